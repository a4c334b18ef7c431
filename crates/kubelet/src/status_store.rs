//! The kubelet's record of pod statuses (upstream `pkg/kubelet/status/status_manager.go`, without
//! the API half): versioned statuses, guarded transitions, and a sink for changes.

use std::{collections::HashMap, sync::Mutex};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus as ApiPodStatus};

use kubelet_core::PodUid;

use crate::lock;

/// Where changed statuses go (in cluster mode, the API server).
pub trait StatusSink: Send + Sync {
    /// The status of `pod` changed to `status` (version `version`).
    fn status_changed(&self, pod: &Pod, status: &ApiPodStatus, version: u64);

    /// Nothing of `pod` runs any more and its volumes are gone: once deletion is asked for, the
    /// API may drop it (upstream `TerminatePod` and `canBeDeleted`). Its last status came before.
    fn pod_terminated(&self, pod: &Pod) {
        let _ = pod;
    }

    /// The kubelet forgot the pod `uid`: it is gone from its configuration and nothing of it
    /// runs, so its status will not change again (upstream `RemoveOrphanedStatuses`).
    fn pod_removed(&self, uid: &PodUid) {
        let _ = uid;
    }
}

/// One stored status.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StoredStatus {
    /// Incremented on every change.
    pub version: u64,
    /// The status.
    pub status: ApiPodStatus,
    /// Nothing of the pod runs and its volumes are gone ([`StatusStore::terminated`]).
    pub terminated: bool,
    /// The store's generation when this status was set: it moves with every change of the
    /// status and, unlike `version`, never comes back once the status is removed and set again,
    /// so what a reader made of a status stays true while its stamp is the same.
    pub stamp: u64,
}

/// Versioned statuses by pod UID.
#[derive(Default)]
pub struct StatusStore {
    statuses: Mutex<HashMap<PodUid, StoredStatus>>,
    /// Moves with every change of a status, its termination or its removal.
    generation: std::sync::atomic::AtomicU64,
    sinks: Mutex<Vec<std::sync::Arc<dyn StatusSink>>>,
}

impl std::fmt::Debug for StatusStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusStore").field("pods", &lock(&self.statuses).len()).finish_non_exhaustive()
    }
}

fn terminated(s: &ContainerStatus) -> Option<i32> {
    s.state.as_ref().and_then(|st| st.terminated.as_ref()).map(|t| t.exit_code)
}

/// Whether the transition from `old` to `new` is legal (upstream `checkContainerStateTransition`):
/// a terminated container may not come back to life unless its restart policy restarts it.
fn legal_transition(old: &ApiPodStatus, new: &ApiPodStatus, restart_policy: &str) -> bool {
    let new_statuses = new.container_statuses.as_deref().unwrap_or_default();
    for o in old.container_statuses.as_deref().unwrap_or_default() {
        let Some(code) = terminated(o) else { continue };
        let Some(n) = new_statuses.iter().find(|n| n.name == o.name) else { continue };
        let restarts = restart_policy == "Always" || (restart_policy == "OnFailure" && code != 0);
        if terminated(n).is_none() && !restarts {
            return false;
        }
    }
    true
}

impl StatusStore {
    /// An empty store.
    pub fn new() -> Self {
        StatusStore::default()
    }

    /// Adds a sink for changes.
    pub fn add_sink(&self, sink: std::sync::Arc<dyn StatusSink>) {
        lock(&self.sinks).push(sink);
    }

    /// Records `status` for `pod`; an identical status is dropped, and an illegal container
    /// transition is refused (the old status stays). Returns whether the status changed.
    pub fn set(&self, pod: &Pod, mut status: ApiPodStatus) -> bool {
        let uid = PodUid::of(pod);
        let policy = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always");
        let mut statuses = lock(&self.statuses);
        let version = match statuses.get(&uid) {
            Some(old) => {
                if !legal_transition(&old.status, &status, policy) {
                    tracing::warn!(pod.uid = %uid, "refusing an illegal container state transition");
                    return false;
                }
                // The start time is set once.
                if old.status.start_time.is_some() {
                    status.start_time.clone_from(&old.status.start_time);
                }
                if old.status == status && pod.metadata.deletion_timestamp.is_none() {
                    return false;
                }
                old.version + 1
            }
            None => 1,
        };
        let terminated = statuses.get(&uid).is_some_and(|old| old.terminated);
        let stamp = self.moved();
        statuses.insert(uid, StoredStatus { version, status: status.clone(), terminated, stamp });
        drop(statuses);
        for sink in lock(&self.sinks).iter() {
            sink.status_changed(pod, &status, version);
        }
        true
    }

    /// Tells the sinks that `pod` has terminated ([`StatusSink::pod_terminated`]).
    pub fn terminated(&self, pod: &Pod) {
        if let Some(stored) = lock(&self.statuses).get_mut(&PodUid::of(pod)) {
            stored.terminated = true;
            self.moved();
        }
        for sink in lock(&self.sinks).iter() {
            sink.pod_terminated(pod);
        }
    }

    /// The stored status of `uid`.
    pub fn get(&self, uid: &PodUid) -> Option<StoredStatus> {
        lock(&self.statuses).get(uid).cloned()
    }

    /// The [`stamp`](StoredStatus::stamp) of `uid`'s stored status, without a copy of it.
    pub fn stamp(&self, uid: &PodUid) -> Option<u64> {
        lock(&self.statuses).get(uid).map(|stored| stored.stamp)
    }

    /// The phase of `uid`'s stored status, without a copy of the rest: admission asks it of
    /// every known pod for each pod it admits.
    pub fn phase(&self, uid: &PodUid) -> Option<String> {
        lock(&self.statuses).get(uid).and_then(|stored| stored.status.phase.clone())
    }

    /// Forgets `uid`, and tells the sinks ([`StatusSink::pod_removed`]).
    pub fn remove(&self, uid: &PodUid) {
        if lock(&self.statuses).remove(uid).is_some() {
            self.moved();
        }
        for sink in lock(&self.sinks).iter() {
            sink.pod_removed(uid);
        }
    }

    /// A number that moves with every change of a status, every termination and every
    /// removal: housekeeping walks the pods again only when something it reads moved.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Moves the generation; its new value.
    fn moved(&self) -> u64 {
        self.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    }

    /// Every UID with a stored status.
    pub fn uids(&self) -> Vec<PodUid> {
        lock(&self.statuses).keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what the store tells its sinks.
    #[derive(Default)]
    struct Recording(Mutex<Vec<String>>);

    impl StatusSink for Recording {
        fn status_changed(&self, pod: &Pod, status: &ApiPodStatus, version: u64) {
            let phase = status.phase.clone().unwrap_or_default();
            lock(&self.0).push(format!("changed {} {phase} v{version}", PodUid::of(pod)));
        }

        fn pod_terminated(&self, pod: &Pod) {
            lock(&self.0).push(format!("terminated {}", PodUid::of(pod)));
        }

        fn pod_removed(&self, uid: &PodUid) {
            lock(&self.0).push(format!("removed {uid}"));
        }
    }

    #[test]
    fn sinks_hear_changes_terminations_and_removals_once_each() {
        let store = StatusStore::new();
        let sink = std::sync::Arc::new(Recording::default());
        store.add_sink(sink.clone());
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u1".into());
        let phase = |p: &str| ApiPodStatus { phase: Some(p.into()), ..ApiPodStatus::default() };
        assert!(store.set(&pod, phase("Running")));
        assert!(!store.set(&pod, phase("Running")), "the same status again is no change");
        assert!(store.set(&pod, phase("Succeeded")));
        store.terminated(&pod);
        store.remove(&PodUid::of(&pod));
        assert_eq!(store.get(&PodUid::of(&pod)), None);
        assert_eq!(*lock(&sink.0), ["changed u1 Running v1", "changed u1 Succeeded v2", "terminated u1", "removed u1"]);
    }

    #[test]
    fn the_generation_moves_with_each_change_and_only_then() {
        let store = StatusStore::new();
        let mut pod = Pod::default();
        pod.metadata.uid = Some("u1".into());
        let phase = |p: &str| ApiPodStatus { phase: Some(p.into()), ..ApiPodStatus::default() };
        let start = store.generation();
        store.set(&pod, phase("Running"));
        let running = store.generation();
        assert_ne!(running, start);
        store.set(&pod, phase("Running"));
        assert_eq!(store.generation(), running, "the same status again moves nothing");
        store.terminated(&pod);
        let terminated = store.generation();
        assert_ne!(terminated, running);
        store.remove(&PodUid::of(&pod));
        let removed = store.generation();
        assert_ne!(removed, terminated);
        store.remove(&PodUid::of(&pod));
        assert_eq!(store.generation(), removed, "removing what is gone moves nothing");
    }
}
