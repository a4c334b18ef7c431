//! The pod manager: the kubelet's desired set of pods, by UID and by full name, with mirror pods
//! kept apart (upstream `pkg/kubelet/pod/pod_manager.go`).
//!
//! Config handlers write it first, before dispatching work, so every later reader (the sync loop,
//! housekeeping, the local API) sees the same desired state.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard},
};

use k8s_openapi::api::core::v1::Pod;

use crate::types::{PodUid, config_hash, is_mirror_pod, pod_full_name};

#[derive(Default)]
struct Inner {
    by_uid: HashMap<PodUid, Arc<Pod>>,
    by_full_name: HashMap<String, Arc<Pod>>,
    mirror_by_uid: HashMap<PodUid, Arc<Pod>>,
    mirror_by_full_name: HashMap<String, Arc<Pod>>,
    /// Moves with every change.
    generation: u64,
}

/// Thread-safe store of the pods the kubelet should run.
#[derive(Default)]
pub struct PodManager {
    inner: RwLock<Inner>,
}

impl std::fmt::Debug for PodManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.read();
        f.debug_struct("PodManager")
            .field("pods", &inner.by_uid.len())
            .field("mirror_pods", &inner.mirror_by_uid.len())
            .finish()
    }
}

impl PodManager {
    /// An empty pod manager.
    pub fn new() -> Self {
        PodManager::default()
    }

    /// Adds or replaces a pod (or mirror pod).
    pub fn add_pod(&self, pod: Arc<Pod>) {
        let uid = PodUid::of(&pod);
        let full_name = pod_full_name(&pod);
        let mut inner = self.write();
        inner.generation += 1;
        if is_mirror_pod(&pod) {
            inner.mirror_by_uid.insert(uid, pod.clone());
            inner.mirror_by_full_name.insert(full_name, pod);
        } else {
            inner.by_uid.insert(uid, pod.clone());
            inner.by_full_name.insert(full_name, pod);
        }
    }

    /// Same as [`PodManager::add_pod`]: an update replaces the stored pod.
    pub fn update_pod(&self, pod: Arc<Pod>) {
        self.add_pod(pod);
    }

    /// Removes a pod (or mirror pod).
    pub fn remove_pod(&self, pod: &Pod) {
        let uid = PodUid::of(pod);
        let full_name = pod_full_name(pod);
        let mut inner = self.write();
        inner.generation += 1;
        let (by_uid, by_name) = if is_mirror_pod(pod) {
            let Inner { mirror_by_uid, mirror_by_full_name, .. } = &mut *inner;
            (mirror_by_uid, mirror_by_full_name)
        } else {
            let Inner { by_uid, by_full_name, .. } = &mut *inner;
            (by_uid, by_full_name)
        };
        by_uid.remove(&uid);
        // Only drop the name entry if it still points at this UID: a newer pod may own the name.
        if by_name.get(&full_name).is_some_and(|p| PodUid::of(p) == uid) {
            by_name.remove(&full_name);
        }
    }

    /// Replaces the whole content with `pods`.
    pub fn set_pods(&self, pods: Vec<Arc<Pod>>) {
        let mut inner = self.write();
        *inner = Inner { generation: inner.generation + 1, ..Inner::default() };
        drop(inner);
        for pod in pods {
            self.add_pod(pod);
        }
    }

    /// A number that moves with every addition, update and removal of a pod or mirror pod:
    /// housekeeping walks the pods again only when something it reads moved.
    pub fn generation(&self) -> u64 {
        self.read().generation
    }

    /// Every regular (non-mirror) pod.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.read().by_uid.values().cloned().collect()
    }

    /// Every mirror pod.
    pub fn mirror_pods(&self) -> Vec<Arc<Pod>> {
        self.read().mirror_by_uid.values().cloned().collect()
    }

    /// The regular pod with this UID.
    pub fn pod_by_uid(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.read().by_uid.get(uid).cloned()
    }

    /// The regular pod with this full name (`<name>_<namespace>`).
    pub fn pod_by_full_name(&self, full_name: &str) -> Option<Arc<Pod>> {
        self.read().by_full_name.get(full_name).cloned()
    }

    /// The regular pod with this namespace and name.
    pub fn pod_by_name(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pod_by_full_name(&crate::types::full_name(name, namespace))
    }

    /// The mirror pod of a static pod, by the static pod's full name.
    pub fn mirror_pod_of(&self, pod: &Pod) -> Option<Arc<Pod>> {
        self.read().mirror_by_full_name.get(&pod_full_name(pod)).cloned()
    }

    /// The static pod a mirror pod mirrors.
    pub fn pod_of_mirror(&self, mirror: &Pod) -> Option<Arc<Pod>> {
        self.read().by_full_name.get(&pod_full_name(mirror)).cloned()
    }

    /// Whether `mirror` mirrors `pod`: same full name and the mirror records the pod's hash.
    pub fn is_mirror_pod_of(mirror: &Pod, pod: &Pod) -> bool {
        pod_full_name(mirror) == pod_full_name(pod)
            && config_hash(mirror).is_some()
            && config_hash(mirror) == config_hash(pod)
    }

    /// The number of regular pods.
    pub fn len(&self) -> usize {
        self.read().by_uid.len()
    }

    /// Whether there are no regular pods.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        // See `util::lock`: every writer replaces whole entries, so a poisoned lock holds valid data.
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::types::annotations;

    fn pod(uid: &str, name: &str, annotations: &[(&str, &str)]) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                name: Some(name.into()),
                namespace: Some("default".into()),
                annotations: Some(
                    annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
                ),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    #[test]
    fn lookups_by_uid_and_name() {
        let pm = PodManager::new();
        pm.add_pod(pod("u1", "web", &[]));
        assert_eq!(pm.len(), 1);
        assert!(pm.pod_by_uid(&PodUid::new("u1")).is_some());
        assert!(pm.pod_by_full_name("web_default").is_some());
        assert!(pm.pod_by_name("default", "web").is_some());
        assert!(pm.pod_by_uid(&PodUid::new("nope")).is_none());
    }

    #[test]
    fn mirror_pods_are_kept_apart() {
        let pm = PodManager::new();
        let static_pod =
            pod("s1", "etcd-node", &[(annotations::CONFIG_SOURCE, "file"), (annotations::CONFIG_HASH, "s1")]);
        let mirror = pod("m1", "etcd-node", &[(annotations::CONFIG_SOURCE, "api"), (annotations::CONFIG_MIRROR, "s1")]);
        pm.add_pod(static_pod.clone());
        pm.add_pod(mirror.clone());
        assert_eq!(pm.len(), 1);
        assert_eq!(pm.mirror_pods().len(), 1);
        assert_eq!(PodUid::of(&pm.mirror_pod_of(&static_pod).unwrap()), PodUid::new("m1"));
        assert_eq!(PodUid::of(&pm.pod_of_mirror(&mirror).unwrap()), PodUid::new("s1"));
        assert!(PodManager::is_mirror_pod_of(&mirror, &static_pod));
        assert!(crate::types::is_static_pod(&static_pod));
        assert!(!crate::types::is_static_pod(&mirror));
    }

    #[test]
    fn remove_keeps_a_newer_pod_with_the_same_name() {
        let pm = PodManager::new();
        let old = pod("u1", "web", &[]);
        pm.add_pod(old.clone());
        pm.add_pod(pod("u2", "web", &[]));
        pm.remove_pod(&old);
        assert_eq!(PodUid::of(&pm.pod_by_full_name("web_default").unwrap()), PodUid::new("u2"));
        assert_eq!(pm.len(), 1);
    }

    #[test]
    fn set_pods_replaces_everything() {
        let pm = PodManager::new();
        pm.add_pod(pod("u1", "a", &[]));
        pm.set_pods(vec![pod("u2", "b", &[])]);
        assert!(pm.pod_by_uid(&PodUid::new("u1")).is_none());
        assert!(pm.pod_by_uid(&PodUid::new("u2")).is_some());
    }

    #[test]
    fn the_generation_moves_with_each_addition_update_and_removal() {
        let pm = PodManager::new();
        let mut seen = vec![pm.generation()];
        let web = pod("u1", "web", &[]);
        pm.add_pod(web.clone());
        seen.push(pm.generation());
        pm.update_pod(web.clone());
        seen.push(pm.generation());
        pm.remove_pod(&web);
        seen.push(pm.generation());
        pm.set_pods(vec![web]);
        seen.push(pm.generation());
        let distinct: std::collections::BTreeSet<u64> = seen.iter().copied().collect();
        assert_eq!(distinct.len(), seen.len(), "every change moved it: {seen:?}");
        assert_eq!(pm.generation(), *seen.last().unwrap(), "reading moves nothing");
    }
}
