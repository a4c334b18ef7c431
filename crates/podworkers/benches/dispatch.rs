//! Pod worker dispatch benchmark, with a free sync:
//! - bursts: one update to each of N pods (10, 1,000, 10,000) at once, timed until every sync
//!   started: dispatch throughput, and latency under that burst;
//! - paced: single updates to random pods among N idle workers, one at a time: the latency from
//!   update to sync start of one update;
//! - resident memory per idle worker;
//! - static pod handover: an edited static pod (a new UID, the same full name) waits for the old
//!   one; the time from the old one's kill to the new one's first sync (upstream: a resync,
//!   10 s or more).
//!
//! A background task bumps the status cache's timestamp every millisecond, as a PLEG's relist
//! would, so the workers' cache barrier opens as it does in the agent.
//! Run with `cargo bench -p kubelet-podworkers` (or `cargo xtask bench`); it prints its figures.

// Reason: a benchmark may panic on broken setup.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kubelet_core::{
    Cache, PodStatusFn, PodSyncer, PodUid, PodWorkers as _, SyncPodType, UpdatePodOptions, WorkQueue,
    runtime::{self, PodStatus},
};
use kubelet_podworkers::{Config, PodWorkers};
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;

/// A free sync that records when it started, relative to when its update was sent.
#[derive(Default)]
struct Probe {
    sent: Mutex<HashMap<PodUid, Instant>>,
    latencies: Mutex<Vec<Duration>>,
    remaining: Mutex<usize>,
    done: Notify,
}

impl PodSyncer for Probe {
    type Error = Infallible;

    async fn sync_pod(
        &self,
        _: SyncPodType,
        pod: &Arc<Pod>,
        _: Option<&Arc<Pod>>,
        _: &PodStatus,
    ) -> Result<bool, Infallible> {
        let now = Instant::now();
        if let Some(sent) = self.sent.lock().unwrap().remove(&PodUid::of(pod)) {
            self.latencies.lock().unwrap().push(now - sent);
            let mut remaining = self.remaining.lock().unwrap();
            *remaining -= 1;
            if *remaining == 0 {
                self.done.notify_one();
            }
        }
        Ok(false)
    }
    async fn sync_terminating_pod(
        &self,
        _: &Arc<Pod>,
        _: &PodStatus,
        _: i64,
        _: Option<&PodStatusFn>,
    ) -> Result<(), Infallible> {
        Ok(())
    }
    async fn sync_terminating_runtime_pod(&self, _: &runtime::Pod) -> Result<(), Infallible> {
        Ok(())
    }
    async fn sync_terminated_pod(&self, _: &Arc<Pod>, _: &PodStatus) -> Result<(), Infallible> {
        Ok(())
    }
}

struct Setup {
    probe: Arc<Probe>,
    workers: PodWorkers<Probe>,
    pods: Vec<Arc<Pod>>,
    lost: usize,
    _cancel: CancellationToken,
}

fn pod(i: usize) -> Arc<Pod> {
    let uid = format!("bench-{i}");
    Arc::new(Pod {
        metadata: ObjectMeta {
            uid: Some(uid.clone()),
            name: Some(uid),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    })
}

impl Setup {
    async fn new(n: usize) -> Setup {
        let probe = Arc::new(Probe::default());
        let cache = Arc::new(Cache::new());
        let cancel = CancellationToken::new();
        let workers = PodWorkers::new(
            probe.clone(),
            cache.clone(),
            Arc::new(WorkQueue::new()),
            Config::default(),
            cancel.clone(),
        );
        let pods: Vec<_> = (0..n).map(pod).collect();
        // The PLEG stand-in: a relist every millisecond.
        tokio::spawn({
            let (cache, cancel) = (cache.clone(), cancel.clone());
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(1));
                while !cancel.is_cancelled() {
                    tick.tick().await;
                    cache.update_time(Instant::now());
                }
            }
        });
        let mut setup = Setup { probe, workers, pods, lost: 0, _cancel: cancel };
        setup.round(SyncPodType::Create).await;
        setup.probe.latencies.lock().unwrap().clear();
        setup
    }

    /// Sends one update to every pod and waits until every sync started; returns the time taken.
    async fn round(&mut self, kind: SyncPodType) -> Duration {
        *self.probe.remaining.lock().unwrap() = self.pods.len();
        let start = Instant::now();
        for pod in &self.pods {
            self.probe.sent.lock().unwrap().insert(PodUid::of(pod), Instant::now());
            self.workers.update_pod(UpdatePodOptions::new(kind, pod.clone()));
        }
        if tokio::time::timeout(Duration::from_secs(30), self.probe.done.notified()).await.is_err() {
            self.lost += *self.probe.remaining.lock().unwrap();
        }
        start.elapsed()
    }

    /// Sends single updates to random pods, one at a time, each after the previous sync started.
    async fn paced(&mut self, updates: usize) {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..updates {
            *self.probe.remaining.lock().unwrap() = 1;
            let pod = self.pods[rng.usize(..self.pods.len())].clone();
            self.probe.sent.lock().unwrap().insert(PodUid::of(&pod), Instant::now());
            self.workers.update_pod(UpdatePodOptions::new(SyncPodType::Update, pod));
            if tokio::time::timeout(Duration::from_secs(30), self.probe.done.notified()).await.is_err() {
                self.lost += 1;
            }
        }
    }

    fn report(&self, what: &str, n: usize) {
        let mut latencies = std::mem::take(&mut *self.probe.latencies.lock().unwrap());
        if latencies.is_empty() {
            // A criterion filter left this size out.
            return;
        }
        latencies.sort();
        let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
        println!(
            "podworkers {what} n={n}: update-to-sync-start p50 {:?} p99 {:?} max {:?} over {} syncs; lost updates: {}",
            at(0.5),
            at(0.99),
            latencies.last().unwrap(),
            latencies.len(),
            self.lost
        );
    }
}

fn static_pod(uid: &str, name: &str) -> Arc<Pod> {
    let annotations = [(kubelet_core::types::annotations::CONFIG_SOURCE.to_owned(), "file".to_owned())];
    Arc::new(Pod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            name: Some(name.into()),
            namespace: Some("default".into()),
            annotations: Some(annotations.into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    })
}

/// Kills an old static pod while its edited successor waits for the name; returns the time
/// from the kill to the successor's first sync, for `rounds` edits.
async fn static_handover(rounds: usize) -> Vec<Duration> {
    let setup = Setup::new(0).await;
    let mut handovers = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let name = format!("static-{round}");
        let (old, new) = (static_pod(&format!("{name}-old"), &name), static_pod(&format!("{name}-new"), &name));
        *setup.probe.remaining.lock().unwrap() = 1;
        setup.probe.sent.lock().unwrap().insert(PodUid::of(&old), Instant::now());
        setup.workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, old.clone()));
        setup.probe.done.notified().await;
        setup.workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, new.clone()));
        tokio::time::sleep(Duration::from_millis(5)).await;
        *setup.probe.remaining.lock().unwrap() = 1;
        setup.probe.sent.lock().unwrap().insert(PodUid::of(&new), Instant::now());
        setup.workers.update_pod(UpdatePodOptions::new(SyncPodType::Kill, old));
        tokio::time::timeout(Duration::from_secs(30), setup.probe.done.notified()).await.unwrap();
        handovers.extend(setup.probe.latencies.lock().unwrap().pop());
        setup.probe.latencies.lock().unwrap().clear();
    }
    handovers.sort();
    handovers
}

fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    statm.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 4096
}

fn dispatch(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut group = c.benchmark_group("podworkers_dispatch");
    group.sample_size(10).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    for n in [10usize, 1_000, 10_000] {
        let mut setup = rt.block_on(Setup::new(n));
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        total += setup.round(SyncPodType::Update).await;
                    }
                    total
                })
            });
        });
        setup.report("burst", n);
        rt.block_on(setup.paced(2_000));
        setup.report("paced", n);
    }
    group.finish();

    let handover = rt.block_on(static_handover(50));
    println!(
        "podworkers static pod handover: kill of the old pod to the edited pod's first sync p50 {:?} max {:?} over {} edits",
        handover[handover.len() / 2],
        handover.last().unwrap(),
        handover.len()
    );

    let before = resident_bytes();
    let idle = rt.block_on(Setup::new(10_000));
    let after = resident_bytes();
    println!(
        "podworkers: resident memory per idle worker {} bytes (10,000 workers)",
        (after.saturating_sub(before)) / 10_000
    );
    drop(idle);
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
