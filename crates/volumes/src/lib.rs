//! Volumes for node-local pods (upstream `pkg/volume` and `pkg/kubelet/volumemanager`):
//! emptyDir (disk, or a tmpfs for `medium: Memory`), hostPath with its type checks, downwardAPI
//! volumes and projected volumes of downwardAPI sources.
//!
//! [`Manager`] implements `kubelet_core::VolumeManager`: the kubelet asks it to set up a pod's
//! volumes before each sync of the pod (the first creates them; later ones refresh downward API
//! files) and to tear them down once the pod has terminated.
//! Each volume lives in `<pods-dir>/<uid>/volumes/<plugin>/<name>`, upstream's layout; the
//! runtime mounts the host paths the manager returns.
//! More volume types plug in as `kubelet_core::VolumePlugin`s ([`Manager::plugin`]).
//! With an `ObjectSource` ([`Manager::objects`]; in cluster mode, the API server), configMap,
//! secret and projected volumes of configMap, secret and serviceAccountToken sources too,
//! refreshed at every sync; secret and projected volumes live on a tmpfs. Claims and CSI are
//! not here: the kubelet refuses pods that use them.
//!
//! Containers mount the volumes the manager writes read-only, the writer never follows a link a
//! container could have planted, and [`subpath`] gives runtimes a `subPath` as a bind mount of a
//! handle opened without following links.
//!
//! Teardown never follows a mount out of the pod's directory: a tmpfs the manager mounted is
//! unmounted first, and a volume directory with anything else mounted below it is left alone
//! with an error.
//!
//! # Example
//!
//! ```no_run
//! use kubelet_core::{VolumeManager, k8s_openapi::api::core::v1::Pod};
//! use kubelet_volumes::Manager;
//!
//! #[tokio::main]
//! async fn main() {
//!     let volumes = Manager::new("/var/lib/kubelet/pods");
//!     let pod = Pod::default();
//!     match volumes.mount_pod(&pod).await {
//!         Ok(paths) => {
//!             for (name, path) in paths.iter() {
//!                 println!("{name} is at {}", path.display());
//!             }
//!         }
//!         Err(err) => eprintln!("{err}"),
//!     }
//! }
//! ```

mod api;
mod at;
mod atomic;
mod downward;
mod empty_dir;
mod host_path;
mod mount;
mod ownership;
pub mod subpath;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_openapi::{
    api::core::v1::{Pod, Volume},
    apimachinery::pkg::api::resource::Quantity,
};
use kubelet_core::ErrorChain;
use kubelet_core::{
    PodUid,
    hook::BoxFuture,
    volume::{ObjectSource, PodVolumes, VolumeError, VolumeManager, VolumePlugin, volume_dir},
};
use tracing::debug;

/// The volume manager: the built-in plugins, and any added with [`Manager::plugin`].
#[derive(Clone)]
pub struct Manager {
    pods_dir: PathBuf,
    plugins: Vec<Arc<dyn VolumePlugin>>,
    objects: Option<Arc<dyn ObjectSource>>,
    allocatable: Arc<downward::Allocatable>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plugins: Vec<&str> = self.plugins.iter().map(|p| p.name()).collect();
        f.debug_struct("Manager").field("pods_dir", &self.pods_dir).field("plugins", &plugins).finish()
    }
}

impl Manager {
    /// A manager of the volumes under `pods_dir` (`<root-dir>/pods`, `/var/lib/kubelet/pods`)
    /// with the built-in plugins.
    pub fn new(pods_dir: impl Into<PathBuf>) -> Self {
        let allocatable = Arc::new(downward::Allocatable::default());
        Manager {
            pods_dir: pods_dir.into(),
            plugins: vec![
                Arc::new(empty_dir::EmptyDir(allocatable.clone())),
                Arc::new(host_path::HostPath),
                Arc::new(downward::DownwardApi(allocatable.clone())),
                Arc::new(api::Projected(None, allocatable.clone())),
            ],
            objects: None,
            allocatable,
        }
    }

    /// The node's allocatable resources (`cpu`, `memory`, ...), which a downwardAPI
    /// `resourceFieldRef` to a limit the container does not set reads, as upstream's; without
    /// them such a file cannot be written.
    #[must_use]
    pub fn allocatable(self, allocatable: BTreeMap<String, Quantity>) -> Self {
        self.allocatable.set(allocatable);
        self
    }

    /// Adds the volumes that need the API server, with their content from `objects`:
    /// configMap, secret, and projected volumes of any of configMap, secret, downwardAPI and
    /// serviceAccountToken sources.
    #[must_use]
    pub fn objects(mut self, objects: Arc<dyn ObjectSource>) -> Self {
        self.objects = Some(objects.clone());
        let allocatable = self.allocatable.clone();
        self.plugin(Arc::new(api::ConfigMap(objects.clone())))
            .plugin(Arc::new(api::Secret(objects.clone())))
            .plugin(Arc::new(api::Projected(Some(objects), allocatable)))
    }

    /// Adds a volume plugin; it is asked before the built-in ones.
    #[must_use]
    pub fn plugin(mut self, plugin: Arc<dyn VolumePlugin>) -> Self {
        self.plugins.insert(0, plugin);
        self
    }

    fn plugin_for(&self, volume: &Volume) -> Option<&Arc<dyn VolumePlugin>> {
        self.plugins.iter().find(|p| p.supports(volume))
    }

    async fn mount(&self, pod: &Pod) -> Result<PodVolumes, VolumeError> {
        let uid = PodUid::of(pod);
        let mut volumes = PodVolumes::new();
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let plugin =
                self.plugin_for(volume).ok_or_else(|| VolumeError::Unsupported { volume: volume.name.clone() })?;
            let dir = volume_dir(&self.pods_dir, &uid, plugin.name(), &volume.name);
            let path = plugin
                .set_up(pod, volume, &dir)
                .await
                .map_err(|message| VolumeError::Failed { volume: volume.name.clone(), message })?;
            if plugin.read_only() {
                volumes.insert_read_only(volume.name.clone(), path);
            } else {
                volumes.insert(volume.name.clone(), path);
            }
            if plugin.relabels() {
                volumes.relabel(&volume.name);
            }
        }
        Ok(volumes)
    }

    async fn unmount(&self, uid: &PodUid) -> Result<(), VolumeError> {
        if let Some(objects) = &self.objects {
            objects.release(uid);
        }
        // The subPath bind mounts go first: they may hold parts of the volumes open.
        let pod_dir = self.pods_dir.join(uid.as_str());
        let subpaths = tokio::task::spawn_blocking({
            let pod_dir = pod_dir.clone();
            move || subpath::clean(&pod_dir)
        });
        let failed = |message: String| VolumeError::Failed { volume: subpath::SUBPATHS_DIR.to_owned(), message };
        subpaths.await.map_err(|e| failed(e.to_string()))?.map_err(|e| failed(ErrorChain(&e).to_string()))?;
        let root = pod_dir.join("volumes");
        let Ok(mut plugins) = tokio::fs::read_dir(&root).await else { return Ok(()) };
        while let Ok(Some(plugin_dir)) = plugins.next_entry().await {
            let name = plugin_dir.file_name().to_string_lossy().into_owned();
            let plugin = self.plugins.iter().find(|p| p.name() == name);
            let Ok(mut volumes) = tokio::fs::read_dir(plugin_dir.path()).await else { continue };
            while let Ok(Some(volume)) = volumes.next_entry().await {
                let volume_name = volume.file_name().to_string_lossy().into_owned();
                let failed = |message: String| VolumeError::Failed { volume: volume_name.clone(), message };
                match plugin {
                    Some(plugin) => plugin.tear_down(&volume.path()).await.map_err(failed)?,
                    // A plugin this agent no longer has: remove what holds no mount.
                    None => remove_unmounted(&volume.path()).await.map_err(failed)?,
                }
                debug!(pod.uid = %uid, volume = %volume_name, plugin = %name, "volume torn down");
            }
            let _ = tokio::fs::remove_dir(plugin_dir.path()).await;
        }
        let _ = tokio::fs::remove_dir(&root).await;
        Ok(())
    }
}

impl VolumeManager for Manager {
    fn mount_pod<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<PodVolumes, VolumeError>> {
        Box::pin(self.mount(pod))
    }

    fn unmount_pod<'a>(&'a self, uid: &'a PodUid) -> BoxFuture<'a, Result<(), VolumeError>> {
        Box::pin(self.unmount(uid))
    }

    fn supports(&self, volume: &Volume) -> bool {
        self.plugin_for(volume).is_some()
    }
}

/// Removes `dir` unless something is mounted at or below it (then it is an error, and the
/// directory stays: removing it would delete the mounted data).
pub async fn remove_unmounted(dir: &Path) -> Result<(), String> {
    if let Some(point) = mount::mount_below(dir).await? {
        return Err(format!("{point} is mounted below {}; leaving it", dir.display()));
    }
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", dir.display())),
    }
}

#[cfg(test)]
mod tests;
