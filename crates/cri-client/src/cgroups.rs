//! Pod-level cgroup cleanup: the runtime removes each container's cgroup but never the pod's
//! parent directory, so the kubelet must, under every hierarchy (cgroup v1 controllers and the
//! hybrid `unified` mount, or the v2 root).

use std::{
    io,
    path::{Path, PathBuf},
};

/// Where cgroup hierarchies are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Removes the cgroup directory `parent` (for example `/kubepods/besteffort/pod<uid>`) under every
/// hierarchy below `root`; returns how many directories were removed.
///
/// A hierarchy without the directory is fine. Processes still in it or in a child cgroup are
/// killed first, as upstream's `tryKillingCgroupProcesses` does: a sandbox the runtime lost
/// when it crashed leaves its pause process there, which nothing else would ever stop. Empty
/// child cgroups go first, deepest first, as libcontainer's removal does: a container whose
/// runtime lost it between creating its cgroup and starting it leaves one behind.
/// It fails when `parent` is not an absolute path without `..`, or when a directory still holds
/// processes (just killed ones, until their parent reaps them: try again a moment later).
pub fn remove_pod_cgroup(root: &Path, parent: &str) -> io::Result<usize> {
    let relative = kubelet_core::cgroups::relative_cgroup_path(parent)?;
    let killed = kill_processes(root, relative)?;
    if killed > 0 {
        tracing::warn!(parent, killed, "killed processes left in a gone pod's cgroup");
    }
    let mut removed = 0;
    for hierarchy in hierarchies(root)? {
        let dir = hierarchy.join(relative);
        match remove_cgroup_tree(&dir) {
            Ok(()) => removed += 1,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(io::Error::new(err.kind(), format!("removing {}: {err}", dir.display()))),
        }
    }
    Ok(removed)
}

/// SIGKILLs every process in cgroup `relative` or below it, under any hierarchy; returns how
/// many it signalled.
fn kill_processes(root: &Path, relative: &Path) -> io::Result<usize> {
    let mut pids = std::collections::BTreeSet::new();
    for hierarchy in hierarchies(root)? {
        collect_pids(&hierarchy.join(relative), &mut pids);
    }
    let mut killed = 0;
    for pid in pids {
        let pid = nix::unistd::Pid::from_raw(pid);
        match nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL) {
            Ok(()) => killed += 1,
            Err(nix::errno::Errno::ESRCH) => {}
            Err(errno) => return Err(io::Error::from(errno)),
        }
    }
    Ok(killed)
}

/// The processes of cgroup `dir` and its children (only directories are followed).
fn collect_pids(dir: &Path, pids: &mut std::collections::BTreeSet<i32>) {
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()).filter(|pid| *pid > 0));
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.filter_map(Result::ok) {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_pids(&entry.path(), pids);
        }
    }
}

/// Removes cgroup `dir` after its child cgroups, deepest first. Only directories are followed
/// (never a link), and a cgroup directory's own files go with it.
fn remove_cgroup_tree(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            match remove_cgroup_tree(&entry.path()) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => return Err(err),
                _ => {}
            }
        }
    }
    std::fs::remove_dir(dir)
}

/// The hierarchies below `root`: `root` itself (cgroup v2, or the v1 mount point) and each
/// directory in it (v1 controllers and the hybrid `unified` mount).
fn hierarchies(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut hierarchies = vec![root.to_path_buf()];
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        // Combined controllers such as `cpu,cpuacct` are often symlinks to a real mount: skip them.
        if entry.file_type()?.is_dir() {
            hierarchies.push(entry.path());
        }
    }
    Ok(hierarchies)
}

/// The pod-level cgroup directories of `uid` that exist under any hierarchy below `root`, in
/// the cgroupfs driver's layout (`kubepods/pod<uid>`, `kubepods/burstable/pod<uid>`,
/// `kubepods/besteffort/pod<uid>`), on cgroup v1 and v2 alike: what a leak check looks for.
pub fn pod_cgroup_dirs(root: &Path, uid: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for hierarchy in hierarchies(root).unwrap_or_default() {
        for qos in ["", "burstable/", "besteffort/"] {
            let dir = hierarchy.join("kubepods").join(format!("{qos}pod{uid}"));
            if dir.is_dir() {
                found.push(dir);
            }
        }
    }
    found
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
    fn empty_child_cgroups_go_first() {
        let root = tempfile::tempdir().unwrap();
        let container = root.path().join("pids/kubepods/besteffort/pod1/abc");
        std::fs::create_dir_all(container.join("nested")).unwrap();
        assert_eq!(remove_pod_cgroup(root.path(), "/kubepods/besteffort/pod1").unwrap(), 1);
        assert!(!root.path().join("pids/kubepods/besteffort/pod1").exists());
    }

    #[test]
    fn processes_left_in_the_pod_cgroup_are_killed_first() {
        let root = tempfile::tempdir().unwrap();
        let container = root.path().join("pids/kubepods/besteffort/pod1/lost-sandbox");
        std::fs::create_dir_all(&container).unwrap();
        let mut child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        std::fs::write(container.join("cgroup.procs"), format!("{}\n", child.id())).unwrap();
        // A regular directory keeps its files; a cgroup's go with it. Only the kill is tested here.
        let relative = kubelet_core::cgroups::relative_cgroup_path("/kubepods/besteffort/pod1").unwrap();
        assert_eq!(kill_processes(root.path(), relative).unwrap(), 1);
        let status = child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "SIGKILLed");
    }

    #[test]
    fn pod_cgroups_are_found_in_v1_and_v2_layouts() {
        let root = tempfile::tempdir().unwrap();
        // v1: a controller's hierarchy; v2: the root itself.
        std::fs::create_dir_all(root.path().join("cpu/kubepods/besteffort/podu1")).unwrap();
        std::fs::create_dir_all(root.path().join("kubepods/burstable/podu1")).unwrap();
        std::fs::create_dir_all(root.path().join("kubepods/podu2")).unwrap();
        let found = pod_cgroup_dirs(root.path(), "u1");
        assert_eq!(
            found,
            [root.path().join("kubepods/burstable/podu1"), root.path().join("cpu/kubepods/besteffort/podu1")]
        );
        assert_eq!(pod_cgroup_dirs(root.path(), "u2"), [root.path().join("kubepods/podu2")]);
        assert!(pod_cgroup_dirs(root.path(), "u3").is_empty());
    }

    #[test]
    fn rejects_relative_and_escaping_parents() {
        let root = std::env::temp_dir();
        for bad in ["kubepods/pod1", "/kubepods/../etc", "/", ""] {
            assert_eq!(remove_pod_cgroup(&root, bad).unwrap_err().kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
    }
}
