//! Relist cost against the real containerd at 50 pods: one relist of unchanged pods, next to the
//! two list calls alone and the client's CPU time they take. Needs the runtime `cargo xtask
//! runtime start` provides (as root); `cargo xtask bench` passes its endpoint. Without it, it
//! says what it skipped.

// Reason: a benchmark may panic on broken setup, and measures real wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods, missing_docs)]

use std::{sync::Arc, time::Duration};

use cri_client::{Client, Config as CriConfig, CriRuntime, manager};
use k8s_openapi::api::core::v1::Pod;
use kubelet_core::{Backoff, Cache, PodUid, Runtime, events::RingRecorder, testing::RealRuntime};
use kubelet_pleg::{Config, GenericPleg};

fn main() {
    // Outside CI a missing runtime is a skip; a benchmark never fails CI.
    if std::env::var(kubelet_core::testing::ENV_ENDPOINT).is_err() {
        println!("SKIPPED pleg relist against containerd: no runtime (run `cargo xtask bench` as root)");
        return;
    }
    let Some(rt) = RealRuntime::from_env("relist_real") else { return };
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    tokio.block_on(async {
        let logs = rt.scratch_dir.join("bench");
        let client = Client::connect(&CriConfig::new(&rt.endpoint)).unwrap();
        let config = manager::Config::new("bench").pod_logs_dir(logs.join("pods")).container_logs_dir(logs.join("containers")).pods_dir(logs.join("kubelet-pods"));
        let runtime = Arc::new(CriRuntime::new(client, config, Arc::new(RingRecorder::default())));
        let pods: Vec<Pod> = (0..50)
            .map(|i| {
                let mut pod = rt.sleeping_pod(&format!("bench-{i}"), "kubelet-rs-bench");
                pod.metadata.uid = Some(format!("bench-{i}-{}", std::process::id()));
                pod
            })
            .collect();
        let started = std::time::Instant::now();
        for pod in &pods {
            let status = runtime.get_pod_status(&PodUid::of(pod), "", "").await.unwrap();
            runtime.sync_pod(pod, &status, &Backoff::default(), &kubelet_core::ProbeResults::new(), &Default::default()).await;
        }
        println!("pleg real: started 50 pods in {:?}", started.elapsed());
        let (pleg, mut events) = GenericPleg::new(runtime.clone(), Arc::new(Cache::new()), Config::default());
        tokio::spawn(async move { while events.recv().await.is_some() {} });
        pleg.relist().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        pleg.relist().await;
        // Enough rounds for the CPU clock's 10 ms ticks to resolve a round's share.
        let rounds = 1000u32;
        let start = std::time::Instant::now();
        let cpu_before = own_cpu();
        for _ in 0..rounds {
            runtime.get_pods(true).await.unwrap();
        }
        let lists = start.elapsed() / rounds;
        let lists_cpu = (own_cpu() - cpu_before) / rounds;
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            pleg.relist().await;
        }
        let relist = start.elapsed() / rounds;
        println!(
            "pleg real: relist of 50 unchanged pods (100 containers with sandboxes) {relist:?}; the two list calls alone {lists:?} (taking {lists_cpu:?} of this process's CPU: the calls and the decoding of their answers); PLEG's own share {:?}",
            relist.saturating_sub(lists)
        );
        for pod in &pods {
            runtime.remove_pod(pod).await.unwrap();
        }
    });
}

/// The CPU time this process has used, from `/proc/self/stat` (user and system, in clock ticks
/// of 10 ms: read over many rounds).
fn own_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}
