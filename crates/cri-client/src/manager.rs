//! The kubelet's generic runtime manager over CRI (upstream `pkg/kubelet/kuberuntime`):
//! [`CriRuntime`] implements `kubelet_core::Runtime`.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::{Container as ApiContainer, Pod as ApiPod};
use kubelet_core::{
    Backoff, HookRunner, PodUid, Runtime,
    events::{Event, EventRecorder, EventType, ObjectRef},
    runtime::{
        self, ContainerState, ExecResult, FsStats, GcPolicy, Image, PodStatus, PodSyncResult, RuntimeCondition,
        RuntimeStatus, SandboxState, SyncAction, SyncFailure, SyncResult, Version, reasons,
    },
    volume::PodVolumes,
};
use tokio::time::Instant;
use tracing::{debug, warn};

mod credentials;
mod gc;
mod images;
mod kill;
mod status;
mod sync;

use crate::{
    Client, Error,
    actions::{self, ProbeVerdicts, compute_pod_actions},
    cgroups, container, convert, labels, pb,
    sandbox::{self, Dns},
};

/// libcni's default cache directory, where containerd's CNI calls keep their results.
pub const DEFAULT_CNI_CACHE_DIR: &str = "/var/lib/cni";

/// How the runtime manager lays things out on the node; defaults are upstream's.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Where pod log directories go (`podLogsDir`, `/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// Where the legacy container log symlinks go (`/var/log/containers`).
    pub container_logs_dir: PathBuf,
    /// The cgroupfs root of pod cgroups (`/kubepods`).
    pub cgroup_root: String,
    /// Where cgroup hierarchies are mounted, for cleanup (`/sys/fs/cgroup`).
    pub cgroup_mount: PathBuf,
    /// The runtime handler for sandboxes (empty: the runtime's default).
    pub runtime_handler: String,
    /// The node's resolver configuration (`resolvConf`, `/etc/resolv.conf`); `None` gives
    /// pods no DNS from the node.
    pub resolv_conf: Option<PathBuf>,
    /// The cluster's DNS servers (`clusterDNS`), for `ClusterFirst` pods.
    pub cluster_dns: Vec<String>,
    /// The cluster's domain (`clusterDomain`).
    pub cluster_domain: String,
    /// The node's name, for the downward API.
    pub node_name: String,
    /// The node's IP, for the downward API.
    pub node_ip: String,
    /// The second address of a dual-stack node, for the downward API; empty when it has one.
    pub secondary_node_ip: String,
    /// Where per-pod directories go (`<root-dir>/pods`, `/var/lib/kubelet/pods`); termination
    /// message files live under them.
    pub pods_dir: PathBuf,
    /// How many image pulls may run at once: `Some(1)` is upstream's `serializeImagePulls`
    /// (the default), `None` no limit (`maxParallelImagePulls` unset).
    pub image_pull_limit: Option<usize>,
    /// Image pulls a second (`registryPullQPS`, 5; 0: no limit) and the burst of them a quiet
    /// node may start at once (`registryBurst`, 10); a pull beyond them fails at once with
    /// upstream's `pull QPS exceeded` and is retried after the pull backoff.
    pub registry_pulls: (f64, u32),
    /// Where `Localhost` seccomp profiles live (`<root-dir>/seccomp`).
    pub seccomp_dir: PathBuf,
    /// The node's allocatable resources, which a `resourceFieldRef` to a CPU or memory limit
    /// the container does not set reads (upstream `defaultPodLimitsForDownwardAPI`).
    pub allocatable: std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    /// The huge page sizes (bytes) the kernel offers: each container gets a limit for every one,
    /// zero for those it does not ask for (upstream `GetHugepageLimitsFromResources`).
    pub hugepage_sizes: Vec<u64>,
    /// The runtime's CNI cache (`/var/lib/cni`, libcni's default, which containerd uses): a
    /// sandbox's network result there that the runtime cannot read is removed so the sandbox
    /// can be stopped.
    pub cni_cache_dir: PathBuf,
}

impl Config {
    /// Upstream's layout for node `node_name`.
    pub fn new(node_name: impl Into<String>) -> Self {
        Config {
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            container_logs_dir: PathBuf::from("/var/log/containers"),
            cgroup_root: "/kubepods".to_owned(),
            cgroup_mount: PathBuf::from(cgroups::CGROUP_ROOT),
            runtime_handler: String::new(),
            resolv_conf: Some(PathBuf::from("/etc/resolv.conf")),
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            node_name: node_name.into(),
            node_ip: String::new(),
            secondary_node_ip: String::new(),
            pods_dir: PathBuf::from("/var/lib/kubelet/pods"),
            image_pull_limit: Some(1),
            registry_pulls: (5.0, 10),
            allocatable: std::collections::BTreeMap::new(),
            hugepage_sizes: Vec::new(),
            seccomp_dir: PathBuf::from(crate::container::DEFAULT_SECCOMP_DIR),
            cni_cache_dir: PathBuf::from(DEFAULT_CNI_CACHE_DIR),
        }
    }

    /// Sets where `Localhost` seccomp profiles live (`<root-dir>/seccomp`).
    #[must_use]
    pub fn seccomp_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.seccomp_dir = dir.into();
        self
    }

    /// Sets the node's allocatable resources (`cpu`, `memory`, ...).
    #[must_use]
    pub fn allocatable(
        mut self,
        allocatable: std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    ) -> Self {
        self.allocatable = allocatable;
        self
    }

    /// Sets where the runtime's CNI cache is.
    #[must_use]
    pub fn cni_cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cni_cache_dir = dir.into();
        self
    }

    /// Sets the huge page sizes (bytes) the kernel offers.
    #[must_use]
    pub fn hugepage_sizes(mut self, sizes: Vec<u64>) -> Self {
        self.hugepage_sizes = sizes;
        self
    }

    /// Sets how many image pulls may run at once (`None`: no limit).
    #[must_use]
    pub fn image_pull_limit(mut self, limit: Option<usize>) -> Self {
        self.image_pull_limit = limit.map(|l| l.max(1));
        self
    }

    /// Sets the image pulls a second (`registryPullQPS`; 0: no limit) and their burst
    /// (`registryBurst`).
    #[must_use]
    pub fn registry_pulls(mut self, qps: f64, burst: u32) -> Self {
        self.registry_pulls = (qps, burst);
        self
    }

    /// Sets the per-pod directory root.
    #[must_use]
    pub fn pods_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.pods_dir = dir.into();
        self
    }

    /// Sets what pods' DNS is built from: the node's resolver configuration (`resolvConf`;
    /// `None` gives pods no DNS from the node), the cluster's DNS servers (`clusterDNS`) and
    /// domain (`clusterDomain`).
    #[must_use]
    pub fn dns(mut self, resolv_conf: Option<PathBuf>, cluster_dns: Vec<String>, cluster_domain: String) -> Self {
        self.resolv_conf = resolv_conf;
        self.cluster_dns = cluster_dns;
        self.cluster_domain = cluster_domain;
        self
    }

    /// Sets the pod log directory root.
    #[must_use]
    pub fn pod_logs_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.pod_logs_dir = dir.into();
        self
    }

    /// Sets the container log symlink directory.
    #[must_use]
    pub fn container_logs_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.container_logs_dir = dir.into();
        self
    }

    /// Sets the cgroupfs root of pod cgroups.
    #[must_use]
    pub fn cgroup_root(mut self, root: impl Into<String>) -> Self {
        self.cgroup_root = root.into();
        self
    }

    /// Sets the node's IP.
    #[must_use]
    pub fn node_ip(mut self, ip: impl Into<String>) -> Self {
        self.node_ip = ip.into();
        self
    }

    /// Sets the second address of a dual-stack node.
    #[must_use]
    pub fn secondary_node_ip(mut self, ip: impl Into<String>) -> Self {
        self.secondary_node_ip = ip.into();
        self
    }

    /// The node's IPs, primary first, none when it has no IP.
    pub fn node_ips(&self) -> Vec<String> {
        [&self.node_ip, &self.secondary_node_ip].into_iter().filter(|ip| !ip.is_empty()).cloned().collect()
    }
}

/// The bucket of `registryPullQPS` and `registryBurst`; none when the QPS is 0 (no limit).
fn pull_tokens((qps, burst): (f64, u32)) -> Option<std::sync::Mutex<kubelet_core::ratelimit::TokenBucket>> {
    let bucket = kubelet_core::ratelimit::TokenBucket::new(qps, burst, Instant::now());
    (qps > 0.0).then(|| std::sync::Mutex::new(bucket))
}

/// The minimum grace period of a container stop (upstream `minimumGracePeriodInSeconds`).
pub const MIN_GRACE_PERIOD_SECONDS: i64 = 2;

/// `kubelet_core::Runtime` over a CRI runtime.
pub struct CriRuntime {
    client: Client,
    config: Config,
    image_backoff: Backoff,
    recorder: Arc<dyn EventRecorder>,
    memory_capacity: i64,
    image_pulls: Option<tokio::sync::Semaphore>,
    /// The pulls a second and their burst, unless unlimited (`registryPullQPS: 0`).
    pull_tokens: Option<std::sync::Mutex<kubelet_core::ratelimit::TokenBucket>>,
    startup: Option<Arc<kubelet_core::StartupTracker>>,
    hooks: Option<Arc<dyn HookRunner>>,
    /// Where pods' `imagePullSecrets` and the config maps and secrets of containers'
    /// environments are read (cluster mode).
    objects: Option<Arc<dyn kubelet_core::volume::ObjectSource>>,
    /// What makes `subPath` mounts safe to hand to the runtime.
    sub_paths: Option<Arc<dyn kubelet_core::volume::SubPathMounter>>,
    /// The pods whose RunPodSandbox is still in flight, however their sync ended.
    sandboxes_starting: sync::StartingSandboxes,
}

impl std::fmt::Debug for CriRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriRuntime").field("config", &self.config).finish_non_exhaustive()
    }
}

fn memory_capacity() -> i64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map_or(i64::MAX, |kib| kib * 1024)
}

fn pod_meta(pod: &ApiPod) -> (&str, &str, &str) {
    (
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default(),
    )
}

impl CriRuntime {
    /// A runtime manager over `client`; events go to `recorder`.
    pub fn new(client: Client, config: Config, recorder: Arc<dyn EventRecorder>) -> Self {
        CriRuntime {
            client,
            image_backoff: Backoff::default(),
            recorder,
            memory_capacity: memory_capacity(),
            image_pulls: config.image_pull_limit.map(tokio::sync::Semaphore::new),
            pull_tokens: pull_tokens(config.registry_pulls),
            startup: None,
            hooks: None,
            objects: None,
            sub_paths: None,
            sandboxes_starting: sync::StartingSandboxes::default(),
            config,
        }
    }

    /// Reports image pulls to `tracker`, which the kubelet shares, for the start-up SLI metric.
    #[must_use]
    pub fn startup_tracker(mut self, tracker: Arc<kubelet_core::StartupTracker>) -> Self {
        self.startup = Some(tracker);
        self
    }

    /// Runs containers' `postStart` and `preStop` hooks with `runner` (without one, the runtime
    /// runs none, and the kubelet refuses pods that have them).
    #[must_use]
    pub fn hooks(mut self, runner: Arc<dyn HookRunner>) -> Self {
        self.hooks = Some(runner);
        self
    }

    /// Reads from `objects` the API objects a pod names beyond its volumes: the secrets of its
    /// `imagePullSecrets`, pulling with their credentials (upstream's keyring: the most specific
    /// registry match first, each tried until one pull succeeds), and the config maps and
    /// secrets of its containers' `envFrom` and `valueFrom`. Without it (a standalone node), pull
    /// secrets are not read and a container whose environment names an object fails with
    /// `CreateContainerConfigError`, as upstream's without an API client.
    #[must_use]
    pub fn objects(mut self, objects: Arc<dyn kubelet_core::volume::ObjectSource>) -> Self {
        self.objects = Some(objects);
        self
    }

    /// Prepares containers' `subPath` mounts with `mounter` (upstream's bind mounts through a
    /// handle: `kubelet_volumes::subpath::BindMounter`); without one, a container with a
    /// `subPath` mount fails with `CreateContainerConfigError`, since handing the runtime the
    /// joined path would let a container that writes its volume redirect the mount.
    #[must_use]
    pub fn sub_paths(mut self, mounter: Arc<dyn kubelet_core::volume::SubPathMounter>) -> Self {
        self.sub_paths = Some(mounter);
        self
    }

    /// Where an httpGet hook without a host goes: the node's IP for a host-network pod, else
    /// the pod's first IP (read from the runtime when `known` is empty).
    async fn hook_ip(&self, pod: &ApiPod, known: &[String]) -> Option<String> {
        if pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false) {
            return Some(self.config.node_ip.clone()).filter(|ip| !ip.is_empty());
        }
        if let Some(ip) = known.first() {
            return Some(ip.clone());
        }
        let (name, namespace, uid) = pod_meta(pod);
        let status = self.get_pod_status(&PodUid::new(uid), name, namespace).await.ok()?;
        status.ips.into_iter().next()
    }

    /// The CRI client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn event(&self, pod: &ApiPod, kind: EventType, reason: &str, message: String) {
        self.recorder.record(Event::new(kind, reason, message, ObjectRef::pod(pod)));
    }

    fn pod_log_dir(&self, pod: &ApiPod) -> PathBuf {
        let (name, namespace, uid) = pod_meta(pod);
        sandbox::pod_log_dir(&self.config.pod_logs_dir, namespace, name, uid)
    }

    async fn list_sandboxes(&self, filter: Option<pb::PodSandboxFilter>) -> Result<Vec<pb::PodSandbox>, Error> {
        let request = pb::ListPodSandboxRequest { filter };
        Ok(self
            .client
            .runtime_service()
            .list_pod_sandbox(request)
            .await
            .map_err(|s| Error::status("ListPodSandbox", s))?
            .into_inner()
            .items)
    }

    async fn list_containers(&self, filter: Option<pb::ContainerFilter>) -> Result<Vec<pb::Container>, Error> {
        let request = pb::ListContainersRequest { filter };
        Ok(self
            .client
            .runtime_service()
            .list_containers(request)
            .await
            .map_err(|s| Error::status("ListContainers", s))?
            .into_inner()
            .containers)
    }

    /// `ListPodSandbox` decoded for a listing of pods ([`listing`](crate::listing)).
    async fn list_listed_sandboxes(
        &self,
        filter: Option<pb::PodSandboxFilter>,
    ) -> Result<Vec<crate::listing::ListedSandbox>, Error> {
        let request = pb::ListPodSandboxRequest { filter };
        let answer: crate::listing::ListedSandboxes = self
            .client
            .runtime_call("/runtime.v1.RuntimeService/ListPodSandbox", request)
            .await
            .map_err(|s| Error::status("ListPodSandbox", s))?;
        Ok(answer.items)
    }

    /// `ListContainers` decoded for a listing of pods ([`listing`](crate::listing)).
    async fn list_listed_containers(
        &self,
        filter: Option<pb::ContainerFilter>,
    ) -> Result<Vec<crate::listing::ListedContainer>, Error> {
        let request = pb::ListContainersRequest { filter };
        let answer: crate::listing::ListedContainers = self
            .client
            .runtime_call("/runtime.v1.RuntimeService/ListContainers", request)
            .await
            .map_err(|s| Error::status("ListContainers", s))?;
        Ok(answer.containers)
    }

    fn uid_selector(uid: &PodUid) -> HashMap<String, String> {
        HashMap::from([(labels::POD_UID.to_owned(), uid.to_string())])
    }
}

impl Runtime for CriRuntime {
    type Error = Error;

    async fn version(&self) -> Result<Version, Error> {
        let v = self.client.version().await?;
        Ok(Version::new(v.runtime_name, v.runtime_version, v.runtime_api_version))
    }

    fn runs_hooks(&self) -> bool {
        self.hooks.is_some()
    }

    fn runs_runtime_classes(&self) -> bool {
        self.objects.is_some()
    }

    async fn status(&self) -> Result<RuntimeStatus, Error> {
        let status = self.client.status().await?;
        Ok(RuntimeStatus::new(
            status
                .conditions
                .into_iter()
                .map(|c| RuntimeCondition::new(c.r#type, c.status, c.reason, c.message))
                .collect(),
        ))
    }

    async fn get_pods(&self, all: bool) -> Result<Vec<runtime::Pod>, Error> {
        status::get_pods(self, all).await
    }

    async fn get_pod_status(&self, uid: &PodUid, name: &str, namespace: &str) -> Result<PodStatus, Error> {
        status::get_pod_status(self, uid, name, namespace).await
    }

    async fn get_listed_pod_status(&self, pod: &runtime::Pod) -> Result<PodStatus, Error> {
        status::get_listed_pod_status(self, pod).await
    }

    async fn sync_pod(
        &self,
        pod: &ApiPod,
        status: &PodStatus,
        backoff: &Backoff,
        probes: &kubelet_core::ProbeResults,
        volumes: &kubelet_core::volume::PodVolumes,
    ) -> PodSyncResult {
        sync::sync_pod(self, pod, status, backoff, probes, volumes).await
    }

    async fn kill_pod(
        &self,
        pod: Option<&ApiPod>,
        running: &runtime::Pod,
        grace_override: Option<i64>,
    ) -> Result<(), Error> {
        kill::kill_pod(self, pod, running, grace_override).await
    }

    async fn pull_image(&self, image: &str) -> Result<String, Error> {
        images::pull_image(self, image).await
    }

    async fn image_ref(&self, image: &str) -> Result<Option<String>, Error> {
        images::image_ref(self, image).await
    }

    async fn list_images(&self) -> Result<Vec<Image>, Error> {
        images::list_images(self).await
    }

    async fn remove_image(&self, image: &str) -> Result<(), Error> {
        images::remove_image(self, image).await
    }

    async fn image_fs_stats(&self) -> Result<Option<FsStats>, Error> {
        images::image_fs_stats(self).await
    }

    async fn container_stats(&self) -> Result<Vec<runtime::ContainerStats>, Error> {
        let request = pb::ListContainerStatsRequest { filter: None };
        let response = self
            .client
            .runtime_service()
            .list_container_stats(request)
            .await
            .map_err(|s| Error::status("ListContainerStats", s))?;
        Ok(response.into_inner().stats.into_iter().filter_map(convert::container_stats).collect())
    }

    async fn pod_network_stats(&self) -> Result<Vec<runtime::PodNetworkStats>, Error> {
        let request = pb::ListPodSandboxStatsRequest { filter: None };
        let response = match self.client.runtime_service().list_pod_sandbox_stats(request).await {
            Ok(response) => response,
            // An older runtime: no network figures, as before CRI had the call.
            Err(status) if status.code() == tonic::Code::Unimplemented => return Ok(Vec::new()),
            Err(status) => return Err(Error::status("ListPodSandboxStats", status)),
        };
        Ok(response.into_inner().stats.into_iter().filter_map(convert::pod_network_stats).collect())
    }

    async fn exec_sync(&self, container_id: &str, cmd: &[String], timeout: Duration) -> Result<ExecResult, Error> {
        let request = pb::ExecSyncRequest {
            container_id: container_id.to_owned(),
            cmd: cmd.to_vec(),
            timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        };
        let response = self
            .client
            .runtime_service()
            .exec_sync(request)
            .await
            .map_err(|s| Error::status("ExecSync", s))?
            .into_inner();
        let mut result = ExecResult::default();
        result.stdout = response.stdout;
        result.stderr = response.stderr;
        result.exit_code = response.exit_code;
        Ok(result)
    }

    async fn stream_url(&self, request: runtime::StreamRequest) -> Result<Option<String>, Error> {
        let mut service = self.client.runtime_service();
        let url = match request {
            runtime::StreamRequest::Exec { container_id, command, io } => {
                let request = pb::ExecRequest {
                    container_id,
                    cmd: command,
                    tty: io.tty,
                    stdin: io.stdin,
                    stdout: io.stdout,
                    stderr: io.stderr,
                };
                service.exec(request).await.map_err(|s| Error::status("Exec", s))?.into_inner().url
            }
            runtime::StreamRequest::Attach { container_id, io } => {
                let request = pb::AttachRequest {
                    container_id,
                    stdin: io.stdin,
                    tty: io.tty,
                    stdout: io.stdout,
                    stderr: io.stderr,
                };
                service.attach(request).await.map_err(|s| Error::status("Attach", s))?.into_inner().url
            }
            runtime::StreamRequest::PortForward { sandbox_id, ports } => {
                let request = pb::PortForwardRequest { pod_sandbox_id: sandbox_id, port: ports };
                service.port_forward(request).await.map_err(|s| Error::status("PortForward", s))?.into_inner().url
            }
        };
        Ok(Some(url))
    }

    async fn remove_pod_content(&self, uid: &PodUid) -> Result<(), Error> {
        gc::remove_pod_content(self, uid).await
    }

    async fn delete_container(&self, container_id: &str) -> Result<(), Error> {
        gc::delete_container(self, container_id).await
    }

    async fn garbage_collect(
        &self,
        policy: &GcPolicy,
        _all_sources_ready: bool,
        _evict_non_deleted_pods: bool,
    ) -> Result<(), Error> {
        gc::garbage_collect(self, policy, _all_sources_ready, _evict_non_deleted_pods).await
    }
}

impl kubelet_core::runtime::RuntimeEvents for CriRuntime {
    async fn stream_events(
        &self,
        events: tokio::sync::mpsc::Sender<kubelet_core::runtime::ContainerEvent>,
    ) -> Result<(), kubelet_core::runtime::EventStreamError> {
        use kubelet_core::runtime::EventStreamError;
        let mut stream = match self.client.runtime_service().get_container_events(pb::GetEventsRequest {}).await {
            Ok(response) => response.into_inner(),
            Err(status) if status.code() == tonic::Code::Unimplemented => return Err(EventStreamError::Unimplemented),
            Err(status) => return Err(EventStreamError::Failed(Box::new(status))),
        };
        loop {
            match stream.message().await {
                Ok(Some(message)) => {
                    let Some(event) = convert::container_event(&message) else {
                        debug!(container.id = %message.container_id, "ignoring a container event without a pod sandbox status");
                        continue;
                    };
                    if events.send(event).await.is_err() {
                        return Ok(());
                    }
                }
                Ok(None) => {
                    return Err(EventStreamError::Closed);
                }
                Err(status) => return Err(EventStreamError::Failed(Box::new(status))),
            }
        }
    }

    /// containerd's own task and container events (see [`Client::watch_containerd_changes`]).
    async fn watch_changes(
        &self,
        changed: tokio::sync::mpsc::Sender<kubelet_core::runtime::ChangeHint>,
    ) -> Result<(), kubelet_core::runtime::EventStreamError> {
        self.client.watch_containerd_changes(changed).await
    }
}
