//! The kubelet's configuration file: `KubeletConfiguration` (`kubelet.config.k8s.io/v1beta1`).
//!
//! [`KubeletConfiguration::from_yaml`] reads the fields this agent implements, with upstream's
//! defaults and Go's duration syntax (`"20s"`, `"1m0s"`, `"1h30m"`, `"500ms"`), and refuses
//! unknown fields and invalid values with an [`Error`] naming the field and its line.
//! Upstream: `pkg/kubelet/apis/config/v1beta1/defaults.go`.

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

use kubelet_core::resources::parse_quantity;

/// The only `apiVersion` accepted.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The only `kind` accepted.
pub const KIND: &str = "KubeletConfiguration";

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
    /// `address`: the read-only API's address (127.0.0.1 here; upstream's is 0.0.0.0).
    pub address: IpAddr,
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
            address: IpAddr::from([127, 0, 0, 1]),
            read_only_port: 0,
            healthz_bind_address: IpAddr::from([127, 0, 0, 1]),
            healthz_port: 10248,
            cgroup_driver: "cgroupfs".to_owned(),
            cgroup_root: String::new(),
            system_reserved: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            serialize_image_pulls: true,
            max_parallel_image_pulls: None,
        }
    }
}

/// The file as written: every field optional, durations and addresses as text.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
}

impl KubeletConfiguration {
    /// Reads a configuration file's text.
    pub fn from_yaml(text: &str) -> Result<Self, Error> {
        let raw: Raw = serde_saphyr::from_str(text).map_err(|e| decode_error(text, &e.to_string()))?;
        let at =
            |field: &str, message: String| Error { field: Some(field.to_owned()), line: line_of(text, field), message };
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
        let duration = |field: &str, value: Option<String>, default: Duration| match value {
            None => Ok(default),
            Some(text) => parse_duration(&text).map_err(|message| at(field, message)),
        };
        config.file_check_frequency =
            duration("fileCheckFrequency", raw.file_check_frequency, config.file_check_frequency)?;
        config.http_check_frequency =
            duration("httpCheckFrequency", raw.http_check_frequency, config.http_check_frequency)?;
        config.sync_frequency = duration("syncFrequency", raw.sync_frequency, config.sync_frequency)?;
        config.runtime_request_timeout =
            duration("runtimeRequestTimeout", raw.runtime_request_timeout, config.runtime_request_timeout)?;
        for (field, value) in [
            ("fileCheckFrequency", config.file_check_frequency),
            ("httpCheckFrequency", config.http_check_frequency),
            ("syncFrequency", config.sync_frequency),
            ("runtimeRequestTimeout", config.runtime_request_timeout),
        ] {
            if value.is_zero() {
                return Err(at(field, "must be greater than zero".to_owned()));
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
        if let Some(max_pods) = raw.max_pods {
            if max_pods == 0 {
                return Err(at("maxPods", "must be greater than zero".to_owned()));
            }
            config.max_pods = max_pods;
        }
        config.read_only_port = raw.read_only_port.unwrap_or(config.read_only_port);
        config.healthz_port = raw.healthz_port.unwrap_or(config.healthz_port);
        if let Some(driver) = raw.cgroup_driver.filter(|d| d != "cgroupfs") {
            return Err(at("cgroupDriver", format!("{driver:?} is not supported: only \"cgroupfs\"")));
        }
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
        config.serialize_image_pulls = raw.serialize_image_pulls.unwrap_or(true);
        config.max_parallel_image_pulls = raw.max_parallel_image_pulls;
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

    /// How many image pulls may run at once: 1 when serialized, else `maxParallelImagePulls`
    /// (`None`: no limit).
    pub fn image_pull_limit(&self) -> Option<usize> {
        if self.serialize_image_pulls { Some(1) } else { self.max_parallel_image_pulls.map(|m| m as usize) }
    }

    /// CPU (millicores) and memory (bytes) reserved by `systemReserved` plus `kubeReserved`.
    pub fn reserved(&self) -> (i64, i64) {
        let sum = |resource: &str, scale: f64| -> i64 {
            #[allow(clippy::cast_possible_truncation)] // Reason: reservations are far below 2^63.
            [&self.system_reserved, &self.kube_reserved]
                .iter()
                .filter_map(|m| m.get(resource).and_then(|q| parse_quantity(q)))
                .map(|q| (q * scale).ceil() as i64)
                .sum()
        };
        (sum("cpu", 1000.0), sum("memory", 1.0))
    }
}

/// Parses Go's duration syntax: a sequence of decimal numbers with units `ns`, `us`, `µs`,
/// `ms`, `s`, `m`, `h` (`"1m0s"`, `"1.5h"`, `"300ms"`); `"0"` alone is zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {text:?}: expected a number and unit such as \"20s\" or \"1m0s\"");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() || text.starts_with('-') {
        return Err(bad());
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

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
            ("maxPods: 0\n", "maxPods", 3, "greater than zero"),
            ("address: localhost\n", "address", 3, "not an IP address"),
            ("cgroupDriver: systemd\n", "cgroupDriver", 3, "only \"cgroupfs\""),
            ("podLogsDir: logs\n", "podLogsDir", 3, "absolute"),
            ("systemReserved: {cpu: lots}\n", "systemReserved", 3, "not a quantity"),
            ("kubeReserved: {gpu: '1'}\n", "kubeReserved", 3, "only cpu and memory"),
            ("maxParallelImagePulls: 3\n", "maxParallelImagePulls", 3, "serializeImagePulls"),
            ("staticPodURL: ftp://x\n", "staticPodURL", 3, "http"),
            ("syncFrequency: 0s\n", "syncFrequency", 3, "greater than zero"),
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
}
