//! Pod identity and the config-update vocabulary: `PodUid`, `PodUpdate`, `Operation`, `Source`, `SyncPodType`.

use std::{borrow::Borrow, fmt, sync::Arc};

use k8s_openapi::api::core::v1::Pod;

/// A pod's UID (`metadata.uid`), cheap to clone and hash.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodUid(Arc<str>);

impl PodUid {
    /// Creates a UID from any string.
    pub fn new(uid: impl AsRef<str>) -> Self {
        PodUid(Arc::from(uid.as_ref()))
    }

    /// The UID as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The UID of `pod` (empty when the pod has none).
    pub fn of(pod: &Pod) -> Self {
        PodUid::new(pod.metadata.uid.as_deref().unwrap_or_default())
    }
}

impl fmt::Debug for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Borrow<str> for PodUid {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for PodUid {
    fn from(s: &str) -> Self {
        PodUid::new(s)
    }
}

impl From<String> for PodUid {
    fn from(s: String) -> Self {
        PodUid(Arc::from(s))
    }
}

/// The pod's full name as upstream spells it: `<name>_<namespace>`.
///
/// Static pods are unique per full name: only one pod with a given full name may run at a time.
pub fn pod_full_name(pod: &Pod) -> String {
    full_name(pod.metadata.name.as_deref().unwrap_or_default(), pod.metadata.namespace.as_deref().unwrap_or_default())
}

/// Builds a full name (`<name>_<namespace>`) from its parts.
pub fn full_name(name: &str, namespace: &str) -> String {
    format!("{name}_{namespace}")
}

/// What a `PodUpdate` does to the pods it carries (upstream `pkg/kubelet/types/pod_update.go`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// The complete current set of pods of one source; the merger turns it into the other ops.
    Set,
    /// Pods new to the kubelet.
    Add,
    /// Pods whose spec, labels or non-local annotations changed.
    Update,
    /// Pods being gracefully deleted (an update carrying `deletionTimestamp`).
    Delete,
    /// Pods gone from their source: kill them.
    Remove,
    /// Pods whose status alone changed in the source.
    Reconcile,
}

/// Where a pod's configuration came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Source {
    /// Static pod manifests on disk (`staticPodPath`).
    File,
    /// Static pod manifests fetched over HTTP (`staticPodURL`).
    Http,
    /// The API server.
    Api,
}

impl Source {
    /// The value of the `kubernetes.io/config.source` annotation for this source.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::Http => "http",
            Source::Api => "api",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One message from the config layer to the sync loop.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PodUpdate {
    /// What to do with `pods`.
    pub op: Operation,
    /// The source that produced the update; the sync loop marks it as seen.
    pub source: Source,
    /// The pods concerned.
    pub pods: Vec<Arc<Pod>>,
}

impl PodUpdate {
    /// Creates an update.
    pub fn new(op: Operation, source: Source, pods: Vec<Arc<Pod>>) -> Self {
        PodUpdate { op, source, pods }
    }
}

/// Why a pod worker is asked to sync (upstream `SyncPodType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SyncPodType {
    /// The pod is new to the worker.
    Create,
    /// The pod's config changed.
    Update,
    /// A periodic or event-driven resync.
    Sync,
    /// The pod must be terminated (removal, eviction, orphan).
    Kill,
}

impl fmt::Display for SyncPodType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SyncPodType::Create => "create",
            SyncPodType::Update => "update",
            SyncPodType::Sync => "sync",
            SyncPodType::Kill => "kill",
        })
    }
}

/// Annotations the kubelet reads and writes on pods (upstream `pkg/kubelet/types`).
pub mod annotations {
    /// The source a pod came from: `file`, `http` or `api`.
    pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
    /// On a mirror pod: the `config.hash` of the static pod it mirrors.
    pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
    /// The static pod's content hash (equal to its UID).
    pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
    /// When the kubelet first saw the pod.
    pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// A pod's log directory (upstream `BuildPodLogsDirectory`): `<pod_logs_dir>/<namespace>_<name>_<uid>`,
/// where a runtime writes `<container>/<restartCount>.log` and readers find them.
pub fn pod_log_dir(pod_logs_dir: &std::path::Path, namespace: &str, name: &str, uid: &str) -> std::path::PathBuf {
    pod_logs_dir.join(format!("{namespace}_{name}_{uid}"))
}

/// A pod metadata field by upstream's field path (`fieldpath.ExtractFieldPathAsString`):
/// `metadata.name`, `.namespace`, `.uid`, `.labels` and `.annotations` (all, as sorted
/// `key="value"` lines), and one label or annotation (`metadata.labels['app']`, empty when
/// unset); `None` for any other path.
pub fn metadata_field(pod: &Pod, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let all = |map: Option<&std::collections::BTreeMap<String, String>>| {
        map.into_iter().flatten().map(|(k, v)| format!("{k}={v:?}")).collect::<Vec<_>>().join("\n")
    };
    let one = |map: Option<&std::collections::BTreeMap<String, String>>, prefix: &str| {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    match path {
        "metadata.name" => Some(meta.name.clone().unwrap_or_default()),
        "metadata.namespace" => Some(meta.namespace.clone().unwrap_or_default()),
        "metadata.uid" => Some(meta.uid.clone().unwrap_or_default()),
        "metadata.labels" => Some(all(meta.labels.as_ref())),
        "metadata.annotations" => Some(all(meta.annotations.as_ref())),
        _ => one(meta.labels.as_ref(), "metadata.labels['")
            .or_else(|| one(meta.annotations.as_ref(), "metadata.annotations['")),
    }
}

/// Whether the pod is a static pod (it came from a file or HTTP source, not the API server).
pub fn is_static_pod(pod: &Pod) -> bool {
    annotation(pod, annotations::CONFIG_SOURCE).is_some_and(|s| s != Source::Api.as_str())
}

/// The priority from which a pod is critical (`system-cluster-critical`'s, upstream
/// `SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Whether the pod is critical (upstream `IsCriticalPod`): static, a mirror pod, or of a
/// priority of at least [`SYSTEM_CRITICAL_PRIORITY`]. The eviction manager never evicts it,
/// and admission takes it under pressure.
pub fn is_critical_pod(pod: &Pod) -> bool {
    is_static_pod(pod)
        || is_mirror_pod(pod)
        || pod.spec.as_ref().and_then(|s| s.priority).is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// Whether the pod is a mirror pod (the API copy of a static pod).
pub fn is_mirror_pod(pod: &Pod) -> bool {
    annotation(pod, annotations::CONFIG_MIRROR).is_some()
}

/// Whether `container`, an init container, is a sidecar: `restartPolicy: Always` (KEP-753; upstream
/// `IsRestartableInitContainer`).
pub fn is_sidecar(container: &k8s_openapi::api::core::v1::Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// An ephemeral container as the container it runs as (upstream converts its
/// `EphemeralContainerCommon`, every field but `targetContainerName`).
pub fn ephemeral_as_container(
    ephemeral: &k8s_openapi::api::core::v1::EphemeralContainer,
) -> k8s_openapi::api::core::v1::Container {
    let e = ephemeral.clone();
    k8s_openapi::api::core::v1::Container {
        name: e.name,
        image: e.image,
        command: e.command,
        args: e.args,
        working_dir: e.working_dir,
        ports: e.ports,
        env_from: e.env_from,
        env: e.env,
        resources: e.resources,
        resize_policy: e.resize_policy,
        restart_policy: e.restart_policy,
        restart_policy_rules: e.restart_policy_rules,
        volume_mounts: e.volume_mounts,
        volume_devices: e.volume_devices,
        liveness_probe: e.liveness_probe,
        readiness_probe: e.readiness_probe,
        startup_probe: e.startup_probe,
        lifecycle: e.lifecycle,
        termination_message_path: e.termination_message_path,
        termination_message_policy: e.termination_message_policy,
        image_pull_policy: e.image_pull_policy,
        security_context: e.security_context,
        stdin: e.stdin,
        stdin_once: e.stdin_once,
        tty: e.tty,
    }
}

/// The hash a mirror pod records of its static pod, or a static pod's own hash.
pub fn config_hash(pod: &Pod) -> Option<&str> {
    annotation(pod, annotations::CONFIG_MIRROR).or_else(|| annotation(pod, annotations::CONFIG_HASH))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    #[test]
    fn metadata_fields_by_upstream_path() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                labels: Some([("b".to_owned(), "2".to_owned()), ("a".to_owned(), "x\"y".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        assert_eq!(metadata_field(&pod, "metadata.name").as_deref(), Some("web"));
        assert_eq!(metadata_field(&pod, "metadata.namespace").as_deref(), Some(""));
        assert_eq!(metadata_field(&pod, "metadata.labels").as_deref(), Some("a=\"x\\\"y\"\nb=\"2\""));
        assert_eq!(metadata_field(&pod, "metadata.labels['b']").as_deref(), Some("2"));
        assert_eq!(metadata_field(&pod, "metadata.annotations['none']").as_deref(), Some(""));
        assert_eq!(metadata_field(&pod, "spec.nodeName"), None);
    }
}
