//! The pod workers' contract: `PodWorkers`, which the kubelet feeds, and `PodSyncer`, which the
//! workers call back into (upstream `pkg/kubelet/pod_workers.go`).

use std::{collections::HashMap, fmt, future::Future, sync::Arc};

use k8s_openapi::api::core::v1::{Pod, PodStatus as ApiPodStatus};
use tokio::time::Instant;

use crate::{
    PodUid, SyncPodType,
    runtime::{self, PodStatus},
};

/// A function that edits the pod's API status when it is killed (for example to mark it evicted).
pub type PodStatusFn = Arc<dyn Fn(&mut ApiPodStatus) + Send + Sync>;

/// Called once the kill it came with has finished: every container of the pod is stopped
/// (upstream's `CompletedCh`). Eviction and shutdown wait on it.
pub type CompletionFn = Arc<dyn Fn() + Send + Sync>;

/// How to kill a pod.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct KillPodOptions {
    /// The pod is being evicted.
    pub evict: bool,
    /// A grace period in seconds that replaces the pod's own, if shorter.
    pub grace_period_override: Option<i64>,
    /// Edits the final API status.
    pub status_fn: Option<PodStatusFn>,
    /// Called once the pod has stopped.
    pub on_complete: Option<CompletionFn>,
}

impl fmt::Debug for KillPodOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KillPodOptions")
            .field("evict", &self.evict)
            .field("grace_period_override", &self.grace_period_override)
            .field("status_fn", &self.status_fn.is_some())
            .field("on_complete", &self.on_complete.is_some())
            .finish()
    }
}

impl KillPodOptions {
    /// Kills with at most `seconds` of grace, whatever the pod's own grace period.
    #[must_use]
    pub fn grace_period_override(mut self, seconds: i64) -> Self {
        self.grace_period_override = Some(seconds);
        self
    }

    /// An eviction: the pod ends with the API status `status_fn` makes of it.
    pub fn evict(status_fn: PodStatusFn) -> Self {
        KillPodOptions { evict: true, status_fn: Some(status_fn), ..KillPodOptions::default() }
    }

    /// Calls `on_complete` once every container of the pod has stopped.
    #[must_use]
    pub fn on_complete(mut self, on_complete: CompletionFn) -> Self {
        self.on_complete = Some(on_complete);
        self
    }
}

/// One request to a pod worker (upstream `UpdatePodOptions`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct UpdatePodOptions {
    /// Why the pod is synced.
    pub update_type: SyncPodType,
    /// When the update was first observed, for latency metrics.
    pub start_time: Option<Instant>,
    /// The pod, when it is in config.
    pub pod: Option<Arc<Pod>>,
    /// The pod's mirror pod, for static pods.
    pub mirror_pod: Option<Arc<Pod>>,
    /// For orphans that exist only in the runtime: what is running.
    pub running_pod: Option<runtime::Pod>,
    /// For kills: how.
    pub kill: Option<KillPodOptions>,
}

impl UpdatePodOptions {
    /// An update of `update_type` for a pod in config.
    pub fn new(update_type: SyncPodType, pod: Arc<Pod>) -> Self {
        UpdatePodOptions {
            update_type,
            start_time: None,
            pod: Some(pod),
            mirror_pod: None,
            running_pod: None,
            kill: None,
        }
    }

    /// A kill of a pod that exists only in the runtime.
    pub fn kill_orphan(running: runtime::Pod, kill: KillPodOptions) -> Self {
        UpdatePodOptions {
            update_type: SyncPodType::Kill,
            start_time: None,
            pod: None,
            mirror_pod: None,
            running_pod: Some(running),
            kill: Some(kill),
        }
    }

    /// Sets the mirror pod.
    #[must_use]
    pub fn with_mirror_pod(mut self, mirror: Option<Arc<Pod>>) -> Self {
        self.mirror_pod = mirror;
        self
    }

    /// Sets the start time.
    #[must_use]
    pub fn with_start_time(mut self, at: Instant) -> Self {
        self.start_time = Some(at);
        self
    }

    /// Sets the kill options.
    #[must_use]
    pub fn with_kill(mut self, kill: KillPodOptions) -> Self {
        self.kill = Some(kill);
        self
    }
}

/// A worker's lifecycle state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WorkerState {
    /// The pod should be running.
    Syncing,
    /// The pod is being stopped.
    Terminating,
    /// The pod is stopped; its resources are being cleaned up or are gone.
    Terminated,
}

/// What `sync_known_pods` reports about one worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerSync {
    /// The worker's state.
    pub state: WorkerState,
    /// The pod exists only in the runtime.
    pub orphan: bool,
    /// The worker holds the pod's config.
    pub has_config: bool,
    /// The pod is a static pod.
    pub is_static: bool,
}

impl WorkerSync {
    /// Creates a report.
    pub fn new(state: WorkerState, orphan: bool, has_config: bool, is_static: bool) -> Self {
        WorkerSync { state, orphan, has_config, is_static }
    }
}

/// The per-pod workers the kubelet dispatches work to.
///
/// Every method returns at once: work happens on the workers' own tasks.
pub trait PodWorkers: Send + Sync + 'static {
    /// Queues an update for the pod's worker, creating the worker if needed.
    fn update_pod(&self, options: UpdatePodOptions);

    /// Housekeeping: starts termination of every worker whose pod is not in `desired`, forgets
    /// finished workers of pods no longer desired, and reports every remaining worker.
    fn sync_known_pods(&self, desired: &[Arc<Pod>]) -> HashMap<PodUid, WorkerSync>;

    /// A number that moves whenever a worker's lifecycle changes (it is added or removed, its
    /// work type moves from sync to terminating to terminated, it finishes, a restart is asked
    /// for, it learns the pod's config), and not for routine syncs; `None` while something
    /// that comes with time alone may change what [`sync_known_pods`](Self::sync_known_pods)
    /// does (a termination under way, retried after its backoff).
    ///
    /// Housekeeping walks the pods again only when something it reads moved; `None`, the
    /// default, walks every time.
    fn lifecycle_generation(&self) -> Option<u64> {
        None
    }

    /// Whether the worker for `uid` exists.
    fn is_pod_known(&self, uid: &PodUid) -> bool;

    /// Whether the pod has finished terminating (or was never started and never will be).
    fn is_pod_known_terminated(&self, uid: &PodUid) -> bool;

    /// Whether the pod may still have running containers (it was started and is not terminated).
    fn could_have_running_containers(&self, uid: &PodUid) -> bool;

    /// Whether termination was requested for the pod.
    fn is_pod_termination_requested(&self, uid: &PodUid) -> bool;

    /// Whether the pod's containers should be stopping or stopped.
    fn should_pod_containers_be_terminating(&self, uid: &PodUid) -> bool;

    /// Whether the pod's runtime resources may be removed.
    fn should_pod_runtime_be_removed(&self, uid: &PodUid) -> bool;

    /// Whether the pod's content (volumes, directories) may be removed.
    fn should_pod_content_be_removed(&self, uid: &PodUid) -> bool;

    /// Waits until every worker task has stopped, once the workers' cancellation token fired.
    /// The default returns at once, for workers without tasks of their own.
    fn wait(&self) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
}

/// The message by which a sync error says the pod network is not ready (upstream
/// `NetworkNotReadyErrorMsg`); the worker then retries after 1 s instead of 10 s.
pub const NETWORK_NOT_READY_MESSAGE: &str = "network is not ready";

/// What the pod workers call to do the actual work: implemented by the kubelet.
///
/// The workers may drop any of these futures at an await point, when a shorter grace period or
/// shutdown cancels the sync in flight; implementations must leave the runtime in a state the
/// next sync can pick up from.
pub trait PodSyncer: Send + Sync + 'static {
    /// The error the sync methods return.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Brings a pod that should run to its spec; returns whether the pod is now terminal.
    fn sync_pod(
        &self,
        update_type: SyncPodType,
        pod: &Arc<Pod>,
        mirror_pod: Option<&Arc<Pod>>,
        status: &PodStatus,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// Stops every container of a terminating pod within `grace_period` seconds; repeated until it
    /// succeeds.
    fn sync_terminating_pod(
        &self,
        pod: &Arc<Pod>,
        status: &PodStatus,
        grace_period: i64,
        status_fn: Option<&PodStatusFn>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Stops a pod that exists only in the runtime.
    fn sync_terminating_runtime_pod(
        &self,
        running: &runtime::Pod,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Cleans up after a terminated pod (volumes, cgroups) and records its final status.
    fn sync_terminated_pod(
        &self,
        pod: &Arc<Pod>,
        status: &PodStatus,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Whether `error` means the pod network is not ready yet (retry soon rather than back off).
    /// The default looks for [`NETWORK_NOT_READY_MESSAGE`], as upstream does.
    fn is_network_not_ready(error: &Self::Error) -> bool {
        error.to_string().contains(NETWORK_NOT_READY_MESSAGE)
    }
}
