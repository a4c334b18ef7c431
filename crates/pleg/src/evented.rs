//! The evented PLEG (upstream `pkg/kubelet/pleg/evented.go`, KEP-3386): the runtime's container
//! event stream updates the cache and produces events at once, with a slow relist as a safety net
//! and a fallback to the relisting PLEG.

use std::{sync::Arc, time::Duration};

use kubelet_core::{
    Cache, ErrorChain, HealthError, Pleg, PodLifecycleEvent, PodLifecycleEventKind,
    clock::wall_now,
    k8s_openapi::jiff::Timestamp,
    runtime::{ChangeHint, ContainerEvent, ContainerEventKind, EventStreamError, RuntimeEvents},
};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::generic::{self, GenericPleg, preserve_ips};

/// Timing of the evented PLEG; defaults are upstream's.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// The safety-net relist period while events flow (300 s).
    pub relist_period: Duration,
    /// The health threshold while events flow (10 min).
    pub relist_threshold: Duration,
    /// Stream failures after which the PLEG falls back to relisting (5).
    pub max_failures: u32,
    /// How often the cache's global timestamp is bumped while events flow (5 s), so pod workers
    /// waiting on the cache barrier never wait for a relist.
    pub cache_bump_period: Duration,
    /// The relisting PLEG used for the safety net and after a fallback (1 s / 3 min).
    pub fallback: generic::Config,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            relist_period: Duration::from_secs(300),
            relist_threshold: Duration::from_secs(600),
            max_failures: 5,
            cache_bump_period: Duration::from_secs(5),
            fallback: generic::Config::default(),
        }
    }
}

/// When the PLEG relists after a change hint (and after subscribing): 10 ms, 100 ms, 250 ms and
/// 1 s after the latest one.
///
/// A hint comes before the runtime's CRI state shows the change: containerd publishes a task's
/// start or exit before its CRI plugin has recorded it, so a relist at once would mostly see
/// nothing new. A hint stream need not say when it stands either (containerd answers a
/// subscription with its first event). The later relists catch what the first missed; after the
/// last one the PLEG is no later than its 1 s relisting fallback would be.
const HINT_FOLLOW_UPS: [Duration; 4] =
    [Duration::from_millis(10), Duration::from_millis(100), Duration::from_millis(250), Duration::from_millis(1000)];

/// The least time between two relists that hints cause, at its largest: a burst of hints (50 pods
/// starting) makes a relist at most every 100 ms, not one per hint, each of which would inspect
/// pods half-created and compete with the runtime for the node's CPUs. The gap is the generic
/// PLEG's ([`GenericPleg::gap`]): shorter where relists cost little.
const HINT_MIN_GAP: Duration = generic::MAX_RELIST_GAP;

/// The follow-ups after an exit hint ([`ChangeHint::Exited`]): denser early on, because the
/// kubelet restarts a container when its death shows, and containerd's CRI plugin records an exit
/// a few milliseconds after publishing it.
/// Exits are few while pods start, so the burst the wider gap guards against does not come.
const EXIT_FOLLOW_UPS: [Duration; 6] = [
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(1000),
];

/// The least time between two relists while exit follow-ups are due.
const EXIT_MIN_GAP: Duration = Duration::from_millis(25);

/// How long after an exit hint its dense follow-ups last: a plain hint after that ends them (the
/// last dense one is at 100 ms). Without it, a stream of plain hints (pods starting after a
/// teardown's exits) kept the exit's 25 ms gap for as long as it lasted.
const EXIT_DENSE_FOR: Duration = Duration::from_millis(100);

/// When the relists that change hints cause are due: a pure schedule, fed the times of hints and
/// of the relists it asked for.
#[derive(Debug)]
struct HintSchedule {
    hinted_at: Instant,
    /// The next of the follow-ups after `hinted_at`, if any is left.
    next: Option<usize>,
    last_relist: Option<Instant>,
    /// An exit hint came since the follow-ups last ran out, at `exited_at`, and no plain hint
    /// came [`EXIT_DENSE_FOR`] after it: [`EXIT_FOLLOW_UPS`] apply.
    exit: bool,
    exited_at: Instant,
    /// The least time between two relists for plain hints, at most [`HINT_MIN_GAP`].
    gap: Duration,
}

impl HintSchedule {
    /// Subscribing at `now` counts as a hint.
    fn new(now: Instant) -> Self {
        HintSchedule {
            hinted_at: now,
            next: Some(0),
            last_relist: None,
            exit: false,
            exited_at: now,
            gap: HINT_MIN_GAP,
        }
    }

    fn follow_ups(&self) -> &'static [Duration] {
        if self.exit { &EXIT_FOLLOW_UPS } else { &HINT_FOLLOW_UPS }
    }

    fn min_gap(&self) -> Duration {
        if self.exit { EXIT_MIN_GAP } else { self.gap }
    }

    /// Plain hints' relists keep `gap` between them from now on (at most [`HINT_MIN_GAP`]).
    fn set_gap(&mut self, gap: Duration) {
        self.gap = gap.min(HINT_MIN_GAP);
    }

    /// A hint came at `now`: the follow-ups start again from it.
    fn hint(&mut self, now: Instant, hint: ChangeHint) {
        self.hinted_at = now;
        self.next = Some(0);
        if hint == ChangeHint::Exited {
            self.exit = true;
            self.exited_at = now;
        } else if self.exit && now >= self.exited_at + EXIT_DENSE_FOR {
            self.exit = false;
        }
    }

    /// When the next relist is due, if one is.
    fn due(&self) -> Option<Instant> {
        let at = self.hinted_at + self.follow_ups()[self.next?];
        Some(self.last_relist.map_or(at, |last| at.max(last + self.min_gap())))
    }

    /// A relist began at `now`, this schedule's or one made for another reason (a pod worker's
    /// refresh): the follow-ups it covers are done. One no later than the last is old news.
    fn relisted(&mut self, now: Instant) {
        if self.last_relist.is_some_and(|last| now <= last) {
            return;
        }
        self.last_relist = Some(now);
        let follow_ups = self.follow_ups();
        let mut next = self.next.unwrap_or(follow_ups.len());
        while next < follow_ups.len() && self.hinted_at + follow_ups[next] <= now {
            next += 1;
        }
        self.next = (next < follow_ups.len()).then_some(next);
        if self.next.is_none() {
            self.exit = false;
        }
    }
}

/// Room for hints not yet taken; more are dropped, as the ones waiting stand for them.
const HINT_CHANNEL_CAPACITY: usize = 16;

/// The evented PLEG.
pub struct EventedPleg<R> {
    runtime: Arc<R>,
    generic: GenericPleg<R>,
    config: Config,
    /// One wall-clock time and its tokio instant: event times map onto the tokio clock through
    /// this single anchor, so events keep their order however late they are handled.
    anchor: (Timestamp, Instant),
}

impl<R> std::fmt::Debug for EventedPleg<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventedPleg").field("config", &self.config).finish_non_exhaustive()
    }
}

impl<R: RuntimeEvents> EventedPleg<R> {
    /// An evented PLEG over `runtime`, writing `cache`; its events arrive on the returned receiver.
    pub fn new(runtime: Arc<R>, cache: Arc<Cache>, config: Config) -> (Self, mpsc::Receiver<PodLifecycleEvent>) {
        let (events, rx) = mpsc::channel(config.fallback.channel_capacity);
        let slow =
            config.fallback.clone().relist_period(config.relist_period).relist_threshold(config.relist_threshold);
        let generic = GenericPleg::with_sender(runtime.clone(), cache, slow, events);
        let pleg = EventedPleg { runtime, generic, config, anchor: (wall_now(), Instant::now()) };
        (pleg, rx)
    }

    /// The tokio instant of an event's wall-clock time.
    fn instant_of(&self, at: Timestamp) -> Instant {
        let (wall, instant) = self.anchor;
        let offset = at.duration_since(wall);
        match std::time::Duration::try_from(offset) {
            Ok(after) => instant + after,
            Err(_) => {
                instant.checked_sub(std::time::Duration::try_from(-offset).unwrap_or_default()).unwrap_or(instant)
            }
        }
    }

    /// Applies one runtime event (upstream `processCRIEvents`).
    fn handle(&self, event: ContainerEvent) {
        let cache = self.generic.cache();
        let uid = event.pod_status.uid.clone();
        let status = preserve_ips(event.pod_status, &cache.get(&uid).status);
        let kinds: &[PodLifecycleEventKind] = match event.kind {
            ContainerEventKind::Deleted => {
                // A removed sandbox takes the pod's cached status with it.
                if status.sandbox_statuses.iter().any(|s| s.id == event.container_id) {
                    cache.delete(&uid);
                }
                &[PodLifecycleEventKind::ContainerDied, PodLifecycleEventKind::ContainerRemoved]
            }
            kind => {
                // An event older than what the cache holds changes nothing.
                if !cache.set(&uid, status, None, self.instant_of(event.created_at)) {
                    return;
                }
                match kind {
                    ContainerEventKind::Started => &[PodLifecycleEventKind::ContainerStarted],
                    ContainerEventKind::Stopped => &[PodLifecycleEventKind::ContainerDied],
                    _ => &[],
                }
            }
        };
        for kind in kinds {
            self.generic.emit(PodLifecycleEvent::new(uid.clone(), *kind, Some(event.container_id.clone())));
        }
    }

    /// Consumes the event stream until it is given up on; returns when falling back.
    async fn stream(&self, cancel: &CancellationToken) {
        let mut failures = 0;
        let mut bump = tokio::time::interval(self.config.cache_bump_period);
        loop {
            let (tx, mut rx) = mpsc::channel(self.config.fallback.channel_capacity);
            let stream = self.runtime.stream_events(tx);
            tokio::pin!(stream);
            let ended = loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    ended = &mut stream => break ended,
                    Some(event) = rx.recv() => self.handle(event),
                    _ = bump.tick() => self.generic.cache().update_time(Instant::now()),
                }
            };
            // Events still buffered when the stream ended are not lost.
            while let Ok(event) = rx.try_recv() {
                self.handle(event);
            }
            match ended {
                Err(EventStreamError::Unimplemented) => {
                    info!("the runtime does not implement container events; relisting on its change hints");
                    self.hints(cancel).await;
                    return;
                }
                Err(err) => {
                    failures += 1;
                    if !self.retry_after(&err, failures, "container event stream", cancel).await {
                        return;
                    }
                }
                Ok(()) => return,
            }
        }
    }

    /// After the `what` stream failed for the `failures`th time in a row: falls back once that
    /// is `max_failures` (and returns false); otherwise relists to catch up on what the broken
    /// stream may have missed, waits a second, and returns true to try again.
    async fn retry_after(&self, err: &EventStreamError, failures: u32, what: &str, cancel: &CancellationToken) -> bool {
        warn!(error = %ErrorChain(err), failures, "{what} failed");
        metrics::counter!("kubelet_evented_pleg_connection_error_count").increment(1);
        if failures >= self.config.max_failures {
            self.fall_back(&format!("the {what} failed too often"));
            return false;
        }
        self.generic.relist_now();
        tokio::select! {
            () = cancel.cancelled() => false,
            () = tokio::time::sleep(Duration::from_secs(1)) => true,
        }
    }

    /// Relists on each change hint, for runtimes with hints but no container events (containerd
    /// 1.6); the slow relist stays the safety net. Returns when falling back.
    ///
    /// Unlike the event stream, hints never bump the cache's timestamp: a hint says something
    /// changed, not what, so only a relist makes the cache fresh. A pod worker waiting for a
    /// fresh status asks for that relist itself (`Cache::get_newer_than`).
    async fn hints(&self, cancel: &CancellationToken) {
        let mut failures = 0;
        loop {
            // A few slots: when they are full, the hints waiting stand for those that follow, as
            // one relist covers them.
            let (tx, mut rx) = mpsc::channel(HINT_CHANNEL_CAPACITY);
            let stream = self.runtime.watch_changes(tx);
            tokio::pin!(stream);
            let mut schedule = HintSchedule::new(Instant::now());
            let mut delivered = false;
            let timer = tokio::time::sleep_until(schedule.due().unwrap_or_else(Instant::now));
            tokio::pin!(timer);
            let ended = loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    ended = &mut stream => break ended,
                    Some(hint) = rx.recv() => {
                        delivered = true;
                        schedule.set_gap(self.generic.gap());
                        schedule.hint(Instant::now(), hint);
                        if let Some(at) = schedule.due() {
                            timer.as_mut().reset(at);
                        }
                    }
                    () = &mut timer, if schedule.due().is_some() => {
                        // A relist since the last one asked for here (a pod worker's refresh)
                        // covers what it covers, and keeps the gap too.
                        if let Some(other) = self.generic.last_relist() {
                            schedule.relisted(other);
                        }
                        schedule.set_gap(self.generic.gap());
                        let now = Instant::now();
                        if schedule.due().is_some_and(|at| at <= now) {
                            self.generic.relist_now();
                            schedule.relisted(now);
                        }
                        if let Some(at) = schedule.due() {
                            timer.as_mut().reset(at);
                        }
                    }
                }
            };
            match ended {
                Err(EventStreamError::Unimplemented) => {
                    self.fall_back("the runtime implements neither container events nor change hints");
                    return;
                }
                Err(err) => {
                    // Failures count while in a row: a stream that worked starts the count again.
                    failures = if delivered { 1 } else { failures + 1 };
                    if !self.retry_after(&err, failures, "change hint stream", cancel).await {
                        return;
                    }
                }
                Ok(()) => return,
            }
        }
    }

    fn fall_back(&self, why: &str) {
        info!(
            reason = why,
            "evented PLEG falling back to the generic PLEG at {:?}", self.config.fallback.relist_period
        );
        metrics::counter!("kubelet_evented_pleg_fallback_total").increment(1);
        self.generic.set_timing(self.config.fallback.relist_period, self.config.fallback.relist_threshold);
        self.generic.relist_now();
    }
}

impl<R: RuntimeEvents> Pleg for EventedPleg<R> {
    async fn run(&self, cancel: CancellationToken) {
        tokio::join!(self.generic.run(cancel.clone()), self.stream(&cancel));
    }

    fn healthy(&self) -> Result<(), HealthError> {
        self.generic.healthy()
    }

    fn relist_now(&self) {
        self.generic.relist_now();
    }
}

#[cfg(test)]
mod tests;
