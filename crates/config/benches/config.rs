//! Config benchmark: decode + default + validate and merge cost for 1,000 static pod manifests.
//!
//! Run with `cargo bench -p kubelet-config` (or `cargo xtask bench`); criterion prints the time per
//! 1,000 pods, and this prints the cost per pod.

// Reason: a benchmark may panic on broken setup.
// Reason: a benchmark measures real wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods, missing_docs)]

use std::{sync::Arc, time::Duration};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kubelet_config::{
    Merger,
    manifest::{Origin, static_pods},
};
use kubelet_core::{
    Operation, Source,
    events::RingRecorder,
    k8s_openapi::{api::core::v1::Pod, jiff::Timestamp},
};

fn manifest(i: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web-{i}\n  labels:\n    app: web\nspec:\n  containers:\n  - name: httpd\n    image: 127.0.0.1:5000/kubelet-rs/busybox:1.35\n    command: [httpd, -f, -p, \"80\"]\n    ports:\n    - containerPort: 80\n      name: http\n    readinessProbe:\n      httpGet:\n        port: 80\n    resources:\n      limits: {{cpu: 100m, memory: 32Mi}}\n  - name: sidecar\n    image: 127.0.0.1:5000/kubelet-rs/busybox:1.35\n    command: [sleep, \"3600\"]\n"
    )
}

fn bench(c: &mut Criterion) {
    let manifests: Vec<(Origin, String)> = (0..1000)
        .map(|i| (Origin::File(format!("/etc/kubernetes/manifests/web-{i}.yaml").into()), manifest(i)))
        .collect();
    let decode_all = || {
        manifests
            .iter()
            .flat_map(|(origin, text)| static_pods(text.as_bytes(), origin, "node-1", false).unwrap())
            .collect::<Vec<_>>()
    };
    let mut group = c.benchmark_group("config_1000_manifests");
    group.sample_size(10).measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(1000));
    group.bench_function("decode_default_validate", |b| b.iter(decode_all));
    let pods = decode_all();
    let now = Timestamp::from_second(1_700_000_000).unwrap();
    group.bench_function("merge_first_snapshot", |b| {
        b.iter(|| Merger::new(Arc::new(RingRecorder::default())).merge(Source::File, Operation::Set, pods.clone(), now))
    });
    let mut merger = Merger::new(Arc::new(RingRecorder::default()));
    merger.merge(Source::File, Operation::Set, pods.clone(), now);
    group.bench_function("merge_unchanged_snapshot", |b| {
        b.iter(|| merger.merge(Source::File, Operation::Set, pods.clone(), now))
    });
    // As the API pod source gives its pods: shared, the same `Arc` while a pod is unchanged.
    let shared: Vec<Arc<Pod>> = pods.iter().cloned().map(Arc::new).collect();
    let mut merger = Merger::new(Arc::new(RingRecorder::default()));
    merger.merge(Source::Api, Operation::Set, shared.clone(), now);
    group.bench_function("merge_unchanged_shared_snapshot", |b| {
        b.iter(|| merger.merge(Source::Api, Operation::Set, shared.clone(), now))
    });
    group.bench_function("decode_default_validate_merge", |b| {
        b.iter(|| Merger::new(Arc::new(RingRecorder::default())).merge(Source::File, Operation::Set, decode_all(), now))
    });
    group.finish();

    // A plain figure per pod, from one timed run of the whole path.
    let start = std::time::Instant::now();
    let runs = 5;
    for _ in 0..runs {
        Merger::new(Arc::new(RingRecorder::default())).merge(Source::File, Operation::Set, decode_all(), now);
    }
    println!(
        "config: decode+default+validate+merge costs {:?} per pod (1,000 manifests)",
        start.elapsed() / (runs * 1000)
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
