//! The static pod file source (upstream `pkg/kubelet/config/file.go`, `file_linux.go`).
//!
//! `staticPodPath` may be a directory or a single file.
//! In a directory, every regular file whose name does not start with a dot is a manifest, read
//! in lexical order; subdirectories are skipped (not recursed), and a file that cannot be read or
//! decoded is skipped with an error naming it while the others still apply.
//! A missing path is an empty snapshot, so the source still counts as seen.
//! Changes are picked up at once through inotify (the `notify` crate) and by a periodic rescan
//! (`fileCheckFrequency`, 20 s) as a safety net; each scan that found a change sends the whole
//! snapshot.
//! Only events that may change content wake the source (create, write, delete, moves): opening
//! or reading a file does not, so the source's own reads never wake it.
//! A file closed after writing, moved or removed is scanned at once; after a creation or a write
//! alone, the source waits for the writer to close the file, 20 ms at most.
//! A manifest that cannot be decoded and was modified within a second of its reading is taken as
//! still being written (another file's close can start a scan in the middle of a burst of writes,
//! and a writer can be held up between creating a file and writing it): its pods stay as they
//! were, its error waits, and it is scanned again once that second has passed.
//! A scan decodes only the files whose identity (device, inode, size, modification time)
//! changed since they were last decoded; an idle directory costs one `stat` per file per rescan,
//! and a scan that found every manifest as it was sends nothing.

use std::{
    collections::{HashMap, HashSet},
    io::Read,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Pod;
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    SourceSender,
    manifest::{MAX_MANIFEST_BYTES, ManifestError, Origin, static_pods},
};
use kubelet_core::{
    ErrorChain,
    events::{Event, EventRecorder, EventType, ObjectRef},
};

/// How long the source waits, after a file is created or written to, for its writer to close it.
pub(crate) const SETTLE: Duration = Duration::from_millis(20);

/// How long after its last write a manifest that cannot be decoded is taken as unfinished: its
/// writer may have been held up between creating it and writing it, as on a busy machine.
/// Only a broken manifest waits this long; a good one is taken as soon as it is read.
pub(crate) const HALF_WRITTEN: Duration = Duration::from_secs(1);

/// The time a scan reads the clock, at each manifest that cannot be decoded.
type Clock<'a> = &'a dyn Fn() -> SystemTime;

/// How the file source runs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// `staticPodPath`: a directory of manifests or one manifest file.
    pub path: PathBuf,
    /// The node's name, for static pod names and UIDs.
    pub node_name: String,
    /// `fileCheckFrequency`: the safety-net rescan period (20 s).
    pub check_frequency: Duration,
}

impl Config {
    /// A config for `path` on node `node_name` with upstream's 20 s rescan.
    pub fn new(path: impl Into<PathBuf>, node_name: impl Into<String>) -> Self {
        Config { path: path.into(), node_name: node_name.into(), check_frequency: Duration::from_secs(20) }
    }

    /// Sets the rescan period.
    #[must_use]
    pub fn check_frequency(mut self, period: Duration) -> Self {
        self.check_frequency = period;
        self
    }
}

/// The outcome of one scan: the pods of every good manifest, and the errors of the others.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Scan {
    /// Pods, in manifest order.
    pub pods: Vec<Pod>,
    /// One error per manifest that was skipped.
    pub errors: Vec<ManifestError>,
    /// Whether the pods may differ from the scan before (a manifest decoded again, or one gone).
    changed: bool,
    /// When a manifest that cannot be decoded was written within [`HALF_WRITTEN`] of its reading
    /// (its writer may not be done), how soon the first such one is taken as written: it is
    /// scanned again then, before its error counts.
    unsettled: Option<Duration>,
}

/// A file as it was when last decoded: its identity, to tell whether it changed since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
}

impl FileId {
    fn of(metadata: &std::fs::Metadata) -> Self {
        FileId {
            dev: metadata.dev(),
            ino: metadata.ino(),
            len: metadata.len(),
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
        }
    }
}

/// The pods of every manifest decoded so far, by path, with the identity of the file decoded.
/// Files that failed are not kept: they are read again at the next scan.
#[derive(Debug, Default)]
struct Decoded {
    files: HashMap<PathBuf, (FileId, Vec<Pod>)>,
}

/// Adds the pods of the manifest at `path` to `scan`: the ones `previous` decoded when the file
/// is unchanged, else read and decoded now; `next` keeps them for the next scan. With a `clock`,
/// a file that cannot be decoded and was modified within [`HALF_WRITTEN`] of the clock's time
/// after reading it keeps the pods `previous` had of it, and no error yet.
fn read_manifest(
    path: &Path,
    metadata: &std::fs::Metadata,
    node_name: &str,
    scan: &mut Scan,
    (previous, next): (&Decoded, &mut Decoded),
    clock: Option<Clock<'_>>,
) {
    let id = FileId::of(metadata);
    if let Some((known, pods)) = previous.files.get(path)
        && *known == id
    {
        scan.pods.extend(pods.iter().cloned());
        next.files.insert(path.to_path_buf(), (id, pods.clone()));
        return;
    }
    let origin = Origin::File(path.to_path_buf());
    // The modification time read after the content: the content is at least as old.
    let mut modified = metadata.modified().ok();
    let mut read = || -> Result<Vec<u8>, ManifestError> {
        // Refused by its size, unread: a refused file is looked at again at every scan, which
        // would read 10 MiB of it each time.
        if metadata.len() > MAX_MANIFEST_BYTES as u64 {
            let size = usize::try_from(metadata.len()).unwrap_or(usize::MAX);
            return Err(ManifestError::TooLarge { origin: origin.clone(), size });
        }
        let file =
            std::fs::File::open(path).map_err(|source| ManifestError::Read { origin: origin.clone(), source })?;
        let mut bytes = Vec::new();
        // One byte more than allowed tells "too large" from "exactly at the limit".
        (&file)
            .take(MAX_MANIFEST_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| ManifestError::Read { origin: origin.clone(), source })?;
        modified = file.metadata().and_then(|m| m.modified()).ok().or(modified);
        Ok(bytes)
    };
    let pods = match read().and_then(|bytes| static_pods(&bytes, &origin, node_name, false)) {
        Ok(pods) => pods,
        Err(err) => {
            match clock.zip(modified).and_then(|(now, modified)| half_written_for(modified, now())) {
                None => scan.errors.push(err),
                Some(remaining) => keep_while_half_written(path, remaining, scan, (previous, next)),
            }
            return;
        }
    };
    next.files.insert(path.to_path_buf(), (id, pods.clone()));
    scan.pods.extend(pods);
    scan.changed = true;
}

/// Keeps the pods `previous` had of the manifest at `path`, which cannot be decoded yet and is
/// taken as half-written for `remaining`, and asks for a scan by then.
fn keep_while_half_written(
    path: &Path,
    remaining: Duration,
    scan: &mut Scan,
    (previous, next): (&Decoded, &mut Decoded),
) {
    debug!(path = %path.display(), "manifest cannot be decoded yet, just written; scanning it again");
    scan.unsettled = Some(scan.unsettled.map_or(remaining, |sooner| sooner.min(remaining)));
    if let Some((known, pods)) = previous.files.get(path) {
        scan.pods.extend(pods.iter().cloned());
        next.files.insert(path.to_path_buf(), (*known, pods.clone()));
    }
}

/// How long a file modified at `modified` is still taken as half-written at `now`: [`HALF_WRITTEN`]
/// after its modification, which may lie a little after `now` (the clocks of a file system
/// and of a process need not agree); none when it was modified longer ago, or further ahead,
/// where such a file would otherwise never count as written.
fn half_written_for(modified: SystemTime, now: SystemTime) -> Option<Duration> {
    match now.duration_since(modified) {
        Ok(age) => HALF_WRITTEN.checked_sub(age).filter(|remaining| !remaining.is_zero()),
        Err(ahead) => (ahead.duration() < HALF_WRITTEN).then(|| ahead.duration() + HALF_WRITTEN),
    }
}

/// Reads every manifest under `path` (blocking IO), an error for each that cannot be decoded.
pub fn scan(path: &Path, node_name: &str) -> Scan {
    scan_with(path, node_name, &mut Decoded::default(), None)
}

/// Reads the manifests under `path`, decoding only those that changed since `decoded` saw them
/// (blocking IO); `decoded` then holds exactly the good files of this scan, and those kept as
/// they were while being written (with a `clock`: [`read_manifest`]).
fn scan_with(path: &Path, node_name: &str, decoded: &mut Decoded, clock: Option<Clock<'_>>) -> Scan {
    let previous = std::mem::take(decoded);
    let mut scan = read_path(path, node_name, (&previous, decoded), clock);
    // Every manifest decoded before was taken as it was, and no other: the same pods.
    scan.changed |= decoded.files.len() != previous.files.len();
    scan
}

/// [`scan_with`]'s reading: the manifests under `path`, each taken from `previous` when its file
/// is unchanged, and kept in `decoded`.
fn read_path(
    path: &Path,
    node_name: &str,
    (previous, decoded): (&Decoded, &mut Decoded),
    clock: Option<Clock<'_>>,
) -> Scan {
    let mut scan = Scan::default();
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            debug!(path = %path.display(), "static pod path does not exist");
            return scan;
        }
        Err(source) => {
            scan.errors.push(ManifestError::Read { origin: Origin::File(path.to_path_buf()), source });
            return scan;
        }
    };
    if !metadata.is_dir() {
        read_manifest(path, &metadata, node_name, &mut scan, (previous, decoded), clock);
        return scan;
    }
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(source) => {
            scan.errors.push(ManifestError::Read { origin: Origin::File(path.to_path_buf()), source });
            return scan;
        }
    };
    let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    for file in files {
        let hidden = file.file_name().and_then(|n| n.to_str()).is_none_or(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        match std::fs::metadata(&file) {
            Ok(m) if m.is_dir() => info!(path = %file.display(), "not recursing into manifest subdirectory"),
            Ok(m) if m.is_file() => read_manifest(&file, &m, node_name, &mut scan, (previous, decoded), clock),
            Ok(_) => debug!(path = %file.display(), "skipping non-regular file"),
            // The file vanished between listing and reading: the next event rescans.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => scan.errors.push(ManifestError::Read { origin: Origin::File(file), source }),
        }
    }
    scan
}

/// A watch event that may change what the manifests say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// A file was created or written to: its writer may not be done.
    Begun,
    /// A file was closed after writing, moved in or out, or removed: what is there now is whole.
    Done,
}

/// What a watch event may change: creation and writes begin a change, a close after writing,
/// a move and a deletion end one; opening, reading and attribute changes change nothing (the
/// source's own reads would otherwise wake it forever).
fn content_change(event: &notify::Event) -> Option<Change> {
    use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => Some(Change::Done),
        EventKind::Access(_) | EventKind::Modify(ModifyKind::Metadata(_)) | EventKind::Other => None,
        EventKind::Modify(ModifyKind::Name(_)) | EventKind::Remove(_) => Some(Change::Done),
        EventKind::Any | EventKind::Create(_) | EventKind::Modify(_) => Some(Change::Begun),
    }
}

/// Waits, after `first`, until a change is done or for [`SETTLE`] at most, then drops the
/// changes queued meanwhile: the scan that follows sees them all.
async fn settle(first: Change, changes: &mut mpsc::UnboundedReceiver<Change>) {
    let deadline = tokio::time::Instant::now() + SETTLE;
    let mut latest = first;
    while latest == Change::Begun {
        match tokio::time::timeout_at(deadline, changes.recv()).await {
            Ok(Some(change)) => latest = change,
            Ok(None) | Err(_) => break,
        }
    }
    while changes.try_recv().is_ok() {}
}

/// Waits until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// What to watch for `path`: the directory itself, a file's directory, or the parent of a path
/// that does not exist yet.
fn watch_target(path: &Path) -> Option<PathBuf> {
    if path.is_dir() {
        return Some(path.to_path_buf());
    }
    path.parent().filter(|p| p.is_dir()).map(Path::to_path_buf)
}

/// The file source.
pub struct FileSource {
    config: Config,
    sender: SourceSender,
    recorder: Arc<dyn EventRecorder>,
}

impl std::fmt::Debug for FileSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSource").field("config", &self.config).finish_non_exhaustive()
    }
}

struct Watch {
    target: PathBuf,
    _watcher: notify::RecommendedWatcher,
}

impl FileSource {
    /// A source that sends its snapshots through `sender` and reports bad manifests to `recorder`.
    pub fn new(config: Config, sender: SourceSender, recorder: Arc<dyn EventRecorder>) -> Self {
        FileSource { config, sender, recorder }
    }

    fn watch(&self, current: Option<Watch>, tx: &mpsc::UnboundedSender<Change>) -> Option<Watch> {
        let target = watch_target(&self.config.path)?;
        if let Some(watch) = current
            && watch.target == target
        {
            return Some(watch);
        }
        let tx = tx.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if let Some(change) = event.ok().as_ref().and_then(content_change) {
                // The receiver is gone only when the source stopped.
                let _ = tx.send(change);
            }
        });
        match watcher.and_then(|mut w| w.watch(&target, RecursiveMode::NonRecursive).map(|()| w)) {
            Ok(watcher) => {
                debug!(path = %target.display(), "watching static pod path");
                Some(Watch { target, _watcher: watcher })
            }
            Err(err) => {
                warn!(path = %target.display(), error = %err, "cannot watch static pod path; relying on the periodic rescan");
                None
            }
        }
    }

    /// Runs until `cancel` fires or the config channel closes.
    pub async fn run(self, cancel: CancellationToken) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut watch = None;
        let mut rescan = tokio::time::interval(self.config.check_frequency);
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reported: HashSet<String> = HashSet::new();
        let mut decoded = Decoded::default();
        let mut sent_any = false;
        let mut unsettled_rescan = None;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = rescan.tick() => {}
                () = sleep_until(unsettled_rescan) => {}
                Some(change) = rx.recv() => settle(change, &mut rx).await,
            }
            watch = self.watch(watch, &tx);
            let (path, node) = (self.config.path.clone(), self.config.node_name.clone());
            let mut owned = std::mem::take(&mut decoded);
            let scan = match tokio::task::spawn_blocking(move || {
                let scan = scan_with(&path, &node, &mut owned, Some(&SystemTime::now));
                (scan, owned)
            })
            .await
            {
                Ok((scan, kept)) => {
                    decoded = kept;
                    scan
                }
                Err(err) => {
                    warn!(error = %err, "static pod scan failed");
                    continue;
                }
            };
            let errors: HashSet<String> = scan.errors.iter().map(|err| ErrorChain(err).to_string()).collect();
            for err in &scan.errors {
                let message = ErrorChain(err).to_string();
                // Each distinct error is reported once, not on every rescan.
                if !reported.contains(&message) {
                    let object = ObjectRef::other("File", err.origin().to_string());
                    self.recorder.record(Event::new(EventType::Warning, "InvalidManifest", message, object));
                }
            }
            reported = errors;
            unsettled_rescan = scan.unsettled.map(|remaining| tokio::time::Instant::now() + remaining);
            // A rescan that found every manifest as it was sends nothing: the pod configuration
            // already has these pods, and comparing them all again would cost every 20 s per pod.
            if sent_any && !scan.changed {
                continue;
            }
            if self.sender.set(scan.pods).await.is_err() {
                return;
            }
            sent_any = true;
        }
    }
}

#[cfg(test)]
mod tests;
