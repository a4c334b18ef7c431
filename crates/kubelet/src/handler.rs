//! [`Kubelet`], what the sync loop calls: upstream's `SyncHandler` methods (`HandlePodAdditions`
//! and the rest, and `HandlePodCleanups`) on top of the pod workers.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use k8s_openapi::api::core::v1::{Pod, PodStatus as ApiPodStatus};
use kubelet_core::{
    Cache, KillPodOptions, PodManager, PodUid, PodWorkers, SourcesReady, SyncHandler, SyncPodType, UpdatePodOptions,
    WorkerSync,
    events::{Event, EventType, ObjectRef},
    eviction::NodePressure,
    runtime::Runtime,
    types::{is_mirror_pod, pod_full_name},
};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::{
    admission::{ApiNode, NodeUsage, Rejection, admit_to},
    cleanup::{Cleanups, Job, KnownNow},
    lock,
    pod_sync::{Error, PodSync},
    status,
    status_store::StatusStore,
    unsupported,
};

/// What the sync loop calls: upstream's `SyncHandler` on top of the pod workers.
pub struct Kubelet<R, W> {
    sync: Arc<PodSync<R>>,
    cache: Arc<Cache>,
    cleanups: Cleanups<R>,
    workers: Arc<W>,
    pods: Arc<PodManager>,
    sources: Arc<SourcesReady>,
    pressure: Arc<NodePressure>,
    api_node: Arc<ApiNode>,
    housekeepings: AtomicU64,
    /// What the last walk over the pods read, when it found nothing to do: until something
    /// moves, the next walk would find nothing either.
    settled_on: std::sync::Mutex<Option<WalkInputs>>,
    /// The pods nobody wants that the runtime or a worker held at the last walk
    /// ([`Kubelet::orphans_gone`]).
    undesired_at_last_walk: std::sync::Mutex<HashSet<PodUid>>,
}

/// What housekeeping's walk over the pods reads, by generation: the desired pods, what the
/// runtime held at the last relist, the statuses, and the workers' lifecycles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WalkInputs {
    pods: u64,
    cache: u64,
    statuses: u64,
    workers: u64,
}

impl<R, W> std::fmt::Debug for Kubelet<R, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet").finish_non_exhaustive()
    }
}

/// Whether the pod's phase, as last computed or as its config says, is terminal.
fn is_terminal(statuses: &StatusStore, pod: &Pod) -> bool {
    let stored = statuses.phase(&PodUid::of(pod));
    let phase = stored.or_else(|| pod.status.as_ref().and_then(|s| s.phase.clone()));
    matches!(phase.as_deref(), Some(status::SUCCEEDED | status::FAILED))
}

/// The pods of `pods` that count against the node (upstream `GetActivePods`): not terminal,
/// not known terminated by `workers`, and not `except`.
pub(crate) fn active_pods(
    pods: &PodManager,
    statuses: &StatusStore,
    workers: &impl PodWorkers,
    except: Option<&PodUid>,
) -> Vec<Arc<Pod>> {
    pods.pods()
        .into_iter()
        .filter(|p| {
            let uid = PodUid::of(p);
            Some(&uid) != except && !is_terminal(statuses, p) && !workers.is_pod_known_terminated(&uid)
        })
        .collect()
}

/// Housekeeping runs runtime garbage collection every this many rounds (about a minute at 2 s).
const GC_EVERY: u64 = 30;

impl<R: Runtime, W: PodWorkers> Kubelet<R, W> {
    /// A kubelet over `sync` (the same one `workers` call) and `workers`; `cache` is the PLEG's
    /// status cache, where housekeeping finds the pods the runtime holds.
    pub fn new(
        sync: Arc<PodSync<R>>,
        workers: Arc<W>,
        pods: Arc<PodManager>,
        sources: Arc<SourcesReady>,
        cache: Arc<Cache>,
    ) -> Self {
        let known_now: KnownNow = {
            let (pods, workers) = (pods.clone(), workers.clone());
            Arc::new(move |uid| pods.pod_by_uid(uid).is_some() || workers.is_pod_known(uid))
        };
        let cleanups = Cleanups::new(sync.clone(), known_now);
        let pressure = Arc::new(NodePressure::new());
        Kubelet {
            sync,
            cache,
            cleanups,
            workers,
            pods,
            sources,
            pressure,
            api_node: Arc::default(),
            housekeepings: AtomicU64::new(0),
            settled_on: std::sync::Mutex::default(),
            undesired_at_last_walk: std::sync::Mutex::default(),
        }
    }

    /// The removals the kubelet queues (dead containers, what is left of pods that are gone,
    /// orphaned pod directories, garbage collection); whoever runs the kubelet runs
    /// [`Cleanups::run`] beside the sync loop, as [`Agent`](crate::Agent) does.
    pub fn cleanups(&self) -> &Cleanups<R> {
        &self.cleanups
    }

    /// Resolves once the prober's tasks have stopped (at once without a prober).
    pub async fn prober_stopped(&self) {
        if let Some(prober) = &self.sync.prober {
            prober.stopped().await;
        }
    }

    fn dispatch(&self, pod: Arc<Pod>, kind: SyncPodType) {
        let mirror = self.pods.mirror_pod_of(&pod);
        self.workers
            .update_pod(UpdatePodOptions::new(kind, pod).with_mirror_pod(mirror).with_start_time(Instant::now()));
    }

    fn is_terminal(&self, pod: &Pod) -> bool {
        is_terminal(&self.sync.statuses, pod)
    }

    /// Pods that count against the node's capacity: known, not terminal, not terminated.
    fn active_pods(&self, except: Option<&PodUid>) -> Vec<Arc<Pod>> {
        active_pods(&self.pods, &self.sync.statuses, self.workers.as_ref(), except)
    }

    /// Refuses new pods under node pressure as `pressure` says (upstream's eviction admit
    /// handler); without a call, the node is never under pressure.
    #[must_use]
    pub fn with_pressure(mut self, pressure: Arc<NodePressure>) -> Self {
        self.pressure = pressure;
        self
    }

    /// Admits pods against the node's labels and taints as `api_node` has them once it knows the
    /// Node (upstream's node informer); without a call, against the node's own.
    #[must_use]
    pub fn with_api_node(mut self, api_node: Arc<ApiNode>) -> Self {
        self.api_node = api_node;
        self
    }

    /// A mirror pod came, changed or went: its static pod is synced, to keep the mirror (upstream
    /// `handleMirrorPod`).
    fn handle_mirror_pod(&self, mirror: &Pod) {
        if let Some(pod) = self.pods.pod_of_mirror(mirror) {
            self.dispatch(pod, SyncPodType::Update);
        }
    }

    /// Whether `pod` may run beside the active pods, whose holdings `usage` sums: fields this
    /// agent implements, no node pressure that refuses it, and upstream's admission checks.
    fn admission(&self, pod: &Pod, usage: &NodeUsage) -> Result<(), Rejection> {
        let unsupported = self.sync.unsupported_fields(pod);
        if !unsupported.is_empty() {
            warn!(pod = %pod_full_name(pod), fields = ?unsupported, "pod refused: it uses fields this agent does not implement");
            return Err(Rejection::new(unsupported::REASON, unsupported::message(&unsupported)));
        }
        if let Err(message) = kubelet_core::eviction::admit(pod, &self.pressure) {
            warn!(pod = %pod_full_name(pod), conditions = ?self.pressure.conditions(), "pod rejected under node pressure");
            return Err(Rejection::new("Evicted", message));
        }
        admit_to(pod, usage, &self.api_node.over(&self.sync.config.node)).inspect_err(|rejection| {
            warn!(pod = %pod_full_name(pod), reason = %rejection.reason, "pod rejected");
        })
    }

    fn reject(&self, pod: &Pod, reason: &str, message: &str) {
        self.sync.recorder.record(Event::new(EventType::Warning, reason, message, ObjectRef::pod(pod)));
        let status = ApiPodStatus {
            phase: Some(status::FAILED.to_owned()),
            reason: Some(reason.to_owned()),
            message: Some(format!("Pod was rejected: {message}")),
            qos_class: Some(kubelet_core::resources::qos_class(pod).to_owned()),
            ..ApiPodStatus::default()
        };
        self.sync.statuses.set(pod, status);
    }
}

impl<R: Runtime, W: PodWorkers> SyncHandler for Kubelet<R, W> {
    type Error = Error;

    async fn handle_pod_additions(&self, mut pods: Vec<Arc<Pod>>) {
        pods.sort_by(|a, b| a.metadata.creation_timestamp.cmp(&b.metadata.creation_timestamp));
        // What the pods active before this batch hold, summed once; each pod of the batch that
        // goes on to run is counted in before the next is admitted.
        let batch: HashSet<PodUid> = pods.iter().map(|pod| PodUid::of(pod)).collect();
        let active: Vec<Arc<Pod>> =
            self.active_pods(None).into_iter().filter(|pod| !batch.contains(&PodUid::of(pod))).collect();
        let mut usage = NodeUsage::of(&active.iter().map(AsRef::as_ref).collect::<Vec<&Pod>>());
        for pod in pods {
            self.pods.add_pod(pod.clone());
            if is_mirror_pod(&pod) {
                self.handle_mirror_pod(&pod);
                continue;
            }
            let uid = PodUid::of(&pod);
            let terminal = self.is_terminal(&pod);
            if !terminal && !self.workers.is_pod_termination_requested(&uid) {
                if let Err(rejection) = self.admission(&pod, &usage) {
                    self.reject(&pod, &rejection.reason, &rejection.message);
                    continue;
                }
                usage.add(&pod);
            } else if !terminal && !self.workers.is_pod_known_terminated(&uid) {
                // Being stopped: it holds what it has until it has stopped.
                usage.add(&pod);
            }
            if let Some(prober) = &self.sync.prober {
                prober.add_pod(&pod);
            }
            self.dispatch(pod, SyncPodType::Create);
        }
    }

    async fn handle_pod_updates(&self, pods: Vec<Arc<Pod>>) {
        for pod in pods {
            self.pods.update_pod(pod.clone());
            if is_mirror_pod(&pod) {
                self.handle_mirror_pod(&pod);
            } else {
                self.dispatch(pod, SyncPodType::Update);
            }
        }
    }

    async fn handle_pod_removes(&self, pods: Vec<Arc<Pod>>) {
        for pod in pods {
            self.pods.remove_pod(&pod);
            if is_mirror_pod(&pod) {
                self.handle_mirror_pod(&pod);
                continue;
            }
            // Until every source has spoken, a removal may be an artefact: housekeeping retries.
            if !self.sources.all_ready() {
                debug!(pod = %pod_full_name(&pod), "sources not ready; leaving the removal to housekeeping");
                continue;
            }
            self.workers.update_pod(UpdatePodOptions::new(SyncPodType::Kill, pod).with_kill(KillPodOptions::default()));
        }
    }

    async fn handle_pod_reconcile(&self, pods: Vec<Arc<Pod>>) {
        for pod in pods {
            self.pods.update_pod(pod.clone());
            let evicted = pod.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted");
            if evicted {
                // Its dead containers go at once.
                self.cleanups.push(Job::RemoveDeadContainers(PodUid::of(&pod)));
            }
            // A mirror pod's conditions are not its static pod's, whose status the kubelet makes.
            if !is_mirror_pod(&pod) && crate::status::readiness_needs_reconcile(&pod) {
                // A readiness gate's condition changed: Ready follows at once.
                self.dispatch(pod, SyncPodType::Sync);
            }
        }
    }

    async fn handle_pod_syncs(&self, pods: Vec<Arc<Pod>>) {
        for pod in pods {
            // The newest config of the pod, if it changed meanwhile.
            let pod = self.pods.pod_by_uid(&PodUid::of(&pod)).unwrap_or(pod);
            self.dispatch(pod, SyncPodType::Sync);
        }
    }

    async fn handle_pod_cleanups(&self) -> Result<(), Error> {
        let first = self.housekeepings.load(Ordering::Relaxed) == 0;
        // Read before the walk: whatever changes during it makes the next one walk again.
        let inputs = self.walk_inputs();
        let settled = inputs.is_some() && *lock(&self.settled_on) == inputs;
        if first || !settled || self.cleanups.orphaned_dirs_left() {
            let acted = self.walk_pods(first);
            *lock(&self.settled_on) = if acted { None } else { inputs };
        }
        self.sync.backoff.gc(Instant::now());
        if self.housekeepings.fetch_add(1, Ordering::Relaxed).is_multiple_of(GC_EVERY) {
            self.cleanups.push(Job::CollectGarbage { all_sources_ready: self.sources.all_ready() });
        }
        Ok(())
    }

    async fn handle_container_died(&self, uid: &PodUid, _container_id: &str) {
        self.cleanups.push(Job::ContainerDied(uid.clone()));
    }
}

impl<R: Runtime, W: PodWorkers> Kubelet<R, W> {
    /// The generations of what [`Kubelet::walk_pods`] reads, or `None` when the workers cannot
    /// say (their lifecycle generation is withheld while a termination is under way).
    fn walk_inputs(&self) -> Option<WalkInputs> {
        Some(WalkInputs {
            pods: self.pods.generation(),
            cache: self.cache.generation(),
            statuses: self.sync.statuses.generation(),
            workers: self.workers.lifecycle_generation()?,
        })
    }

    /// Housekeeping's walk over the pods (upstream `HandlePodCleanups`): the workers of pods
    /// that are gone stop and are forgotten, desired pods no worker knows start, orphans in the
    /// runtime are killed and what is left of stopped ones is removed, and what is kept about
    /// pods that are gone is forgotten. Returns whether it acted (killed, restarted, removed
    /// or forgot a pod, or waited on one the PLEG could not inspect): then the next
    /// housekeeping walks again, whatever moved.
    fn walk_pods(&self, first: bool) -> bool {
        let mut acted = false;
        let desired = self.pods.pods();
        let desired_uids: HashSet<PodUid> = desired.iter().map(|p| PodUid::of(p)).collect();
        let workers = self.workers.sync_known_pods(&desired);
        // Upstream rule B.3: an active pod the workers do not know was re-added with the same UID
        // while it terminated (static pods have fixed UIDs); once its worker is gone, start it again.
        for pod in self.active_pods(None) {
            let uid = PodUid::of(&pod);
            if !workers.contains_key(&uid) && !is_mirror_pod(&pod) {
                info!(pod = %pod_full_name(&pod), pod.uid = %uid, "pod will be restarted: it is desired and not known to the pod workers (likely a reused UID)");
                acted = true;
                if let Some(prober) = &self.sync.prober {
                    prober.add_pod(&pod);
                }
                self.dispatch(pod, SyncPodType::Create);
            }
        }
        // Pods in the runtime that nobody wants and no worker knows: running ones are orphans,
        // killed with a 1 s grace; what is left of stopped ones is removed. The PLEG's cache says
        // what the runtime held at its last relist, so housekeeping asks the runtime nothing.
        let cached_pods = self.cache.pods();
        let in_runtime: HashSet<PodUid> = cached_pods.iter().map(|(uid, _)| uid.clone()).collect();
        for (uid, cached) in cached_pods {
            if workers.contains_key(&uid) || desired_uids.contains(&uid) {
                continue;
            }
            acted = true;
            if let Some(err) = &cached.error {
                debug!(pod.uid = %uid, error = %err, "not inspected at the last relist; housekeeping waits");
                continue;
            }
            if cached.status.is_running() {
                let kill = KillPodOptions::default().grace_period_override(1);
                self.workers.update_pod(UpdatePodOptions::kill_orphan(cached.status.to_running_pod(), kill));
            } else {
                self.cleanups.push(Job::RemovePodContent(uid));
            }
        }
        // What is kept about pods that are gone.
        let mut forgot_any = false;
        for uid in self.sync.statuses.uids() {
            if !desired_uids.contains(&uid) && !workers.contains_key(&uid) {
                self.sync.forget(&uid);
                forgot_any = true;
                // A pod whose start was cut short may have left files beside the runtime (its
                // cgroup, its log directory) without anything in the runtime for the loop above
                // to find.
                if !in_runtime.contains(&uid) {
                    self.cleanups.push(Job::RemovePodContent(uid));
                }
            }
        }
        if let Some(prober) = &self.sync.prober {
            prober.cleanup_pods(&desired_uids);
        }
        // Mirror pods whose static pod is gone go from the API server.
        if self.sync.mirrors.is_some() {
            for mirror in self.pods.mirror_pods() {
                if self.pods.pod_of_mirror(&mirror).is_none() {
                    let meta = &mirror.metadata;
                    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".to_owned());
                    self.cleanups.push(Job::DeleteMirrorPod { namespace, name: meta.name.clone().unwrap_or_default() });
                    acted = true;
                }
            }
        }
        let orphans_gone = self.orphans_gone(&desired_uids, &in_runtime, &workers);
        let keep: HashSet<PodUid> = desired_uids.into_iter().chain(workers.into_keys()).collect();
        // Pod cgroups nobody claims: those a crash left, looked for at the first housekeeping,
        // and those of pods that went since, not every round (idle costs nothing per pod).
        // Orphaned pod directories alike, and again while the last sweep left one behind
        // (something still mounted below it, or the runtime not done with the pod).
        let went = first || forgot_any || orphans_gone;
        let sweep_cgroups = self.sync.cgroups.is_some() && went;
        let sweep_dirs = went || self.cleanups.orphaned_dirs_left();
        let keep_cgroups = sweep_cgroups.then(|| keep.iter().chain(&in_runtime).cloned().collect());
        if sweep_dirs {
            self.cleanups.push(Job::RemoveOrphanedPodDirs { keep });
        }
        if let Some(keep) = keep_cgroups {
            self.cleanups.push(Job::RemoveOrphanedPodCgroups { keep });
        }
        acted || forgot_any
    }

    /// Whether a pod nobody wants that the runtime or a worker held at the last walk is gone
    /// from both now. Orphaned pod directories and cgroups are then swept again: a pod deleted
    /// while the agent was down is killed as an orphan after the first housekeeping's sweep
    /// (which its worker kept it from), and leaves its directory, its volumes still mounted.
    fn orphans_gone(
        &self,
        desired: &HashSet<PodUid>,
        in_runtime: &HashSet<PodUid>,
        workers: &HashMap<PodUid, WorkerSync>,
    ) -> bool {
        let held = |uid: &PodUid| in_runtime.contains(uid) || workers.contains_key(uid);
        let undesired: HashSet<PodUid> =
            in_runtime.iter().chain(workers.keys()).filter(|uid| !desired.contains(*uid)).cloned().collect();
        let before = std::mem::replace(&mut *lock(&self.undesired_at_last_walk), undesired);
        before.iter().any(|uid| !held(uid))
    }
}
