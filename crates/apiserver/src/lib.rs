//! Cluster mode for node agents: the node's client of the API server (upstream
//! `pkg/kubelet/nodestatus/setters.go`, `kubelet_node_status.go`, the node lease controller,
//! `pkg/kubelet/config/apiserver.go`, `status_manager.go`, `mirror_client.go`): the [`Node`] a
//! kubelet registers, the status it reports and the lease it renews, the pods bound to it, their
//! statuses, mirror pods, events, and the objects API-backed volumes read.
//!
//! Everything here is a pure function of [`Facts`] (what the agent knows of its node) and
//! [`Health`] (what is wrong with it now), so it is tested without an API server:
//!
//! - [`registration`]: the Node to create (labels `kubernetes.io/hostname`, `kubernetes.io/os`,
//!   `kubernetes.io/arch` and `--node-labels`; taints from `--register-with-taints`).
//! - [`set_status`]: upstream's setters in upstream's order: addresses, capacity and allocatable,
//!   node info, `MemoryPressure`, `DiskPressure`, `PIDPressure` and `Ready` last, each keeping
//!   its transition time while its status holds, with the events upstream records.
//! - [`should_report`]: the status goes to the API server when it changed (heartbeats aside) or
//!   when `nodeStatusReportFrequency` has passed since the last report.
//! - [`parse_taints`]: `--register-with-taints` (`key=value:Effect,...`).
//! - [`lease`]: the node lease in `kube-node-lease` (40 s, renewed every 10 s with optimistic
//!   concurrency, creation retried with a backoff up to 7 s).
//!
//! [`heartbeat`] puts them to work over a kube-rs client: [`heartbeat::connect`] reads a
//! kubeconfig, [`heartbeat::register`] creates the Node or adopts the one there (putting the
//! kubelet's labels back), and [`heartbeat::run`] reports the status on change (or every
//! report period) and renews the lease until cancelled, telling when the API server answers
//! again after an outage. [`node_watch::watch_node`] follows the node's own Node (its labels
//! and taints, for admission). [`source::watch_pods`] is the API pod source: the pods bound to the
//! node, as snapshots for the config merger, the first once the initial list is complete, and
//! afresh when told the API server answers again. [`testing`] (feature `test-util`) is an in-process API server that
//! speaks the wire protocol of these requests (list and watch with 410 included), for tests.
//! [`status`] is the pod status sink: [`status::status_patch`] holds its rules (the UID
//! precondition, terminal phases kept, others' conditions kept), [`status::report`] sends the
//! changes and ends graceful deletions (a terminated pod whose deletion was asked for is
//! deleted with grace 0 and its UID as a precondition). [`mirror`] builds, creates and deletes
//! static pods' mirror pods. [`ratelimit`] holds requests to `kubeAPIQPS` and `kubeAPIBurst`
//! with a token bucket, as client-go does, and [`retry`] retries what the server asks to have
//! retried (`Retry-After`), as client-go does; [`client_metrics`] measures the clients under
//! client-go's `rest_client_*` metric names. [`bootstrap`] is TLS bootstrap: a client
//! certificate asked for with a bootstrap kubeconfig through a CertificateSigningRequest;
//! [`certificate`] renews the node's client and serving certificates the same way, and
//! [`credentials`] lets running clients take a rotated client certificate without a restart.
//!
//! TLS to the API server is kube's: rustls with ring by default (feature `rustls-tls`), or the
//! system's OpenSSL (feature `openssl-tls`, without the default features).
//!
//! # Example
//!
//! ```no_run
//! use kubelet_cluster::{Facts, Health, registration, set_status};
//! use kubelet_core::runtime::Version;
//!
//! let mut facts = Facts::new("node-1", Version::new("containerd", "1.6.20", "v1"));
//! facts.cpu_milli = 2000;
//! facts.memory_bytes = 4 << 30;
//! let mut node = registration(&facts);
//! let events = set_status(&mut node, &facts, &Health::default(), kubelet_core::clock::wall_now());
//! assert!(events.iter().any(|e| e.reason == "NodeReady"));
//! ```

pub mod bootstrap;
pub mod certificate;
pub mod client_metrics;
pub mod credentials;
pub mod events;
pub mod heartbeat;
pub mod lease;
pub mod mirror;
pub mod node_watch;
pub mod objects;
pub mod ratelimit;
pub mod retry;
pub mod source;
pub mod status;
#[cfg(feature = "test-util")]
pub mod testing;

use std::{collections::BTreeMap, net::IpAddr, path::Path};

use k8s_openapi::{
    api::core::v1::{
        ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
        NodeSystemInfo, Taint,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, Time},
    },
    jiff::Timestamp,
};
use kubelet_core::{
    eviction::{Pressure, Resource, Thresholds, format_amount},
    resources::hugepage_resource,
    runtime::{Image, Version},
};

/// What the agent knows of its node: identity, resources, software.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Facts {
    /// The node's name (`--hostname-override` or the host name, lower case).
    pub name: String,
    /// The host name: the `Hostname` address and the `kubernetes.io/hostname` label. Upstream's
    /// without a cloud provider is the node's name (`--hostname-override` when given), which
    /// [`Facts::new`] sets.
    pub hostname: String,
    /// The node's IP (`--node-ip`), reported as its `InternalIP`; none: no InternalIP.
    pub ip: Option<IpAddr>,
    /// The second address of a dual-stack `--node-ip`, reported as a second `InternalIP`.
    pub secondary_ip: Option<IpAddr>,
    /// Extra labels (`--node-labels`).
    pub labels: BTreeMap<String, String>,
    /// Taints to register with (`--register-with-taints`).
    pub taints: Vec<Taint>,
    /// `providerID`: the Node's `spec.providerID`.
    pub provider_id: Option<String>,
    /// `--cloud-provider=external`: the node registers with upstream's uninitialized taint,
    /// names its IPs ([`Facts::ip`] and the secondary one, which must then be the ones
    /// `--node-ip` gave) for the cloud's controller, and leaves the addresses to that controller
    /// once the Node has any.
    pub external_cloud_provider: bool,
    /// CPU capacity in millicores.
    pub cpu_milli: i64,
    /// Memory capacity in bytes.
    pub memory_bytes: i64,
    /// Root filesystem capacity in bytes (`ephemeral-storage`), when known.
    pub ephemeral_storage_bytes: Option<i64>,
    /// Pre-allocated huge pages in bytes by page size in bytes (`hugepages-2Mi`, ...), each
    /// held back from allocatable memory.
    pub hugepages: BTreeMap<u64, u64>,
    /// `maxPods`.
    pub max_pods: u32,
    /// `nodeStatusMaxImages` (50): the most images the status lists, largest first; `None`
    /// lists them all.
    pub max_images: Option<usize>,
    /// Reserved CPU millicores and memory bytes (`systemReserved` plus `kubeReserved`).
    pub reserved: (i64, i64),
    /// The eviction thresholds: the hard ones hold memory and node storage back from pods.
    pub eviction: Thresholds,
    /// The container runtime's version.
    pub runtime: Version,
    /// This agent's version, as the kubelet version (`v1.36.0-kubelet-rs.0.1.0`).
    pub kubelet_version: String,
    /// The kernel's release (`/proc/sys/kernel/osrelease`).
    pub kernel_version: String,
    /// The OS image (`PRETTY_NAME` of `/etc/os-release`).
    pub os_image: String,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// `/sys/class/dmi/id/product_uuid` (the machine's SMBIOS UUID, upstream's `systemUUID`).
    pub system_uuid: String,
    /// The port the kubelet API is served on, reported as `daemonEndpoints.kubeletEndpoint`
    /// (where the API server calls for logs, exec and stats); none while it is not served.
    pub kubelet_port: Option<u16>,
}

impl Facts {
    /// Facts of node `name` on `runtime`, with nothing known of its resources yet.
    pub fn new(name: impl Into<String>, runtime: Version) -> Self {
        let name = name.into();
        Facts {
            hostname: name.clone(),
            name,
            ip: None,
            secondary_ip: None,
            labels: BTreeMap::new(),
            taints: Vec::new(),
            provider_id: None,
            external_cloud_provider: false,
            cpu_milli: 0,
            memory_bytes: 0,
            ephemeral_storage_bytes: None,
            hugepages: BTreeMap::new(),
            max_pods: 110,
            max_images: Some(50),
            reserved: (0, 0),
            eviction: Thresholds::default(),
            runtime,
            kubelet_version: String::new(),
            kernel_version: String::new(),
            os_image: String::new(),
            machine_id: String::new(),
            boot_id: String::new(),
            system_uuid: String::new(),
            kubelet_port: None,
        }
    }
}

impl Facts {
    /// Fills in what this host says of itself: its kernel release, OS image, machine and boot
    /// IDs, its system UUID, and the capacity of the filesystem holding `root_dir` (`ephemeral-storage`).
    /// What cannot be read stays empty.
    #[must_use]
    pub fn read_host(mut self, root_dir: &Path) -> Self {
        let read = |path: &str| std::fs::read_to_string(path).map(|s| s.trim().to_owned()).unwrap_or_default();
        self.kernel_version = read("/proc/sys/kernel/osrelease");
        self.machine_id = read("/etc/machine-id");
        self.boot_id = read("/proc/sys/kernel/random/boot_id");
        self.system_uuid = read("/sys/class/dmi/id/product_uuid");
        self.os_image = read("/etc/os-release")
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_owned())
            .unwrap_or_else(|| "Linux".to_owned());
        let fs = root_dir.ancestors().find_map(|dir| nix::sys::statvfs::statvfs(dir).ok());
        // Reason: the field types are the platform's (`c_ulong`, `fsblkcnt_t`), u64 here.
        #[allow(clippy::useless_conversion)]
        let bytes = fs.map(|fs| u64::from(fs.fragment_size()).saturating_mul(u64::from(fs.blocks())));
        self.ephemeral_storage_bytes = bytes.and_then(|b| i64::try_from(b).ok());
        self
    }
}

/// What keeps the node from being ready now: each list holds the messages upstream joins into
/// the `Ready` condition's message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// The runtime's errors (`container runtime is down`, the PLEG's `PLEG is not healthy: ...`).
    pub runtime_errors: Vec<String>,
    /// The network's errors (`container runtime network not ready: ...`).
    pub network_errors: Vec<String>,
    /// The pressure conditions the eviction manager reports.
    pub pressure: Vec<Pressure>,
    /// The runtime's images as last listed, for the status's `images`.
    pub images: Vec<Image>,
}

/// The most names the status gives one image (upstream `MaxNamesPerImageInNodeStatus`).
pub const MAX_NAMES_PER_IMAGE: usize = 5;

/// Upstream's `Images` setter: the largest images first, at most `max`, each with at most
/// [`MAX_NAMES_PER_IMAGE`] names (its digests, then its tags); none when nothing is listed.
fn node_images(images: &[Image], max: Option<usize>) -> Option<Vec<ContainerImage>> {
    if images.is_empty() {
        return None;
    }
    let mut largest_first: Vec<&Image> = images.iter().collect();
    largest_first.sort_by_key(|image| std::cmp::Reverse(image.size));
    let listed = largest_first
        .into_iter()
        .take(max.unwrap_or(usize::MAX))
        .map(|image| {
            let names = image.repo_digests.iter().chain(&image.repo_tags).take(MAX_NAMES_PER_IMAGE).cloned().collect();
            ContainerImage { names: Some(names), size_bytes: i64::try_from(image.size).ok() }
        })
        .collect();
    Some(listed)
}

/// A pressure condition's reason, message and event (upstream's `MemoryPressureCondition`,
/// `DiskPressureCondition` and `PIDPressureCondition` setters).
fn pressure_condition(pressure: Pressure, under: bool) -> (&'static str, &'static str, &'static str) {
    match (pressure, under) {
        (Pressure::Memory, true) => {
            ("KubeletHasInsufficientMemory", "kubelet has insufficient memory available", "NodeHasInsufficientMemory")
        }
        (Pressure::Disk, true) => ("KubeletHasDiskPressure", "kubelet has disk pressure", "NodeHasDiskPressure"),
        (Pressure::Pid, true) => {
            ("KubeletHasInsufficientPID", "kubelet has insufficient PID available", "NodeHasInsufficientPID")
        }
        (Pressure::Memory, false) => {
            ("KubeletHasSufficientMemory", "kubelet has sufficient memory available", "NodeHasSufficientMemory")
        }
        (Pressure::Disk, false) => {
            ("KubeletHasNoDiskPressure", "kubelet has no disk pressure", "NodeHasNoDiskPressure")
        }
        (Pressure::Pid, false) => {
            ("KubeletHasSufficientPID", "kubelet has sufficient PID available", "NodeHasSufficientPID")
        }
    }
}

/// An event about the node the setters ask to record (upstream records them on the Node).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeEvent {
    /// `Normal` or `Warning`.
    pub kind: &'static str,
    /// Upstream's reason: `NodeReady`, `NodeNotReady`, `NodeHasSufficientMemory`, `NodeRebooted`...
    pub reason: &'static str,
    /// The message (upstream's: `Node <name> status is now: <reason>`).
    pub message: String,
}

/// A `--register-with-taints` value that is not `key[=value]:Effect,...`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid taint {taint:?}: {why}")]
#[non_exhaustive]
pub struct TaintError {
    /// The taint as written.
    pub taint: String,
    /// What is wrong with it.
    pub why: &'static str,
}

/// The label keys a kubelet sets on its Node.
pub mod labels;

/// The labels a kubelet gives its Node: its own (`kubernetes.io/hostname` as `hostname`, the OS
/// and architecture, stable and beta), then `extra` (`--node-labels`), which win (upstream's
/// `initialNode`).
pub fn node_labels(hostname: &str, extra: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (labels::HOSTNAME.to_owned(), hostname.to_owned()),
        (labels::OS.to_owned(), std::env::consts::OS.to_owned()),
        (labels::ARCH.to_owned(), go_arch().to_owned()),
        (labels::BETA_OS.to_owned(), std::env::consts::OS.to_owned()),
        (labels::BETA_ARCH.to_owned(), go_arch().to_owned()),
    ]);
    // `--node-labels` over the defaults, as upstream's `initialNode` (which logs each it replaces).
    labels.extend(extra.iter().map(|(key, value)| (key.clone(), value.clone())));
    labels
}

/// This machine's architecture as Go (and so Kubernetes) names it: `amd64`, `arm64`...
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "arm" => "arm",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

/// Parses `--register-with-taints`: `key=value:Effect` or `key:Effect`, comma-separated, with
/// `NoSchedule`, `PreferNoSchedule` or `NoExecute` as the effect.
pub fn parse_taints(text: &str) -> Result<Vec<Taint>, TaintError> {
    let mut taints = Vec::new();
    for item in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let bad = |why| TaintError { taint: item.to_owned(), why };
        let (key_value, effect) = item.rsplit_once(':').ok_or_else(|| bad("no effect (key=value:Effect)"))?;
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(bad("the effect must be NoSchedule, PreferNoSchedule or NoExecute"));
        }
        let (key, value) = match key_value.split_once('=') {
            Some((key, value)) => (key, Some(value.to_owned())),
            None => (key_value, None),
        };
        if key.is_empty() {
            return Err(bad("an empty key"));
        }
        taints.push(Taint { key: key.to_owned(), value, effect: effect.to_owned(), time_added: None });
    }
    Ok(taints)
}

/// The Node to register (upstream `initialNode`): the kubelet's labels over `--node-labels`,
/// the taints, and a first status.
pub fn registration(facts: &Facts) -> Node {
    let labels = node_labels(&facts.hostname, &facts.labels);
    let mut taints = facts.taints.clone();
    if facts.external_cloud_provider {
        taints.push(Taint {
            key: labels::UNINITIALIZED_TAINT.to_owned(),
            value: Some("true".to_owned()),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        });
    }
    Node {
        metadata: ObjectMeta {
            name: Some(facts.name.clone()),
            labels: Some(labels),
            annotations: Some(node_annotations(facts)),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            provider_id: facts.provider_id.clone(),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus::default()),
    }
}

/// The annotations the kubelet keeps on its Node: volumes attached by the attach/detach
/// controller, and for an external cloud provider the IP `--node-ip` named (upstream's
/// `initialNode` and `NodeAddress` setter).
pub fn node_annotations(facts: &Facts) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([(labels::CONTROLLER_MANAGED_ATTACH.to_owned(), "true".to_owned())]);
    let given: Vec<String> = facts.ip.iter().chain(&facts.secondary_ip).map(ToString::to_string).collect();
    if facts.external_cloud_provider && !given.is_empty() {
        annotations.insert(labels::PROVIDED_NODE_IP.to_owned(), given.join(","));
    }
    annotations
}

/// Upstream's setters, in upstream's order, on `node` at `now`; returns the events to record.
pub fn set_status(node: &mut Node, facts: &Facts, health: &Health, now: Timestamp) -> Vec<NodeEvent> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let status = node.status.get_or_insert_with(NodeStatus::default);
    let mut events = Vec::new();
    let status_event = |reason: &'static str| NodeEvent {
        kind: "Normal",
        reason,
        message: format!("Node {name} status is now: {reason}"),
    };
    // Addresses: the node IPs (a dual-stack pair in the order given), then the host name; an
    // external cloud provider's, once it has set them, stay.
    let addresses_set = status.addresses.as_ref().is_some_and(|a| !a.is_empty());
    let mut addresses = Vec::new();
    for ip in facts.ip.iter().chain(&facts.secondary_ip) {
        addresses.push(NodeAddress { type_: "InternalIP".into(), address: ip.to_string() });
    }
    addresses.push(NodeAddress { type_: "Hostname".into(), address: facts.hostname.clone() });
    if !(facts.external_cloud_provider && addresses_set) {
        status.addresses = Some(addresses);
    }
    // Capacity, and allocatable as capacity minus the reservations, never below zero.
    let mut capacity = BTreeMap::from([
        ("cpu".to_owned(), millis(facts.cpu_milli)),
        ("memory".to_owned(), Quantity(format!("{}Ki", facts.memory_bytes / 1024))),
        ("pods".to_owned(), Quantity(facts.max_pods.to_string())),
    ]);
    if let Some(bytes) = facts.ephemeral_storage_bytes {
        capacity.insert("ephemeral-storage".to_owned(), Quantity(format!("{}Ki", bytes / 1024)));
    }
    for (page_size, bytes) in &facts.hugepages {
        capacity.insert(hugepage_resource(*page_size), Quantity(format_amount(*bytes, Resource::Memory)));
    }
    // Allocatable: capacity less what is reserved less what the hard eviction thresholds hold back.
    let storage = facts.ephemeral_storage_bytes.unwrap_or(0);
    let (memory_held, storage_held) =
        facts.eviction.hard_reservation(facts.memory_bytes.max(0).unsigned_abs(), storage.max(0).unsigned_abs());
    let held = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
    let mut allocatable = capacity.clone();
    allocatable.insert("cpu".to_owned(), millis((facts.cpu_milli - facts.reserved.0).max(0)));
    // Memory in huge pages is no memory pods can use as such.
    let hugepages: u64 = facts.hugepages.values().sum();
    let memory = facts.memory_bytes - facts.reserved.1 - held(memory_held) - held(hugepages);
    allocatable.insert("memory".to_owned(), Quantity(memory.max(0).to_string()));
    if facts.ephemeral_storage_bytes.is_some() {
        let storage = (storage - held(storage_held)).max(0).unsigned_abs();
        allocatable
            .insert("ephemeral-storage".to_owned(), Quantity(format_amount(storage, Resource::EphemeralStorage)));
    }
    status.capacity = Some(capacity);
    status.allocatable = Some(allocatable);
    // Node info; a changed boot ID is a reboot.
    let info = status.node_info.get_or_insert_with(NodeSystemInfo::default);
    let rebooted = !info.boot_id.is_empty() && info.boot_id != facts.boot_id;
    *info = NodeSystemInfo {
        architecture: go_arch().to_owned(),
        operating_system: std::env::consts::OS.to_owned(),
        boot_id: facts.boot_id.clone(),
        machine_id: facts.machine_id.clone(),
        system_uuid: facts.system_uuid.clone(),
        kernel_version: facts.kernel_version.clone(),
        os_image: facts.os_image.clone(),
        container_runtime_version: format!("{}://{}", facts.runtime.runtime_name, facts.runtime.runtime_version),
        kubelet_version: facts.kubelet_version.clone(),
        ..NodeSystemInfo::default()
    };
    status.images = node_images(&health.images, facts.max_images);
    status.daemon_endpoints = facts
        .kubelet_port
        .map(|port| NodeDaemonEndpoints { kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(port) }) });
    if rebooted {
        events.push(NodeEvent {
            kind: "Warning",
            reason: "Rebooted",
            message: format!("Node {name} has been rebooted, boot id: {}", facts.boot_id),
        });
    }
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    // The eviction manager's conditions, with upstream's reasons, messages and events.
    for pressure in Pressure::ALL {
        let under = health.pressure.contains(&pressure);
        let (reason, message, event) = pressure_condition(pressure, under);
        if set_condition(
            conditions,
            pressure.condition_type(),
            if under { "True" } else { "False" },
            reason,
            message,
            now,
        ) {
            events.push(status_event(event));
        }
    }
    // Ready last (upstream keeps it last for old readers).
    let errors: Vec<String> = health.runtime_errors.iter().chain(&health.network_errors).cloned().collect();
    let changed = if errors.is_empty() {
        set_condition(conditions, "Ready", "True", "KubeletReady", "kubelet is posting ready status", now)
    } else {
        set_condition(conditions, "Ready", "False", "KubeletNotReady", &errors.join(","), now)
    };
    if let Some(at) = conditions.iter().position(|c| c.type_ == "Ready") {
        let ready = conditions.remove(at);
        conditions.push(ready);
    }
    if changed {
        events.push(status_event(if errors.is_empty() { "NodeReady" } else { "NodeNotReady" }));
    }
    events
}

/// Sets condition `kind` (heartbeat now; transition now only when its status changes); returns
/// whether the status changed (or the condition is new).
fn set_condition(
    conditions: &mut Vec<NodeCondition>,
    kind: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> bool {
    let now = Some(Time(now));
    match conditions.iter_mut().find(|c| c.type_ == kind) {
        Some(condition) => {
            let changed = condition.status != status;
            if changed {
                condition.last_transition_time.clone_from(&now);
            }
            condition.status = status.to_owned();
            condition.reason = Some(reason.to_owned());
            condition.message = Some(message.to_owned());
            condition.last_heartbeat_time = now;
            changed
        }
        None => {
            conditions.push(NodeCondition {
                type_: kind.to_owned(),
                status: status.to_owned(),
                reason: Some(reason.to_owned()),
                message: Some(message.to_owned()),
                last_heartbeat_time: now.clone(),
                last_transition_time: now,
            });
            true
        }
    }
}

/// Whether the new status goes to the API server (upstream `updateNodeStatus`): when it differs
/// from the last one reported, heartbeat times aside, or when `report_every`
/// (`nodeStatusReportFrequency`, 5 min) has passed since that report.
pub fn should_report(
    reported: &NodeStatus,
    current: &NodeStatus,
    since_report: std::time::Duration,
    report_every: std::time::Duration,
) -> bool {
    let without_heartbeats = |status: &NodeStatus| {
        let mut status = status.clone();
        for condition in status.conditions.iter_mut().flatten() {
            condition.last_heartbeat_time = None;
        }
        status
    };
    since_report >= report_every || without_heartbeats(reported) != without_heartbeats(current)
}

/// A CPU quantity in millicores, in whole cores when it is one.
fn millis(milli: i64) -> Quantity {
    if milli % 1000 == 0 { Quantity((milli / 1000).to_string()) } else { Quantity(format!("{milli}m")) }
}

#[cfg(test)]
mod tests;
