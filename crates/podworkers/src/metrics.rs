//! Pod worker metrics, with upstream kubelet names.

use std::time::Duration;

/// `kubelet_pod_worker_duration_seconds{operation_type}`: time from an update to the end of its sync.
pub(crate) fn observe_worker_duration(operation: &'static str, took: Duration) {
    metrics::histogram!("kubelet_pod_worker_duration_seconds", "operation_type" => operation)
        .record(took.as_secs_f64());
}

/// `kubelet_pod_worker_start_duration_seconds`: time from a pod's first update to its first sync.
pub(crate) fn observe_start_duration(took: Duration) {
    metrics::histogram!("kubelet_pod_worker_start_duration_seconds").record(took.as_secs_f64());
}

/// `kubelet_working_pods{lifecycle, config, static}`: workers by state, set by housekeeping.
pub(crate) fn set_working_pods(lifecycle: &'static str, config: &'static str, is_static: bool, count: usize) {
    let is_static = if is_static { "true" } else { "false" };
    #[allow(clippy::cast_precision_loss)] // Reason: pod counts are far below 2^52.
    metrics::gauge!("kubelet_working_pods", "lifecycle" => lifecycle, "config" => config, "static" => is_static)
        .set(count as f64);
}
