//! Probes as every agent names them: kinds, outcomes, the results store the prober writes and the
//! runtime and status read (upstream `pkg/kubelet/prober/results`), and the [`ProbeManager`]
//! trait through which the kubelet starts and stops probing.
//!
//! The prober itself, with its handlers, lives in `kubelet-prober`.

use std::{collections::HashSet, sync::Arc};

use dashmap::DashMap;
use k8s_openapi::api::core::v1::Pod;

use crate::PodUid;

/// Which probe produced a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProbeKind {
    /// Liveness: a failure kills and restarts the container.
    Liveness,
    /// Readiness: drives the container's `ready` and the pod's Ready condition.
    Readiness,
    /// Startup: holds the other probes until it succeeds; a failure kills the container.
    Startup,
}

impl ProbeKind {
    /// The three kinds.
    pub const ALL: [ProbeKind; 3] = [ProbeKind::Liveness, ProbeKind::Readiness, ProbeKind::Startup];

    /// Upstream's name (`probe_type` label, event messages): `Liveness`, `Readiness`, `Startup`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }

    /// The result a new container starts with (upstream `worker.initialValue`): readiness
    /// Failure, liveness Success, startup Unknown.
    pub fn initial_outcome(self) -> ProbeOutcome {
        match self {
            ProbeKind::Liveness => ProbeOutcome::Success,
            ProbeKind::Readiness => ProbeOutcome::Failure,
            ProbeKind::Startup => ProbeOutcome::Unknown,
        }
    }
}

/// A probe's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProbeOutcome {
    /// The probe passed (`successThreshold` times in a row).
    Success,
    /// The probe failed (`failureThreshold` times in a row).
    Failure,
    /// No verdict yet.
    Unknown,
}

/// A probe result that changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeResult {
    /// The probe kind.
    pub kind: ProbeKind,
    /// The pod.
    pub pod_uid: PodUid,
    /// The probed container's runtime ID.
    pub container_id: String,
    /// The verdict.
    pub outcome: ProbeOutcome,
}

impl ProbeResult {
    /// Creates a result.
    pub fn new(kind: ProbeKind, pod_uid: PodUid, container_id: impl Into<String>, outcome: ProbeOutcome) -> Self {
        ProbeResult { kind, pod_uid, container_id: container_id.into(), outcome }
    }
}

/// The latest verdict of every probe, by kind and runtime container ID (upstream's liveness,
/// readiness and startup results managers in one).
///
/// The prober writes it; the kubelet hands it to `Runtime::sync_pod`, which acts on liveness and
/// startup failures, and reads readiness and startup when it computes a status.
/// Shared by many tasks at once, so it is a sharded map; no reference into it is held across an
/// `.await`.
#[derive(Debug, Default)]
pub struct ProbeResults {
    outcomes: DashMap<(ProbeKind, String), (PodUid, ProbeOutcome)>,
}

impl ProbeResults {
    /// An empty store.
    pub fn new() -> Self {
        ProbeResults::default()
    }

    /// Records a verdict; true when it differs from the one recorded (or none was).
    pub fn set(&self, kind: ProbeKind, pod_uid: &PodUid, container_id: &str, outcome: ProbeOutcome) -> bool {
        let old = self.outcomes.insert((kind, container_id.to_owned()), (pod_uid.clone(), outcome));
        old.is_none_or(|(_, was)| was != outcome)
    }

    /// The verdict recorded for a container's probe, if any.
    pub fn get(&self, kind: ProbeKind, container_id: &str) -> Option<ProbeOutcome> {
        self.outcomes.get(&(kind, container_id.to_owned())).map(|entry| entry.value().1)
    }

    /// Whether a container's probe of `kind` has failed.
    pub fn failed(&self, kind: ProbeKind, container_id: &str) -> bool {
        self.get(kind, container_id) == Some(ProbeOutcome::Failure)
    }

    /// Forgets a container's probe of `kind` (its worker stopped).
    pub fn remove(&self, kind: ProbeKind, container_id: &str) {
        self.outcomes.remove(&(kind, container_id.to_owned()));
    }

    /// Forgets every verdict about a pod's containers.
    pub fn forget_pod(&self, pod_uid: &PodUid) {
        self.outcomes.retain(|_, (uid, _)| uid != pod_uid);
    }

    /// How many verdicts are recorded.
    pub fn len(&self) -> usize {
        self.outcomes.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.outcomes.is_empty()
    }
}

/// What the kubelet tells its prober (upstream `prober.Manager`): which pods to probe.
///
/// Methods return at once; probing happens on the prober's own tasks, whose verdicts go into
/// [`ProbeResults`] and, when they change, to the sync loop as [`ProbeResult`]s.
/// Used as `Arc<dyn ProbeManager>`, so an agent can leave probing out or bring its own.
pub trait ProbeManager: Send + Sync + 'static {
    /// A pod was added or updated: probe the containers of its spec that have probes (a probe
    /// already running for a container keeps running).
    fn add_pod(&self, pod: &Arc<Pod>);

    /// A pod is terminating or gone: stop probing it; its liveness and startup verdicts become
    /// Success so nothing restarts a container on its way out.
    fn remove_pod(&self, pod: &Pod);

    /// Housekeeping: stop probing every pod not in `desired`.
    fn cleanup_pods(&self, desired: &HashSet<PodUid>);

    /// A pod began terminating: stop its liveness and startup probes, whose verdicts become
    /// Success so nothing restarts a container on its way out, and keep probing readiness
    /// until it is gone (upstream `StopLivenessAndStartup`). By default, every probe stops.
    fn stop_liveness_and_startup(&self, pod: &Pod) {
        self.remove_pod(pod);
    }

    /// Container `container` of pod `uid` has started and is not ready: run its readiness probe
    /// now rather than at its next period (upstream's manual trigger in `UpdatePodStatus`). By
    /// default nothing happens.
    fn probe_readiness_now(&self, uid: &PodUid, container: &str) {
        let _ = (uid, container);
    }

    /// Resolves once every probe task has stopped, after the agent's cancellation token fired
    /// (by default at once: nothing runs in the background).
    fn stopped(&self) -> crate::hook::BoxFuture<'_, ()> {
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_report_changes_and_forget_by_pod() {
        let results = ProbeResults::new();
        let (a, b) = (PodUid::new("a"), PodUid::new("b"));
        assert!(results.set(ProbeKind::Readiness, &a, "c1", ProbeOutcome::Failure), "a first verdict is a change");
        assert!(!results.set(ProbeKind::Readiness, &a, "c1", ProbeOutcome::Failure));
        assert!(results.set(ProbeKind::Readiness, &a, "c1", ProbeOutcome::Success));
        assert!(results.set(ProbeKind::Liveness, &a, "c1", ProbeOutcome::Failure), "kinds are apart");
        assert!(results.set(ProbeKind::Liveness, &b, "c2", ProbeOutcome::Failure));
        assert_eq!(results.get(ProbeKind::Readiness, "c1"), Some(ProbeOutcome::Success));
        assert!(results.failed(ProbeKind::Liveness, "c1"));
        assert!(!results.failed(ProbeKind::Startup, "c1"));
        results.forget_pod(&a);
        assert_eq!(results.len(), 1);
        assert!(results.failed(ProbeKind::Liveness, "c2"));
        results.remove(ProbeKind::Liveness, "c2");
        assert!(results.is_empty());
    }

    #[test]
    fn initial_outcomes_are_upstreams() {
        assert_eq!(ProbeKind::Readiness.initial_outcome(), ProbeOutcome::Failure);
        assert_eq!(ProbeKind::Liveness.initial_outcome(), ProbeOutcome::Success);
        assert_eq!(ProbeKind::Startup.initial_outcome(), ProbeOutcome::Unknown);
    }
}
