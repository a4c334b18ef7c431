//! The manager against the fake runtime, with paused time: exec probes, thresholds, startup
//! gating, events, and stopping.

use std::{collections::HashSet, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{ExecAction, Pod, Probe};
use kubelet_core::{
    Backoff, Cache, PodUid, ProbeKind, ProbeManager, ProbeOutcome, ProbeResult, ProbeResults, Runtime,
    events::RingRecorder,
    fake::{FakeRuntime, Method},
    runtime::{ExecResult, PodStatus},
    testing::pod,
};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{Config, Manager};

struct Harness {
    runtime: Arc<FakeRuntime>,
    cache: Arc<Cache>,
    results: Arc<ProbeResults>,
    recorder: Arc<RingRecorder>,
    changes: mpsc::Receiver<ProbeResult>,
    prober: Manager<FakeRuntime>,
    cancel: CancellationToken,
}

fn harness() -> Harness {
    let runtime = Arc::new(FakeRuntime::new());
    let cache = Arc::new(Cache::new());
    let results = Arc::new(ProbeResults::new());
    let recorder = Arc::new(RingRecorder::default());
    let (updates, changes) = mpsc::channel(64);
    let cancel = CancellationToken::new();
    let prober = Manager::new(
        runtime.clone(),
        cache.clone(),
        results.clone(),
        updates,
        recorder.clone(),
        Config::default(),
        cancel.clone(),
    );
    Harness { runtime, cache, results, recorder, changes, prober, cancel }
}

fn exec_probe(period: i32, failure_threshold: i32) -> Probe {
    Probe {
        exec: Some(ExecAction { command: Some(vec!["true".into()]) }),
        period_seconds: Some(period),
        failure_threshold: Some(failure_threshold),
        ..Probe::default()
    }
}

fn exit(code: i32) -> ExecResult {
    let mut result = ExecResult::default();
    result.exit_code = code;
    result.stdout = format!("exit {code}\n").into_bytes();
    result
}

impl Harness {
    /// Runs `pod` on the fake runtime and shows it in the cache; returns its container's ID.
    async fn run(&self, pod: &Pod) -> String {
        let uid = PodUid::of(pod);
        let empty = PodStatus::new(uid.clone(), "", "");
        let result = self
            .runtime
            .sync_pod(pod, &empty, &Backoff::default(), &kubelet_core::ProbeResults::new(), &Default::default())
            .await;
        assert!(!result.is_err(), "{result:?}");
        self.refresh(&uid).await;
        self.cache.get(&uid).status.container_statuses[0].id.clone()
    }

    async fn refresh(&self, uid: &PodUid) {
        let status = self.runtime.get_pod_status(uid, uid.as_str(), "default").await.unwrap();
        self.cache.set(uid, status, None, Instant::now());
    }

    /// The changes sent within `within`.
    async fn changes_within(&mut self, within: Duration) -> Vec<(ProbeKind, ProbeOutcome)> {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        while let Ok(Some(change)) = tokio::time::timeout_at(deadline, self.changes.recv()).await {
            seen.push((change.kind, change.outcome));
        }
        seen
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.prober.wait().await;
    }
}

#[tokio::test(start_paused = true)]
async fn readiness_starts_failed_and_flips_on_the_first_success() {
    let mut h = harness();
    let mut p = pod("p1", &["app"]);
    p.spec.as_mut().unwrap().containers[0].readiness_probe = Some(exec_probe(10, 3));
    let id = h.run(&p).await;
    h.runtime.set_exec_result("app", exit(0));
    // The agent started less than a period ago: the first probe waits up to 10 s of jitter.
    h.prober.add_pod(&Arc::new(p));
    assert_eq!(h.prober.worker_count(), 1);
    assert_eq!(
        h.changes_within(Duration::from_secs(11)).await,
        [(ProbeKind::Readiness, ProbeOutcome::Failure), (ProbeKind::Readiness, ProbeOutcome::Success)]
    );
    assert_eq!(h.results.get(ProbeKind::Readiness, &id), Some(ProbeOutcome::Success));
    assert!(h.changes_within(Duration::from_secs(60)).await.is_empty(), "only changes are sent");
    let probes = h.runtime.calls_of(Method::ExecSync).len();
    assert!((6..=8).contains(&probes), "one probe every 10 s: {probes}");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn liveness_fails_after_its_threshold_with_events_then_holds_until_a_new_container() {
    let mut h = harness();
    let mut p = pod("p1", &["app"]);
    p.spec.as_mut().unwrap().containers[0].liveness_probe = Some(exec_probe(10, 3));
    let id = h.run(&p).await;
    h.runtime.set_exec_result("app", exit(1));
    h.prober.add_pod(&Arc::new(p.clone()));
    let changes = h.changes_within(Duration::from_secs(10)).await;
    assert_eq!(changes, [(ProbeKind::Liveness, ProbeOutcome::Success)], "the initial verdict");
    assert_eq!(h.changes_within(Duration::from_secs(21)).await, [(ProbeKind::Liveness, ProbeOutcome::Failure)]);
    assert!(h.results.failed(ProbeKind::Liveness, &id));
    let events = h.recorder.events_for("p1");
    assert_eq!(events.len(), 3, "one event per failed probe: {events:?}");
    assert!(events.iter().all(|e| e.reason == "Unhealthy" && e.message == "Liveness probe failed: exit 1"));
    // Held: no more probes of this container.
    let probes = h.runtime.calls_of(Method::ExecSync).len();
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(h.runtime.calls_of(Method::ExecSync).len(), probes, "held after the failure");
    // The runtime replaces the container: the worker forgets the old one and probes the new.
    h.runtime.stop_container(&id, 137).unwrap();
    let uid = PodUid::new("p1");
    let status = h.runtime.get_pod_status(&uid, "p1", "default").await.unwrap();
    let result = h
        .runtime
        .sync_pod(&p, &status, &Backoff::default(), &kubelet_core::ProbeResults::new(), &Default::default())
        .await;
    assert!(!result.is_err(), "{result:?}");
    h.refresh(&uid).await;
    h.runtime.set_exec_result("app", exit(0));
    assert_eq!(h.changes_within(Duration::from_secs(11)).await, [(ProbeKind::Liveness, ProbeOutcome::Success)]);
    assert_eq!(h.results.get(ProbeKind::Liveness, &id), None, "the old container's verdict is gone");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_startup_probe_gates_liveness_until_it_passes() {
    let mut h = harness();
    let mut p = pod("p1", &["app"]);
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    c.startup_probe = Some(exec_probe(1, 30));
    c.liveness_probe = Some(exec_probe(1, 1));
    let id = h.run(&p).await;
    h.runtime.set_exec_result("app", exit(1));
    h.prober.add_pod(&Arc::new(p));
    assert_eq!(h.prober.worker_count(), 2);
    let changes = h.changes_within(Duration::from_secs(5)).await;
    assert!(changes.contains(&(ProbeKind::Startup, ProbeOutcome::Unknown)), "{changes:?}");
    assert!(changes.contains(&(ProbeKind::Liveness, ProbeOutcome::Success)), "{changes:?}");
    assert!(
        !changes.contains(&(ProbeKind::Liveness, ProbeOutcome::Failure)),
        "liveness waits for startup: {changes:?}"
    );
    h.runtime.set_exec_result("app", exit(0));
    assert_eq!(h.changes_within(Duration::from_secs(2)).await, [(ProbeKind::Startup, ProbeOutcome::Success)]);
    h.runtime.set_exec_result("app", exit(1));
    assert_eq!(h.changes_within(Duration::from_secs(3)).await, [(ProbeKind::Liveness, ProbeOutcome::Failure)]);
    assert_eq!(h.results.get(ProbeKind::Startup, &id), Some(ProbeOutcome::Success));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn removing_or_cleaning_up_a_pod_stops_its_workers_and_forgets_their_results() {
    let h = harness();
    let mut a = pod("a", &["app"]);
    a.spec.as_mut().unwrap().containers[0].readiness_probe = Some(exec_probe(1, 1));
    let mut b = pod("b", &["app"]);
    b.spec.as_mut().unwrap().containers[0].liveness_probe = Some(exec_probe(1, 1));
    h.run(&a).await;
    h.run(&b).await;
    h.prober.add_pod(&Arc::new(a.clone()));
    h.prober.add_pod(&Arc::new(b.clone()));
    h.prober.add_pod(&Arc::new(b.clone()));
    assert_eq!(h.prober.worker_count(), 2, "adding a pod twice starts its workers once");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(h.results.len(), 2);
    h.prober.remove_pod(&a);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(h.prober.worker_count(), 1);
    assert_eq!(h.results.len(), 1);
    h.prober.cleanup_pods(&HashSet::from([PodUid::new("a")]));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(h.prober.worker_count(), 0);
    assert!(h.results.is_empty());
    let probes = h.runtime.calls_of(Method::ExecSync).len();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(h.runtime.calls_of(Method::ExecSync).len(), probes, "nothing probes a removed pod");
    // A pod added again after it was removed is probed again.
    h.prober.add_pod(&Arc::new(a));
    assert_eq!(h.prober.worker_count(), 1);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_started_unready_container_is_probed_for_readiness_at_once_when_asked() {
    let mut h = harness();
    // Long after the agent started: no start-up jitter.
    tokio::time::advance(Duration::from_secs(200)).await;
    let mut p = pod("p1", &["app"]);
    p.spec.as_mut().unwrap().containers[0].readiness_probe = Some(exec_probe(100, 3));
    h.runtime.set_exec_result("app", exit(0));
    h.prober.add_pod(&Arc::new(p.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The container starts after the worker's first look; its next is 100 s away.
    h.run(&p).await;
    assert!(h.changes_within(Duration::from_secs(1)).await.is_empty(), "nothing before the period");
    h.prober.probe_readiness_now(&PodUid::of(&p), "app");
    assert_eq!(
        h.changes_within(Duration::from_secs(1)).await,
        [(ProbeKind::Readiness, ProbeOutcome::Failure), (ProbeKind::Readiness, ProbeOutcome::Success)],
        "probed when asked, not 100 s later"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_terminating_pod_keeps_its_readiness_probe_only() {
    let h = harness();
    let mut p = pod("p1", &["app"]);
    let container = &mut p.spec.as_mut().unwrap().containers[0];
    container.readiness_probe = Some(exec_probe(1, 1));
    container.liveness_probe = Some(exec_probe(1, 1));
    h.run(&p).await;
    h.prober.add_pod(&Arc::new(p.clone()));
    assert_eq!(h.prober.worker_count(), 2);
    h.prober.stop_liveness_and_startup(&p);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(h.prober.worker_count(), 1, "readiness goes on while the pod terminates");
    h.prober.remove_pod(&p);
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(h.prober.worker_count(), 0);
    h.stop().await;
}
