//! Static pod manifests: decoding (YAML or JSON, one Pod or a PodList), the API defaults a
//! kubelet relies on, static pod defaulting, and the validation the kubelet needs
//! (upstream `pkg/kubelet/config/common.go` and the API's `SetDefaults_*` and `ValidatePod*`).

use std::{collections::BTreeMap, collections::HashSet, fmt, path::PathBuf};

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod, PodSpec, PodStatus, Probe, Toleration};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use kubelet_core::types::annotations;

/// The largest manifest accepted (upstream's `maxConfigLength`).
pub const MAX_MANIFEST_BYTES: usize = 10 * 1024 * 1024;

/// Where a manifest came from; part of a static pod's UID and of every error.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Origin {
    /// A file under `staticPodPath`.
    File(PathBuf),
    /// The `staticPodURL`.
    Url(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(path) => write!(f, "{}", path.display()),
            Origin::Url(url) => f.write_str(url),
        }
    }
}

/// Why a manifest was rejected; every variant names where it came from.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManifestError {
    /// The manifest is larger than [`MAX_MANIFEST_BYTES`].
    #[error("{origin}: manifest is {size} bytes, more than the {MAX_MANIFEST_BYTES} allowed")]
    TooLarge {
        /// Where it came from.
        origin: Origin,
        /// Its size.
        size: usize,
    },
    /// The manifest is not a YAML or JSON document of the expected shape.
    #[error("{origin}: cannot decode: {message}")]
    Decode {
        /// Where it came from.
        origin: Origin,
        /// What is wrong, in a few words (`invalid YAML`); the decoder's error, with line and
        /// column, is the source.
        message: &'static str,
        /// The decoder's error, when one failed.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The manifest holds another kind of object.
    #[error("{origin}: expected kind Pod{}, got {kind:?}", if *.list_allowed { " or PodList" } else { "" })]
    WrongKind {
        /// Where it came from.
        origin: Origin,
        /// The kind found.
        kind: String,
        /// Whether a PodList would have been accepted.
        list_allowed: bool,
    },
    /// The manifest could not be read.
    #[error("{origin}: cannot read")]
    Read {
        /// Where it came from.
        origin: Origin,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// A pod failed validation.
    #[error("{origin}: invalid pod {pod:?}: {field}: {message}")]
    Invalid {
        /// Where it came from.
        origin: Origin,
        /// The pod's name.
        pod: String,
        /// The offending field, e.g. `spec.containers[1].name`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A static pod references API objects (upstream's wording).
    #[error("{origin}: pod {pod:?} has forbidden references to API objects: {}", references.join(", "))]
    ApiReferences {
        /// Where it came from.
        origin: Origin,
        /// The pod's name.
        pod: String,
        /// What it references, as [`api_references`] names them.
        references: Vec<String>,
    },
}

impl ManifestError {
    /// Where the rejected manifest came from.
    pub fn origin(&self) -> &Origin {
        match self {
            ManifestError::TooLarge { origin, .. }
            | ManifestError::Decode { origin, .. }
            | ManifestError::WrongKind { origin, .. }
            | ManifestError::Read { origin, .. }
            | ManifestError::Invalid { origin, .. }
            | ManifestError::ApiReferences { origin, .. } => origin,
        }
    }
}

/// One validation failure: the field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// The field path, e.g. `spec.containers[0].image`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn field_error(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError { field: field.into(), message: message.into() }
}

#[derive(Deserialize)]
struct TypeMeta {
    kind: Option<String>,
}

#[derive(Deserialize)]
struct PodListDoc {
    #[serde(default)]
    items: Vec<Pod>,
}

fn is_json(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8], origin: &Origin) -> Result<T, ManifestError> {
    let decode_error = |message: &'static str, source: Box<dyn std::error::Error + Send + Sync>| {
        ManifestError::Decode { origin: origin.clone(), message, source: Some(source) }
    };
    if is_json(bytes) {
        return serde_json::from_slice(bytes).map_err(|e| decode_error("invalid JSON", e.into()));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| decode_error("not UTF-8", e.into()))?;
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = yaml_node_budget(bytes.len(), budget.max_nodes);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    // YAML 1.1's octal, as upstream's decoder (go-yaml v2) reads it: `defaultMode: 0400` is 256.
    options.legacy_octal_numbers = true;
    serde_saphyr::from_str_with_options(text, options).map_err(|e| decode_error("invalid YAML", e.into()))
}

/// The YAML nodes a manifest of `len` bytes may expand to, at most `ceiling`: a document without
/// aliases has fewer nodes than bytes, so aliases may multiply that by four, with a floor for
/// small manifests. Upstream's YAML decoder refuses excessive aliasing likewise (go-yaml's
/// ratio of aliases to nodes); here a billion-laughs manifest of 500 bytes stops at 12,000
/// nodes, where the ceiling's 250,000 took 28 MiB of heap, which the allocator kept.
fn yaml_node_budget(len: usize, ceiling: usize) -> usize {
    const SMALL_MANIFEST_NODES: usize = 10_000;
    const ALIAS_EXPANSION: usize = 4;
    len.saturating_mul(ALIAS_EXPANSION).saturating_add(SMALL_MANIFEST_NODES).min(ceiling)
}

/// Decodes one Pod, or when `allow_list` also a PodList, from YAML or JSON.
pub fn decode(bytes: &[u8], origin: &Origin, allow_list: bool) -> Result<Vec<Pod>, ManifestError> {
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(ManifestError::TooLarge { origin: origin.clone(), size: bytes.len() });
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ManifestError::Decode { origin: origin.clone(), message: "empty manifest", source: None });
    }
    // Decoding is the expensive part (a YAML parse), so the common case, one Pod, parses once;
    // only when that fails is the kind looked at, to tell a list or a wrong kind from a bad pod.
    let pod_error = match parse::<Pod>(bytes, origin) {
        Ok(pod) => return Ok(vec![pod]),
        Err(err) => err,
    };
    let meta: TypeMeta = parse(bytes, origin)?;
    match meta.kind.as_deref() {
        None | Some("Pod") => Err(pod_error),
        Some("PodList" | "List") if allow_list => Ok(parse::<PodListDoc>(bytes, origin)?.items),
        Some(kind) => {
            Err(ManifestError::WrongKind { origin: origin.clone(), kind: kind.to_owned(), list_allowed: allow_list })
        }
    }
}

/// Upstream's default pull policy: Always for `:latest` or an untagged image, else IfNotPresent.
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn default_probe(probe: &mut Option<Probe>) {
    let Some(probe) = probe else { return };
    probe.timeout_seconds.get_or_insert(1);
    probe.period_seconds.get_or_insert(10);
    probe.success_threshold.get_or_insert(1);
    probe.failure_threshold.get_or_insert(3);
    if let Some(http) = probe.http_get.as_mut() {
        http.path.get_or_insert_with(|| "/".to_owned());
        http.scheme.get_or_insert_with(|| "HTTP".to_owned());
    }
}

fn default_container(container: &mut Container, host_network: bool) {
    if container.image_pull_policy.as_deref().is_none_or(str::is_empty) {
        container.image_pull_policy =
            Some(default_pull_policy(container.image.as_deref().unwrap_or_default()).to_owned());
    }
    container.termination_message_path.get_or_insert_with(|| "/dev/termination-log".to_owned());
    container.termination_message_policy.get_or_insert_with(|| "File".to_owned());
    for port in container.ports.iter_mut().flatten() {
        port.protocol.get_or_insert_with(|| "TCP".to_owned());
        if host_network && port.host_port.is_none_or(|p| p == 0) {
            port.host_port = Some(port.container_port);
        }
    }
    default_probe(&mut container.liveness_probe);
    default_probe(&mut container.readiness_probe);
    default_probe(&mut container.startup_probe);
    // Requests default to limits.
    if let Some(resources) = container.resources.as_mut()
        && let Some(limits) = resources.limits.clone()
    {
        let requests = resources.requests.get_or_insert_with(BTreeMap::new);
        for (name, quantity) in limits {
            requests.entry(name).or_insert(quantity);
        }
    }
}

/// Applies the API defaults the kubelet relies on (what the API server would set).
pub fn apply_api_defaults(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else { return };
    spec.restart_policy.get_or_insert_with(|| "Always".to_owned());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".to_owned());
    spec.scheduler_name.get_or_insert_with(|| "default-scheduler".to_owned());
    spec.enable_service_links.get_or_insert(true);
    spec.security_context.get_or_insert_with(Default::default);
    let host_network = spec.host_network.unwrap_or(false);
    for container in spec.init_containers.iter_mut().flatten().chain(spec.containers.iter_mut()) {
        default_container(container, host_network);
    }
}

/// The UID of a static pod without one: a SHA-256 over the pod's canonical JSON (k8s-openapi's
/// serialization of the API-defaulted pod, absent fields omitted) followed by `host:<node>` and
/// `file:<path>` (or `url:<url>`), as 32 hex digits.
///
/// Any change to the manifest's content, the node name or the file's path gives a new UID.
pub fn static_pod_uid(pod: &Pod, node_name: &str, origin: &Origin) -> String {
    let mut hasher = Sha256::new();
    // Serializing a k8s-openapi Pod cannot fail: it holds only strings, numbers, maps and lists.
    hasher.update(serde_json::to_vec(pod).unwrap_or_default());
    match origin {
        Origin::File(path) => {
            hasher.update(format!("host:{node_name}"));
            hasher.update(format!("file:{}", path.display()));
        }
        Origin::Url(url) => hasher.update(format!("url:{url}")),
    }
    let digest = hasher.finalize();
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Applies static pod defaulting (upstream `applyDefaults` in `config/common.go`): a content-hash
/// UID when none is given, the name suffix `-<lowercased node name>`, namespace `default`,
/// `spec.nodeName`, the `config.hash` annotation, a NoExecute toleration for file pods, and
/// phase Pending.
pub fn apply_static_defaults(pod: &mut Pod, node_name: &str, origin: &Origin) {
    if pod.metadata.uid.as_deref().is_none_or(str::is_empty) {
        pod.metadata.uid = Some(static_pod_uid(pod, node_name, origin));
    }
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata.name = Some(format!("{name}-{}", node_name.to_lowercase()));
    if pod.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        pod.metadata.namespace = Some("default".to_owned());
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    pod.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(annotations::CONFIG_HASH.to_owned(), uid);
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node_name.to_owned());
        if matches!(origin, Origin::File(_)) {
            let toleration = Toleration {
                operator: Some("Exists".to_owned()),
                effect: Some("NoExecute".to_owned()),
                ..Toleration::default()
            };
            let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
            if !tolerations.contains(&toleration) {
                tolerations.push(toleration);
            }
        }
    }
    pod.status.get_or_insert_with(PodStatus::default).phase = Some("Pending".to_owned());
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn one_of(field: String, value: Option<&str>, allowed: &[&str]) -> Result<(), FieldError> {
    match value {
        Some(v) if !allowed.contains(&v) => {
            Err(field_error(field, format!("unsupported value {v:?}: supported values: {}", allowed.join(", "))))
        }
        _ => Ok(()),
    }
}

fn validate_container(c: &Container, path: &str, volumes: &HashSet<&str>) -> Result<(), FieldError> {
    if !is_dns_label(&c.name) {
        return Err(field_error(
            format!("{path}.name"),
            format!("invalid value {:?}: must be a DNS-1123 label", c.name),
        ));
    }
    if c.image.as_deref().is_none_or(|i| i.trim().is_empty()) {
        return Err(field_error(format!("{path}.image"), "required value"));
    }
    one_of(format!("{path}.imagePullPolicy"), c.image_pull_policy.as_deref(), &["Always", "IfNotPresent", "Never"])?;
    let mut port_names = HashSet::new();
    for (i, port) in c.ports.iter().flatten().enumerate() {
        let at = format!("{path}.ports[{i}]");
        if !(1..=65535).contains(&port.container_port) {
            return Err(field_error(
                format!("{at}.containerPort"),
                format!("invalid value {}: must be between 1 and 65535", port.container_port),
            ));
        }
        if let Some(host) = port.host_port
            && !(0..=65535).contains(&host)
        {
            return Err(field_error(
                format!("{at}.hostPort"),
                format!("invalid value {host}: must be between 0 and 65535"),
            ));
        }
        one_of(format!("{at}.protocol"), port.protocol.as_deref(), &["TCP", "UDP", "SCTP"])?;
        if let Some(name) = port.name.as_deref() {
            let valid = name.len() <= 15
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && name.bytes().any(|b| b.is_ascii_lowercase());
            if !valid {
                return Err(field_error(
                    format!("{at}.name"),
                    format!("invalid value {name:?}: must be an IANA service name"),
                ));
            }
            if !port_names.insert(name) {
                return Err(field_error(format!("{at}.name"), format!("duplicate value {name:?}")));
            }
        }
    }
    for (i, env) in c.env.iter().flatten().enumerate() {
        if env.name.is_empty() || env.name.contains('=') {
            return Err(field_error(format!("{path}.env[{i}].name"), format!("invalid value {:?}", env.name)));
        }
    }
    for (name, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if let Some(probe) = probe {
            validate_probe(probe, &format!("{path}.{name}"), name != "readinessProbe")?;
        }
    }
    for (name, handler) in c.lifecycle.iter().flat_map(|l| [("postStart", &l.post_start), ("preStop", &l.pre_stop)]) {
        if let Some(handler) = handler {
            validate_hook(handler, &format!("{path}.lifecycle.{name}"))?;
        }
    }
    for (i, mount) in c.volume_mounts.iter().flatten().enumerate() {
        if !volumes.contains(mount.name.as_str()) {
            return Err(field_error(
                format!("{path}.volumeMounts[{i}].name"),
                format!("not found: no volume {:?}", mount.name),
            ));
        }
    }
    Ok(())
}

/// Upstream `validateProbe`: one handler, counts not negative, a success threshold of 1 where
/// a probe's success cannot be repeated (liveness, startup), a positive own grace period.
fn validate_probe(probe: &Probe, path: &str, success_must_be_one: bool) -> Result<(), FieldError> {
    let handlers = [probe.exec.is_some(), probe.http_get.is_some(), probe.tcp_socket.is_some(), probe.grpc.is_some()];
    match handlers.iter().filter(|h| **h).count() {
        0 => return Err(field_error(path, "required value: must specify a handler type")),
        1 => {}
        _ => return Err(field_error(path, "forbidden: may not specify more than 1 handler type")),
    }
    for (field, value) in [
        ("initialDelaySeconds", probe.initial_delay_seconds),
        ("timeoutSeconds", probe.timeout_seconds),
        ("periodSeconds", probe.period_seconds),
        ("successThreshold", probe.success_threshold),
        ("failureThreshold", probe.failure_threshold),
    ] {
        if let Some(v) = value.filter(|v| *v < 0) {
            return Err(field_error(
                format!("{path}.{field}"),
                format!("invalid value {v}: must be greater than or equal to 0"),
            ));
        }
    }
    if success_must_be_one && probe.success_threshold.is_some_and(|t| t != 1) {
        return Err(field_error(format!("{path}.successThreshold"), "invalid value: must be 1"));
    }
    if let Some(grace) = probe.termination_grace_period_seconds.filter(|g| *g <= 0) {
        return Err(field_error(
            format!("{path}.terminationGracePeriodSeconds"),
            format!("invalid value {grace}: must be greater than 0"),
        ));
    }
    Ok(())
}

/// Upstream `validateLifecycleHandler`: one handler, and a sleep that is not negative.
fn validate_hook(handler: &LifecycleHandler, path: &str) -> Result<(), FieldError> {
    let handlers =
        [handler.exec.is_some(), handler.http_get.is_some(), handler.tcp_socket.is_some(), handler.sleep.is_some()];
    match handlers.iter().filter(|h| **h).count() {
        0 => return Err(field_error(path, "required value: must specify a handler type")),
        1 => {}
        _ => return Err(field_error(path, "forbidden: may not specify more than 1 handler type")),
    }
    if let Some(seconds) = handler.sleep.as_ref().map(|s| s.seconds).filter(|s| *s < 0) {
        return Err(field_error(
            format!("{path}.sleep.seconds"),
            format!("invalid value {seconds}: must be greater than or equal to 0"),
        ));
    }
    Ok(())
}

/// Validates what the kubelet needs of a pod.
pub fn validate_pod(pod: &Pod) -> Result<(), FieldError> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if name.is_empty() {
        return Err(field_error("metadata.name", "required value"));
    }
    if !is_dns_subdomain(name) {
        return Err(field_error("metadata.name", format!("invalid value {name:?}: must be a DNS-1123 subdomain")));
    }
    if let Some(namespace) = pod.metadata.namespace.as_deref()
        && !is_dns_label(namespace)
    {
        return Err(field_error(
            "metadata.namespace",
            format!("invalid value {namespace:?}: must be a DNS-1123 label"),
        ));
    }
    let Some(spec) = pod.spec.as_ref() else { return Err(field_error("spec", "required value")) };
    if spec.containers.is_empty() {
        return Err(field_error("spec.containers", "required value: a pod needs at least one container"));
    }
    one_of("spec.restartPolicy".to_owned(), spec.restart_policy.as_deref(), &["Always", "OnFailure", "Never"])?;
    one_of(
        "spec.dnsPolicy".to_owned(),
        spec.dns_policy.as_deref(),
        &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
    )?;
    if let Some(grace) = spec.termination_grace_period_seconds
        && grace < 0
    {
        return Err(field_error("spec.terminationGracePeriodSeconds", format!("invalid value {grace}: must be >= 0")));
    }
    if let Some(deadline) = spec.active_deadline_seconds
        && deadline < 1
    {
        return Err(field_error("spec.activeDeadlineSeconds", format!("invalid value {deadline}: must be >= 1")));
    }
    let mut volumes = HashSet::new();
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        if !is_dns_label(&volume.name) {
            return Err(field_error(
                format!("spec.volumes[{i}].name"),
                format!("invalid value {:?}: must be a DNS-1123 label", volume.name),
            ));
        }
        if !volumes.insert(volume.name.as_str()) {
            return Err(field_error(format!("spec.volumes[{i}].name"), format!("duplicate value {:?}", volume.name)));
        }
    }
    let mut names = HashSet::new();
    let containers = containers_with_paths(spec);
    for (path, container) in containers {
        validate_container(container, &path, &volumes)?;
        if !names.insert(container.name.as_str()) {
            return Err(field_error(format!("{path}.name"), format!("duplicate value {:?}", container.name)));
        }
    }
    Ok(())
}

/// The init and regular containers of `spec`, each with its field path (`spec.containers[0]`).
fn containers_with_paths(spec: &PodSpec) -> impl Iterator<Item = (String, &Container)> {
    spec.init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c))
        .chain(spec.containers.iter().enumerate().map(|(i, c)| (format!("spec.containers[{i}]"), c)))
}

/// The volume sources that need nothing of the API server (upstream's allow-list in
/// `getAPIReferences`, `pkg/kubelet/config/common.go`).
const NODE_LOCAL_SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "downwardAPI",
    "emptyDir",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "glusterfs",
    "hostPath",
    "iscsi",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// The names of the fields set in `value` (a volume or projection source) other than `name`:
/// which source it is, whatever the API version knows.
fn source_keys<T: serde::Serialize>(value: &T) -> Vec<String> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(fields)) => fields.into_iter().map(|(k, _)| k).filter(|k| k != "name").collect(),
        _ => Vec::new(),
    }
}

/// The API objects `pod` references, in upstream's words and order (sorted): `Secret "s"`,
/// `ConfigMap volume "v"`, `ServiceAccount "sa"`...; a static pod may reference none.
pub fn api_references(pod: &Pod) -> Vec<String> {
    let mut found = std::collections::BTreeSet::new();
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    if let Some(account) = spec.service_account_name.as_deref().filter(|s| !s.is_empty()) {
        found.insert(format!("ServiceAccount {account:?}"));
    }
    let mut secret = |name: Option<&str>| {
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            found.insert(format!("Secret {name:?}"));
        }
    };
    for reference in spec.image_pull_secrets.iter().flatten() {
        secret(Some(&reference.name));
    }
    let envs = containers_with_paths(spec)
        .map(|(_, c)| (c.env.as_deref(), c.env_from.as_deref()))
        .chain(spec.ephemeral_containers.iter().flatten().map(|e| (e.env.as_deref(), e.env_from.as_deref())));
    let mut config_maps = Vec::new();
    for (env, env_from) in envs.collect::<Vec<_>>() {
        for from in env_from.unwrap_or_default() {
            secret(from.secret_ref.as_ref().map(|r| r.name.as_str()));
            config_maps.extend(from.config_map_ref.as_ref().map(|r| r.name.clone()));
        }
        for source in env.unwrap_or_default().iter().filter_map(|e| e.value_from.as_ref()) {
            secret(source.secret_key_ref.as_ref().map(|r| r.name.as_str()));
            config_maps.extend(source.config_map_key_ref.as_ref().map(|r| r.name.clone()));
        }
    }
    for volume in spec.volumes.iter().flatten() {
        secret(volume.secret.as_ref().and_then(|s| s.secret_name.as_deref()));
        config_maps.extend(volume.config_map.as_ref().map(|c| c.name.clone()));
        secret(volume.csi.as_ref().and_then(|c| c.node_publish_secret_ref.as_ref()).map(|r| r.name.as_str()));
        for source in volume.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            secret(source.secret.as_ref().map(|s| s.name.as_str()));
            config_maps.extend(source.config_map.as_ref().map(|c| c.name.clone()));
        }
    }
    for name in config_maps.into_iter().filter(|n| !n.is_empty()) {
        found.insert(format!("ConfigMap {name:?}"));
    }
    for volume in spec.volumes.iter().flatten() {
        let name = &volume.name;
        let keys = source_keys(volume);
        let Some(kind) = keys.first() else {
            found.insert(format!("unknown type for volume {name:?}"));
            continue;
        };
        match kind.as_str() {
            kind if NODE_LOCAL_SOURCES.contains(&kind) => {}
            "projected" => {
                for source in volume.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
                    let kind = source_keys(source);
                    match kind.first().map(String::as_str) {
                        Some("downwardAPI") => {}
                        Some(kind @ ("configMap" | "secret" | "serviceAccountToken")) => {
                            found.insert(format!("{kind} projected volume {name:?}"));
                        }
                        _ => {
                            found.insert(format!("unknown source for projected volume {name:?}"));
                        }
                    }
                }
            }
            "configMap" => _ = found.insert(format!("ConfigMap volume {name:?}")),
            "csi" => _ = found.insert(format!("CSI volume {name:?}")),
            "ephemeral" => _ = found.insert(format!("Ephemeral volume {name:?}")),
            "persistentVolumeClaim" => _ = found.insert(format!("PersistentVolumeClaim volume {name:?}")),
            "secret" => _ = found.insert(format!("Secret volume {name:?}")),
            _ => _ = found.insert(format!("unknown type for volume {name:?}")),
        }
    }
    found.into_iter().collect()
}

/// Decodes a manifest into static pods: decode, API defaults, static defaults, validation.
/// All or nothing: one invalid pod rejects the manifest.
pub fn static_pods(
    bytes: &[u8],
    origin: &Origin,
    node_name: &str,
    allow_list: bool,
) -> Result<Vec<Pod>, ManifestError> {
    let mut pods = decode(bytes, origin, allow_list)?;
    for pod in &mut pods {
        apply_api_defaults(pod);
        apply_static_defaults(pod, node_name, origin);
        let name = || pod.metadata.name.clone().unwrap_or_default();
        validate_pod(pod).map_err(|e| ManifestError::Invalid {
            origin: origin.clone(),
            pod: name(),
            field: e.field,
            message: e.message,
        })?;
        let references = api_references(pod);
        if !references.is_empty() {
            return Err(ManifestError::ApiReferences { origin: origin.clone(), pod: name(), references });
        }
    }
    Ok(pods)
}

#[cfg(test)]
mod tests;
