//! [`PodSync`], what the pod workers call (upstream `SyncPod`, `SyncTerminatingPod`,
//! `SyncTerminatingRuntimePod` and `SyncTerminatedPod` in `pkg/kubelet/kubelet.go`), and the
//! kubelet's [`Config`] and [`Error`].

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Pod, PodStatus as ApiPodStatus},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kubelet_core::{
    Backoff, PodStatusFn, PodSyncer, PodUid, ProbeManager, ProbeResults, RuntimeState, StartupTracker, SyncPodType,
    WorkQueue,
    cgroups::PodCgroups,
    clock::wall_now,
    events::{Event, EventRecorder, EventType, ObjectRef},
    runtime::{self, ContainerState, PodStatus, Runtime, SyncAction},
    types::{is_static_pod, pod_full_name},
    volume::{MOUNT_TIMEOUT, PodVolumes, VolumeError, VolumeManager},
};
use tracing::{debug, info, warn};

use crate::{
    admission::NodeResources,
    lock,
    mirror::{MirrorAction, MirrorClient, mirror_action},
    status::{self, StartFailure, StatusInput},
    status_store::StatusStore,
};

/// The mode of the directories the agent makes for pods (upstream's 0750).
pub(crate) const PRIVATE_DIR_MODE: u32 = 0o750;

/// How the kubelet runs on this node.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// The node's name.
    pub node_name: String,
    /// The node's IP (`status.hostIP`).
    pub node_ip: String,
    /// The second address of a dual-stack node (`status.hostIPs[1]`); empty when it has one.
    pub secondary_node_ip: String,
    /// `--root-dir` (`/var/lib/kubelet`); pod directories go under `pods/`.
    pub root_dir: PathBuf,
    /// What the node offers, for admission.
    pub node: NodeResources,
    /// The runtime's name, as container ID prefix (`containerd`).
    pub runtime_name: String,
}

impl Config {
    /// A config for node `node_name` with this machine's resources.
    pub fn new(node_name: impl Into<String>) -> Self {
        Config {
            node_name: node_name.into(),
            node_ip: String::new(),
            secondary_node_ip: String::new(),
            root_dir: PathBuf::from("/var/lib/kubelet"),
            node: NodeResources::of_this_node(),
            runtime_name: "containerd".to_owned(),
        }
    }

    /// Sets the root directory.
    #[must_use]
    pub fn root_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root_dir = dir.into();
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

    /// Sets the node's resources.
    #[must_use]
    pub fn node(mut self, node: NodeResources) -> Self {
        self.node = node;
        self
    }
}

/// A runtime's error, kept whole as the source of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a sync failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A runtime call failed; the runtime's own error is the source.
    #[error("runtime call {operation} failed")]
    Runtime {
        /// The [`Runtime`] method that failed (`kill_pod`).
        operation: &'static str,
        /// The runtime's error.
        #[source]
        source: BoxError,
    },
    /// The runtime sync left a failure behind (other than a backoff), with upstream's reason.
    #[error("sync failed: {reason}: {message}")]
    Sync {
        /// Upstream's reason (`CreateContainerError`).
        reason: String,
        /// What the runtime said.
        message: String,
    },
    /// The pod network is not ready; the worker retries soon.
    #[error("network is not ready: {0}")]
    NetworkNotReady(String),
    /// Containers still run after a successful kill.
    #[error("detected running containers after a successful KillPod, CRI violation: {0}")]
    StillRunning(String),
    /// A volume could not be set up or torn down.
    #[error(transparent)]
    Volume(kubelet_core::volume::VolumeError),
    /// The pod's cgroup could not be made or set.
    #[error("failed to ensure that the pod cgroups exist and are correctly applied")]
    PodCgroup(#[source] kubelet_core::cgroups::PodCgroupError),
    /// A pod directory could not be made.
    #[error("cannot make pod directories")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Wraps the runtime's error from `operation`.
    pub(crate) fn runtime(operation: &'static str, source: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::Runtime { operation, source: Box::new(source) }
    }
}

/// The kubelet's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the pod workers call: upstream's `SyncPod`, `SyncTerminatingPod`,
/// `SyncTerminatingRuntimePod` and `SyncTerminatedPod`.
pub struct PodSync<R> {
    pub(crate) runtime: Arc<R>,
    pub(crate) runtime_state: Arc<RuntimeState>,
    pub(crate) statuses: Arc<StatusStore>,
    pub(crate) recorder: Arc<dyn EventRecorder>,
    pub(crate) backoff: Backoff,
    failures: Mutex<HashMap<(PodUid, String), StartFailure>>,
    pub(crate) config: Config,
    after_change: Option<Arc<dyn Fn() + Send + Sync>>,
    work_queue: Option<Arc<WorkQueue>>,
    startup: Arc<StartupTracker>,
    /// Pods whose data directories exist, so a resync of an unchanged pod touches no file.
    dirs_made: Mutex<HashSet<PodUid>>,
    /// The prober, when the agent probes.
    pub(crate) prober: Option<Arc<dyn ProbeManager>>,
    pub(crate) volumes: Option<Arc<dyn VolumeManager>>,
    /// Where static pods' mirror pods go, in cluster mode.
    pub(crate) mirrors: Option<Arc<dyn MirrorClient>>,
    pub(crate) cgroups: Option<Arc<dyn PodCgroups>>,
    /// The verdicts it writes (empty without one): the runtime acts on liveness and startup
    /// failures, the status shows readiness and start.
    probe_results: Arc<ProbeResults>,
}

impl<R> std::fmt::Debug for PodSync<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodSync").field("config", &self.config).finish_non_exhaustive()
    }
}

/// How long a sync waits for the API server to create or replace a mirror pod.
const MIRROR_TIMEOUT: Duration = Duration::from_secs(10);

fn now_time() -> Time {
    Time(wall_now())
}

impl<R: Runtime> PodSync<R> {
    /// A syncer over `runtime`.
    pub fn new(
        runtime: Arc<R>,
        runtime_state: Arc<RuntimeState>,
        statuses: Arc<StatusStore>,
        recorder: Arc<dyn EventRecorder>,
        config: Config,
    ) -> Self {
        PodSync {
            runtime,
            runtime_state,
            statuses,
            recorder,
            backoff: Backoff::default(),
            failures: Mutex::new(HashMap::new()),
            config,
            after_change: None,
            work_queue: None,
            startup: Arc::new(StartupTracker::new()),
            dirs_made: Mutex::new(HashSet::new()),
            cgroups: None,
            prober: None,
            volumes: None,
            mirrors: None,
            probe_results: Arc::new(ProbeResults::new()),
        }
    }

    /// Probes pods with `prober`, whose verdicts in `results` set containers' `started` and
    /// `ready`; without one, pods with probes are refused.
    #[must_use]
    pub fn prober(mut self, prober: Arc<dyn ProbeManager>, results: Arc<ProbeResults>) -> Self {
        self.prober = Some(prober);
        self.probe_results = results;
        self
    }

    /// Sets up pods' volumes with `volumes` before their containers start, and tears them down
    /// once they have terminated; without one, pods with volumes are refused.
    #[must_use]
    pub fn volumes(mut self, volumes: Arc<dyn VolumeManager>) -> Self {
        self.volumes = Some(volumes);
        self
    }

    /// Makes each pod's cgroup with `cgroups` before its sandbox starts (upstream's
    /// `cgroupsPerQOS`); without one, the runtime makes the cgroups it needs, unset.
    #[must_use]
    pub fn pod_cgroups(mut self, cgroups: Arc<dyn PodCgroups>) -> Self {
        self.cgroups = Some(cgroups);
        self
    }

    /// Keeps a mirror pod in the API server for each static pod through `mirrors` (cluster mode).
    #[must_use]
    pub fn mirror_client(mut self, mirrors: Arc<dyn MirrorClient>) -> Self {
        self.mirrors = Some(mirrors);
        self
    }

    /// Creates or replaces the mirror pod of static pod `pod` (upstream `SyncPod`); failures are
    /// logged and tried again at the next sync, never holding up the pod itself.
    async fn sync_mirror_pod(&self, pod: &Pod, mirror: Option<&Arc<Pod>>) {
        let Some(client) = &self.mirrors else { return };
        if !is_static_pod(pod) {
            return;
        }
        let action = mirror_action(pod, mirror.map(AsRef::as_ref));
        let work = async {
            if let MirrorAction::Replace { uid } = &action {
                let (namespace, name) = (
                    pod.metadata.namespace.as_deref().unwrap_or("default"),
                    pod.metadata.name.as_deref().unwrap_or_default(),
                );
                info!(pod = %pod_full_name(pod), mirror.uid = %uid, "deleting an outdated mirror pod");
                client.delete_mirror_pod(namespace, name, Some(uid)).await?;
            }
            if action != MirrorAction::Keep {
                client.create_mirror_pod(pod).await?;
            }
            Ok::<_, String>(())
        };
        match tokio::time::timeout(MIRROR_TIMEOUT, work).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => warn!(pod = %pod_full_name(pod), error = %err, "failed creating a mirror pod"),
            Err(_) => {
                warn!(pod = %pod_full_name(pod), "failed creating a mirror pod: the API server did not answer in time")
            }
        }
    }

    /// The unsupported fields of `pod` for this agent: probes are implemented with a prober,
    /// lifecycle hooks when the runtime runs them, volumes as far as the volume manager sets them up.
    pub(crate) fn unsupported_fields(&self, pod: &Pod) -> Vec<String> {
        let abilities = crate::unsupported::Abilities::new(self.prober.is_some(), self.runtime.runs_hooks())
            .runtime_classes(self.runtime.runs_runtime_classes());
        match &self.volumes {
            Some(volumes) => {
                let supports = |volume: &k8s_openapi::api::core::v1::Volume| volumes.supports(volume);
                crate::unsupported::unsupported_fields(pod, abilities.volumes(&supports))
            }
            None => crate::unsupported::unsupported_fields(pod, abilities),
        }
    }

    /// Calls `hook` after every sync that may have changed the runtime (for example
    /// `Pleg::relist_now`, so the change is seen at once).
    #[must_use]
    pub fn after_change(mut self, hook: Arc<dyn Fn() + Send + Sync>) -> Self {
        self.after_change = Some(hook);
        self
    }

    /// Queues pods on `queue` for their next timed sync: a pod held back by a backoff for when the
    /// backoff ends, a pod with `activeDeadlineSeconds` for its deadline; so both happen on time
    /// rather than at the next periodic resync.
    #[must_use]
    pub fn work_queue(mut self, queue: Arc<WorkQueue>) -> Self {
        self.work_queue = Some(queue);
        self
    }

    /// Shares the start-up tracker with the runtime, which reports image pulls into it, so
    /// `kubelet_pod_start_sli_duration_seconds` leaves them out.
    #[must_use]
    pub fn startup_tracker(mut self, tracker: Arc<StartupTracker>) -> Self {
        self.startup = tracker;
        self
    }

    /// The runtime.
    pub fn runtime(&self) -> &Arc<R> {
        &self.runtime
    }

    /// The status store.
    pub fn statuses(&self) -> &Arc<StatusStore> {
        &self.statuses
    }

    /// The crash-loop backoff.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    fn changed(&self) {
        if let Some(hook) = &self.after_change {
            hook();
        }
    }

    /// The pod with its last known status: the stored one, with the conditions others own as
    /// the config has them; else the config's.
    fn with_last_status(&self, pod: &Pod) -> Pod {
        let mut pod = pod.clone();
        if let Some(stored) = self.statuses.get(&PodUid::of(&pod)) {
            pod.status = Some(status::with_others_conditions(stored.status, pod.status.as_ref()));
        }
        pod
    }

    /// The API status the kubelet computes for `pod` now.
    pub fn api_status(&self, pod: &Pod, runtime_status: &PodStatus, terminal: bool) -> ApiPodStatus {
        let pod = self.with_last_status(pod);
        let uid = PodUid::of(&pod);
        let failures = lock(&self.failures)
            .iter()
            .filter(|((u, _), _)| *u == uid)
            .map(|((_, name), f)| (name.clone(), f.clone()))
            .collect::<HashMap<_, _>>();
        let lookup = |name: &str| failures.get(name).cloned();
        let input = StatusInput::new(&pod, runtime_status, &lookup, now_time())
            .terminal(terminal)
            .runtime_name(&self.config.runtime_name)
            .host_ip(&self.config.node_ip)
            .secondary_host_ip(&self.config.secondary_node_ip)
            .probe_results(&self.probe_results);
        status::api_pod_status(&input)
    }

    /// Has the prober run the readiness probe of every started container that is not ready now,
    /// not at its next period (upstream's manual trigger in `UpdatePodStatus`), so a container
    /// is ready as soon as its probe passes after it starts.
    fn probe_readiness_of_unready(&self, uid: &PodUid, status: &ApiPodStatus) {
        let Some(prober) = &self.prober else { return };
        for container in status.container_statuses.iter().flatten() {
            if container.started == Some(true) && !container.ready {
                prober.probe_readiness_now(uid, &container.name);
            }
        }
    }

    /// Keeps the start failures of `result` (upstream's reason cache); returns whether any changed.
    fn record_failures(&self, uid: &PodUid, result: &runtime::PodSyncResult) -> bool {
        let mut failures = lock(&self.failures);
        let mut changed = false;
        for r in
            result.results.iter().filter(|r| matches!(r.action, SyncAction::StartContainer | SyncAction::InitContainer))
        {
            let key = (uid.clone(), r.target.clone());
            changed |= match &r.failure {
                Some(f) => {
                    let failure = StartFailure::new(&f.reason, &f.message);
                    failures.insert(key, failure.clone()) != Some(failure)
                }
                None => failures.remove(&key).is_some(),
            };
        }
        changed
    }

    /// Forgets everything kept about a pod.
    pub fn forget(&self, uid: &PodUid) {
        lock(&self.failures).retain(|(u, _), _| u != uid);
        lock(&self.dirs_made).remove(uid);
        if let Some(cgroups) = &self.cgroups {
            cgroups.forget(uid);
        }
        self.statuses.remove(uid);
        self.startup.forget(uid);
    }

    fn pod_dir(&self, uid: &PodUid) -> PathBuf {
        self.config.root_dir.join("pods").join(uid.as_str())
    }

    /// The pod's data directories (upstream `makePodDataDirs`), and the root and `pods`
    /// directories above them where they do not exist yet: 0750 as upstream makes them, so no
    /// other local user reads a pod's volumes (its projected token among them).
    async fn make_pod_dirs(&self, uid: &PodUid) -> std::io::Result<()> {
        for dir in ["volumes", "plugins", "containers"] {
            tokio::fs::DirBuilder::new()
                .recursive(true)
                .mode(PRIVATE_DIR_MODE)
                .create(self.pod_dir(uid).join(dir))
                .await?;
        }
        Ok(())
    }
}

/// How long the pod may still be active under `activeDeadlineSeconds` (zero once exceeded), or
/// `None` without a deadline or a start time.
fn deadline_remaining(pod: &Pod, status: &ApiPodStatus) -> Option<Duration> {
    let deadline = pod.spec.as_ref()?.active_deadline_seconds?;
    let start = status.start_time.as_ref()?;
    let allowed = Duration::from_secs(u64::try_from(deadline).unwrap_or(0));
    let elapsed = Duration::try_from(wall_now().duration_since(start.0)).unwrap_or(Duration::ZERO);
    Some(allowed.saturating_sub(elapsed))
}

/// How long ago the kubelet first saw the pod (its `config.seen` annotation).
fn since_first_seen(pod: &Pod) -> Option<Duration> {
    let seen = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(kubelet_core::types::annotations::CONFIG_SEEN))
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())?;
    Some(Duration::try_from(wall_now().duration_since(seen)).unwrap_or(Duration::ZERO))
}

impl<R: Runtime> PodSyncer for PodSync<R> {
    type Error = Error;

    async fn sync_pod(
        &self,
        update_type: SyncPodType,
        pod: &Arc<Pod>,
        mirror: Option<&Arc<Pod>>,
        runtime_status: &PodStatus,
    ) -> Result<bool, Error> {
        let uid = PodUid::of(pod);
        debug!(pod = %pod_full_name(pod), %update_type, "sync pod");
        let mut api_status = self.api_status(pod, runtime_status, false);
        self.probe_readiness_of_unready(&uid, &api_status);
        let deadline = deadline_remaining(pod, &api_status);
        if deadline == Some(Duration::ZERO) {
            api_status.phase = Some(status::FAILED.to_owned());
            api_status.reason = Some("DeadlineExceeded".to_owned());
            api_status.message = Some("Pod was active on the node longer than the specified deadline".to_owned());
            self.recorder.record(Event::new(
                EventType::Normal,
                "DeadlineExceeded",
                "Pod was active on the node longer than the specified deadline",
                ObjectRef::pod(pod),
            ));
        }
        let phase = api_status.phase.clone().unwrap_or_default();
        let was_running = self.statuses.phase(&uid).as_deref() == Some(status::RUNNING);
        if phase == status::RUNNING && !was_running {
            // Upstream records the start-up metrics in `SyncPod` on the first Running status.
            if let Some(since) = since_first_seen(pod) {
                self.startup.running(&uid, since);
            }
        }
        self.statuses.set(pod, api_status);
        if phase == status::SUCCEEDED || phase == status::FAILED {
            return Ok(true);
        }
        // Synced again when the deadline passes (upstream scans every pod each second for this).
        if let (Some(queue), Some(remaining)) = (&self.work_queue, deadline) {
            queue.enqueue(uid.clone(), remaining);
        }
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
        let network = self.runtime_state.network_errors();
        if !host_network && !network.is_empty() {
            let error = Error::NetworkNotReady(network.join("; "));
            self.recorder.record(Event::new(
                EventType::Warning,
                runtime::reasons::NETWORK_NOT_READY,
                error.to_string(),
                ObjectRef::pod(pod),
            ));
            return Err(error);
        }
        if let Some(cgroups) = &self.cgroups
            && let Err(err) = cgroups.ensure(pod)
        {
            let message = format!("unable to ensure pod container exists: {err}");
            self.recorder.record(Event::new(
                EventType::Warning,
                "FailedCreatePodContainer",
                message,
                ObjectRef::pod(pod),
            ));
            return Err(Error::PodCgroup(err));
        }
        if !lock(&self.dirs_made).contains(&uid) {
            if let Err(err) = self.make_pod_dirs(&uid).await {
                // Upstream's event (`FailedToMakePodDataDirectories`); the worker retries.
                let message = format!("error making pod data directories: {err}");
                self.recorder.record(Event::new(EventType::Warning, "Failed", message, ObjectRef::pod(pod)));
                return Err(Error::Io(err));
            }
            lock(&self.dirs_made).insert(uid.clone());
        }
        let volumes = match &self.volumes {
            Some(manager) => {
                let mounted = tokio::time::timeout(MOUNT_TIMEOUT, manager.mount_pod(pod)).await;
                match mounted.unwrap_or(Err(VolumeError::TimedOut { seconds: MOUNT_TIMEOUT.as_secs() })) {
                    Ok(volumes) => volumes,
                    Err(err) => {
                        // The containers keep waiting in ContainerCreating; the worker retries.
                        let message = format!("Unable to attach or mount volumes: {err}");
                        let event = Event::new(EventType::Warning, "FailedMount", message, ObjectRef::pod(pod));
                        self.recorder.record(event);
                        return Err(Error::Volume(err));
                    }
                }
            }
            None => PodVolumes::new(),
        };
        let result = self.runtime.sync_pod(pod, runtime_status, &self.backoff, &self.probe_results, &volumes).await;
        // After the containers' start, so an API server that does not answer delays no static pod.
        self.sync_mirror_pod(pod, mirror).await;
        if self.record_failures(&uid, &result) {
            // The reasons show at once (upstream shows them from the next sync on).
            self.statuses.set(pod, self.api_status(pod, runtime_status, false));
        }
        if let Some(queue) = &self.work_queue
            && let Some(delay) = result.failures().filter_map(|f| f.retry_after).min()
        {
            queue.enqueue(uid.clone(), delay);
        }
        if !result.results.is_empty() {
            self.changed();
        }
        if let Some(err) = result.errors().next() {
            return Err(Error::Sync { reason: err.reason.clone(), message: err.message.clone() });
        }
        Ok(false)
    }

    async fn sync_terminating_pod(
        &self,
        pod: &Arc<Pod>,
        runtime_status: &PodStatus,
        grace_period: i64,
        status_fn: Option<&PodStatusFn>,
    ) -> Result<(), Error> {
        let uid = PodUid::of(pod);
        // Nothing restarts a container on its way out; readiness is still probed until the pod
        // has terminated (upstream `StopLivenessAndStartup`).
        if let Some(prober) = &self.prober {
            prober.stop_liveness_and_startup(pod);
        }
        let mut api_status = self.api_status(pod, runtime_status, false);
        if let Some(edit) = status_fn {
            edit(&mut api_status);
        }
        self.statuses.set(pod, api_status);
        let mut running = runtime::Pod::new(uid.clone(), &runtime_status.name, &runtime_status.namespace);
        running.containers = runtime_status
            .container_statuses
            .iter()
            .filter(|c| c.state != ContainerState::Exited)
            .map(|c| runtime::Container::new(&c.id, &c.name, c.state))
            .collect();
        running.sandboxes =
            runtime_status.sandbox_statuses.iter().map(|s| runtime::Sandbox::new(&s.id, s.attempt, s.state)).collect();
        self.runtime
            .kill_pod(Some(pod), &running, Some(grace_period))
            .await
            .map_err(|e| Error::runtime("kill_pod", e))?;
        self.changed();
        let mut after = self
            .runtime
            .get_pod_status(&uid, &runtime_status.name, &runtime_status.namespace)
            .await
            .map_err(|e| Error::runtime("get_pod_status", e))?;
        // A stopped sandbox reports no IP; the pod keeps the ones it had (upstream
        // `preserveDataFromBeforeStopping`), as the PLEG's cache does, so the terminal status
        // is sent once, not once without them and again with them.
        after.ips.clone_from(&runtime_status.ips);
        let still: Vec<&str> = after
            .container_statuses
            .iter()
            .filter(|c| c.state == ContainerState::Running)
            .map(|c| c.name.as_str())
            .collect();
        if !still.is_empty() {
            return Err(Error::StillRunning(still.join(", ")));
        }
        let mut final_status = self.api_status(pod, &after, true);
        if let Some(edit) = status_fn {
            edit(&mut final_status);
        }
        self.statuses.set(pod, final_status);
        info!(pod = %pod_full_name(pod), "pod terminated");
        Ok(())
    }

    async fn sync_terminating_runtime_pod(&self, running: &runtime::Pod) -> Result<(), Error> {
        info!(pod.uid = %running.uid, pod.name = %running.name, "killing an orphaned pod that exists only in the runtime");
        self.runtime.kill_pod(None, running, Some(1)).await.map_err(|e| Error::runtime("kill_pod", e))?;
        // Nobody wants it back: its containers, sandboxes and logs go now, not at the next GC.
        let removed = self.runtime.remove_pod_content(&running.uid).await;
        self.changed();
        removed.map_err(|e| Error::runtime("remove_pod_content", e))
    }

    async fn sync_terminated_pod(&self, pod: &Arc<Pod>, runtime_status: &PodStatus) -> Result<(), Error> {
        if let Some(prober) = &self.prober {
            prober.remove_pod(pod);
        }
        let status = self.api_status(pod, runtime_status, true);
        self.statuses.set(pod, status);
        // Its volumes go now that nothing runs (upstream's volume manager unmounts them once the
        // pod has terminated); a failure is retried.
        if let Some(volumes) = &self.volumes {
            volumes.unmount_pod(&PodUid::of(pod)).await.map_err(Error::Volume)?;
        }
        // Nothing of it runs and its volumes are gone: the API may delete it (upstream
        // `TerminatePod` and the status manager's `canBeDeleted`).
        self.statuses.terminated(pod);
        // Its directories may go with its content; a pod that comes back with this UID makes them again.
        lock(&self.dirs_made).remove(&PodUid::of(pod));
        // Its CPU requests leave its QoS class's cgroup; its own cgroup goes with its content.
        if let Some(cgroups) = &self.cgroups {
            cgroups.forget(&PodUid::of(pod));
        }
        // Dead containers stay for GC, so their logs remain readable.
        Ok(())
    }

    fn is_network_not_ready(error: &Error) -> bool {
        matches!(error, Error::NetworkNotReady(_))
    }
}
