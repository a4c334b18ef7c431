//! Sync loop dispatch tests with paused time and a recording handler.

use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use tokio::{sync::mpsc, task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::{
    PodUid, Source,
    probe::{ProbeKind, ProbeOutcome},
    state::HealthError,
};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Add(Vec<String>),
    Update(Vec<String>),
    Remove(Vec<String>),
    Reconcile(Vec<String>),
    Sync(Vec<String>),
    Cleanup,
    Died(String, String),
}

struct Recorder {
    tx: mpsc::UnboundedSender<(Instant, Call)>,
}

fn uids(pods: &[Arc<Pod>]) -> Vec<String> {
    pods.iter().map(|p| PodUid::of(p).to_string()).collect()
}

impl Recorder {
    fn record(&self, call: Call) {
        let _ = self.tx.send((Instant::now(), call));
    }
}

impl SyncHandler for Recorder {
    type Error = Infallible;

    async fn handle_pod_additions(&self, pods: Vec<Arc<Pod>>) {
        self.record(Call::Add(uids(&pods)));
    }
    async fn handle_pod_updates(&self, pods: Vec<Arc<Pod>>) {
        self.record(Call::Update(uids(&pods)));
    }
    async fn handle_pod_removes(&self, pods: Vec<Arc<Pod>>) {
        self.record(Call::Remove(uids(&pods)));
    }
    async fn handle_pod_reconcile(&self, pods: Vec<Arc<Pod>>) {
        self.record(Call::Reconcile(uids(&pods)));
    }
    async fn handle_pod_syncs(&self, pods: Vec<Arc<Pod>>) {
        self.record(Call::Sync(uids(&pods)));
    }
    async fn handle_pod_cleanups(&self) -> Result<(), Infallible> {
        self.record(Call::Cleanup);
        Ok(())
    }
    async fn handle_container_died(&self, uid: &PodUid, container_id: &str) {
        self.record(Call::Died(uid.to_string(), container_id.to_owned()));
    }
}

fn pod(uid: &str) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            name: Some(uid.into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        ..Default::default()
    })
}

struct Harness {
    config: mpsc::Sender<PodUpdate>,
    pleg: mpsc::Sender<PodLifecycleEvent>,
    probes: mpsc::Sender<ProbeResult>,
    calls: mpsc::UnboundedReceiver<(Instant, Call)>,
    shared: Shared,
    cancel: CancellationToken,
    task: JoinHandle<()>,
    started: Instant,
}

impl Harness {
    fn start(expected_sources: &[Source]) -> Harness {
        Harness::start_with(expected_sources, Arc::new(RuntimeState::new(Duration::from_secs(365 * 86400))), true)
    }

    fn start_with(expected_sources: &[Source], runtime_state: Arc<RuntimeState>, runtime_synced: bool) -> Harness {
        if runtime_synced {
            runtime_state.set_runtime_sync(Instant::now());
        }
        let (config_tx, config_rx) = mpsc::channel(16);
        let (pleg_tx, pleg_rx) = mpsc::channel(16);
        let (probe_tx, probe_rx) = mpsc::channel(16);
        let (calls_tx, calls_rx) = mpsc::unbounded_channel();
        let shared = Shared::new(
            Arc::new(PodManager::new()),
            Arc::new(WorkQueue::new()),
            Arc::new(SourcesReady::new(expected_sources.iter().copied())),
            runtime_state,
            Arc::new(LoopHealth::new(Duration::from_secs(60))),
        );
        let cancel = CancellationToken::new();
        let task = tokio::spawn({
            let (shared, cancel) = (shared.clone(), cancel.clone());
            async move {
                let handler = Recorder { tx: calls_tx };
                run(&handler, Inputs::new(config_rx, pleg_rx, probe_rx), &shared, &Config::default(), cancel).await;
            }
        });
        Harness {
            config: config_tx,
            pleg: pleg_tx,
            probes: probe_tx,
            calls: calls_rx,
            shared,
            cancel,
            task,
            started: Instant::now(),
        }
    }

    async fn next(&mut self) -> (Duration, Call) {
        let (at, call) = self.calls.recv().await.expect("handler dropped");
        (at - self.started, call)
    }

    async fn next_call(&mut self) -> Call {
        self.next().await.1
    }

    /// Asserts that no call arrives within `d` of virtual time.
    async fn assert_quiet_for(&mut self, d: Duration) {
        if let Ok(Some((_, call))) = tokio::time::timeout(d, self.calls.recv()).await {
            panic!("unexpected call {call:?}");
        }
    }

    async fn send(&self, op: Operation, source: Source, pods: &[&str]) {
        self.config.send(PodUpdate::new(op, source, pods.iter().map(|u| pod(u)).collect())).await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn config_ops_map_to_upstream_handlers() {
    // Api is expected but never sends, so housekeeping stays off and does not interleave.
    let mut h = Harness::start(&[Source::File, Source::Api]);
    h.send(Operation::Add, Source::File, &["a", "b"]).await;
    h.send(Operation::Update, Source::File, &["a"]).await;
    h.send(Operation::Delete, Source::File, &["b"]).await;
    h.send(Operation::Remove, Source::File, &["a"]).await;
    h.send(Operation::Set, Source::File, &["ignored"]).await;
    h.send(Operation::Reconcile, Source::File, &["c"]).await;
    assert_eq!(h.next_call().await, Call::Add(vec!["a".into(), "b".into()]));
    assert_eq!(h.next_call().await, Call::Update(vec!["a".into()]));
    assert_eq!(h.next_call().await, Call::Update(vec!["b".into()]), "DELETE is an update carrying deletionTimestamp");
    assert_eq!(h.next_call().await, Call::Remove(vec!["a".into()]));
    assert_eq!(h.next_call().await, Call::Reconcile(vec!["c".into()]), "SET is not dispatched");
    assert!(h.shared.sources.is_seen(Source::File));
    assert!(!h.shared.sources.all_ready());
}

#[tokio::test(start_paused = true)]
async fn housekeeping_runs_every_two_seconds_once_all_sources_are_ready() {
    let mut h = Harness::start(&[Source::File, Source::Http]);
    h.assert_quiet_for(Duration::from_secs(10)).await;
    h.send(Operation::Add, Source::File, &[]).await;
    assert_eq!(h.next_call().await, Call::Add(vec![]));
    h.assert_quiet_for(Duration::from_secs(5)).await;
    // A SET is not dispatched but still marks its source as seen.
    h.send(Operation::Set, Source::Http, &[]).await;
    let (first, call) = h.next().await;
    assert_eq!(call, Call::Cleanup);
    let (second, call) = h.next().await;
    assert_eq!(call, Call::Cleanup);
    assert_eq!(second - first, Duration::from_secs(2));
    assert_eq!(first.as_millis() % 2000, 0, "housekeeping follows its own 2 s ticker");
}

#[tokio::test(start_paused = true)]
async fn pleg_events_sync_known_pods_and_died_prunes() {
    let mut h = Harness::start(&[Source::Api]);
    h.shared.pods.add_pod(pod("p1"));
    let ev = |kind, cid: Option<&str>| PodLifecycleEvent::new(PodUid::new("p1"), kind, cid.map(str::to_owned));
    h.pleg.send(ev(PodLifecycleEventKind::ContainerStarted, Some("c1"))).await.unwrap();
    assert_eq!(h.next_call().await, Call::Sync(vec!["p1".into()]));
    h.pleg.send(ev(PodLifecycleEventKind::ContainerRemoved, Some("c1"))).await.unwrap();
    h.pleg.send(ev(PodLifecycleEventKind::ContainerDied, Some("c2"))).await.unwrap();
    assert_eq!(h.next_call().await, Call::Sync(vec!["p1".into()]), "ContainerRemoved does not sync");
    assert_eq!(h.next_call().await, Call::Died("p1".into(), "c2".into()));
    h.pleg.send(PodLifecycleEvent::new(PodUid::new("unknown"), PodLifecycleEventKind::PodSync, None)).await.unwrap();
    h.pleg.send(ev(PodLifecycleEventKind::PodSync, None)).await.unwrap();
    assert_eq!(h.next_call().await, Call::Sync(vec!["p1".into()]), "events of unknown pods are dropped");
}

#[tokio::test(start_paused = true)]
async fn sync_tick_syncs_pods_whose_time_has_come() {
    let mut h = Harness::start(&[Source::Api]);
    h.shared.pods.add_pod(pod("due-later"));
    h.shared.pods.add_pod(pod("due-soon"));
    h.shared.work_queue.enqueue(PodUid::new("due-later"), Duration::from_millis(3500));
    h.shared.work_queue.enqueue(PodUid::new("due-soon"), Duration::from_millis(1500));
    h.shared.work_queue.enqueue(PodUid::new("not-in-config"), Duration::ZERO);
    assert_eq!(h.next().await, (Duration::from_secs(2), Call::Sync(vec!["due-soon".into()])));
    assert_eq!(h.next().await, (Duration::from_secs(4), Call::Sync(vec!["due-later".into()])));
    h.assert_quiet_for(Duration::from_secs(5)).await;
    assert!(h.shared.work_queue.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_pod_queued_to_sync_now_is_synced_at_once_not_at_the_next_tick() {
    let mut h = Harness::start(&[Source::Api]);
    h.shared.pods.add_pod(pod("mounts-a-config-map"));
    h.shared.pods.add_pod(pod("resyncs-later"));
    h.shared.work_queue.enqueue(PodUid::new("resyncs-later"), Duration::from_millis(2500));
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.shared.work_queue.enqueue_now(PodUid::new("mounts-a-config-map"));
    let (at, call) = h.next().await;
    assert_eq!(call, Call::Sync(vec!["mounts-a-config-map".into()]), "only the pod queued now");
    assert_eq!(at, Duration::from_millis(300), "at once, not at the 1 s tick");
    assert_eq!(h.next().await, (Duration::from_secs(3), Call::Sync(vec!["resyncs-later".into()])));
}

#[tokio::test(start_paused = true)]
async fn probe_results_sync_unless_liveness_succeeds() {
    let mut h = Harness::start(&[Source::Api]);
    h.shared.pods.add_pod(pod("p1"));
    let probe = |kind, outcome| ProbeResult::new(kind, PodUid::new("p1"), "c1", outcome);
    h.probes.send(probe(ProbeKind::Liveness, ProbeOutcome::Success)).await.unwrap();
    h.probes.send(probe(ProbeKind::Liveness, ProbeOutcome::Failure)).await.unwrap();
    assert_eq!(h.next_call().await, Call::Sync(vec!["p1".into()]));
    h.probes.send(probe(ProbeKind::Readiness, ProbeOutcome::Success)).await.unwrap();
    assert_eq!(h.next_call().await, Call::Sync(vec!["p1".into()]));
    h.assert_quiet_for(Duration::from_secs(3)).await;
}

#[tokio::test(start_paused = true)]
async fn unhealthy_runtime_gates_the_loop_with_doubling_backoff() {
    let checked_at = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let state = Arc::new(RuntimeState::new(Duration::from_secs(365 * 86400)));
    state.add_health_check("PLEG", {
        let checked_at = checked_at.clone();
        Arc::new(move || {
            let mut at = checked_at.lock().unwrap();
            at.push(Instant::now());
            if at.len() <= 9 { Err(HealthError("pleg has yet to be successful".into())) } else { Ok(()) }
        })
    });
    let mut h = Harness::start_with(&[Source::Api], state, true);
    // Queued while unhealthy: must only be handled after the runtime recovers.
    h.send(Operation::Add, Source::Api, &["p"]).await;
    let (at, call) = h.next().await;
    assert_eq!(call, Call::Add(vec!["p".into()]));
    let checks = checked_at.lock().unwrap().clone();
    let gaps: Vec<u128> = checks.windows(2).take(9).map(|w| (w[1] - w[0]).as_millis()).collect();
    assert_eq!(gaps, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    assert_eq!(at, checks[9] - h.started, "work resumes right after the first healthy check");
}

#[tokio::test(start_paused = true)]
async fn no_work_before_the_first_runtime_status() {
    let mut h = Harness::start_with(&[Source::Api], Arc::new(RuntimeState::default()), false);
    h.send(Operation::Add, Source::Api, &["p"]).await;
    h.assert_quiet_for(Duration::from_secs(20)).await;
    h.shared.runtime_state.set_runtime_sync(Instant::now());
    assert_eq!(h.next_call().await, Call::Add(vec!["p".into()]));
}

#[tokio::test(start_paused = true)]
async fn exits_on_cancel_and_marks_progress() {
    let h = Harness::start(&[Source::Api]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mark = h.shared.health.last().expect("loop marked progress");
    assert!(Instant::now() - mark <= Duration::from_secs(1));
    assert!(h.shared.health.check().is_ok());
    h.cancel.cancel();
    tokio::time::timeout(Duration::from_secs(1), h.task).await.expect("loop exits on cancel").unwrap();
}

#[tokio::test(start_paused = true)]
async fn exits_when_config_channel_closes_but_not_when_pleg_closes() {
    let Harness { config, pleg, probes, task, calls: _calls, .. } = Harness::start(&[Source::Api]);
    drop(pleg);
    drop(probes);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!task.is_finished());
    drop(config);
    tokio::time::timeout(Duration::from_secs(1), task).await.expect("loop exits when config closes").unwrap();
}

#[tokio::test(start_paused = true)]
async fn cancel_interrupts_runtime_backoff() {
    let h = Harness::start_with(&[Source::Api], Arc::new(RuntimeState::default()), false);
    tokio::time::sleep(Duration::from_secs(30)).await;
    h.cancel.cancel();
    tokio::time::timeout(Duration::from_millis(10), h.task).await.expect("no wait for the backoff sleep").unwrap();
}
