//! subPath mounts that a container cannot redirect (upstream `volume/util/subpath`, the fixes
//! of CVE-2017-1002101 and CVE-2021-25741).
//!
//! A container that can write its volume can turn a subPath's directory into a link to the
//! host's root between the moment the agent checks the path and the moment the runtime mounts
//! it. So the runtime is never handed the path: [`prepare`] opens it one component at a time
//! without following a link, checks that it stays in the volume, and bind-mounts that handle
//! (`/proc/self/fd/N`) at `<pod-dir>/volume-subpaths/<volume>/<container>/<index>`, a path of
//! the agent's own that the runtime then mounts. [`clean`] unmounts and removes those bind
//! mounts when the pod's volumes are torn down.

use std::{
    ffi::OsStr,
    fs::File,
    io,
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    },
    path::{Path, PathBuf},
};

use kubelet_core::{
    hook::BoxFuture,
    volume::{SubPath, SubPathMounter},
};
use nix::{
    mount::{MsFlags, mount, umount},
    sys::stat::{Mode, fchmod, fstat},
};

use crate::at;

/// The directory of a pod's subPath bind mounts, under the pod's directory.
pub const SUBPATHS_DIR: &str = "volume-subpaths";

/// The [`SubPathMounter`] of pods under one pods directory: [`prepare`] on the blocking pool.
#[derive(Clone, Debug)]
pub struct BindMounter {
    pods_dir: PathBuf,
}

impl BindMounter {
    /// Bind-mounts the subPaths of the pods under `pods_dir` (`<root-dir>/pods`).
    pub fn new(pods_dir: impl Into<PathBuf>) -> Self {
        BindMounter { pods_dir: pods_dir.into() }
    }
}

impl SubPathMounter for BindMounter {
    fn prepare<'a>(&'a self, sub_path: &'a SubPath) -> BoxFuture<'a, Result<PathBuf, String>> {
        let (pods_dir, sub_path) = (self.pods_dir.clone(), sub_path.clone());
        Box::pin(async move {
            let prepared = tokio::task::spawn_blocking(move || prepare(&pods_dir, &sub_path));
            match prepared.await {
                Ok(Ok(target)) => Ok(target),
                Ok(Err(err)) => Err(kubelet_core::ErrorChain(&err).to_string()),
                Err(err) => Err(format!("the subPath preparation failed: {err}")),
            }
        })
    }
}

/// Why a subPath could not be prepared or cleaned up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubPathError {
    /// The `subPath` itself is not allowed: absolute, or with `..`.
    #[error("{0}")]
    Invalid(String),
    /// The path leads out of the volume, through a link or a link put there meanwhile.
    #[error("{path} leads out of volume {volume}")]
    OutOfVolume {
        /// The path.
        path: PathBuf,
        /// The volume's host path.
        volume: PathBuf,
    },
    /// A file-system operation failed.
    #[error("cannot {what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

fn io_failed<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> SubPathError + 'a {
    move |source| SubPathError::Io { what, path: path.to_owned(), source }
}

/// Where `sub` is bind-mounted: `<pods-dir>/<uid>/volume-subpaths/<volume>/<container>/<index>`.
pub fn bind_target(pods_dir: &Path, sub: &SubPath) -> PathBuf {
    pods_dir
        .join(sub.pod_uid.as_str())
        .join(SUBPATHS_DIR)
        .join(&sub.volume_name)
        .join(&sub.container_name)
        .join(sub.mount_index.to_string())
}

/// Makes the subPath a directory when it is missing (with the volume's mode, as upstream), opens
/// it without following a link out of the volume, and bind-mounts it at [`bind_target`], which
/// it returns: the host path the runtime mounts.
/// A target already bound to the same file is kept. Blocking; needs `CAP_SYS_ADMIN`.
pub fn prepare(pods_dir: &Path, sub: &SubPath) -> Result<PathBuf, SubPathError> {
    kubelet_core::volume::validate_sub_path(&sub.sub_path).map_err(SubPathError::Invalid)?;
    let volume = std::fs::canonicalize(&sub.volume_path).map_err(io_failed("resolve", &sub.volume_path))?;
    let wanted = volume.join(&sub.sub_path);
    let resolved = match std::fs::canonicalize(&wanted) {
        Ok(resolved) => resolved,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            make_dirs(&volume, Path::new(&sub.sub_path))?;
            std::fs::canonicalize(&wanted).map_err(io_failed("resolve", &wanted))?
        }
        Err(e) => return Err(io_failed("resolve", &wanted)(e)),
    };
    // Links inside the volume that stay inside are fine (upstream resolves them too); the walk
    // below then refuses any link, so nothing swapped in meanwhile is followed.
    let Ok(inside) = resolved.strip_prefix(&volume) else {
        return Err(SubPathError::OutOfVolume { path: resolved, volume });
    };
    let handle = at::open_beneath(&volume, inside).map_err(io_failed("open", &resolved))?;
    bind(&handle, &bind_target(pods_dir, sub))
}

/// Makes the missing directories of `sub_path` below `volume` one at a time, each opened
/// without following a link before the next is made in it (upstream `doSafeMakeDir`).
fn make_dirs(volume: &Path, sub_path: &Path) -> Result<(), SubPathError> {
    let mode = std::fs::metadata(volume).map_err(io_failed("read the mode of", volume))?.permissions().mode() & 0o7777;
    let names = at::components(sub_path).map_err(io_failed("create", sub_path))?;
    // The longest part that exists, resolved; it must be in the volume.
    let existing = (0..names.len())
        .rev()
        .find_map(|n| {
            let prefix: PathBuf = names[..n].iter().collect();
            std::fs::canonicalize(volume.join(&prefix)).ok().map(|real| (n, real))
        })
        .unwrap_or((0, volume.to_owned()));
    let (present, real) = existing;
    let Ok(inside) = real.strip_prefix(volume) else {
        return Err(SubPathError::OutOfVolume { path: real, volume: volume.to_owned() });
    };
    let base = at::open_beneath(volume, inside).map_err(io_failed("open", &real))?;
    let mut parent = at::open_dir_at(&base, OsStr::new(".")).map_err(io_failed("open", &real))?;
    let mut path = real;
    for name in &names[present..] {
        path.push(name);
        let (dir, _) = at::make_dir_at(&parent, name, mode).map_err(io_failed("create", &path))?;
        // mkdir's mode went through the umask: the container gets the volume's own mode.
        fchmod(&dir, Mode::from_bits_truncate(mode)).map_err(|e| io_failed("set the mode of", &path)(e.into()))?;
        parent = dir;
    }
    Ok(())
}

/// Bind-mounts what `handle` names at `target`, or keeps `target` when it already is.
fn bind(handle: &OwnedFd, target: &Path) -> Result<PathBuf, SubPathError> {
    let source = fstat(handle).map_err(|e| io_failed("inspect", target)(e.into()))?;
    if is_mount_point(target)? {
        let bound = std::fs::symlink_metadata(target).map_err(io_failed("inspect", target))?;
        if bound.dev() == source.st_dev && bound.ino() == source.st_ino {
            return Ok(target.to_owned());
        }
        umount(target).map_err(|e| io_failed("unmount", target)(e.into()))?;
    }
    let parent = target.parent().unwrap_or(target);
    std::fs::DirBuilder::new().recursive(true).mode(0o750).create(parent).map_err(io_failed("create", parent))?;
    if at::is_dir(handle).map_err(io_failed("inspect", target))? {
        match std::fs::DirBuilder::new().mode(0o750).create(target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_failed("create", target)(e)),
        }
    } else {
        // A file takes the bind mount of any kind of non-directory.
        File::options()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o640)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(target)
            .map_err(io_failed("create", target))?;
    }
    let fd_path = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()));
    if let Err(errno) = mount(Some(&fd_path), target, None::<&str>, MsFlags::MS_BIND, None::<&str>) {
        let _ = std::fs::remove_dir(target).or_else(|_| std::fs::remove_file(target));
        return Err(io_failed("bind-mount a subPath at", target)(errno.into()));
    }
    Ok(target.to_owned())
}

fn is_mount_point(path: &Path) -> Result<bool, SubPathError> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").map_err(io_failed("read the mount table for", path))?;
    Ok(kubelet_core::volume::mount_points(&table).any(|point| Path::new(&point) == path))
}

/// Unmounts and removes every subPath bind mount of the pod in `pod_dir` (upstream
/// `CleanSubPaths`), then the directories that held them. A target that cannot be unmounted
/// stays, with an error, and so do its parents; nothing is removed but empty directories and the
/// empty files the bind mounts were made on. Blocking.
pub fn clean(pod_dir: &Path) -> Result<(), SubPathError> {
    let root = pod_dir.join(SUBPATHS_DIR);
    let Ok(volumes) = std::fs::read_dir(&root) else { return Ok(()) };
    for volume in volumes.flatten() {
        for container in std::fs::read_dir(volume.path()).into_iter().flatten().flatten() {
            for target in std::fs::read_dir(container.path()).into_iter().flatten().flatten() {
                let target = target.path();
                if is_mount_point(&target)? {
                    umount(&target).map_err(|e| io_failed("unmount", &target)(e.into()))?;
                }
                std::fs::remove_dir(&target)
                    .or_else(|_| std::fs::remove_file(&target))
                    .map_err(io_failed("remove", &target))?;
            }
            std::fs::remove_dir(container.path()).map_err(io_failed("remove", &container.path()))?;
        }
        std::fs::remove_dir(volume.path()).map_err(io_failed("remove", &volume.path()))?;
    }
    std::fs::remove_dir(&root).map_err(io_failed("remove", &root))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// Bind mounts need root: a test without it says so and passes, but under CI.
    fn root_or_skip(test: &str) -> bool {
        let root = crate::tests::is_root();
        if !root {
            kubelet_core::testing::skip(test, "bind mounts need root");
        }
        root
    }

    /// Pod `u1`'s mount `index` of volume `data` (at `volume`) in container `app`.
    fn sub(volume: &Path, index: usize, sub_path: &str) -> SubPath {
        SubPath::new(kubelet_core::PodUid::new("u1"), ("data", volume), "app", index, sub_path)
    }

    fn same_file(a: &Path, b: &Path) -> bool {
        let (a, b) = (std::fs::metadata(a).unwrap(), std::fs::metadata(b).unwrap());
        (a.dev(), a.ino()) == (b.dev(), b.ino())
    }

    #[test]
    fn a_sub_path_is_bound_by_handle_kept_and_cleaned_up() {
        if !root_or_skip("a_sub_path_is_bound_by_handle_kept_and_cleaned_up") {
            return;
        }
        let scratch = tempfile::tempdir().unwrap();
        let (pods, volume) = (scratch.path().join("pods"), scratch.path().join("volume"));
        let pod_dir = pods.join("u1");
        std::fs::create_dir_all(volume.join("conf")).unwrap();
        std::fs::write(volume.join("conf/app.yaml"), "a: 1").unwrap();
        std::fs::set_permissions(&volume, std::fs::Permissions::from_mode(0o777)).unwrap();
        // A link that stays inside the volume is resolved, as upstream does.
        symlink("conf/app.yaml", volume.join("current")).unwrap();

        let dir = prepare(&pods, &sub(&volume, 0, "conf")).unwrap();
        assert_eq!(dir, pod_dir.join("volume-subpaths/data/app/0"));
        assert!(same_file(&dir, &volume.join("conf")));
        let file = prepare(&pods, &sub(&volume, 1, "current")).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "a: 1");
        // A missing subPath is made, every level with the volume's mode whatever the umask.
        let made = prepare(&pods, &sub(&volume, 2, "new/deeper")).unwrap();
        for level in ["new", "new/deeper"] {
            let mode = std::fs::metadata(volume.join(level)).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o777, "{level}");
        }
        assert!(same_file(&made, &volume.join("new/deeper")));
        // Prepared again (a restarted container): the same mount, not a second one on top.
        let table = || std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mounts_before = table().lines().count();
        assert_eq!(prepare(&pods, &sub(&volume, 0, "conf")).unwrap(), dir);
        assert_eq!(table().lines().count(), mounts_before);

        clean(&pod_dir).unwrap();
        assert!(!pod_dir.join(SUBPATHS_DIR).exists(), "every bind mount and its directories are gone");
        assert!(!table().contains(&pod_dir.display().to_string()));
        assert_eq!(std::fs::read_to_string(volume.join("conf/app.yaml")).unwrap(), "a: 1", "the volume keeps its data");
    }

    #[test]
    fn a_sub_path_out_of_the_volume_is_refused() {
        if !root_or_skip("a_sub_path_out_of_the_volume_is_refused") {
            return;
        }
        let scratch = tempfile::tempdir().unwrap();
        let (pods, volume, host) =
            (scratch.path().join("pods"), scratch.path().join("volume"), scratch.path().join("host"));
        let pod_dir = pods.join("u1");
        std::fs::create_dir_all(&volume).unwrap();
        std::fs::create_dir_all(host.join("etc")).unwrap();
        symlink(&host, volume.join("escape")).unwrap();
        symlink("../host", volume.join("up")).unwrap();
        for sub_path in ["escape", "escape/etc", "up/etc", "escape/made"] {
            let err = prepare(&pods, &sub(&volume, 0, sub_path)).unwrap_err();
            assert!(matches!(err, SubPathError::OutOfVolume { .. }), "{sub_path}: {err}");
        }
        assert!(!host.join("made").exists(), "nothing was made outside the volume");
        for (sub_path, reason) in [("/etc", "must be a relative path"), ("a/../../x", "must not contain '..'")] {
            let err = prepare(&pods, &sub(&volume, 0, sub_path)).unwrap_err();
            assert_eq!(err.to_string(), format!("subPath {sub_path:?} {reason}"));
            assert!(matches!(err, SubPathError::Invalid(_)));
        }
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!table.contains(&pod_dir.display().to_string()), "nothing was mounted");
        clean(&pod_dir).unwrap();
    }

    /// CVE-2021-25741: the container swaps the subPath's directory for a link to the host while
    /// the agent prepares it. Whatever the timing, what gets mounted is the volume's directory.
    #[test]
    fn a_sub_path_swapped_for_a_link_meanwhile_never_mounts_the_host() {
        if !root_or_skip("a_sub_path_swapped_for_a_link_meanwhile_never_mounts_the_host") {
            return;
        }
        use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
        let scratch = tempfile::tempdir().unwrap();
        let (pods, volume, host) =
            (scratch.path().join("pods"), scratch.path().join("volume"), scratch.path().join("host"));
        let pod_dir = pods.join("u1");
        std::fs::create_dir_all(volume.join("data")).unwrap();
        std::fs::create_dir_all(&host).unwrap();
        symlink(&host, volume.join("swap")).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (volume, done) = (volume.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let (a, b) = (volume.join("data"), volume.join("swap"));
                    renameat2(AT_FDCWD, &a, AT_FDCWD, &b, RenameFlags::RENAME_EXCHANGE).unwrap();
                }
            })
        };
        let (mut bound, mut refused) = (0, 0);
        for _ in 0..300 {
            match prepare(&pods, &sub(&volume, 0, "data")) {
                Ok(target) => {
                    assert!(!same_file(&target, &host), "the host's directory was mounted");
                    bound += 1;
                }
                Err(_) => refused += 1,
            }
            clean(&pod_dir).unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
        println!("during the swaps: bound {bound}, refused {refused}");
        // Once the container stops swapping, the directory is mounted, and the link refused.
        if std::fs::symlink_metadata(volume.join("data")).unwrap().is_symlink() {
            renameat2(AT_FDCWD, &volume.join("data"), AT_FDCWD, &volume.join("swap"), RenameFlags::RENAME_EXCHANGE)
                .unwrap();
        }
        let target = prepare(&pods, &sub(&volume, 0, "data")).unwrap();
        assert!(same_file(&target, &volume.join("data")));
        let err = prepare(&pods, &sub(&volume, 1, "swap")).unwrap_err();
        assert!(matches!(err, SubPathError::OutOfVolume { .. }), "{err}");
        clean(&pod_dir).unwrap();
    }
}
