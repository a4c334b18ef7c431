//! Pods' use of the node, the order in which pods are evicted for each signal, and the messages
//! they are evicted with (upstream `helpers.go`), as pure functions.

use std::{cmp::Ordering, collections::HashMap, sync::Arc};

use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_core::{
    PodUid,
    eviction::{Resource, Signal, Threshold, format_amount},
    resources,
};

use crate::state::Observations;

/// Bytes and inodes used on a filesystem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskUsage {
    /// Bytes.
    pub bytes: u64,
    /// Inodes.
    pub inodes: u64,
}

impl DiskUsage {
    /// `bytes` in `inodes` inodes.
    pub fn new(bytes: u64, inodes: u64) -> Self {
        DiskUsage { bytes, inodes }
    }

    fn of(self, resource: Resource) -> u64 {
        if resource == Resource::Inodes { self.inodes } else { self.bytes }
    }
}

/// One container's use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerUsage {
    /// The container's name.
    pub name: String,
    /// The runtime's ID of it, when the runtime measured it.
    pub id: Option<String>,
    /// Its memory working set, when measured.
    pub memory_working_set: Option<u64>,
    /// The CPU time it has used in nanoseconds, and when that was read (nanoseconds since the
    /// epoch), when measured.
    pub cpu: Option<(u64, Option<i64>)>,
    /// Its CPU use between the summary's last reading and this one, in nanocores (cAdvisor's
    /// `usageNanoCores`), once there are two readings.
    pub cpu_usage_nano_cores: Option<u64>,
    /// Its writable layer, when measured.
    pub rootfs: Option<DiskUsage>,
    /// Its log files.
    pub logs: Option<DiskUsage>,
}

/// One pod's use of the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodStats {
    /// Its containers.
    pub containers: Vec<ContainerUsage>,
    /// Its local volumes on the node's disk (emptyDir), by volume name.
    pub volumes: Vec<(String, DiskUsage)>,
    /// Its processes, when measured.
    pub processes: Option<u64>,
    /// Its network traffic, when the runtime measured it.
    pub network: Option<kubelet_core::runtime::PodNetworkStats>,
    /// Its cgroup (`/kubepods/besteffort/pod<uid>`), when pods have cgroups.
    pub cgroup: Option<String>,
}

impl PodStats {
    /// The pod's memory working set: its containers'.
    pub fn memory(&self) -> u64 {
        self.containers.iter().filter_map(|c| c.memory_working_set).sum()
    }

    /// The pod's use of `resource` (ephemeral storage or inodes) counting `parts`.
    pub fn disk(&self, parts: DiskParts, resource: Resource) -> u64 {
        let containers: u64 = self
            .containers
            .iter()
            .map(|c| {
                let root = if parts.rootfs { c.rootfs.unwrap_or_default().of(resource) } else { 0 };
                let logs = if parts.logs { c.logs.unwrap_or_default().of(resource) } else { 0 };
                root + logs
            })
            .sum();
        let volumes: u64 =
            if parts.local_volumes { self.volumes.iter().map(|(_, usage)| usage.of(resource)).sum() } else { 0 };
        containers + volumes
    }

    /// The bytes the volume named `name` uses, when measured.
    pub fn volume(&self, name: &str) -> Option<u64> {
        self.volumes.iter().find(|(volume, _)| volume == name).map(|(_, usage)| usage.bytes)
    }
}

/// Which parts of a pod's disk use count for a signal (upstream's `fsStatsType`s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskParts {
    /// The containers' writable layers.
    pub rootfs: bool,
    /// The containers' logs.
    pub logs: bool,
    /// The pod's local volumes.
    pub local_volumes: bool,
}

impl DiskParts {
    /// Everything: the parts that count when the images share the node's filesystem.
    pub const ALL: DiskParts = DiskParts { rootfs: true, logs: true, local_volumes: true };

    /// The parts on `signal`'s filesystem, with or without a dedicated image filesystem.
    pub fn for_signal(signal: Signal, dedicated_image_fs: bool) -> DiskParts {
        match signal {
            Signal::ImageFsAvailable | Signal::ImageFsInodesFree if dedicated_image_fs => {
                DiskParts { rootfs: true, logs: false, local_volumes: false }
            }
            Signal::NodeFsAvailable | Signal::NodeFsInodesFree if dedicated_image_fs => {
                DiskParts { rootfs: false, logs: true, local_volumes: true }
            }
            _ => DiskParts::ALL,
        }
    }
}

/// The measured pods, by UID.
pub type PodStatsMap = HashMap<PodUid, PodStats>;

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// A pod's request of `resource` in base units (upstream's `PodRequests`).
fn pod_request(pod: &Pod, resource: Resource) -> u64 {
    bytes(resources::pod_request(pod, resource.name(), resources::units))
}

/// A container's request (or, with `limit`, limit) of `resource` in base units, if set.
pub fn container_amount(container: &Container, resource: Resource, limit: bool) -> Option<u64> {
    resources::container_resource(container, resource.name(), limit).and_then(resources::units).map(bytes)
}

/// A whole amount as the unsigned count the observations use (a negative quantity is none).
pub(crate) fn bytes(amount: i64) -> u64 {
    amount.max(0).unsigned_abs()
}

/// `true` after `false`: the pod for which `key` holds goes first.
fn first_if(a: bool, b: bool) -> Ordering {
    b.cmp(&a)
}

/// Ranks `pods` for `signal` (upstream's rank functions): for memory, pods using more than they
/// request first, then lower priority, then use above the request; for disk the same with the
/// signal's parts of their disk use; for PIDs lower priority, then more processes. Pods without
/// stats go first, as upstream puts them.
pub fn rank(pods: &mut [Arc<Pod>], signal: Signal, stats: &PodStatsMap, dedicated_image_fs: bool) {
    let of = |pod: &Pod| stats.get(&PodUid::of(pod));
    let measured_first = |a: &Pod, b: &Pod| first_if(of(a).is_none(), of(b).is_none());
    match signal.resource() {
        Resource::Memory => pods.sort_by(|a, b| {
            measured_first(a, b)
                .then_with(|| {
                    let exceeds = |p: &Pod| of(p).is_some_and(|s| s.memory() > pod_request(p, Resource::Memory));
                    first_if(exceeds(a), exceeds(b))
                })
                .then_with(|| priority(a).cmp(&priority(b)))
                .then_with(|| {
                    let above = |p: &Pod| {
                        i128::from(of(p).map_or(0, PodStats::memory)) - i128::from(pod_request(p, Resource::Memory))
                    };
                    above(b).cmp(&above(a))
                })
        }),
        Resource::Pids => pods.sort_by(|a, b| {
            priority(a).cmp(&priority(b)).then_with(|| {
                let processes = |p: &Pod| of(p).and_then(|s| s.processes).unwrap_or(0);
                processes(b).cmp(&processes(a))
            })
        }),
        resource => {
            let parts = DiskParts::for_signal(signal, dedicated_image_fs);
            let used = |p: &Pod| of(p).map_or(0, |s| s.disk(parts, resource));
            let request = |p: &Pod| pod_request(p, resource);
            pods.sort_by(|a, b| {
                measured_first(a, b)
                    .then_with(|| first_if(used(a) > request(a), used(b) > request(b)))
                    .then_with(|| priority(a).cmp(&priority(b)))
                    .then_with(|| {
                        // Upstream subtracts the ephemeral-storage request for inodes as well.
                        let above =
                            |p: &Pod| i128::from(used(p)) - i128::from(pod_request(p, Resource::EphemeralStorage));
                        above(b).cmp(&above(a))
                    })
            });
        }
    }
}

/// Upstream's message for a pod evicted to reclaim `resource` (`evictionMessage`): the node was
/// low on it, the threshold and what was available, and each container using more than it
/// requests.
pub fn eviction_message(
    resource: Resource,
    pod: &Pod,
    stats: Option<&PodStats>,
    thresholds: &[Threshold],
    observations: &Observations,
) -> String {
    let mut message = format!("The node was low on resource: {resource}. ");
    let met = thresholds.iter().find_map(|t| {
        let observed = observations.get(&t.signal).filter(|_| t.signal.resource() == resource)?;
        Some((t.value.amount(observed.capacity), observed.available))
    });
    if let Some((quantity, available)) = met {
        let (quantity, available) = (format_amount(quantity, resource), format_amount(available, resource));
        message.push_str(&format!("Threshold quantity: {quantity}, available: {available}. "));
    }
    let Some(stats) = stats else { return message };
    for usage in &stats.containers {
        let Some(container) = pod.spec.iter().flat_map(|s| &s.containers).find(|c| c.name == usage.name) else {
            continue;
        };
        let used = match resource {
            Resource::Memory => usage.memory_working_set,
            Resource::EphemeralStorage => usage.rootfs.zip(usage.logs).map(|(root, logs)| root.bytes + logs.bytes),
            _ => None,
        };
        let request = container_amount(container, resource, false).unwrap_or(0);
        if let Some(used) = used.filter(|used| *used > request) {
            message.push_str(&format!(
                "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
                container.name,
                format_amount(used, resource),
                format_amount(request, resource),
            ));
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{api::core::v1::ResourceRequirements, apimachinery::pkg::api::resource::Quantity};
    use kubelet_core::{eviction::ThresholdValue, testing};

    use super::*;
    use crate::state::Observation;

    const MI: u64 = 1024 * 1024;

    fn stats(memory_mi: u64) -> PodStats {
        PodStats {
            containers: vec![ContainerUsage {
                name: "c".into(),
                memory_working_set: Some(memory_mi * MI),
                ..ContainerUsage::default()
            }],
            ..PodStats::default()
        }
    }

    fn pod(name: &str, memory_request: Option<&str>, priority: i32) -> Arc<Pod> {
        let mut pod = testing::pod(name, &["c"]);
        let spec = pod.spec.as_mut().unwrap();
        spec.priority = Some(priority);
        if let Some(request) = memory_request {
            let requests = [("memory".to_owned(), Quantity(request.into()))].into();
            spec.containers[0].resources =
                Some(ResourceRequirements { requests: Some(requests), ..Default::default() });
        }
        Arc::new(pod)
    }

    fn names(pods: &[Arc<Pod>]) -> Vec<&str> {
        pods.iter().map(|p| p.metadata.name.as_deref().unwrap()).collect()
    }

    #[test]
    fn memory_ranks_by_exceeding_requests_then_priority_then_use_above_request() {
        let within = pod("within", Some("500Mi"), 0);
        let low_priority_over = pod("low-over", Some("10Mi"), -10);
        let big_over = pod("big-over", None, 0);
        let small_over = pod("small-over", None, 0);
        let stats = PodStatsMap::from([
            (PodUid::of(&within), stats(400)),
            (PodUid::of(&low_priority_over), stats(20)),
            (PodUid::of(&big_over), stats(300)),
            (PodUid::of(&small_over), stats(100)),
        ]);
        let mut pods = vec![within, small_over, big_over, low_priority_over];
        rank(&mut pods, Signal::MemoryAvailable, &stats, false);
        assert_eq!(names(&pods), ["low-over", "big-over", "small-over", "within"]);
    }

    #[test]
    fn disk_counts_the_signals_parts_and_unmeasured_pods_go_first() {
        let logs_heavy = pod("logs", None, 0);
        let volume_heavy = pod("volume", None, 0);
        let unmeasured = pod("unmeasured", None, 0);
        let usage = |logs: u64, volume: u64| PodStats {
            containers: vec![ContainerUsage {
                name: "c".into(),
                logs: Some(DiskUsage::new(logs, 1)),
                rootfs: Some(DiskUsage::new(0, 0)),
                ..ContainerUsage::default()
            }],
            volumes: vec![("data".into(), DiskUsage::new(volume, 1))],
            ..PodStats::default()
        };
        let stats =
            PodStatsMap::from([(PodUid::of(&logs_heavy), usage(50, 0)), (PodUid::of(&volume_heavy), usage(1, 80))]);
        let mut pods = vec![logs_heavy.clone(), volume_heavy.clone(), unmeasured];
        rank(&mut pods, Signal::NodeFsAvailable, &stats, false);
        assert_eq!(names(&pods), ["unmeasured", "volume", "logs"]);
        let mut pods = vec![volume_heavy, logs_heavy];
        rank(&mut pods, Signal::ImageFsAvailable, &stats, true);
        assert_eq!(names(&pods), ["volume", "logs"], "equal on the image filesystem: kept in order");
    }

    #[test]
    fn pids_rank_by_priority_then_processes() {
        let (a, b, c) = (pod("a", None, 0), pod("b", None, 0), pod("c", None, 100));
        let with = |n| PodStats { processes: Some(n), ..PodStats::default() };
        let stats =
            PodStatsMap::from([(PodUid::of(&a), with(5)), (PodUid::of(&b), with(50)), (PodUid::of(&c), with(500))]);
        let mut pods = vec![c, a, b];
        rank(&mut pods, Signal::PidAvailable, &stats, false);
        assert_eq!(names(&pods), ["b", "a", "c"]);
    }

    #[test]
    fn the_message_names_the_threshold_and_each_container_over_its_request() {
        let greedy = pod("greedy", Some("10Mi"), 0);
        let threshold = Threshold::hard(Signal::MemoryAvailable, ThresholdValue::Quantity(100 * MI));
        let observations = Observations::from([(Signal::MemoryAvailable, Observation::new(50 * MI, 1024 * MI))]);
        let message = eviction_message(Resource::Memory, &greedy, Some(&stats(30)), &[threshold], &observations);
        assert_eq!(
            message,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
             Container c was using 30Mi, request is 10Mi, has larger consumption of memory. "
        );
    }
}
