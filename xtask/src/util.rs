//! Helpers shared by the xtask commands: paths, running commands, environment checks.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// Names a copy of the source for this binary to work in, as its root: the compile-only lane of
/// `cargo xtask ci` runs the same binary in one ([`crate::lane`]).
pub(crate) const ROOT_VAR: &str = "KUBELET_RS_XTASK_ROOT";

/// The workspace root: the parent of `xtask/`, or the copy [`ROOT_VAR`] names.
pub(crate) fn project_root() -> Result<PathBuf> {
    if let Some(copy) = std::env::var_os(ROOT_VAR) {
        return Ok(PathBuf::from(copy));
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).context("xtask has no parent directory")
}

/// Whether we run under CI (`CI=true`), where a missing prerequisite is a failure.
pub(crate) fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether this process runs as root.
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// Whether `program` is on PATH (or is an executable path).
pub(crate) fn have(program: &str) -> bool {
    if program.contains('/') {
        return Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

/// Runs a command, echoing it, and fails unless it exits 0.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {}", display(cmd));
    let status = cmd.status().with_context(|| format!("cannot start {}", display(cmd)))?;
    if !status.success() {
        bail!("`{}` failed: {status}", display(cmd));
    }
    Ok(())
}

/// Runs a command quietly and returns its stdout; fails with its stderr unless it exits 0.
pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("cannot start {}", display(cmd)))?;
    if !out.status.success() {
        bail!("`{}` failed: {}\n{}", display(cmd), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The command as a shell-like line.
pub(crate) fn display(cmd: &Command) -> String {
    let mut line = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// The hex SHA-256 of a file.
pub(crate) fn sha256(path: &Path) -> Result<String> {
    let out = output(Command::new("sha256sum").arg(path))?;
    out.split_whitespace().next().map(str::to_owned).context("sha256sum printed nothing")
}

/// Small tmpfs mounts, unmounted when dropped: a scenario's filesystems of its own size, or a
/// benchmark's scratch space kept off the host's disk.
pub(crate) struct SmallFilesystems(pub(crate) Vec<PathBuf>);

impl SmallFilesystems {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it) on each of `paths`, made first
    /// where missing.
    pub(crate) fn mount(paths: &[PathBuf], size: &str) -> Result<SmallFilesystems> {
        let mut mounted = SmallFilesystems(Vec::new());
        for path in paths {
            std::fs::create_dir_all(path)?;
            let options = format!("size={size}");
            output(Command::new("mount").args(["-t", "tmpfs", "-o", &options, "tmpfs"]).arg(path))?;
            mounted.0.push(path.clone());
        }
        Ok(mounted)
    }
}

impl Drop for SmallFilesystems {
    fn drop(&mut self) {
        for path in self.0.iter().rev() {
            // Lazily: whatever still holds a file there lets go of it later.
            let _ = output(Command::new("umount").arg("-l").arg(path));
        }
    }
}
