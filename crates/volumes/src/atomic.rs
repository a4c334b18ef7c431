//! The atomic writer (upstream `pkg/volume/util/atomic_writer.go`): a set of files appears in a
//! directory all at once, so a reader never sees half of an update.
//!
//! The files live in a hidden timestamped directory (`..2026_11_23_23_40_00.123456789`); the
//! symlink `..data` points at the current one and is replaced with one `rename`; each visible
//! top-level name is a symlink through `..data` (`labels -> ..data/labels`).

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    os::unix::fs::PermissionsExt,
    path::{Component, Path, PathBuf},
};

/// The symlink to the current set.
pub(crate) const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// One file of the set: its content and mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct File {
    pub(crate) content: Vec<u8>,
    pub(crate) mode: u32,
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

/// Makes `dir` hold exactly `payload` (paths relative to `dir`); returns whether anything changed.
/// Blocking: call it on the blocking pool.
pub(crate) fn write(dir: &Path, payload: &BTreeMap<String, File>, stamp: &str) -> Result<bool, String> {
    let failed = |what: &str, path: &Path, err: io::Error| format!("{what} {}: {err}", path.display());
    for path in payload.keys() {
        validate_path(path)?;
    }
    std::fs::create_dir_all(dir).map_err(|e| failed("cannot create", dir, e))?;
    let current = std::fs::read_link(dir.join(DATA)).ok().map(|target| dir.join(target));
    if let Some(current) = &current
        && same(current, payload)
    {
        return Ok(false);
    }
    // The new set, in full, beside the old one (never in its place, should the stamp repeat).
    let mut name = format!("..{stamp}");
    if current.as_deref() == Some(dir.join(&name).as_path()) {
        name.push_str(".1");
    }
    let fresh = dir.join(&name);
    let _ = std::fs::remove_dir_all(&fresh);
    for (path, file) in payload {
        let target = fresh.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| failed("cannot create", parent, e))?;
        }
        std::fs::write(&target, &file.content).map_err(|e| failed("cannot write", &target, e))?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(file.mode))
            .map_err(|e| failed("cannot set the mode of", &target, e))?;
    }
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| failed("cannot set the mode of", &fresh, e))?;
    // One rename swaps the whole set.
    let tmp = dir.join(DATA_TMP);
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&name, &tmp).map_err(|e| failed("cannot link", &tmp, e))?;
    std::fs::rename(&tmp, dir.join(DATA)).map_err(|e| failed("cannot swap", &dir.join(DATA), e))?;
    // Visible names: one symlink per top-level name; names no longer in the set go.
    let visible: BTreeSet<&str> = payload.keys().filter_map(|p| p.split('/').next()).collect();
    for name in &visible {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(PathBuf::from(DATA).join(name), &link)
                .map_err(|e| failed("cannot link", &link, e))?;
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            if file_name.starts_with("..") || visible.contains(file_name.as_str()) {
                continue;
            }
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if let Some(old) = current.filter(|old| *old != fresh) {
        let _ = std::fs::remove_dir_all(old);
    }
    Ok(true)
}

/// Whether the set in `dir` is `payload`, contents and modes.
fn same(dir: &Path, payload: &BTreeMap<String, File>) -> bool {
    let mut found = 0;
    let all_match = payload.iter().all(|(path, file)| {
        let target = dir.join(path);
        let matches = std::fs::read(&target).is_ok_and(|c| c == file.content)
            && std::fs::metadata(&target).is_ok_and(|m| m.permissions().mode() & 0o7777 == file.mode);
        found += 1;
        matches
    });
    all_match && found == count_files(dir)
}

fn count_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => count_files(&e.path()),
            Ok(_) => 1,
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(files: &[(&str, &str)]) -> BTreeMap<String, File> {
        files.iter().map(|(p, c)| ((*p).to_owned(), File { content: c.as_bytes().to_vec(), mode: 0o644 })).collect()
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
        assert!(write(&root, &payload(&[("labels", "app=\"web\""), ("sub/name", "web")]), "1").unwrap());
        assert_eq!(std::fs::read_to_string(root.join("labels")).unwrap(), "app=\"web\"");
        assert_eq!(std::fs::read_to_string(root.join("sub/name")).unwrap(), "web");
        assert_eq!(std::fs::read_link(root.join("labels")).unwrap(), Path::new("..data/labels"));
        let first = std::fs::read_link(root.join(DATA)).unwrap();

        // The same set again: nothing is written.
        assert!(!write(&root, &payload(&[("labels", "app=\"web\""), ("sub/name", "web")]), "2").unwrap());
        assert_eq!(std::fs::read_link(root.join(DATA)).unwrap(), first);

        // A changed set: a new directory behind `..data`; the old one and a dropped name go.
        assert!(write(&root, &payload(&[("labels", "app=\"api\"")]), "3").unwrap());
        assert_eq!(std::fs::read_to_string(root.join("labels")).unwrap(), "app=\"api\"");
        assert_eq!(std::fs::read_link(root.join(DATA)).unwrap(), Path::new("..3"));
        assert!(!root.join(&first).exists(), "the old set is removed");
        assert!(std::fs::symlink_metadata(root.join("sub")).is_err(), "a name no longer in the set is removed");

        // A mode change alone is a change.
        let mut modes = payload(&[("labels", "app=\"api\"")]);
        modes.get_mut("labels").unwrap().mode = 0o400;
        assert!(write(&root, &modes, "4").unwrap());
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
        write(&root, &set(0), "0").unwrap();
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
            assert!(write(&root, &set(n), &n.to_string()).unwrap());
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0, "the reader read whole sets");
        assert_eq!(
            std::fs::read_to_string(root.join("a")).unwrap(),
            String::from_utf8(set(199)["a"].content.clone()).unwrap()
        );
    }

    #[test]
    fn a_repeated_stamp_does_not_remove_the_current_set() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("vol");
        write(&root, &payload(&[("a", "1")]), "same").unwrap();
        assert!(write(&root, &payload(&[("a", "2")]), "same").unwrap());
        assert_eq!(std::fs::read_to_string(root.join("a")).unwrap(), "2");
    }
}
