//! Pod-level cgroup cleanup: the runtime removes each container's cgroup but never the pod's
//! parent directory, so the kubelet must, under every hierarchy (cgroup v1 controllers and the
//! hybrid `unified` mount, or the v2 root).

use std::{
    io,
    path::{Component, Path},
};

/// Where cgroup hierarchies are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Removes the cgroup directory `parent` (for example `/kubepods/besteffort/pod<uid>`) under every
/// hierarchy below `root`; returns how many directories were removed.
///
/// A hierarchy without the directory is fine.
/// It fails when `parent` is not an absolute path without `..`, or when a directory still holds
/// processes or child cgroups.
pub fn remove_pod_cgroup(root: &Path, parent: &str) -> io::Result<usize> {
    let relative = Path::new(parent);
    let valid = relative.is_absolute()
        && relative.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && relative.components().count() > 1;
    if !valid {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("invalid cgroup parent {parent:?}")));
    }
    let relative = relative.strip_prefix("/").unwrap_or(relative);
    let mut hierarchies = vec![root.to_path_buf()];
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        // Combined controllers such as `cpu,cpuacct` are often symlinks to a real mount: skip them.
        if entry.file_type()?.is_dir() {
            hierarchies.push(entry.path());
        }
    }
    let mut removed = 0;
    for hierarchy in hierarchies {
        match std::fs::remove_dir(hierarchy.join(relative)) {
            Ok(()) => removed += 1,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => {
                return Err(io::Error::new(
                    err.kind(),
                    format!("removing {}: {err}", hierarchy.join(relative).display()),
                ));
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_the_pod_dir_under_every_hierarchy() {
        let root = std::env::temp_dir().join(format!("cgroups-test-{}", std::process::id()));
        for h in ["cpu", "memory", "unified"] {
            std::fs::create_dir_all(root.join(h).join("kubepods/besteffort/pod1")).unwrap();
        }
        std::fs::create_dir_all(root.join("pids")).unwrap();
        assert_eq!(remove_pod_cgroup(&root, "/kubepods/besteffort/pod1").unwrap(), 3);
        assert!(root.join("cpu/kubepods/besteffort").is_dir(), "only the pod level goes");
        assert_eq!(remove_pod_cgroup(&root, "/kubepods/besteffort/pod1").unwrap(), 0, "idempotent");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn rejects_relative_and_escaping_parents() {
        let root = std::env::temp_dir();
        for bad in ["kubepods/pod1", "/kubepods/../etc", "/", ""] {
            assert_eq!(remove_pod_cgroup(&root, bad).unwrap_err().kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
    }
}
