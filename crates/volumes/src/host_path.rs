//! hostPath volumes (upstream `pkg/volume/hostpath`): a path of the node's, checked against the
//! volume's `type` first, and created for `DirectoryOrCreate` (with its parents) and
//! `FileOrCreate` (the file alone: its directory must exist).

use std::{
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
};

use k8s_openapi::api::core::v1::{Pod, Volume};
use kubelet_core::{hook::BoxFuture, volume::VolumePlugin};

/// hostPath volumes.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HostPath;

/// The name of the plugin (hostPath volumes have no directory under the pod).
pub(crate) const NAME: &str = "kubernetes.io~host-path";

impl VolumePlugin for HostPath {
    fn name(&self) -> &str {
        NAME
    }

    fn supports(&self, volume: &Volume) -> bool {
        volume.host_path.is_some()
    }

    fn set_up<'a>(
        &'a self,
        _pod: &'a Pod,
        volume: &'a Volume,
        _dir: &'a Path,
    ) -> BoxFuture<'a, Result<PathBuf, String>> {
        Box::pin(async move {
            let source = volume.host_path.as_ref().ok_or("not a hostPath volume")?;
            let path = PathBuf::from(&source.path);
            let kind = source.type_.clone().unwrap_or_default();
            tokio::task::spawn_blocking(move || check(&path, &kind).map(|()| path))
                .await
                .map_err(|e| format!("the hostPath check failed: {e}"))?
        })
    }

    fn tear_down<'a>(&'a self, _dir: &'a Path) -> BoxFuture<'a, Result<(), String>> {
        // The node's path is the node's: nothing to undo.
        Box::pin(std::future::ready(Ok(())))
    }
}

/// Upstream's `checkType`: creates what `*OrCreate` asks for, then checks what is there.
pub(crate) fn check(path: &Path, kind: &str) -> Result<(), String> {
    let failed = |what: &str| Err(format!("hostPath type check failed: {} is not {what}", path.display()));
    if !path.is_absolute() {
        return Err(format!("hostPath {} is not an absolute path", path.display()));
    }
    let meta = || std::fs::metadata(path).ok();
    match kind {
        "" => Ok(()),
        "DirectoryOrCreate" => {
            if meta().is_none() {
                std::fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
                    .map_err(|e| format!("cannot set the mode of {}: {e}", path.display()))?;
            }
            if meta().is_some_and(|m| m.is_dir()) { Ok(()) } else { failed("a directory") }
        }
        "Directory" => {
            if meta().is_some_and(|m| m.is_dir()) {
                Ok(())
            } else {
                failed("a directory")
            }
        }
        "FileOrCreate" => {
            // Upstream creates the file alone: a missing parent directory fails the mount.
            if meta().is_none() {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(path)
                    .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
                    .map_err(|e| format!("cannot set the mode of {}: {e}", path.display()))?;
            }
            if meta().is_some_and(|m| m.is_file()) { Ok(()) } else { failed("a file") }
        }
        "File" => {
            if meta().is_some_and(|m| m.is_file()) {
                Ok(())
            } else {
                failed("a file")
            }
        }
        "Socket" => {
            if meta().is_some_and(|m| m.file_type().is_socket()) {
                Ok(())
            } else {
                failed("a socket file")
            }
        }
        "CharDevice" => {
            if meta().is_some_and(|m| m.file_type().is_char_device()) {
                Ok(())
            } else {
                failed("a character device")
            }
        }
        "BlockDevice" => {
            if meta().is_some_and(|m| m.file_type().is_block_device()) {
                Ok(())
            } else {
                failed("a block device")
            }
        }
        other => Err(format!("hostPath type {other:?} is not one of the known types")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_checked_and_or_create_creates() {
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("a/b");
        check(&made, "DirectoryOrCreate").unwrap();
        assert!(made.is_dir());
        check(&made, "Directory").unwrap();
        let err = check(&made, "File").unwrap_err();
        assert_eq!(err, format!("hostPath type check failed: {} is not a file", made.display()));
        let file = dir.path().join("c/f");
        let err = check(&file, "FileOrCreate").unwrap_err();
        assert!(err.starts_with(&format!("cannot create {}: ", file.display())), "{err}");
        assert!(!dir.path().join("c").exists(), "FileOrCreate makes no parent directory");
        std::fs::create_dir(dir.path().join("c")).unwrap();
        check(&file, "FileOrCreate").unwrap();
        assert!(file.is_file());
        check(&file, "File").unwrap();
        assert!(check(&file, "Directory").unwrap_err().ends_with("is not a directory"));
        assert!(check(&dir.path().join("missing"), "Directory").is_err());
        assert!(check(&file, "Socket").unwrap_err().ends_with("is not a socket file"));
        assert!(check(Path::new("/dev/null"), "CharDevice").is_ok());
        assert!(check(Path::new("/dev/null"), "BlockDevice").unwrap_err().ends_with("is not a block device"));
        check(&dir.path().join("anything"), "").unwrap();
        assert!(check(Path::new("relative"), "").is_err());
        assert!(check(&file, "Pipe").is_err());
    }
}
