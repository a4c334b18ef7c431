//! Allocations of one relist with the fake runtime at 100, 1,000 and 10,000 containers, when
//! nothing changed and when 1% changed, next to the fake runtime's listing alone.
//! A separate benchmark because the counting allocator slows every allocation down.

// Reason: a benchmark may panic on broken setup.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;

use kubelet_core::{Cache, Runtime, fake::FakeRuntime, runtime::ContainerState};
use kubelet_pleg::{Config, GenericPleg};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn main() {
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for containers in [100usize, 1_000, 10_000] {
        let runtime = Arc::new(FakeRuntime::new());
        runtime.populate(containers / 10, 10);
        let (pleg, mut events) = GenericPleg::new(runtime.clone(), Arc::new(Cache::new()), Config::default());
        tokio.spawn(async move { while events.recv().await.is_some() {} });
        tokio.block_on(pleg.relist());
        let ids: Vec<String> = tokio
            .block_on(runtime.get_pods(true))
            .unwrap()
            .into_iter()
            .flat_map(|p| p.containers)
            .map(|c| c.id)
            .collect();
        let _profiler = dhat::Profiler::builder().testing().build();
        let per_round = |work: &mut dyn FnMut()| {
            let before = dhat::HeapStats::get().total_blocks;
            for _ in 0..10 {
                work();
            }
            (dhat::HeapStats::get().total_blocks - before) / 10
        };
        let listing = per_round(&mut || drop(tokio.block_on(runtime.get_pods(true))));
        let unchanged = per_round(&mut || tokio.block_on(pleg.relist()));
        let mut round = 0u32;
        let changed = per_round(&mut || {
            let state = if round.is_multiple_of(2) { ContainerState::Exited } else { ContainerState::Running };
            round += 1;
            for id in ids.iter().take(containers / 100) {
                runtime.set_container_state(id, state).unwrap();
            }
            tokio.block_on(pleg.relist());
        });
        println!(
            "pleg relist of {containers} containers: {unchanged} allocations unchanged ({} beyond the listing's {listing}), {changed} with 1% changed",
            unchanged.saturating_sub(listing)
        );
    }
}
