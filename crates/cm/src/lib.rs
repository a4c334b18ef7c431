//! Pods' cgroups as upstream's kubelet manages them (`pkg/kubelet/cm`: the node, QoS and pod
//! container managers), on the cgroupfs driver, cgroup v1 and v2.
//!
//! [`CgroupManager::new`] makes the `kubepods` hierarchy and limits `kubepods` to the node's
//! allocatable; as a [`PodCgroups`] it makes each pod's cgroup before its sandbox starts, with
//! the values [`ResourceConfig::for_pod`] computes, and keeps the Burstable class's CPU shares
//! at the sum of its pods' requests. The runtime then creates each container's cgroup below
//! the pod's, and the pod's cgroup goes with the pod's other leftovers.
//!
//! # Example
//!
//! ```no_run
//! use kubelet_cm::{CgroupManager, Config};
//! use kubelet_core::cgroups::PodCgroups;
//!
//! # fn example(pod: &k8s_openapi::api::core::v1::Pod) -> Result<(), kubelet_core::cgroups::PodCgroupError> {
//! let manager = CgroupManager::new(Config::new("/sys/fs/cgroup", "/kubepods"))?;
//! manager.ensure(pod)?;
//! # Ok(())
//! # }
//! ```

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    sync::{Mutex, MutexGuard, PoisonError},
};

use k8s_openapi::api::core::v1::Pod;
use kubelet_core::{
    cgroups::{PodCgroupError, PodCgroups, pod_cgroup_name},
    resources::{hugepage_limits, hugepage_unit_size, pod_hugepage_requests, pod_requests, qos_class},
    types::PodUid,
};
use tracing::{debug, warn};

pub mod cgroupfs;
pub mod resource_config;
#[cfg(test)]
mod test_pods;

#[doc(inline)]
pub use crate::{
    cgroupfs::{Cgroupfs, Version},
    resource_config::ResourceConfig,
};

/// Where the pods' cgroups go and what they get.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// Where the cgroup hierarchies are mounted (`/sys/fs/cgroup`).
    pub mount: PathBuf,
    /// The cgroup of all pods: `<cgroupRoot>/kubepods`.
    pub pods_cgroup: String,
    /// What `kubepods` is limited to: the node's allocatable CPU (millicores) and memory
    /// (bytes) with `enforceNodeAllocatable: [pods]`, or its capacity; `None` leaves it as is.
    pub node: Option<(i64, i64)>,
    /// `cpuCFSQuota` (true): CPU limits become CFS quotas.
    pub cfs_quota: bool,
    /// `cpuCFSQuotaPeriod` in microseconds (100 ms).
    pub cpu_period: u64,
    /// `podPidsLimit`: the most processes in one pod (none: no limit).
    pub pod_pids_limit: Option<i64>,
    /// The node's huge pages: bytes by page size in bytes. `kubepods` is limited to them, and
    /// each pod to what it requests of each size (zero of a size it does not ask for).
    pub hugepages: BTreeMap<u64, u64>,
}

/// An existing cgroup limited to a reservation (`enforceNodeAllocatable` with `system-reserved`
/// or `kube-reserved`): `systemReservedCgroup` to `systemReserved`, or `kubeReservedCgroup` to
/// `kubeReserved`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReservedCgroup {
    /// Whose reservation it holds: `System Reserved`, `Kube Reserved`.
    pub whose: &'static str,
    /// The cgroup (`/system.slice`).
    pub cgroup: String,
    /// Its values: shares for the reserved CPU, a limit for the reserved memory.
    pub config: ResourceConfig,
}

impl ReservedCgroup {
    /// `cgroup`, holding `whose` reservation of `cpu_milli` millicores and `memory_bytes`.
    pub fn new(
        whose: &'static str,
        cgroup: impl Into<String>,
        cpu_milli: Option<i64>,
        memory_bytes: Option<i64>,
    ) -> Self {
        ReservedCgroup {
            whose,
            cgroup: cgroup.into(),
            config: ResourceConfig::for_reservation(cpu_milli, memory_bytes),
        }
    }

    /// Writes the reservation into the cgroup below `mount`, which must exist (upstream's
    /// `enforceExistingCgroup`).
    pub fn enforce(&self, mount: impl Into<PathBuf>) -> Result<(), ReservedCgroupError> {
        let fs = Cgroupfs::detect(mount);
        fs.update_existing(&self.cgroup, &self.config).map_err(|source| ReservedCgroupError {
            whose: self.whose,
            cgroup: self.cgroup.clone(),
            source,
        })?;
        debug!(cgroup = %self.cgroup, config = ?self.config, "{} cgroup limited", self.whose);
        Ok(())
    }
}

/// Why a reserved cgroup could not be limited (upstream's `FailedNodeAllocatableEnforcement`).
#[derive(Debug, thiserror::Error)]
#[error("Failed to enforce {whose} Cgroup Limits on {cgroup:?}")]
#[non_exhaustive]
pub struct ReservedCgroupError {
    /// Whose reservation: `System Reserved`, `Kube Reserved`.
    pub whose: &'static str,
    /// The cgroup.
    pub cgroup: String,
    /// Why.
    #[source]
    pub source: PodCgroupError,
}

impl Config {
    /// Pods' cgroups below `pods_cgroup` (`/kubepods`) in the hierarchies at `mount`, with
    /// upstream's defaults and `kubepods` left as it is.
    pub fn new(mount: impl Into<PathBuf>, pods_cgroup: impl Into<String>) -> Self {
        Config {
            mount: mount.into(),
            pods_cgroup: pods_cgroup.into(),
            node: None,
            cfs_quota: true,
            cpu_period: resource_config::DEFAULT_CPU_PERIOD,
            pod_pids_limit: None,
            hugepages: BTreeMap::new(),
        }
    }

    /// Limits `kubepods` to `cpu_milli` millicores' shares and `memory_bytes`.
    #[must_use]
    pub fn node(mut self, cpu_milli: i64, memory_bytes: i64) -> Self {
        self.node = Some((cpu_milli, memory_bytes));
        self
    }

    /// Sets the node's huge pages (bytes by page size in bytes).
    #[must_use]
    pub fn hugepages(mut self, hugepages: BTreeMap<u64, u64>) -> Self {
        self.hugepages = hugepages;
        self
    }

    /// The sizes of the node's huge pages, in bytes.
    fn hugepage_sizes(&self) -> Vec<u64> {
        self.hugepages.keys().copied().collect()
    }

    /// Sets `podPidsLimit` (a value below 1 is no limit).
    #[must_use]
    pub fn pod_pids_limit(mut self, limit: Option<i64>) -> Self {
        self.pod_pids_limit = limit.filter(|l| *l > 0);
        self
    }
}

/// The pods' cgroups on one cgroup mount.
#[derive(Debug)]
pub struct CgroupManager {
    fs: Cgroupfs,
    config: Config,
    state: Mutex<State>,
}

/// What the manager remembers of the pods it has set up.
#[derive(Debug, Default)]
struct State {
    /// Pods whose cgroup was made and set by this process.
    ensured: HashSet<PodUid>,
    /// The CPU requests (millicores) of the Burstable pods.
    burstable: HashMap<PodUid, i64>,
    /// The Burstable class's CPU requests as last written.
    burstable_written: Option<i64>,
}

impl CgroupManager {
    /// Makes the `kubepods`, `kubepods/burstable` and `kubepods/besteffort` cgroups (a restart
    /// finds and keeps them), limits `kubepods` as configured, and gives BestEffort 2 shares
    /// and Burstable 2 until its pods are ensured again.
    pub fn new(config: Config) -> Result<Self, PodCgroupError> {
        let fs = Cgroupfs::detect(&config.mount);
        let pods = config.pods_cgroup.trim_end_matches('/').to_owned();
        let mut node =
            config.node.map_or_else(ResourceConfig::default, |(cpu, memory)| ResourceConfig::for_node(cpu, memory));
        // `kubepods` holds the node's huge pages, all of them.
        let unit_sizes = config.hugepages.iter().filter_map(|(size, bytes)| Some((hugepage_unit_size(*size)?, *bytes)));
        node.hugepage_limits = unit_sizes.collect();
        fs.apply(&pods, &node)?;
        fs.apply(&format!("{pods}/besteffort"), &ResourceConfig::for_best_effort())?;
        let manager = CgroupManager { fs, config, state: Mutex::new(State::default()) };
        // No Burstable pod yet: the fewest shares, until the pods come back.
        manager.update_burstable(&mut manager.state())?;
        debug!(pods_cgroup = %pods, version = ?manager.fs.version(), ?node, "pod cgroups ready");
        Ok(manager)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state whole: a poisoned lock's state is usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn burstable_cgroup(&self) -> String {
        format!("{}/burstable", self.config.pods_cgroup.trim_end_matches('/'))
    }

    /// Writes the Burstable class's shares when its pods' requests changed since last written.
    fn update_burstable(&self, state: &mut State) -> Result<(), PodCgroupError> {
        let requests: i64 = state.burstable.values().sum();
        if state.burstable_written == Some(requests) {
            return Ok(());
        }
        self.fs.apply(&self.burstable_cgroup(), &ResourceConfig::for_burstable(requests))?;
        state.burstable_written = Some(requests);
        Ok(())
    }
}

impl PodCgroups for CgroupManager {
    fn ensure(&self, pod: &Pod) -> Result<(), PodCgroupError> {
        let uid = PodUid::of(pod);
        let name = pod_cgroup_name(&self.config.pods_cgroup, pod);
        let mut state = self.state();
        if qos_class(pod) == "Burstable" {
            state.burstable.insert(uid.clone(), pod_requests(pod).0);
            self.update_burstable(&mut state)?;
        }
        if state.ensured.contains(&uid) && self.fs.exists(&name) {
            return Ok(());
        }
        let mut config =
            ResourceConfig::for_pod(pod, self.config.cfs_quota, self.config.cpu_period, self.config.pod_pids_limit);
        config.hugepage_limits = hugepage_limits(&self.config.hugepage_sizes(), &pod_hugepage_requests(pod));
        self.fs.apply(&name, &config)?;
        debug!(pod.uid = %uid, cgroup = %name, ?config, "pod cgroup set");
        state.ensured.insert(uid);
        Ok(())
    }

    fn forget(&self, uid: &PodUid) {
        let mut state = self.state();
        state.ensured.remove(uid);
        if state.burstable.remove(uid).is_some()
            && let Err(err) = self.update_burstable(&mut state)
        {
            warn!(error = %err, "cannot update the Burstable pods' cgroup");
        }
    }

    fn unclaimed_pods(&self) -> Result<Vec<PodUid>, PodCgroupError> {
        // Held while listing, so a pod is either ensured already or its cgroup is not made yet.
        let state = self.state();
        let pods = self.config.pods_cgroup.trim_end_matches('/');
        let mut unclaimed = Vec::new();
        for class in [pods.to_owned(), format!("{pods}/burstable"), format!("{pods}/besteffort")] {
            for child in self.fs.children(&class)? {
                let Some(uid) = child.strip_prefix("pod").filter(|uid| !uid.is_empty()) else { continue };
                let uid = PodUid::new(uid);
                if !state.ensured.contains(&uid) {
                    unclaimed.push(uid);
                }
            }
        }
        Ok(unclaimed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, requests: &str, limits: &str) -> Pod {
        crate::test_pods::pod(uid, &[("a", requests, limits)])
    }

    fn read(mount: &std::path::Path, file: &str) -> String {
        std::fs::read_to_string(mount.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
    }

    #[test]
    fn the_hierarchy_and_each_class_get_upstreams_values() {
        let mount = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(mount.path().join("cpu")).unwrap();
        let config = Config::new(mount.path(), "/kubepods").node(2000, 4 << 30).pod_pids_limit(Some(64));
        let manager = CgroupManager::new(config).unwrap();
        assert_eq!(read(mount.path(), "cpu/kubepods/cpu.shares"), "2048");
        assert_eq!(read(mount.path(), "memory/kubepods/memory.limit_in_bytes"), (4u64 << 30).to_string());
        assert_eq!(read(mount.path(), "cpu/kubepods/besteffort/cpu.shares"), "2");
        assert_eq!(read(mount.path(), "cpu/kubepods/burstable/cpu.shares"), "2", "no Burstable pod yet");

        manager.ensure(&pod("g", "cpu=1,memory=64Mi", "cpu=1,memory=64Mi")).unwrap();
        manager.ensure(&pod("b1", "cpu=250m", "")).unwrap();
        manager.ensure(&pod("b2", "cpu=250m", "cpu=500m")).unwrap();
        manager.ensure(&pod("e", "", "")).unwrap();
        assert_eq!(read(mount.path(), "cpu/kubepods/podg/cpu.shares"), "1024");
        assert_eq!(read(mount.path(), "cpu/kubepods/podg/cpu.cfs_quota_us"), "100000");
        assert_eq!(read(mount.path(), "memory/kubepods/podg/memory.limit_in_bytes"), "67108864");
        assert_eq!(read(mount.path(), "pids/kubepods/podg/pids.max"), "64");
        assert_eq!(read(mount.path(), "cpu/kubepods/burstable/podb2/cpu.cfs_quota_us"), "50000");
        assert_eq!(read(mount.path(), "cpu/kubepods/besteffort/pode/cpu.shares"), "2");
        assert_eq!(read(mount.path(), "cpu/kubepods/burstable/cpu.shares"), "512", "both Burstable pods' requests");

        manager.forget(&PodUid::new("b1"));
        assert_eq!(read(mount.path(), "cpu/kubepods/burstable/cpu.shares"), "256");
        manager.forget(&PodUid::new("g"));
        manager.forget(&PodUid::new("b2"));
        assert_eq!(read(mount.path(), "cpu/kubepods/burstable/cpu.shares"), "2");
    }

    #[test]
    fn pods_with_a_cgroup_this_process_has_not_ensured_are_unclaimed() {
        let mount = tempfile::tempdir().unwrap();
        let manager = CgroupManager::new(Config::new(mount.path(), "/kubepods")).unwrap();
        manager.ensure(&pod("kept", "", "")).unwrap();
        manager.ensure(&pod("gone", "cpu=1,memory=64Mi", "cpu=1,memory=64Mi")).unwrap();
        manager.forget(&PodUid::new("gone"));
        // Left by an earlier process: one in a single controller only.
        std::fs::create_dir_all(mount.path().join("cpu/kubepods/burstable/podcrashed")).unwrap();
        std::fs::create_dir_all(mount.path().join("memory/kubepods/besteffort/podhalf")).unwrap();
        // Not pods' cgroups.
        std::fs::create_dir_all(mount.path().join("cpu/kubepods/pod")).unwrap();
        std::fs::create_dir_all(mount.path().join("cpu/kubepods/other")).unwrap();
        std::fs::write(mount.path().join("cpu/kubepods/besteffort/podfile"), "").unwrap();

        let mut unclaimed: Vec<String> =
            manager.unclaimed_pods().unwrap().iter().map(|uid| uid.as_str().to_owned()).collect();
        unclaimed.sort();
        assert_eq!(unclaimed, ["crashed", "gone", "half"]);
    }

    #[test]
    fn a_set_pod_is_left_alone_until_its_cgroup_goes() {
        let mount = tempfile::tempdir().unwrap();
        let manager = CgroupManager::new(Config::new(mount.path(), "/kubepods")).unwrap();
        let guaranteed = pod("g", "cpu=1,memory=64Mi", "cpu=1,memory=64Mi");
        manager.ensure(&guaranteed).unwrap();
        let shares = mount.path().join("cpu/kubepods/podg/cpu.shares");
        std::fs::write(&shares, "7").unwrap();
        manager.ensure(&guaranteed).unwrap();
        assert_eq!(std::fs::read_to_string(&shares).unwrap(), "7", "not written again");
        std::fs::remove_dir_all(mount.path().join("cpu/kubepods/podg")).unwrap();
        manager.ensure(&guaranteed).unwrap();
        assert_eq!(std::fs::read_to_string(&shares).unwrap(), "1024", "made again");
    }
}
