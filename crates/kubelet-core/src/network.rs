//! Pod networking done by the agent, for runtimes that do not network pods themselves.
//!
//! A CRI runtime (containerd, CRI-O) sets up each pod's network through CNI on its own, and
//! is used as it is.
//! A runtime of processes, VMs or WASM has no such step: wrap it in [`Networked`] with a
//! [`NetworkPlugin`] (`kubelet-cni`'s `CniNetworkPlugin` runs CNI plugins), and the agent
//! networks its pods at the points upstream's kubelet called its network plugin:
//!
//! - **set up** after the pod's sandbox exists and before its containers start: here the
//!   plugin makes the sandbox, a network namespace, and attaches it;
//! - **checked** when the pod is synced again, at most once per check interval (a failure is
//!   reported on the sync);
//! - **torn down** once the pod's containers are killed, before the sandbox goes;
//! - **status**: the pod's IPs and namespace path are its sandbox's, so the pod's status
//!   (`podIP`) and the runtime's `sync_pod` see them.
//!
//! Pods with `hostNetwork: true` are passed through untouched.

use std::{
    collections::HashMap,
    future::Future,
    net::IpAddr,
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod as ApiPod;
use tokio::time::Instant;

use crate::{
    Backoff, PodUid, ProbeResults,
    runtime::{
        self, ContainerStats, ExecResult, GcPolicy, Image, NETWORK_READY, NetworkMode, Pod, PodNetworkStats, PodStatus,
        PodSyncResult, Runtime, RuntimeCondition, RuntimeStatus, Sandbox, SandboxState, SandboxStatus, StreamRequest,
        SyncAction, SyncFailure, SyncResult, Version, reasons,
    },
    volume::PodVolumes,
};

/// How often a synced pod's network is checked by default: upstream's pod resync period.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(60);

/// The prefix of the sandbox ID a [`Networked`] runtime reports for a pod's network.
pub const SANDBOX_ID_PREFIX: &str = "network-";

/// One pod's network as the plugin set it up.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodNetworkStatus {
    /// The pod UID.
    pub uid: PodUid,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// The path of the pod's network namespace, which its containers join.
    pub namespace_path: PathBuf,
    /// The pod's IPs, primary first.
    pub ips: Vec<IpAddr>,
}

impl PodNetworkStatus {
    /// A pod's network: its namespace at `namespace_path`, no IPs yet.
    pub fn new(uid: PodUid, name: impl Into<String>, namespace: impl Into<String>, namespace_path: PathBuf) -> Self {
        PodNetworkStatus { uid, name: name.into(), namespace: namespace.into(), namespace_path, ips: Vec::new() }
    }

    /// The sandbox status a [`Networked`] runtime reports for this network.
    fn sandbox_status(&self) -> SandboxStatus {
        let mut sandbox = SandboxStatus::new(sandbox_id(&self.uid), 0, SandboxState::Ready);
        sandbox.ips = self.ips.iter().map(IpAddr::to_string).collect();
        sandbox.network_mode = NetworkMode::Pod;
        sandbox.network_namespace = Some(self.namespace_path.clone());
        sandbox
    }
}

/// Sets pods' networks up and tears them down (upstream's network plugin: `SetUpPod`,
/// `TearDownPod`, `GetPodNetworkStatus`, `Status`).
///
/// An implementation keeps what it set up across restarts of the agent, so that
/// [`pod_network`](Self::pod_network) still knows a pod's network, and a pod that went away
/// while the agent was down is torn down when the agent lists it.
pub trait NetworkPlugin: Send + Sync + 'static {
    /// The error every method may return.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Whether the plugin can network pods now: `Err` says why not (no network configuration
    /// yet, a plugin missing), and the node's `NetworkReady` condition carries it.
    fn status(&self) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Makes the pod's sandbox (its network namespace) and attaches it to the network, with the
    /// pod's host ports and bandwidth limits.
    fn set_up_pod(&self, pod: &ApiPod) -> impl Future<Output = Result<PodNetworkStatus, Self::Error>> + Send;

    /// Checks that the pod's network is still as it was set up; its status. A failure is
    /// reported on the pod's sync, whose containers are synced all the same.
    fn check_pod(
        &self,
        pod: &ApiPod,
        network: &PodNetworkStatus,
    ) -> impl Future<Output = Result<PodNetworkStatus, Self::Error>> + Send;

    /// Detaches the pod from the network and removes its namespace; nothing to do for a pod it
    /// has no network of.
    fn tear_down_pod(&self, uid: &PodUid) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The pod's network, if set up.
    fn pod_network(&self, uid: &PodUid) -> Option<PodNetworkStatus>;

    /// Every pod network that is set up.
    fn pod_networks(&self) -> Vec<PodNetworkStatus>;
}

/// The sandbox ID a [`Networked`] runtime reports for pod `uid`'s network.
pub fn sandbox_id(uid: &PodUid) -> String {
    format!("{SANDBOX_ID_PREFIX}{uid}")
}

/// Whether `pod` shares the host's network namespace.
pub fn uses_host_network(pod: &ApiPod) -> bool {
    pod.spec.as_ref().and_then(|spec| spec.host_network).unwrap_or(false)
}

/// An error of a [`Networked`] runtime: its runtime's, or its network plugin's.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetworkedError<R, N>
where
    R: std::error::Error + 'static,
    N: std::error::Error + 'static,
{
    /// The runtime failed.
    #[error(transparent)]
    Runtime(R),
    /// The network plugin failed.
    #[error("pod network")]
    Network(#[source] N),
}

/// A runtime whose pods the agent networks through a [`NetworkPlugin`].
///
/// Each pod (but `hostNetwork` ones) gets a sandbox made by the plugin before the runtime's
/// `sync_pod` starts anything; the runtime reads its namespace from
/// [`PodStatus::network_namespace`] and runs the containers in it.
/// The sandbox is listed as the pod's (ID [`SANDBOX_ID_PREFIX`] + UID), so the agent kills a
/// pod whose network outlived it, as upstream kills an orphaned sandbox.
pub struct Networked<R, N> {
    runtime: R,
    plugin: Arc<N>,
    check_interval: Duration,
    last_checked: Mutex<HashMap<PodUid, Instant>>,
}

impl<R: Runtime, N: NetworkPlugin> Networked<R, N> {
    /// The runtime's `status` of pod `uid`, with the pod's network as its sandbox, if it has one.
    fn with_pod_network(&self, uid: &PodUid, status: PodStatus) -> PodStatus {
        match self.plugin.pod_network(uid) {
            Some(network) => with_network(&status, &network),
            None => status,
        }
    }

    /// `runtime`, its pods networked by `plugin`.
    pub fn new(runtime: R, plugin: N) -> Self {
        Networked {
            runtime,
            plugin: Arc::new(plugin),
            check_interval: DEFAULT_CHECK_INTERVAL,
            last_checked: Mutex::new(HashMap::new()),
        }
    }

    /// Checks a synced pod's network at most once per `interval` (by default
    /// [`DEFAULT_CHECK_INTERVAL`]).
    pub fn with_check_interval(mut self, interval: Duration) -> Self {
        self.check_interval = interval;
        self
    }

    /// The wrapped runtime.
    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    /// The network plugin.
    pub fn plugin(&self) -> &Arc<N> {
        &self.plugin
    }

    /// Whether pod `uid`'s network is due a check, marking it checked now if so.
    fn take_check_due(&self, uid: &PodUid) -> bool {
        let now = Instant::now();
        let mut last_checked = self.last_checked();
        let due = last_checked.get(uid).is_none_or(|checked| now.duration_since(*checked) >= self.check_interval);
        if due {
            last_checked.insert(uid.clone(), now);
        }
        due
    }

    fn last_checked(&self) -> std::sync::MutexGuard<'_, HashMap<PodUid, Instant>> {
        // Each critical section inserts or removes one entry: a poisoned map is whole.
        self.last_checked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Pod `uid`'s network was just set up: it counts as checked now.
    fn checked_now(&self, uid: &PodUid) {
        self.last_checked().insert(uid.clone(), Instant::now());
    }

    /// Pod `uid`'s network is gone: nothing is due for it.
    fn forget(&self, uid: &PodUid) {
        self.last_checked().remove(uid);
    }

    /// The pod's network, set up now if it has none, or checked if a check is due.
    async fn ensure_network(&self, pod: &ApiPod) -> Result<PodNetworkStatus, NetworkFailure> {
        let uid = PodUid::of(pod);
        let Some(network) = self.plugin.pod_network(&uid) else {
            let network = self.plugin.set_up_pod(pod).await.map_err(|error| {
                let message = format!("failed to set up the pod's network: {}", crate::ErrorChain(&error));
                NetworkFailure::SetUp(SyncResult::failed(
                    SyncAction::CreatePodSandbox,
                    uid.to_string(),
                    SyncFailure::new(reasons::CREATE_POD_SANDBOX_ERROR, message),
                ))
            })?;
            self.checked_now(&uid);
            return Ok(network);
        };
        if !self.take_check_due(&uid) {
            return Ok(network);
        }
        self.plugin.check_pod(pod, &network).await.map_err(|error| {
            let message = format!("the pod's network failed its check: {}", crate::ErrorChain(&error));
            NetworkFailure::Check(SyncResult::failed(
                SyncAction::ConfigPodSandbox,
                uid.to_string(),
                SyncFailure::new(reasons::CONFIG_POD_SANDBOX_ERROR, message),
            ))
        })
    }
}

/// Why [`Networked`] could not give a pod its network.
enum NetworkFailure {
    /// The pod has no network and setting it up failed: nothing of the pod may start.
    SetUp(SyncResult),
    /// The pod's network failed its check: reported, the pod keeps it.
    Check(SyncResult),
}

/// `status` with `network` as its newest sandbox.
fn with_network(status: &PodStatus, network: &PodNetworkStatus) -> PodStatus {
    let mut status = status.clone();
    status.sandbox_statuses.retain(|sandbox| !sandbox.id.starts_with(SANDBOX_ID_PREFIX));
    status.sandbox_statuses.insert(0, network.sandbox_status());
    status.ips = network.ips.iter().map(IpAddr::to_string).collect();
    status
}

/// `running` without the sandbox a [`Networked`] runtime added.
fn without_network(running: &Pod) -> Pod {
    let mut running = running.clone();
    running.sandboxes.retain(|sandbox| !sandbox.id.starts_with(SANDBOX_ID_PREFIX));
    running
}

impl<R: Runtime, N: NetworkPlugin> Runtime for Networked<R, N> {
    type Error = NetworkedError<R::Error, N::Error>;

    async fn version(&self) -> Result<Version, Self::Error> {
        self.runtime.version().await.map_err(NetworkedError::Runtime)
    }

    fn runs_hooks(&self) -> bool {
        self.runtime.runs_hooks()
    }

    fn runs_runtime_classes(&self) -> bool {
        self.runtime.runs_runtime_classes()
    }

    /// The runtime's conditions, with `NetworkReady` the plugin's.
    async fn status(&self) -> Result<RuntimeStatus, Self::Error> {
        let mut status = self.runtime.status().await.map_err(NetworkedError::Runtime)?;
        let network_ready = match self.plugin.status().await {
            Ok(()) => RuntimeCondition::new(NETWORK_READY, true, "", ""),
            Err(error) => {
                let message = format!("network plugin is not ready: {}", crate::ErrorChain(&error));
                RuntimeCondition::new(NETWORK_READY, false, "NetworkPluginNotReady", message)
            }
        };
        status.conditions.retain(|condition| condition.kind != NETWORK_READY);
        status.conditions.push(network_ready);
        Ok(status)
    }

    /// The runtime's pods, each with its network's sandbox; a network whose pod the runtime has
    /// nothing of is listed as a pod of its own, for the agent to kill.
    async fn get_pods(&self, all: bool) -> Result<Vec<Pod>, Self::Error> {
        let mut pods = self.runtime.get_pods(all).await.map_err(NetworkedError::Runtime)?;
        for network in self.plugin.pod_networks() {
            let sandbox = Sandbox::new(sandbox_id(&network.uid), 0, SandboxState::Ready);
            match pods.iter_mut().find(|pod| pod.uid == network.uid) {
                Some(pod) => pod.sandboxes.insert(0, sandbox),
                None => {
                    let mut pod = Pod::new(network.uid.clone(), &network.name, &network.namespace);
                    pod.sandboxes.push(sandbox);
                    pods.push(pod);
                }
            }
        }
        Ok(pods)
    }

    async fn get_pod_status(&self, uid: &PodUid, name: &str, namespace: &str) -> Result<PodStatus, Self::Error> {
        let status = self.runtime.get_pod_status(uid, name, namespace).await.map_err(NetworkedError::Runtime)?;
        Ok(self.with_pod_network(uid, status))
    }

    async fn get_listed_pod_status(&self, pod: &Pod) -> Result<PodStatus, Self::Error> {
        let listed = without_network(pod);
        let status = self.runtime.get_listed_pod_status(&listed).await.map_err(NetworkedError::Runtime)?;
        Ok(self.with_pod_network(&pod.uid, status))
    }

    /// Sets the pod's network up (or checks it), then lets the runtime sync the pod in it.
    async fn sync_pod(
        &self,
        pod: &ApiPod,
        status: &PodStatus,
        backoff: &Backoff,
        probes: &ProbeResults,
        volumes: &PodVolumes,
    ) -> PodSyncResult {
        if uses_host_network(pod) {
            return self.runtime.sync_pod(pod, status, backoff, probes, volumes).await;
        }
        let mut result = PodSyncResult::default();
        let network = match self.ensure_network(pod).await {
            Ok(network) => network,
            Err(NetworkFailure::SetUp(failed)) => {
                result.push(failed);
                return result;
            }
            Err(NetworkFailure::Check(failed)) => {
                // Reported, not repaired: the containers run on in the network they have.
                result.push(failed);
                match self.plugin.pod_network(&PodUid::of(pod)) {
                    Some(network) => network,
                    None => return result,
                }
            }
        };
        let status = with_network(status, &network);
        result.extend(self.runtime.sync_pod(pod, &status, backoff, probes, volumes).await);
        result
    }

    /// Kills the pod's containers, then tears its network down.
    async fn kill_pod(
        &self,
        pod: Option<&ApiPod>,
        running: &Pod,
        grace_override: Option<i64>,
    ) -> Result<(), Self::Error> {
        let containers = without_network(running);
        self.runtime.kill_pod(pod, &containers, grace_override).await.map_err(NetworkedError::Runtime)?;
        self.plugin.tear_down_pod(&running.uid).await.map_err(NetworkedError::Network)?;
        self.forget(&running.uid);
        Ok(())
    }

    async fn pull_image(&self, image: &str) -> Result<String, Self::Error> {
        self.runtime.pull_image(image).await.map_err(NetworkedError::Runtime)
    }

    async fn image_ref(&self, image: &str) -> Result<Option<String>, Self::Error> {
        self.runtime.image_ref(image).await.map_err(NetworkedError::Runtime)
    }

    async fn list_images(&self) -> Result<Vec<Image>, Self::Error> {
        self.runtime.list_images().await.map_err(NetworkedError::Runtime)
    }

    async fn remove_image(&self, image: &str) -> Result<(), Self::Error> {
        self.runtime.remove_image(image).await.map_err(NetworkedError::Runtime)
    }

    async fn image_fs_stats(&self) -> Result<Option<runtime::FsStats>, Self::Error> {
        self.runtime.image_fs_stats().await.map_err(NetworkedError::Runtime)
    }

    async fn container_stats(&self) -> Result<Vec<ContainerStats>, Self::Error> {
        self.runtime.container_stats().await.map_err(NetworkedError::Runtime)
    }

    async fn pod_network_stats(&self) -> Result<Vec<PodNetworkStats>, Self::Error> {
        self.runtime.pod_network_stats().await.map_err(NetworkedError::Runtime)
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, Self::Error> {
        self.runtime.exec_sync(container_id, cmd, timeout).await.map_err(NetworkedError::Runtime)
    }

    async fn stream_url(&self, request: StreamRequest) -> Result<Option<String>, Self::Error> {
        self.runtime.stream_url(request).await.map_err(NetworkedError::Runtime)
    }

    async fn delete_container(&self, container_id: &str) -> Result<(), Self::Error> {
        self.runtime.delete_container(container_id).await.map_err(NetworkedError::Runtime)
    }

    /// Removes what the runtime keeps of a gone pod, and its network if it is still set up.
    async fn remove_pod_content(&self, uid: &PodUid) -> Result<(), Self::Error> {
        self.runtime.remove_pod_content(uid).await.map_err(NetworkedError::Runtime)?;
        self.plugin.tear_down_pod(uid).await.map_err(NetworkedError::Network)?;
        self.forget(uid);
        Ok(())
    }

    async fn garbage_collect(
        &self,
        policy: &GcPolicy,
        all_sources_ready: bool,
        evict_non_deleted_pods: bool,
    ) -> Result<(), Self::Error> {
        self.runtime
            .garbage_collect(policy, all_sources_ready, evict_non_deleted_pods)
            .await
            .map_err(NetworkedError::Runtime)
    }
}

#[cfg(test)]
mod tests;
