//! Mounting a tmpfs and unmounting it, with util-linux's `mount` and `umount` as upstream's
//! mount utilities do, and mount points read from `/proc/self/mountinfo`.

use std::path::Path;

use tokio::process::Command;

async fn mountinfo() -> Result<String, String> {
    tokio::fs::read_to_string("/proc/self/mountinfo").await.map_err(|e| format!("cannot read the mount table: {e}"))
}

/// Whether `dir` itself is a mount point.
pub(crate) async fn is_mount_point(dir: &Path) -> Result<bool, String> {
    let table = mountinfo().await?;
    Ok(kubelet_core::volume::mount_below(&table, dir).is_some_and(|point| Path::new(&point) == dir))
}

/// The first mount at or below `dir`, if any.
pub(crate) async fn mount_below(dir: &Path) -> Result<Option<String>, String> {
    Ok(kubelet_core::volume::mount_below(&mountinfo().await?, dir))
}

/// Mounts a tmpfs of `size` bytes (the kernel's default, half the memory, when `None`) on `dir`.
pub(crate) async fn tmpfs(dir: &Path, size: Option<i64>) -> Result<(), String> {
    let mut command = Command::new("mount");
    command.args(["-t", "tmpfs"]);
    if let Some(size) = size {
        command.args(["-o", &format!("size={size}")]);
    }
    command.arg("tmpfs").arg(dir);
    run(&mut command, "mount a tmpfs on", dir).await
}

/// Unmounts `dir`.
pub(crate) async fn unmount(dir: &Path) -> Result<(), String> {
    run(Command::new("umount").arg(dir), "unmount", dir).await
}

async fn run(command: &mut Command, what: &str, dir: &Path) -> Result<(), String> {
    let output = command.output().await.map_err(|e| format!("cannot {what} {}: {e}", dir.display()))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!("cannot {what} {}: {}", dir.display(), String::from_utf8_lossy(&output.stderr).trim()))
}
