//! Generic PLEG tests with the fake runtime and paused time.

use k8s_openapi::api::core::v1::Pod as ApiPod;
use kubelet_core::{
    Backoff,
    fake::{Code, FakeError, FakeRuntime, Method},
    runtime::ContainerState,
};

use super::*;

fn api_pod(uid: &str, containers: &[&str]) -> ApiPod {
    kubelet_core::testing::pod(uid, containers)
}

struct Harness {
    runtime: Arc<FakeRuntime>,
    cache: Arc<Cache>,
    pleg: Arc<GenericPleg<FakeRuntime>>,
    events: mpsc::Receiver<PodLifecycleEvent>,
}

fn harness(config: Config) -> Harness {
    let runtime = Arc::new(FakeRuntime::new());
    let cache = Arc::new(Cache::new());
    let (pleg, events) = GenericPleg::new(runtime.clone(), cache.clone(), config);
    Harness { runtime, cache, pleg: Arc::new(pleg), events }
}

impl Harness {
    async fn start(&self, uid: &str, containers: &[&str]) {
        let pod = api_pod(uid, containers);
        let status = self.runtime.get_pod_status(&PodUid::new(uid), "", "").await.unwrap();
        let result = self
            .runtime
            .sync_pod(&pod, &status, &Backoff::default(), &kubelet_core::ProbeResults::new(), &Default::default())
            .await;
        assert!(!result.is_err(), "{result:?}");
    }

    fn drain(&mut self) -> Vec<(String, PodLifecycleEventKind)> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            out.push((e.id.to_string(), e.kind));
        }
        out
    }

    async fn container_id(&self, uid: &str, name: &str) -> String {
        self.runtime.get_pod_status(&PodUid::new(uid), "", "").await.unwrap().container_status(name).unwrap().id.clone()
    }
}

use PodLifecycleEventKind::{ContainerDied as Died, ContainerRemoved as Removed, ContainerStarted as Started, PodSync};

fn kinds(events: &[(String, PodLifecycleEventKind)]) -> Vec<PodLifecycleEventKind> {
    events.iter().map(|(_, k)| *k).collect()
}

#[tokio::test(start_paused = true)]
async fn new_pod_started_died_removed_and_gone() {
    let mut h = harness(Config::default());
    h.start("p1", &["a"]).await;
    h.pleg.relist().await;
    assert_eq!(kinds(&h.drain()), [Started, Started], "the sandbox and the container");
    let cached = h.cache.get(&PodUid::new("p1"));
    assert_eq!(cached.status.container_statuses.len(), 1);
    assert!(cached.error.is_none());

    let id = h.container_id("p1", "a").await;
    h.runtime.stop_container(&id, 1).unwrap();
    h.pleg.relist().await;
    assert_eq!(h.drain(), [("p1".to_owned(), Died)]);
    assert_eq!(h.cache.get(&PodUid::new("p1")).status.container_status("a").unwrap().state, ContainerState::Exited);

    h.runtime.remove_container(&id).unwrap();
    h.pleg.relist().await;
    assert_eq!(kinds(&h.drain()), [Removed], "an exit already seen is not reported twice");
}

#[tokio::test(start_paused = true)]
async fn removal_without_an_observed_exit_reports_died_then_removed() {
    let mut h = harness(Config::default());
    h.start("p1", &["a"]).await;
    h.pleg.relist().await;
    h.drain();
    let id = h.container_id("p1", "a").await;
    h.runtime.stop_container(&id, 0).unwrap();
    h.runtime.remove_container(&id).unwrap();
    h.pleg.relist().await;
    assert_eq!(kinds(&h.drain()), [Died, Removed]);
}

#[tokio::test(start_paused = true)]
async fn a_pod_gone_from_the_runtime_leaves_the_cache() {
    let mut h = harness(Config::default());
    h.start("p1", &["a"]).await;
    h.pleg.relist().await;
    h.drain();
    let running = h.runtime.get_pods(true).await.unwrap().remove(0);
    h.runtime.kill_pod(None, &running, None).await.unwrap();
    let mut policy = kubelet_core::runtime::GcPolicy::default();
    policy.max_per_pod_container = 0;
    h.runtime.garbage_collect(&policy, true, false).await.unwrap();
    h.pleg.relist().await;
    let events = kinds(&h.drain());
    assert_eq!(events, [Died, Removed, Died, Removed], "container and sandbox");
    assert_eq!(h.cache.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn unchanged_pods_cost_only_the_list_calls_and_bump_the_cache_time() {
    let mut h = harness(Config::default());
    for i in 0..20 {
        h.start(&format!("p{i}"), &["a", "b"]).await;
    }
    h.pleg.relist().await;
    h.drain();
    h.runtime.clear_calls();
    tokio::time::advance(Duration::from_secs(1)).await;
    let before = Instant::now();
    h.pleg.relist().await;
    assert!(h.drain().is_empty());
    let methods: Vec<Method> = h.runtime.calls().iter().map(|c| c.method).collect();
    assert_eq!(methods, [Method::GetPods], "no per-pod inspection when nothing changed");
    assert_eq!(h.cache.timestamp(), Some(before));
}

#[tokio::test(start_paused = true)]
async fn pod_ips_survive_a_stopped_sandbox() {
    let mut h = harness(Config::default());
    h.start("p1", &["a"]).await;
    h.pleg.relist().await;
    let ips = h.cache.get(&PodUid::new("p1")).status.ips.clone();
    assert_eq!(ips.len(), 1);
    h.runtime.stop_sandbox(&PodUid::new("p1")).unwrap();
    h.pleg.relist().await;
    assert!(h.drain().contains(&("p1".to_owned(), Died)));
    assert!(h.runtime.get_pod_status(&PodUid::new("p1"), "", "").await.unwrap().ips.is_empty());
    assert_eq!(h.cache.get(&PodUid::new("p1")).status.ips, ips, "the cache keeps the last IP");
}

#[tokio::test(start_paused = true)]
async fn a_failed_inspection_is_retried_with_the_old_record() {
    let mut h = harness(Config::default());
    h.start("p1", &["a"]).await;
    h.start("p2", &["a"]).await;
    h.runtime.fail_next(Method::GetPodStatus, FakeError::new(Code::DeadlineExceeded, "inspect timed out"));
    h.pleg.relist().await;
    let events = h.drain();
    assert_eq!(events.len(), 2, "only the pod that was inspected reports: {events:?}");
    let failed = if events[0].0 == "p1" { "p2" } else { "p1" };
    let cached = h.cache.get(&PodUid::new(failed));
    assert!(cached.error.as_ref().unwrap().to_string().contains("inspect timed out"));

    tokio::time::advance(Duration::from_secs(1)).await;
    h.pleg.relist().await;
    let events = h.drain();
    assert_eq!(events, [(failed.to_owned(), Started), (failed.to_owned(), Started)], "the same events, once inspected");
    assert!(h.cache.get(&PodUid::new(failed)).error.is_none());
    h.pleg.relist().await;
    assert!(h.drain().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_reinspected_pod_without_container_events_gets_pod_sync() {
    let mut h = harness(Config::default());
    h.start("p1", &["a"]).await;
    h.pleg.relist().await;
    h.drain();
    // A reinspection is owed (an earlier inspection failed) but the listing has not changed since
    // the last good one, as when a container went unknown and back.
    let listed = h.runtime.get_pods(true).await.unwrap().remove(0);
    h.pleg.lock().reinspect.insert(PodUid::new("p1"), Some(listed));
    h.runtime.clear_calls();
    h.pleg.relist().await;
    assert_eq!(kinds(&h.drain()), [PodSync]);
    assert_eq!(h.runtime.calls_of(Method::GetPodStatus).len(), 1);
    h.pleg.relist().await;
    assert!(h.drain().is_empty(), "owed once");
}

#[tokio::test(start_paused = true)]
async fn one_hung_inspection_does_not_stall_the_others() {
    let mut h = harness(Config::default().inspect_timeout(Duration::from_secs(2)));
    h.start("slow", &["a"]).await;
    h.start("fast", &["a"]).await;
    h.runtime.set_pod_status_latency(&PodUid::new("slow"), Duration::from_secs(600));
    let start = Instant::now();
    h.pleg.relist().await;
    assert_eq!(start.elapsed(), Duration::from_secs(2), "bounded by the inspection timeout");
    let events = h.drain();
    assert!(events.iter().all(|(uid, _)| uid == "fast") && events.len() == 2, "{events:?}");
    assert!(h.cache.get(&PodUid::new("slow")).error.unwrap().to_string().contains("timed out"));
    assert!(h.pleg.healthy().is_ok());
}

#[tokio::test(start_paused = true)]
async fn events_beyond_a_full_channel_wait_one_per_pod_and_none_is_lost() {
    let mut h = harness(Config::default().channel_capacity(3));
    for i in 0..4 {
        h.start(&format!("p{i}"), &["a"]).await;
    }
    h.pleg.relist().await;
    let first: Vec<_> = h.drain();
    assert_eq!(first.len(), 3, "{first:?}");
    // Two events for each of 4 pods (sandbox, container): 3 sent, 5 beyond the channel, of
    // which the pods' later ones merge into the one each pod has waiting.
    assert_eq!(h.pleg.waiting().order.len(), 3);
    assert_eq!(h.pleg.discarded_events(), 2);
    h.pleg.send_waiting().await;
    let rest = h.drain();
    let mut pods: Vec<String> = first.iter().chain(&rest).map(|(uid, _)| uid.to_string()).collect();
    pods.sort();
    pods.dedup();
    assert_eq!(pods, ["p0", "p1", "p2", "p3"], "every pod got an event: {first:?} {rest:?}");
    assert!(h.pleg.waiting().order.is_empty());
}

#[test]
fn a_waiting_death_is_kept_over_later_events_and_replaces_earlier_ones() {
    let mut waiting = Waiting::default();
    let event = |kind| PodLifecycleEvent::new(PodUid::new("p"), kind, Some("c".to_owned()));
    assert!(waiting.push(event(PodLifecycleEventKind::ContainerStarted)));
    assert!(!waiting.push(event(PodLifecycleEventKind::ContainerDied)));
    assert!(!waiting.push(event(PodLifecycleEventKind::ContainerStarted)));
    assert_eq!(waiting.pop().map(|e| e.kind), Some(PodLifecycleEventKind::ContainerDied));
    assert!(waiting.pop().is_none());
}

#[tokio::test(start_paused = true)]
async fn health_before_the_first_relist_and_after_the_threshold() {
    let h = harness(Config::default());
    assert_eq!(h.pleg.healthy().unwrap_err().to_string(), "pleg has yet to be successful");
    h.pleg.relist().await;
    assert!(h.pleg.healthy().is_ok());
    // The runtime stops answering: relists fail and the last success ages.
    for _ in 0..200 {
        h.runtime.fail_next(Method::GetPods, FakeError::new(Code::Unavailable, "down"));
    }
    for _ in 0..181 {
        tokio::time::advance(Duration::from_secs(1)).await;
        h.pleg.relist().await;
    }
    assert_eq!(h.pleg.healthy().unwrap_err().to_string(), "pleg was last seen active 3m1s ago; threshold is 3m0s");
}

#[tokio::test(start_paused = true)]
async fn run_relists_every_period_at_once_when_woken_and_refreshes_keep_a_gap_by_the_relists_cost() {
    let h = harness(Config::default());
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let (pleg, cancel) = (h.pleg.clone(), cancel.clone());
        async move { pleg.run(cancel).await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(h.runtime.calls_of(Method::GetPods).len(), 1, "first relist at once");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(h.runtime.calls_of(Method::GetPods).len(), 2, "then every second");
    h.pleg.relist_now();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(h.runtime.calls_of(Method::GetPods).len(), 3, "relist_now does not wait for the period");
    h.pleg.cache().request_refresh();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(h.runtime.calls_of(Method::GetPods).len(), 4, "nor does a pod worker's request through the cache");
    // Relists that take 4 ms: a refresh waits until ten times that after the last one began.
    h.runtime.set_latency(Method::GetPods, Duration::from_millis(4));
    h.pleg.relist_now();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(h.runtime.calls_of(Method::GetPods).len(), 5);
    assert_eq!(h.pleg.gap(), Duration::from_millis(40));
    h.pleg.cache().request_refresh();
    tokio::time::sleep(Duration::from_millis(28)).await;
    assert_eq!(h.runtime.calls_of(Method::GetPods).len(), 5, "a refresh 10 ms after a relist waits");
    tokio::time::sleep(Duration::from_millis(3)).await;
    assert_eq!(h.runtime.calls_of(Method::GetPods).len(), 6, "and goes 40 ms after that relist began");
    tokio::time::sleep(Duration::from_millis(10)).await;
    h.pleg.cache().request_refresh();
    tokio::time::sleep(Duration::from_millis(5)).await;
    h.pleg.relist_now();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(h.runtime.calls_of(Method::GetPods).len(), 7, "a wake-up while a refresh waits relists at once");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(h.runtime.calls_of(Method::GetPods).len(), 7, "and serves the waiting refresh");
    // However long relists take, a refresh waits at most 100 ms.
    h.runtime.set_latency(Method::GetPods, Duration::from_millis(30));
    h.pleg.relist_now();
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(h.pleg.gap(), Duration::from_millis(100));
    cancel.cancel();
    task.await.unwrap();
}

#[test]
fn go_duration_format() {
    assert_eq!(go_duration(Duration::from_secs(180)), "3m0s");
    assert_eq!(go_duration(Duration::from_millis(181_500)), "3m1.5s");
    assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
    assert_eq!(go_duration(Duration::from_secs(3661)), "1h1m1s");
}

#[tokio::test(start_paused = true)]
async fn a_burst_larger_than_the_channel_reaches_every_pod_between_relists() {
    let mut h = harness(Config::default().channel_capacity(4).relist_period(Duration::from_secs(3600)));
    for i in 0..50 {
        h.start(&format!("p{i:02}"), &["a", "b"]).await;
    }
    let cancel = CancellationToken::new();
    let pleg = h.pleg.clone();
    let running = tokio::spawn({
        let cancel = cancel.clone();
        async move { pleg.run(cancel).await }
    });
    // A slow consumer: one event at a time. No second relist comes for an hour, so every pod
    // must be reached from what the first relist found.
    let mut pods = std::collections::BTreeSet::new();
    while pods.len() < 50 {
        let event = tokio::time::timeout(Duration::from_secs(60), h.events.recv()).await.expect("an event").unwrap();
        pods.insert(event.id.to_string());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(h.pleg.waiting().order.is_empty());
    cancel.cancel();
    running.await.unwrap();
}
