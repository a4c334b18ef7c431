//! Container log rotation (upstream `pkg/kubelet/logs/container_log_manager.go`).
//!
//! A running container's live log, `<pod log dir>/<container>/<restart>.log`, is rotated once it
//! reaches the policy's size: the oldest rotated files go until at most `max_files - 2` remain,
//! the remaining rotated files are gzipped (`.gz`), the live log is renamed to
//! `<restart>.log.<YYYYMMDD-hhmmss>`, and the runtime is asked to reopen it (CRI
//! `ReopenContainerLog`), so the container's next line goes to a new live file. A reopen that
//! fails renames the file back, to try again on the next round.
//!
//! Upstream stats every running container's log each monitor interval. Here an inotify watch on
//! the pod log directories (read only at each interval, so the kernel merges a busy log's
//! writes into one event) names the logs written since the last round, and only those are
//! looked at: an idle node does no work per container.

use std::{
    collections::{BTreeSet, HashMap},
    ffi::OsStr,
    io::{self, Read, Write},
    path::{Path, PathBuf},
    time::Duration,
};

use futures::StreamExt;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tracing::{debug, info, warn};

use crate::{Client, labels, pb};

/// What upstream adds to a compressed rotated log.
const COMPRESSED_SUFFIX: &str = ".gz";
/// What a compression in progress writes to, before it is renamed.
const TMP_SUFFIX: &str = ".tmp";

/// When and how container logs are rotated: `containerLogMaxSize`, `containerLogMaxFiles`,
/// `containerLogMaxWorkers` and `containerLogMonitorInterval`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogRotationPolicy {
    /// A live log this large (bytes) or larger is rotated.
    pub max_size: u64,
    /// The most files a container instance keeps, the live one included (at least 2).
    pub max_files: usize,
    /// How many containers' logs are rotated at once.
    pub workers: usize,
    /// How often written logs are checked.
    pub interval: Duration,
}

impl LogRotationPolicy {
    /// A policy; `max_files` below 2 counts as 2 and `workers` below 1 as 1, as upstream's
    /// validation allows no less.
    pub fn new(max_size: u64, max_files: usize, workers: usize, interval: Duration) -> Self {
        LogRotationPolicy { max_size, max_files: max_files.max(2), workers: workers.max(1), interval }
    }
}

/// Rotates the logs of running containers under a pod log directory, until cancelled.
#[derive(Debug)]
pub struct LogRotator {
    client: Client,
    pod_logs_dir: PathBuf,
    policy: LogRotationPolicy,
}

impl LogRotator {
    /// A rotator of the logs under `pod_logs_dir` (`podLogsDir`), asking the runtime behind
    /// `client` to reopen them.
    pub fn new(client: Client, pod_logs_dir: impl Into<PathBuf>, policy: LogRotationPolicy) -> Self {
        LogRotator { client, pod_logs_dir: pod_logs_dir.into(), policy }
    }

    /// Checks the written logs every interval until `cancel`. Fails only when the inotify
    /// watch cannot be made at all.
    pub async fn run(self, cancel: tokio_util::sync::CancellationToken) -> io::Result<()> {
        std::fs::create_dir_all(&self.pod_logs_dir)?;
        let mut watch = LogDirWatch::new(&self.pod_logs_dir)?;
        info!(
            max_size = self.policy.max_size,
            max_files = self.policy.max_files,
            workers = self.policy.workers,
            interval = ?self.policy.interval,
            "container log rotation on"
        );
        // Every log is written as far as a fresh start knows.
        let mut written = watch.scan_all();
        let mut ticks = tokio::time::interval(self.policy.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if cancel.run_until_cancelled(ticks.tick()).await.is_none() {
                return Ok(());
            }
            written.extend(watch.drain());
            let logs = std::mem::take(&mut written);
            let rotator = &self;
            futures::stream::iter(logs)
                .for_each_concurrent(self.policy.workers, |log| async move {
                    if let Err(err) = rotator.rotate_if_full(&log).await {
                        warn!(log = %log.display(), error = %err, "failed to rotate a container log");
                    }
                })
                .await;
        }
    }

    /// Rotates live log `log` when it has reached the policy's size and its container runs.
    async fn rotate_if_full(&self, log: &Path) -> io::Result<()> {
        let size = match std::fs::symlink_metadata(log) {
            Ok(meta) if meta.file_type().is_file() => meta.len(),
            Ok(_) => return Ok(()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(err) => return Err(err),
        };
        if size < self.policy.max_size {
            return Ok(());
        }
        let Some(id) = self.running_container_of(log).await? else {
            debug!(log = %log.display(), "no running container writes this log: not rotated");
            return Ok(());
        };
        let max_files = self.policy.max_files;
        let to_rotate = log.to_path_buf();
        let rotated = tokio::task::spawn_blocking(move || prepare_and_rename(&to_rotate, max_files, now_stamp()))
            .await
            .map_err(io::Error::other)??;
        let request = pb::ReopenContainerLogRequest { container_id: id.clone() };
        if let Err(status) = self.client.runtime_service().reopen_container_log(request).await {
            // Renamed back, it is rotated on a later round.
            if let Err(err) = std::fs::rename(&rotated, log) {
                warn!(log = %log.display(), error = %err, "cannot rename a rotated log back: its container writes nowhere");
            }
            return Err(io::Error::other(format!("ReopenContainerLog {id}: {}", status.message())));
        }
        debug!(log = %log.display(), rotated = %rotated.display(), size, "container log rotated");
        Ok(())
    }

    /// The ID of the running container writing `log` (`<pod dir>/<container>/<restart>.log`),
    /// found by the pod UID in the pod directory's name and the container's name and attempt.
    async fn running_container_of(&self, log: &Path) -> io::Result<Option<String>> {
        let Some(target) = LogTarget::of(log) else { return Ok(None) };
        let filter = pb::ContainerFilter {
            state: Some(pb::ContainerStateValue { state: pb::ContainerState::ContainerRunning as i32 }),
            label_selector: [(labels::POD_UID.to_owned(), target.uid.clone())].into(),
            ..pb::ContainerFilter::default()
        };
        let request = pb::ListContainersRequest { filter: Some(filter) };
        let containers = self
            .client
            .runtime_service()
            .list_containers(request)
            .await
            .map_err(|status| io::Error::other(format!("ListContainers: {}", status.message())))?
            .into_inner()
            .containers;
        Ok(containers.into_iter().find(|c| target.is(c)).map(|c| c.id))
    }
}

/// Whose live log a path is.
#[derive(Debug, PartialEq, Eq)]
struct LogTarget {
    uid: String,
    container: String,
    attempt: u32,
}

impl LogTarget {
    /// `<namespace>_<name>_<uid>/<container>/<attempt>.log`, read from the path's last three names.
    fn of(log: &Path) -> Option<LogTarget> {
        let attempt = live_log_attempt(log.file_name()?)?;
        let container_dir = log.parent()?;
        let container = container_dir.file_name()?.to_str()?.to_owned();
        let pod_dir = container_dir.parent()?.file_name()?.to_str()?;
        let (_, uid) = pod_dir.rsplit_once('_')?;
        Some(LogTarget { uid: uid.to_owned(), container, attempt })
    }

    fn is(&self, container: &pb::Container) -> bool {
        container.metadata.as_ref().is_some_and(|m| m.name == self.container && m.attempt == self.attempt)
    }
}

/// The attempt of a live log's name (`<attempt>.log`), or `None` for any other name.
fn live_log_attempt(name: &OsStr) -> Option<u32> {
    let number = name.to_str()?.strip_suffix(".log")?;
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    number.parse().ok()
}

/// What to do with the rotated files of a live log before it is rotated again.
#[derive(Debug, Default, PartialEq, Eq)]
struct Cleanup {
    /// Files to remove: temporary files, files already compressed, and the oldest.
    remove: Vec<String>,
    /// Files to gzip.
    compress: Vec<String>,
}

/// The cleanup before rotating live log `live` again (as upstream's `cleanupUnusedLogs`,
/// `removeExcessLogs` and compression): `rotated` are the names in its directory that start
/// with `<live>.`. The live log and the one about to be rotated count against `max_files`, so
/// at most `max_files - 2` older files are kept, the newest, all compressed.
fn plan_cleanup(live: &str, rotated: &[String], max_files: usize) -> Cleanup {
    let prefix = format!("{live}.");
    let mut cleanup = Cleanup::default();
    let mut kept: Vec<&String> = Vec::new();
    for name in rotated.iter().filter(|n| n.starts_with(&prefix)) {
        let compressed_twin = format!("{name}{COMPRESSED_SUFFIX}");
        if name.ends_with(TMP_SUFFIX) || rotated.contains(&compressed_twin) {
            cleanup.remove.push(name.clone());
        } else {
            kept.push(name);
        }
    }
    // Names carry their rotation time: name order is age order.
    kept.sort();
    let excess = kept.len().saturating_sub(max_files.saturating_sub(2));
    let (oldest, newest) = kept.split_at(excess);
    cleanup.remove.extend(oldest.iter().map(|n| (*n).clone()));
    cleanup.compress.extend(newest.iter().filter(|n| !n.ends_with(COMPRESSED_SUFFIX)).map(|n| (*n).clone()));
    cleanup
}

/// The rotation time in a rotated log's name, as upstream's `20060102-150405`.
fn now_stamp() -> String {
    kubelet_core::clock::wall_now().strftime("%Y%m%d-%H%M%S").to_string()
}

/// Cleans up `log`'s rotated files and renames it to `<log>.<stamp>`; returns the new name.
/// A name taken already, compressed or not (two rotations within a second), is an error
/// before anything changes: the older file would be overwritten, or taken for a compressed one's
/// leftover and removed.
fn prepare_and_rename(log: &Path, max_files: usize, stamp: String) -> io::Result<PathBuf> {
    let dir = log.parent().ok_or_else(|| io::Error::other("a log path without a directory"))?;
    let live = log.file_name().and_then(OsStr::to_str).ok_or_else(|| io::Error::other("a log name not UTF-8"))?;
    let siblings: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    let rotated_name = format!("{live}.{stamp}");
    if siblings
        .iter()
        .any(|n| n.strip_prefix(&rotated_name).is_some_and(|rest| rest.is_empty() || rest == COMPRESSED_SUFFIX))
    {
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{rotated_name} exists")));
    }
    let cleanup = plan_cleanup(live, &siblings, max_files);
    for name in &cleanup.remove {
        remove_if_present(&dir.join(name))?;
    }
    for name in &cleanup.compress {
        compress(&dir.join(name))?;
    }
    let rotated = dir.join(rotated_name);
    std::fs::rename(log, &rotated)?;
    Ok(rotated)
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

/// Gzips `path` to `<path>.gz` through `<path>.tmp`, then removes `path`. Nothing is followed:
/// both files are opened without following a link.
fn compress(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut name = path.as_os_str().to_owned();
    name.push(TMP_SUFFIX);
    let tmp = PathBuf::from(name);
    let mut input = std::fs::OpenOptions::new().read(true).custom_flags(libc_nofollow()).open(path)?;
    let output =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).custom_flags(libc_nofollow()).open(&tmp)?;
    let written = (|| {
        let mut encoder = flate2::write::GzEncoder::new(output, flate2::Compression::default());
        let mut buffer = vec![0; 64 * 1024];
        loop {
            let read = input.read(&mut buffer)?;
            if read == 0 {
                break;
            }
            encoder.write_all(&buffer[..read])?;
        }
        encoder.finish()?.sync_all()
    })();
    let mut compressed = path.as_os_str().to_owned();
    compressed.push(COMPRESSED_SUFFIX);
    let renamed = written.and_then(|()| std::fs::rename(&tmp, PathBuf::from(compressed)));
    if let Err(err) = renamed {
        let _ = std::fs::remove_file(&tmp);
        return Err(err);
    }
    std::fs::remove_file(path)
}

fn libc_nofollow() -> i32 {
    nix::fcntl::OFlag::O_NOFOLLOW.bits()
}

/// Which level of the pod log tree a watched directory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// `podLogsDir`: pod directories appear in it.
    Root,
    /// A pod's directory: container directories appear in it.
    Pod,
    /// A container's directory: its logs are written in it.
    Container,
}

/// An inotify watch on every directory of the pod log tree, read without blocking.
struct LogDirWatch {
    inotify: Inotify,
    root: PathBuf,
    dirs: HashMap<WatchDescriptor, (Level, PathBuf)>,
}

impl LogDirWatch {
    fn new(root: &Path) -> io::Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        Ok(LogDirWatch { inotify, root: root.to_path_buf(), dirs: HashMap::new() })
    }

    /// Watches every directory of the tree again and names every live log in it.
    fn scan_all(&mut self) -> BTreeSet<PathBuf> {
        for wd in std::mem::take(&mut self.dirs).into_keys() {
            let _ = self.inotify.rm_watch(wd);
        }
        let mut logs = BTreeSet::new();
        let root = self.root.clone();
        self.watch(Level::Root, &root, &mut logs);
        logs
    }

    /// Watches `dir` and what is below it, adding the live logs found to `logs`. A directory
    /// that went away meanwhile is skipped.
    fn watch(&mut self, level: Level, dir: &Path, logs: &mut BTreeSet<PathBuf>) {
        let mask = match level {
            Level::Root | Level::Pod => AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO,
            Level::Container => AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_CREATE,
        } | AddWatchFlags::IN_ONLYDIR
            | AddWatchFlags::IN_DONT_FOLLOW;
        match self.inotify.add_watch(dir, mask) {
            Ok(wd) => _ = self.dirs.insert(wd, (level, dir.to_path_buf())),
            Err(errno) => {
                debug!(dir = %dir.display(), error = %errno, "cannot watch a log directory");
                return;
            }
        }
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.filter_map(Result::ok) {
            let Ok(kind) = entry.file_type() else { continue };
            match level {
                Level::Root if kind.is_dir() => self.watch(Level::Pod, &entry.path(), logs),
                Level::Pod if kind.is_dir() => self.watch(Level::Container, &entry.path(), logs),
                Level::Container if kind.is_file() && live_log_attempt(&entry.file_name()).is_some() => {
                    logs.insert(entry.path());
                }
                _ => {}
            }
        }
    }

    /// The live logs written since the last call, with new directories watched.
    fn drain(&mut self) -> BTreeSet<PathBuf> {
        let mut logs = BTreeSet::new();
        loop {
            let events = match self.inotify.read_events() {
                Ok(events) => events,
                Err(nix::errno::Errno::EAGAIN) => return logs,
                Err(errno) => {
                    warn!(error = %errno, "reading the log directories' watch failed; scanning them all");
                    return self.scan_all();
                }
            };
            for event in events {
                if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    // Events were lost: look at everything once.
                    logs.extend(self.scan_all());
                    continue;
                }
                if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                    self.dirs.remove(&event.wd);
                    continue;
                }
                let Some((level, dir)) = self.dirs.get(&event.wd).cloned() else { continue };
                let Some(name) = event.name else { continue };
                let path = dir.join(&name);
                let is_dir = event.mask.contains(AddWatchFlags::IN_ISDIR);
                match level {
                    Level::Root if is_dir => self.watch(Level::Pod, &path, &mut logs),
                    Level::Pod if is_dir => self.watch(Level::Container, &path, &mut logs),
                    Level::Container if !is_dir && live_log_attempt(&name).is_some() => _ = logs.insert(path),
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn only_numbered_logs_are_live() {
        assert_eq!(live_log_attempt(OsStr::new("0.log")), Some(0));
        assert_eq!(live_log_attempt(OsStr::new("12.log")), Some(12));
        for other in ["0.log.20261126-101010", "0.log.20261126-101010.gz", "x.log", ".log", "0.log.tmp", "-1.log"] {
            assert_eq!(live_log_attempt(OsStr::new(other)), None, "{other}");
        }
    }

    #[test]
    fn a_log_path_names_its_pod_container_and_attempt() {
        let log = Path::new("/var/log/pods/default_web_3f1c-aa/app/2.log");
        let target = LogTarget::of(log).unwrap();
        assert_eq!(target, LogTarget { uid: "3f1c-aa".into(), container: "app".into(), attempt: 2 });
        assert_eq!(LogTarget::of(Path::new("/var/log/pods/default_web_u/app/2.log.20261126-101010")), None);
    }

    #[test]
    fn cleanup_keeps_the_newest_compressed_and_drops_the_rest() {
        let rotated = names(&[
            "0.log.20261126-100000.gz",
            "0.log.20261126-100010.gz",
            "0.log.20261126-100020",
            "0.log.20261126-100030",
            "1.log.20261126-100000",
        ]);
        // 5 files: the live log, the one rotated now, and three older ones.
        let cleanup = plan_cleanup("0.log", &rotated, 5);
        assert_eq!(cleanup.remove, names(&["0.log.20261126-100000.gz"]));
        assert_eq!(cleanup.compress, names(&["0.log.20261126-100020", "0.log.20261126-100030"]));
        // 2 files: the live log and the one rotated now.
        let cleanup = plan_cleanup("0.log", &rotated, 2);
        assert_eq!(cleanup.remove.len(), 4);
        assert!(cleanup.compress.is_empty());
    }

    #[test]
    fn cleanup_drops_what_an_interrupted_compression_left() {
        let rotated = names(&[
            "0.log.20261126-100000",
            "0.log.20261126-100000.gz",
            "0.log.20261126-100010.tmp",
            "0.log.20261126-100010",
        ]);
        let cleanup = plan_cleanup("0.log", &rotated, 5);
        assert_eq!(cleanup.remove, names(&["0.log.20261126-100000", "0.log.20261126-100010.tmp"]));
        assert_eq!(cleanup.compress, names(&["0.log.20261126-100010"]));
    }

    #[test]
    fn a_rotation_compresses_old_files_and_renames_the_live_one() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        std::fs::write(&log, "now\n").unwrap();
        std::fs::write(dir.path().join("0.log.20261126-100000"), "older\n").unwrap();
        std::fs::write(dir.path().join("0.log.20261126-090000.gz"), "oldest").unwrap();
        let rotated = prepare_and_rename(&log, 3, "20261126-100010".into()).unwrap();
        assert_eq!(rotated, dir.path().join("0.log.20261126-100010"));
        let mut left: Vec<String> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["0.log.20261126-100000.gz", "0.log.20261126-100010"]);
        let mut text = String::new();
        let gz = std::fs::File::open(dir.path().join("0.log.20261126-100000.gz")).unwrap();
        flate2::read::GzDecoder::new(gz).read_to_string(&mut text).unwrap();
        assert_eq!(text, "older\n");
        // Within the same second, the rotated name is taken: nothing changes.
        std::fs::write(&log, "again\n").unwrap();
        let err = prepare_and_rename(&log, 3, "20261126-100010".into()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(dir.path().join("0.log.20261126-100010")).unwrap(), "now\n");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "again\n");
    }

    #[test]
    fn the_watch_names_the_logs_written_since_it_last_looked() {
        let root = tempfile::tempdir().unwrap();
        let old = root.path().join("ns_a_u1/app");
        std::fs::create_dir_all(&old).unwrap();
        std::fs::write(old.join("0.log"), "x").unwrap();
        let mut watch = LogDirWatch::new(root.path()).unwrap();
        assert_eq!(watch.scan_all(), [old.join("0.log")].into());
        assert!(watch.drain().is_empty(), "nothing written since");

        // A new pod and container directory, made after the watch, and its log written.
        let new = root.path().join("ns_b_u2/web");
        std::fs::create_dir_all(&new).unwrap();
        let first = watch.drain();
        std::fs::write(new.join("0.log"), "y").unwrap();
        let second = watch.drain();
        assert!(first.is_empty() || first == [new.join("0.log")].into(), "{first:?}");
        assert_eq!(second, [new.join("0.log")].into());

        // Appends to an old log; rotated names and other files are not live logs.
        let mut file = std::fs::OpenOptions::new().append(true).open(old.join("0.log")).unwrap();
        for _ in 0..100 {
            file.write_all(b"more\n").unwrap();
        }
        std::fs::write(old.join("0.log.20261126-100000"), "z").unwrap();
        assert_eq!(watch.drain(), [old.join("0.log")].into());
    }
}
