//! File source tests on a real temporary directory, with inotify: every change must be seen
//! within 1 s, long before the (one hour) rescan.

use std::{collections::HashMap, fs, path::Path, time::Duration};

use tokio::{sync::mpsc, task::JoinHandle};

use super::*;
use kubelet_core::{Operation, PodUpdate, Source, events::RingRecorder};

use crate::PodConfig;

const NODE: &str = "Node-A";

fn manifest(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: {image}\n"
    )
}

/// Writes a file the way editors do: a dot-file, then a rename into place.
fn write_atomic(path: &Path, content: &str) {
    let tmp = path.with_file_name(format!(".{}.tmp", path.file_name().unwrap().to_string_lossy()));
    fs::write(&tmp, content).unwrap();
    fs::rename(&tmp, path).unwrap();
}

struct Fixture {
    dir: tempfile::TempDir,
    rx: mpsc::Receiver<PodUpdate>,
    ring: Arc<RingRecorder>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Fixture {
    fn start_at(dir: tempfile::TempDir, path: PathBuf) -> Fixture {
        Fixture::rescanning_every(dir, path, Duration::from_secs(3600))
    }

    /// A source of `path` whose rescan comes every `period`.
    fn rescanning_every(dir: tempfile::TempDir, path: PathBuf, period: Duration) -> Fixture {
        let ring = Arc::new(RingRecorder::default());
        let (config, rx) = PodConfig::new(ring.clone());
        let source =
            FileSource::new(Config::new(path, NODE).check_frequency(period), config.source(Source::File), ring.clone());
        let cancel = CancellationToken::new();
        let task = tokio::spawn(source.run(cancel.clone()));
        Fixture { dir, rx, ring, cancel, task }
    }

    fn start() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        Fixture::start_at(dir, path)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The next update, which must come within 1 s.
    async fn next(&mut self) -> (Operation, Vec<String>) {
        let update =
            tokio::time::timeout(Duration::from_secs(1), self.rx.recv()).await.expect("no update within 1 s").unwrap();
        (update.op, update.pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect())
    }

    async fn next_uids(&mut self) -> (Operation, Vec<String>) {
        let update =
            tokio::time::timeout(Duration::from_secs(1), self.rx.recv()).await.expect("no update within 1 s").unwrap();
        (update.op, update.pods.iter().map(|p| p.metadata.uid.clone().unwrap()).collect())
    }

    /// No update for 400 ms: twenty times the source's settling time after an event, its only
    /// period here (the rescan is an hour away), so a scan the events caused would have come.
    async fn quiet(&mut self) {
        if let Ok(Some(update)) = tokio::time::timeout(super::SETTLE * 20, self.rx.recv()).await {
            panic!(
                "unexpected update {:?} {:?}",
                update.op,
                update.pods.iter().map(|p| p.metadata.name.clone()).collect::<Vec<_>>()
            );
        }
    }

    /// The events recorded once there are `count` of them, which must be within five times the
    /// time a broken manifest is taken as half-written.
    async fn events(&self, count: usize) -> Vec<Event> {
        let deadline = tokio::time::Instant::now() + SETTLE * 100;
        while self.ring.events().len() < count && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(SETTLE).await;
        }
        self.ring.events()
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap();
    }
}

fn add(names: &[&str]) -> (Operation, Vec<String>) {
    (Operation::Add, names.iter().map(|n| n.to_string()).collect())
}

#[tokio::test]
async fn create_edit_delete_are_seen_within_a_second() {
    let mut f = Fixture::start();
    assert_eq!(f.next().await, add(&[]), "an empty directory is an empty snapshot");
    write_atomic(&f.path("web.yaml"), &manifest("web", "busybox:1"));
    let (op, uids) = f.next_uids().await;
    assert_eq!(op, Operation::Add);
    let first_uid = uids[0].clone();

    // An edit changes the content hash, so the UID: the old pod goes, the new one comes.
    fs::write(f.path("web.yaml"), manifest("web", "busybox:2")).unwrap();
    let (op, removed) = f.next_uids().await;
    assert_eq!((op, removed), (Operation::Remove, vec![first_uid]));
    let (op, added) = f.next().await;
    assert_eq!((op, added), add(&["web-node-a"]));

    fs::remove_file(f.path("web.yaml")).unwrap();
    assert_eq!(f.next().await, (Operation::Remove, vec!["web-node-a".to_owned()]));
    f.stop().await;
}

#[tokio::test]
async fn dotfiles_and_subdirectories_are_ignored() {
    let mut f = Fixture::start();
    assert_eq!(f.next().await, add(&[]));
    write_atomic(&f.path(".hidden.yaml"), &manifest("hidden", "i"));
    fs::create_dir(f.path("sub")).unwrap();
    write_atomic(&f.path("sub").join("nested.yaml"), &manifest("nested", "i"));
    f.quiet().await;
    write_atomic(&f.path("real.yaml"), &manifest("real", "i"));
    assert_eq!(f.next().await, add(&["real-node-a"]));
    f.stop().await;
}

#[tokio::test]
async fn a_broken_manifest_is_skipped_with_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), manifest("a", "i")).unwrap();
    fs::write(
        dir.path().join("b.yaml"),
        "metadata:\n  name: b\nspec:\n  containers: [{name: c, image: i, ports: [{containerPort: eighty}]}]\n",
    )
    .unwrap();
    fs::write(
        dir.path().join("c.json"),
        r#"{"metadata":{"name":"c"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#,
    )
    .unwrap();
    fs::write(dir.path().join("d.yaml"), "metadata:\n  name: d\nspec:\n  containers: [{name: c}]\n").unwrap();
    let path = dir.path().to_path_buf();
    let mut f = Fixture::start_at(dir, path);
    assert_eq!(f.next().await, add(&["a-node-a", "c-node-a"]));
    // Written just now, the broken ones may be taken as half-written for a while.
    let events = f.events(2).await;
    let messages: Vec<&str> = events.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(events.len(), 2, "{messages:?}");
    assert!(messages[0].contains("b.yaml: cannot decode") && messages[0].contains("line 4"), "{}", messages[0]);
    assert!(
        messages[1].contains("d.yaml: invalid pod \"d-node-a\": spec.containers[0].image: required value"),
        "{}",
        messages[1]
    );
    assert!(events.iter().all(|e| e.reason == "InvalidManifest"));
    f.stop().await;
}

#[tokio::test]
async fn an_editor_backup_file_loses_to_the_manifest_by_name() {
    let mut f = Fixture::start();
    assert_eq!(f.next().await, add(&[]));
    write_atomic(&f.path("web.yaml~"), &manifest("web", "busybox:old"));
    write_atomic(&f.path("web.yaml"), &manifest("web", "busybox:new"));
    // Whichever file the first scan saw, the settled state is web.yaml's pod.
    let mut images = Vec::new();
    while let Ok(Some(update)) = tokio::time::timeout(Duration::from_millis(500), f.rx.recv()).await {
        if update.op == Operation::Add {
            images.extend(update.pods.iter().map(|p| p.spec.as_ref().unwrap().containers[0].image.clone().unwrap()));
        }
    }
    assert_eq!(images.last().map(String::as_str), Some("busybox:new"));
    let pods = f.ring.events();
    assert!(
        pods.iter().any(|e| e.reason == "FailedValidation" && e.message.contains("duplicate pod name")),
        "{pods:?}"
    );
    f.stop().await;
}

#[tokio::test]
async fn a_file_replaced_by_rename_is_seen() {
    let mut f = Fixture::start();
    assert_eq!(f.next().await, add(&[]));
    write_atomic(&f.path("web.yaml"), &manifest("web", "v1"));
    assert_eq!(f.next().await, add(&["web-node-a"]));
    // Staged outside the watched directory, then moved over the manifest.
    let staging = tempfile::tempdir().unwrap();
    fs::write(staging.path().join("web.yaml"), manifest("web", "v2")).unwrap();
    f.quiet().await;
    fs::rename(staging.path().join("web.yaml"), f.path("web.yaml")).unwrap();
    assert_eq!(f.next().await.0, Operation::Remove);
    assert_eq!(f.next().await, add(&["web-node-a"]));
    f.stop().await;
}

#[tokio::test]
async fn a_missing_path_is_empty_and_its_creation_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manifests");
    let mut f = Fixture::start_at(dir, path.clone());
    assert_eq!(f.next().await, add(&[]), "a missing path still marks the source seen");
    fs::create_dir(&path).unwrap();
    f.quiet().await;
    write_atomic(&path.join("web.yaml"), &manifest("web", "i"));
    assert_eq!(f.next().await, add(&["web-node-a"]), "the new directory is watched");
    f.stop().await;
}

#[tokio::test]
async fn a_single_file_path_works() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("only.yaml");
    fs::write(&file, manifest("only", "v1")).unwrap();
    write_atomic(&dir.path().join("other.yaml"), &manifest("other", "v1"));
    let mut f = Fixture::start_at(dir, file.clone());
    assert_eq!(f.next().await, add(&["only-node-a"]));
    write_atomic(&file, &manifest("only", "v2"));
    assert_eq!(f.next().await.0, Operation::Remove);
    assert_eq!(f.next().await, add(&["only-node-a"]));
    f.stop().await;
}

#[test]
fn scan_reports_the_pods_and_errors_of_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("b.yaml"), manifest("b", "i")).unwrap();
    fs::write(dir.path().join("a.yaml"), manifest("a", "i")).unwrap();
    fs::write(dir.path().join("empty.yaml"), "").unwrap();
    let scan = scan(dir.path(), "n");
    let names: Vec<_> = scan.pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, ["a-n", "b-n"], "lexical order");
    assert_eq!(scan.errors.len(), 1);
    assert!(scan.errors[0].to_string().contains("empty.yaml: cannot decode: empty manifest"));
}

#[test]
fn a_scan_that_finds_every_manifest_as_it_was_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), manifest("a", "i")).unwrap();
    fs::write(dir.path().join("broken.yaml"), "kind: [").unwrap();
    let mut decoded = Decoded::default();
    let mut rescan = || scan_with(dir.path(), "n", &mut decoded, None);
    assert!(rescan().changed, "the first scan decodes");
    let again = rescan();
    assert!(!again.changed, "nothing changed, and a broken manifest is still broken");
    assert_eq!((again.pods.len(), again.errors.len()), (1, 1), "the same pods and errors all the same");
    write_atomic(&dir.path().join("b.yaml"), &manifest("b", "i"));
    assert!(rescan().changed, "a new manifest");
    assert!(!rescan().changed);
    write_atomic(&dir.path().join("b.yaml"), &manifest("b", "j"));
    assert!(rescan().changed, "an edited manifest");
    fs::remove_file(dir.path().join("a.yaml")).unwrap();
    assert!(rescan().changed, "a manifest gone");
    write_atomic(&dir.path().join("b.yaml"), "kind: [");
    assert!(rescan().changed, "a manifest broken");
    assert!(!rescan().changed);
}

/// A manifest that cannot be decoded right after a write is one caught half-written: the pods
/// it had stay, no error is reported, and the scan asks to be made again when it will have
/// settled; once its last write is older than that, its error counts and its pods go.
#[test]
fn a_manifest_broken_just_after_a_write_keeps_its_pods_until_it_settles() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.yaml"), manifest("a", "i")).unwrap();
    fs::write(dir.path().join("b.yaml"), manifest("b", "i")).unwrap();
    let mut decoded = Decoded::default();
    let first = scan_with(dir.path(), "n", &mut decoded, Some(&SystemTime::now));
    assert_eq!((first.pods.len(), first.unsettled), (2, None));

    fs::write(dir.path().join("a.yaml"), "metadata:\n  name: a\nspec:\n  contai").unwrap();
    fs::write(dir.path().join("new.yaml"), "").unwrap();
    let written = set_modified_at_once(dir.path(), &["a.yaml", "new.yaml"]);
    let during = scan_with(dir.path(), "n", &mut decoded, Some(&|| written + HALF_WRITTEN / 4));
    let names: Vec<_> = during.pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, ["a-n", "b-n"], "the half-written manifest's pod stays; the empty new one has none");
    assert!(during.errors.is_empty(), "{:?}", during.errors);
    assert_eq!((during.unsettled, during.changed), (Some(HALF_WRITTEN * 3 / 4), false));

    let settled = scan_with(dir.path(), "n", &mut decoded, Some(&|| written + HALF_WRITTEN));
    let names: Vec<_> = settled.pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, ["b-n"]);
    assert_eq!((settled.errors.len(), settled.unsettled, settled.changed), (2, None, true));
}

/// A file written after the scan began, as one created while a scan reads a burst of others, is
/// half-written too: the clock is read for each file after reading it, and a modification time
/// a little ahead of it counts as just now. One far ahead counts as written, or it never would.
#[test]
fn a_manifest_modified_ahead_of_the_clock_is_half_written_unless_far_ahead() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("empty.yaml"), "").unwrap();
    let written = set_modified_at_once(dir.path(), &["empty.yaml"]);
    let mut decoded = Decoded::default();

    let ahead = scan_with(dir.path(), "n", &mut decoded, Some(&|| written - HALF_WRITTEN / 2));
    assert!(ahead.errors.is_empty(), "{:?}", ahead.errors);
    assert_eq!(ahead.unsettled, Some(HALF_WRITTEN * 3 / 2), "until a settling time after the write");

    let far_ahead = scan_with(dir.path(), "n", &mut decoded, Some(&|| written - HALF_WRITTEN * 60));
    assert_eq!((far_ahead.errors.len(), far_ahead.unsettled), (1, None));
    assert!(far_ahead.errors[0].to_string().contains("empty.yaml: cannot decode: empty manifest"));
}

/// Sets the modification time of the `names` under `dir` to one time, whatever the machine's
/// pace, and returns it.
fn set_modified_at_once(dir: &Path, names: &[&str]) -> SystemTime {
    let written = SystemTime::now();
    for name in names {
        fs::File::options().write(true).open(dir.join(name)).unwrap().set_modified(written).unwrap();
    }
    written
}

#[test]
fn only_events_that_may_change_content_wake_the_source_and_a_close_or_move_ends_a_change() {
    use notify::event::{
        AccessKind, AccessMode, CreateKind, DataChange, EventKind, MetadataKind, ModifyKind, RemoveKind, RenameMode,
    };
    let change = |kind| content_change(&notify::Event::new(kind));
    for kind in [EventKind::Create(CreateKind::File), EventKind::Modify(ModifyKind::Data(DataChange::Any))] {
        assert_eq!(change(kind), Some(Change::Begun), "{kind:?}");
    }
    for kind in [
        EventKind::Modify(ModifyKind::Name(RenameMode::To)),
        EventKind::Modify(ModifyKind::Name(RenameMode::From)),
        EventKind::Remove(RemoveKind::File),
        EventKind::Access(AccessKind::Close(AccessMode::Write)),
    ] {
        assert_eq!(change(kind), Some(Change::Done), "{kind:?}");
    }
    for kind in [
        EventKind::Access(AccessKind::Open(AccessMode::Any)),
        EventKind::Access(AccessKind::Read),
        EventKind::Access(AccessKind::Close(AccessMode::Read)),
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)),
    ] {
        assert_eq!(change(kind), None, "{kind:?}");
    }
}

/// A change that is done is scanned at once; one only begun waits for its close, or for the
/// settling time when none comes; what was queued meanwhile is dropped (the scan sees it).
#[tokio::test(start_paused = true)]
async fn the_source_waits_for_a_begun_change_to_be_done_and_no_longer() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let began = tokio::time::Instant::now();
    tx.send(Change::Begun).unwrap();
    settle(Change::Done, &mut rx).await;
    assert_eq!(began.elapsed(), Duration::ZERO, "done: at once");
    assert!(rx.try_recv().is_err(), "what was queued is dropped");

    let closer = tx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        closer.send(Change::Begun).unwrap();
        tokio::time::sleep(Duration::from_millis(3)).await;
        closer.send(Change::Done).unwrap();
    });
    let began = tokio::time::Instant::now();
    settle(Change::Begun, &mut rx).await;
    assert_eq!(began.elapsed(), Duration::from_millis(8), "begun: until the close");

    let began = tokio::time::Instant::now();
    settle(Change::Begun, &mut rx).await;
    assert_eq!(began.elapsed(), SETTLE, "begun and never closed: the settling time");
}

/// Counts the opens of each file in `dir` (inotify), as another reader would see the source.
fn count_opens(dir: &Path) -> (notify::RecommendedWatcher, Arc<std::sync::Mutex<HashMap<PathBuf, usize>>>) {
    use notify::event::{AccessKind, EventKind};
    let opens: Arc<std::sync::Mutex<HashMap<PathBuf, usize>>> = Arc::default();
    let counted = opens.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event
            && matches!(event.kind, EventKind::Access(AccessKind::Open(_)))
        {
            for path in event.paths {
                *counted.lock().unwrap().entry(path).or_default() += 1;
            }
        }
    })
    .unwrap();
    watcher.watch(dir, RecursiveMode::NonRecursive).unwrap();
    (watcher, opens)
}

#[tokio::test]
async fn an_idle_directory_is_not_read_again_and_a_change_reads_only_the_changed_file() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..50 {
        fs::write(dir.path().join(format!("pod-{i:02}.yaml")), manifest(&format!("pod-{i:02}"), "busybox:1")).unwrap();
    }
    // A broken manifest is read again at every scan: a scan woken by its own reads would loop.
    fs::write(dir.path().join("broken.yaml"), "kind: [").unwrap();
    let path = dir.path().to_path_buf();
    // Rescans every 200 ms, so that the test sees several pass over the idle directory.
    let mut f = Fixture::rescanning_every(dir, path, Duration::from_millis(200));
    assert_eq!(f.next().await.1.len(), 50);
    // Written just now, the broken one is read again once it has settled, and reported then.
    assert_eq!(f.events(1).await.len(), 1);
    let (_watcher, opens) = count_opens(f.dir.path());

    // Each rescan reads the broken manifest again: three of them read it, and nothing else.
    let broken = f.path("broken.yaml");
    let rescans_seen = |count: usize| {
        let opens = opens.clone();
        let broken = broken.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while opens.lock().unwrap().get(&broken).copied().unwrap_or(0) < count {
                assert!(tokio::time::Instant::now() < deadline, "no {count} rescans in 10 s: {opens:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    rescans_seen(3).await;
    // (A rescan lists the directory, which opens it.)
    let manifest_opened = |p: &&PathBuf| **p != broken && *p != f.dir.path();
    let opened: Vec<PathBuf> = opens.lock().unwrap().keys().filter(manifest_opened).cloned().collect();
    assert!(opened.is_empty(), "idle, yet unchanged files were opened by the rescans: {opened:?}");
    opens.lock().unwrap().clear();

    // A new manifest: the scan reads it (and the broken one), not the 50 unchanged ones, and
    // neither do the rescans after it.
    write_atomic(&f.path("pod-new.yaml"), &manifest("pod-new", "busybox:1"));
    assert_eq!(f.next().await, add(&["pod-new-node-a"]));
    rescans_seen(3).await;
    let opened: Vec<PathBuf> = opens.lock().unwrap().keys().cloned().collect();
    assert!(opened.iter().all(|p| !p.file_name().unwrap().to_string_lossy().starts_with("pod-0")), "{opened:?}");
    assert!(opened.contains(&f.path("pod-new.yaml")), "{opened:?}");
    f.stop().await;
}

/// A burst of broken manifests, written while the source scans the ones before: each is named by
/// one event, neither while it was empty nor again after a scan that caught it just written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_of_a_burst_of_broken_manifests_is_reported_once() {
    let f = Fixture::start();
    tokio::time::sleep(SETTLE * 5).await;
    let broken: [&[u8]; 4] = [
        b"apiVersion: v1\nkind: Pod\nmetadata: {name: [unclosed\n",
        b"apiVersion: v1\nkind: Service\nmetadata: {name: svc}\n",
        b"apiVersion: v1\nkind: Pod\nmetadata: {name: empty}\nspec: {containers: []}\n",
        b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: \xff\xfe\n",
    ];
    let names: Vec<String> = (0..40).map(|i| format!("broken-{i:02}.yaml")).collect();
    let dir = f.dir.path().to_path_buf();
    let written = names.clone();
    tokio::task::spawn_blocking(move || {
        for (i, name) in written.iter().enumerate() {
            fs::write(dir.join(name), broken[i % broken.len()]).unwrap();
        }
    })
    .await
    .unwrap();
    f.events(names.len()).await;
    // Time for a scan that would report one again.
    tokio::time::sleep(HALF_WRITTEN * 2).await;
    let events = f.ring.events();
    let not_once: Vec<(&String, Vec<&str>)> = names
        .iter()
        .map(|name| {
            (name, events.iter().filter(|e| e.message.contains(name.as_str())).map(|e| e.message.as_str()).collect())
        })
        .filter(|(_, messages): &(_, Vec<&str>)| messages.len() != 1)
        .collect();
    assert!(not_once.is_empty(), "{not_once:#?}");
    f.stop().await;
}

/// A manifest past the size limit is refused by its size, unread (a buffer of the limit's size
/// read at every scan would stay with the allocator), with its true size in the error.
#[tokio::test]
async fn a_manifest_past_the_size_limit_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.yaml");
    let size = crate::manifest::MAX_MANIFEST_BYTES as u64 * 2;
    // Sparse: the size is what counts, and nothing needs writing.
    fs::File::create(&huge).unwrap().set_len(size).unwrap();
    let (_watcher, opens) = count_opens(dir.path());
    let path = dir.path().to_path_buf();
    let f = Fixture::start_at(dir, path);
    let events = f.events(1).await;
    let messages: Vec<&str> = events.iter().map(|e| e.message.as_str()).collect();
    assert!(
        messages.len() == 1 && messages[0].contains(&format!("huge.yaml: manifest is {size} bytes, more than the")),
        "{messages:?}"
    );
    assert_eq!(opens.lock().unwrap().get(&huge), None, "the file was opened");
    f.stop().await;
}
