//! The atomic writer (upstream `pkg/volume/util/atomic_writer.go`): a set of files appears in a
//! directory all at once, so a reader never sees half of an update.
//!
//! The files live in a hidden timestamped directory (`..2026_11_23_23_40_00.123456789`); the
//! symlink `..data` points at the current one and is replaced with one `rename`; each visible
//! top-level name is a symlink through `..data` (`labels -> ..data/labels`).
//!
//! The volume directory is the agent's, but nothing inside it is trusted: the writer works
//! relative to a handle on the directory and never follows a link ([`crate::at`]).
//! `..data` counts only as a link to a `..`-named directory directly inside; every other
//! entry that the current set does not account for is removed (a link itself, never what it
//! points to), so each write leaves the directory exactly as the writer would have made it.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::{OsStr, OsString},
    io::{self, Read, Write},
    os::fd::{AsFd, OwnedFd},
    path::{Component, Path},
};

use nix::{
    fcntl::{AtFlags, OFlag, openat, readlinkat, renameat},
    sys::stat::{Mode, SFlag, fchmod, fstat},
    unistd::{Gid, Uid, fchown, fchownat, symlinkat},
};

use crate::at;

/// The symlink to the current set.
pub(crate) const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// One file of the set: its content, mode and, when it has one of its own, owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct File {
    pub(crate) content: Vec<u8>,
    pub(crate) mode: u32,
    /// The user the file is given to (a projected token's, upstream's `FsUser`); otherwise the
    /// agent's, which makes it.
    pub(crate) owner: Option<u32>,
}

impl File {
    /// A file of the agent's with `content` and `mode`.
    pub(crate) fn new(content: Vec<u8>, mode: u32) -> Self {
        File { content, mode, owner: None }
    }
}

/// The group a set's files and directories are given (the pod's `fsGroup`), as upstream's
/// `SetVolumeOwnership` leaves a volume whose content the kubelet writes: the group owns every
/// entry, files gain read for their owner and group (0440), and directories are setgid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Group(pub(crate) Option<u32>);

impl Group {
    /// The mode `file` is written with.
    fn file_mode(self, file: &File) -> u32 {
        if self.0.is_some() { file.mode | 0o440 } else { file.mode }
    }

    /// The mode of a directory of the set (and of the volume's directory).
    fn dir_mode(self) -> u32 {
        if self.0.is_some() { 0o2755 } else { 0o755 }
    }

    fn gid(self) -> Option<Gid> {
        self.0.map(Gid::from_raw)
    }

    /// Gives `fd` to `owner` and this group, where either is set.
    fn give(self, fd: impl AsFd, owner: Option<u32>) -> io::Result<()> {
        if owner.is_none() && self.0.is_none() {
            return Ok(());
        }
        fchown(fd, owner.map(Uid::from_raw), self.gid()).map_err(io::Error::from)
    }

    /// Gives the link `name` in `dir` (not what it points to) to this group, where it is set.
    fn give_link(self, dir: impl AsFd, name: &OsStr) -> io::Result<()> {
        let Some(gid) = self.gid() else { return Ok(()) };
        fchownat(dir, name, None, Some(gid), AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io::Error::from)
    }
}

/// Checks a payload path: relative, no `..`, not starting with `..` (upstream `validatePath`).
pub(crate) fn validate_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("the path is empty".to_owned());
    }
    if path.starts_with("..") {
        return Err(format!("{path:?} must not start with '..'"));
    }
    for component in Path::new(path).components() {
        match component {
            Component::Normal(_) => {}
            Component::ParentDir => return Err(format!("{path:?} must not contain '..'")),
            _ => return Err(format!("{path:?} must be a relative path")),
        }
    }
    Ok(())
}

/// Whether `name` can name a set: `..` and more, one component, not one of the writer's links.
fn is_set_name(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else { return false };
    name.len() > 2 && name.starts_with("..") && !name.contains('/') && name != DATA && name != DATA_TMP
}

fn failed(what: &str, path: &Path, err: impl std::fmt::Display) -> String {
    format!("{what} {}: {err}", path.display())
}

/// Makes `dir` hold exactly `payload` (paths relative to `dir`), everything given to `group`;
/// returns whether anything changed. Blocking: call it on the blocking pool.
pub(crate) fn write(dir: &Path, payload: &BTreeMap<String, File>, stamp: &str, group: Group) -> Result<bool, String> {
    for path in payload.keys() {
        validate_path(path)?;
    }
    std::fs::create_dir_all(dir).map_err(|e| failed("cannot create", dir, e))?;
    let root = at::open_dir(dir).map_err(|e| failed("cannot open", dir, e))?;
    if group.0.is_some() {
        group.give(&root, None).map_err(|e| failed("cannot give the group", dir, e))?;
        fchmod(&root, Mode::from_bits_truncate(group.dir_mode()))
            .map_err(|e| failed("cannot set the mode of", dir, e))?;
    }
    let current = current_set(&root);
    let up_to_date = current.as_ref().is_some_and(|set| same_set(&root, set, payload, group));
    let set = match current {
        Some(set) if up_to_date => set,
        current => {
            let set = fresh_name(stamp, current.as_deref());
            write_set(&root, &set, payload, group).map_err(|e| failed("cannot write", &dir.join(&set), e))?;
            swap(&root, &set, group).map_err(|e| failed("cannot swap", &dir.join(DATA), e))?;
            set
        }
    };
    let visible: BTreeSet<&OsStr> = payload.keys().filter_map(|p| p.split('/').next()).map(OsStr::new).collect();
    let relinked = link_visible(&root, &visible, group).map_err(|e| failed("cannot link in", dir, e))?;
    let removed = remove_strays(&root, &set, &visible).map_err(|e| failed("cannot clean", dir, e))?;
    Ok(!up_to_date || relinked || removed)
}

/// The set `..data` names, when it is a link to a set directory directly inside.
fn current_set(root: &OwnedFd) -> Option<OsString> {
    let target = readlinkat(root, DATA).ok()?;
    let is_dir = at::type_at(root, &target).ok().flatten() == Some(SFlag::S_IFDIR);
    (is_set_name(&target) && is_dir).then_some(target)
}

/// The new set's name: `..<stamp>`, never the current set's (should the stamp repeat).
fn fresh_name(stamp: &str, current: Option<&OsStr>) -> OsString {
    let mut name = OsString::from(format!("..{stamp}"));
    if current == Some(name.as_os_str()) {
        name.push(".1");
    }
    name
}

/// Whether set `set` holds `payload` exactly, given to `group`: contents, modes, owners, and no
/// other file.
fn same_set(root: &OwnedFd, set: &OsStr, payload: &BTreeMap<String, File>, group: Group) -> bool {
    let Ok(set) = at::open_dir_at(root, set) else { return false };
    let all_match = payload.iter().all(|(path, file)| same_file(&set, Path::new(path), file, group).unwrap_or(false));
    all_match && count_files(&set, 0).is_ok_and(|n| n == payload.len())
}

fn same_file(set: &OwnedFd, path: &Path, file: &File, group: Group) -> io::Result<bool> {
    let opened = open_in_set(set, path, OFlag::O_RDONLY | OFlag::O_NONBLOCK, Mode::empty())?;
    let stat = fstat(&opened).map_err(io::Error::from)?;
    let regular = SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFREG;
    let same_size = u64::try_from(stat.st_size).is_ok_and(|size| size == file.content.len() as u64);
    // Only what the writer sets: a file left to whoever made it is that user's, whoever that is.
    let same_owner = file.owner.is_none_or(|uid| uid == stat.st_uid) && group.0.is_none_or(|gid| gid == stat.st_gid);
    if !regular || !same_size || !same_owner || stat.st_mode & 0o7777 != group.file_mode(file) {
        return Ok(false);
    }
    let mut content = Vec::with_capacity(file.content.len());
    std::fs::File::from(opened).take(file.content.len() as u64 + 1).read_to_end(&mut content)?;
    Ok(content == file.content)
}

/// Opens `path` of a set: its directories never through a link, the file itself with `flags`
/// and `O_NOFOLLOW`.
fn open_in_set(set: &OwnedFd, path: &Path, flags: OFlag, mode: Mode) -> io::Result<OwnedFd> {
    let names = at::components(path)?;
    let Some((file, dirs)) = names.split_last() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "an empty path"));
    };
    let parent = directories(set, dirs, None)?;
    let parent = parent.as_ref().map_or(set.as_fd(), AsFd::as_fd);
    openat(parent, *file, flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, mode).map_err(io::Error::from)
}

/// Opens (and with `make`, makes, given to `group`) directories `dirs` below `set`, one inside
/// the other, never through a link; returns the last one (none when `dirs` is empty: the set
/// itself).
fn directories(set: &OwnedFd, dirs: &[&OsStr], make: Option<Group>) -> io::Result<Option<OwnedFd>> {
    let mut parent: Option<OwnedFd> = None;
    for name in dirs {
        let here = parent.as_ref().map_or(set.as_fd(), AsFd::as_fd);
        let next = match make {
            Some(group) => {
                let (made, _) = at::make_dir_at(here, name, 0o755)?;
                group.give(&made, None)?;
                fchmod(&made, Mode::from_bits_truncate(group.dir_mode())).map_err(io::Error::from)?;
                made
            }
            None => at::open_dir_at(here, name)?,
        };
        parent = Some(next);
    }
    Ok(parent)
}

/// The files below directory `dir`, anything but directories counted, no link followed.
fn count_files(dir: &OwnedFd, depth: usize) -> io::Result<usize> {
    if depth > 64 {
        return Err(io::Error::other("too deep"));
    }
    let mut count = 0;
    for (name, _) in at::entries(dir)? {
        if at::type_at(dir, &name)? == Some(SFlag::S_IFDIR) {
            count += count_files(&at::open_dir_at(dir, &name)?, depth + 1)?;
        } else {
            count += 1;
        }
    }
    Ok(count)
}

/// Writes `payload` into a new directory `set`, whatever had that name before, everything given
/// to `group`.
fn write_set(root: &OwnedFd, set: &OsStr, payload: &BTreeMap<String, File>, group: Group) -> io::Result<()> {
    at::remove_entry(root, set)?;
    let (set_dir, _) = at::make_dir_at(root, set, 0o700)?;
    for (path, file) in payload {
        let names = at::components(Path::new(path))?;
        if let Some((_, dirs)) = names.split_last() {
            directories(&set_dir, dirs, Some(group))?;
        }
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
        let created = open_in_set(&set_dir, Path::new(path), flags, Mode::from_bits_truncate(0o600))?;
        group.give(&created, file.owner)?;
        fchmod(&created, Mode::from_bits_truncate(group.file_mode(file))).map_err(io::Error::from)?;
        std::fs::File::from(created).write_all(&file.content)?;
    }
    group.give(&set_dir, None)?;
    fchmod(&set_dir, Mode::from_bits_truncate(group.dir_mode())).map_err(io::Error::from)
}

/// Points `..data` at `set` with one rename.
fn swap(root: &OwnedFd, set: &OsStr, group: Group) -> io::Result<()> {
    at::remove_entry(root, OsStr::new(DATA_TMP))?;
    symlinkat(set, root, DATA_TMP).map_err(io::Error::from)?;
    group.give_link(root, OsStr::new(DATA_TMP))?;
    // Only a link can be renamed over: anything else named `..data` goes first.
    if at::type_at(root, OsStr::new(DATA))?.is_some_and(|kind| kind != SFlag::S_IFLNK) {
        at::remove_entry(root, OsStr::new(DATA))?;
    }
    renameat(root, DATA_TMP, root, DATA).map_err(io::Error::from)
}

/// Makes each visible name the link `..data/<name>`, given to `group`; returns whether any was
/// missing or wrong.
fn link_visible(root: &OwnedFd, visible: &BTreeSet<&OsStr>, group: Group) -> io::Result<bool> {
    let mut changed = false;
    for name in visible {
        let wanted = Path::new(DATA).join(name);
        if readlinkat(root, *name).is_ok_and(|target| Path::new(&target) == wanted) {
            continue;
        }
        at::remove_entry(root, name)?;
        symlinkat(&wanted, root, *name).map_err(io::Error::from)?;
        group.give_link(root, name)?;
        changed = true;
    }
    Ok(changed)
}

/// Removes everything but `..data`, the current set and the visible names (old sets, names no
/// longer in the set, and whatever else was put there); returns whether anything went.
fn remove_strays(root: &OwnedFd, set: &OsStr, visible: &BTreeSet<&OsStr>) -> io::Result<bool> {
    let mut removed = false;
    for (name, _) in at::entries(root)? {
        if name == DATA || name == set || visible.contains(name.as_os_str()) {
            continue;
        }
        at::remove_entry(root, &name)?;
        removed = true;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn payload(files: &[(&str, &str)]) -> BTreeMap<String, File> {
        files.iter().map(|(p, c)| ((*p).to_owned(), File::new(c.as_bytes().to_vec(), 0o644))).collect()
    }

    #[test]
    fn paths_may_not_escape() {
        assert!(validate_path("labels").is_ok());
        assert!(validate_path("a/b").is_ok());
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "..data"] {
            assert!(validate_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_set_appears_whole_and_is_swapped_whole() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("vol");
        assert!(
            write(&root, &payload(&[("labels", "app=\"web\""), ("sub/name", "web")]), "1", Group::default()).unwrap()
        );
        assert_eq!(std::fs::read_to_string(root.join("labels")).unwrap(), "app=\"web\"");
        assert_eq!(std::fs::read_to_string(root.join("sub/name")).unwrap(), "web");
        assert_eq!(std::fs::read_link(root.join("labels")).unwrap(), Path::new("..data/labels"));
        let first = std::fs::read_link(root.join(DATA)).unwrap();

        // The same set again: nothing is written.
        assert!(
            !write(&root, &payload(&[("labels", "app=\"web\""), ("sub/name", "web")]), "2", Group::default()).unwrap()
        );
        assert_eq!(std::fs::read_link(root.join(DATA)).unwrap(), first);

        // A changed set: a new directory behind `..data`; the old one and a dropped name go.
        assert!(write(&root, &payload(&[("labels", "app=\"api\"")]), "3", Group::default()).unwrap());
        assert_eq!(std::fs::read_to_string(root.join("labels")).unwrap(), "app=\"api\"");
        assert_eq!(std::fs::read_link(root.join(DATA)).unwrap(), Path::new("..3"));
        assert!(!root.join(&first).exists(), "the old set is removed");
        assert!(std::fs::symlink_metadata(root.join("sub")).is_err(), "a name no longer in the set is removed");

        // A mode change alone is a change.
        let mut modes = payload(&[("labels", "app=\"api\"")]);
        modes.get_mut("labels").unwrap().mode = 0o400;
        assert!(write(&root, &modes, "4", Group::default()).unwrap());
        let mode = std::fs::metadata(root.join("labels")).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o400);
    }

    #[test]
    fn a_reader_never_sees_half_a_set() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("vol");
        // Two files that always carry the same generation, large enough to be written in parts.
        let set = |n: usize| {
            let body = format!("{n:08}\n").repeat(8 * 1024);
            payload(&[("a", &body), ("b", &body)])
        };
        write(&root, &set(0), "0", Group::default()).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (root, done) = (root.clone(), done.clone());
            std::thread::spawn(move || {
                let mut whole_pairs = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    // What a container sees: one resolution of `..data`, then both files from it
                    // (a set swapped away meanwhile may be gone: then nothing is read).
                    let Ok(target) = std::fs::read_link(root.join(DATA)) else { continue };
                    let (Ok(a), Ok(b)) = (
                        std::fs::read_to_string(root.join(&target).join("a")),
                        std::fs::read_to_string(root.join(&target).join("b")),
                    ) else {
                        continue;
                    };
                    assert_eq!(a.len(), 9 * 8 * 1024, "a whole file");
                    assert!(a.lines().all(|l| l == &a[..8]), "one generation throughout");
                    assert_eq!(a, b, "both files of one set");
                    whole_pairs += 1;
                }
                whole_pairs
            })
        };
        for n in 1..200 {
            assert!(write(&root, &set(n), &n.to_string(), Group::default()).unwrap());
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0, "the reader read whole sets");
        assert_eq!(
            std::fs::read_to_string(root.join("a")).unwrap(),
            String::from_utf8(set(199)["a"].content.clone()).unwrap()
        );
    }

    /// Everything below `dir`, links as their targets, files with their contents.
    fn tree(dir: &Path) -> BTreeMap<String, String> {
        let mut found = BTreeMap::new();
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            let name = path.strip_prefix(dir).unwrap().display().to_string();
            let kind = entry.file_type().unwrap();
            if kind.is_symlink() {
                found.insert(name, format!("-> {}", std::fs::read_link(&path).unwrap().display()));
            } else if kind.is_dir() {
                found.extend(tree(&path).into_iter().map(|(k, v)| (format!("{name}/{k}"), v)));
                found.insert(name, "dir".to_owned());
            } else {
                found.insert(name, std::fs::read_to_string(&path).unwrap_or_else(|_| "unreadable".to_owned()));
            }
        }
        found
    }

    /// Asserts that `root` holds exactly what the writer makes of `files`.
    fn assert_exactly(root: &Path, files: &[(&str, &str)]) {
        let set = std::fs::read_link(root.join(DATA)).unwrap();
        assert!(is_set_name(set.as_os_str()), "{set:?}");
        let mut wanted: BTreeSet<String> = [DATA.to_owned(), set.display().to_string()].into();
        for (path, content) in files {
            assert_eq!(std::fs::read_to_string(root.join(path)).unwrap(), *content, "{path}");
            let top = path.split('/').next().unwrap();
            assert_eq!(std::fs::read_link(root.join(top)).unwrap(), Path::new(DATA).join(top));
            wanted.insert(top.to_owned());
        }
        let names: BTreeSet<String> =
            std::fs::read_dir(root).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        assert_eq!(names, wanted);
    }

    #[test]
    fn nothing_planted_in_the_volume_leads_the_writer_out_of_it() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        // The host's data the agent must never touch.
        let outside = dir.path().join("host");
        std::fs::create_dir_all(outside.join("sub")).unwrap();
        std::fs::write(outside.join("keep"), "host data").unwrap();
        std::fs::write(outside.join("sub/labels"), "host labels").unwrap();
        let host = tree(&outside);
        let root = dir.path().join("vol");
        let files = [("labels", "app=\"web\""), ("sub/name", "web")];
        write(&root, &payload(&files), "0", Group::default()).unwrap();

        // What a root container could do to a volume it could write, one state at a time.
        let plants: Vec<(&str, Plant<'_>)> = vec![
            ("..data to the host by an absolute path", Box::new(|r| replace_link(r, DATA, &outside))),
            ("..data to the host by '..'", Box::new(|r| replace_link(r, DATA, Path::new("../host")))),
            (
                "..data to a ..-named link to the host",
                Box::new(|r| {
                    symlink(&outside, r.join("..evil")).unwrap();
                    replace_link(r, DATA, Path::new("..evil"));
                }),
            ),
            (
                "..data a directory holding a link to the host",
                Box::new(|r| {
                    std::fs::remove_file(r.join(DATA)).unwrap();
                    std::fs::create_dir(r.join(DATA)).unwrap();
                    symlink(&outside, r.join(DATA).join("sub")).unwrap();
                }),
            ),
            (
                "visible names turned into links to the host and a directory",
                Box::new(|r| {
                    replace_link(r, "labels", &outside.join("keep"));
                    std::fs::remove_file(r.join("sub")).unwrap();
                    std::fs::create_dir(r.join("sub")).unwrap();
                    symlink(&outside, r.join("sub/escape")).unwrap();
                }),
            ),
            (
                "a file of the current set turned into a link to the host",
                Box::new(|r| {
                    let set = r.join(std::fs::read_link(r.join(DATA)).unwrap());
                    std::fs::remove_dir_all(set.join("sub")).unwrap();
                    symlink(outside.join("sub"), set.join("sub")).unwrap();
                }),
            ),
            (
                "a file of the current set turned into a fifo",
                Box::new(|r| {
                    let set = r.join(std::fs::read_link(r.join(DATA)).unwrap());
                    std::fs::remove_file(set.join("labels")).unwrap();
                    nix::unistd::mkfifo(&set.join("labels"), Mode::from_bits_truncate(0o644)).unwrap();
                }),
            ),
            (
                "..data_tmp and strays holding links to the host",
                Box::new(|r| {
                    std::fs::create_dir(r.join(DATA_TMP)).unwrap();
                    symlink(&outside, r.join(DATA_TMP).join("x")).unwrap();
                    symlink(&outside, r.join("stray")).unwrap();
                    std::fs::create_dir(r.join("..old")).unwrap();
                    symlink(&outside, r.join("..old/x")).unwrap();
                }),
            ),
        ];
        for (n, (what, plant)) in plants.iter().enumerate() {
            plant(&root);
            let changed = write(&root, &payload(&files), &format!("{}", n + 1), Group::default());
            assert_eq!(changed, Ok(true), "{what}: the write restores the volume");
            assert_eq!(tree(&outside), host, "{what}: nothing outside the volume changed");
            assert_exactly(&root, &files);
            assert_eq!(
                write(&root, &payload(&files), "again", Group::default()),
                Ok(false),
                "{what}: then nothing to do"
            );
        }
    }

    /// One thing a container does to the volume directory (given as the host sees it).
    type Plant<'a> = Box<dyn Fn(&Path) + 'a>;

    fn replace_link(root: &Path, name: &str, target: &Path) {
        let _ = std::fs::remove_file(root.join(name));
        std::os::unix::fs::symlink(target, root.join(name)).unwrap();
    }

    #[test]
    fn a_repeated_stamp_does_not_remove_the_current_set() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("vol");
        write(&root, &payload(&[("a", "1")]), "same", Group::default()).unwrap();
        assert!(write(&root, &payload(&[("a", "2")]), "same", Group::default()).unwrap());
        assert_eq!(std::fs::read_to_string(root.join("a")).unwrap(), "2");
    }

    #[test]
    fn an_fs_group_owns_every_entry_with_group_read_and_setgid_directories() {
        use std::os::unix::fs::MetadataExt;
        if !crate::tests::is_root() {
            kubelet_core::testing::skip(
                "an_fs_group_owns_every_entry_with_group_read_and_setgid_directories",
                "giving files to another user and group needs root",
            );
            return;
        }
        let scratch = tempfile::tempdir().unwrap();
        let root = scratch.path().join("volume");
        let mut files = payload(&[("token", "t"), ("sub/name", "web")]);
        let token = files.get_mut("token").unwrap();
        token.mode = 0o400;
        token.owner = Some(1000);
        let group = Group(Some(2000));
        assert!(write(&root, &files, "1", group).unwrap());
        let of = |path: &str| std::fs::metadata(root.join(path)).unwrap();
        let link = |path: &str| std::fs::symlink_metadata(root.join(path)).unwrap();
        let owned = |meta: std::fs::Metadata| (meta.uid(), meta.gid(), meta.mode() & 0o7777);
        assert_eq!(owned(of("token")), (1000, 2000, 0o440), "group read added, given to its user");
        assert_eq!(owned(of("sub/name")), (0, 2000, 0o644));
        assert_eq!(owned(of("sub")), (0, 2000, 0o2755), "through the links: the set's directory");
        assert_eq!(owned(of("..data")), (0, 2000, 0o2755));
        assert_eq!(owned(of(".")), (0, 2000, 0o2755), "the volume's directory");
        for name in ["..data", "token", "sub"] {
            assert_eq!(link(name).gid(), 2000, "the link {name} itself");
        }
        assert_eq!(write(&root, &files, "2", group), Ok(false), "nothing to do once owned");
        files.get_mut("token").unwrap().owner = Some(1001);
        assert!(write(&root, &files, "3", group).unwrap(), "another owner is a change");
        assert_eq!(owned(of("token")), (1001, 2000, 0o440));
    }
}
