//! [`Cleanups`]: the kubelet's background removals (upstream's container deletor and garbage
//! collection goroutines, and the removals of `HandlePodCleanups`).
//!
//! The sync loop only queues them; one task runs them, so a runtime call that hangs delays other
//! removals, never another pod's sync.
//! A removal runs after the housekeeping that queued it, while pods keep coming: each checks,
//! when it runs, that the kubelet still does not know the pod (upstream runs these removals
//! inside housekeeping, where no pod can come meanwhile).

use std::{
    collections::{HashSet, VecDeque},
    mem::discriminant,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use kubelet_core::{
    Backoff, ErrorChain, PodUid,
    events::{Event, EventType, ObjectRef},
    runtime::{self, ContainerState, Runtime},
};
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{lock, pod_sync::PodSync};

/// One removal the sync loop asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Job {
    /// A container of the pod died: all but the newest dead instance of each container go.
    ContainerDied(PodUid),
    /// The pod was evicted: its dead containers go at once.
    RemoveDeadContainers(PodUid),
    /// Nothing of the pod runs and nobody wants it: its containers, sandboxes, cgroups and logs go.
    RemovePodContent(PodUid),
    /// Pod directories of pods other than these go, unless something is mounted below them.
    RemoveOrphanedPodDirs { keep: HashSet<PodUid> },
    /// Pod cgroups of pods other than these, which the pod cgroups' manager has not set up, go.
    RemoveOrphanedPodCgroups { keep: HashSet<PodUid> },
    /// Container garbage collection.
    CollectGarbage { all_sources_ready: bool },
    /// A mirror pod whose static pod is gone: it goes from the API server.
    DeleteMirrorPod { namespace: String, name: String },
}

/// Whether the kubelet knows the pod now: its config or its worker has it.
pub(crate) type KnownNow = Arc<dyn Fn(&PodUid) -> bool + Send + Sync>;

/// The kubelet's queue of removals and the task that runs them.
///
/// Cloning is cheap; clones share the queue.
pub struct Cleanups<R> {
    sync: Arc<PodSync<R>>,
    queue: Arc<Queue>,
    /// Asked as each removal runs: a pod the kubelet knows by then (one added since the
    /// housekeeping that queued the removal, whose worker may be making its directory and cgroup
    /// right now) is left alone.
    known_now: KnownNow,
    /// Pods whose removal failed: housekeeping asks again every 2 s, and the runtime is asked
    /// (and the failure logged) only when their backoff allows it.
    retries: Arc<Backoff>,
    /// Whether the last orphaned-directory sweep left an orphan's directory behind, which the
    /// next housekeeping sweeps again.
    orphaned_dirs_left: Arc<AtomicBool>,
}

/// The first wait after a failed pod removal, doubling up to [`RETRY_MAX`].
const RETRY_INITIAL: Duration = Duration::from_secs(2);
/// The longest wait between attempts to remove a pod that is gone.
const RETRY_MAX: Duration = Duration::from_secs(300);

impl<R> Clone for Cleanups<R> {
    fn clone(&self) -> Self {
        Cleanups {
            sync: self.sync.clone(),
            queue: self.queue.clone(),
            known_now: self.known_now.clone(),
            retries: self.retries.clone(),
            orphaned_dirs_left: self.orphaned_dirs_left.clone(),
        }
    }
}

impl<R> std::fmt::Debug for Cleanups<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cleanups").field("queued", &lock(&self.queue.jobs).len()).finish()
    }
}

#[derive(Default)]
struct Queue {
    jobs: Mutex<VecDeque<Job>>,
    notify: Notify,
}

impl<R: Runtime> Cleanups<R> {
    /// Removals for `sync`'s pods, each skipped for a pod `known_now` says the kubelet knows.
    pub(crate) fn new(sync: Arc<PodSync<R>>, known_now: KnownNow) -> Self {
        let retries = Arc::new(Backoff::new(RETRY_INITIAL, RETRY_MAX));
        Cleanups { sync, queue: Arc::default(), known_now, retries, orphaned_dirs_left: Arc::default() }
    }

    /// Whether the last orphaned-directory sweep left an orphan's directory behind (something
    /// still mounted below it, or the runtime not done with the pod), to be swept again.
    pub(crate) fn orphaned_dirs_left(&self) -> bool {
        self.orphaned_dirs_left.load(Ordering::Relaxed)
    }

    /// Whether `uid` is a pod nobody knows now: neither in `keep` (what housekeeping knew) nor
    /// known to the kubelet as the removal runs.
    fn unknown(&self, keep: &HashSet<PodUid>, uid: &PodUid) -> bool {
        !keep.contains(uid) && !(self.known_now)(uid)
    }

    /// Queues `job` unless the same one is already queued; a newer orphaned-directory or
    /// orphaned-cgroup sweep or garbage collection replaces a queued one.
    pub(crate) fn push(&self, job: Job) {
        let mut jobs = lock(&self.queue.jobs);
        let sweep = matches!(job, Job::RemoveOrphanedPodDirs { .. } | Job::RemoveOrphanedPodCgroups { .. });
        if sweep || matches!(job, Job::CollectGarbage { .. }) {
            jobs.retain(|queued| discriminant(queued) != discriminant(&job));
        }
        if !jobs.contains(&job) {
            jobs.push_back(job);
        }
        drop(jobs);
        self.queue.notify.notify_one();
    }

    /// Runs queued removals as they come, until `cancel` fires.
    pub async fn run(&self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.queue.notify.notified() => {}
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = self.run_queued() => {}
            }
        }
    }

    /// Runs every removal queued so far, one after another (what [`Cleanups::run`] does each
    /// time it wakes; tests call it directly).
    pub async fn run_queued(&self) {
        loop {
            let Some(job) = lock(&self.queue.jobs).pop_front() else { return };
            self.execute(job).await;
        }
    }

    async fn execute(&self, job: Job) {
        let runtime = &self.sync.runtime;
        match job {
            // Keep the newest dead instance of each container; older ones go.
            Job::ContainerDied(uid) => self.remove_dead_containers(&uid, true).await,
            Job::RemoveDeadContainers(uid) => self.remove_dead_containers(&uid, false).await,
            Job::RemovePodContent(uid) => {
                if (self.known_now)(&uid) {
                    debug!(pod.uid = %uid, "the pod came back before its removal ran; leaving it");
                    return;
                }
                self.remove_pod_content(&uid).await;
            }
            Job::RemoveOrphanedPodDirs { keep } => self.remove_orphaned_pod_dirs(&keep).await,
            Job::RemoveOrphanedPodCgroups { keep } => self.remove_orphaned_pod_cgroups(&keep).await,
            Job::DeleteMirrorPod { namespace, name } => {
                let Some(mirrors) = &self.sync.mirrors else { return };
                match mirrors.delete_mirror_pod(&namespace, &name, None).await {
                    Ok(true) => info!(pod = %name, namespace = %namespace, "deleted an orphaned mirror pod"),
                    Ok(false) => {}
                    Err(err) => {
                        warn!(pod = %name, namespace = %namespace, error = %err, "cannot delete an orphaned mirror pod")
                    }
                }
            }
            Job::CollectGarbage { all_sources_ready } => {
                let policy = runtime::GcPolicy::default();
                if let Err(err) = runtime.garbage_collect(&policy, all_sources_ready, false).await {
                    warn!(error = %ErrorChain(&err), "container garbage collection failed");
                }
            }
        }
    }

    /// Removes what is left of pod `uid`, which is gone: once, then again only when its backoff
    /// since the last failure allows.
    async fn remove_pod_content(&self, uid: &PodUid) {
        let now = Instant::now();
        self.retries.gc(now);
        if self.retries.is_in_backoff_since_update(uid.as_str(), now) {
            debug!(pod.uid = %uid, "removal of a pod that is gone failed before; waiting to try again");
            return;
        }
        debug!(pod.uid = %uid, "removing what is left of a pod that is gone");
        match self.sync.runtime.remove_pod_content(uid).await {
            Ok(()) => {
                debug!(pod.uid = %uid, took = ?now.elapsed(), "removed what was left of a pod that is gone");
                self.retries.reset(uid.as_str());
            }
            Err(err) => {
                self.retries.next(uid.as_str(), now);
                let retry_in = self.retries.get(uid.as_str());
                warn!(pod.uid = %uid, error = %ErrorChain(&err), ?retry_in, "cannot remove a pod that is gone");
            }
        }
    }

    /// Upstream's orphaned pod cgroup cleanup: the cgroup of a pod that is not in `keep` and
    /// that the pod cgroups' manager has not set up in this process goes, with what else is
    /// left of the pod. A pod whose directory is still there (a volume still mounted) keeps
    /// its cgroup, so a memory-backed volume's charge stays with it; the directory sweep,
    /// queued first, removes the cgroup with the directory.
    async fn remove_orphaned_pod_cgroups(&self, keep: &HashSet<PodUid>) {
        let Some(cgroups) = &self.sync.cgroups else { return };
        let unclaimed = match cgroups.unclaimed_pods() {
            Ok(unclaimed) => unclaimed,
            Err(err) => {
                warn!(error = %ErrorChain(&err), "cannot list the pods' cgroups");
                return;
            }
        };
        let pods_dir = self.sync.config.root_dir.join("pods");
        // Listed first, asked after: a pod's cgroup is made only once the kubelet knows the pod.
        for uid in unclaimed.into_iter().filter(|uid| self.unknown(keep, uid)) {
            if pods_dir.join(uid.as_str()).exists() {
                debug!(pod.uid = %uid, "orphaned pod found, but its directory is not removed yet; leaving its cgroup");
                continue;
            }
            info!(pod.uid = %uid, "orphaned pod found; removing its cgroup");
            self.remove_pod_content(&uid).await;
        }
    }

    /// Removes the pod's dead containers, all of them or all but the newest of each name.
    async fn remove_dead_containers(&self, uid: &PodUid, keep_newest: bool) {
        let Ok(status) = self.sync.runtime.get_pod_status(uid, "", "").await else { return };
        let mut seen = HashSet::new();
        // Statuses come newest first.
        for c in status.container_statuses.iter().filter(|c| c.state == ContainerState::Exited) {
            if keep_newest && seen.insert(c.name.as_str()) {
                continue;
            }
            if let Err(err) = self.sync.runtime.delete_container(&c.id).await {
                warn!(pod.uid = %uid, container.id = %c.id, error = %ErrorChain(&err), "cannot remove a dead container");
            }
        }
    }

    /// Upstream's orphaned pod directory cleanup: a directory with anything mounted below it is
    /// left alone (removing it would delete the mounted data), with a warning.
    async fn remove_orphaned_pod_dirs(&self, keep: &HashSet<PodUid>) {
        let left = self.sweep_orphaned_pod_dirs(keep).await;
        self.orphaned_dirs_left.store(left, Ordering::Relaxed);
    }

    /// [`Cleanups::remove_orphaned_pod_dirs`]' sweep: whether it left an orphan's directory.
    async fn sweep_orphaned_pod_dirs(&self, keep: &HashSet<PodUid>) -> bool {
        let root = self.sync.config.root_dir.join("pods");
        let Ok(mut entries) = tokio::fs::read_dir(&root).await else { return false };
        let mut orphans = Vec::new();
        while let Ok(Some(entry)) = entries.next_entry().await {
            let uid = PodUid::new(entry.file_name().to_string_lossy());
            // Listed first, asked after: a pod's directory is made only once the kubelet knows it.
            if self.unknown(keep, &uid) {
                orphans.push((uid, entry.path()));
            }
        }
        if orphans.is_empty() {
            return false;
        }
        let mountinfo = match tokio::fs::read_to_string("/proc/self/mountinfo").await {
            Ok(text) => text,
            Err(err) => {
                warn!(error = %err, "cannot read /proc/self/mountinfo; leaving orphaned pod directories alone");
                return true;
            }
        };
        let mut left = false;
        for (uid, dir) in orphans {
            // Volumes this agent set up (a pod gone while the agent was down) are torn down first.
            if let Some(volumes) = &self.sync.volumes
                && let Err(err) = volumes.unmount_pod(&uid).await
            {
                warn!(pod.uid = %uid, error = %err, "cannot tear down the volumes of an orphaned pod");
            }
            let mountinfo = tokio::fs::read_to_string("/proc/self/mountinfo").await.unwrap_or(mountinfo.clone());
            if let Some(mount) = kubelet_core::volume::mount_below(&mountinfo, &dir) {
                let message = format!(
                    "orphaned pod {uid} found, but {mount} is still mounted below {}; leaving its directory",
                    dir.display()
                );
                warn!(pod.uid = %uid, mount = %mount, "{message}");
                let object = ObjectRef::other("Node", self.sync.config.node_name.clone());
                self.sync.recorder.record(Event::new(EventType::Warning, "OrphanedPodMounted", message, object));
                left = true;
                continue;
            }
            // The directory goes last: while the runtime still holds something of the pod, or
            // something it left (a cgroup) cannot be removed yet, the directory stays, and the
            // next housekeeping tries again.
            if let Err(err) = self.sync.runtime.remove_pod_content(&uid).await {
                debug!(pod.uid = %uid, error = %ErrorChain(&err), "orphaned pod not removed yet; trying again later");
                left = true;
                continue;
            }
            debug!(pod.uid = %uid, dir = %dir.display(), "removing an orphaned pod directory");
            if let Err(err) = tokio::fs::remove_dir_all(&dir).await {
                warn!(error = %err, dir = %dir.display(), "cannot remove an orphaned pod directory");
                left = true;
            }
        }
        left
    }
}
