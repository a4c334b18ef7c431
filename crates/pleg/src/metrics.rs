//! PLEG metrics, with upstream kubelet names.

use std::time::Duration;

use kubelet_core::runtime::{ContainerState, Pod, SandboxState};

/// `kubelet_pleg_relist_duration_seconds`: how long a relist took.
pub(crate) fn relist_duration(took: Duration) {
    metrics::histogram!("kubelet_pleg_relist_duration_seconds").record(took.as_secs_f64());
}

/// `kubelet_pleg_relist_interval_seconds`: time between the starts of two relists.
pub(crate) fn relist_interval(interval: Duration) {
    metrics::histogram!("kubelet_pleg_relist_interval_seconds").record(interval.as_secs_f64());
}

/// `kubelet_pleg_last_seen_seconds`: Unix time of the last relist.
pub(crate) fn last_seen(unix_seconds: f64) {
    metrics::gauge!("kubelet_pleg_last_seen_seconds").set(unix_seconds);
}

/// `kubelet_pleg_discard_events`: events merged into another waiting event of the same pod because
/// the channel was full (the pod still gets its sync).
pub(crate) fn discarded() {
    metrics::counter!("kubelet_pleg_discard_events").increment(1);
}

/// `kubelet_running_pods` and `kubelet_running_containers{container_state}`, from a listing.
pub(crate) fn running(pods: &[Pod]) {
    let running_pods = pods.iter().filter(|p| p.sandboxes.iter().any(|s| s.state == SandboxState::Ready)).count();
    let mut by_state = [0usize; 4];
    for c in pods.iter().flat_map(|p| &p.containers) {
        by_state[match c.state {
            ContainerState::Created => 0,
            ContainerState::Running => 1,
            ContainerState::Exited => 2,
            ContainerState::Unknown => 3,
        }] += 1;
    }
    #[allow(clippy::cast_precision_loss)] // Reason: counts are far below 2^52.
    {
        metrics::gauge!("kubelet_running_pods").set(running_pods as f64);
        for (state, count) in ["created", "running", "exited", "unknown"].into_iter().zip(by_state) {
            metrics::gauge!("kubelet_running_containers", "container_state" => state).set(count as f64);
        }
    }
}
