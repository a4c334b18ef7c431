//! Pod start-up latency (upstream `pod_startup_latency_tracker.go`).
//!
//! The runtime reports when it starts and finishes pulling a pod's images; the kubelet reports
//! when the pod first runs. From them [`StartupTracker`] records
//! `kubelet_pod_start_duration_seconds` (first seen to running) and
//! `kubelet_pod_start_sli_duration_seconds` (the same without the image pulling, from the first
//! pull's start to the last pull's end).

use std::{collections::HashMap, sync::Mutex, time::Duration};

use tokio::time::Instant;

use crate::{PodUid, util::lock};

#[derive(Debug, Default, Clone, Copy)]
struct Pulls {
    first_started: Option<Instant>,
    last_finished: Option<Instant>,
}

/// Image pulling per pod, until the pod first runs; shared by the runtime and the kubelet.
#[derive(Debug, Default)]
pub struct StartupTracker {
    pulls: Mutex<HashMap<PodUid, Pulls>>,
}

/// The two start-up durations of one pod.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct StartupDurations {
    /// From first seen to running.
    pub total: Duration,
    /// The same without the image pulling.
    pub without_pulling: Duration,
}

impl StartupTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        StartupTracker::default()
    }

    /// The runtime started pulling an image for `uid` at `at`.
    pub fn pulling_started(&self, uid: &PodUid, at: Instant) {
        let mut pulls = lock(&self.pulls);
        let entry = pulls.entry(uid.clone()).or_default();
        entry.first_started.get_or_insert(at);
    }

    /// The runtime finished pulling an image for `uid` at `at` (successfully or not).
    pub fn pulling_finished(&self, uid: &PodUid, at: Instant) {
        let mut pulls = lock(&self.pulls);
        let entry = pulls.entry(uid.clone()).or_default();
        entry.last_finished = Some(entry.last_finished.map_or(at, |last| last.max(at)));
    }

    /// The pod first ran, `since_first_seen` after the kubelet first saw it: records both
    /// metrics and forgets the pod's pulls; returns what it recorded.
    pub fn running(&self, uid: &PodUid, since_first_seen: Duration) -> StartupDurations {
        let pulls = lock(&self.pulls).remove(uid).unwrap_or_default();
        let pulling = match (pulls.first_started, pulls.last_finished) {
            (Some(start), Some(end)) => end.saturating_duration_since(start),
            _ => Duration::ZERO,
        };
        let durations =
            StartupDurations { total: since_first_seen, without_pulling: since_first_seen.saturating_sub(pulling) };
        metrics::histogram!("kubelet_pod_start_duration_seconds").record(durations.total.as_secs_f64());
        metrics::histogram!("kubelet_pod_start_sli_duration_seconds").record(durations.without_pulling.as_secs_f64());
        durations
    }

    /// Forgets a pod that went away before it ran.
    pub fn forget(&self, uid: &PodUid) {
        lock(&self.pulls).remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pulling_from_first_start_to_last_end_is_left_out() {
        let tracker = StartupTracker::new();
        let uid = PodUid::new("u");
        let t0 = Instant::now();
        tracker.pulling_started(&uid, t0 + Duration::from_secs(1));
        tracker.pulling_started(&uid, t0 + Duration::from_secs(2));
        tracker.pulling_finished(&uid, t0 + Duration::from_secs(4));
        tracker.pulling_finished(&uid, t0 + Duration::from_secs(3));
        let got = tracker.running(&uid, Duration::from_secs(10));
        assert_eq!(got, StartupDurations { total: Duration::from_secs(10), without_pulling: Duration::from_secs(7) });
        // Forgotten once recorded: a restart of the pod is not a second start-up.
        let again = tracker.running(&uid, Duration::from_secs(10));
        assert_eq!(again.without_pulling, Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn no_pulls_means_the_two_are_equal() {
        let tracker = StartupTracker::new();
        let uid = PodUid::new("u");
        tracker.pulling_started(&uid, Instant::now());
        tracker.forget(&uid);
        let got = tracker.running(&uid, Duration::from_millis(1500));
        let both = Duration::from_millis(1500);
        assert_eq!(got, StartupDurations { total: both, without_pulling: both });
    }
}
