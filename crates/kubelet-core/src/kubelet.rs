//! The kubelet itself (upstream `pkg/kubelet/kubelet.go` and `kubelet_pods.go`): [`Kubelet`]
//! implements [`SyncHandler`] for the sync loop, and [`PodSync`] implements [`PodSyncer`] for
//! the pod workers. Both are generic over the [`Runtime`].
//!
//! They are two types because the pod workers own their syncer while the kubelet dispatches to
//! the workers: `Kubelet<R, W>` holds the workers `W`, and `W` holds `PodSync<R>`.

pub mod admission;
pub mod status_store;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Pod, PodStatus as ApiPodStatus},
    apimachinery::pkg::apis::meta::v1::Time,
};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use self::{
    admission::{NodeResources, admit},
    status_store::StatusStore,
};
use crate::{
    Backoff, PodManager, PodSyncer, PodUid, PodWorkers, Runtime, SourcesReady, SyncHandler, SyncPodType,
    UpdatePodOptions, WorkQueue,
    clock::wall_now,
    events::{Event, EventRecorder, EventType, ObjectRef},
    runtime::{self, ContainerState, PodStatus, SyncAction},
    state::RuntimeState,
    status::{self, StartFailure, StatusInput},
    types::{is_mirror_pod, pod_full_name},
    util::lock,
    workers::{KillPodOptions, NETWORK_NOT_READY_MESSAGE, PodStatusFn},
};

/// How the kubelet runs on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// The node's name.
    pub node_name: String,
    /// The node's IP (`status.hostIP`).
    pub node_ip: String,
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

    /// Sets the node's resources.
    #[must_use]
    pub fn node(mut self, node: NodeResources) -> Self {
        self.node = node;
        self
    }
}

/// Why a sync failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The runtime failed a call.
    #[error("runtime: {0}")]
    Runtime(String),
    /// The runtime sync left failures behind (other than backoffs).
    #[error("sync failed: {0}")]
    Sync(String),
    /// The pod network is not ready; the worker retries soon.
    #[error("network is not ready: {0}")]
    NetworkNotReady(String),
    /// Containers still run after a successful kill.
    #[error("detected running containers after a successful KillPod, CRI violation: {0}")]
    StillRunning(String),
    /// A pod directory could not be made.
    #[error("cannot make pod directories: {0}")]
    Io(#[from] std::io::Error),
}

/// What the pod workers call: upstream's `SyncPod`, `SyncTerminatingPod`,
/// `SyncTerminatingRuntimePod` and `SyncTerminatedPod`.
pub struct PodSync<R> {
    runtime: Arc<R>,
    runtime_state: Arc<RuntimeState>,
    statuses: Arc<StatusStore>,
    recorder: Arc<dyn EventRecorder>,
    backoff: Backoff,
    failures: Mutex<HashMap<(PodUid, String), StartFailure>>,
    config: Config,
    after_change: Option<Arc<dyn Fn() + Send + Sync>>,
    work_queue: Option<Arc<WorkQueue>>,
    startup: Arc<crate::startup::StartupTracker>,
}

impl<R> std::fmt::Debug for PodSync<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodSync").field("config", &self.config).finish_non_exhaustive()
    }
}

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
            startup: Arc::new(crate::startup::StartupTracker::new()),
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
    pub fn startup_tracker(mut self, tracker: Arc<crate::startup::StartupTracker>) -> Self {
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

    /// The pod with its last known status (the stored one, else the config's).
    fn with_last_status(&self, pod: &Pod) -> Pod {
        let mut pod = pod.clone();
        if let Some(stored) = self.statuses.get(&PodUid::of(&pod)) {
            pod.status = Some(stored.status);
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
            .host_ip(&self.config.node_ip);
        status::api_pod_status(&input)
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
        self.statuses.remove(uid);
        self.startup.forget(uid);
    }

    fn pod_dir(&self, uid: &PodUid) -> PathBuf {
        self.config.root_dir.join("pods").join(uid.as_str())
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
        .and_then(|a| a.get(crate::types::annotations::CONFIG_SEEN))
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())?;
    Some(Duration::try_from(wall_now().duration_since(seen)).unwrap_or(Duration::ZERO))
}

impl<R: Runtime> PodSyncer for PodSync<R> {
    type Error = Error;

    async fn sync_pod(
        &self,
        update_type: SyncPodType,
        pod: &Arc<Pod>,
        _mirror: Option<&Arc<Pod>>,
        runtime_status: &PodStatus,
    ) -> Result<bool, Error> {
        let uid = PodUid::of(pod);
        debug!(pod = %pod_full_name(pod), %update_type, "sync pod");
        let mut api_status = self.api_status(pod, runtime_status, false);
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
        let was_running = self.statuses.get(&uid).and_then(|s| s.status.phase).as_deref() == Some(status::RUNNING);
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
            return Err(Error::NetworkNotReady(network.join("; ")));
        }
        for dir in ["volumes", "plugins", "containers"] {
            tokio::fs::create_dir_all(self.pod_dir(&uid).join(dir)).await?;
        }
        let result = self.runtime.sync_pod(pod, runtime_status, &self.backoff).await;
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
            return Err(Error::Sync(format!("{}: {}", err.reason, err.message)));
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
            .map_err(|e| Error::Runtime(e.to_string()))?;
        self.changed();
        let after = self
            .runtime
            .get_pod_status(&uid, &runtime_status.name, &runtime_status.namespace)
            .await
            .map_err(|e| Error::Runtime(e.to_string()))?;
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
        self.runtime.kill_pod(None, running, Some(1)).await.map_err(|e| Error::Runtime(e.to_string()))?;
        // Nobody wants it back: its containers, sandboxes and logs go now, not at the next GC.
        let removed = self.runtime.remove_pod_content(&running.uid).await;
        self.changed();
        removed.map_err(|e| Error::Runtime(e.to_string()))
    }

    async fn sync_terminated_pod(&self, pod: &Arc<Pod>, runtime_status: &PodStatus) -> Result<(), Error> {
        let status = self.api_status(pod, runtime_status, true);
        self.statuses.set(pod, status);
        // Dead containers stay for GC, so their logs remain readable.
        Ok(())
    }

    fn is_network_not_ready(error: &Error) -> bool {
        matches!(error, Error::NetworkNotReady(_)) || error.to_string().contains(NETWORK_NOT_READY_MESSAGE)
    }
}

/// What the sync loop calls: upstream's `SyncHandler` on top of the pod workers.
pub struct Kubelet<R, W> {
    sync: Arc<PodSync<R>>,
    workers: Arc<W>,
    pods: Arc<PodManager>,
    sources: Arc<SourcesReady>,
    housekeepings: AtomicU64,
}

impl<R, W> std::fmt::Debug for Kubelet<R, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet").finish_non_exhaustive()
    }
}

/// Housekeeping runs runtime garbage collection every this many rounds (about a minute at 2 s).
const GC_EVERY: u64 = 30;

impl<R: Runtime, W: PodWorkers> Kubelet<R, W> {
    /// A kubelet over `sync` (the same one `workers` call) and `workers`.
    pub fn new(sync: Arc<PodSync<R>>, workers: Arc<W>, pods: Arc<PodManager>, sources: Arc<SourcesReady>) -> Self {
        Kubelet { sync, workers, pods, sources, housekeepings: AtomicU64::new(0) }
    }

    fn dispatch(&self, pod: Arc<Pod>, kind: SyncPodType) {
        let mirror = self.pods.mirror_pod_of(&pod);
        self.workers
            .update_pod(UpdatePodOptions::new(kind, pod).with_mirror_pod(mirror).with_start_time(Instant::now()));
    }

    fn is_terminal(&self, pod: &Pod) -> bool {
        let stored = self.sync.statuses.get(&PodUid::of(pod)).and_then(|s| s.status.phase);
        let phase = stored.or_else(|| pod.status.as_ref().and_then(|s| s.phase.clone()));
        matches!(phase.as_deref(), Some(status::SUCCEEDED | status::FAILED))
    }

    /// Pods that count against the node's capacity: known, not terminal, not terminated.
    fn active_pods(&self, except: &PodUid) -> Vec<Arc<Pod>> {
        self.pods
            .pods()
            .into_iter()
            .filter(|p| {
                PodUid::of(p) != *except
                    && !self.is_terminal(p)
                    && !self.workers.is_pod_known_terminated(&PodUid::of(p))
            })
            .collect()
    }

    fn reject(&self, pod: &Pod, reason: &str, message: &str) {
        self.sync.recorder.record(Event::new(EventType::Warning, reason, message, ObjectRef::pod(pod)));
        let status = ApiPodStatus {
            phase: Some(status::FAILED.to_owned()),
            reason: Some(reason.to_owned()),
            message: Some(format!("Pod was rejected: {message}")),
            qos_class: Some(crate::resources::qos_class(pod).to_owned()),
            ..ApiPodStatus::default()
        };
        self.sync.statuses.set(pod, status);
    }
}

impl<R: Runtime, W: PodWorkers> SyncHandler for Kubelet<R, W> {
    type Error = Error;

    async fn handle_pod_additions(&self, mut pods: Vec<Arc<Pod>>) {
        pods.sort_by(|a, b| a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp));
        for pod in pods {
            self.pods.add_pod(pod.clone());
            if is_mirror_pod(&pod) {
                continue;
            }
            let uid = PodUid::of(&pod);
            if !self.is_terminal(&pod) && !self.workers.is_pod_termination_requested(&uid) {
                let active = self.active_pods(&uid);
                let active: Vec<&Pod> = active.iter().map(AsRef::as_ref).collect();
                if let Err(rejection) = admit(&pod, &active, &self.sync.config.node) {
                    warn!(pod = %pod_full_name(&pod), reason = %rejection.reason, "pod rejected");
                    self.reject(&pod, &rejection.reason, &rejection.message);
                    continue;
                }
            }
            self.dispatch(pod, SyncPodType::Create);
        }
    }

    async fn handle_pod_updates(&self, pods: Vec<Arc<Pod>>) {
        for pod in pods {
            self.pods.update_pod(pod.clone());
            if !is_mirror_pod(&pod) {
                self.dispatch(pod, SyncPodType::Update);
            }
        }
    }

    async fn handle_pod_removes(&self, pods: Vec<Arc<Pod>>) {
        for pod in pods {
            self.pods.remove_pod(&pod);
            if is_mirror_pod(&pod) {
                continue;
            }
            // Until every source has spoken, a removal may be an artefact: housekeeping retries.
            if !self.sources.all_ready() {
                debug!(pod = %pod_full_name(&pod), "sources not ready; leaving the removal to housekeeping");
                continue;
            }
            self.workers.update_pod(UpdatePodOptions::new(SyncPodType::Kill, pod).with_kill(KillPodOptions::default()));
        }
    }

    async fn handle_pod_reconcile(&self, pods: Vec<Arc<Pod>>) {
        for pod in pods {
            self.pods.update_pod(pod.clone());
            let evicted = pod.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted");
            if evicted {
                // Its dead containers go at once.
                let uid = PodUid::of(&pod);
                if let Ok(status) = self.sync.runtime.get_pod_status(&uid, "", "").await {
                    for c in status.container_statuses.iter().filter(|c| c.state == ContainerState::Exited) {
                        let _ = self.sync.runtime.delete_container(&c.id).await;
                    }
                }
            }
        }
    }

    async fn handle_pod_syncs(&self, pods: Vec<Arc<Pod>>) {
        for pod in pods {
            // The newest config of the pod, if it changed meanwhile.
            let pod = self.pods.pod_by_uid(&PodUid::of(&pod)).unwrap_or(pod);
            self.dispatch(pod, SyncPodType::Sync);
        }
    }

    async fn handle_pod_cleanups(&self) -> Result<(), Error> {
        let desired = self.pods.pods();
        let desired_uids: HashSet<PodUid> = desired.iter().map(|p| PodUid::of(p)).collect();
        let workers = self.workers.sync_known_pods(&desired);
        // Pods in the runtime that nobody wants and no worker knows: running ones are orphans,
        // killed with a 1 s grace; what is left of stopped ones is removed.
        let in_runtime = self.sync.runtime.get_pods(true).await.map_err(|e| Error::Runtime(e.to_string()))?;
        for pod in in_runtime {
            if workers.contains_key(&pod.uid) || desired_uids.contains(&pod.uid) {
                continue;
            }
            let runs = pod.containers.iter().any(|c| c.state == ContainerState::Running)
                || pod.sandboxes.iter().any(|s| s.state == runtime::SandboxState::Ready);
            if runs {
                let kill = KillPodOptions { grace_period_override: Some(1), ..KillPodOptions::default() };
                self.workers.update_pod(UpdatePodOptions::kill_orphan(pod, kill));
            } else if let Err(err) = self.sync.runtime.remove_pod_content(&pod.uid).await {
                warn!(pod.uid = %pod.uid, pod.name = %pod.name, error = %err, "cannot remove a pod that is gone");
            }
        }
        // What is kept about pods that are gone.
        for uid in self.sync.statuses.uids() {
            if !desired_uids.contains(&uid) && !workers.contains_key(&uid) {
                self.sync.forget(&uid);
            }
        }
        if let Ok(mut entries) = tokio::fs::read_dir(self.sync.config.root_dir.join("pods")).await {
            while let Ok(Some(entry)) = entries.next_entry().await {
                let uid = PodUid::new(entry.file_name().to_string_lossy());
                if !desired_uids.contains(&uid)
                    && !workers.contains_key(&uid)
                    && let Err(err) = tokio::fs::remove_dir_all(entry.path()).await
                {
                    warn!(error = %err, dir = %entry.path().display(), "cannot remove an orphaned pod directory");
                }
            }
        }
        self.sync.backoff.gc(Instant::now());
        if self.housekeepings.fetch_add(1, Ordering::Relaxed).is_multiple_of(GC_EVERY) {
            let policy = runtime::GcPolicy::default();
            if let Err(err) = self.sync.runtime.garbage_collect(&policy, self.sources.all_ready(), false).await {
                warn!(error = %err, "container garbage collection failed");
            }
        }
        Ok(())
    }

    async fn handle_container_died(&self, uid: &PodUid, _container_id: &str) {
        // Keep the newest dead instance of each container; older ones go.
        let Ok(status) = self.sync.runtime.get_pod_status(uid, "", "").await else { return };
        let mut seen = HashSet::new();
        for c in status.container_statuses.iter().filter(|c| c.state == ContainerState::Exited) {
            if !seen.insert(c.name.clone()) {
                let _ = self.sync.runtime.delete_container(&c.id).await;
            }
        }
    }
}

#[cfg(test)]
mod tests;
