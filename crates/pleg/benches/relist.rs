//! Relist benchmark with the fake runtime: wall time of one relist at 100, 1,000 and 10,000
//! containers, when nothing changed and when 1% changed (next to the fake runtime's listing
//! alone, which a relist includes); and how long a container transition takes to reach the event
//! channel with the 1 s period alone and with `relist_now`.
//! `benches/relist_allocations.rs` counts allocations.
//!
//! Run with `cargo bench -p kubelet-pleg` (or `cargo xtask bench`); it prints its figures.

// Reason: a benchmark may panic on broken setup, and measures real wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods, missing_docs)]

use std::{sync::Arc, time::Duration};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kubelet_core::{
    Cache, Pleg, Runtime, fake::FakeRuntime, runtime::ContainerState, tokio_util::sync::CancellationToken,
};
use kubelet_pleg::{Config, GenericPleg};
use tokio::runtime::Runtime as Tokio;

struct Setup {
    runtime: Arc<FakeRuntime>,
    pleg: Arc<GenericPleg<FakeRuntime>>,
    ids: Vec<String>,
    round: usize,
}

fn setup(tokio: &Tokio, containers: usize) -> Setup {
    let runtime = Arc::new(FakeRuntime::new());
    runtime.populate(containers / 10, 10);
    let (pleg, mut events) = GenericPleg::new(runtime.clone(), Arc::new(Cache::new()), Config::default());
    let pleg = Arc::new(pleg);
    tokio.spawn(async move { while events.recv().await.is_some() {} });
    tokio.block_on(pleg.relist());
    let ids =
        tokio.block_on(runtime.get_pods(true)).unwrap().into_iter().flat_map(|p| p.containers).map(|c| c.id).collect();
    Setup { runtime, pleg, ids, round: 0 }
}

impl Setup {
    /// Flips 1% of the containers between running and exited.
    fn change_one_percent(&mut self) {
        let n = (self.ids.len() / 100).max(1);
        let state = if self.round.is_multiple_of(2) { ContainerState::Exited } else { ContainerState::Running };
        for id in self.ids.iter().take(n) {
            self.runtime.set_container_state(id, state).unwrap();
        }
        self.round += 1;
    }
}

fn relist(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut group = c.benchmark_group("pleg_relist");
    group.sample_size(20).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    for containers in [100usize, 1_000, 10_000] {
        let mut s = setup(&tokio, containers);
        group.bench_with_input(BenchmarkId::new("fake_runtime_list_only", containers), &containers, |b, _| {
            b.iter(|| tokio.block_on(s.runtime.get_pods(true)).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("unchanged", containers), &containers, |b, _| {
            b.iter(|| tokio.block_on(s.pleg.relist()))
        });
        group.bench_with_input(BenchmarkId::new("one_percent_changed", containers), &containers, |b, _| {
            b.iter(|| {
                s.change_one_percent();
                tokio.block_on(s.pleg.relist());
            });
        });
    }
    group.finish();
}

/// How long from a container's exit to its ContainerDied event, with and without `relist_now`.
fn transition_latency(_: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for adaptive in [false, true] {
        let latencies = tokio.block_on(async {
            let runtime = Arc::new(FakeRuntime::new());
            runtime.populate(50, 2);
            let (pleg, mut events) = GenericPleg::new(runtime.clone(), Arc::new(Cache::new()), Config::default());
            let pleg = Arc::new(pleg);
            let cancel = CancellationToken::new();
            tokio::spawn({
                let (pleg, cancel) = (pleg.clone(), cancel.clone());
                async move { pleg.run(cancel).await }
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            while events.try_recv().is_ok() {}
            let ids: Vec<String> =
                runtime.get_pods(true).await.unwrap().into_iter().flat_map(|p| p.containers).map(|c| c.id).collect();
            let mut latencies = Vec::new();
            for (i, id) in ids.iter().take(20).enumerate() {
                // Transitions land at arbitrary points of the relist period.
                tokio::time::sleep(Duration::from_millis(137 * (i as u64 % 7))).await;
                runtime.set_container_state(id, ContainerState::Exited).unwrap();
                let start = std::time::Instant::now();
                if adaptive {
                    // The kubelet changed the runtime itself, so it asks for a relist.
                    pleg.relist_now();
                }
                while let Some(event) = events.recv().await {
                    if event.container_id.as_deref() == Some(id.as_str()) {
                        break;
                    }
                }
                latencies.push(start.elapsed());
            }
            cancel.cancel();
            latencies
        });
        let mut sorted = latencies.clone();
        sorted.sort();
        let mean = latencies.iter().sum::<Duration>() / latencies.len() as u32;
        println!(
            "pleg transition-to-event latency ({}): mean {:?}, max {:?}",
            if adaptive { "relist_now after a change" } else { "1 s period only" },
            mean,
            sorted.last().unwrap()
        );
    }
}

criterion_group!(benches, relist, transition_latency);
criterion_main!(benches);
