//! The kubelet's configuration file: `KubeletConfiguration` (`kubelet.config.k8s.io/v1beta1`).
//!
//! [`KubeletConfiguration::from_yaml`] knows every field of upstream's file ([`FIELDS`]) and
//! gives each one of three outcomes ([`Support`]): honoured, with upstream's defaults and Go's
//! duration syntax (`"20s"`, `"1m0s"`, `"1h30m"`, `"500ms"`); accepted without effect, listed in
//! [`KubeletConfiguration::without_effect`] for one start-up warning; or accepted only with a
//! value that asks for nothing the agent lacks. Unknown fields (with the closest upstream name
//! as a suggestion) and invalid values are an [`Error`] naming the field and its line.
//! Upstream: `pkg/kubelet/apis/config/v1beta1/defaults.go`.

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet_core::resources::parse_quantity;

mod fields;
mod server;
mod versioned;

pub use fields::{FIELDS, Support, describe, support};
pub use server::{Authentication, Authorization, AuthorizationMode, ServerConfiguration};

/// The only `apiVersion` accepted.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only `kind` accepted.
pub const KIND: &str = "KubeletConfiguration";

/// The requests per second client-go gives a client whose configuration says 0, which is what
/// upstream's `eventRecordQPS: 0` comes to (its `--event-qps` help: "If 0 will use DefaultQPS: 5").
const CLIENT_GO_DEFAULT_QPS: f64 = 5.0;

/// A configuration file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}{message}", field.as_ref().map(|f| format!("field {f}: ")).unwrap_or_default(), line.map(|l| format!("line {l}: ")).unwrap_or_default())]
#[non_exhaustive]
pub struct Error {
    /// The field, when known.
    pub field: Option<String>,
    /// The 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

/// The fields of `KubeletConfiguration` this agent implements, defaults applied.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct KubeletConfiguration {
    /// `staticPodPath`: a directory or file of static pod manifests.
    pub static_pod_path: Option<PathBuf>,
    /// `staticPodURL`: a URL serving static pod manifests.
    pub static_pod_url: Option<String>,
    /// `staticPodURLHeader`: headers sent with `staticPodURL` requests.
    pub static_pod_url_header: BTreeMap<String, Vec<String>>,
    /// `fileCheckFrequency` (20s).
    pub file_check_frequency: Duration,
    /// `httpCheckFrequency` (20s).
    pub http_check_frequency: Duration,
    /// `syncFrequency` (1m): the periodic resync of running pods.
    pub sync_frequency: Duration,
    /// `containerRuntimeEndpoint` (`unix:///run/containerd/containerd.sock`).
    pub container_runtime_endpoint: String,
    /// `imageServiceEndpoint` (the runtime endpoint when unset).
    pub image_service_endpoint: Option<String>,
    /// `runtimeRequestTimeout` (2m): the timeout of every CRI call but long-running ones.
    pub runtime_request_timeout: Duration,
    /// `podLogsDir` (`/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// `maxPods` (110).
    pub max_pods: u32,
    /// `address` (0.0.0.0): where the kubelet API and the read-only API listen.
    pub address: IpAddr,
    /// The kubelet API on `port`: `enableServer`, `port`, `tls*`, `authentication`,
    /// `authorization`.
    pub server: ServerConfiguration,
    /// `readOnlyPort` (0: disabled).
    pub read_only_port: u16,
    /// `healthzBindAddress` (127.0.0.1).
    pub healthz_bind_address: IpAddr,
    /// `healthzPort` (10248; 0 disables it).
    pub healthz_port: u16,
    /// `cgroupDriver`: only `cgroupfs`.
    pub cgroup_driver: String,
    /// `cgroupRoot`: the cgroup under which the pods' `kubepods` hierarchy goes ("" is `/`).
    pub cgroup_root: String,
    /// `systemReserved`: resources set aside for the OS (`cpu`, `memory`).
    pub system_reserved: BTreeMap<String, String>,
    /// `kubeReserved`: resources set aside for the kubelet and runtime (`cpu`, `memory`).
    pub kube_reserved: BTreeMap<String, String>,
    /// `serializeImagePulls` (true): pull one image at a time.
    pub serialize_image_pulls: bool,
    /// `maxParallelImagePulls`: the limit when pulls are not serialized (none: no limit).
    pub max_parallel_image_pulls: Option<u32>,
    /// `registryPullQPS` (5, a whole number as upstream's int32): image pulls a second; 0: no
    /// limit.
    pub registry_pull_qps: i32,
    /// `registryBurst` (10): the pulls a quiet node may start at once.
    pub registry_burst: u32,
    /// `clusterDNS`: the cluster's DNS servers, for `ClusterFirst` pods (none: the node's resolver).
    pub cluster_dns: Vec<IpAddr>,
    /// `clusterDomain`: the cluster's DNS domain, searched by `ClusterFirst` pods.
    pub cluster_domain: String,
    /// `allowedUnsafeSysctls`: the unsafe sysctls (or `prefix*` patterns) pods may set.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// `resolvConf` (`/etc/resolv.conf`): the node's resolver configuration, the base of pods'
    /// DNS; `None` (an empty string in the file) gives pods no DNS from the node.
    pub resolv_conf: Option<PathBuf>,
    /// `failSwapOn` (true): refuse to start on a node with swap on.
    pub fail_swap_on: bool,
    /// `oomScoreAdj` (-999): the agent's own `oom_score_adj`.
    pub oom_score_adj: i32,
    /// `failCgroupV1`: refuse to start on a cgroup v1 node (false here; upstream's default is true).
    pub fail_cgroup_v1: bool,
    /// `logging.format`: `text` or `json` (none: the flag's or text).
    pub logging_format: Option<String>,
    /// `logging.verbosity`, as `--v` (none: the flag's or 0).
    pub verbosity: Option<u8>,
    /// `registerNode` (true): with `--kubeconfig`, register the Node with the API server.
    pub register_node: bool,
    /// `rotateCertificates` (false): ask for a new client certificate as the current one nears
    /// its end, and use it without a restart.
    pub rotate_certificates: bool,
    /// `serverTLSBootstrap` (false): the kubelet API's certificate comes from the API server (a
    /// `kubernetes.io/kubelet-serving` CertificateSigningRequest) and is renewed the same way.
    pub server_tls_bootstrap: bool,
    /// `registerWithTaints`: the taints the Node registers with.
    pub register_with_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// `providerID`: the Node's `spec.providerID` (none: unset), which a cloud's controllers
    /// match the node to its machine by.
    pub provider_id: Option<String>,
    /// `enableSystemLogHandler` (true): the kubelet API serves `/var/log` at `/logs/` (with
    /// `enableDebuggingHandlers`).
    pub enable_system_log_handler: bool,
    /// `enableDebugFlagsHandler` (true): the kubelet API takes a new verbosity at
    /// `/debug/flags/v` (with `enableDebuggingHandlers`).
    pub enable_debug_flags_handler: bool,
    /// `localStorageCapacityIsolation` (true): the node has `ephemeral-storage` capacity and
    /// allocatable, pods' requests of it are admitted against them, and emptyDir `sizeLimit`s and
    /// `ephemeral-storage` limits are policed by eviction; false turns all of it off, as
    /// upstream's.
    pub local_storage_capacity_isolation: bool,
    /// `nodeStatusUpdateFrequency` (10s): how often the Node's status is computed.
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency` (5m): how often an unchanged Node status is reported anyway.
    pub node_status_report_frequency: Duration,
    /// `nodeLeaseDurationSeconds` (40): the node lease's duration, renewed every quarter of it.
    pub node_lease_duration_seconds: i32,
    /// `kubeAPIQPS` (50): the API client's average requests per second (0: the default).
    pub kube_api_qps: f64,
    /// `kubeAPIBurst` (100): the API client's burst (0: the default).
    pub kube_api_burst: u32,
    /// `eventRecordQPS` (50): the event client's average event creations per second, a budget
    /// of its own beside `kubeAPIQPS` (0: client-go's default of 5, as upstream's flag says).
    pub event_record_qps: f64,
    /// `eventBurst` (100): the event client's burst (0: the default).
    pub event_burst: u32,
    /// `imageGCHighThresholdPercent` (85): image GC starts at this image filesystem usage; 100
    /// turns it off.
    pub image_gc_high_threshold_percent: u32,
    /// `imageGCLowThresholdPercent` (80): image GC brings the usage down to this.
    pub image_gc_low_threshold_percent: u32,
    /// `imageMinimumGCAge` (2m): an image seen for less long is never collected.
    pub image_minimum_gc_age: Duration,
    /// `imageMaximumGCAge` (0, off): an image unused for longer is collected.
    pub image_maximum_gc_age: Option<Duration>,
    /// `enforceNodeAllocatable` (`[pods]`): with `pods`, the `kubepods` cgroup is limited to
    /// the node's allocatable; empty (or `none`), to its capacity. With `system-reserved` and
    /// `kube-reserved`, the cgroups `systemReservedCgroup` and `kubeReservedCgroup` are limited
    /// to `systemReserved` and `kubeReserved`.
    pub enforce_node_allocatable: Vec<String>,
    /// `systemReservedCgroup`: the existing cgroup of the system daemons, limited to
    /// `systemReserved` when `enforceNodeAllocatable` holds `system-reserved`.
    pub system_reserved_cgroup: String,
    /// `kubeReservedCgroup`: the existing cgroup of the Kubernetes daemons, limited to
    /// `kubeReserved` when `enforceNodeAllocatable` holds `kube-reserved`.
    pub kube_reserved_cgroup: String,
    /// `podPidsLimit` (-1): the most processes in one pod; `None` is no limit.
    pub pod_pids_limit: Option<i64>,
    /// `containerLogMaxSize` (10Mi): a running container's log is rotated once it is this
    /// large, in bytes; `None` (a negative size) turns rotation off.
    pub container_log_max_size: Option<u64>,
    /// `containerLogMaxFiles` (5): the most log files a container keeps, the live one included.
    pub container_log_max_files: u32,
    /// `containerLogMaxWorkers` (1): how many containers' logs are rotated at once.
    pub container_log_max_workers: u32,
    /// `containerLogMonitorInterval` (10s): how often the logs are checked for rotation.
    pub container_log_monitor_interval: Duration,
    /// `nodeStatusMaxImages` (50): the most images the Node's status lists; `None` (-1) lists
    /// them all.
    pub node_status_max_images: Option<usize>,
    /// `evictionHard` (upstream's Linux defaults: `memory.available<100Mi`,
    /// `nodefs.available<10%`, `nodefs.inodesFree<5%`, `imagefs.available<15%`); a map given
    /// replaces them, unless `mergeDefaultEvictionSettings` fills in the signals it leaves out.
    pub eviction_hard: BTreeMap<String, String>,
    /// `evictionSoft`: thresholds that evict only once crossed for their grace period.
    pub eviction_soft: BTreeMap<String, String>,
    /// `evictionSoftGracePeriod`: each soft threshold's grace period.
    pub eviction_soft_grace_period: BTreeMap<String, String>,
    /// `evictionMinimumReclaim`: how much beyond a threshold must be free again.
    pub eviction_minimum_reclaim: BTreeMap<String, String>,
    /// `evictionPressureTransitionPeriod` (5m): how long a pressure condition outlasts its
    /// threshold.
    pub eviction_pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod` (0): the most grace a pod evicted for a soft threshold gets;
    /// 0 or less gives it none beyond the minimum.
    pub eviction_max_pod_grace_period: i64,
    /// The fields set in the file that have no effect in this agent ([`Support::WithoutEffect`]),
    /// for one start-up warning.
    pub without_effect: Vec<String>,
}

impl Default for KubeletConfiguration {
    fn default() -> Self {
        KubeletConfiguration {
            static_pod_path: None,
            static_pod_url: None,
            static_pod_url_header: BTreeMap::new(),
            file_check_frequency: Duration::from_secs(20),
            http_check_frequency: Duration::from_secs(20),
            sync_frequency: Duration::from_secs(60),
            container_runtime_endpoint: "unix:///run/containerd/containerd.sock".to_owned(),
            image_service_endpoint: None,
            runtime_request_timeout: Duration::from_secs(120),
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            max_pods: 110,
            address: IpAddr::from([0, 0, 0, 0]),
            server: ServerConfiguration::default(),
            read_only_port: 0,
            healthz_bind_address: IpAddr::from([127, 0, 0, 1]),
            healthz_port: 10248,
            cgroup_driver: "cgroupfs".to_owned(),
            cgroup_root: String::new(),
            system_reserved: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            serialize_image_pulls: true,
            max_parallel_image_pulls: None,
            registry_pull_qps: 5,
            registry_burst: 10,
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            allowed_unsafe_sysctls: Vec::new(),
            resolv_conf: Some(PathBuf::from("/etc/resolv.conf")),
            fail_swap_on: true,
            oom_score_adj: -999,
            fail_cgroup_v1: false,
            logging_format: None,
            verbosity: None,
            register_node: true,
            rotate_certificates: false,
            server_tls_bootstrap: false,
            node_lease_duration_seconds: 40,
            kube_api_qps: 50.0,
            kube_api_burst: 100,
            event_record_qps: 50.0,
            event_burst: 100,
            register_with_taints: Vec::new(),
            provider_id: None,
            enable_system_log_handler: true,
            enable_debug_flags_handler: true,
            local_storage_capacity_isolation: true,
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            image_minimum_gc_age: Duration::from_secs(120),
            image_maximum_gc_age: None,
            enforce_node_allocatable: vec!["pods".to_owned()],
            system_reserved_cgroup: String::new(),
            kube_reserved_cgroup: String::new(),
            pod_pids_limit: None,
            container_log_max_size: Some(10 * 1024 * 1024),
            container_log_max_files: 5,
            container_log_max_workers: 1,
            container_log_monitor_interval: Duration::from_secs(10),
            node_status_max_images: Some(50),
            eviction_hard: default_eviction_hard(),
            eviction_soft: BTreeMap::new(),
            eviction_soft_grace_period: BTreeMap::new(),
            eviction_minimum_reclaim: BTreeMap::new(),
            eviction_pressure_transition_period: Duration::from_secs(300),
            eviction_max_pod_grace_period: 0,
            without_effect: Vec::new(),
        }
    }
}

/// The honoured fields as written: every one optional, durations and addresses as text (the
/// others are checked against [`FIELDS`] before).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    api_version: Option<String>,
    kind: Option<String>,
    static_pod_path: Option<String>,
    #[serde(rename = "staticPodURL")]
    static_pod_url: Option<String>,
    #[serde(rename = "staticPodURLHeader")]
    static_pod_url_header: Option<BTreeMap<String, Vec<String>>>,
    file_check_frequency: Option<String>,
    http_check_frequency: Option<String>,
    sync_frequency: Option<String>,
    container_runtime_endpoint: Option<String>,
    image_service_endpoint: Option<String>,
    runtime_request_timeout: Option<String>,
    pod_logs_dir: Option<String>,
    max_pods: Option<u32>,
    address: Option<String>,
    read_only_port: Option<u16>,
    healthz_bind_address: Option<String>,
    healthz_port: Option<u16>,
    cgroup_driver: Option<String>,
    cgroup_root: Option<String>,
    system_reserved: Option<BTreeMap<String, String>>,
    kube_reserved: Option<BTreeMap<String, String>>,
    serialize_image_pulls: Option<bool>,
    max_parallel_image_pulls: Option<u32>,
    #[serde(rename = "registryPullQPS")]
    registry_pull_qps: Option<i32>,
    registry_burst: Option<i64>,
    #[serde(rename = "clusterDNS")]
    cluster_dns: Option<Vec<String>>,
    cluster_domain: Option<String>,
    allowed_unsafe_sysctls: Option<Vec<String>>,
    resolv_conf: Option<String>,
    fail_swap_on: Option<bool>,
    oom_score_adj: Option<i32>,
    fail_cgroup_v1: Option<bool>,
    logging: Option<RawLogging>,
    register_node: Option<bool>,
    rotate_certificates: Option<bool>,
    #[serde(rename = "serverTLSBootstrap")]
    server_tls_bootstrap: Option<bool>,
    node_lease_duration_seconds: Option<i32>,
    #[serde(rename = "kubeAPIQPS")]
    kube_api_qps: Option<f64>,
    #[serde(rename = "kubeAPIBurst")]
    kube_api_burst: Option<u32>,
    #[serde(rename = "eventRecordQPS")]
    event_record_qps: Option<f64>,
    event_burst: Option<u32>,
    register_with_taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,
    #[serde(rename = "providerID")]
    provider_id: Option<String>,
    enable_system_log_handler: Option<bool>,
    enable_debug_flags_handler: Option<bool>,
    local_storage_capacity_isolation: Option<bool>,
    node_status_update_frequency: Option<String>,
    node_status_report_frequency: Option<String>,
    container_log_max_size: Option<String>,
    enforce_node_allocatable: Option<Vec<String>>,
    system_reserved_cgroup: Option<String>,
    kube_reserved_cgroup: Option<String>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    image_gc_high_threshold_percent: Option<i64>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    image_gc_low_threshold_percent: Option<i64>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<String>,
    #[serde(rename = "imageMaximumGCAge")]
    image_maximum_gc_age: Option<String>,
    pod_pids_limit: Option<i64>,
    container_log_max_files: Option<i64>,
    container_log_max_workers: Option<i64>,
    container_log_monitor_interval: Option<String>,
    node_status_max_images: Option<i64>,
    eviction_hard: Option<BTreeMap<String, String>>,
    eviction_soft: Option<BTreeMap<String, String>>,
    eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    eviction_pressure_transition_period: Option<String>,
    eviction_max_pod_grace_period: Option<i64>,
    merge_default_eviction_settings: Option<bool>,
}

fn default_eviction_hard() -> BTreeMap<String, String> {
    kubelet_core::eviction::DEFAULT_EVICTION_HARD.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

/// `enforceNodeAllocatable`'s values (upstream's validation): `pods`, `system-reserved` and
/// `kube-reserved`, or `none` alone.
fn check_enforce_node_allocatable(enforced: &[String]) -> Result<(), String> {
    if enforced.iter().any(|e| e == "none") && enforced.len() > 1 {
        return Err("none cannot be combined with other values".to_owned());
    }
    match enforced.iter().find(|e| !matches!(e.as_str(), "pods" | "system-reserved" | "kube-reserved" | "none")) {
        Some(other) => Err(format!(
            "{other:?} is not supported: only \"pods\", \"system-reserved\", \"kube-reserved\" or \"none\""
        )),
        None => Ok(()),
    }
}

/// A cgroup name from the configuration: empty (none) or an absolute cgroup path.
fn check_cgroup_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.starts_with('/') {
        Ok(())
    } else {
        Err(format!("{name:?} must be an absolute cgroup path"))
    }
}

/// The part of upstream's `LoggingConfiguration` this agent reads.
#[derive(Debug, Deserialize)]
struct RawLogging {
    format: Option<String>,
    verbosity: Option<u8>,
}

impl KubeletConfiguration {
    /// Reads a configuration file's text.
    pub fn from_yaml(text: &str) -> Result<Self, Error> {
        let at =
            |field: &str, message: String| Error { field: Some(field.to_owned()), line: line_of(text, field), message };
        // Every field is upstream's, and those this agent does not honour ask for nothing it lacks.
        let fields: serde_json::Map<String, serde_json::Value> =
            serde_saphyr::from_str(text).map_err(|e| decode_error(text, &e.to_string()))?;
        let mut without_effect = Vec::new();
        for (field, value) in &fields {
            match support(field) {
                Some(Support::Honoured) => {}
                Some(Support::WithoutEffect) => without_effect.push(field.clone()),
                Some(Support::DefaultOnly) => fields::check_default(field, value).map_err(|m| at(field, m))?,
                None if field == "apiVersion" || field == "kind" => {}
                None => {
                    let hint = fields::closest(field).map(|c| format!(", did you mean {c:?}?")).unwrap_or_default();
                    return Err(at(field, format!("unknown field {field:?}{hint}")));
                }
            }
        }
        let raw: Raw = serde_saphyr::from_str(text).map_err(|e| decode_error(text, &e.to_string()))?;
        match raw.api_version.as_deref() {
            Some(API_VERSION) => {}
            Some(other) => return Err(at("apiVersion", format!("must be {API_VERSION}, not {other:?}"))),
            None => return Err(at("apiVersion", format!("missing: must be {API_VERSION}"))),
        }
        match raw.kind.as_deref() {
            Some(KIND) => {}
            Some(other) => return Err(at("kind", format!("must be {KIND}, not {other:?}"))),
            None => return Err(at("kind", format!("missing: must be {KIND}"))),
        }
        let mut config = KubeletConfiguration::default();
        config.read_log_rotation(&raw, &at)?;
        config.read_image_gc(&raw, &at)?;
        config.read_eviction(&raw, &at)?;
        let server: server::RawServer = serde_saphyr::from_str(text).map_err(|e| decode_error(text, &e.to_string()))?;
        config.server = server.read(&at)?;
        // Zero is "the default", as upstream's defaulting has it (kubeadm writes `0s` so).
        let duration = |field: &str, value: Option<String>, default: Duration| match value {
            None => Ok(default),
            Some(text) => match parse_duration(&text).map_err(|message| at(field, message))? {
                Duration::ZERO => Ok(default),
                set => Ok(set),
            },
        };
        config.file_check_frequency =
            duration("fileCheckFrequency", raw.file_check_frequency, config.file_check_frequency)?;
        config.http_check_frequency =
            duration("httpCheckFrequency", raw.http_check_frequency, config.http_check_frequency)?;
        config.sync_frequency = duration("syncFrequency", raw.sync_frequency, config.sync_frequency)?;
        config.runtime_request_timeout =
            duration("runtimeRequestTimeout", raw.runtime_request_timeout, config.runtime_request_timeout)?;
        config.node_status_update_frequency = duration(
            "nodeStatusUpdateFrequency",
            raw.node_status_update_frequency,
            config.node_status_update_frequency,
        )?;
        config.node_status_report_frequency = duration(
            "nodeStatusReportFrequency",
            raw.node_status_report_frequency,
            config.node_status_report_frequency,
        )?;
        config.register_node = raw.register_node.unwrap_or(true);
        config.rotate_certificates = raw.rotate_certificates.unwrap_or(false);
        config.server_tls_bootstrap = raw.server_tls_bootstrap.unwrap_or(false);
        match raw.node_status_max_images {
            Some(-1) => config.node_status_max_images = None,
            Some(max) => {
                let max =
                    usize::try_from(max).map_err(|_| at("nodeStatusMaxImages", format!("{max} must be >= -1")))?;
                config.node_status_max_images = Some(max);
            }
            None => {}
        }
        match raw.node_lease_duration_seconds {
            Some(seconds) if seconds < 0 => {
                return Err(at("nodeLeaseDurationSeconds", format!("{seconds} is negative")));
            }
            Some(seconds) if seconds > 0 => config.node_lease_duration_seconds = seconds,
            _ => {}
        }
        match raw.kube_api_qps {
            Some(qps) if qps < 0.0 => return Err(at("kubeAPIQPS", format!("{qps} is negative"))),
            Some(qps) if qps > 0.0 => config.kube_api_qps = qps,
            _ => {}
        }
        config.kube_api_burst = raw.kube_api_burst.filter(|b| *b > 0).unwrap_or(config.kube_api_burst);
        match raw.event_record_qps {
            Some(qps) if qps < 0.0 => return Err(at("eventRecordQPS", format!("{qps} is negative"))),
            Some(0.0) => config.event_record_qps = CLIENT_GO_DEFAULT_QPS,
            Some(qps) => config.event_record_qps = qps,
            None => {}
        }
        config.event_burst = raw.event_burst.filter(|b| *b > 0).unwrap_or(config.event_burst);
        config.register_with_taints = raw.register_with_taints.unwrap_or_default();
        config.provider_id = raw.provider_id.filter(|id| !id.is_empty());
        config.enable_system_log_handler = raw.enable_system_log_handler.unwrap_or(true);
        config.enable_debug_flags_handler = raw.enable_debug_flags_handler.unwrap_or(true);
        config.local_storage_capacity_isolation = raw.local_storage_capacity_isolation.unwrap_or(true);
        for taint in &config.register_with_taints {
            if !matches!(taint.effect.as_str(), "NoSchedule" | "PreferNoSchedule" | "NoExecute") || taint.key.is_empty()
            {
                return Err(at(
                    "registerWithTaints",
                    format!(
                        "{:?}: a taint needs a key and the effect NoSchedule, PreferNoSchedule or NoExecute",
                        taint.key
                    ),
                ));
            }
        }
        let address = |field: &str, value: Option<String>, default: IpAddr| match value {
            None => Ok(default),
            Some(text) => text.parse().map_err(|_| at(field, format!("{text:?} is not an IP address"))),
        };
        config.address = address("address", raw.address, config.address)?;
        config.healthz_bind_address =
            address("healthzBindAddress", raw.healthz_bind_address, config.healthz_bind_address)?;
        config.static_pod_path = raw.static_pod_path.filter(|p| !p.is_empty()).map(PathBuf::from);
        config.static_pod_url = raw.static_pod_url.filter(|u| !u.is_empty());
        if let Some(url) = config.static_pod_url.as_ref().filter(|u| !u.starts_with("http://")) {
            return Err(at("staticPodURL", format!("{url:?} is not an http:// URL (the HTTP source has no TLS yet)")));
        }
        config.static_pod_url_header = raw.static_pod_url_header.unwrap_or_default();
        if let Some(endpoint) = raw.container_runtime_endpoint.filter(|e| !e.is_empty()) {
            config.container_runtime_endpoint = endpoint;
        }
        config.image_service_endpoint = raw.image_service_endpoint.filter(|e| !e.is_empty());
        if let Some(dir) = raw.pod_logs_dir {
            if !dir.starts_with('/') {
                return Err(at("podLogsDir", format!("{dir:?} must be an absolute path")));
            }
            config.pod_logs_dir = PathBuf::from(dir);
        }
        // 0 is "the default" too.
        config.max_pods = raw.max_pods.filter(|m| *m > 0).unwrap_or(config.max_pods);
        config.read_only_port = raw.read_only_port.unwrap_or(config.read_only_port);
        config.healthz_port = raw.healthz_port.unwrap_or(config.healthz_port);
        if let Some(driver) = raw.cgroup_driver.filter(|d| d != "cgroupfs") {
            return Err(at(
                "cgroupDriver",
                format!(
                    "{driver:?} is not supported: only \"cgroupfs\" (set cgroupDriver: cgroupfs here, and \
                     SystemdCgroup = false in containerd's runc options so the runtime uses the same driver)"
                ),
            ));
        }
        if let Some(enforced) = raw.enforce_node_allocatable {
            check_enforce_node_allocatable(&enforced).map_err(|m| at("enforceNodeAllocatable", m))?;
            config.enforce_node_allocatable = enforced.into_iter().filter(|e| e != "none").collect();
        }
        config.system_reserved_cgroup = raw.system_reserved_cgroup.unwrap_or_default();
        config.kube_reserved_cgroup = raw.kube_reserved_cgroup.unwrap_or_default();
        let reserved_cgroups = [
            ("systemReservedCgroup", "--system-reserved-cgroup", "system-reserved", &config.system_reserved_cgroup),
            ("kubeReservedCgroup", "--kube-reserved-cgroup", "kube-reserved", &config.kube_reserved_cgroup),
        ];
        for (field, flag, enforcement, cgroup) in reserved_cgroups {
            check_cgroup_name(cgroup).map_err(|m| at(field, m))?;
            if cgroup.is_empty() && config.enforce_node_allocatable.iter().any(|e| e == enforcement) {
                let message = format!(
                    "{field} ({flag}) must be specified when {enforcement:?} contained in enforceNodeAllocatable \
                     (--enforce-node-allocatable)"
                );
                return Err(at("enforceNodeAllocatable", message));
            }
        }
        config.pod_pids_limit = raw.pod_pids_limit.filter(|limit| *limit > 0);
        if let Some(root) = raw.cgroup_root {
            if !root.is_empty() && !root.starts_with('/') {
                return Err(at("cgroupRoot", format!("{root:?} must be an absolute cgroup path")));
            }
            config.cgroup_root = root;
        }
        for (field, reserved) in [("systemReserved", raw.system_reserved), ("kubeReserved", raw.kube_reserved)] {
            let reserved = reserved.unwrap_or_default();
            for (resource, quantity) in &reserved {
                if !matches!(resource.as_str(), "cpu" | "memory") {
                    return Err(at(field, format!("resource {resource:?} is not supported: only cpu and memory")));
                }
                if parse_quantity(quantity).is_none_or(|q| q < 0.0) {
                    return Err(at(field, format!("{resource}: {quantity:?} is not a quantity")));
                }
            }
            match field {
                "systemReserved" => config.system_reserved = reserved,
                _ => config.kube_reserved = reserved,
            }
        }
        for server in raw.cluster_dns.unwrap_or_default() {
            let ip = server.parse().map_err(|_| at("clusterDNS", format!("{server:?} is not an IP address")))?;
            config.cluster_dns.push(ip);
        }
        config.cluster_domain = raw.cluster_domain.unwrap_or_default().trim_end_matches('.').to_owned();
        config.allowed_unsafe_sysctls = raw.allowed_unsafe_sysctls.unwrap_or_default();
        kubelet_core::sysctl::check_allowed_unsafe(&config.allowed_unsafe_sysctls)
            .map_err(|message| at("allowedUnsafeSysctls", message))?;
        if let Some(path) = raw.resolv_conf {
            config.resolv_conf = (!path.is_empty()).then(|| PathBuf::from(path));
        }
        config.fail_swap_on = raw.fail_swap_on.unwrap_or(true);
        if let Some(adj) = raw.oom_score_adj {
            if !(-1000..=1000).contains(&adj) {
                return Err(at("oomScoreAdj", format!("{adj} is outside [-1000, 1000]")));
            }
            config.oom_score_adj = adj;
        }
        config.fail_cgroup_v1 = raw.fail_cgroup_v1.unwrap_or(false);
        if let Some(logging) = raw.logging {
            if let Some(format) = logging.format.as_deref().filter(|f| !matches!(*f, "text" | "json")) {
                return Err(at("format", format!("{format:?} is not a log format: text or json")));
            }
            config.logging_format = logging.format;
            config.verbosity = logging.verbosity;
        }
        config.without_effect = without_effect;
        config.serialize_image_pulls = raw.serialize_image_pulls.unwrap_or(true);
        config.max_parallel_image_pulls = raw.max_parallel_image_pulls;
        match raw.registry_pull_qps {
            Some(qps) if qps < 0 => {
                return Err(at("registryPullQPS", format!("{qps} must not be a negative number")));
            }
            Some(qps) => config.registry_pull_qps = qps,
            None => {}
        }
        match raw.registry_burst {
            Some(burst) if burst < 0 => {
                return Err(at("registryBurst", format!("{burst} must not be a negative number")));
            }
            Some(burst) => config.registry_burst = u32::try_from(burst).unwrap_or(u32::MAX),
            None => {}
        }
        if let Some(max) = config.max_parallel_image_pulls {
            if max == 0 {
                return Err(at("maxParallelImagePulls", "must be at least 1".to_owned()));
            }
            if config.serialize_image_pulls && max > 1 {
                return Err(at(
                    "maxParallelImagePulls",
                    "cannot be larger than 1 unless serializeImagePulls is false".to_owned(),
                ));
            }
        }
        Ok(config)
    }

    /// The image GC fields, with upstream's validation: percents from 0 to 100, the low one
    /// below the high one, and a maximum age above the minimum.
    fn read_image_gc(&mut self, raw: &Raw, at: &impl Fn(&str, String) -> Error) -> Result<(), Error> {
        let percent = |field: &str, value: Option<i64>, default: u32| match value {
            None => Ok(default),
            Some(p) => u32::try_from(p)
                .ok()
                .filter(|p| *p <= 100)
                .ok_or_else(|| at(field, format!("{p} must be between 0 and 100"))),
        };
        self.image_gc_high_threshold_percent = percent(
            "imageGCHighThresholdPercent",
            raw.image_gc_high_threshold_percent,
            self.image_gc_high_threshold_percent,
        )?;
        self.image_gc_low_threshold_percent = percent(
            "imageGCLowThresholdPercent",
            raw.image_gc_low_threshold_percent,
            self.image_gc_low_threshold_percent,
        )?;
        if self.image_gc_low_threshold_percent >= self.image_gc_high_threshold_percent {
            let message = format!(
                "{} must be less than imageGCHighThresholdPercent ({})",
                self.image_gc_low_threshold_percent, self.image_gc_high_threshold_percent
            );
            return Err(at("imageGCLowThresholdPercent", message));
        }
        if let Some(text) = raw.image_minimum_gc_age.as_deref() {
            let age = parse_duration(text).map_err(|m| at("imageMinimumGCAge", m))?;
            if !age.is_zero() {
                self.image_minimum_gc_age = age;
            }
        }
        if let Some(text) = raw.image_maximum_gc_age.as_deref() {
            let age = parse_duration(text).map_err(|m| at("imageMaximumGCAge", m))?;
            if !age.is_zero() && age <= self.image_minimum_gc_age {
                return Err(at("imageMaximumGCAge", format!("{text:?} must be greater than imageMinimumGCAge")));
            }
            self.image_maximum_gc_age = (!age.is_zero()).then_some(age);
        }
        Ok(())
    }

    /// The `eviction*` fields, checked as upstream's `ParseThresholdConfig` checks them.
    fn read_eviction(&mut self, raw: &Raw, at: &impl Fn(&str, String) -> Error) -> Result<(), Error> {
        if let Some(hard) = raw.eviction_hard.clone() {
            self.eviction_hard = hard;
        }
        if raw.merge_default_eviction_settings == Some(true) {
            for (signal, value) in default_eviction_hard() {
                self.eviction_hard.entry(signal).or_insert(value);
            }
        }
        self.eviction_soft = raw.eviction_soft.clone().unwrap_or_default();
        self.eviction_soft_grace_period = raw.eviction_soft_grace_period.clone().unwrap_or_default();
        self.eviction_minimum_reclaim = raw.eviction_minimum_reclaim.clone().unwrap_or_default();
        if let Some(text) = raw.eviction_pressure_transition_period.as_deref() {
            let period = parse_duration(text).map_err(|m| at("evictionPressureTransitionPeriod", m))?;
            if !period.is_zero() {
                self.eviction_pressure_transition_period = period;
            }
        }
        self.eviction_max_pod_grace_period = raw.eviction_max_pod_grace_period.unwrap_or(0);
        let field = if raw.eviction_soft.is_some() { "evictionSoft" } else { "evictionHard" };
        self.eviction_thresholds().map_err(|e| at(field, e.message))?;
        Ok(())
    }

    /// The eviction thresholds of `evictionHard`, `evictionSoft`, `evictionSoftGracePeriod` and
    /// `evictionMinimumReclaim`, with `allocatableMemory.available` copies when
    /// `enforceNodeAllocatable` holds `pods`.
    pub fn eviction_thresholds(
        &self,
    ) -> Result<kubelet_core::eviction::Thresholds, kubelet_core::eviction::ThresholdError> {
        kubelet_core::eviction::Thresholds::parse(
            &self.eviction_hard,
            &self.eviction_soft,
            &self.eviction_soft_grace_period,
            &self.eviction_minimum_reclaim,
            self.enforce_node_allocatable.iter().any(|e| e == "pods"),
        )
    }

    /// The `containerLog*` fields, with upstream's validation: at least 2 files, at least one
    /// worker, and a monitor interval of at least 3 s.
    fn read_log_rotation(&mut self, raw: &Raw, at: &impl Fn(&str, String) -> Error) -> Result<(), Error> {
        if let Some(text) = raw.container_log_max_size.as_deref() {
            let bytes = Quantity(text.to_owned());
            let size = kubelet_core::resources::units(&bytes)
                .ok_or_else(|| at("containerLogMaxSize", format!("{text:?} is not a quantity")))?;
            self.container_log_max_size = u64::try_from(size).ok();
        }
        if let Some(files) = raw.container_log_max_files {
            if files < 2 {
                return Err(at("containerLogMaxFiles", format!("{files} must be greater than 1")));
            }
            self.container_log_max_files = u32::try_from(files).unwrap_or(u32::MAX);
        }
        if let Some(workers) = raw.container_log_max_workers {
            if workers < 1 {
                return Err(at("containerLogMaxWorkers", format!("{workers} must be at least 1")));
            }
            self.container_log_max_workers = u32::try_from(workers).unwrap_or(u32::MAX);
        }
        if let Some(text) = raw.container_log_monitor_interval.as_deref() {
            let interval = parse_duration(text).map_err(|m| at("containerLogMonitorInterval", m))?;
            if interval < Duration::from_secs(3) {
                return Err(at("containerLogMonitorInterval", format!("{text:?} must be at least 3s")));
            }
            self.container_log_monitor_interval = interval;
        }
        Ok(())
    }

    /// How many image pulls may run at once: 1 when serialized, else `maxParallelImagePulls`
    /// (`None`: no limit).
    pub fn image_pull_limit(&self) -> Option<usize> {
        if self.serialize_image_pulls { Some(1) } else { self.max_parallel_image_pulls.map(|m| m as usize) }
    }

    /// CPU (millicores) and memory (bytes) reserved by `systemReserved` plus `kubeReserved`.
    pub fn reserved(&self) -> (i64, i64) {
        let sum = |resource: &str, scaled: fn(&Quantity) -> Option<i64>| -> i64 {
            [&self.system_reserved, &self.kube_reserved]
                .iter()
                .filter_map(|m| m.get(resource).and_then(|q| scaled(&Quantity(q.clone()))))
                .sum()
        };
        (sum("cpu", kubelet_core::resources::milli), sum("memory", kubelet_core::resources::units))
    }
}

pub use kubelet_core::clock::parse_duration;

/// The 1-based line where `field:` is first written as a key.
fn line_of(text: &str, field: &str) -> Option<usize> {
    text.lines()
        .position(|line| {
            let line = line.trim_start();
            line.strip_prefix(field).is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map(|i| i + 1)
}

/// A decoder error, with the field named when the message points at a line with a key.
fn decode_error(text: &str, message: &str) -> Error {
    let line = message
        .split("line ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<usize>().ok());
    let field =
        message.split("unknown field `").nth(1).and_then(|rest| rest.split('`').next()).map(str::to_owned).or_else(
            || {
                let line = text.lines().nth(line?.checked_sub(1)?)?;
                let key = line.trim_start().split(':').next()?.trim();
                (!key.is_empty() && !key.starts_with('#')).then(|| key.to_owned())
            },
        );
    let line = line.or_else(|| field.as_deref().and_then(|f| line_of(text, f)));
    Error { field, line, message: message.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    fn parse(body: &str) -> Result<KubeletConfiguration, Error> {
        KubeletConfiguration::from_yaml(&format!("{HEADER}{body}"))
    }

    #[test]
    fn defaults_are_upstreams() {
        let config = parse("").unwrap();
        assert_eq!(config, KubeletConfiguration::default());
        assert_eq!(config.sync_frequency, Duration::from_secs(60));
        assert_eq!(config.runtime_request_timeout, Duration::from_secs(120));
        assert_eq!(config.max_pods, 110);
        assert_eq!(config.healthz_port, 10248);
        assert_eq!(config.image_pull_limit(), Some(1));
        assert_eq!((config.event_record_qps, config.event_burst), (50.0, 100));
    }

    #[test]
    fn the_event_client_has_a_budget_of_its_own() {
        let config = parse("kubeAPIQPS: 10\nkubeAPIBurst: 20\neventRecordQPS: 3\neventBurst: 7\n").unwrap();
        assert_eq!((config.kube_api_qps, config.kube_api_burst), (10.0, 20));
        assert_eq!((config.event_record_qps, config.event_burst), (3.0, 7));
        // 0 is client-go's default, as upstream's `--event-qps` says; a burst of 0 is the default.
        let zero = parse("eventRecordQPS: 0\neventBurst: 0\n").unwrap();
        assert_eq!((zero.event_record_qps, zero.event_burst), (5.0, 100));
        let err = parse("eventRecordQPS: -1\n").unwrap_err().to_string();
        assert!(err.contains("eventRecordQPS"), "{err}");
    }

    #[test]
    fn every_field_reads() {
        let config = parse(
            "staticPodPath: /etc/kubernetes/manifests
staticPodURL: http://127.0.0.1:8080/pods
staticPodURLHeader:
  Authorization: [Bearer x]
fileCheckFrequency: 5s
httpCheckFrequency: 1m0s
syncFrequency: 30s
containerRuntimeEndpoint: unix:///run/k.sock
imageServiceEndpoint: unix:///run/i.sock
runtimeRequestTimeout: 1m30s
podLogsDir: /logs
maxPods: 20
address: 0.0.0.0
readOnlyPort: 10255
healthzBindAddress: 0.0.0.0
healthzPort: 0
cgroupDriver: cgroupfs
cgroupRoot: /custom
systemReserved: {cpu: 100m, memory: 100Mi}
kubeReserved: {cpu: '0.5', memory: 1Gi}
serializeImagePulls: false
maxParallelImagePulls: 3
",
        )
        .unwrap();
        assert_eq!(config.static_pod_path, Some(PathBuf::from("/etc/kubernetes/manifests")));
        assert_eq!(config.static_pod_url.as_deref(), Some("http://127.0.0.1:8080/pods"));
        assert_eq!(config.static_pod_url_header["Authorization"], ["Bearer x"]);
        assert_eq!(config.file_check_frequency, Duration::from_secs(5));
        assert_eq!(config.http_check_frequency, Duration::from_secs(60));
        assert_eq!(config.runtime_request_timeout, Duration::from_secs(90));
        assert_eq!(config.max_pods, 20);
        assert_eq!(config.read_only_port, 10255);
        assert_eq!(config.healthz_port, 0);
        assert_eq!(config.cgroup_root, "/custom");
        assert_eq!(config.reserved(), (600, 100 * 1024 * 1024 + 1024 * 1024 * 1024));
        assert_eq!(config.image_pull_limit(), Some(3));
        assert_eq!(config.image_service_endpoint.as_deref(), Some("unix:///run/i.sock"));
    }

    #[test]
    fn go_durations() {
        for (text, want) in [
            ("20s", Duration::from_secs(20)),
            ("1m0s", Duration::from_secs(60)),
            ("1h30m", Duration::from_secs(5400)),
            ("1.5h", Duration::from_secs(5400)),
            ("300ms", Duration::from_millis(300)),
            ("2m3.5s", Duration::from_millis(123_500)),
            ("10us", Duration::from_micros(10)),
            ("0", Duration::ZERO),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for bad in ["", "20", "s", "1x", "-1s", "1m s", "1..5s", "20 s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn errors_name_the_field_and_line() {
        let cases = [
            ("maxPods: 20\nsyncFrequencyy: 1m\n", "syncFrequencyy", 4, "unknown field"),
            ("syncFrequency: 1 minute\n", "syncFrequency", 3, "invalid duration"),
            ("maxPods: many\n", "maxPods", 3, ""),
            ("address: localhost\n", "address", 3, "not an IP address"),
            ("cgroupDriver: systemd\n", "cgroupDriver", 3, "only \"cgroupfs\""),
            ("podLogsDir: logs\n", "podLogsDir", 3, "absolute"),
            ("systemReserved: {cpu: lots}\n", "systemReserved", 3, "not a quantity"),
            ("kubeReserved: {gpu: '1'}\n", "kubeReserved", 3, "only cpu and memory"),
            ("maxParallelImagePulls: 3\n", "maxParallelImagePulls", 3, "serializeImagePulls"),
            ("staticPodURL: ftp://x\n", "staticPodURL", 3, "http"),
        ];
        for (body, field, line, words) in cases {
            let e = parse(body).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{body}: {e}");
            assert_eq!(e.line, Some(line), "{body}: {e}");
            assert!(e.message.contains(words), "{body}: {e}");
            let shown = e.to_string();
            assert!(shown.contains(field) && shown.contains(&format!("line {line}")), "{shown}");
        }
        let e = KubeletConfiguration::from_yaml("kind: KubeletConfiguration\n").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("apiVersion"));
        let e = KubeletConfiguration::from_yaml("apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n")
            .unwrap_err();
        assert_eq!((e.field.as_deref(), e.line), (Some("apiVersion"), Some(1)));
    }

    /// A configuration as kubeadm writes it.
    pub(crate) const KUBEADM: &str = "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: cgroupfs
cgroupsPerQOS: true
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerLogMaxFiles: 5
containerLogMaxSize: 10Mi
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cpuManagerReconcilePeriod: 0s
evictionHard:
  memory.available: 100Mi
  nodefs.available: 10%
evictionPressureTransitionPeriod: 0s
failSwapOn: false
featureGates:
  KubeletCrashLoopBackOffMax: false
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMaximumGCAge: 0s
imageMinimumGCAge: 0s
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: \"0\"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
port: 10250
rotateCertificates: true
runtimeRequestTimeout: 0s
serverTLSBootstrap: false
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
";

    #[test]
    fn every_upstream_field_is_known_once() {
        // Upstream's v1beta1 KubeletConfiguration has 126 fields besides apiVersion and kind.
        assert_eq!(FIELDS.len(), 126);
        let mut names: Vec<&str> = FIELDS.iter().map(|(name, _)| *name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FIELDS.len(), "no field twice");
        for (name, _) in FIELDS {
            assert!(name.chars().next().is_some_and(|c| c.is_ascii_lowercase()), "{name} is camelCase");
        }
        // What this agent reads is what the table calls honoured.
        for field in ["staticPodPath", "clusterDNS", "resolvConf", "failSwapOn", "oomScoreAdj", "logging"] {
            assert_eq!(support(field), Some(Support::Honoured), "{field}");
        }
        assert_eq!(support("authentication"), Some(Support::Honoured));
        assert_eq!(support("shutdownGracePeriod"), Some(Support::WithoutEffect));
        assert_eq!(support("cgroupsPerQOS"), Some(Support::DefaultOnly));
        assert_eq!(support("cgroupPerQOS"), None);
    }

    #[test]
    fn node_status_max_images_is_50_all_or_a_count() {
        assert_eq!(parse("").unwrap().node_status_max_images, Some(50));
        assert_eq!(parse("nodeStatusMaxImages: -1\n").unwrap().node_status_max_images, None);
        assert_eq!(parse("nodeStatusMaxImages: 0\n").unwrap().node_status_max_images, Some(0));
        assert!(parse("nodeStatusMaxImages: -2\n").unwrap_err().message.contains("must be >= -1"));
    }

    #[test]
    fn eviction_settings_default_merge_and_are_checked_as_upstream() {
        let defaults = parse("").unwrap();
        assert_eq!(defaults.eviction_thresholds().unwrap().thresholds.len(), 5, "four and the allocatable copy");
        let merged = parse("evictionHard: {memory.available: 1Gi}\nmergeDefaultEvictionSettings: true\n").unwrap();
        assert_eq!(merged.eviction_hard["memory.available"], "1Gi");
        assert_eq!(merged.eviction_hard["imagefs.available"], "15%");
        let error = parse("evictionSoft: {memory.available: 1Gi}\n").unwrap_err();
        assert_eq!(error.field.as_deref(), Some("evictionSoft"));
        assert!(error.message.contains("grace period must be specified"), "{error}");
        let error = parse("evictionHard: {memory.free: 1Gi}\n").unwrap_err();
        assert!(error.message.contains("unsupported eviction signal memory.free"), "{error}");
    }

    #[test]
    fn a_kubeadm_configuration_reads_and_names_what_has_no_effect() {
        let config = KubeletConfiguration::from_yaml(KUBEADM).unwrap();
        assert_eq!(config.cluster_dns, [IpAddr::from([10, 96, 0, 10])]);
        assert_eq!(config.cluster_domain, "cluster.local");
        assert!(!config.fail_swap_on);
        assert_eq!(config.static_pod_path, Some(PathBuf::from("/etc/kubernetes/manifests")));
        assert_eq!(config.verbosity, Some(0));
        assert!(config.rotate_certificates);
        assert!(!config.server_tls_bootstrap);
        // kubeadm writes zero durations for "the default": they are upstream's defaults here too.
        assert_eq!(config.sync_frequency, Duration::from_secs(60));
        assert_eq!(config.runtime_request_timeout, Duration::from_secs(120));
        assert_eq!(config.eviction_pressure_transition_period, Duration::from_secs(300));
        let hard: Vec<_> = config.eviction_hard.keys().collect();
        assert_eq!(hard, ["memory.available", "nodefs.available"], "kubeadm's map replaces the defaults");
        let authentication = &config.server.authentication;
        assert_eq!(authentication.client_ca_file, Some(PathBuf::from("/etc/kubernetes/pki/ca.crt")));
        assert_eq!(authentication.webhook_cache_ttl, Duration::from_secs(120), "kubeadm's 0s is the default");
        assert_eq!(config.server.authorization.webhook_cache_unauthorized_ttl, Duration::from_secs(30));
        assert_eq!(config.server.streaming_connection_idle_timeout, Duration::from_secs(4 * 3600), "0s: upstream's 4h");
        let five_minutes = KUBEADM.replace("streamingConnectionIdleTimeout: 0s", "streamingConnectionIdleTimeout: 5m");
        let set = KubeletConfiguration::from_yaml(&five_minutes).unwrap();
        assert_eq!(set.server.streaming_connection_idle_timeout, Duration::from_secs(300));
        assert_eq!(
            config.without_effect,
            [
                "cpuManagerReconcilePeriod",
                "featureGates",
                "shutdownGracePeriod",
                "shutdownGracePeriodCriticalPods",
                "volumeStatsAggPeriod",
            ]
        );
    }

    #[test]
    fn values_asking_for_what_the_agent_lacks_are_errors() {
        for (body, field, words) in [
            ("cgroupsPerQOS: false\n", "cgroupsPerQOS", "QoS cgroups"),
            ("cpuManagerPolicy: static\n", "cpuManagerPolicy", "exclusive CPUs"),
            ("enforceNodeAllocatable: [pods, system]\n", "enforceNodeAllocatable", "only \"pods\""),
            ("enforceNodeAllocatable: [pods, system-reserved]\n", "enforceNodeAllocatable", "systemReservedCgroup"),
            ("enforceNodeAllocatable: [kube-reserved]\n", "enforceNodeAllocatable", "kubeReservedCgroup (--kube"),
            ("systemReservedCgroup: system.slice\n", "systemReservedCgroup", "absolute cgroup path"),
            ("enforceNodeAllocatable: [none, pods]\n", "enforceNodeAllocatable", "cannot be combined"),
            ("cgroupDriver: systemd\n", "cgroupDriver", "SystemdCgroup = false"),
            ("seccompDefault: true\n", "seccompDefault", "Unconfined"),
            ("memorySwap: {swapBehavior: LimitedSwap}\n", "memorySwap", "NoSwap"),
            ("crashLoopBackOff: {maxContainerRestartPeriod: 10s}\n", "crashLoopBackOff", "backoff"),
            ("oomScoreAdj: -1001\n", "oomScoreAdj", "[-1000, 1000]"),
            ("clusterDNS: [dns.local]\n", "clusterDNS", "not an IP address"),
        ] {
            let e = parse(body).unwrap_err();
            assert_eq!((e.field.as_deref(), e.line), (Some(field), Some(3)), "{body}: {e}");
            assert!(e.message.contains(words), "{body}: {e}");
        }
        for body in ["cgroupsPerQOS: true\n", "cpuManagerPolicy: none\n", "podPidsLimit: -1\n", "memorySwap: {}\n"] {
            parse(body).unwrap();
        }
        let config = parse("podPidsLimit: 1024\nenforceNodeAllocatable: [none]\n").unwrap();
        assert_eq!(config.pod_pids_limit, Some(1024));
        assert!(config.enforce_node_allocatable.is_empty(), "none enforces nothing");
        assert_eq!(parse("").unwrap().enforce_node_allocatable, ["pods"]);
    }

    #[test]
    fn log_rotation_has_upstreams_defaults_and_checks() {
        let defaults = parse("").unwrap();
        assert_eq!(defaults.container_log_max_size, Some(10 * 1024 * 1024));
        assert_eq!(defaults.container_log_max_files, 5);
        assert_eq!(defaults.container_log_max_workers, 1);
        assert_eq!(defaults.container_log_monitor_interval, Duration::from_secs(10));
        let set = parse(
            "containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\ncontainerLogMaxWorkers: 2\n\
             containerLogMonitorInterval: 3s\n",
        )
        .unwrap();
        assert_eq!(set.container_log_max_size, Some(1024 * 1024));
        assert_eq!((set.container_log_max_files, set.container_log_max_workers), (3, 2));
        assert_eq!(set.container_log_monitor_interval, Duration::from_secs(3));
        assert_eq!(parse("containerLogMaxSize: \"-1\"\n").unwrap().container_log_max_size, None, "off");
        for (body, field) in [
            ("containerLogMaxFiles: 1\n", "containerLogMaxFiles"),
            ("containerLogMaxWorkers: 0\n", "containerLogMaxWorkers"),
            ("containerLogMonitorInterval: 1s\n", "containerLogMonitorInterval"),
            ("containerLogMaxSize: lots\n", "containerLogMaxSize"),
        ] {
            assert_eq!(parse(body).unwrap_err().field.as_deref(), Some(field), "{body}");
        }
    }

    #[test]
    fn image_gc_has_upstreams_defaults_and_checks() {
        let defaults = parse("").unwrap();
        assert_eq!((defaults.image_gc_high_threshold_percent, defaults.image_gc_low_threshold_percent), (85, 80));
        assert_eq!((defaults.image_minimum_gc_age, defaults.image_maximum_gc_age), (Duration::from_secs(120), None));
        let set = parse(
            "imageGCHighThresholdPercent: 90\nimageGCLowThresholdPercent: 50\nimageMinimumGCAge: 1s\n\
             imageMaximumGCAge: 1h\n",
        )
        .unwrap();
        assert_eq!((set.image_gc_high_threshold_percent, set.image_gc_low_threshold_percent), (90, 50));
        assert_eq!(set.image_minimum_gc_age, Duration::from_secs(1));
        assert_eq!(set.image_maximum_gc_age, Some(Duration::from_secs(3600)));
        for (body, field) in [
            ("imageGCHighThresholdPercent: 101\n", "imageGCHighThresholdPercent"),
            ("imageGCHighThresholdPercent: 70\n", "imageGCLowThresholdPercent"),
            ("imageMaximumGCAge: 1m\n", "imageMaximumGCAge"),
        ] {
            assert_eq!(parse(body).unwrap_err().field.as_deref(), Some(field), "{body}");
        }
    }

    #[test]
    fn registry_pulls_have_upstreams_defaults_and_checks() {
        let defaults = parse("").unwrap();
        assert_eq!((defaults.registry_pull_qps, defaults.registry_burst), (5, 10));
        assert!(defaults.local_storage_capacity_isolation);
        assert!(!parse("localStorageCapacityIsolation: false\n").unwrap().local_storage_capacity_isolation);
        let set = parse("registryPullQPS: 0\nregistryBurst: 3\n").unwrap();
        assert_eq!((set.registry_pull_qps, set.registry_burst), (0, 3));
        for body in ["registryPullQPS: -1\n", "registryBurst: -1\n", "registryPullQPS: 0.5\n"] {
            assert!(parse(body).is_err(), "{body}");
        }
    }

    #[test]
    fn an_unknown_field_suggests_the_closest_upstream_name() {
        let e = parse("staticPodPth: /etc/kubernetes/manifests\n").unwrap_err();
        assert_eq!((e.field.as_deref(), e.line), (Some("staticPodPth"), Some(3)));
        assert_eq!(e.message, "unknown field \"staticPodPth\", did you mean \"staticPodPath\"?");
        let e = parse("bananas: 3\n").unwrap_err();
        assert_eq!(e.message, "unknown field \"bananas\"");
    }
}
