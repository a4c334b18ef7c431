//! Volume vocabulary (upstream `pkg/volume` and `pkg/kubelet/volumemanager`): where a pod's
//! volumes live on the host, the host paths the runtime mounts, and the [`VolumeManager`] and
//! [`VolumePlugin`] traits an agent plugs volume types in with.
//!
//! A volume of pod `uid` lives in `<pods-dir>/<uid>/volumes/<plugin>/<name>` ([`volume_dir`]),
//! as upstream lays it out, so a restarted agent, and upstream's tools, find it again; a hostPath
//! volume is the host's own path.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::{PodUid, hook::BoxFuture};

/// The directory name of the emptyDir plugin under a pod's `volumes/`.
pub const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
/// The directory name of the downwardAPI plugin under a pod's `volumes/`.
pub const DOWNWARD_API: &str = "kubernetes.io~downward-api";
/// The directory name of the projected plugin under a pod's `volumes/`.
pub const PROJECTED: &str = "kubernetes.io~projected";
/// The directory name of the configMap plugin under a pod's `volumes/`.
pub const CONFIG_MAP: &str = "kubernetes.io~configmap";
/// The directory name of the secret plugin under a pod's `volumes/`.
pub const SECRET: &str = "kubernetes.io~secret";

/// The keys of a config map or secret with their bytes (a config map's `data` and `binaryData`).
pub type ObjectData = BTreeMap<String, Vec<u8>>;

/// Where the volumes that need the API server get their content (upstream's config map and
/// secret managers and its token manager); in cluster mode, the API server.
///
/// Each read names the pod it is for, so a source that keeps objects up to date (upstream's
/// watch-based managers) knows which it still needs; [`ObjectSource::release`] says a pod is gone.
pub trait ObjectSource: Send + Sync + 'static {
    /// The keys of config map `name` in `pod`'s namespace, or `None` when it does not exist.
    fn config_map<'a>(&'a self, pod: &'a Pod, name: &'a str) -> BoxFuture<'a, Result<Option<ObjectData>, String>>;

    /// The `data` of config map `name` in `pod`'s namespace (its text keys, without
    /// `binaryData`), as containers' `envFrom` and `configMapKeyRef` read it, or `None` when it
    /// does not exist.
    fn config_map_text<'a>(
        &'a self,
        pod: &'a Pod,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>, String>>;

    /// The keys of secret `name` in `pod`'s namespace, or `None` when it does not exist.
    fn secret<'a>(&'a self, pod: &'a Pod, name: &'a str) -> BoxFuture<'a, Result<Option<ObjectData>, String>>;

    /// Pod `uid` has terminated: what was kept for it alone may go.
    fn release(&self, uid: &PodUid) {
        let _ = uid;
    }

    /// A token of `pod`'s service account for `audience` (the API server's own when `None`),
    /// valid for about `expiration_seconds` and bound to the pod (upstream's TokenRequest).
    fn service_account_token<'a>(
        &'a self,
        pod: &'a Pod,
        audience: Option<&'a str>,
        expiration_seconds: i64,
    ) -> BoxFuture<'a, Result<String, String>>;

    /// The services of `namespace`, and `kubernetes` of `default`: what upstream's
    /// `getServiceEnvVarMap` reads for the variables of a container in `namespace`. `Ok(None)`
    /// when the source has no services, as a kubelet without an API server, whose containers get
    /// no service variables; an error when they have not been listed even once yet.
    fn services<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Option<Vec<k8s_openapi::api::core::v1::Service>>, String>> {
        let _ = namespace;
        Box::pin(async { Ok(None) })
    }

    /// The handler of runtime class `class`, which a pod's sandbox runs with (upstream's runtime
    /// class manager's `LookupRuntimeHandler`): an error in upstream's words when the class does
    /// not exist or cannot be read; `Ok(None)` when the source has no runtime classes, as a
    /// kubelet without an API server, which cannot run such a pod as its spec says.
    fn runtime_handler<'a>(&'a self, class: &'a str) -> BoxFuture<'a, Result<Option<String>, String>> {
        let _ = class;
        Box::pin(async { Ok(None) })
    }
}

/// How long a sync waits for a pod's volumes before it fails with `FailedMount` and is retried
/// (upstream `podAttachAndMountTimeout`, 2 min 3 s).
pub const MOUNT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(123);

/// Where volume `name` of plugin `plugin` of pod `uid` lives: `<pods_dir>/<uid>/volumes/<plugin>/<name>`.
pub fn volume_dir(pods_dir: &Path, uid: &PodUid, plugin: &str, name: &str) -> PathBuf {
    pods_dir.join(uid.as_str()).join("volumes").join(plugin).join(name)
}

/// The host paths of a pod's volumes, by volume name: what the runtime mounts into containers.
///
/// A volume whose content the agent writes (configMap, secret, downwardAPI, projected) is
/// recorded with [`PodVolumes::insert_read_only`]: the runtime mounts it read-only whatever the
/// container's `volumeMount` says, as upstream does (CVE-2017-1002102), so no container can
/// rewrite what the agent later reads, replaces or removes there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodVolumes {
    volumes: BTreeMap<String, HostVolume>,
}

/// Where one volume is on the host, whether containers may only read it, and whether the
/// runtime relabels it for SELinux.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HostVolume {
    path: PathBuf,
    read_only: bool,
    relabel: bool,
}

impl PodVolumes {
    /// No volumes.
    pub fn new() -> Self {
        PodVolumes::default()
    }

    /// Records that volume `name` is at `path` on the host.
    pub fn insert(&mut self, name: impl Into<String>, path: impl Into<PathBuf>) {
        self.volumes.insert(name.into(), HostVolume { path: path.into(), read_only: false, relabel: false });
    }

    /// Records that volume `name` is at `path` on the host and that every container mounts it
    /// read-only (upstream's volume attribute `ReadOnly`).
    pub fn insert_read_only(&mut self, name: impl Into<String>, path: impl Into<PathBuf>) {
        self.volumes.insert(name.into(), HostVolume { path: path.into(), read_only: true, relabel: false });
    }

    /// The host path of volume `name`, when it is set up.
    pub fn get(&self, name: &str) -> Option<&Path> {
        self.volumes.get(name).map(|v| v.path.as_path())
    }

    /// Has the runtime relabel volume `name` with the pod's SELinux label where a container
    /// mounts it ([`VolumePlugin::relabels`]).
    pub fn relabel(&mut self, name: &str) {
        if let Some(volume) = self.volumes.get_mut(name) {
            volume.relabel = true;
        }
    }

    /// Whether the runtime relabels volume `name` for SELinux.
    pub fn relabels(&self, name: &str) -> bool {
        self.volumes.get(name).is_some_and(|v| v.relabel)
    }

    /// Whether volume `name` is mounted read-only into every container.
    pub fn is_read_only(&self, name: &str) -> bool {
        self.volumes.get(name).is_some_and(|v| v.read_only)
    }

    /// Every volume with its host path, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.volumes.iter().map(|(name, v)| (name.as_str(), v.path.as_path()))
    }

    /// Whether no volume is set up.
    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty()
    }
}

/// A volume that could not be set up or torn down.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VolumeError {
    /// No plugin handles the volume's type.
    #[error("volume {volume:?}: no volume plugin handles this volume type")]
    Unsupported {
        /// The volume's name.
        volume: String,
    },
    /// Setting up the pod's volumes took longer than [`MOUNT_TIMEOUT`].
    #[error("timed out after {seconds} s waiting for the volumes to be set up")]
    TimedOut {
        /// How long it waited.
        seconds: u64,
    },
    /// A plugin failed; `message` says why.
    #[error("volume {volume:?}: {message}")]
    Failed {
        /// The volume's name.
        volume: String,
        /// Why.
        message: String,
    },
}

/// One volume type (upstream `volume.VolumePlugin` with its mounter and unmounter in one).
pub trait VolumePlugin: Send + Sync {
    /// The plugin's directory name under a pod's `volumes/` (`kubernetes.io~empty-dir`).
    fn name(&self) -> &str;

    /// Whether this plugin handles `volume`.
    fn supports(&self, volume: &Volume) -> bool;

    /// Sets up `volume` of `pod` (again on every sync: it must be idempotent, and it refreshes
    /// what may change, such as downward API files) in `dir`, the volume's directory, and returns
    /// the host path containers mount (`dir`, or a host path of the plugin's own).
    fn set_up<'a>(&'a self, pod: &'a Pod, volume: &'a Volume, dir: &'a Path) -> BoxFuture<'a, Result<PathBuf, String>>;

    /// Tears down the volume in `dir` (unmounts what the plugin mounted, then removes `dir`),
    /// never following a mount out of it.
    fn tear_down<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Result<(), String>>;

    /// Whether containers must mount this plugin's volumes read-only whatever their
    /// `volumeMounts` say (upstream's `GetAttributes().ReadOnly`): true for volumes whose content
    /// the agent writes, so that a container cannot plant links the agent would later follow.
    fn read_only(&self) -> bool {
        false
    }

    /// Whether the runtime relabels this plugin's volumes with the pod's SELinux label when a
    /// container mounts them (upstream's `Managed` and `SELinuxRelabel` attributes): true for
    /// the volumes the agent makes, false for a host's own path.
    fn relabels(&self) -> bool {
        false
    }
}

/// The volume manager the kubelet calls (upstream `volumemanager.VolumeManager`).
pub trait VolumeManager: Send + Sync + 'static {
    /// Sets up every volume of `pod` before its containers start (and on each sync after) and
    /// returns their host paths.
    fn mount_pod<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<PodVolumes, VolumeError>>;

    /// Tears down every volume of the terminated pod `uid`.
    fn unmount_pod<'a>(&'a self, uid: &'a PodUid) -> BoxFuture<'a, Result<(), VolumeError>>;

    /// Whether the manager can set up `volume` (the kubelet refuses pods with others).
    fn supports(&self, volume: &Volume) -> bool;
}

/// Checks a `subPath` as upstream's validation does: relative, without `..`.
pub fn validate_sub_path(sub_path: &str) -> Result<(), String> {
    let path = Path::new(sub_path);
    if path.is_absolute() {
        return Err(format!("subPath {sub_path:?} must be a relative path"));
    }
    if path.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(format!("subPath {sub_path:?} must not contain '..'"));
    }
    Ok(())
}

/// One `subPath` of a container's volume mount (upstream `subpath.Subpath`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubPath {
    /// The pod's UID.
    pub pod_uid: PodUid,
    /// The volume's name.
    pub volume_name: String,
    /// The volume's host path.
    pub volume_path: PathBuf,
    /// The container's name.
    pub container_name: String,
    /// The index of the mount in the container's `volumeMounts`.
    pub mount_index: usize,
    /// The `subPath`, relative to the volume.
    pub sub_path: String,
}

impl SubPath {
    /// `sub_path` of volume `volume_name` (at `volume_path`) in the mount at `mount_index` of
    /// container `container_name` of pod `pod_uid`.
    pub fn new(
        pod_uid: PodUid,
        volume: (&str, &Path),
        container_name: &str,
        mount_index: usize,
        sub_path: &str,
    ) -> SubPath {
        SubPath {
            pod_uid,
            volume_name: volume.0.to_owned(),
            volume_path: volume.1.to_owned(),
            container_name: container_name.to_owned(),
            mount_index,
            sub_path: sub_path.to_owned(),
        }
    }
}

/// Makes `subPath` mounts safe to hand to the runtime (upstream `subpath.Interface`): a
/// container that can write its volume could otherwise swap the path for a link to the host
/// between the agent's check and the runtime's mount (CVE-2017-1002101, CVE-2021-25741).
pub trait SubPathMounter: Send + Sync + 'static {
    /// The host path the runtime mounts for `sub_path`: what the subPath named inside its
    /// volume, made a directory when missing, pinned so that no later change of the volume
    /// redirects it. An error says why; the pod's status shows only that it failed.
    fn prepare<'a>(&'a self, sub_path: &'a SubPath) -> BoxFuture<'a, Result<PathBuf, String>>;
}

/// The first mount point at or below `dir` in `mountinfo` (`/proc/self/mountinfo`'s format:
/// the fifth field is the mount point, with spaces and the like escaped as octal).
pub fn mount_below(mountinfo: &str, dir: &Path) -> Option<String> {
    mount_points(mountinfo).find(|point| Path::new(point).starts_with(dir))
}

/// Every mount point in `mountinfo` (`/proc/self/mountinfo`'s format), unescaped, in its order.
pub fn mount_points(mountinfo: &str) -> impl Iterator<Item = String> + '_ {
    mountinfo.lines().filter_map(|line| line.split(' ').nth(4).map(unescape))
}

/// Undoes mountinfo's octal escapes (`\040` is a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(octal) = field.get(i + 1..i + 4)
            && let Ok(byte) = u8::from_str_radix(octal, 8)
        {
            out.push(byte);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
        90 22 0:50 / /var/lib/kubelet/pods/abc/volumes/kubernetes.io~empty-dir/cache rw - tmpfs tmpfs rw\n\
        91 22 0:51 / /var/lib/kubelet/pods/with\\040space/x rw - tmpfs tmpfs rw\n";

    #[test]
    fn volumes_live_under_the_pod_by_plugin_and_name() {
        let dir = volume_dir(Path::new("/var/lib/kubelet/pods"), &PodUid::new("u1"), EMPTY_DIR, "cache");
        assert_eq!(dir, Path::new("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache"));
        let mut volumes = PodVolumes::new();
        assert!(volumes.is_empty());
        volumes.insert("cache", &dir);
        assert_eq!(volumes.get("cache"), Some(dir.as_path()));
        assert_eq!(volumes.get("other"), None);
        assert!(!volumes.is_read_only("cache"));
        volumes.insert_read_only("labels", &dir);
        assert!(volumes.is_read_only("labels"));
        assert!(!volumes.is_read_only("other"));
    }

    #[test]
    fn mounts_below_a_directory_are_found_and_unescaped() {
        let pods = Path::new("/var/lib/kubelet/pods");
        assert_eq!(
            mount_below(MOUNTINFO, &pods.join("abc")).as_deref(),
            Some("/var/lib/kubelet/pods/abc/volumes/kubernetes.io~empty-dir/cache")
        );
        assert_eq!(mount_below(MOUNTINFO, &pods.join("ab")), None, "a path prefix is not a parent");
        assert_eq!(mount_below(MOUNTINFO, &pods.join("def")), None);
        assert!(mount_below(MOUNTINFO, &pods.join("with space")).is_some());
    }
}
