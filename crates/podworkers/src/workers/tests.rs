//! Tests of the async pod workers with paused time and a recording syncer.

use std::{
    collections::HashMap,
    fmt,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use kubelet_core::{
    KillPodOptions, NETWORK_NOT_READY_MESSAGE, PodStatusFn, PodWorkers as _, SyncPodType,
    runtime::{self, PodStatus},
};

use super::*;

#[derive(Debug)]
struct TestError(String);

impl fmt::Display for TestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TestError {}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Sync(SyncPodType),
    Terminating(i64),
    Runtime,
    Terminated,
    Cancelled(&'static str),
}

#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<(Duration, String, Call)>>,
    /// Per pod: what `sync_pod` returns next (default `Ok(false)`).
    results: Mutex<HashMap<String, Vec<Result<bool, String>>>>,
    /// How long `sync_pod` takes.
    sync_time: Mutex<Duration>,
    /// Whether `sync_terminating_pod` takes its whole grace period.
    slow_stop: Mutex<bool>,
    /// Per pod: how many more `sync_terminating_pod` calls fail.
    stop_failures: Mutex<HashMap<String, usize>>,
    running: Mutex<HashMap<String, usize>>,
    max_concurrent: AtomicUsize,
    started: Mutex<Option<Instant>>,
}

/// Counts syncs in flight per pod, and records a cancellation if the future is dropped.
struct InFlight<'a> {
    rec: &'a Recorder,
    uid: String,
    done: bool,
    what: &'static str,
}

impl<'a> InFlight<'a> {
    fn enter(rec: &'a Recorder, uid: &str, what: &'static str) -> Self {
        let mut running = rec.running.lock().unwrap();
        let n = running.entry(uid.to_owned()).or_default();
        *n += 1;
        rec.max_concurrent.fetch_max(*n, Ordering::SeqCst);
        InFlight { rec, uid: uid.to_owned(), done: false, what }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        *self.rec.running.lock().unwrap().get_mut(&self.uid).unwrap() -= 1;
        if !self.done {
            self.rec.record(&self.uid, Call::Cancelled(self.what));
        }
    }
}

impl Recorder {
    fn record(&self, uid: &str, call: Call) {
        let started = *self.started.lock().unwrap().get_or_insert_with(Instant::now);
        self.calls.lock().unwrap().push((Instant::now() - started, uid.to_owned(), call));
    }

    fn calls(&self, uid: &str) -> Vec<Call> {
        self.calls.lock().unwrap().iter().filter(|(_, u, _)| u == uid).map(|(_, _, c)| c.clone()).collect()
    }
}

impl PodSyncer for Recorder {
    type Error = TestError;

    async fn sync_pod(
        &self,
        kind: SyncPodType,
        pod: &Arc<Pod>,
        _: Option<&Arc<Pod>>,
        _: &PodStatus,
    ) -> Result<bool, TestError> {
        let uid = PodUid::of(pod).to_string();
        let mut guard = InFlight::enter(self, &uid, "sync");
        let wait = *self.sync_time.lock().unwrap();
        tokio::time::sleep(wait).await;
        guard.done = true;
        self.record(&uid, Call::Sync(kind));
        let next = self.results.lock().unwrap().get_mut(&uid).and_then(|r| (!r.is_empty()).then(|| r.remove(0)));
        next.unwrap_or(Ok(false)).map_err(TestError)
    }

    async fn sync_terminating_pod(
        &self,
        pod: &Arc<Pod>,
        _: &PodStatus,
        grace: i64,
        _: Option<&PodStatusFn>,
    ) -> Result<(), TestError> {
        let uid = PodUid::of(pod).to_string();
        let mut guard = InFlight::enter(self, &uid, "terminating");
        if *self.slow_stop.lock().unwrap() {
            tokio::time::sleep(Duration::from_secs(grace.unsigned_abs())).await;
        }
        guard.done = true;
        self.record(&uid, Call::Terminating(grace));
        match self.stop_failures.lock().unwrap().get_mut(&uid) {
            Some(left) if *left > 0 => {
                *left -= 1;
                Err(TestError("StopContainer failed".to_owned()))
            }
            _ => Ok(()),
        }
    }

    async fn sync_terminating_runtime_pod(&self, running: &runtime::Pod) -> Result<(), TestError> {
        self.record(running.uid.as_str(), Call::Runtime);
        Ok(())
    }

    async fn sync_terminated_pod(&self, pod: &Arc<Pod>, _: &PodStatus) -> Result<(), TestError> {
        self.record(&PodUid::of(pod).to_string(), Call::Terminated);
        Ok(())
    }
}

struct Harness {
    rec: Arc<Recorder>,
    cache: Arc<Cache>,
    queue: Arc<WorkQueue>,
    workers: PodWorkers<Recorder>,
    cancel: CancellationToken,
}

fn harness() -> Harness {
    let rec = Arc::new(Recorder::default());
    let cache = Arc::new(Cache::new());
    // The PLEG's first relist.
    cache.update_time(Instant::now());
    let queue = Arc::new(WorkQueue::new());
    let cancel = CancellationToken::new();
    let workers = PodWorkers::new(rec.clone(), cache.clone(), queue.clone(), Config::default(), cancel.clone());
    Harness { rec, cache, queue, workers, cancel }
}

fn pod(uid: &str) -> Arc<Pod> {
    Arc::new(kubelet_core::testing::pod(uid, &[]))
}

fn kill(uid: &str, grace: Option<i64>) -> UpdatePodOptions {
    let mut options = KillPodOptions::default();
    options.grace_period_override = grace;
    UpdatePodOptions::new(SyncPodType::Kill, pod(uid)).with_kill(options)
}

/// Lets every ready task run, without moving virtual time.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Keeps the PLEG's cache timestamp moving, as relists do.
async fn relist(cache: &Cache) {
    settle().await;
    cache.update_time(Instant::now());
    settle().await;
}

/// When `uid` next becomes due on the work queue, at most `limit` from now.
async fn due_in(queue: &WorkQueue, uid: &str, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while Instant::now() - start <= limit {
        if queue.take_due().iter().any(|u| u.as_str() == uid) {
            return Some(Instant::now() - start);
        }
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    None
}

#[tokio::test(start_paused = true)]
async fn create_syncs_once_and_requeues_for_resync_with_jitter() {
    let h = harness();
    h.workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, pod("a")).with_start_time(Instant::now()));
    relist(&h.cache).await;
    assert_eq!(h.rec.calls("a"), [Call::Sync(SyncPodType::Create)]);
    let due = due_in(&h.queue, "a", Duration::from_secs(100)).await.expect("requeued");
    assert!(due >= Duration::from_secs(60) && due <= Duration::from_secs(90), "resync after {due:?}");
    assert!(h.workers.is_pod_known(&PodUid::new("a")));
    assert_eq!(h.workers.active_pods().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn each_sync_waits_for_a_cache_newer_than_the_last_sync() {
    let h = harness();
    h.workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, pod("a")));
    settle().await;
    assert_eq!(h.rec.calls("a").len(), 1, "the first sync takes the first relist");
    tokio::time::advance(Duration::from_millis(300)).await;
    h.workers.update_pod(UpdatePodOptions::new(SyncPodType::Update, pod("a")));
    settle().await;
    assert_eq!(h.rec.calls("a").len(), 1, "no status newer than the last sync yet");
    h.cache.set(&PodUid::new("a"), PodStatus::new(PodUid::new("a"), "a", "default"), None, Instant::now());
    settle().await;
    assert_eq!(h.rec.calls("a"), [Call::Sync(SyncPodType::Create), Call::Sync(SyncPodType::Update)]);
}

#[tokio::test(start_paused = true)]
async fn failed_syncs_requeue_after_the_backoff_or_the_network_backoff() {
    for (error, low, high) in [("boom", 10.0, 15.0), (NETWORK_NOT_READY_MESSAGE, 1.0, 1.5)] {
        let h = harness();
        h.rec.results.lock().unwrap().insert("a".into(), vec![Err(error.to_owned())]);
        h.workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, pod("a")));
        settle().await;
        let due = due_in(&h.queue, "a", Duration::from_secs(20)).await.expect("requeued").as_secs_f64();
        assert!(due >= low && due <= high + 0.1, "{error}: requeued after {due} s");
    }
}

#[tokio::test(start_paused = true)]
async fn terminal_sync_goes_through_terminating_and_terminated_without_waiting() {
    let h = harness();
    h.rec.results.lock().unwrap().insert("job".into(), vec![Ok(true)]);
    h.workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, pod("job")));
    for _ in 0..3 {
        relist(&h.cache).await;
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    assert_eq!(h.rec.calls("job"), [Call::Sync(SyncPodType::Create), Call::Terminating(30), Call::Terminated]);
    assert!(h.workers.is_pod_known_terminated(&PodUid::new("job")));
    assert_eq!(h.workers.stats().workers, 0, "the worker exited");
    h.workers.sync_known_pods(&[]);
    assert_eq!(h.workers.stats(), Stats::default());
}

#[tokio::test(start_paused = true)]
async fn a_kill_cancels_the_sync_in_flight() {
    let h = harness();
    *h.rec.sync_time.lock().unwrap() = Duration::from_secs(60);
    h.workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, pod("a")));
    settle().await;
    tokio::time::advance(Duration::from_secs(1)).await;
    h.workers.update_pod(kill("a", Some(5)));
    relist(&h.cache).await;
    tokio::time::advance(Duration::from_millis(10)).await;
    relist(&h.cache).await;
    assert_eq!(h.rec.calls("a"), [Call::Cancelled("sync"), Call::Terminating(5), Call::Terminated]);
}

#[tokio::test(start_paused = true)]
async fn a_shorter_grace_restarts_the_kill_with_the_new_deadline() {
    let h = harness();
    *h.rec.slow_stop.lock().unwrap() = true;
    h.workers.update_pod(kill("a", Some(30)));
    settle().await;
    tokio::time::advance(Duration::from_secs(2)).await;
    h.workers.update_pod(kill("a", Some(3)));
    settle().await;
    // A longer grace later changes nothing.
    h.workers.update_pod(kill("a", Some(20)));
    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(1)).await;
        relist(&h.cache).await;
    }
    assert_eq!(h.rec.calls("a"), [Call::Cancelled("terminating"), Call::Terminating(3), Call::Terminated]);
}

#[tokio::test(start_paused = true)]
async fn never_two_syncs_of_one_pod_at_once_and_no_update_lost() {
    let h = harness();
    *h.rec.sync_time.lock().unwrap() = Duration::from_millis(5);
    for round in 0..200 {
        for p in ["a", "b", "c"] {
            let kind = if round == 0 { SyncPodType::Create } else { SyncPodType::Update };
            h.workers.update_pod(UpdatePodOptions::new(kind, pod(p)));
        }
        tokio::time::advance(Duration::from_millis(1)).await;
        h.cache.update_time(Instant::now());
        settle().await;
    }
    for _ in 0..20 {
        tokio::time::advance(Duration::from_millis(10)).await;
        relist(&h.cache).await;
    }
    assert_eq!(h.rec.max_concurrent.load(Ordering::SeqCst), 1);
    for p in ["a", "b", "c"] {
        let calls = h.rec.calls(p);
        assert_eq!(calls.last(), Some(&Call::Sync(SyncPodType::Update)), "the last update ran");
        assert!(calls.len() < 200, "pending updates coalesce ({} syncs)", calls.len());
    }
}

#[tokio::test(start_paused = true)]
async fn housekeeping_kills_undesired_pods_and_orphans_run_terminating_runtime_pod() {
    let h = harness();
    h.workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, pod("a")));
    relist(&h.cache).await;
    let report = h.workers.sync_known_pods(&[]);
    assert!(report[&PodUid::new("a")].orphan);
    tokio::time::advance(Duration::from_millis(10)).await;
    relist(&h.cache).await;
    tokio::time::advance(Duration::from_millis(10)).await;
    relist(&h.cache).await;
    assert_eq!(h.rec.calls("a"), [Call::Sync(SyncPodType::Create), Call::Terminating(30), Call::Terminated]);

    let orphan = runtime::Pod::new(PodUid::new("ghost"), "ghost", "default");
    h.workers.update_pod(UpdatePodOptions::kill_orphan(orphan, KillPodOptions::default()));
    settle().await;
    assert_eq!(h.rec.calls("ghost"), [Call::Runtime]);
    assert!(!h.workers.is_pod_known(&PodUid::new("ghost")), "runtime-only pods are forgotten once stopped");
    h.workers.sync_known_pods(&[]);
    assert_eq!(h.workers.stats(), Stats::default());
}

#[tokio::test(start_paused = true)]
async fn a_failed_kill_of_a_pod_that_left_the_config_is_retried_by_housekeeping_until_done() {
    let h = harness();
    h.rec.stop_failures.lock().unwrap().insert("a".to_owned(), 2);
    h.workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, pod("a")));
    relist(&h.cache).await;
    h.workers.update_pod(kill("a", Some(1)));
    relist(&h.cache).await;
    assert_eq!(h.rec.calls("a"), [Call::Sync(SyncPodType::Create), Call::Terminating(1)]);
    // Housekeeping every 2 s, as the sync loop runs it; the pod manager no longer has the pod,
    // so nothing else would offer it again.
    for _ in 0..30 {
        tokio::time::advance(Duration::from_secs(2)).await;
        h.workers.sync_known_pods(&[]);
        relist(&h.cache).await;
        if h.rec.calls("a").last() == Some(&Call::Terminated) {
            break;
        }
    }
    assert_eq!(
        h.rec.calls("a"),
        [
            Call::Sync(SyncPodType::Create),
            Call::Terminating(1),
            Call::Terminating(1),
            Call::Terminating(1),
            Call::Terminated
        ]
    );
    let retries: Vec<Duration> = h
        .rec
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, call)| *call == Call::Terminating(1))
        .map(|(at, _, _)| *at)
        .collect();
    for pair in retries.windows(2) {
        assert!(pair[1] - pair[0] >= Duration::from_secs(10), "retries respect the backoff: {retries:?}");
    }
    h.workers.sync_known_pods(&[]);
    assert!(!h.workers.is_pod_known(&PodUid::new("a")));
}

#[tokio::test(start_paused = true)]
async fn a_kill_without_a_status_to_act_on_is_retried_once_the_runtime_answers() {
    let h = harness();
    h.workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, pod("a")));
    relist(&h.cache).await;
    // The PLEG cannot inspect the pod: the kill has no status to act on and fails.
    let failed: kubelet_core::StatusError = Arc::new(std::io::Error::other("inspect timed out"));
    tokio::time::advance(Duration::from_millis(10)).await;
    h.cache.set(&PodUid::new("a"), PodStatus::new(PodUid::new("a"), "a", "default"), Some(failed), Instant::now());
    h.workers.update_pod(kill("a", Some(1)));
    settle().await;
    assert_eq!(h.rec.calls("a"), [Call::Sync(SyncPodType::Create)], "no kill without a status");
    // The runtime answers again; housekeeping retries once the backoff has passed.
    tokio::time::advance(Duration::from_millis(10)).await;
    h.cache.set(&PodUid::new("a"), PodStatus::new(PodUid::new("a"), "a", "default"), None, Instant::now());
    for _ in 0..15 {
        tokio::time::advance(Duration::from_secs(2)).await;
        h.workers.sync_known_pods(&[]);
        relist(&h.cache).await;
    }
    assert_eq!(h.rec.calls("a"), [Call::Sync(SyncPodType::Create), Call::Terminating(1), Call::Terminated]);
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_every_worker() {
    let h = harness();
    *h.rec.sync_time.lock().unwrap() = Duration::from_secs(3600);
    for i in 0..50 {
        h.workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, pod(&format!("p{i}"))));
    }
    settle().await;
    h.cancel.cancel();
    tokio::time::timeout(Duration::from_secs(1), h.workers.wait()).await.expect("workers stop on cancel");
}

#[tokio::test(start_paused = true)]
async fn churning_pods_through_create_kill_forget_leaves_nothing_behind() {
    let h = harness();
    for batch in 0..20 {
        for i in 0..1000 {
            h.workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, pod(&format!("p{batch}-{i}"))));
        }
        relist(&h.cache).await;
        for i in 0..1000 {
            h.workers.update_pod(kill(&format!("p{batch}-{i}"), Some(1)));
        }
        for _ in 0..3 {
            tokio::time::advance(Duration::from_millis(10)).await;
            relist(&h.cache).await;
        }
        h.workers.sync_known_pods(&[]);
        let _ = h.queue.take_due();
    }
    assert_eq!(h.workers.stats(), Stats::default());
    assert_eq!(h.cache.waiters(), 0);
    h.cancel.cancel();
    h.workers.wait().await;
}
