//! Upstream's histogram layouts (`pkg/kubelet/metrics/metrics.go`), for whichever exporter an
//! agent installs.
//!
//! The crates record histograms through the `metrics` facade, which carries no buckets.
//! Exporters that are given no buckets fall back to summaries, which dashboards built on
//! upstream's `_bucket` series cannot read, and whose sketches grow with the range of values
//! seen; an agent passes these layouts to its exporter instead.
//!
//! ```
//! for (name, buckets) in kubelet_core::metrics::HISTOGRAMS {
//!     assert!(["kubelet_", "prober_", "rest_client_"].iter().any(|prefix| name.starts_with(prefix)));
//!     assert!(buckets.windows(2).all(|w| w[0] < w[1]));
//! }
//! ```

/// Prometheus' default buckets (`prometheus.DefBuckets`), used by every kubelet histogram that
/// names no other layout.
pub const DEFAULT_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Upstream's `podStartupDurationBuckets`, in seconds.
pub const POD_STARTUP_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0,
    600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// `ExponentialBuckets(0.005, 2.5, 14)`: the runtime operation durations, 5 ms to about 12 min.
pub const RUNTIME_OPERATION_BUCKETS: [f64; 14] = exponential(0.005, 2.5);

/// client-go's buckets of its request and rate limiter latencies
/// (component-base `metrics/prometheus/restclient`), in seconds.
pub const REST_CLIENT_LATENCY_BUCKETS: [f64; 12] = [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0];

/// client-go's buckets of its request and response sizes: 64 bytes to 16 MiB.
pub const REST_CLIENT_SIZE_BUCKETS: [f64; 11] =
    [64.0, 256.0, 512.0, 1024.0, 4096.0, 16384.0, 65536.0, 262_144.0, 1_048_576.0, 4_194_304.0, 16_777_216.0];

/// Every histogram the crates record, with its upstream bucket layout.
pub const HISTOGRAMS: [(&str, &[f64]); 12] = [
    ("kubelet_pod_worker_duration_seconds", &DEFAULT_BUCKETS),
    ("kubelet_pod_worker_start_duration_seconds", &DEFAULT_BUCKETS),
    ("kubelet_pod_start_duration_seconds", &POD_STARTUP_BUCKETS),
    ("kubelet_pod_start_sli_duration_seconds", &POD_STARTUP_BUCKETS),
    ("kubelet_pleg_relist_duration_seconds", &DEFAULT_BUCKETS),
    ("kubelet_pleg_relist_interval_seconds", &DEFAULT_BUCKETS),
    ("kubelet_runtime_operations_duration_seconds", &RUNTIME_OPERATION_BUCKETS),
    ("prober_probe_duration_seconds", &DEFAULT_BUCKETS),
    ("rest_client_request_duration_seconds", &REST_CLIENT_LATENCY_BUCKETS),
    ("rest_client_rate_limiter_duration_seconds", &REST_CLIENT_LATENCY_BUCKETS),
    ("rest_client_request_size_bytes", &REST_CLIENT_SIZE_BUCKETS),
    ("rest_client_response_size_bytes", &REST_CLIENT_SIZE_BUCKETS),
];

/// `N` buckets starting at `start`, each `factor` times the previous one.
const fn exponential<const N: usize>(start: f64, factor: f64) -> [f64; N] {
    let mut buckets = [start; N];
    let mut i = 1;
    while i < N {
        buckets[i] = buckets[i - 1] * factor;
        i += 1;
    }
    buckets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_operation_buckets_are_upstreams() {
        assert_eq!(RUNTIME_OPERATION_BUCKETS[0], 0.005);
        assert_eq!(RUNTIME_OPERATION_BUCKETS[1], 0.0125);
        assert_eq!(RUNTIME_OPERATION_BUCKETS[2], 0.03125);
        assert!((RUNTIME_OPERATION_BUCKETS[13] - 745.058_059_692_382_8).abs() < 1e-9);
    }
}
