//! The relisting PLEG (upstream `pkg/kubelet/pleg/generic.go`).

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, stream};
use kubelet_core::{
    Cache, HealthError, Pleg, PodLifecycleEvent, PodLifecycleEventKind, PodUid, Runtime, StatusError,
    runtime::{self, PodStatus, SandboxState},
};
use tokio::{
    sync::{Notify, mpsc},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use crate::{
    events::{all_ids, generate, state_in},
    metrics,
};

/// Timing and limits of the relisting PLEG; defaults are upstream's.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Time between relists (1 s).
    pub relist_period: Duration,
    /// The PLEG is unhealthy when the last relist started longer ago than this (3 min).
    pub relist_threshold: Duration,
    /// Capacity of the event channel (1,000). Events beyond it wait, at most one per pod (a
    /// pod's later events merge into the one waiting, counted as discarded), and go out as the
    /// channel drains: no pod loses its sync, and memory stays bounded by the number of pods.
    pub channel_capacity: usize,
    /// How many pods are inspected at once during a relist (16).
    pub inspect_concurrency: usize,
    /// Timeout of one pod's inspection; a pod that times out is retried next relist (10 s).
    pub inspect_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            relist_period: Duration::from_secs(1),
            relist_threshold: Duration::from_secs(180),
            channel_capacity: 1000,
            inspect_concurrency: 16,
            inspect_timeout: Duration::from_secs(10),
        }
    }
}

impl Config {
    /// Sets the relist period.
    #[must_use]
    pub fn relist_period(mut self, period: Duration) -> Self {
        self.relist_period = period;
        self
    }

    /// Sets the health threshold.
    #[must_use]
    pub fn relist_threshold(mut self, threshold: Duration) -> Self {
        self.relist_threshold = threshold;
        self
    }

    /// Sets the event channel capacity.
    #[must_use]
    pub fn channel_capacity(mut self, capacity: usize) -> Self {
        self.channel_capacity = capacity.max(1);
        self
    }

    /// Sets the per-pod inspection timeout.
    #[must_use]
    pub fn inspect_timeout(mut self, timeout: Duration) -> Self {
        self.inspect_timeout = timeout;
        self
    }
}

/// What the PLEG last saw of one pod: the listing at the last successful inspection (`old`) and
/// at this relist (`current`).
#[derive(Default)]
struct Record {
    old: Option<runtime::Pod>,
    current: Option<runtime::Pod>,
}

#[derive(Default)]
struct State {
    records: HashMap<PodUid, Record>,
    /// Pods whose inspection failed, to inspect again at the next relist.
    reinspect: HashMap<PodUid, Option<runtime::Pod>>,
    relist_time: Option<Instant>,
}

/// The least time between the starts of two relists asked for on demand ([`GenericPleg::gap`])
/// is this many times the last relist's own time, so that relists take at most a tenth of the
/// time however many pods there are to list.
///
/// As pods start, every worker that finishes its first sync asks for a relist (a refresh), each
/// at its own moment; served at once, they made the relists run back to back (401 of them,
/// 26 ms each, while 110 pods started in 13 s), each listing every container of the node.
const RELIST_GAP_FACTOR: u32 = 10;

/// The most [`GenericPleg::gap`] ever is: a waiting pod worker waits at most this long for its
/// relist (upstream waits for the next periodic relist, up to a second).
pub(crate) const MAX_RELIST_GAP: Duration = Duration::from_millis(100);

/// The relisting PLEG: lists the runtime every period, diffs against the previous listing, and
/// inspects only pods whose containers changed.
pub struct GenericPleg<R> {
    runtime: Arc<R>,
    cache: Arc<Cache>,
    config: Config,
    /// Relist period and health threshold; the evented PLEG changes them when it falls back.
    timing: Mutex<(Duration, Duration)>,
    events: mpsc::Sender<PodLifecycleEvent>,
    state: Mutex<State>,
    wake: Notify,
    discarded: AtomicU64,
    /// How long the last relist took, in nanoseconds ([`GenericPleg::gap`]).
    last_took: AtomicU64,
    /// When the relist loop's last relist began (set before it lists, so the evented PLEG's
    /// hint schedule counts a relist under way).
    last_started: Mutex<Option<Instant>>,
    /// Events the channel had no room for, at most one per pod, oldest first.
    waiting: Mutex<Waiting>,
}

/// Events waiting for room in the channel: one per pod, in the order their pods first waited.
#[derive(Default)]
struct Waiting {
    order: VecDeque<PodUid>,
    events: HashMap<PodUid, PodLifecycleEvent>,
}

impl Waiting {
    /// Keeps `event` for its pod; `false` when the pod already had one waiting, which stays
    /// unless `event` is a container's death (which the sync loop also cleans up after).
    fn push(&mut self, event: PodLifecycleEvent) -> bool {
        match self.events.get_mut(&event.id) {
            Some(waiting) => {
                if event.kind == PodLifecycleEventKind::ContainerDied
                    && waiting.kind != PodLifecycleEventKind::ContainerDied
                {
                    *waiting = event;
                }
                false
            }
            None => {
                self.order.push_back(event.id.clone());
                self.events.insert(event.id.clone(), event);
                true
            }
        }
    }

    fn pop(&mut self) -> Option<PodLifecycleEvent> {
        let uid = self.order.pop_front()?;
        self.events.remove(&uid)
    }
}

impl<R> std::fmt::Debug for GenericPleg<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenericPleg").field("config", &self.config).finish_non_exhaustive()
    }
}

/// Formats a duration as Go does (`3m0.5s`), for upstream's health message.
pub(crate) fn go_duration(d: Duration) -> String {
    let total = d.as_secs();
    let (h, m, s) = (total / 3600, (total / 60) % 60, total % 60);
    let nanos = d.subsec_nanos();
    let mut seconds = s.to_string();
    if nanos > 0 {
        let fraction = format!("{nanos:09}");
        seconds = format!("{s}.{}", fraction.trim_end_matches('0'));
    }
    match (h, m) {
        (0, 0) => format!("{seconds}s"),
        (0, m) => format!("{m}m{seconds}s"),
        (h, m) => format!("{h}h{m}m{seconds}s"),
    }
}

/// Keeps the cached pod IPs when the new status has none and no ready sandbox (a dead pod keeps
/// reporting its IP, as upstream does).
pub(crate) fn preserve_ips(mut status: PodStatus, cached: &PodStatus) -> PodStatus {
    if status.ips.is_empty() && !status.sandbox_statuses.iter().any(|s| s.state == SandboxState::Ready) {
        status.ips.clone_from(&cached.ips);
    }
    status
}

impl<R: Runtime> GenericPleg<R> {
    /// A PLEG over `runtime` that keeps `cache` fresh; its events arrive on the returned receiver.
    pub fn new(runtime: Arc<R>, cache: Arc<Cache>, config: Config) -> (Self, mpsc::Receiver<PodLifecycleEvent>) {
        let (events, rx) = mpsc::channel(config.channel_capacity);
        (GenericPleg::with_sender(runtime, cache, config, events), rx)
    }

    /// A PLEG that sends its events on an existing channel (the evented PLEG's safety net).
    pub(crate) fn with_sender(
        runtime: Arc<R>,
        cache: Arc<Cache>,
        config: Config,
        events: mpsc::Sender<PodLifecycleEvent>,
    ) -> Self {
        GenericPleg {
            runtime,
            cache,
            timing: Mutex::new((config.relist_period, config.relist_threshold)),
            config,
            events,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            discarded: AtomicU64::new(0),
            last_took: AtomicU64::new(0),
            last_started: Mutex::new(None),
            waiting: Mutex::new(Waiting::default()),
        }
    }

    /// When the relist loop's last relist began, finished or under way.
    pub(crate) fn last_relist(&self) -> Option<Instant> {
        *self.last_started.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The least time between the start of a relist and one a pod worker's refresh or a change
    /// hint asks for ([`RELIST_GAP_FACTOR`] times the last relist's own time, at most
    /// [`MAX_RELIST_GAP`]): a node of a few pods relists within milliseconds, a node of many,
    /// whose relists cost more, less often. A change the kubelet made itself
    /// ([`Pleg::relist_now`]) is relisted at once.
    pub(crate) fn gap(&self) -> Duration {
        let took = Duration::from_nanos(self.last_took.load(Ordering::Relaxed));
        took.saturating_mul(RELIST_GAP_FACTOR).min(MAX_RELIST_GAP)
    }

    /// Changes the relist period and health threshold (the evented PLEG's fallback).
    pub(crate) fn set_timing(&self, period: Duration, threshold: Duration) {
        *self.timing.lock().unwrap_or_else(|p| p.into_inner()) = (period, threshold);
    }

    fn timing(&self) -> (Duration, Duration) {
        *self.timing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends an event, counting it when the channel is full.
    pub(crate) fn emit(&self, event: PodLifecycleEvent) {
        self.send(event);
    }

    /// The status cache this PLEG writes.
    pub(crate) fn cache(&self) -> &Cache {
        &self.cache
    }

    /// How many events were merged into another waiting event of the same pod because the
    /// channel was full (the pod still gets its sync).
    pub fn discarded_events(&self) -> u64 {
        self.discarded.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Critical sections only replace whole map entries, so a poisoned lock holds valid data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn waiting(&self) -> MutexGuard<'_, Waiting> {
        // Each critical section leaves `order` and `events` in step.
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends an event, or keeps it waiting (merged per pod) while the channel is full or
    /// others wait before it.
    fn send(&self, event: PodLifecycleEvent) {
        let mut waiting = self.waiting();
        let event = if waiting.order.is_empty() {
            match self.events.try_send(event) {
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => return,
                Err(mpsc::error::TrySendError::Full(event)) => event,
            }
        } else {
            event
        };
        if !waiting.push(event) {
            self.discarded.fetch_add(1, Ordering::Relaxed);
            metrics::discarded();
        }
    }

    /// Sends the waiting events as the channel makes room; returns when none is left (or the
    /// receiver is gone). Cancelling it loses nothing: an event leaves the queue only once
    /// there is room for it.
    async fn send_waiting(&self) {
        loop {
            if self.waiting().order.is_empty() {
                return;
            }
            let Ok(permit) = self.events.reserve().await else { return };
            match self.waiting().pop() {
                Some(event) => permit.send(event),
                None => return,
            }
        }
    }

    /// Waits for the next relist: the period, a wake-up, or a refresh the cache asks for, which
    /// waits until [`GenericPleg::gap`] after the start of the last relist (`last`).
    async fn until_next_relist(&self, last: Instant) {
        tokio::select! {
            () = tokio::time::sleep(self.timing().0) => {}
            () = self.wake.notified() => {}
            () = self.cache.refresh_requested() => {
                tokio::select! {
                    // A wake-up due at the same moment is served by the same relist.
                    biased;
                    () = self.wake.notified() => {}
                    () = tokio::time::sleep_until(last + self.gap()) => {}
                }
            }
        }
    }

    /// Inspects one pod as the relist listed it: `Ok` with its status, or the error to record;
    /// a pod gone from the listing needs no inspection.
    async fn inspect(&self, pod: &runtime::Pod) -> Result<PodStatus, StatusError> {
        let fetch = self.runtime.get_listed_pod_status(pod);
        match tokio::time::timeout(self.config.inspect_timeout, fetch).await {
            Ok(Ok(status)) => Ok(status),
            Ok(Err(err)) => Err(Arc::new(err)),
            Err(_) => Err(Arc::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("inspecting pod {} timed out after {:?}", pod.uid, self.config.inspect_timeout),
            ))),
        }
    }

    /// One relist (upstream `Relist`).
    pub async fn relist(&self) {
        let timestamp = Instant::now();
        let pods = match self.runtime.get_pods(true).await {
            Ok(pods) => pods,
            Err(err) => {
                warn!(error = %err, "PLEG: unable to retrieve pods");
                return;
            }
        };
        metrics::running(&pods);
        let mut to_inspect: Vec<(PodUid, Option<runtime::Pod>, Vec<PodLifecycleEvent>)> = Vec::new();
        {
            let mut state = self.lock();
            if let Some(previous) = state.relist_time.replace(timestamp) {
                metrics::relist_interval(timestamp - previous);
            }
            let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            metrics::last_seen(unix.as_secs_f64());
            for record in state.records.values_mut() {
                record.current = None;
            }
            for pod in pods {
                let uid = pod.uid.clone();
                state.records.entry(uid).or_default().current = Some(pod);
            }
            let reinspect = std::mem::take(&mut state.reinspect);
            for (uid, record) in &state.records {
                let owed = reinspect.contains_key(uid);
                // Fast path: a listing identical to the last inspected one has no events.
                if !owed && record.old == record.current {
                    continue;
                }
                let mut events = Vec::new();
                for id in all_ids(record.old.as_ref(), record.current.as_ref()) {
                    let old = state_in(record.old.as_ref(), id);
                    let new = state_in(record.current.as_ref(), id);
                    events.extend(generate(uid, id, old, new));
                }
                if !events.is_empty() || owed {
                    to_inspect.push((uid.clone(), record.current.clone(), events));
                }
            }
            // Pods left for reinspection that are not even listed any more.
            for (uid, pod) in reinspect {
                if !state.records.contains_key(&uid) {
                    to_inspect.push((uid, pod, Vec::new()));
                }
            }
        }

        // Inspect concurrently, each with its own timeout: one hung pod never stalls the others.
        let inspected: Vec<_> = stream::iter(to_inspect)
            .map(|(uid, pod, events)| async move {
                let result = match &pod {
                    Some(pod) => Some(self.inspect(pod).await),
                    None => None,
                };
                (uid, pod, events, result)
            })
            .buffer_unordered(self.config.inspect_concurrency.max(1))
            .collect()
            .await;

        let mut state = self.lock();
        for (uid, pod, events, result) in inspected {
            match result {
                // The pod is gone from the runtime: so is its status.
                None => self.cache.delete(&uid),
                Some(Err(err)) => {
                    debug!(pod.uid = %uid, error = %err, "PLEG: ignoring events for pod until it can be inspected");
                    let cached = self.cache.get(&uid);
                    self.cache.set(&uid, (*cached.status).clone(), Some(err), timestamp);
                    state.reinspect.insert(uid, pod);
                    // The record keeps its old listing, so the same events are found next time.
                    continue;
                }
                Some(Ok(status)) => {
                    let status = preserve_ips(status, &self.cache.get(&uid).status);
                    self.cache.set(&uid, status, None, timestamp);
                }
            }
            // Inspected: the current listing becomes the old one, and the events go out.
            match state.records.get_mut(&uid) {
                Some(record) if record.current.is_some() => record.old = record.current.take(),
                _ => {
                    state.records.remove(&uid);
                }
            }
            let mut sent_container_event = false;
            for event in events {
                // Upstream filters this one: nothing consumes it yet.
                if event.kind == PodLifecycleEventKind::ContainerChanged {
                    continue;
                }
                sent_container_event = true;
                self.send(event);
            }
            if !sent_container_event {
                self.send(PodLifecycleEvent::new(uid, PodLifecycleEventKind::PodSync, None));
            }
        }
        // Every pod's status is now at least as new as this relist.
        self.cache.update_time(timestamp);
        drop(state);
        metrics::relist_duration(timestamp.elapsed());
    }
}

impl<R: Runtime> Pleg for GenericPleg<R> {
    async fn run(&self, cancel: CancellationToken) {
        loop {
            let started = Instant::now();
            *self.last_started.lock().unwrap_or_else(|p| p.into_inner()) = Some(started);
            self.relist().instrument(info_span!("relist")).await;
            let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.last_took.store(took, Ordering::Relaxed);
            // Between relists the events that found the channel full go out as it drains.
            let send_waiting = async {
                self.send_waiting().await;
                std::future::pending::<()>().await;
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.until_next_relist(started) => {}
                () = send_waiting => {}
            }
        }
    }

    fn healthy(&self) -> Result<(), HealthError> {
        let Some(relist_time) = self.lock().relist_time else {
            return Err(HealthError("pleg has yet to be successful".to_owned()));
        };
        let elapsed = relist_time.elapsed();
        let threshold = self.timing().1;
        if elapsed > threshold {
            return Err(HealthError(format!(
                "pleg was last seen active {} ago; threshold is {}",
                go_duration(elapsed),
                go_duration(threshold)
            )));
        }
        Ok(())
    }

    /// Relists at once, without waiting for the period: after the kubelet changed the runtime,
    /// its transitions are seen in milliseconds.
    fn relist_now(&self) {
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests;
