//! emptyDir volumes (upstream `pkg/volume/emptydir`): a directory of the pod's, on the node's
//! disk, or a tmpfs for `medium: Memory` (its size the `sizeLimit`); it outlives container
//! restarts and goes with the pod.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use k8s_openapi::api::core::v1::{Pod, Volume};
use kubelet_core::{
    hook::BoxFuture,
    resources::units,
    volume::{EMPTY_DIR, VolumePlugin},
};

use crate::mount;

/// emptyDir volumes on disk and in memory.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct EmptyDir;

impl VolumePlugin for EmptyDir {
    fn name(&self) -> &str {
        EMPTY_DIR
    }

    fn supports(&self, volume: &Volume) -> bool {
        volume.empty_dir.as_ref().is_some_and(|e| matches!(e.medium.as_deref().unwrap_or_default(), "" | "Memory"))
    }

    fn set_up<'a>(&'a self, pod: &'a Pod, volume: &'a Volume, dir: &'a Path) -> BoxFuture<'a, Result<PathBuf, String>> {
        Box::pin(async move {
            let source = volume.empty_dir.as_ref().ok_or("not an emptyDir volume")?;
            tokio::fs::create_dir_all(dir).await.map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            if source.medium.as_deref() == Some("Memory") && !mount::is_mount_point(dir).await? {
                let size = source.size_limit.as_ref().and_then(units).filter(|s| *s > 0);
                mount::tmpfs(dir, size).await?;
            }
            // Upstream's emptyDir is world-writable, so any container user can write to it; with
            // an fsGroup the group owns it and what is made in it (setgid). Only the directory:
            // what containers wrote in it is theirs (upstream walks it only while it is empty).
            let mode = match crate::ownership::fs_group(pod).0 {
                Some(gid) => {
                    std::os::unix::fs::lchown(dir, None, Some(gid))
                        .map_err(|e| format!("cannot give {} to group {gid}: {e}", dir.display()))?;
                    0o2777
                }
                None => 0o777,
            };
            tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
                .await
                .map_err(|e| format!("cannot set the mode of {}: {e}", dir.display()))?;
            Ok(dir.to_owned())
        })
    }

    fn tear_down<'a>(&'a self, dir: &'a Path) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if mount::is_mount_point(dir).await? {
                mount::unmount(dir).await?;
            }
            crate::remove_unmounted(dir).await
        })
    }
}
