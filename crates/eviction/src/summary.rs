//! The node's and the pods' resource use for the kubelet API, from the same stats the eviction
//! manager reads (upstream `pkg/kubelet/server/stats` and `metrics/collectors/resource_metrics.go`):
//! [`summary`] is `/stats/summary` (upstream's `stats/v1alpha1` `Summary`) and
//! [`resource_metrics`] is `/metrics/resource`, the series metrics-server reads.
//!
//! Both are pure functions of a [`NodeSample`] and the pods' [`PodStats`]; [`SummaryProvider`]
//! takes the samples when asked, never in the background.

use std::{
    collections::{HashMap, HashSet},
    fmt::Write as _,
    sync::Mutex,
};

use k8s_openapi::{
    api::core::v1::{Pod, PodStatus},
    jiff::Timestamp,
};
use kubelet_core::{
    Runtime,
    runtime::{FsStats, InterfaceStats},
};
use serde_json::{Value, json};

use crate::{
    rank::{ContainerUsage, DiskParts, PodStats},
    state::Observation,
    stats::{HostStats, Need},
};

/// The node's use at one moment.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NodeSample {
    /// When it was read.
    pub time: Timestamp,
    /// The CPU time all processes used, in nanoseconds (the root cgroup's).
    pub cpu_usage_core_nanoseconds: Option<u64>,
    /// The CPU use since the previous sample, in nanocores.
    pub cpu_usage_nano_cores: Option<u64>,
    /// Memory: available and capacity (`memory.available`'s observation).
    pub memory: Option<Observation>,
    /// The root directory's filesystem.
    pub fs: Option<FsStats>,
    /// The runtime's image filesystem.
    pub image_fs: Option<FsStats>,
    /// Process IDs: available and `pid_max`.
    pub pids: Option<Observation>,
    /// The node's network interfaces.
    pub network: Vec<InterfaceStats>,
}

impl NodeSample {
    /// A sample at `time` with nothing measured.
    pub fn new(time: Timestamp) -> Self {
        NodeSample {
            time,
            cpu_usage_core_nanoseconds: None,
            cpu_usage_nano_cores: None,
            memory: None,
            fs: None,
            image_fs: None,
            pids: None,
            network: Vec::new(),
        }
    }

    fn memory_working_set(&self) -> Option<u64> {
        self.memory.map(|m| m.capacity.saturating_sub(m.available))
    }
}

/// One pod's part of a summary: the pod, its status (start times) and its measured use.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct PodSample<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// Its status as the kubelet computed it.
    pub status: Option<&'a PodStatus>,
    /// Its measured use.
    pub stats: &'a PodStats,
}

impl<'a> PodSample<'a> {
    /// `pod` with `status` and `stats`.
    pub fn new(pod: &'a Pod, status: Option<&'a PodStatus>, stats: &'a PodStats) -> Self {
        PodSample { pod, status, stats }
    }

    fn name(&self) -> &'a str {
        self.pod.metadata.name.as_deref().unwrap_or_default()
    }

    fn namespace(&self) -> &'a str {
        self.pod.metadata.namespace.as_deref().unwrap_or("default")
    }

    /// The pod's CPU time: its containers'.
    fn cpu(&self) -> Option<u64> {
        let used: Vec<u64> = self.stats.containers.iter().filter_map(|c| c.cpu.map(|(used, _)| used)).collect();
        (!used.is_empty()).then(|| used.iter().sum())
    }

    /// Its containers' `usageNanoCores` summed, once one has a rate (a container without one
    /// counts as none, as upstream's sum).
    fn cpu_rate(&self) -> Option<u64> {
        let rates: Vec<u64> = self.stats.containers.iter().filter_map(|c| c.cpu_usage_nano_cores).collect();
        (!rates.is_empty()).then(|| rates.iter().sum())
    }

    fn memory(&self) -> Option<u64> {
        self.stats.containers.iter().any(|c| c.memory_working_set.is_some()).then(|| self.stats.memory())
    }

    /// The image the spec gives container `name`.
    fn image_of(&self, name: &str) -> &'a str {
        let containers =
            self.pod.spec.iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()));
        containers.filter(|c| c.name == name).find_map(|c| c.image.as_deref()).unwrap_or_default()
    }

    /// When the container `name` last started, from the status.
    fn container_start(&self, name: &str) -> Option<Timestamp> {
        let statuses = self.status?.container_statuses.as_ref()?;
        let running = statuses.iter().find(|s| s.name == name)?.state.as_ref()?.running.as_ref()?;
        running.started_at.as_ref().map(|t| t.0)
    }
}

/// The CPU time of a container, and when it was read (the runtime's time, else `fallback`).
fn container_cpu(container: &ContainerUsage, fallback: Timestamp) -> Option<(u64, Timestamp)> {
    let (used, read_at) = container.cpu?;
    let at = read_at.and_then(|nanos| Timestamp::from_nanosecond(i128::from(nanos)).ok()).unwrap_or(fallback);
    Some((used, at))
}

fn fs_json(fs: &FsStats, time: Timestamp) -> Value {
    let mut value = json!({
        "time": time.to_string(),
        "availableBytes": fs.available_bytes,
        "capacityBytes": fs.capacity_bytes,
        "usedBytes": fs.capacity_bytes.saturating_sub(fs.available_bytes),
    });
    if let Some((inodes, free)) = fs.inodes.zip(fs.inodes_free) {
        value["inodes"] = json!(inodes);
        value["inodesFree"] = json!(free);
        value["inodesUsed"] = json!(inodes.saturating_sub(free));
    }
    value
}

/// Upstream's name for the interface a summary's network figures lead with, when there is one.
const DEFAULT_INTERFACE: &str = "eth0";

fn interface_json(interface: &InterfaceStats) -> Value {
    json!({
        "name": interface.name,
        "rxBytes": interface.rx_bytes,
        "rxErrors": interface.rx_errors,
        "txBytes": interface.tx_bytes,
        "txErrors": interface.tx_errors,
    })
}

/// Upstream's `NetworkStats`: the default interface's figures, and every interface's.
fn network_json(default: Option<&InterfaceStats>, interfaces: &[&InterfaceStats], time: Timestamp) -> Value {
    let mut value = default.map(interface_json).unwrap_or_else(|| json!({}));
    value["time"] = json!(time.to_string());
    value["interfaces"] = Value::Array(interfaces.iter().map(|i| interface_json(i)).collect());
    value
}

fn node_json(node_name: &str, node: &NodeSample) -> Value {
    let time = node.time.to_string();
    let mut value = json!({ "nodeName": node_name, "systemContainers": [] });
    if let Some(used) = node.cpu_usage_core_nanoseconds {
        value["cpu"] = json!({ "time": time, "usageCoreNanoSeconds": used });
        if let Some(rate) = node.cpu_usage_nano_cores {
            value["cpu"]["usageNanoCores"] = json!(rate);
        }
    }
    if let (Some(memory), Some(working_set)) = (node.memory, node.memory_working_set()) {
        value["memory"] = json!({ "time": time, "availableBytes": memory.available, "workingSetBytes": working_set });
    }
    if let Some(fs) = &node.fs {
        value["fs"] = fs_json(fs, node.time);
    }
    if let Some(image_fs) = &node.image_fs {
        value["runtime"] = json!({ "imageFs": fs_json(image_fs, node.time) });
    }
    if !node.network.is_empty() {
        let interfaces: Vec<&InterfaceStats> = node.network.iter().collect();
        let default = interfaces.iter().find(|i| i.name == DEFAULT_INTERFACE).or(interfaces.first()).copied();
        value["network"] = network_json(default, &interfaces, node.time);
    }
    if let Some(pids) = node.pids {
        value["rlimit"] =
            json!({ "time": time, "maxpid": pids.capacity, "curproc": pids.capacity.saturating_sub(pids.available) });
    }
    value
}

fn container_json(sample: &PodSample<'_>, container: &ContainerUsage, time: Timestamp) -> Value {
    let mut value = json!({ "name": container.name });
    if let Some(start) = sample.container_start(&container.name) {
        value["startTime"] = json!(start.to_string());
    }
    if let Some((used, at)) = container_cpu(container, time) {
        value["cpu"] = json!({ "time": at.to_string(), "usageCoreNanoSeconds": used });
        if let Some(rate) = container.cpu_usage_nano_cores {
            value["cpu"]["usageNanoCores"] = json!(rate);
        }
    }
    if let Some(working_set) = container.memory_working_set {
        value["memory"] = json!({ "time": time.to_string(), "workingSetBytes": working_set });
    }
    if let Some(rootfs) = container.rootfs {
        value["rootfs"] = json!({ "time": time.to_string(), "usedBytes": rootfs.bytes, "inodesUsed": rootfs.inodes });
    }
    if let Some(logs) = container.logs {
        value["logs"] = json!({ "time": time.to_string(), "usedBytes": logs.bytes, "inodesUsed": logs.inodes });
    }
    value
}

fn pod_json(sample: &PodSample<'_>, time: Timestamp) -> Value {
    let uid = sample.pod.metadata.uid.as_deref().unwrap_or_default();
    let containers: Vec<Value> = sample.stats.containers.iter().map(|c| container_json(sample, c, time)).collect();
    let mut value = json!({
        "podRef": { "name": sample.name(), "namespace": sample.namespace(), "uid": uid },
        "containers": containers,
    });
    if let Some(start) = sample.status.and_then(|s| s.start_time.as_ref()) {
        value["startTime"] = json!(start.0.to_string());
    }
    if let Some(used) = sample.cpu() {
        value["cpu"] = json!({ "time": time.to_string(), "usageCoreNanoSeconds": used });
        if let Some(rate) = sample.cpu_rate() {
            value["cpu"]["usageNanoCores"] = json!(rate);
        }
    }
    if let Some(working_set) = sample.memory() {
        value["memory"] = json!({ "time": time.to_string(), "workingSetBytes": working_set });
    }
    let volumes: Vec<Value> = sample
        .stats
        .volumes
        .iter()
        .map(|(name, used)| json!({ "name": name, "time": time.to_string(), "usedBytes": used.bytes, "inodesUsed": used.inodes }))
        .collect();
    if !volumes.is_empty() {
        value["volume"] = json!(volumes);
    }
    let all = DiskParts { rootfs: true, logs: true, local_volumes: true };
    value["ephemeral-storage"] = json!({
        "time": time.to_string(),
        "usedBytes": sample.stats.disk(all, kubelet_core::eviction::Resource::EphemeralStorage),
        "inodesUsed": sample.stats.disk(all, kubelet_core::eviction::Resource::Inodes),
    });
    if let Some(processes) = sample.stats.processes {
        value["process_stats"] = json!({ "process_count": processes });
    }
    if let Some(network) = &sample.stats.network {
        let interfaces: Vec<&InterfaceStats> = network.default_interface.iter().chain(&network.interfaces).collect();
        value["network"] = network_json(network.default_interface.as_ref(), &interfaces, time);
    }
    value
}

/// `/stats/summary`: upstream's `Summary` of node `node_name` and `pods`.
pub fn summary(node_name: &str, node: &NodeSample, pods: &[PodSample<'_>]) -> Value {
    let pods: Vec<Value> = pods.iter().map(|p| pod_json(p, node.time)).collect();
    json!({ "node": node_json(node_name, node), "pods": pods })
}

/// One series of `/metrics/resource`: its name, help, type and samples (labels, value, time).
struct Series {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<(String, f64, Timestamp)>,
}

impl Series {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Self {
        Series { name, help, kind, samples: Vec::new() }
    }

    fn render(&self, out: &mut String) {
        if self.samples.is_empty() {
            return;
        }
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {}", self.name, self.kind);
        for (labels, value, time) in &self.samples {
            let _ = writeln!(out, "{}{labels} {value} {}", self.name, time.as_millisecond());
        }
    }
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let escaped: Vec<String> = pairs
        .iter()
        .map(|(key, value)| {
            format!("{key}=\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
        })
        .collect();
    format!("{{{}}}", escaped.join(","))
}

const NANOS_PER_SECOND: f64 = 1e9;

/// `/metrics/resource`: the node's, pods' and containers' CPU time and memory working set and
/// the containers' start times, with upstream's names, labels and sample times; `scrape_error`
/// says whether the containers could be read.
pub fn resource_metrics(node: &NodeSample, pods: &[PodSample<'_>], scrape_error: bool) -> String {
    let mut node_cpu = Series::new(
        "node_cpu_usage_seconds_total",
        "counter",
        "[ALPHA] Cumulative cpu time consumed by the node in core-seconds",
    );
    let mut node_memory =
        Series::new("node_memory_working_set_bytes", "gauge", "[ALPHA] Current working set of the node in bytes");
    let mut container_cpu_series = Series::new(
        "container_cpu_usage_seconds_total",
        "counter",
        "[ALPHA] Cumulative cpu time consumed by the container in core-seconds",
    );
    let mut container_memory = Series::new(
        "container_memory_working_set_bytes",
        "gauge",
        "[ALPHA] Current working set of the container in bytes",
    );
    let mut container_start = Series::new(
        "container_start_time_seconds",
        "gauge",
        "[ALPHA] Start time of the container since unix epoch in seconds",
    );
    let mut pod_cpu = Series::new(
        "pod_cpu_usage_seconds_total",
        "counter",
        "[ALPHA] Cumulative cpu time consumed by the pod in core-seconds",
    );
    let mut pod_memory =
        Series::new("pod_memory_working_set_bytes", "gauge", "[ALPHA] Current working set of the pod in bytes");
    let time = node.time;
    if let Some(used) = node.cpu_usage_core_nanoseconds {
        node_cpu.samples.push((String::new(), used as f64 / NANOS_PER_SECOND, time));
    }
    if let Some(working_set) = node.memory_working_set() {
        node_memory.samples.push((String::new(), working_set as f64, time));
    }
    for pod in pods {
        let (name, namespace) = (pod.name(), pod.namespace());
        for container in &pod.stats.containers {
            let labels = labels(&[("container", &container.name), ("namespace", namespace), ("pod", name)]);
            if let Some((used, at)) = container_cpu(container, time) {
                container_cpu_series.samples.push((labels.clone(), used as f64 / NANOS_PER_SECOND, at));
            }
            if let Some(working_set) = container.memory_working_set {
                container_memory.samples.push((labels.clone(), working_set as f64, time));
            }
            if let Some(start) = pod.container_start(&container.name).filter(|s| s.as_second() > 0) {
                container_start.samples.push((labels, start.as_second() as f64, start));
            }
        }
        let labels = labels(&[("namespace", namespace), ("pod", name)]);
        if let Some(used) = pod.cpu() {
            pod_cpu.samples.push((labels.clone(), used as f64 / NANOS_PER_SECOND, time));
        }
        if let Some(working_set) = pod.memory() {
            pod_memory.samples.push((labels, working_set as f64, time));
        }
    }
    let mut out = String::new();
    for series in
        [&container_cpu_series, &container_memory, &container_start, &node_cpu, &node_memory, &pod_cpu, &pod_memory]
    {
        series.render(&mut out);
    }
    // Upstream's scrape result has no sample time.
    out.push_str("# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise\n");
    out.push_str("# TYPE scrape_error gauge\n");
    let _ = writeln!(out, "scrape_error {}", u8::from(scrape_error));
    out
}

/// `/metrics/cadvisor`: the series of cAdvisor's that have a source here, with its names and
/// labels: the machine's (`id="/"`) and the containers' CPU time and memory working set, the
/// containers' start times, and the pods' network traffic by interface. Container series are
/// labelled `container`, `id` (the cgroup), `image`, `name` (the runtime's ID), `namespace`
/// and `pod`, as cAdvisor labels them for a kubelet.
pub fn cadvisor_metrics(node: &NodeSample, pods: &[PodSample<'_>]) -> String {
    let mut cpu =
        Series::new("container_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed in seconds.");
    let mut memory = Series::new("container_memory_working_set_bytes", "gauge", "Current working set in bytes.");
    let mut start = Series::new(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds.",
    );
    let network_help = [
        ("container_network_receive_bytes_total", "Cumulative count of bytes received"),
        ("container_network_receive_errors_total", "Cumulative count of errors encountered while receiving"),
        ("container_network_transmit_bytes_total", "Cumulative count of bytes transmitted"),
        ("container_network_transmit_errors_total", "Cumulative count of errors encountered while transmitting"),
    ];
    let mut network = network_help.map(|(name, help)| Series::new(name, "counter", help));
    let time = node.time;
    let machine = Subject { id: "/", ..Subject::default() };
    if let Some(used) = node.cpu_usage_core_nanoseconds {
        cpu.samples.push((machine.cpu_labels(), used as f64 / NANOS_PER_SECOND, time));
    }
    if let Some(working_set) = node.memory_working_set() {
        memory.samples.push((machine.labels(), working_set as f64, time));
    }
    for pod in pods {
        let (name, namespace) = (pod.name(), pod.namespace());
        let pod_cgroup = pod.stats.cgroup.as_deref().unwrap_or_default();
        for container in &pod.stats.containers {
            let id = container.id.as_deref().unwrap_or_default();
            let cgroup = if pod_cgroup.is_empty() { String::new() } else { format!("{pod_cgroup}/{id}") };
            let subject = Subject {
                container: &container.name,
                id: &cgroup,
                image: pod.image_of(&container.name),
                name: id,
                namespace,
                pod: name,
            };
            let labels = subject.labels();
            if let Some((used, at)) = container_cpu(container, time) {
                cpu.samples.push((subject.cpu_labels(), used as f64 / NANOS_PER_SECOND, at));
            }
            if let Some(working_set) = container.memory_working_set {
                memory.samples.push((labels.clone(), working_set as f64, time));
            }
            if let Some(started) = pod.container_start(&container.name).filter(|s| s.as_second() > 0) {
                start.samples.push((labels, started.as_second() as f64, time));
            }
        }
        let Some(traffic) = &pod.stats.network else { continue };
        for interface in traffic.default_interface.iter().chain(&traffic.interfaces) {
            let labels = Subject { id: pod_cgroup, namespace, pod: name, ..Subject::default() }
                .interface_labels(&interface.name);
            let counters = [interface.rx_bytes, interface.rx_errors, interface.tx_bytes, interface.tx_errors];
            for (series, counter) in network.iter_mut().zip(counters) {
                if let Some(value) = counter {
                    series.samples.push((labels.clone(), value as f64, time));
                }
            }
        }
    }
    let mut out = String::new();
    for series in [&cpu, &memory, &start].into_iter().chain(&network) {
        series.render(&mut out);
    }
    out
}

/// What a cAdvisor series is of: a container, a pod's cgroup or the machine (`id="/"`).
#[derive(Default)]
struct Subject<'a> {
    container: &'a str,
    id: &'a str,
    image: &'a str,
    name: &'a str,
    namespace: &'a str,
    pod: &'a str,
}

impl Subject<'_> {
    /// The labels, in cAdvisor's order.
    fn labels(&self) -> String {
        labels(&[
            ("container", self.container),
            ("id", self.id),
            ("image", self.image),
            ("name", self.name),
            ("namespace", self.namespace),
            ("pod", self.pod),
        ])
    }

    /// The labels of a CPU series: the total of all CPUs, as the kubelet's cAdvisor counts.
    fn cpu_labels(&self) -> String {
        labels(&[
            ("container", self.container),
            ("cpu", "total"),
            ("id", self.id),
            ("image", self.image),
            ("name", self.name),
            ("namespace", self.namespace),
            ("pod", self.pod),
        ])
    }

    /// The labels of a network series of `interface`.
    fn interface_labels(&self, interface: &str) -> String {
        labels(&[
            ("container", self.container),
            ("id", self.id),
            ("image", self.image),
            ("interface", interface),
            ("name", self.name),
            ("namespace", self.namespace),
            ("pod", self.pod),
        ])
    }
}

/// The last CPU reading of each thing measured (the node, each container by its runtime ID):
/// what a rate is taken against. Only what the latest reading saw is kept.
#[derive(Debug, Default)]
struct CpuReadings(HashMap<String, (i128, u64)>);

impl CpuReadings {
    /// The rate, in nanocores, of `used` CPU nanoseconds read at `at` (nanoseconds since the
    /// epoch) since the kept reading of `key`; none for a first reading, one no later than the
    /// kept one, one more than [`STALE_AFTER`] later, or a counter that went back (a restarted
    /// container). The kept reading is replaced once it is [`WINDOW`] old or no use any more, so
    /// a rate spans at least a window however often the summary is asked for (upstream's cache,
    /// which its eviction manager refreshes every 10 s).
    fn rate(&mut self, key: &str, used: u64, at: i128) -> Option<u64> {
        let Some(&(then, before)) = self.0.get(key) else {
            self.0.insert(key.to_owned(), (at, used));
            return None;
        };
        let elapsed = at - then;
        if elapsed <= 0 {
            return None;
        }
        let rate = (elapsed <= STALE_AFTER)
            .then(|| used.checked_sub(before))
            .flatten()
            .and_then(|spent| u64::try_from(i128::from(spent) * 1_000_000_000 / elapsed).ok());
        if elapsed >= WINDOW || rate.is_none() {
            self.0.insert(key.to_owned(), (at, used));
        }
        rate
    }

    /// Forgets every key but `seen` and the node's.
    fn keep_only(&mut self, seen: &HashSet<String>) {
        self.0.retain(|key, _| key == NODE_KEY || seen.contains(key));
    }
}

/// The node's key among the [`CpuReadings`] (no runtime ID is empty).
const NODE_KEY: &str = "";

/// How old a kept CPU reading gets before a newer one replaces it: 10 s, in nanoseconds.
const WINDOW: i128 = 10_000_000_000;

/// How old a kept CPU reading may be and still give a rate: 10 minutes (upstream's cache
/// period), in nanoseconds.
const STALE_AFTER: i128 = 600_000_000_000;

/// Takes the samples for the summary and the resource metrics when asked: the node's from this
/// host, the pods' from the runtime and the disk; it keeps the last CPU readings of the node and
/// of each container for their `usageNanoCores`.
pub struct SummaryProvider<R> {
    stats: HostStats<R>,
    last_cpu: Mutex<CpuReadings>,
}

impl<R: Runtime> SummaryProvider<R> {
    /// Samples through `stats`.
    pub fn new(stats: HostStats<R>) -> Self {
        SummaryProvider { stats, last_cpu: Mutex::default() }
    }

    fn readings(&self) -> std::sync::MutexGuard<'_, CpuReadings> {
        // Each critical section replaces whole readings: a poisoned map is whole.
        self.last_cpu.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The node now.
    pub async fn node(&self) -> NodeSample {
        let mut sample = self.stats.node_sample().await;
        if let Some(used) = sample.cpu_usage_core_nanoseconds {
            sample.cpu_usage_nano_cores = self.readings().rate(NODE_KEY, used, sample.time.as_nanosecond());
        }
        sample
    }

    /// Each measured container's `usageNanoCores` since the last summary.
    fn container_rates(&self, measured: &mut crate::rank::PodStatsMap) {
        let mut readings = self.readings();
        let mut seen = HashSet::new();
        for container in measured.values_mut().flat_map(|pod| pod.containers.iter_mut()) {
            let (Some(id), Some((used, Some(at)))) = (&container.id, container.cpu) else { continue };
            container.cpu_usage_nano_cores = readings.rate(id, used, i128::from(at));
            seen.insert(id.clone());
        }
        readings.keep_only(&seen);
    }

    /// The pods' use (CPU, memory, disk and processes), and whether the runtime failed to say
    /// what its containers use (upstream's `scrape_error`).
    pub async fn pods(&self, pods: &[std::sync::Arc<Pod>]) -> (crate::rank::PodStatsMap, bool) {
        let need = Need { memory: true, disk: true, processes: true };
        let (containers, networks) = tokio::join!(self.stats.container_stats(), self.stats.pod_network_stats());
        let (containers, failed) = match containers {
            Ok(containers) => (containers, false),
            Err(err) => {
                tracing::debug!(error = %kubelet_core::ErrorChain(&err), "cannot read the containers' stats");
                (Vec::new(), true)
            }
        };
        let mut measured = self.stats.measure(pods, need, containers).await;
        if !failed {
            // A failed listing says nothing of the containers: their readings stay.
            self.container_rates(&mut measured);
        }
        match networks {
            Ok(networks) => {
                for network in networks {
                    if let Some(pod) = measured.get_mut(&network.pod_uid) {
                        pod.network = Some(network);
                    }
                }
            }
            Err(err) => tracing::debug!(error = %kubelet_core::ErrorChain(&err), "cannot read the pods' networks"),
        }
        (measured, failed)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::rank::DiskUsage;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
            "spec": {"containers": [{"name": "app"}, {"name": "side"}]},
        }))
        .unwrap()
    }

    fn status() -> PodStatus {
        let running = ContainerState {
            running: Some(ContainerStateRunning { started_at: Some(Time(at(1_700_000_100))) }),
            ..ContainerState::default()
        };
        PodStatus {
            start_time: Some(Time(at(1_700_000_000))),
            container_statuses: Some(vec![ContainerStatus {
                name: "app".to_owned(),
                state: Some(running),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        }
    }

    fn stats() -> PodStats {
        let app = ContainerUsage {
            name: "app".to_owned(),
            memory_working_set: Some(4 << 20),
            cpu: Some((1_500_000_000, Some(1_700_000_200_000_000_000))),
            rootfs: Some(DiskUsage::new(8192, 2)),
            logs: Some(DiskUsage::new(4096, 1)),
            ..ContainerUsage::default()
        };
        let side = ContainerUsage {
            name: "side".to_owned(),
            memory_working_set: Some(1 << 20),
            cpu: Some((500_000_000, None)),
            ..ContainerUsage::default()
        };
        PodStats {
            containers: vec![app, side],
            volumes: vec![("cache".to_owned(), DiskUsage::new(4096, 3))],
            processes: Some(7),
            network: Some(network()),
            ..PodStats::default()
        }
    }

    fn interface(name: &str, rx_bytes: u64, tx_bytes: u64) -> InterfaceStats {
        let mut interface = InterfaceStats::new(name);
        interface.rx_bytes = Some(rx_bytes);
        interface.rx_errors = Some(0);
        interface.tx_bytes = Some(tx_bytes);
        interface.tx_errors = Some(1);
        interface
    }

    fn network() -> kubelet_core::runtime::PodNetworkStats {
        let mut network = kubelet_core::runtime::PodNetworkStats::new(kubelet_core::PodUid::new("u1"));
        network.default_interface = Some(interface("eth0", 1580, 542));
        network.interfaces = vec![interface("net1", 10, 20)];
        network
    }

    fn node() -> NodeSample {
        let mut node = NodeSample::new(at(1_700_000_300));
        node.cpu_usage_core_nanoseconds = Some(90_000_000_000);
        node.memory = Some(Observation::new(6 << 30, 8 << 30));
        node.fs = Some(FsStats::new(100 << 30, 40 << 30).with_inodes(1000, 600));
        node.network = vec![interface("ens3", 5000, 6000), interface("eth0", 7000, 8000)];
        node
    }

    #[test]
    fn usage_nano_cores_is_the_rate_since_the_last_reading() {
        let second = 1_000_000_000;
        let mut readings = CpuReadings::default();
        assert_eq!(readings.rate("c1", second as u64, 0), None, "a first reading");
        assert_eq!(readings.rate("c1", 1_500_000_000, second), Some(500_000_000), "half a core for a second");
        assert_eq!(readings.rate("c1", 3_000_000_000, 2 * second), Some(1_000_000_000), "still from the first reading");
        assert_eq!(readings.rate("c1", 11_000_000_000, 10 * second), Some(1_000_000_000), "a window old: replaced");
        assert_eq!(readings.rate("c1", 12_000_000_000, 11 * second), Some(1_000_000_000), "from the new one");
        assert_eq!(readings.rate("c1", 1_000, 12 * second), None, "a counter that went back: a new instance");
        assert_eq!(readings.rate("c1", 2_000, 12 * second), None, "no time passed");
        assert_eq!(readings.rate("c1", 3_000, 700 * second), None, "a reading too old to say");
        readings.rate(NODE_KEY, 1, 1);
        readings.keep_only(&HashSet::new());
        assert_eq!(readings.0.keys().collect::<Vec<_>>(), [NODE_KEY], "gone containers are forgotten");
    }

    #[test]
    fn a_pods_usage_nano_cores_is_its_containers_sum() {
        let (pod, status, mut stats) = (pod(), status(), stats());
        let rate = |stats: &PodStats| {
            let summary = summary("node-1", &node(), &[PodSample::new(&pod, Some(&status), stats)]);
            summary["pods"][0]["cpu"]["usageNanoCores"].as_u64()
        };
        assert_eq!(rate(&stats), None, "no container has a rate yet");
        stats.containers[0].cpu_usage_nano_cores = Some(300);
        assert_eq!(rate(&stats), Some(300), "one without a rate counts as none");
        stats.containers[1].cpu_usage_nano_cores = Some(200);
        assert_eq!(rate(&stats), Some(500));
    }

    #[test]
    fn the_summary_has_upstreams_shape() {
        let (pod, status, stats) = (pod(), status(), stats());
        let summary = summary("node-1", &node(), &[PodSample::new(&pod, Some(&status), &stats)]);
        assert_eq!(summary["node"]["nodeName"], "node-1");
        assert_eq!(summary["node"]["cpu"]["usageCoreNanoSeconds"], 90_000_000_000u64);
        assert_eq!(summary["node"]["memory"]["workingSetBytes"], 2u64 << 30);
        assert_eq!(summary["node"]["fs"]["usedBytes"], 60u64 << 30);
        assert_eq!(summary["node"]["fs"]["inodesUsed"], 400);
        let pod = &summary["pods"][0];
        assert_eq!(pod["podRef"], json!({"name": "web", "namespace": "shop", "uid": "u1"}));
        assert_eq!(pod["startTime"], "2023-11-14T22:13:20Z");
        assert_eq!(pod["cpu"]["usageCoreNanoSeconds"], 2_000_000_000u64, "its containers' sum");
        assert_eq!(pod["memory"]["workingSetBytes"], 5u64 << 20);
        assert_eq!(pod["containers"][0]["startTime"], "2023-11-14T22:15:00Z");
        assert_eq!(pod["containers"][0]["cpu"]["time"], "2023-11-14T22:16:40Z", "the runtime's read time");
        assert_eq!(pod["containers"][0]["rootfs"]["usedBytes"], 8192);
        assert_eq!(pod["volume"][0]["name"], "cache");
        assert_eq!(pod["ephemeral-storage"]["usedBytes"], 8192 + 4096 + 4096, "rootfs, logs and emptyDir");
        assert_eq!(pod["process_stats"]["process_count"], 7);
        let network = &pod["network"];
        assert_eq!(
            (&network["name"], &network["rxBytes"], &network["txBytes"], &network["txErrors"]),
            (&json!("eth0"), &json!(1580), &json!(542), &json!(1)),
            "the default interface leads: {network}"
        );
        assert_eq!(network["interfaces"][1]["name"], "net1");
        assert_eq!(network["time"], "2023-11-14T22:18:20Z");
        let network = &summary["node"]["network"];
        assert_eq!((&network["name"], &network["rxBytes"]), (&json!("eth0"), &json!(7000)), "eth0 leads: {network}");
        assert_eq!(network["interfaces"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn resource_metrics_have_upstreams_names_labels_and_times() {
        let (pod, status, stats) = (pod(), status(), stats());
        let text = resource_metrics(&node(), &[PodSample::new(&pod, Some(&status), &stats)], false);
        for line in [
            "# HELP container_cpu_usage_seconds_total [ALPHA] Cumulative cpu time consumed by the container in core-seconds",
            "# TYPE container_cpu_usage_seconds_total counter",
            "container_cpu_usage_seconds_total{container=\"app\",namespace=\"shop\",pod=\"web\"} 1.5 1700000200000",
            "container_cpu_usage_seconds_total{container=\"side\",namespace=\"shop\",pod=\"web\"} 0.5 1700000300000",
            "container_memory_working_set_bytes{container=\"app\",namespace=\"shop\",pod=\"web\"} 4194304 1700000300000",
            "container_start_time_seconds{container=\"app\",namespace=\"shop\",pod=\"web\"} 1700000100 1700000100000",
            "node_cpu_usage_seconds_total 90 1700000300000",
            "node_memory_working_set_bytes 2147483648 1700000300000",
            "pod_cpu_usage_seconds_total{namespace=\"shop\",pod=\"web\"} 2 1700000300000",
            "pod_memory_working_set_bytes{namespace=\"shop\",pod=\"web\"} 5242880 1700000300000",
            "scrape_error 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\nin:\n{text}");
        }
        assert!(!text.contains("container_start_time_seconds{container=\"side\""), "side has no start time");
    }

    #[test]
    fn cadvisor_metrics_have_cadvisors_names_and_labels() {
        let mut pod = pod();
        if let Some(spec) = pod.spec.as_mut() {
            spec.containers[0].image = Some("registry.local/app:1".to_owned());
        }
        let (status, mut stats) = (status(), stats());
        stats.cgroup = Some("/kubepods/besteffort/podu1".to_owned());
        stats.containers[0].id = Some("c0ffee".to_owned());
        let text = cadvisor_metrics(&node(), &[PodSample::new(&pod, Some(&status), &stats)]);
        let app = "container=\"app\",cpu=\"total\",id=\"/kubepods/besteffort/podu1/c0ffee\",\
                   image=\"registry.local/app:1\",name=\"c0ffee\",namespace=\"shop\",pod=\"web\"";
        let network = "container=\"\",id=\"/kubepods/besteffort/podu1\",image=\"\",interface=\"eth0\",name=\"\",\
                       namespace=\"shop\",pod=\"web\"";
        for line in [
            "# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.".to_owned(),
            "# TYPE container_cpu_usage_seconds_total counter".to_owned(),
            format!("container_cpu_usage_seconds_total{{{app}}} 1.5 1700000200000"),
            "container_cpu_usage_seconds_total{container=\"\",cpu=\"total\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 90 1700000300000".to_owned(),
            format!("container_memory_working_set_bytes{{{}}} 4194304 1700000300000", app.replace("cpu=\"total\",", "")),
            "container_memory_working_set_bytes{container=\"\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"} 2147483648 1700000300000".to_owned(),
            format!("container_start_time_seconds{{{}}} 1700000100 1700000300000", app.replace("cpu=\"total\",", "")),
            format!("container_network_receive_bytes_total{{{network}}} 1580 1700000300000"),
            format!("container_network_transmit_errors_total{{{network}}} 1 1700000300000"),
            format!("container_network_transmit_bytes_total{{{}}} 20 1700000300000", network.replace("eth0", "net1")),
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\nin:\n{text}");
        }
    }
}
