//! Pod admission (upstream `pkg/kubelet/lifecycle/predicate.go`): a pod is admitted only if the
//! node has room for it among the active pods.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::Pod;

use kubelet_core::resources::{container_resource, milli, units};

/// What the node offers to pods.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeResources {
    /// Allocatable CPU in millicores (capacity minus reserved).
    pub cpu_milli: i64,
    /// Allocatable memory in bytes.
    pub memory_bytes: i64,
    /// `maxPods` (110).
    pub max_pods: usize,
    /// The node's labels, for `nodeSelector`.
    pub labels: BTreeMap<String, String>,
}

impl NodeResources {
    /// Resources with upstream's `maxPods` and the `kubernetes.io/os=linux` label.
    pub fn new(cpu_milli: i64, memory_bytes: i64) -> Self {
        NodeResources {
            cpu_milli,
            memory_bytes,
            max_pods: 110,
            labels: BTreeMap::from([("kubernetes.io/os".to_owned(), "linux".to_owned())]),
        }
    }

    /// This machine's CPUs and memory, with nothing reserved.
    pub fn of_this_node() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
            .map_or(0, |kib| kib * 1024);
        NodeResources::new(i64::try_from(cpus).unwrap_or(1) * 1000, memory)
    }
}

/// Why a pod was rejected: upstream's reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rejection {
    /// Reason, e.g. `OutOfcpu`, `OutOfmemory`, `OutOfpods`, `NodeAffinity`, `NodePorts`.
    pub reason: String,
    /// Message.
    pub message: String,
}

/// A pod's effective requests: the larger of the sum over its containers and any single init
/// container (upstream's `PodRequests`).
pub fn pod_requests(pod: &Pod) -> (i64, i64) {
    let Some(spec) = pod.spec.as_ref() else { return (0, 0) };
    let sum = |resource: &str, f: fn(&k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<i64>| -> i64 {
        spec.containers.iter().filter_map(|c| container_resource(c, resource, false).and_then(f)).sum()
    };
    let init_max =
        |resource: &str, f: fn(&k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<i64>| -> i64 {
            spec.init_containers
                .iter()
                .flatten()
                .filter_map(|c| container_resource(c, resource, false).and_then(f))
                .max()
                .unwrap_or(0)
        };
    (sum("cpu", milli).max(init_max("cpu", milli)), sum("memory", units).max(init_max("memory", units)))
}

fn host_ports(pod: &Pod) -> Vec<(String, i32)> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            p.host_port.filter(|h| *h > 0).map(|h| (p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()), h))
        })
        .collect()
}

/// Decides whether `pod` fits next to the `active` pods.
pub fn admit(pod: &Pod, active: &[&Pod], node: &NodeResources) -> Result<(), Rejection> {
    let reject = |reason: &str, message: String| Err(Rejection { reason: reason.to_owned(), message });
    if active.len() >= node.max_pods {
        return reject(
            "OutOfpods",
            format!(
                "Node didn't have enough resource: pods, requested: 1, used: {}, capacity: {}",
                active.len(),
                node.max_pods
            ),
        );
    }
    if let Some(selector) = pod.spec.as_ref().and_then(|s| s.node_selector.as_ref())
        && selector.iter().any(|(k, v)| node.labels.get(k) != Some(v))
    {
        return reject("NodeAffinity", "Predicate NodeAffinity failed".to_owned());
    }
    let (cpu, memory) = pod_requests(pod);
    let used_cpu: i64 = active.iter().map(|p| pod_requests(p).0).sum();
    let used_memory: i64 = active.iter().map(|p| pod_requests(p).1).sum();
    let resources = [("cpu", cpu, used_cpu, node.cpu_milli), ("memory", memory, used_memory, node.memory_bytes)];
    for (resource, requested, used, capacity) in resources {
        if requested > 0 && used + requested > capacity {
            return reject(
                &format!("OutOf{resource}"),
                format!(
                    "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
                ),
            );
        }
    }
    let used_ports: HashSet<(String, i32)> = active.iter().flat_map(|p| host_ports(p)).collect();
    if host_ports(pod).iter().any(|p| used_ports.contains(p)) {
        return reject("NodePorts", "Predicate NodePorts failed".to_owned());
    }
    Ok(())
}
