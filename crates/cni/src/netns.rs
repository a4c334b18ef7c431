//! Network namespaces kept as files: made, joined and removed without the `ip` command.
//!
//! A namespace lives as long as a bind mount of it does: [`create`] unshares one on a thread of
//! its own and bind-mounts it on a file, as `ip netns add` and container runtimes do;
//! [`remove`] unmounts and deletes the file; [`join_on_spawn`] makes a command start inside it.

use std::{
    fs::{self, File, OpenOptions},
    io,
    path::{Path, PathBuf},
    process::Command,
};

use nix::{
    errno::Errno,
    mount::{MntFlags, MsFlags, mount, umount2},
    sched::{CloneFlags, setns, unshare},
};

/// Makes a new network namespace, held by a bind mount on `path` (created; it must not exist).
///
/// The namespace has only a loopback interface, down, as every new network namespace has.
pub fn create(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    OpenOptions::new().write(true).create_new(true).open(path)?;
    let target = path.to_owned();
    // The namespace is unshared on a thread that exists for this alone: unshare changes the
    // calling thread's namespace, and the thread ends right after the mount.
    let outcome = std::thread::Builder::new()
        .name("netns-create".into())
        .spawn(move || bind_new_namespace(&target))?
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")));
    if outcome.is_err() {
        let _ = fs::remove_file(path);
    }
    outcome
}

fn bind_new_namespace(target: &PathBuf) -> io::Result<()> {
    unshare(CloneFlags::CLONE_NEWNET)?;
    mount(Some("/proc/thread-self/ns/net"), target, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
    Ok(())
}

/// Unmounts the namespace at `path` and removes the file: the namespace ends once no process
/// is left in it. A path that is not there, or not mounted, is removed all the same.
pub fn remove(path: &Path) -> io::Result<()> {
    match umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(Errno::EINVAL | Errno::ENOENT) => {}
        Err(errno) => return Err(errno.into()),
    }
    match fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// Whether `path` holds a network namespace (a bind mount of one), not a plain file.
pub fn is_namespace(path: &Path) -> bool {
    File::open(path).is_ok_and(|file| setns_target_is_net(&file))
}

fn setns_target_is_net(file: &File) -> bool {
    // NS_GET_NSTYPE needs an ioctl; a namespace file is on nsfs, whose magic statfs reports.
    nix::sys::statfs::fstatfs(file).is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

/// Makes `command` join the network namespace at `path` when it is spawned.
///
/// The namespace is opened now (an error if it is not one), and joined in the child between
/// fork and exec.
pub fn join_on_spawn(command: &mut Command, path: &Path) -> io::Result<()> {
    let namespace = File::open(path)?;
    if !setns_target_is_net(&namespace) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a namespace", path.display())));
    }
    pre_exec_setns(command, namespace);
    Ok(())
}

#[allow(unsafe_code)] // Reason: joining a namespace in the child, between fork and exec, needs pre_exec.
fn pre_exec_setns(command: &mut Command, namespace: File) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: the closure only calls setns(2), a single system call that is async-signal-safe;
    // it allocates nothing and takes no lock, as code between fork and exec must not.
    unsafe {
        command.pre_exec(move || setns(&namespace, CloneFlags::CLONE_NEWNET).map_err(io::Error::from));
    }
}
