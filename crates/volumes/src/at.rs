//! File operations relative to a directory handle that never follow a link: how the agent
//! works inside a directory whose content a container may have written (upstream's
//! `doSafeOpen` and `doSafeMakeDir` in `volume/util/subpath`).
//!
//! Each name is one path component looked up in a directory the agent holds open, with
//! `O_NOFOLLOW`: a link planted where a directory was expected makes the operation fail instead
//! of leading it elsewhere, and a link to be removed is removed itself.

use std::{
    ffi::{OsStr, OsString},
    io,
    os::{
        fd::{AsFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Component, Path},
};

use nix::{
    dir::{Dir, Type},
    errno::Errno,
    fcntl::{AtFlags, OFlag, openat},
    sys::stat::{Mode, SFlag, fstat, fstatat, mkdirat},
    unistd::{UnlinkatFlags, unlinkat},
};

/// How deep [`remove_entry`] goes before it gives up: far deeper than any volume's own files.
const MAX_DEPTH: usize = 64;

/// Flags that open a directory to read and to work in, never through a link.
fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

fn io_error(errno: Errno) -> io::Error {
    io::Error::from_raw_os_error(errno as i32)
}

/// The error of finding a link where the walk expected a directory or a file.
fn link_found(name: &OsStr) -> io::Error {
    io::Error::other(format!("{} is a symbolic link", Path::new(name).display()))
}

/// Opens directory `path` (absolute, or relative to the working directory) without following
/// a link at its last component. The caller trusts every component before it.
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    openat(nix::fcntl::AT_FDCWD, path, dir_flags(), Mode::empty()).map_err(io_error)
}

/// Opens directory `name` in `parent` without following a link.
pub(crate) fn open_dir_at(parent: impl AsFd, name: &OsStr) -> io::Result<OwnedFd> {
    openat(parent, name, dir_flags(), Mode::empty()).map_err(io_error)
}

/// The components of a relative path that has no `..` and is not absolute; anything else is
/// an error.
pub(crate) fn components(path: &Path) -> io::Result<Vec<&OsStr>> {
    path.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a relative path without '..'", path.display()),
            )),
        })
        .collect()
}

/// Opens `path` below `base` one component at a time with `O_PATH | O_NOFOLLOW`, failing on
/// any link on the way or at the end: the handle names what `path` named inside `base` at the
/// moment of each step, whatever is renamed or replaced meanwhile.
pub(crate) fn open_beneath(base: &Path, path: &Path) -> io::Result<OwnedFd> {
    let mut current =
        openat(nix::fcntl::AT_FDCWD, base, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(io_error)?;
    if is_link(&current)? {
        return Err(link_found(base.as_os_str()));
    }
    for name in components(path)? {
        let next = openat(&current, name, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(io_error)?;
        if is_link(&next)? {
            return Err(link_found(name));
        }
        current = next;
    }
    Ok(current)
}

fn is_link(fd: &OwnedFd) -> io::Result<bool> {
    let stat = fstat(fd).map_err(io_error)?;
    Ok(SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFLNK)
}

/// Whether `fd` is a directory.
pub(crate) fn is_dir(fd: impl AsFd) -> io::Result<bool> {
    let stat = fstat(fd).map_err(io_error)?;
    Ok(SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR)
}

/// Makes directory `name` in `parent` with `mode` if it is missing, and opens it (never
/// through a link). Returns the handle and whether it was made.
pub(crate) fn make_dir_at(parent: impl AsFd, name: &OsStr, mode: u32) -> io::Result<(OwnedFd, bool)> {
    let made = match mkdirat(parent.as_fd(), name, Mode::from_bits_truncate(mode)) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(errno) => return Err(io_error(errno)),
    };
    Ok((open_dir_at(parent, name)?, made))
}

/// The names in directory `dir` with their types (none when the file system does not say),
/// without `.` and `..`.
pub(crate) fn entries(dir: impl AsFd) -> io::Result<Vec<(OsString, Option<Type>)>> {
    let mut listing = Dir::openat(dir, ".", dir_flags(), Mode::empty()).map_err(io_error)?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(io_error)?;
        let bytes = entry.file_name().to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        names.push((OsStr::from_bytes(bytes).to_owned(), entry.file_type()));
    }
    Ok(names)
}

/// The type of `name` in `parent`, not following a link; `None` when there is nothing.
pub(crate) fn type_at(parent: impl AsFd, name: &OsStr) -> io::Result<Option<SFlag>> {
    match fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()))),
        Err(Errno::ENOENT) => Ok(None),
        Err(errno) => Err(io_error(errno)),
    }
}

/// Removes `name` from `parent` whatever it is: a link itself (never what it points to), a
/// file, or a directory with everything in it. Nothing there is not an error.
pub(crate) fn remove_entry(parent: impl AsFd, name: &OsStr) -> io::Result<()> {
    remove_at_depth(parent.as_fd(), name, 0)
}

fn remove_at_depth(parent: std::os::fd::BorrowedFd<'_>, name: &OsStr, depth: usize) -> io::Result<()> {
    match type_at(parent, name)? {
        None => Ok(()),
        Some(SFlag::S_IFDIR) => {
            if depth >= MAX_DEPTH {
                return Err(io::Error::other(format!("more than {MAX_DEPTH} directories deep; not removing")));
            }
            let dir = open_dir_at(parent, name)?;
            for (child, _) in entries(&dir)? {
                remove_at_depth(dir.as_fd(), &child, depth + 1)?;
            }
            match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => Ok(()),
                Err(errno) => Err(io_error(errno)),
            }
        }
        Some(_) => match unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(errno) => Err(io_error(errno)),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn a_walk_beneath_a_directory_refuses_every_link() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("vol");
        std::fs::create_dir_all(base.join("a/b")).unwrap();
        std::fs::write(base.join("a/b/file"), "x").unwrap();
        symlink("/", base.join("a/root")).unwrap();
        symlink("b", base.join("a/inside")).unwrap();

        assert!(open_beneath(&base, Path::new("a/b/file")).is_ok());
        assert!(is_dir(open_beneath(&base, Path::new("a/./b")).unwrap()).unwrap());
        for linked in ["a/root", "a/root/etc", "a/inside/file"] {
            let err = open_beneath(&base, Path::new(linked)).unwrap_err();
            assert!(err.to_string().contains("symbolic link") || err.raw_os_error().is_some(), "{linked}: {err}");
        }
        for outside in ["../x", "/etc"] {
            assert_eq!(open_beneath(&base, Path::new(outside)).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        }
        // The base itself must not be a link either.
        symlink(&base, dir.path().join("alias")).unwrap();
        assert!(open_beneath(&dir.path().join("alias"), Path::new("a")).is_err());
    }

    #[test]
    fn removal_takes_links_never_their_targets() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "host data").unwrap();
        let vol = dir.path().join("vol");
        std::fs::create_dir_all(vol.join("tree/deeper")).unwrap();
        symlink(&outside, vol.join("tree/deeper/link")).unwrap();
        symlink(&outside, vol.join("top-link")).unwrap();
        std::fs::write(vol.join("file"), "x").unwrap();

        let root = open_dir(&vol).unwrap();
        for name in ["tree", "top-link", "file", "missing"] {
            remove_entry(&root, OsStr::new(name)).unwrap();
        }
        assert!(entries(&root).unwrap().is_empty());
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "host data");
        // A directory handle is never opened through a link.
        symlink(&outside, vol.join("alias")).unwrap();
        assert!(open_dir_at(&root, OsStr::new("alias")).is_err());
        assert!(open_dir(&vol.join("alias")).is_err());
    }
}
