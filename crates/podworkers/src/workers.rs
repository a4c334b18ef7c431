//! The async pod workers: one tokio task per pod UID, driven by the state machine in `core.rs`.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use kubelet_core::{
    Cache, PodSyncer, PodUid, UpdatePodOptions, WorkQueue, WorkerState, WorkerSync,
    runtime::{ContainerState, PodStatus, SandboxState},
};
use tokio::{sync::Notify, time::Instant};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, debug, info_span, warn};

use crate::{
    core::{self, Core, Outcome, Requeue, Start, UpdateEffect, Work, WorkType},
    metrics,
};

/// Timing of the pod workers; defaults are upstream's.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Resync after a successful sync (`syncFrequency`, 1 min).
    pub resync_interval: Duration,
    /// Retry after a failed sync (10 s).
    pub backoff_period: Duration,
    /// Retry after a sync failed because the network is not ready (1 s).
    pub network_backoff_period: Duration,
    /// Every requeue waits up to this fraction longer, at random (0.5).
    pub jitter_factor: f64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            resync_interval: Duration::from_secs(60),
            backoff_period: Duration::from_secs(10),
            network_backoff_period: Duration::from_secs(1),
            jitter_factor: 0.5,
        }
    }
}

impl Config {
    /// Sets the resync interval.
    #[must_use]
    pub fn resync_interval(mut self, interval: Duration) -> Self {
        self.resync_interval = interval;
        self
    }

    /// Sets the retry period after a failed sync.
    #[must_use]
    pub fn backoff_period(mut self, period: Duration) -> Self {
        self.backoff_period = period;
        self
    }

    /// Sets the jitter factor (0 disables jitter).
    #[must_use]
    pub fn jitter_factor(mut self, factor: f64) -> Self {
        self.jitter_factor = factor;
        self
    }

    fn delay(&self, requeue: Requeue) -> Duration {
        let base = match requeue {
            Requeue::Immediately => return Duration::ZERO,
            Requeue::Resync => self.resync_interval,
            Requeue::Backoff => self.backoff_period,
            Requeue::NetworkBackoff => self.network_backoff_period,
        };
        base.mul_f64(1.0 + self.jitter_factor.max(0.0) * fastrand::f64())
    }
}

/// Sizes of the workers' bookkeeping, for leak checks and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Pods with a sync status.
    pub statuses: usize,
    /// Worker tasks alive.
    pub workers: usize,
    /// Full names with static pods waiting to start.
    pub waiting_static: usize,
    /// Full names with a started static pod.
    pub started_static: usize,
}

struct Handle {
    notify: Arc<Notify>,
    token: CancellationToken,
}

struct Inner {
    core: Core,
    handles: HashMap<PodUid, Handle>,
}

struct Shared<S> {
    syncer: Arc<S>,
    cache: Arc<Cache>,
    queue: Arc<WorkQueue>,
    config: Config,
    inner: Mutex<Inner>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl<S> Shared<S> {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Critical sections only call `Core` methods, which keep the maps consistent at every
        // return, so a poisoned lock still guards valid data.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One serialized worker per pod (upstream `podWorkers`).
///
/// Cloning is cheap; clones share the workers.
pub struct PodWorkers<S> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for PodWorkers<S> {
    fn clone(&self) -> Self {
        PodWorkers { shared: self.shared.clone() }
    }
}

impl<S> std::fmt::Debug for PodWorkers<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodWorkers").field("config", &self.shared.config).finish_non_exhaustive()
    }
}

/// Whether the cached runtime status shows nothing running (upstream `isPodStatusCacheTerminal`).
fn runtime_terminal(status: &PodStatus) -> bool {
    !status.container_statuses.iter().any(|c| c.state == ContainerState::Running)
        && !status.sandbox_statuses.iter().any(|s| s.state == SandboxState::Ready)
}

impl<S: PodSyncer> PodWorkers<S> {
    /// Creates the workers. Every worker task stops when `cancel` fires; `syncer` does the work,
    /// `cache` is the PLEG's status cache, and `queue` receives requeued pods.
    pub fn new(
        syncer: Arc<S>,
        cache: Arc<Cache>,
        queue: Arc<WorkQueue>,
        config: Config,
        cancel: CancellationToken,
    ) -> Self {
        let inner = Mutex::new(Inner { core: Core::default(), handles: HashMap::new() });
        let shared = Shared { syncer, cache, queue, config, inner, tracker: TaskTracker::new(), cancel };
        PodWorkers { shared: Arc::new(shared) }
    }

    /// Waits until every worker task has stopped (after the cancellation token fired).
    pub async fn wait(&self) {
        self.shared.tracker.close();
        self.shared.tracker.wait().await;
    }

    /// The pods that count as active for admission: known to a worker and not terminated.
    pub fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.shared.lock().core.active_pods()
    }

    /// Sizes of the bookkeeping.
    pub fn stats(&self) -> Stats {
        let inner = self.shared.lock();
        let (statuses, waiting_static, started_static) = inner.core.sizes();
        Stats { statuses, workers: inner.handles.len(), waiting_static, started_static }
    }
}

/// Carries out an update's effect: spawn or wake the pod's worker, cancel its sync in flight.
fn apply<S: PodSyncer>(shared: &Arc<Shared<S>>, inner: &mut Inner, uid: PodUid, effect: UpdateEffect) {
    let UpdateEffect::Queued { spawn, cancel } = effect else {
        if let UpdateEffect::Ignored(reason) = effect {
            debug!(pod.uid = %uid, reason, "pod update ignored");
        }
        return;
    };
    if spawn || !inner.handles.contains_key(&uid) {
        let handle = Handle { notify: Arc::new(Notify::new()), token: shared.cancel.child_token() };
        // `pod.name` is recorded once the worker knows the pod's full name.
        let span = info_span!("pod_worker", pod.uid = %uid, pod.name = tracing::field::Empty);
        shared.tracker.spawn(worker_loop(shared.clone(), uid.clone(), handle.notify.clone()).instrument(span));
        inner.handles.insert(uid.clone(), handle);
    }
    if let Some(handle) = inner.handles.get(&uid) {
        handle.notify.notify_one();
        if cancel {
            debug!(pod.uid = %uid, "cancelling the sync in flight");
            handle.token.cancel();
        }
    }
}

/// Wakes the workers the core says have work again.
fn wake<S: PodSyncer>(shared: &Arc<Shared<S>>, inner: &mut Inner) {
    for uid in inner.core.take_wakeups() {
        debug!(pod.uid = %uid, "waking an idle pod worker");
        apply(shared, inner, uid, UpdateEffect::Queued { spawn: false, cancel: false });
    }
}

impl<S: PodSyncer> kubelet_core::PodWorkers for PodWorkers<S> {
    fn update_pod(&self, options: UpdatePodOptions) {
        let Some(uid) = core::update_uid(&options) else {
            warn!("pod update names no pod");
            return;
        };
        let cache = &self.shared.cache;
        let mut inner = self.shared.lock();
        let effect = inner.core.update_pod(options, Instant::now(), || runtime_terminal(&cache.get(&uid).status));
        apply(&self.shared, &mut inner, uid, effect);
    }

    fn sync_known_pods(&self, desired: &[Arc<Pod>]) -> HashMap<PodUid, WorkerSync> {
        let desired: HashSet<PodUid> = desired.iter().map(|p| PodUid::of(p)).collect();
        let mut inner = self.shared.lock();
        let (report, effects) = inner.core.sync_known_pods(&desired, Instant::now());
        for (uid, effect) in effects {
            apply(&self.shared, &mut inner, uid, effect);
        }
        wake(&self.shared, &mut inner);
        drop(inner);
        let mut counts: HashMap<(&'static str, &'static str, bool), usize> = HashMap::new();
        for sync in report.values() {
            let lifecycle = match sync.state {
                WorkerState::Syncing => "sync",
                WorkerState::Terminating => "terminating",
                _ => "terminated",
            };
            let config = match (sync.orphan, sync.has_config) {
                (false, _) => "desired",
                (true, true) => "orphan",
                (true, false) => "runtime_only",
            };
            *counts.entry((lifecycle, config, sync.is_static)).or_default() += 1;
        }
        for lifecycle in ["sync", "terminating", "terminated"] {
            for config in ["desired", "orphan", "runtime_only"] {
                for is_static in [false, true] {
                    let count = counts.get(&(lifecycle, config, is_static)).copied().unwrap_or(0);
                    metrics::set_working_pods(lifecycle, config, is_static, count);
                }
            }
        }
        report
    }

    fn lifecycle_generation(&self) -> Option<u64> {
        self.shared.lock().core.lifecycle_generation()
    }

    fn is_pod_known(&self, uid: &PodUid) -> bool {
        self.shared.lock().core.is_pod_known(uid)
    }

    fn is_pod_known_terminated(&self, uid: &PodUid) -> bool {
        self.shared.lock().core.is_pod_known_terminated(uid)
    }

    fn could_have_running_containers(&self, uid: &PodUid) -> bool {
        self.shared.lock().core.could_have_running_containers(uid)
    }

    fn is_pod_termination_requested(&self, uid: &PodUid) -> bool {
        self.shared.lock().core.is_pod_termination_requested(uid)
    }

    fn should_pod_containers_be_terminating(&self, uid: &PodUid) -> bool {
        self.shared.lock().core.is_pod_termination_requested(uid)
    }

    fn should_pod_runtime_be_removed(&self, uid: &PodUid) -> bool {
        self.shared.lock().core.should_pod_runtime_be_removed(uid)
    }

    fn should_pod_content_be_removed(&self, uid: &PodUid) -> bool {
        self.shared.lock().core.should_pod_content_be_removed(uid)
    }

    async fn wait(&self) {
        PodWorkers::wait(self).await;
    }
}

fn operation(work: &Work) -> &'static str {
    match (work.kind, work.options.update_type) {
        (WorkType::Terminated, _) => "terminated",
        (_, kubelet_core::SyncPodType::Create) => "create",
        (_, kubelet_core::SyncPodType::Update) => "update",
        (_, kubelet_core::SyncPodType::Kill) => "kill",
        _ => "sync",
    }
}

async fn worker_loop<S: PodSyncer>(shared: Arc<Shared<S>>, uid: PodUid, notify: Arc<Notify>) {
    // Upstream's zero time: the first sync takes whatever the cache holds after the first relist.
    let mut last_sync: Option<Instant> = None;
    let mut named = false;
    loop {
        tokio::select! {
            biased;
            () = shared.cancel.cancelled() => return,
            () = notify.notified() => {}
        }
        let (work, token) = {
            let mut inner = shared.lock();
            match inner.core.start_pod_sync(&uid, Instant::now()) {
                Start::Exit => {
                    inner.handles.remove(&uid);
                    return;
                }
                Start::Idle => continue,
                Start::Wait => {
                    drop(inner);
                    shared.queue.enqueue(uid.clone(), shared.config.delay(Requeue::Backoff));
                    continue;
                }
                Start::Run(work) => {
                    let Some(handle) = inner.handles.get_mut(&uid) else { return };
                    if handle.token.is_cancelled() {
                        handle.token = shared.cancel.child_token();
                    }
                    (work, handle.token.clone())
                }
            }
        };
        if !named && let Some(pod) = &work.options.pod {
            tracing::Span::current()
                .record("pod.name", tracing::field::display(kubelet_core::types::pod_full_name(pod)));
            named = true;
        }
        if work.first_start
            && let Some(start) = work.options.start_time
        {
            metrics::observe_start_duration(start.elapsed());
        }

        // Boxed: a sync's future holds every await of the syncer's work, kilobytes that an idle
        // worker (most of a node's, most of the time) would otherwise carry in its task.
        let sync = Box::pin(run_sync(&shared, &uid, &work, last_sync));
        let outcome = tokio::select! {
            biased;
            () = token.cancelled() => Outcome::Cancelled,
            outcome = sync => outcome,
        };
        last_sync = Some(Instant::now());

        let completion = {
            let mut inner = shared.lock();
            let now = Instant::now();
            let completion = inner.core.complete(&uid, &work, outcome, now);
            if completion.exit {
                inner.handles.remove(&uid);
            }
            if let Some(requeue) = completion.requeue {
                let delay = shared.config.delay(requeue);
                shared.queue.enqueue(uid.clone(), delay);
                inner.core.note_retry(&uid, now + delay);
            }
            wake(&shared, &mut inner);
            completion
        };
        if let Some(start) = work.options.start_time {
            metrics::observe_worker_duration(operation(&work), start.elapsed());
        }
        if completion.exit {
            return;
        }
        if completion.wake {
            notify.notify_one();
        }
    }
}

async fn run_sync<S: PodSyncer>(shared: &Shared<S>, uid: &PodUid, work: &Work, last_sync: Option<Instant>) -> Outcome {
    let options = &work.options;
    let Some(pod) = options.pod.as_ref() else { return Outcome::Failed { network_not_ready: false } };
    let status = if options.running_pod.is_some() {
        // A runtime-only pod is killed from what the runtime listed; no status is needed.
        Arc::new(PodStatus::new(uid.clone(), "", ""))
    } else {
        if work.kind == WorkType::Terminated {
            // The pod was just stopped: ask for a relist now instead of waiting out the PLEG's
            // period, so its final status (and a static pod waiting for its name) comes at once.
            shared.cache.request_refresh();
        }
        let cached = shared.cache.get_newer_than(uid, last_sync).await;
        if let Some(err) = cached.error {
            warn!(error = %err, "error determining pod status");
            return Outcome::Failed { network_not_ready: false };
        }
        cached.status
    };
    let result = match work.kind {
        WorkType::Terminated => shared.syncer.sync_terminated_pod(pod, &status).await.map(|()| false),
        WorkType::Terminating => match &options.running_pod {
            Some(running) => shared.syncer.sync_terminating_runtime_pod(running).await.map(|()| false),
            None => shared
                .syncer
                .sync_terminating_pod(pod, &status, work.grace_period, work.status_fn.as_ref())
                .await
                .map(|()| false),
        },
        WorkType::Sync => shared.syncer.sync_pod(options.update_type, pod, options.mirror_pod.as_ref(), &status).await,
    };
    match result {
        Ok(terminal) => Outcome::Synced { terminal },
        Err(err) => {
            warn!(error = %kubelet_core::ErrorChain(&err), work = ?work.kind, "error syncing pod");
            Outcome::Failed { network_not_ready: S::is_network_not_ready(&err) }
        }
    }
}

#[cfg(test)]
mod tests;
