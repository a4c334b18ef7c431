//! The eviction manager (upstream `pkg/kubelet/eviction`): it watches the node's signals
//! against the configured thresholds, reports `MemoryPressure`, `DiskPressure` and
//! `PIDPressure`, reclaims what the node itself holds (dead containers, unused images), and
//! evicts one pod per round, ranked as upstream ranks them, until the pressure is gone.
//!
//! - [`state`]: the rules over time (thresholds met, grace periods, minimum reclaim, the
//!   transition period), pure.
//! - [`mod@rank`]: the pods' use, the eviction order and messages, pure.
//! - [`stats`]: where the signals and the pods' use come from ([`StatsProvider`],
//!   [`HostStats`]).
//! - [`Manager`]: the loop, every 10 s as upstream's.
//!
//! The thresholds themselves ([`Thresholds`](kubelet_core::eviction::Thresholds)) and the
//! conditions the manager sets ([`NodePressure`]) are `kubelet_core`'s, so admission and the
//! node's status read them without this crate.

pub mod rank;
pub mod state;
pub mod stats;
pub mod summary;

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus as ApiPodStatus};
use kubelet_core::{
    KillPodOptions, PodUid, PodWorkers, SyncPodType, UpdatePodOptions,
    events::{Event, EventRecorder, EventType, ObjectRef},
    eviction::{NodePressure, Resource, Signal, Threshold},
    hook::BoxFuture,
    resources,
    types::{is_critical_pod, pod_full_name},
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

pub use crate::stats::{HostPaths, HostStats, Need, StatsProvider};
use crate::{
    rank::{DiskParts, PodStats, bytes, container_amount, eviction_message, rank},
    state::{Observations, State, thresholds_met},
};

/// Upstream's reason for an evicted pod.
pub const REASON: &str = "Evicted";

/// How the manager runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The thresholds (`evictionHard`, `evictionSoft` and the rest, parsed).
    pub thresholds: Vec<Threshold>,
    /// `evictionPressureTransitionPeriod` (5m): how long a condition outlasts its threshold.
    pub pressure_transition_period: Duration,
    /// `evictionMaxPodGracePeriod` (0): the most grace a pod evicted for a soft threshold gets.
    pub max_pod_grace_period: i64,
    /// How often the signals are read (10 s, upstream's `evictionMonitoringPeriod`).
    pub monitoring_period: Duration,
    /// How long the manager waits for an evicted pod to stop before the next round (30 s).
    pub pod_cleanup_timeout: Duration,
    /// Whether emptyDir `sizeLimit` and `ephemeral-storage` limits are policed
    /// (`LocalStorageCapacityIsolation`, on as upstream's).
    pub local_storage_limits: bool,
}

impl Config {
    /// Upstream's periods with `thresholds`.
    pub fn new(thresholds: Vec<Threshold>) -> Self {
        Config {
            thresholds,
            pressure_transition_period: Duration::from_secs(300),
            max_pod_grace_period: 0,
            monitoring_period: Duration::from_secs(10),
            pod_cleanup_timeout: Duration::from_secs(30),
            local_storage_limits: true,
        }
    }
}

/// A boxed error of a reclaim.
pub type ReclaimError = Box<dyn std::error::Error + Send + Sync>;

/// What the node itself holds that can go before pods do (upstream's `ContainerGC` and
/// `ImageGC` as the eviction manager calls them).
pub trait NodeReclaim: Send + Sync + 'static {
    /// Removes every dead container no pod needs (upstream `DeleteAllUnusedContainers`).
    fn delete_unused_containers(&self) -> BoxFuture<'_, Result<(), ReclaimError>>;

    /// Removes every image no container uses (upstream `DeleteUnusedImages`).
    fn delete_unused_images(&self) -> BoxFuture<'_, Result<(), ReclaimError>>;
}

/// The pods that may be evicted: admitted, not terminal, not terminating.
pub type ActivePods = Arc<dyn Fn() -> Vec<Arc<Pod>> + Send + Sync>;

/// Whether an evicted pod's resources are reclaimed: nothing of it runs, its volumes are gone.
pub type PodCleanedUp = Arc<dyn Fn(&PodUid) -> bool + Send + Sync>;

/// The eviction manager.
pub struct Manager<S, W> {
    config: Config,
    stats: S,
    workers: Arc<W>,
    active_pods: ActivePods,
    reclaim: Option<Arc<dyn NodeReclaim>>,
    cleaned_up: Option<PodCleanedUp>,
    recorder: Arc<dyn EventRecorder>,
    node: ObjectRef,
    pressure: Arc<NodePressure>,
}

impl<S, W> std::fmt::Debug for Manager<S, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager").field("config", &self.config).finish_non_exhaustive()
    }
}

impl<S: StatsProvider, W: PodWorkers> Manager<S, W> {
    /// A manager reading `stats`, evicting through `workers` among `active_pods`, with its
    /// events on node `node_name` and its conditions in `pressure`.
    pub fn new(
        config: Config,
        stats: S,
        workers: Arc<W>,
        active_pods: ActivePods,
        recorder: Arc<dyn EventRecorder>,
        node_name: &str,
        pressure: Arc<NodePressure>,
    ) -> Self {
        let mut node = ObjectRef::other("Node", node_name);
        node.uid = node_name.to_owned();
        Manager { config, stats, workers, active_pods, reclaim: None, cleaned_up: None, recorder, node, pressure }
    }

    /// Reclaims disk through `reclaim` before evicting pods for it.
    #[must_use]
    pub fn node_reclaim(mut self, reclaim: Arc<dyn NodeReclaim>) -> Self {
        self.reclaim = Some(reclaim);
        self
    }

    /// After an eviction, waits until `cleaned_up` says the pod's resources are reclaimed (at
    /// most the cleanup timeout) before the next round, so the space or memory it held is not
    /// taken for pressure that needs another eviction; without it, the next round waits a
    /// monitoring period.
    #[must_use]
    pub fn pod_cleaned_up(mut self, cleaned_up: PodCleanedUp) -> Self {
        self.cleaned_up = Some(cleaned_up);
        self
    }

    /// Runs a round every monitoring period until `cancel`; after an eviction, the next round
    /// waits for the pod's resources to be reclaimed (upstream `waitForPodsCleanup`).
    pub async fn run(self, cancel: CancellationToken) {
        if self.config.thresholds.is_empty() && !self.config.local_storage_limits {
            info!("no eviction thresholds: the eviction manager is off");
            return;
        }
        let mut state = State::new();
        let mut dedicated_image_fs = None;
        loop {
            // Asked until known (upstream asks each round until the runtime answers); until
            // then the images count as sharing the node's filesystem.
            if dedicated_image_fs.is_none() {
                dedicated_image_fs = self.stats.dedicated_image_fs().await;
                if let Some(dedicated) = dedicated_image_fs {
                    debug!(dedicated, "eviction manager: whether the images have a filesystem of their own");
                }
            }
            let evicted = self.synchronize(&mut state, dedicated_image_fs.unwrap_or(false)).await;
            let wait = async {
                match (&self.cleaned_up, evicted.is_empty()) {
                    (Some(cleaned_up), false) => self.wait_for_cleanup(cleaned_up, &evicted).await,
                    _ => tokio::time::sleep(self.config.monitoring_period).await,
                }
            };
            if cancel.run_until_cancelled(wait).await.is_none() {
                return;
            }
        }
    }

    /// Polls `cleaned_up` every second until every pod of `evicted` is cleaned up, at most the
    /// cleanup timeout.
    async fn wait_for_cleanup(&self, cleaned_up: &PodCleanedUp, evicted: &[PodUid]) {
        let deadline = Instant::now() + self.config.pod_cleanup_timeout;
        while !evicted.iter().all(|uid| cleaned_up(uid)) {
            if Instant::now() >= deadline {
                warn!(pods = ?evicted, "eviction manager: timed out waiting for evicted pods to be cleaned up");
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        info!(pods = ?evicted, "eviction manager: evicted pods were cleaned up");
    }

    /// One round (upstream `synchronize`); returns the pods it evicted.
    pub async fn synchronize(&self, state: &mut State, dedicated_image_fs: bool) -> Vec<PodUid> {
        let observations = self.stats.observe().await;
        let transition = self.config.pressure_transition_period;
        let round = state.observe(&self.config.thresholds, &observations, transition, Instant::now());
        let before = self.pressure.conditions();
        if before != round.conditions {
            info!(conditions = ?round.conditions, "eviction manager: node conditions changed");
        }
        self.pressure.set(&round.conditions);
        let active = (self.active_pods)();
        if self.config.local_storage_limits {
            let evicted = self.police_local_storage(&active, dedicated_image_fs).await;
            if !evicted.is_empty() {
                return evicted;
            }
        }
        let Some(threshold) = round.to_act_on.first().copied() else { return Vec::new() };
        let signal = threshold.signal;
        let resource = signal.resource();
        info!(resource = %resource, signal = %signal, "eviction manager: attempting to reclaim");
        self.node_event(EventType::Warning, "EvictionThresholdMet", format!("Attempting to reclaim {resource}"));
        if self.reclaim_node_level(signal, dedicated_image_fs).await {
            info!(resource = %resource, "eviction manager: able to reduce resource pressure without evicting pods");
            return Vec::new();
        }
        if active.is_empty() {
            error!("eviction manager: eviction thresholds have been met, but no pods are active to evict");
            return Vec::new();
        }
        let stats = self.stats.pod_stats(&active, Need::for_signal(signal)).await;
        let mut ranked = active;
        rank(&mut ranked, signal, &stats, dedicated_image_fs);
        info!(pods = ?ranked.iter().map(|p| pod_full_name(p)).collect::<Vec<_>>(), "eviction manager: pods ranked for eviction");
        let grace = if threshold.is_hard() { 0 } else { self.config.max_pod_grace_period };
        for pod in &ranked {
            let pod_stats = stats.get(&PodUid::of(pod));
            let message = eviction_message(resource, pod, pod_stats, &round.to_act_on, &observations);
            if self.evict(pod, grace, message) {
                metrics::counter!("kubelet_evictions", "eviction_signal" => signal.name()).increment(1);
                return vec![PodUid::of(pod)];
            }
        }
        warn!("eviction manager: unable to evict any pods from the node");
        Vec::new()
    }

    /// Node-level reclaim for a disk signal; whether it brought every threshold (with its
    /// minimum reclaim) back (upstream `reclaimNodeLevelResources`).
    async fn reclaim_node_level(&self, signal: Signal, dedicated_image_fs: bool) -> bool {
        let Some(reclaim) = &self.reclaim else { return false };
        let on_image_fs = matches!(signal, Signal::ImageFsAvailable | Signal::ImageFsInodesFree);
        let disk = signal.condition() == kubelet_core::eviction::Pressure::Disk;
        // With a dedicated image filesystem, nothing of the node's own lives on nodefs.
        if !disk || (dedicated_image_fs && !on_image_fs) {
            return false;
        }
        if let Err(err) = reclaim.delete_unused_containers().await {
            info!(error = %err, "eviction manager: cannot remove unused containers");
        }
        if let Err(err) = reclaim.delete_unused_images().await {
            info!(error = %err, "eviction manager: cannot remove unused images");
        }
        let observations: Observations = self.stats.observe().await;
        thresholds_met(&self.config.thresholds, &observations, true).is_empty()
    }

    /// Evicts the pods that exceed their local storage limits (upstream
    /// `localStorageEviction`); returns those evicted.
    async fn police_local_storage(&self, active: &[Arc<Pod>], dedicated_image_fs: bool) -> Vec<PodUid> {
        let limited: Vec<Arc<Pod>> = active.iter().filter(|p| has_local_storage_limit(p)).cloned().collect();
        if limited.is_empty() {
            return Vec::new();
        }
        let stats = self.stats.pod_stats(&limited, Need { disk: true, ..Need::default() }).await;
        let mut evicted = Vec::new();
        for pod in &limited {
            let Some(pod_stats) = stats.get(&PodUid::of(pod)) else { continue };
            let Some((message, signal)) = local_storage_violation(pod, pod_stats, dedicated_image_fs) else { continue };
            if self.evict(pod, 0, message) {
                metrics::counter!("kubelet_evictions", "eviction_signal" => signal).increment(1);
                evicted.push(PodUid::of(pod));
            }
        }
        evicted
    }

    /// Kills `pod` as evicted with at most `grace` seconds; whether it did (a critical pod is
    /// never evicted).
    fn evict(&self, pod: &Arc<Pod>, grace: i64, message: String) -> bool {
        if is_critical_pod(pod) {
            error!(pod = %pod_full_name(pod), "eviction manager: cannot evict a critical pod");
            return false;
        }
        self.recorder.record(Event::new(EventType::Warning, REASON, message.clone(), ObjectRef::pod(pod)));
        info!(pod = %pod_full_name(pod), message = %message, "evicting pod");
        let status_fn = Arc::new(move |status: &mut ApiPodStatus| mark_evicted(status, &message));
        let kill = KillPodOptions::evict(status_fn).grace_period_override(grace);
        self.workers.update_pod(UpdatePodOptions::new(SyncPodType::Kill, pod.clone()).with_kill(kill));
        true
    }

    fn node_event(&self, kind: EventType, reason: &str, message: String) {
        self.recorder.record(Event::new(kind, reason, message, self.node.clone()));
    }
}

/// An evicted pod's final status: `Failed`, `Evicted`, the message, and the
/// `DisruptionTarget` condition upstream adds.
pub fn mark_evicted(status: &mut ApiPodStatus, message: &str) {
    status.phase = Some("Failed".to_owned());
    status.reason = Some(REASON.to_owned());
    status.message = Some(message.to_owned());
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    conditions.retain(|c| c.type_ != "DisruptionTarget");
    conditions.push(PodCondition {
        type_: "DisruptionTarget".to_owned(),
        status: "True".to_owned(),
        reason: Some("TerminationByKubelet".to_owned()),
        message: Some(message.to_owned()),
        ..PodCondition::default()
    });
}

/// A pod's `ephemeral-storage` limit in bytes (upstream's `PodLimits`), when a container has one.
fn pod_ephemeral_storage_limit(pod: &Pod) -> Option<u64> {
    resources::pod_limit(pod, Resource::EphemeralStorage.name(), resources::units).map(bytes)
}

fn has_local_storage_limit(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    let size_limit =
        spec.volumes.iter().flatten().any(|v| v.empty_dir.as_ref().is_some_and(|e| e.size_limit.is_some()));
    size_limit || pod_ephemeral_storage_limit(pod).is_some()
}

/// The first local storage limit `pod` exceeds, with upstream's message and metric signal:
/// an emptyDir's `sizeLimit`, the pod's `ephemeral-storage` limit, a container's.
pub fn local_storage_violation(
    pod: &Pod,
    stats: &PodStats,
    dedicated_image_fs: bool,
) -> Option<(String, &'static str)> {
    let spec = pod.spec.as_ref()?;
    for volume in spec.volumes.iter().flatten() {
        let Some(limit) = volume.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()) else { continue };
        let limit_bytes = resources::units(limit).map_or(0, bytes);
        let over = stats.volume(&volume.name).is_some_and(|used| limit_bytes > 0 && used > limit_bytes);
        if over {
            let message = format!("Usage of EmptyDir volume {:?} exceeds the limit {:?}. ", volume.name, limit.0);
            return Some((message, "emptydirfs.limit"));
        }
    }
    if let Some(limit) = pod_ephemeral_storage_limit(pod)
        && stats.disk(DiskParts::ALL, Resource::EphemeralStorage) > limit
    {
        let limit = kubelet_core::eviction::format_amount(limit, Resource::EphemeralStorage);
        let message = format!("Pod ephemeral local storage usage exceeds the total limit of containers {limit}. ");
        return Some((message, "ephemeralpodfs.limit"));
    }
    for usage in &stats.containers {
        let Some(container) = spec.containers.iter().find(|c| c.name == usage.name) else { continue };
        let Some(limit) = container_amount(container, Resource::EphemeralStorage, true).filter(|l| *l > 0) else {
            continue;
        };
        let mut used = usage.logs.map_or(0, |l| l.bytes);
        if !dedicated_image_fs {
            used += usage.rootfs.map_or(0, |r| r.bytes);
        }
        if used > limit {
            let written = container
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("ephemeral-storage"))
                .map_or_else(String::new, |q| q.0.clone());
            let message =
                format!("Container {} exceeded its local ephemeral storage limit {written:?}. ", container.name);
            return Some((message, "ephemeralcontainerfs.limit"));
        }
    }
    None
}

#[cfg(test)]
mod tests;
