//! What a cgroup is set to (upstream's `ResourceConfig` and `ResourceConfigForPod`, in
//! `pkg/kubelet/cm/helpers_linux.go`): pure functions of a pod spec or the node's allocatable.

use k8s_openapi::api::core::v1::Pod;
use kubelet_core::resources::{pod_limits, pod_requests, qos_class};

/// The fewest CPU shares a cgroup gets (a BestEffort pod's).
pub const MIN_SHARES: u64 = 2;
/// The most CPU shares a cgroup may get.
pub const MAX_SHARES: u64 = 262_144;
/// CPU shares per core.
const SHARES_PER_CPU: i64 = 1024;
/// The smallest CFS quota, in microseconds.
const MIN_QUOTA_PERIOD: i64 = 1000;
/// The CFS period upstream uses (`cpuCFSQuotaPeriod`, 100ms), in microseconds.
pub const DEFAULT_CPU_PERIOD: u64 = 100_000;

/// The values written to one cgroup; `None` leaves a value as the kernel has it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResourceConfig {
    /// `cpu.shares` (v1), turned into `cpu.weight` on v2.
    pub cpu_shares: Option<u64>,
    /// The CFS quota in microseconds per period (`cpu.cfs_quota_us`; `cpu.max` on v2).
    pub cpu_quota: Option<i64>,
    /// The CFS period in microseconds.
    pub cpu_period: Option<u64>,
    /// The memory limit in bytes (`memory.limit_in_bytes`; `memory.max` on v2).
    pub memory_limit: Option<i64>,
    /// The most processes (`pids.max`).
    pub pids_limit: Option<i64>,
    /// Huge page limits in bytes by runc's size name (`hugetlb.2MB.limit_in_bytes`;
    /// `hugetlb.2MB.max` on v2), written where the hugetlb controller is.
    pub hugepage_limits: Vec<(String, u64)>,
}

/// CPU shares for `milli` millicores: 2 for none, at most [`MAX_SHARES`].
pub fn milli_cpu_to_shares(milli: i64) -> u64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    let shares = u64::try_from(milli * SHARES_PER_CPU / 1000).unwrap_or(MIN_SHARES);
    shares.clamp(MIN_SHARES, MAX_SHARES)
}

/// The CFS quota (µs per `period` µs) for `milli` millicores: 0 (no quota) for none, at least
/// 1 ms otherwise.
pub fn milli_cpu_to_quota(milli: i64, period: u64) -> i64 {
    if milli <= 0 {
        return 0;
    }
    let period = i64::try_from(period).unwrap_or(i64::MAX);
    (milli.saturating_mul(period) / 1000).max(MIN_QUOTA_PERIOD)
}

/// cgroup v2's `cpu.weight` for v1 CPU shares (runc's conversion, as upstream uses).
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    1 + (shares.saturating_sub(2) * 9999) / 262_142
}

impl ResourceConfig {
    /// A pod cgroup's values (upstream's `ResourceConfigForPod`), by QoS class:
    /// - Guaranteed: shares from its requests, a quota and a memory limit from its limits;
    /// - Burstable: shares from its requests; a quota only when every container limits CPU,
    ///   and a memory limit only when every container limits memory;
    /// - BestEffort: 2 shares.
    ///
    /// Without `cfs_quota` (`cpuCFSQuota: false`) the quota is -1, unlimited. The PID limit is
    /// `podPidsLimit` when positive.
    pub fn for_pod(pod: &Pod, cfs_quota: bool, period: u64, pids_limit: Option<i64>) -> ResourceConfig {
        let (cpu_requests, _) = pod_requests(pod);
        let limits = pod_limits(pod);
        let shares = milli_cpu_to_shares(cpu_requests);
        let quota = if cfs_quota { milli_cpu_to_quota(limits.cpu_milli.unwrap_or(0), period) } else { -1 };
        let memory = limits.memory_bytes.unwrap_or(0);
        let pids_limit = pids_limit.filter(|p| *p > 0);
        let base = ResourceConfig { pids_limit, ..ResourceConfig::default() };
        match qos_class(pod) {
            "Guaranteed" => ResourceConfig {
                cpu_shares: Some(shares),
                cpu_quota: Some(quota),
                cpu_period: Some(period),
                memory_limit: Some(memory),
                ..base
            },
            "Burstable" => ResourceConfig {
                cpu_shares: Some(shares),
                cpu_quota: limits.cpu_declared.then_some(quota),
                cpu_period: limits.cpu_declared.then_some(period),
                memory_limit: limits.memory_declared.then_some(memory),
                ..base
            },
            _ => ResourceConfig { cpu_shares: Some(MIN_SHARES), ..base },
        }
    }

    /// The `kubepods` cgroup's values for the node's allocatable (or, when node allocatable is
    /// not enforced on pods, its capacity): shares for the CPU, a limit for the memory.
    pub fn for_node(cpu_milli: i64, memory_bytes: i64) -> ResourceConfig {
        ResourceConfig {
            cpu_shares: Some(milli_cpu_to_shares(cpu_milli)),
            memory_limit: (memory_bytes > 0).then_some(memory_bytes),
            ..ResourceConfig::default()
        }
    }

    /// The values of a daemons' cgroup for its reservation (upstream's `getCgroupConfig`): shares
    /// for the CPU and a limit for the memory, each only when reserved.
    pub fn for_reservation(cpu_milli: Option<i64>, memory_bytes: Option<i64>) -> ResourceConfig {
        ResourceConfig {
            cpu_shares: cpu_milli.map(milli_cpu_to_shares),
            memory_limit: memory_bytes,
            ..ResourceConfig::default()
        }
    }

    /// The Burstable class's values: shares for the sum of its pods' CPU requests.
    pub fn for_burstable(cpu_requests_milli: i64) -> ResourceConfig {
        ResourceConfig { cpu_shares: Some(milli_cpu_to_shares(cpu_requests_milli)), ..ResourceConfig::default() }
    }

    /// The BestEffort class's values: the fewest shares.
    pub fn for_best_effort() -> ResourceConfig {
        ResourceConfig { cpu_shares: Some(MIN_SHARES), ..ResourceConfig::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: &[(&str, &str, &str)]) -> Pod {
        crate::test_pods::pod("u1", containers)
    }

    #[test]
    fn conversions_as_upstreams() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(1_000_000), MAX_SHARES);
        assert_eq!(milli_cpu_to_quota(0, 100_000), 0);
        assert_eq!(milli_cpu_to_quota(5, 100_000), 1000, "at least 1 ms");
        assert_eq!(milli_cpu_to_quota(250, 100_000), 25_000);
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(MAX_SHARES), 10_000);
    }

    #[test]
    fn each_qos_class_gets_upstreams_values() {
        let guaranteed = pod(&[("a", "cpu=500m,memory=64Mi", "cpu=500m,memory=64Mi")]);
        assert_eq!(
            ResourceConfig::for_pod(&guaranteed, true, DEFAULT_CPU_PERIOD, Some(100)),
            ResourceConfig {
                cpu_shares: Some(512),
                cpu_quota: Some(50_000),
                cpu_period: Some(100_000),
                memory_limit: Some(64 << 20),
                pids_limit: Some(100),
                hugepage_limits: Vec::new(),
            }
        );
        // Burstable, every container with a CPU limit but not a memory one.
        let burstable = pod(&[("a", "cpu=100m", "cpu=200m"), ("b", "cpu=100m,memory=10Mi", "cpu=300m")]);
        let config = ResourceConfig::for_pod(&burstable, true, DEFAULT_CPU_PERIOD, None);
        assert_eq!(config.cpu_shares, Some(204));
        assert_eq!((config.cpu_quota, config.cpu_period), (Some(50_000), Some(100_000)));
        assert_eq!(config.memory_limit, None, "not every container limits memory");
        // Burstable with one container unlimited: no quota either.
        let open = pod(&[("a", "cpu=100m", "cpu=200m"), ("b", "cpu=100m", "")]);
        let config = ResourceConfig::for_pod(&open, true, DEFAULT_CPU_PERIOD, None);
        assert_eq!((config.cpu_quota, config.memory_limit), (None, None));
        let best_effort = pod(&[("a", "", "")]);
        assert_eq!(
            ResourceConfig::for_pod(&best_effort, true, DEFAULT_CPU_PERIOD, Some(-1)),
            ResourceConfig { cpu_shares: Some(2), ..ResourceConfig::default() }
        );
        // cpuCFSQuota: false leaves the quota unlimited.
        assert_eq!(ResourceConfig::for_pod(&guaranteed, false, DEFAULT_CPU_PERIOD, None).cpu_quota, Some(-1));
    }
}
