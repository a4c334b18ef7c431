//! The start-up's breakdown: where the agent's time goes beside the floor's three calls, from
//! the agent's own upstream metrics read before and after each start-up run.
//!
//! - RunPodSandbox, CreateContainer and StartContainer: the mean time of each call as the agent
//!   made it (`kubelet_runtime_operations_duration_seconds`), against the floor's mean for the
//!   same call with as many pods at once;
//! - every other CRI call the start made (image and sandbox status, relists, container status):
//!   how many per pod, and their time per pod;
//! - a pod's first update until its worker's first sync
//!   (`kubelet_pod_worker_start_duration_seconds`), the mean;
//! - the relists during the start-up, and their mean time (`kubelet_pleg_relist_duration_seconds`);
//! - the CPU time per pod of the agent and of containerd during the start-up, containerd's
//!   against its CPU time per pod during the floor's start-up with as many pods at once: the
//!   share of the machine's two cores the agent's work takes from the runtime's.
//!
//! The rows are reported, not held to the baseline: the start-up figure holds their sum.

use std::collections::BTreeMap;

use anyhow::Result;

use super::{Figure, Stat};
use crate::{
    harness::{self, Agent},
    runtime,
};

/// The floor's calls, by their `operation_type`, with the name the table gives them.
const CALLS: [(&str, &str); 3] = [
    ("run_podsandbox", "RunPodSandbox"),
    ("create_container", "CreateContainer"),
    ("start_container", "StartContainer"),
];

/// The agent's metrics at one moment.
#[derive(Debug)]
pub(super) struct Snapshot {
    /// CRI calls by `operation_type`: (seconds, count).
    operations: BTreeMap<String, (f64, f64)>,
    /// First update → first sync: (seconds, count).
    worker_start: (f64, f64),
    /// Relists: (seconds, count).
    relists: (f64, f64),
    /// The agent's CPU seconds.
    agent_cpu: f64,
    /// containerd's CPU seconds.
    runtime_cpu: f64,
}

pub(super) fn snapshot(agent: &Agent) -> Result<Snapshot> {
    let seconds = |ns: u64| ns as f64 / 1e9;
    Ok(Snapshot {
        operations: agent.metric_by_label("kubelet_runtime_operations_duration_seconds", "operation_type")?,
        worker_start: agent.metric_sum_count("kubelet_pod_worker_start_duration_seconds")?,
        relists: agent.metric_sum_count("kubelet_pleg_relist_duration_seconds")?,
        agent_cpu: seconds(agent.cpu_ns()),
        runtime_cpu: runtime::containerd_pid().map_or(f64::NAN, |pid| seconds(harness::cpu_ns_of(pid))),
    })
}

/// One start-up run's breakdown.
#[derive(Debug, Clone)]
pub(super) struct Breakdown {
    /// Mean seconds of each of [`CALLS`], by `operation_type`.
    calls: BTreeMap<&'static str, f64>,
    /// Other CRI calls per pod.
    other_calls: f64,
    /// Seconds in other CRI calls per pod.
    other_time: f64,
    /// Mean seconds from a pod's first update to its first sync.
    first_sync: f64,
    /// Relists during the start-up.
    relists: f64,
    /// Mean seconds of a relist (its list calls, and the statuses of the pods that changed).
    relist: f64,
    /// The agent's CPU seconds per pod.
    agent_cpu: f64,
    /// containerd's CPU seconds per pod.
    runtime_cpu: f64,
}

/// The breakdown of a run of `pods` pods between two snapshots.
pub(super) fn between(before: &Snapshot, after: &Snapshot, pods: usize) -> Breakdown {
    let delta = |operation: &str| {
        let (sum, count) = after.operations.get(operation).copied().unwrap_or_default();
        let (sum0, count0) = before.operations.get(operation).copied().unwrap_or_default();
        (sum - sum0, count - count0)
    };
    let mean = |(sum, count): (f64, f64)| if count > 0.0 { sum / count } else { f64::NAN };
    let calls = CALLS.iter().map(|(operation, _)| (*operation, mean(delta(operation)))).collect();
    let (mut other_time, mut other_calls) = (0.0, 0.0);
    for operation in after.operations.keys().filter(|o| !CALLS.iter().any(|(c, _)| c == o)) {
        let (sum, count) = delta(operation);
        other_time += sum;
        other_calls += count;
    }
    let pods = pods as f64;
    let worker_start = (after.worker_start.0 - before.worker_start.0, after.worker_start.1 - before.worker_start.1);
    let relists = (after.relists.0 - before.relists.0, after.relists.1 - before.relists.1);
    Breakdown {
        calls,
        other_calls: other_calls / pods,
        other_time: other_time / pods,
        first_sync: mean(worker_start),
        relists: relists.1,
        relist: mean(relists),
        agent_cpu: (after.agent_cpu - before.agent_cpu) / pods,
        runtime_cpu: (after.runtime_cpu - before.runtime_cpu) / pods,
    }
}

/// The rows of `pods` pods' start-up runs; `floor_calls` holds the floor's mean of each call per
/// run, by `operation_type`, and `floor_runtime_cpu` containerd's CPU seconds per pod in the
/// floor's start-up, each with as many pods at once.
pub(super) fn figures(
    pods: usize,
    runs: &[Breakdown],
    floor_calls: &BTreeMap<String, Vec<f64>>,
    floor_runtime_cpu: f64,
) -> Vec<Figure> {
    let prefix = format!("start-up, {pods} pods, breakdown:");
    let mut figures = Vec::new();
    for (operation, call) in CALLS {
        let samples: Vec<f64> = runs.iter().map(|run| run.calls.get(operation).copied().unwrap_or(f64::NAN)).collect();
        let mut figure = Figure::new(format!("{prefix} {call}, mean per call"), "s", &samples);
        if let Some(floor) = floor_calls.get(operation) {
            figure = figure.floor(Stat::of(floor).median);
        }
        figures.push(figure.unchecked());
    }
    let other_calls: Vec<f64> = runs.iter().map(|run| run.other_calls).collect();
    let other_time: Vec<f64> = runs.iter().map(|run| run.other_time).collect();
    let first_sync: Vec<f64> = runs.iter().map(|run| run.first_sync).collect();
    figures.push(Figure::new(format!("{prefix} other CRI calls per pod"), "", &other_calls).unchecked());
    figures.push(Figure::new(format!("{prefix} time in other CRI calls per pod"), "s", &other_time).unchecked());
    figures.push(
        Figure::new(format!("{prefix} first update → first sync of a pod's worker, mean"), "s", &first_sync)
            .unchecked(),
    );
    let relists: Vec<f64> = runs.iter().map(|run| run.relists).collect();
    let relist: Vec<f64> = runs.iter().map(|run| run.relist).collect();
    figures.push(Figure::new(format!("{prefix} relists"), "", &relists).unchecked());
    figures.push(Figure::new(format!("{prefix} relist, mean"), "s", &relist).unchecked());
    let agent_cpu: Vec<f64> = runs.iter().map(|run| run.agent_cpu).collect();
    let runtime_cpu: Vec<f64> = runs.iter().map(|run| run.runtime_cpu).collect();
    figures.push(Figure::new(format!("{prefix} agent CPU per pod"), "s", &agent_cpu).unchecked());
    figures.push(
        Figure::new(format!("{prefix} containerd CPU per pod"), "s", &runtime_cpu).floor(floor_runtime_cpu).unchecked(),
    );
    figures
}
