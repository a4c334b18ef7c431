//! Pod admission (upstream `pkg/kubelet/lifecycle/predicate.go` and `pkg/kubelet/sysctl`): a
//! pod is admitted only if it is for this node's OS, the node has room for it among the active
//! pods, it matches the node's labels, its host ports are free, it tolerates the node's
//! `NoExecute` taints (static pods aside) and its sysctls are allowed.
//!
//! The node's labels and taints are the API's Node's once [`ApiNode`] knows it (upstream admits
//! against its node informer's Node), and the node's own before that (upstream's `initialNode`).
//!
//! Extended resources the node does not have (`nvidia.com/gpu` here) are left out of the
//! requests, as upstream leaves them (`removeMissingExtendedResources`); the node has none.

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{PoisonError, RwLock},
};

use k8s_openapi::api::core::v1::{Pod, Taint};
use kubelet_core::resources::{hugepage_page_size, pod_hugepage_requests, pod_request, units};

mod affinity;
mod sysctls;
mod taints;

/// The node label naming its operating system.
const OS_LABEL: &str = "kubernetes.io/os";

/// What the node offers to pods, and what it allows them.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NodeResources {
    /// Allocatable CPU in millicores (capacity minus reserved).
    pub cpu_milli: i64,
    /// Allocatable memory in bytes.
    pub memory_bytes: i64,
    /// `maxPods` (110).
    pub max_pods: usize,
    /// The node's labels, for `nodeSelector` and the required node affinity.
    pub labels: BTreeMap<String, String>,
    /// The node's taints (`registerWithTaints`); a pod not from a static source must tolerate
    /// each `NoExecute` one.
    pub taints: Vec<Taint>,
    /// The unsafe sysctls (names, or prefixes ending in `*`) pods may set beside the safe ones
    /// (`allowedUnsafeSysctls`).
    pub allowed_unsafe_sysctls: Vec<String>,
    /// The huge pages the node has: bytes of pre-allocated pages, by page size in bytes (every
    /// size the kernel offers, with zero when none are allocated).
    pub hugepages: BTreeMap<u64, u64>,
    /// Allocatable ephemeral storage in bytes: the root directory's filesystem less the hard
    /// `nodefs.available` threshold. `None` when unknown, and then pods' requests for it are
    /// not checked.
    pub ephemeral_storage_bytes: Option<i64>,
    /// Why this host cannot enforce AppArmor profiles (`None`: it can); pods that ask for one
    /// are then refused, as upstream's AppArmor admit handler refuses them.
    pub apparmor_unavailable: Option<&'static str>,
}

/// The node's labels and taints as the API server has its Node, once known: upstream admits pods
/// against its node informer's Node, so labels and taints an administrator sets count. Until the
/// Node is known, and after it is deleted, admission uses the node's own ([`NodeResources`],
/// upstream's `initialNode`).
#[derive(Debug, Default)]
pub struct ApiNode(RwLock<Option<NodeLabelsAndTaints>>);

/// What admission reads of a Node: its labels and its taints.
type NodeLabelsAndTaints = (BTreeMap<String, String>, Vec<Taint>);

impl ApiNode {
    /// The Node's labels and taints are now these.
    pub fn set(&self, labels: BTreeMap<String, String>, taints: Vec<Taint>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some((labels, taints));
    }

    /// The Node is gone: admission goes back to the node's own labels and taints.
    pub fn forget(&self) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// `own` with the Node's labels and taints in place of its own, once the Node is known.
    pub fn over<'a>(&self, own: &'a NodeResources) -> Cow<'a, NodeResources> {
        // Each write replaces the whole value: a poisoned lock still holds a whole one.
        match &*self.0.read().unwrap_or_else(PoisonError::into_inner) {
            None => Cow::Borrowed(own),
            Some((labels, taints)) => {
                let mut node = own.clone();
                node.labels.clone_from(labels);
                node.taints.clone_from(taints);
                Cow::Owned(node)
            }
        }
    }
}

impl NodeResources {
    /// Resources with upstream's `maxPods` and the `kubernetes.io/os=linux` label.
    pub fn new(cpu_milli: i64, memory_bytes: i64) -> Self {
        NodeResources {
            cpu_milli,
            memory_bytes,
            max_pods: 110,
            labels: BTreeMap::from([(OS_LABEL.to_owned(), "linux".to_owned())]),
            taints: Vec::new(),
            allowed_unsafe_sysctls: Vec::new(),
            hugepages: BTreeMap::new(),
            ephemeral_storage_bytes: None,
            apparmor_unavailable: None,
        }
    }

    /// This machine's CPUs, memory and huge pages, with nothing reserved.
    pub fn of_this_node() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
            .map_or(0, |kib| kib * 1024);
        let mut node = NodeResources::new(i64::try_from(cpus).unwrap_or(1) * 1000, memory);
        node.hugepages = hugepages_of(Path::new(HUGEPAGES_DIR));
        node.apparmor_unavailable = kubelet_core::apparmor::host_unavailable();
        node
    }
}

/// Where the kernel lists its huge page sizes (`hugepages-2048kB/nr_hugepages`).
const HUGEPAGES_DIR: &str = "/sys/kernel/mm/hugepages";

/// The huge pages under `dir` (as cAdvisor reads them): bytes allocated by page size.
fn hugepages_of(dir: &Path) -> BTreeMap<u64, u64> {
    let mut hugepages = BTreeMap::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let kib = name.to_str().and_then(|n| n.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse::<u64>().ok());
        let Some(page_size) = kib.map(|kib| kib * 1024) else { continue };
        let pages = std::fs::read_to_string(entry.path().join("nr_hugepages"));
        let pages: u64 = pages.ok().and_then(|p| p.trim().parse().ok()).unwrap_or(0);
        hugepages.insert(page_size, page_size.saturating_mul(pages));
    }
    hugepages
}

/// Why a pod was rejected: upstream's reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rejection {
    /// Reason, e.g. `OutOfcpu`, `OutOfmemory`, `OutOfpods`, `NodeAffinity`, `NodePorts`,
    /// `SysctlForbidden`.
    pub reason: String,
    /// Message.
    pub message: String,
}

impl Rejection {
    pub(crate) fn new(reason: impl Into<String>, message: impl Into<String>) -> Rejection {
        Rejection { reason: reason.into(), message: message.into() }
    }

    /// A failed scheduler predicate, as upstream's `PredicateFailureError` words it.
    fn predicate(name: &str, description: &str) -> Rejection {
        Rejection::new(name, format!("Predicate {name} failed: {description}"))
    }
}

pub use kubelet_core::resources::pod_requests;

/// A host port a pod asks for: protocol, host IP (`0.0.0.0` when unset) and port.
type HostPort = (String, String, i32);

fn host_ports(pod: &Pod) -> Vec<HostPort> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".to_owned());
            let ip = p.host_ip.clone().filter(|ip| !ip.is_empty()).unwrap_or_else(|| "0.0.0.0".to_owned());
            p.host_port.filter(|h| *h > 0).map(|h| (protocol, ip, h))
        })
        .collect()
}

/// Whether two host ports collide (upstream's `HostPortInfo`): same protocol and port, and the
/// same IP or either on every address.
fn ports_collide(a: &HostPort, b: &HostPort) -> bool {
    a.0 == b.0 && a.2 == b.2 && (a.1 == b.1 || a.1 == "0.0.0.0" || b.1 == "0.0.0.0")
}

/// Decides whether `pod` may run next to the `active` pods, with upstream's checks in
/// upstream's order (`predicateAdmitHandler.Admit`, then the sysctl allowlist): the OS label
/// and `spec.os`, then the scheduler's admission checks (pod count, CPU, memory, the required
/// node affinity and `nodeSelector`, host ports), the `NoExecute` taints, then the pod's sysctls.
pub fn admit(pod: &Pod, active: &[&Pod], node: &NodeResources) -> Result<(), Rejection> {
    admit_to(pod, &NodeUsage::of(active), node)
}

/// [`admit`] against what the active pods hold, summed once in `usage`: for a burst of pods,
/// count each admitted one in with [`NodeUsage::add`] before the next.
pub fn admit_to(pod: &Pod, usage: &NodeUsage, node: &NodeResources) -> Result<(), Rejection> {
    let labels = pod.metadata.labels.as_ref();
    if labels.and_then(|l| l.get(OS_LABEL)).is_some_and(|os| os != "linux") {
        return Err(Rejection::new(
            "PodOSSelectorNodeLabelDoesNotMatch",
            "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
        ));
    }
    if pod.spec.as_ref().and_then(|s| s.os.as_ref()).is_some_and(|os| os.name != "linux") {
        return Err(Rejection::new("PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS"));
    }
    fits(pod, usage, node)?;
    if !affinity::required_affinity_matches(pod, &node.labels) {
        return Err(Rejection::predicate("NodeAffinity", "node(s) didn't match Pod's node affinity/selector"));
    }
    if host_ports(pod).iter().any(|wanted| usage.host_ports.iter().any(|used| ports_collide(wanted, used))) {
        return Err(Rejection::predicate("NodePorts", "node(s) didn't have free ports for the requested pod ports"));
    }
    if !kubelet_core::types::is_static_pod(pod) && taints::untolerated_no_execute(pod, &node.taints) {
        return Err(Rejection::predicate("TaintToleration", "node(s) had taints that the pod didn't tolerate"));
    }
    sysctls::check(pod, &node.allowed_unsafe_sysctls)
        .map_err(|error| Rejection::new("SysctlForbidden", format!("forbidden sysctl: {error}")))?;
    apparmor(pod, node.apparmor_unavailable)
        .map_err(|error| Rejection::new("AppArmor", format!("Cannot enforce AppArmor: {error}")))
}

/// Upstream's AppArmor validator: a pod that asks for confinement needs a host that enforces
/// it, and a `Localhost` profile needs a name.
fn apparmor(pod: &Pod, host_unavailable: Option<&'static str>) -> Result<(), String> {
    use kubelet_core::apparmor::{Profile, is_required, profile};
    // A pod already running or done is not checked again (an agent's restart admits it anew).
    let pending = pod.status.as_ref().and_then(|s| s.phase.as_deref()).is_none_or(|phase| phase == "Pending");
    if !pending || !is_required(pod) {
        return Ok(());
    }
    if let Some(why) = host_unavailable {
        return Err(why.to_owned());
    }
    let spec = pod.spec.as_ref();
    let containers = spec.into_iter().flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers));
    let contexts = containers.map(|c| (c.name.as_str(), c.security_context.as_ref()));
    let ephemeral = spec.into_iter().flat_map(|s| s.ephemeral_containers.iter().flatten());
    let contexts = contexts.chain(ephemeral.map(|c| (c.name.as_str(), c.security_context.as_ref())));
    for (name, context) in contexts {
        if let Some(Profile::Localhost(profile_name)) = profile(pod, name, context)
            && profile_name.trim().is_empty()
        {
            return Err(format!("invalid empty AppArmor profile name: {profile_name:?}"));
        }
    }
    Ok(())
}

/// The resource name of local ephemeral storage.
const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// What the active pods already hold of the node: their number, requests and host ports,
/// summed once. Admitting a burst of pods then costs each pod its own requests, where a sum over
/// every active pod for each (upstream's way) costs a node of 10,000 pods 50 million sums.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeUsage {
    pods: i64,
    cpu_milli: i64,
    memory_bytes: i64,
    ephemeral_storage_bytes: i64,
    /// Huge page requests by resource name (`hugepages-2Mi`).
    hugepages: BTreeMap<String, i64>,
    host_ports: Vec<HostPort>,
}

impl NodeUsage {
    /// The usage of the pods `active`.
    pub fn of(active: &[&Pod]) -> Self {
        let mut usage = NodeUsage::default();
        for pod in active {
            usage.add(pod);
        }
        usage
    }

    /// Counts `pod` in, as one more active pod.
    pub fn add(&mut self, pod: &Pod) {
        let (cpu, memory) = pod_requests(pod);
        self.pods += 1;
        self.cpu_milli += cpu;
        self.memory_bytes += memory;
        self.ephemeral_storage_bytes += pod_request(pod, EPHEMERAL_STORAGE, units);
        for name in hugepage_names(pod) {
            let requested = pod_request(pod, &name, units);
            *self.hugepages.entry(name).or_default() += requested;
        }
        self.host_ports.extend(host_ports(pod));
    }
}

/// The huge page resources any container of `pod` names, in its requests or its limits.
fn hugepage_names(pod: &Pod) -> BTreeSet<String> {
    let Some(spec) = pod.spec.as_ref() else { return BTreeSet::new() };
    let resources =
        spec.containers.iter().chain(spec.init_containers.iter().flatten()).filter_map(|c| c.resources.as_ref());
    let names = resources.flat_map(|r| r.requests.iter().chain(r.limits.iter()).flat_map(BTreeMap::keys));
    names.filter(|name| hugepage_page_size(name).is_some()).cloned().collect()
}

/// Upstream's `noderesources.Fits`: room for one more pod, and for its CPU, memory, ephemeral
/// storage and huge page requests.
fn fits(pod: &Pod, usage: &NodeUsage, node: &NodeResources) -> Result<(), Rejection> {
    let short = |resource: &str, requested: i64, used: i64, capacity: i64| {
        Rejection::new(
            format!("OutOf{resource}"),
            format!(
                "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
            ),
        )
    };
    let max_pods = i64::try_from(node.max_pods).unwrap_or(i64::MAX);
    if usage.pods + 1 > max_pods {
        return Err(short("pods", 1, usage.pods, max_pods));
    }
    let (cpu, memory) = pod_requests(pod);
    for (resource, requested, used, capacity) in
        [("cpu", cpu, usage.cpu_milli, node.cpu_milli), ("memory", memory, usage.memory_bytes, node.memory_bytes)]
    {
        if requested > 0 && requested > capacity - used {
            return Err(short(resource, requested, used, capacity));
        }
    }
    if let Some(capacity) = node.ephemeral_storage_bytes {
        let requested = pod_request(pod, EPHEMERAL_STORAGE, units);
        let used = usage.ephemeral_storage_bytes;
        if requested > 0 && requested > capacity - used {
            return Err(short(EPHEMERAL_STORAGE, requested, used, capacity));
        }
    }
    // Huge pages are native resources: a size the node lacks has none to give.
    for name in pod_hugepage_requests(pod).keys() {
        let requested = pod_request(pod, name, units);
        let used = usage.hugepages.get(name).copied().unwrap_or(0);
        let page_size = hugepage_page_size(name).unwrap_or(0);
        let capacity = node.hugepages.get(&page_size).map_or(0, |b| i64::try_from(*b).unwrap_or(i64::MAX));
        if requested > 0 && requested > capacity - used {
            return Err(short(name, requested, used, capacity));
        }
    }
    Ok(())
}
