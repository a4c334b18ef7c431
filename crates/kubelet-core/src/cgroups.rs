//! The seam to pods' cgroups (upstream's pod and QoS container managers, `pkg/kubelet/cm`):
//! each pod's cgroup is made and given its resources before its sandbox starts, and its QoS
//! class's cgroup follows the pods it holds.

use k8s_openapi::api::core::v1::Pod;

use crate::{resources::qos_class, types::PodUid};

/// The cgroup of `pod` below `pods_cgroup` (`/kubepods`), named by QoS class as upstream's
/// cgroupfs driver names it: `<pods>/pod<uid>` (Guaranteed), `<pods>/burstable/pod<uid>`,
/// `<pods>/besteffort/pod<uid>`.
pub fn pod_cgroup_name(pods_cgroup: &str, pod: &Pod) -> String {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let root = pods_cgroup.trim_end_matches('/');
    match qos_class(pod) {
        "Guaranteed" => format!("{root}/pod{uid}"),
        "Burstable" => format!("{root}/burstable/pod{uid}"),
        _ => format!("{root}/besteffort/pod{uid}"),
    }
}

/// Cgroup `name` (`/kubepods/besteffort/pod<uid>`) below a hierarchy's root, when it is an
/// absolute path of at least one plain name: no `..`, so nothing built from it leaves the
/// hierarchy, and never the root itself.
pub fn relative_cgroup_path(name: &str) -> std::io::Result<&std::path::Path> {
    use std::path::{Component, Path};
    let path = Path::new(name);
    let plain = path.is_absolute()
        && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && path.components().count() > 1;
    if !plain {
        let message = format!("invalid cgroup name {name:?}");
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, message));
    }
    Ok(path.strip_prefix("/").unwrap_or(path))
}

/// A pod's cgroup could not be made or set.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}")]
#[non_exhaustive]
pub struct PodCgroupError {
    /// What failed (`writing`, `making`).
    pub what: &'static str,
    /// The file or directory.
    pub path: String,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

impl PodCgroupError {
    /// `what` failed on `path` with `source`.
    pub fn new(what: &'static str, path: impl Into<String>, source: std::io::Error) -> Self {
        PodCgroupError { what, path: path.into(), source }
    }
}

/// Pods' cgroups: made before a pod's sandbox starts, with the resources its spec asks for.
pub trait PodCgroups: Send + Sync + 'static {
    /// Makes `pod`'s cgroup with the CPU shares, quota, memory and PID limits its spec asks
    /// for, after updating its QoS class's cgroup for the pods it now holds. A pod whose cgroup
    /// is in place already is left as it is.
    fn ensure(&self, pod: &Pod) -> Result<(), PodCgroupError>;

    /// Pod `uid` no longer runs: its share leaves its QoS class's cgroup. Its own cgroup goes
    /// with the pod's other leftovers.
    fn forget(&self, uid: &PodUid);

    /// The pods that have a cgroup here which this process has not ensured (or has forgotten
    /// since): candidates for upstream's orphaned pod cgroup cleanup, such as what a crash
    /// between making a pod's cgroup and starting its sandbox leaves. A pod being ensured
    /// meanwhile is never among them.
    fn unclaimed_pods(&self) -> Result<Vec<PodUid>, PodCgroupError>;
}
