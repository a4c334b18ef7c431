//! Evented PLEG tests with the fake runtime's event stream and paused time.

use k8s_openapi::{
    api::core::v1::{Container, Pod as ApiPod, PodSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kubelet_core::{
    Backoff, PodUid, Runtime,
    fake::{Code, FakeError, FakeRuntime, Method},
};

use super::*;

struct Harness {
    runtime: Arc<FakeRuntime>,
    cache: Arc<Cache>,
    pleg: Arc<EventedPleg<FakeRuntime>>,
    events: mpsc::Receiver<PodLifecycleEvent>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn start(runtime: FakeRuntime) -> Harness {
    let runtime = Arc::new(runtime);
    let cache = Arc::new(Cache::new());
    let (pleg, events) = EventedPleg::new(runtime.clone(), cache.clone(), Config::default());
    let pleg = Arc::new(pleg);
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let (pleg, cancel) = (pleg.clone(), cancel.clone());
        async move { pleg.run(cancel).await }
    });
    Harness { runtime, cache, pleg, events, cancel, task }
}

impl Harness {
    async fn sync(&self, uid: &str) {
        let pod = ApiPod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                name: Some(uid.into()),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container { name: "a".into(), image: Some("busybox".into()), ..Container::default() }],
                ..PodSpec::default()
            }),
            ..ApiPod::default()
        };
        let status = self.runtime.get_pod_status(&PodUid::new(uid), "", "").await.unwrap();
        self.runtime
            .sync_pod(&pod, &status, &Backoff::default(), &kubelet_core::ProbeResults::new(), &Default::default())
            .await;
    }

    /// Events that arrive within `within` of virtual time.
    async fn events_within(&mut self, within: Duration) -> Vec<PodLifecycleEventKind> {
        let mut kinds = Vec::new();
        let deadline = Instant::now() + within;
        while let Ok(Some(event)) = tokio::time::timeout_at(deadline, self.events.recv()).await {
            kinds.push(event.kind);
        }
        kinds
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap();
    }
}

use PodLifecycleEventKind::{ContainerDied as Died, ContainerRemoved as Removed, ContainerStarted as Started};

#[tokio::test(start_paused = true)]
async fn runtime_events_reach_the_cache_and_the_channel_without_relisting() {
    let mut h = start(FakeRuntime::new());
    tokio::time::sleep(Duration::from_millis(10)).await;
    let lists = h.runtime.calls_of(Method::GetPods).len();
    h.sync("p1").await;
    assert_eq!(h.events_within(Duration::from_millis(10)).await, [Started, Started], "sandbox and container, at once");
    let status = h.cache.get(&PodUid::new("p1")).status;
    assert_eq!(status.container_statuses.len(), 1, "the event's status is cached");
    let id = status.container_statuses[0].id.clone();
    h.runtime.stop_container(&id, 1).unwrap();
    assert_eq!(h.events_within(Duration::from_millis(10)).await, [Died]);
    h.runtime.remove_container(&id).unwrap();
    assert_eq!(h.events_within(Duration::from_millis(10)).await, [Died, Removed]);
    assert_eq!(h.runtime.calls_of(Method::GetPods).len(), lists, "no relist was needed");
    assert!(h.pleg.healthy().is_ok());
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_events_or_hints_the_pleg_falls_back_to_relisting_every_second() {
    let runtime = FakeRuntime::new();
    runtime.fail_next(
        Method::StreamEvents,
        FakeError::new(Code::Unimplemented, "method GetContainerEvents not implemented"),
    );
    runtime.fail_next(Method::WatchChanges, FakeError::new(Code::Unimplemented, "unknown service"));
    let mut h = start(runtime);
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let lists = h.runtime.calls_of(Method::GetPods).len();
    assert!(lists >= 4, "relisting at 1 s after the fallback: {lists} lists in 3 s");
    h.sync("p1").await;
    assert_eq!(h.events_within(Duration::from_millis(1100)).await, [Started, Started], "found by the relist");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn five_stream_failures_fall_back_but_one_does_not() {
    let runtime = FakeRuntime::new();
    runtime.fail_next(Method::StreamEvents, FakeError::new(Code::Internal, "transport closed"));
    let mut h = start(runtime);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let lists = h.runtime.calls_of(Method::GetPods).len();
    assert!(lists <= 3, "one failure does not fall back: {lists} lists in 30 s");
    h.sync("p1").await;
    assert_eq!(h.events_within(Duration::from_millis(10)).await, [Started, Started], "the stream came back");
    h.stop().await;

    falls_back_after_five_failures_of(FakeRuntime::new(), Method::StreamEvents).await;
}

/// Five failures in a row of `stream` make the PLEG fall back to relisting every second.
async fn falls_back_after_five_failures_of(runtime: FakeRuntime, stream: Method) {
    for _ in 0..5 {
        runtime.fail_next(stream, FakeError::new(Code::Internal, "transport closed"));
    }
    let h = start(runtime);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let lists = h.runtime.calls_of(Method::GetPods).len();
    assert!(lists >= 20, "falls back after 5 failures: {lists} lists in 30 s");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_broken_stream_reconnects_and_a_relist_catches_up() {
    reconnects_and_catches_up(FakeRuntime::new(), Duration::from_millis(10), Duration::from_millis(10)).await;
}

/// A stream broken `after` the start reconnects: a relist finds what changed while none was
/// open, and a later death comes through the new stream `within` that long.
async fn reconnects_and_catches_up(runtime: FakeRuntime, after: Duration, within: Duration) {
    let mut h = start(runtime);
    tokio::time::sleep(after).await;
    h.runtime.break_event_streams();
    h.sync("p1").await;
    assert_eq!(h.events_within(Duration::from_millis(100)).await, [Started, Started], "the catch-up relist found it");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id = h.cache.get(&PodUid::new("p1")).status.container_statuses[0].id.clone();
    h.runtime.stop_container(&id, 0).unwrap();
    assert_eq!(h.events_within(within).await, [Died], "the stream flows again");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_cache_timestamp_is_bumped_while_events_flow() {
    let h = start(FakeRuntime::new());
    tokio::time::sleep(Duration::from_secs(12)).await;
    let bumped = h.cache.timestamp().expect("a timestamp");
    assert!(Instant::now() - bumped <= Duration::from_secs(5), "bumped every 5 s although no relist ran");
    h.stop().await;
}

/// A runtime with no events: scripted `Unimplemented`, so the PLEG relists on change hints.
fn hinting() -> FakeRuntime {
    let runtime = FakeRuntime::new();
    runtime.fail_next(
        Method::StreamEvents,
        FakeError::new(Code::Unimplemented, "method GetContainerEvents not implemented"),
    );
    runtime
}

#[tokio::test(start_paused = true)]
async fn without_events_each_hint_makes_the_pleg_relist_at_once_and_idle_costs_no_relist() {
    let mut h = start(hinting());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let settled = h.runtime.calls_of(Method::GetPods).len();
    assert_eq!(settled, 5, "the first relist, and the follow-ups after subscribing");
    h.sync("p1").await;
    assert_eq!(h.events_within(Duration::from_millis(20)).await, [Started, Started], "relisted on the hint");
    let id = h.cache.get(&PodUid::new("p1")).status.container_statuses[0].id.clone();
    tokio::time::sleep(Duration::from_secs(2)).await;
    h.runtime.stop_container(&id, 1).unwrap();
    assert_eq!(h.events_within(Duration::from_millis(20)).await, [Died], "seen 10 ms after the hint");
    let hinted = h.runtime.calls_of(Method::GetPods).len();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lists = h.runtime.calls_of(Method::GetPods).len();
    assert_eq!(lists, hinted + 5, "five more follow-up relists after the exit's hint");
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(h.runtime.calls_of(Method::GetPods).len(), lists, "no relist while nothing changes");
    assert!(h.pleg.healthy().is_ok());
    // A pod worker waiting for a status newer than now gets one relist at once.
    let waited = Instant::now();
    let uid = PodUid::new("p1");
    let fresh = tokio::time::timeout(Duration::from_millis(10), h.cache.get_newer_than(&uid, Some(waited)));
    assert!(fresh.await.is_ok(), "a waiter is served by a relist it asked for");
    assert_eq!(h.runtime.calls_of(Method::GetPods).len(), lists + 1);
    h.stop().await;
}

/// containerd publishes a task's exit before its CRI plugin records it: `hint` comes first, the
/// relist 10 ms later sees nothing, and the death shows 20 ms after the hint; it is seen within
/// `within` after that.
async fn a_hint_ahead_of_a_death_is_caught_within(hint: ChangeHint, within: Duration) {
    let mut h = start(hinting());
    h.sync("p1").await;
    assert_eq!(h.events_within(Duration::from_millis(20)).await, [Started, Started]);
    let id = h.cache.get(&PodUid::new("p1")).status.container_statuses[0].id.clone();
    tokio::time::sleep(Duration::from_secs(2)).await;
    h.runtime.send_hint(hint);
    tokio::time::sleep(Duration::from_millis(20)).await;
    h.runtime.set_events_muted(true);
    h.runtime.stop_container(&id, 1).unwrap();
    h.runtime.set_events_muted(false);
    assert_eq!(h.events_within(within).await, [Died], "{hint:?}");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_hint_ahead_of_the_runtime_state_is_caught_by_a_follow_up_relist() {
    // The follow-up relist at 110 ms sees it.
    a_hint_ahead_of_a_death_is_caught_within(ChangeHint::Changed, Duration::from_millis(100)).await;
}

#[tokio::test(start_paused = true)]
async fn an_exit_hint_ahead_of_the_runtime_state_is_caught_within_tens_of_milliseconds() {
    // The follow-up relist at 35 ms sees it.
    a_hint_ahead_of_a_death_is_caught_within(ChangeHint::Exited, Duration::from_millis(20)).await;
}

#[tokio::test(start_paused = true)]
async fn a_broken_hint_stream_reconnects_and_five_failures_fall_back() {
    reconnects_and_catches_up(hinting(), Duration::from_secs(1), Duration::from_millis(20)).await;

    falls_back_after_five_failures_of(hinting(), Method::WatchChanges).await;
}

#[tokio::test(start_paused = true)]
async fn hint_stream_failures_count_only_in_a_row() {
    let h = start(hinting());
    for i in 0..6 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Each stream delivers hints before it breaks.
        h.sync(&format!("p{i}")).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        h.runtime.break_event_streams();
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let lists = h.runtime.calls_of(Method::GetPods).len();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        h.runtime.calls_of(Method::GetPods).len(),
        lists,
        "six broken streams that each worked do not fall back"
    );
    h.stop().await;
}

mod schedule {
    use super::super::{EXIT_MIN_GAP, HINT_MIN_GAP, HintSchedule};
    use super::*;

    /// The relists a schedule asks for when hints come at `hints` (milliseconds), up to `until`.
    fn relists(hints: &[u64], until: u64) -> Vec<u64> {
        relists_of(&hints.iter().map(|&ms| (ms, ChangeHint::Changed)).collect::<Vec<_>>(), until)
    }

    /// As [`relists`], with each hint's kind.
    fn relists_of(hints: &[(u64, ChangeHint)], until: u64) -> Vec<u64> {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut schedule = HintSchedule::new(t0);
        let mut hints = hints.iter().copied().peekable();
        let mut done = Vec::new();
        for ms in 0..=until {
            while let Some(&(_, hint)) = hints.peek().filter(|(hint_ms, _)| *hint_ms == ms) {
                schedule.hint(at(ms), hint);
                hints.next();
            }
            if schedule.due().is_some_and(|due| due <= at(ms)) {
                schedule.relisted(at(ms));
                done.push(ms);
            }
        }
        done
    }

    #[test]
    fn subscribing_and_a_lone_hint_bring_four_relists_each() {
        assert_eq!(relists(&[], 3000), [10, 110, 250, 1000]);
        assert_eq!(relists(&[2000], 4000), [10, 110, 250, 1000, 2010, 2110, 2250, 3000]);
    }

    #[test]
    fn a_relist_made_for_a_refresh_keeps_the_gap_and_covers_the_follow_ups_behind_it() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut schedule = HintSchedule::new(t0);
        schedule.relisted(at(10));
        // A hint at 500 ms: follow-ups at 510, 600, 750 and 1500 ms.
        schedule.hint(at(500), ChangeHint::Changed);
        // A pod worker's refresh relists at 505 ms: the first follow-up keeps the gap from it.
        schedule.relisted(at(505));
        assert_eq!(schedule.due(), Some(at(605)));
        // Another at 620 ms covers the follow-ups at 510 and 600 ms; one older is old news.
        schedule.relisted(at(620));
        schedule.relisted(at(600));
        assert_eq!(schedule.due(), Some(at(750)));
    }

    #[test]
    fn plain_hints_after_an_exit_keep_the_plain_gap_once_its_dense_follow_ups_are_over() {
        // An exit at 2000 ms (a teardown's), then a pod start's hints every 20 ms for a second.
        let mut hints = vec![(2000, ChangeHint::Exited)];
        hints.extend((0..50).map(|i| (2150 + i * 20, ChangeHint::Changed)));
        let done = relists_of(&hints, 4000);
        let starting: Vec<u64> = done.iter().copied().filter(|ms| (2150..3200).contains(ms)).collect();
        assert!(
            starting.windows(2).all(|w| Duration::from_millis(w[1] - w[0]) >= HINT_MIN_GAP),
            "the exit's 25 ms gap ended with its follow-ups: {done:?}"
        );
        // A plain hint within the exit's dense follow-ups keeps them.
        let done = relists_of(&[(2000, ChangeHint::Exited), (2030, ChangeHint::Changed)], 2200);
        assert_eq!(done, [10, 110, 250, 1000, 2010, 2040, 2065, 2090, 2130], "{done:?}");
    }

    #[test]
    fn a_hint_soon_after_a_relist_waits_for_the_gap() {
        // A relist at 10 ms; a hint at 50 ms is due at 60 ms, but no sooner than 110 ms; each
        // follow-up keeps the gap too.
        assert_eq!(relists(&[50], 1100), [10, 110, 210, 310, 1050]);
    }

    #[test]
    fn a_burst_of_hints_relists_every_gap_then_follows_up() {
        // A hint every 20 ms for a second: a relist every 100 ms, then the follow-ups.
        let hints: Vec<u64> = (1..=50).map(|i| i * 20).collect();
        let done = relists(&hints, 3000);
        assert!(done.windows(2).all(|w| Duration::from_millis(w[1] - w[0]) >= HINT_MIN_GAP), "{done:?}");
        assert!(done.len() <= 15, "{} relists for 50 hints: {done:?}", done.len());
        assert_eq!(done.last(), Some(&2000), "the last follow-up, 1 s after the last hint");
    }

    #[test]
    fn an_exit_hint_follows_up_densely_then_as_any_hint() {
        // Idle since subscribing; an exit at 2000 ms: relists 10, 25 (35 with the gap), 50 (60)
        // and 100 ms after it, then 250 ms and 1 s.
        assert_eq!(
            relists_of(&[(2000, ChangeHint::Exited)], 4000),
            [10, 110, 250, 1000, 2010, 2035, 2060, 2100, 2250, 3000]
        );
        // The task's deletion 5 ms after its exit: the follow-ups count from the deletion, each
        // at least 25 ms after the one before.
        assert_eq!(
            relists_of(&[(2000, ChangeHint::Exited), (2005, ChangeHint::Exited)], 2100),
            [10, 110, 250, 1000, 2015, 2040, 2065]
        );
        // Once the exit's follow-ups have run out, a plain hint has the plain schedule again.
        assert_eq!(
            relists_of(&[(2000, ChangeHint::Exited), (4000, ChangeHint::Changed)], 4300),
            [10, 110, 250, 1000, 2010, 2035, 2060, 2100, 2250, 3000, 4010, 4110, 4250]
        );
    }

    #[test]
    fn a_burst_of_exits_keeps_the_exit_gap() {
        let hints: Vec<(u64, ChangeHint)> = (1..=50).map(|i| (i * 5, ChangeHint::Exited)).collect();
        let done = relists_of(&hints, 2000);
        assert!(done.windows(2).all(|w| Duration::from_millis(w[1] - w[0]) >= EXIT_MIN_GAP), "{done:?}");
        assert_eq!(done.last(), Some(&1250), "the last follow-up, 1 s after the last exit");
    }
}
