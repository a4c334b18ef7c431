//! The pod workers' state machine, without IO (upstream `pkg/kubelet/pod_workers.go`).
//!
//! `Core` holds every pod's sync status and the static-pod start order, and decides: what an
//! update does (`update_pod`), what a worker runs next (`start_pod_sync`), and what follows a sync
//! (`complete`).
//! It never blocks, spawns or sleeps: the async layer in `workers.rs` acts on the effects it
//! returns (spawn a worker, wake it, cancel its sync, requeue the pod), so every rule here is tested
//! by tables and by property tests without IO.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kubelet_core::{
    CompletionFn, KillPodOptions, PodStatusFn, PodUid, SyncPodType, UpdatePodOptions, WorkerState, WorkerSync,
    types::{is_static_pod, pod_full_name},
};
use tokio::time::Instant;

/// What a worker does next, derived from the pod's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WorkType {
    /// Bring the pod to its spec.
    Sync,
    /// Stop the pod.
    Terminating,
    /// Clean up after the stopped pod.
    Terminated,
}

impl From<WorkType> for WorkerState {
    fn from(kind: WorkType) -> WorkerState {
        match kind {
            WorkType::Sync => WorkerState::Syncing,
            WorkType::Terminating => WorkerState::Terminating,
            WorkType::Terminated => WorkerState::Terminated,
        }
    }
}

/// One pod's sync status (upstream `podSyncStatus`).
#[derive(Clone, Default)]
pub(crate) struct PodSyncStatus {
    full_name: String,
    /// A worker task exists for the pod.
    worker: bool,
    /// The worker has work queued or running.
    working: bool,
    pending: Option<UpdatePodOptions>,
    active: Option<UpdatePodOptions>,
    started_at: Option<Instant>,
    terminating_at: Option<Instant>,
    terminated_at: Option<Instant>,
    finished: bool,
    /// The effective grace period in seconds once termination is requested (0: not set yet).
    grace_period: i64,
    status_fns: Vec<PodStatusFn>,
    /// Completion callbacks of kills, called when the pod has stopped.
    on_complete: Vec<CompletionFn>,
    restart_requested: bool,
    evicted: bool,
    deleted: bool,
    /// The pod is known only from the runtime (no config was ever seen for this UID).
    runtime_only: bool,
    /// When the work queue will next offer the pod after a failed sync; housekeeping retries an
    /// idle termination from then on.
    retry_at: Option<Instant>,
}

impl PodSyncStatus {
    pub(crate) fn work_type(&self) -> WorkType {
        if self.terminated_at.is_some() {
            WorkType::Terminated
        } else if self.terminating_at.is_some() {
            WorkType::Terminating
        } else {
            WorkType::Sync
        }
    }

    pub(crate) fn is_started(&self) -> bool {
        self.started_at.is_some()
    }

    pub(crate) fn is_termination_requested(&self) -> bool {
        self.terminating_at.is_some()
    }

    pub(crate) fn is_terminated(&self) -> bool {
        self.terminated_at.is_some()
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    #[cfg(test)]
    pub(crate) fn grace_period(&self) -> i64 {
        self.grace_period
    }

    /// Remembers what the worker last acted on (upstream `mergeLastUpdate`).
    fn merge_last_update(&mut self, other: &UpdatePodOptions) {
        let active = self.active.get_or_insert_with(|| other.clone());
        // Keep the most recent real pod: a runtime-only update does not replace it.
        if active.pod.is_none() || other.running_pod.is_none() {
            active.pod = other.pod.clone();
        }
        active.running_pod = other.running_pod.clone();
        if other.mirror_pod.is_some() {
            active.mirror_pod = other.mirror_pod.clone();
        }
        active.update_type = other.update_type;
        if let Some(kill) = &other.kill {
            let mut kept = KillPodOptions::default();
            kept.grace_period_override = kill.grace_period_override;
            active.kill = Some(kept);
        }
    }
}

/// The effect of an update on the async layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UpdateEffect {
    /// Nothing to do; the reason is logged.
    Ignored(&'static str),
    /// The update is pending: wake the worker (spawning it first when `spawn`), and cancel the
    /// sync in flight when `cancel`.
    Queued { spawn: bool, cancel: bool },
}

/// What a worker runs.
#[derive(Clone)]
pub(crate) struct Work {
    pub(crate) kind: WorkType,
    pub(crate) options: UpdatePodOptions,
    /// Effective grace period in seconds, for terminating work.
    pub(crate) grace_period: i64,
    /// The status function of the newest kill, for terminating work.
    pub(crate) status_fn: Option<PodStatusFn>,
    /// The pod was started by this very call (for the start-latency metric).
    pub(crate) first_start: bool,
}

/// What `start_pod_sync` tells a woken worker.
pub(crate) enum Start {
    /// The worker must exit: the pod is forgotten, or it can never start.
    Exit,
    /// Nothing is pending.
    Idle,
    /// A static pod with the same full name runs: retry after the backoff.
    Wait,
    /// Run this.
    Run(Box<Work>),
}

/// How a sync ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It succeeded; for syncing work, `terminal` says the pod reached a terminal phase.
    Synced { terminal: bool },
    /// It failed.
    Failed { network_not_ready: bool },
    /// It was cancelled (a shorter grace period, or a kill while syncing).
    Cancelled,
}

/// When to sync the pod again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Requeue {
    /// At once (a phase transition).
    Immediately,
    /// After the resync interval, with jitter.
    Resync,
    /// After the error backoff, with jitter.
    Backoff,
    /// After the short network-not-ready backoff, with jitter.
    NetworkBackoff,
}

/// What follows a sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Completion {
    /// The worker exits.
    pub(crate) exit: bool,
    /// Put the pod on the work queue.
    pub(crate) requeue: Option<Requeue>,
    /// An update is pending: run the worker again at once.
    pub(crate) wake: bool,
}

/// Every pod's sync status and the static-pod start order.
#[derive(Default)]
pub(crate) struct Core {
    statuses: HashMap<PodUid, PodSyncStatus>,
    waiting_static: HashMap<String, VecDeque<PodUid>>,
    started_static: HashMap<String, PodUid>,
    pods_synced: bool,
    /// Idle workers that have work again (a static pod whose full name was released, a
    /// termination to retry): the caller wakes them.
    wakeups: Vec<PodUid>,
    /// How many lifecycle changes the workers went through ([`Core::lifecycle_generation`]).
    lifecycle: u64,
    /// How many workers are terminating and not finished.
    terminations_under_way: usize,
}

/// What of a worker's status housekeeping's walk depends on: its work type, whether it has
/// started, finished or was asked to restart, and whether it knows only the runtime's pod.
/// A routine sync changes none of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lifecycle {
    kind: WorkType,
    started: bool,
    finished: bool,
    restart_requested: bool,
    runtime_only: bool,
}

impl Lifecycle {
    /// A termination was asked for and has not finished.
    fn terminating(self) -> bool {
        self.kind != WorkType::Sync && !self.finished
    }
}

/// The pod an update is for: its config's UID, or the runtime pod's.
pub(crate) fn update_uid(options: &UpdatePodOptions) -> Option<PodUid> {
    options.pod.as_deref().map(PodUid::of).or_else(|| options.running_pod.as_ref().map(|r| r.uid.clone()))
}

/// The effective grace period of a terminating pod, and whether it shrank (upstream
/// `calculateEffectiveGracePeriod`): the current value, lowered by the pod's
/// `deletionGracePeriodSeconds` and by a kill override; with neither, the pod's
/// `terminationGracePeriodSeconds`; never below 1.
/// An explicit override of 0 (a force delete, a hard eviction) is kept as such and so becomes 1,
/// as in upstream since the `overridden` fix.
pub(crate) fn effective_grace_period(current: i64, pod: Option<&Pod>, kill: Option<&KillPodOptions>) -> (i64, bool) {
    let mut grace = current;
    let mut overridden = false;
    let mut lower = |value: Option<i64>| {
        if let Some(value) = value
            && (grace == 0 || value < grace)
        {
            grace = value;
            overridden = true;
        }
    };
    lower(pod.and_then(|p| p.metadata.deletion_grace_period_seconds));
    lower(kill.and_then(|k| k.grace_period_override));
    if !overridden
        && grace == 0
        && let Some(spec_grace) = pod.and_then(|p| p.spec.as_ref()).and_then(|s| s.termination_grace_period_seconds)
    {
        grace = spec_grace;
    }
    let grace = grace.max(1);
    (grace, current != 0 && current != grace)
}

fn phase_is_terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// A placeholder API pod for a pod known only to the runtime.
fn placeholder_pod(running: &kubelet_core::runtime::Pod) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            uid: Some(running.uid.to_string()),
            name: Some(running.name.clone()),
            namespace: Some(running.namespace.clone()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    })
}

impl Core {
    #[cfg(test)]
    pub(crate) fn status(&self, uid: &PodUid) -> Option<&PodSyncStatus> {
        self.statuses.get(uid)
    }

    /// The number of pods with a status, of full names with waiting static pods, and of started
    /// static pods: all three return to zero once every pod is forgotten.
    pub(crate) fn sizes(&self) -> (usize, usize, usize) {
        (self.statuses.len(), self.waiting_static.len(), self.started_static.len())
    }

    /// The number of lifecycle changes so far ([`Lifecycle`]: a worker added or forgotten, a
    /// work type, start, finish, restart request or runtime-only flag changed), or `None` while
    /// a termination is under way, whose retry comes with time alone.
    pub(crate) fn lifecycle_generation(&self) -> Option<u64> {
        (self.terminations_under_way == 0).then_some(self.lifecycle)
    }

    fn lifecycle_of(&self, uid: &PodUid) -> Option<Lifecycle> {
        self.statuses.get(uid).map(|status| Lifecycle {
            kind: status.work_type(),
            started: status.is_started(),
            finished: status.finished,
            restart_requested: status.restart_requested,
            runtime_only: status.runtime_only,
        })
    }

    /// Runs `change` and counts a lifecycle change if pod `uid`'s lifecycle moved, and a
    /// termination that started or ended.
    fn tracking<T>(&mut self, uid: Option<&PodUid>, change: impl FnOnce(&mut Self) -> T) -> T {
        let Some(uid) = uid else { return change(self) };
        let before = self.lifecycle_of(uid);
        let result = change(self);
        let after = self.lifecycle_of(uid);
        if before != after {
            self.lifecycle += 1;
        }
        match (before.is_some_and(Lifecycle::terminating), after.is_some_and(Lifecycle::terminating)) {
            (false, true) => self.terminations_under_way += 1,
            (true, false) => self.terminations_under_way -= 1,
            _ => {}
        }
        result
    }

    /// Applies an update (upstream `UpdatePod`), counting the lifecycle change it makes.
    pub(crate) fn update_pod(
        &mut self,
        options: UpdatePodOptions,
        now: Instant,
        runtime_terminal: impl FnOnce() -> bool,
    ) -> UpdateEffect {
        let uid = update_uid(&options);
        self.tracking(uid.as_ref(), |core| core.apply_update(options, now, runtime_terminal))
    }

    /// Applies an update (upstream `UpdatePod`).
    ///
    /// `runtime_terminal` says whether the status cache shows nothing running for the pod; it is
    /// asked only the first time a pod is seen with a terminal phase, to record such a pod as
    /// terminated at once after a restart.
    fn apply_update(
        &mut self,
        mut options: UpdatePodOptions,
        now: Instant,
        runtime_terminal: impl FnOnce() -> bool,
    ) -> UpdateEffect {
        // An orphan known only to the runtime can only be killed.
        let is_runtime_pod = options.running_pod.is_some() && options.pod.is_none();
        if is_runtime_pod && options.update_type != SyncPodType::Kill {
            return UpdateEffect::Ignored("runtime pods can only be killed");
        }
        if !is_runtime_pod {
            options.running_pod = None;
        }
        let (uid, full_name) = match (&options.pod, &options.running_pod) {
            (Some(pod), _) => (PodUid::of(pod), pod_full_name(pod)),
            (None, Some(running)) => {
                (running.uid.clone(), kubelet_core::types::full_name(&running.name, &running.namespace))
            }
            (None, None) => return UpdateEffect::Ignored("update names no pod"),
        };

        let first_time = !self.statuses.contains_key(&uid);
        let status = self.statuses.entry(uid.clone()).or_insert_with(|| {
            let mut status = PodSyncStatus { full_name: full_name.clone(), ..PodSyncStatus::default() };
            // After a restart, a pod terminal in config with nothing running is already terminated:
            // it still runs sync-terminated-pod, but never counts as active.
            if options.pod.as_deref().is_some_and(phase_is_terminal) && runtime_terminal() {
                status.terminating_at = Some(now);
                status.terminated_at = Some(now);
            }
            status
        });

        if is_runtime_pod {
            // Prefer the last real spec we saw; otherwise a placeholder built from the runtime pod.
            // Unlike upstream, a placeholder never passes for a real spec on a later update, so a
            // runtime-only pod stays runtime-only until config names its UID.
            let known = if status.runtime_only || first_time {
                None
            } else {
                status
                    .pending
                    .as_ref()
                    .and_then(|u| u.pod.clone())
                    .or_else(|| status.active.as_ref().and_then(|u| u.pod.clone()))
            };
            match known {
                Some(pod) => {
                    options.pod = Some(pod);
                    options.running_pod = None;
                }
                None => {
                    options.pod = options.running_pod.as_ref().map(placeholder_pod);
                    status.runtime_only = true;
                }
            }
        }
        let is_runtime_pod = options.running_pod.is_some();

        if !first_time && status.is_termination_requested() && options.update_type == SyncPodType::Create {
            status.restart_requested = true;
            return UpdateEffect::Ignored("pod is terminating; restart with the same UID is remembered");
        }
        if status.is_finished() {
            return UpdateEffect::Ignored("pod is finished, no further updates");
        }
        if !is_runtime_pod {
            status.runtime_only = false;
        }

        let Some(pod) = options.pod.clone() else { return UpdateEffect::Ignored("update names no pod") };
        let mut became_terminating = false;
        if !status.is_termination_requested() {
            if is_runtime_pod || pod.metadata.deletion_timestamp.is_some() {
                status.deleted = true;
                became_terminating = true;
            } else if phase_is_terminal(&pod) {
                became_terminating = true;
            } else if options.update_type == SyncPodType::Kill {
                status.evicted = options.kill.as_ref().is_some_and(|k| k.evict);
                became_terminating = true;
            }
            if became_terminating {
                status.terminating_at = Some(now);
            }
        }

        let mut grace_shortened = false;
        if status.is_terminated() {
            // A stale runtime-only kill while the pod worker finishes is dropped.
            if is_runtime_pod {
                return UpdateEffect::Ignored("pod is terminated; runtime-only kill ignored until the worker finishes");
            }
            // The pod already stopped: a kill's completion is immediate.
            if let Some(done) = options.kill.as_ref().and_then(|k| k.on_complete.as_ref()) {
                done();
            }
            options.kill = None;
        } else if status.is_termination_requested() {
            let mut kill = options.kill.take().unwrap_or_default();
            if let Some(status_fn) = &kill.status_fn {
                status.status_fns.push(status_fn.clone());
            }
            if let Some(done) = kill.on_complete.take() {
                status.on_complete.push(done);
            }
            let (grace, shortened) = effective_grace_period(status.grace_period, Some(&pod), Some(&kill));
            grace_shortened = shortened;
            status.grace_period = grace;
            kill.grace_period_override = Some(grace);
            options.kill = Some(kill);
        } else {
            // Kill options mean nothing outside termination; a completion waiter is not left hanging.
            if let Some(done) = options.kill.as_ref().and_then(|k| k.on_complete.as_ref()) {
                done();
            }
            options.kill = None;
        }

        let spawn = !status.worker;
        status.worker = true;
        // Keep the oldest start time, to measure the longest wait.
        if let Some(pending_start) = status.pending.as_ref().and_then(|p| p.start_time)
            && options.start_time.is_none_or(|t| pending_start < t)
        {
            options.start_time = Some(pending_start);
        }
        status.pending = Some(options);
        status.working = true;
        if spawn && is_static_pod(&pod) {
            // Static pods start in the order their workers were created.
            self.waiting_static.entry(full_name).or_default().push_back(uid);
        }
        UpdateEffect::Queued { spawn, cancel: became_terminating || grace_shortened }
    }

    /// Takes the pending update for a woken worker (upstream `startPodSync`), counting the
    /// lifecycle change it makes.
    pub(crate) fn start_pod_sync(&mut self, uid: &PodUid, now: Instant) -> Start {
        self.tracking(Some(uid), |core| core.take_pending(uid, now))
    }

    fn take_pending(&mut self, uid: &PodUid, now: Instant) -> Start {
        let Some(status) = self.statuses.get_mut(uid) else { return Start::Exit };
        let Some(options) = status.pending.take() else {
            status.working = false;
            return Start::Idle;
        };
        let kind = status.work_type();

        if status.is_started() {
            status.merge_last_update(&options);
            return Start::Run(Box::new(self.work(uid, kind, options, false)));
        }
        if options.running_pod.is_some() && kind == WorkType::Terminating {
            status.merge_last_update(&options);
            // Beyond upstream: an orphan still being stopped holds its full name, so a static pod
            // with the same name (say, an edited manifest) waits until the old one is gone.
            let full_name = status.full_name.clone();
            self.started_static.entry(full_name).or_insert_with(|| uid.clone());
            return Start::Run(Box::new(self.work(uid, kind, options, false)));
        }
        let Some(pod) = options.pod.clone() else {
            status.merge_last_update(&options);
            return Start::Exit;
        };

        // Only one static pod per full name may be started; the others wait in FIFO order.
        let (can_start, can_ever_start) = if !is_static_pod(&pod) {
            (true, true)
        } else if status.is_termination_requested() {
            (false, false)
        } else {
            let full_name = status.full_name.clone();
            (self.allow_static_pod_start(&full_name, uid), true)
        };
        let Some(status) = self.statuses.get_mut(uid) else { return Start::Exit };
        if !can_ever_start {
            // Terminated before it ever started: nothing ran, so nothing needs stopping.
            status.terminating_at.get_or_insert(now);
            self.finish(uid, now);
            return Start::Exit;
        }
        if !can_start {
            status.pending = Some(options);
            status.working = false;
            return Start::Wait;
        }
        status.started_at = Some(now);
        status.merge_last_update(&options);
        Start::Run(Box::new(self.work(uid, kind, options, true)))
    }

    fn work(&mut self, uid: &PodUid, kind: WorkType, options: UpdatePodOptions, first_start: bool) -> Work {
        let status = self.statuses.get_mut(uid);
        let (grace_period, status_fn) = match (kind, status) {
            (WorkType::Terminating, Some(status)) => {
                let (grace, _) =
                    effective_grace_period(status.grace_period, options.pod.as_deref(), options.kill.as_ref());
                status.grace_period = grace;
                (grace, status.status_fns.last().cloned())
            }
            _ => (0, None),
        };
        Work { kind, options, grace_period, status_fn, first_start }
    }

    /// Upstream `allowStaticPodStart`: may `uid` start among pods with `full_name`?
    fn allow_static_pod_start(&mut self, full_name: &str, uid: &PodUid) -> bool {
        if let Some(started) = self.started_static.get(full_name) {
            return started == uid;
        }
        let statuses = &self.statuses;
        if let Some(waiting) = self.waiting_static.get_mut(full_name) {
            // Drop waiters that were terminated or forgotten before their turn.
            while let Some(front) = waiting.front() {
                let gone = statuses.get(front).is_none_or(|s| s.is_termination_requested() || s.is_terminated());
                if !gone {
                    break;
                }
                waiting.pop_front();
            }
            match waiting.front() {
                Some(next) if next != uid => return false,
                Some(_) => {
                    waiting.pop_front();
                }
                None => {}
            }
            if waiting.is_empty() {
                self.waiting_static.remove(full_name);
            }
        }
        self.started_static.insert(full_name.to_owned(), uid.clone());
        true
    }

    /// Releases `full_name` if `uid` holds it, and wakes the first static pod waiting for it,
    /// so an edited manifest starts as soon as the old pod is gone (upstream waits for a resync).
    fn forget_started_static(&mut self, full_name: &str, uid: &PodUid) {
        if self.started_static.get(full_name) != Some(uid) {
            return;
        }
        self.started_static.remove(full_name);
        let statuses = &mut self.statuses;
        let next =
            self.waiting_static.get(full_name).into_iter().flatten().find(|waiter| {
                statuses.get(*waiter).is_some_and(|s| s.pending.is_some() && !s.is_termination_requested())
            });
        if let Some(next) = next.cloned()
            && let Some(status) = statuses.get_mut(&next)
            && !status.working
        {
            status.working = true;
            self.wakeups.push(next);
        }
    }

    /// The workers to wake, gathered since the last call.
    pub(crate) fn take_wakeups(&mut self) -> Vec<PodUid> {
        std::mem::take(&mut self.wakeups)
    }

    /// Records when the work queue offers the pod again, after a sync that asked for a requeue.
    pub(crate) fn note_retry(&mut self, uid: &PodUid, at: Instant) {
        if let Some(status) = self.statuses.get_mut(uid) {
            status.retry_at = Some(at);
        }
    }

    /// Marks the pod terminated and finished, with no worker and no pending work.
    fn finish(&mut self, uid: &PodUid, now: Instant) {
        let Some(status) = self.statuses.get_mut(uid) else { return };
        status.terminated_at.get_or_insert(now);
        status.finished = true;
        status.working = false;
        status.worker = false;
        status.pending = None;
        let full_name = status.full_name.clone();
        self.forget_started_static(&full_name, uid);
    }

    /// What follows a sync of `work` that ended with `outcome` (upstream's tail of
    /// `podWorkerLoop`, `completeSync`, `completeTerminating`, `completeTerminated`,
    /// `completeTerminatingRuntimePod` and `completeWork`).
    /// Counts the lifecycle change it makes.
    pub(crate) fn complete(&mut self, uid: &PodUid, work: &Work, outcome: Outcome, now: Instant) -> Completion {
        self.tracking(Some(uid), |core| core.complete_work(uid, work, outcome, now))
    }

    fn complete_work(&mut self, uid: &PodUid, work: &Work, outcome: Outcome, now: Instant) -> Completion {
        let mut requeue = match outcome {
            Outcome::Failed { network_not_ready: true } => Requeue::NetworkBackoff,
            Outcome::Failed { network_not_ready: false } | Outcome::Cancelled => Requeue::Backoff,
            Outcome::Synced { .. } => Requeue::Resync,
        };
        if let Outcome::Synced { terminal } = outcome {
            match work.kind {
                WorkType::Terminated => {
                    self.finish(uid, now);
                    return Completion { exit: true, requeue: None, wake: false };
                }
                WorkType::Terminating if work.options.running_pod.is_some() => {
                    // A runtime-only pod is not desired state: once stopped, forget it entirely.
                    if let Some(status) = self.statuses.remove(uid) {
                        self.forget_started_static(&status.full_name, uid);
                        status.on_complete.iter().for_each(|done| done());
                    }
                    return Completion { exit: true, requeue: None, wake: false };
                }
                WorkType::Terminating => {
                    if let Some(status) = self.statuses.get_mut(uid) {
                        status.terminated_at = Some(now);
                        status.status_fns.clear();
                        for done in status.on_complete.drain(..) {
                            done();
                        }
                        requeue_last_update(status);
                    }
                    requeue = Requeue::Immediately;
                }
                WorkType::Sync if terminal => {
                    if let Some(status) = self.statuses.get_mut(uid) {
                        status.terminating_at.get_or_insert(now);
                        requeue_last_update(status);
                    }
                    requeue = Requeue::Immediately;
                }
                WorkType::Sync => {}
            }
        }
        let Some(status) = self.statuses.get_mut(uid) else {
            return Completion { exit: true, requeue: None, wake: false };
        };
        let wake = status.pending.is_some();
        if !wake {
            status.working = false;
        }
        Completion { exit: false, requeue: Some(requeue), wake }
    }

    /// Housekeeping (upstream `SyncKnownPods`): forgets finished pods that are no longer desired
    /// (or whose UID was re-created), starts termination of undesired pods still running, and
    /// reports every remaining worker.
    /// Returns the report and the effects of the terminations it started.
    pub(crate) fn sync_known_pods(
        &mut self,
        desired: &HashSet<PodUid>,
        now: Instant,
    ) -> (HashMap<PodUid, WorkerSync>, Vec<(PodUid, UpdateEffect)>) {
        self.pods_synced = true;
        let mut kills = Vec::new();
        let uids: Vec<PodUid> = self.statuses.keys().cloned().collect();
        for uid in &uids {
            let orphan = !desired.contains(uid);
            let Some(status) = self.statuses.get_mut(uid) else { continue };
            if (status.restart_requested || orphan) && status.is_finished() {
                status.on_complete.drain(..).for_each(|done| done());
                let full_name = status.full_name.clone();
                self.statuses.remove(uid);
                self.lifecycle += 1;
                self.forget_started_static(&full_name, uid);
                if let Some(waiting) = self.waiting_static.get_mut(&full_name) {
                    waiting.retain(|u| u != uid);
                    if waiting.is_empty() {
                        self.waiting_static.remove(&full_name);
                    }
                }
                continue;
            }
            // A termination that failed is retried once its backoff has passed, whether or not
            // the pod is still in config: the work queue alone never offers a pod that left it.
            if status.is_termination_requested()
                && !status.is_finished()
                && !status.working
                && status.retry_at.is_none_or(|at| at <= now)
            {
                requeue_last_update(status);
                if status.working {
                    self.wakeups.push(uid.clone());
                }
            }
            if orphan {
                // Every orphan counts as deleted; its worker drives it to completion.
                status.deleted = true;
                if !status.is_termination_requested() {
                    let last = status.pending.as_ref().or(status.active.as_ref());
                    if let Some(pod) = last.and_then(|u| u.pod.clone()) {
                        let kill = UpdatePodOptions::new(SyncPodType::Kill, pod)
                            .with_mirror_pod(last.and_then(|u| u.mirror_pod.clone()));
                        kills.push(kill);
                    }
                }
            }
        }
        let effects = kills
            .into_iter()
            .filter_map(|kill| {
                let uid = kill.pod.as_deref().map(PodUid::of)?;
                Some((uid, self.update_pod(kill, now, || false)))
            })
            .collect();
        let report = self
            .statuses
            .iter()
            .map(|(uid, status)| {
                let config = status.active.as_ref().or(status.pending.as_ref()).and_then(|u| u.pod.as_deref());
                let sync = WorkerSync::new(
                    status.work_type().into(),
                    !desired.contains(uid),
                    config.is_some(),
                    config.is_some_and(is_static_pod),
                );
                (uid.clone(), sync)
            })
            .collect();
        (report, effects)
    }

    pub(crate) fn is_pod_known(&self, uid: &PodUid) -> bool {
        self.statuses.contains_key(uid)
    }

    pub(crate) fn is_pod_known_terminated(&self, uid: &PodUid) -> bool {
        self.statuses.get(uid).is_some_and(PodSyncStatus::is_terminated)
    }

    pub(crate) fn could_have_running_containers(&self, uid: &PodUid) -> bool {
        match self.statuses.get(uid) {
            Some(status) => !status.is_terminated(),
            // Once housekeeping has run, an unknown pod is known not to run.
            None => !self.pods_synced,
        }
    }

    pub(crate) fn is_pod_termination_requested(&self, uid: &PodUid) -> bool {
        self.statuses.get(uid).is_some_and(PodSyncStatus::is_termination_requested)
    }

    pub(crate) fn should_pod_runtime_be_removed(&self, uid: &PodUid) -> bool {
        self.statuses.get(uid).map_or(self.pods_synced, PodSyncStatus::is_terminated)
    }

    pub(crate) fn should_pod_content_be_removed(&self, uid: &PodUid) -> bool {
        self.statuses.get(uid).map_or(self.pods_synced, |s| s.evicted || (s.deleted && s.is_terminated()))
    }

    /// The pods that count as active for admission: known and not terminated.
    pub(crate) fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.statuses
            .values()
            .filter(|s| !s.is_terminated())
            .filter_map(|s| s.active.as_ref().or(s.pending.as_ref()).and_then(|u| u.pod.clone()))
            .collect()
    }

    /// Applies a kill that edits the final status (tests and eviction).
    #[cfg(test)]
    pub(crate) fn status_fns(&self, uid: &PodUid) -> usize {
        self.statuses.get(uid).map_or(0, |s| s.status_fns.len())
    }
}

/// Queues the last update again so the next phase runs at once (upstream `requeueLastPodUpdate`).
fn requeue_last_update(status: &mut PodSyncStatus) {
    if status.pending.is_some() {
        return;
    }
    if let Some(active) = status.active.clone() {
        status.pending = Some(active);
        status.working = true;
    }
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
