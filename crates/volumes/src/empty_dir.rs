//! emptyDir volumes (upstream `pkg/volume/emptydir`): a directory of the pod's, on the node's
//! disk, or a tmpfs for `medium: Memory` sized as upstream sizes it; it outlives container
//! restarts and goes with the pod.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Pod, Volume};
use kubelet_core::{
    hook::BoxFuture,
    resources::{pod_limits, units},
    volume::{EMPTY_DIR, VolumePlugin},
};

use crate::{downward::Allocatable, mount};

/// emptyDir volumes on disk and in memory, the node's allocatable memory at hand to size the
/// latter.
#[derive(Clone, Debug, Default)]
pub(crate) struct EmptyDir(pub(crate) Arc<Allocatable>);

/// The size of a memory-backed emptyDir (upstream's `calculateEmptyDirMemorySize`): the node's
/// allocatable memory, or less, the pod's memory limit where its cgroup has one (every container
/// limits memory), or less still, the volume's `sizeLimit`. `None` (the tmpfs's own default)
/// only while none of the three is known.
fn memory_size(pod: &Pod, source: &EmptyDirVolumeSource, allocatable: Option<i64>) -> Option<i64> {
    let limits = pod_limits(pod);
    let pod_limit = limits.memory_bytes.filter(|_| limits.memory_declared);
    let size_limit = source.size_limit.as_ref().and_then(units);
    [allocatable, pod_limit, size_limit].into_iter().flatten().filter(|bound| *bound > 0).min()
}

impl VolumePlugin for EmptyDir {
    fn name(&self) -> &str {
        EMPTY_DIR
    }

    fn relabels(&self) -> bool {
        true
    }

    fn supports(&self, volume: &Volume) -> bool {
        volume.empty_dir.as_ref().is_some_and(|e| matches!(e.medium.as_deref().unwrap_or_default(), "" | "Memory"))
    }

    fn set_up<'a>(&'a self, pod: &'a Pod, volume: &'a Volume, dir: &'a Path) -> BoxFuture<'a, Result<PathBuf, String>> {
        Box::pin(async move {
            let source = volume.empty_dir.as_ref().ok_or("not an emptyDir volume")?;
            tokio::fs::create_dir_all(dir).await.map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            if source.medium.as_deref() == Some("Memory") && !mount::is_mount_point(dir).await? {
                let allocatable = self.0.get().get("memory").and_then(units);
                mount::tmpfs(dir, memory_size(pod, source, allocatable)).await?;
            }
            // Upstream's emptyDir is world-writable, so any container user can write to it (a
            // tmpfs keeps its sticky bit, so no user removes another's files); with an fsGroup
            // the group owns it and what is made in it (setgid). Only the directory: what
            // containers wrote in it is theirs (upstream walks it only while it is empty).
            let mut mode = if source.medium.as_deref() == Some("Memory") { 0o1777 } else { 0o777 };
            if let Some(gid) = crate::ownership::fs_group(pod).0 {
                let dir = dir.to_owned();
                tokio::task::spawn_blocking(move || std::os::unix::fs::lchown(&dir, None, Some(gid)))
                    .await
                    .map_err(|e| format!("cannot give the volume to group {gid}: {e}"))?
                    .map_err(|e| format!("cannot give the volume to group {gid}: {e}"))?;
                mode |= 0o2000;
            }
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

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{Container, PodSpec, ResourceRequirements},
        apimachinery::pkg::api::resource::Quantity,
    };

    use super::*;

    fn container(memory_limit: Option<&str>) -> Container {
        let limits = memory_limit.map(|l| [("memory".to_owned(), Quantity(l.to_owned()))].into());
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements { limits, ..Default::default() }),
            ..Default::default()
        }
    }

    fn pod(containers: Vec<Container>) -> Pod {
        Pod { spec: Some(PodSpec { containers, ..PodSpec::default() }), ..Pod::default() }
    }

    fn source(size_limit: Option<&str>) -> EmptyDirVolumeSource {
        EmptyDirVolumeSource { medium: Some("Memory".into()), size_limit: size_limit.map(|s| Quantity(s.into())) }
    }

    #[test]
    fn a_memory_empty_dir_is_the_smallest_of_allocatable_the_pods_limit_and_its_size_limit() {
        let (mi, gi) = (1 << 20, 1 << 30);
        let node = Some(4 * gi);
        assert_eq!(
            memory_size(&pod(vec![container(None)]), &source(None), node),
            Some(4 * gi),
            "the node's allocatable"
        );
        let limited = pod(vec![container(Some("64Mi")), container(Some("64Mi"))]);
        assert_eq!(memory_size(&limited, &source(None), node), Some(128 * mi), "the pod's limit");
        assert_eq!(memory_size(&limited, &source(Some("16Mi")), node), Some(16 * mi), "the sizeLimit");
        assert_eq!(
            memory_size(&limited, &source(Some("1Gi")), node),
            Some(128 * mi),
            "a larger sizeLimit is not the size"
        );
        let partly = pod(vec![container(Some("64Mi")), container(None)]);
        assert_eq!(
            memory_size(&partly, &source(None), node),
            Some(4 * gi),
            "no pod limit unless every container has one"
        );
        assert_eq!(memory_size(&pod(vec![container(None)]), &source(None), None), None, "nothing known yet");
    }
}
