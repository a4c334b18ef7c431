//! Merging every source's pods into the op stream the sync loop consumes (upstream
//! `pkg/kubelet/config/config.go`, incremental mode).
//!
//! Each source's pods are stored by UID.
//! A source sends snapshots (SET) or increments (ADD, UPDATE, DELETE, REMOVE); the merger
//! compares them with what it holds and emits, in this order: REMOVE (UIDs gone from a snapshot),
//! ADD (new UIDs), UPDATE (spec, labels or non-local annotations changed), DELETE (the change sets
//! a deletion timestamp), an empty ADD the first time a source sends a snapshot that changes
//! nothing (so the source counts as seen), then RECONCILE (only the status changed).
//!
//! A source that keeps its pods behind `Arc`s (the API pod source) hands them on shared; the
//! merger keeps what it was given, so that a pod given again as the same `Arc` is known unchanged
//! without copying or comparing it: a snapshot costs one pointer per pod that did not change.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
};

use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};

use kubelet_core::{
    Operation, PodUid, PodUpdate, Source,
    events::{Event, EventRecorder, EventType, ObjectRef},
    types::{annotations, pod_full_name},
};

/// Annotations the kubelet itself sets; they never make pods differ.
const LOCAL_ANNOTATIONS: [&str; 3] = [annotations::CONFIG_SOURCE, annotations::CONFIG_MIRROR, annotations::CONFIG_SEEN];

fn is_local(key: &str) -> bool {
    LOCAL_ANNOTATIONS.contains(&key)
}

fn non_local(map: Option<&BTreeMap<String, String>>) -> impl Iterator<Item = (&String, &String)> {
    map.into_iter().flatten().filter(|(k, _)| !is_local(k))
}

/// Whether two pods differ in what the kubelet acts on: spec, labels, deletion timestamp and
/// grace, and annotations other than the kubelet's own.
pub fn differ_semantically(existing: &Pod, candidate: &Pod) -> bool {
    existing.spec != candidate.spec
        || existing.metadata.labels.as_ref().filter(|l| !l.is_empty())
            != candidate.metadata.labels.as_ref().filter(|l| !l.is_empty())
        || existing.metadata.deletion_timestamp != candidate.metadata.deletion_timestamp
        || existing.metadata.deletion_grace_period_seconds != candidate.metadata.deletion_grace_period_seconds
        || !non_local(existing.metadata.annotations.as_ref()).eq(non_local(candidate.metadata.annotations.as_ref()))
}

/// Holds every source's pods and turns their changes into `PodUpdate`s.
pub struct Merger {
    pods: HashMap<Source, HashMap<PodUid, Held>>,
    seen: BTreeSet<Source>,
    /// Pods ignored as duplicate names, per source, so each is reported once rather than at
    /// every snapshot of an unchanged directory.
    duplicates: HashMap<Source, HashSet<PodUid>>,
    recorder: Arc<dyn EventRecorder>,
}

impl std::fmt::Debug for Merger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merger").field("seen", &self.seen).finish_non_exhaustive()
    }
}

/// One pod the merger holds.
#[derive(Clone)]
struct Held {
    /// The pod as merged, which the updates carry.
    merged: Arc<Pod>,
    /// The pod as its source last gave it, when the source keeps it too (a shared `Arc`).
    given: Option<Arc<Pod>>,
}

impl Held {
    /// Whether `pod` is the one last given, shared, so nothing of it can have changed.
    fn was_given(&self, pod: &Arc<Pod>) -> bool {
        self.given.as_ref().is_some_and(|given| Arc::ptr_eq(given, pod))
    }
}

#[derive(Default)]
struct Changes {
    adds: Vec<Arc<Pod>>,
    updates: Vec<Arc<Pod>>,
    deletes: Vec<Arc<Pod>>,
    removes: Vec<Arc<Pod>>,
    reconciles: Vec<Arc<Pod>>,
}

impl Merger {
    /// An empty merger that reports duplicate pods to `recorder`.
    pub fn new(recorder: Arc<dyn EventRecorder>) -> Self {
        Merger { pods: HashMap::new(), seen: BTreeSet::new(), duplicates: HashMap::new(), recorder }
    }

    /// Whether `source` has sent its first snapshot.
    pub fn is_seen(&self, source: Source) -> bool {
        self.seen.contains(&source)
    }

    /// The pods `source` currently contributes.
    pub fn pods_of(&self, source: Source) -> Vec<Arc<Pod>> {
        self.pods.get(&source).map(|p| p.values().map(|held| held.merged.clone()).collect()).unwrap_or_default()
    }

    /// Applies a change from `source` and returns the updates to send, in upstream's order.
    /// `now` stamps the `config.seen` annotation of new pods. The pods may be given owned or
    /// shared: a shared one given again unchanged costs no copy.
    pub fn merge(
        &mut self,
        source: Source,
        op: Operation,
        pods: impl IntoIterator<Item = impl Into<Arc<Pod>>>,
        now: Timestamp,
    ) -> Vec<PodUpdate> {
        let pods: Vec<Arc<Pod>> = pods.into_iter().map(Into::into).collect();
        let seen_before = self.seen.contains(&source);
        let mut changes = Changes::default();
        let mut stored = self.pods.remove(&source).unwrap_or_default();
        match op {
            Operation::Add | Operation::Update | Operation::Delete => {
                let old = stored.clone();
                let duplicates = self.apply(source, pods, &old, &mut stored, &mut changes, now);
                self.duplicates.entry(source).or_default().extend(duplicates);
            }
            Operation::Remove => {
                for pod in pods {
                    if let Some(existing) = stored.remove(&PodUid::of(&pod)) {
                        changes.removes.push(existing.merged);
                    }
                }
            }
            Operation::Set => {
                self.seen.insert(source);
                let old = std::mem::take(&mut stored);
                let duplicates = self.apply(source, pods, &old, &mut stored, &mut changes, now);
                self.duplicates.insert(source, duplicates);
                let mut removed: Vec<_> = old.into_iter().filter(|(uid, _)| !stored.contains_key(uid)).collect();
                removed.sort_by(|a, b| a.0.cmp(&b.0));
                changes.removes.extend(removed.into_iter().map(|(_, held)| held.merged));
            }
            // Sources send snapshots and increments; RECONCILE (and any operation this merger does
            // not know) is the merger's own output.
            op => {
                tracing::warn!(%source, ?op, "sources send snapshots and increments only; ignored");
            }
        }
        self.pods.insert(source, stored);

        let first_set = !seen_before && self.seen.contains(&source);
        let nothing = changes.adds.is_empty() && changes.updates.is_empty() && changes.deletes.is_empty();
        let mut out: Vec<PodUpdate> = [
            (Operation::Remove, changes.removes),
            (Operation::Add, changes.adds),
            (Operation::Update, changes.updates),
            (Operation::Delete, changes.deletes),
        ]
        .into_iter()
        .filter(|(_, pods)| !pods.is_empty())
        .map(|(op, pods)| PodUpdate::new(op, source, pods))
        .collect();
        if first_set && nothing {
            // Tells the sync loop the source is ready even though it has no pods.
            out.push(PodUpdate::new(Operation::Add, source, Vec::new()));
        }
        if !changes.reconciles.is_empty() {
            out.push(PodUpdate::new(Operation::Reconcile, source, changes.reconciles));
        }
        out
    }

    /// Upstream's `updatePodsFunc`: compares each new pod with `old` and stores it in `stored`.
    /// Returns the pods ignored as duplicate names; each is reported once (upstream reports it
    /// again at every snapshot).
    fn apply(
        &self,
        source: Source,
        pods: Vec<Arc<Pod>>,
        old: &HashMap<PodUid, Held>,
        stored: &mut HashMap<PodUid, Held>,
        changes: &mut Changes,
        now: Timestamp,
    ) -> HashSet<PodUid> {
        let repeated = repeated_names(&pods);
        let mut duplicates = HashSet::new();
        let reported = self.duplicates.get(&source);
        for (index, given) in pods.into_iter().enumerate() {
            let uid = PodUid::of(&given);
            if repeated.contains(&index) {
                if !reported.is_some_and(|r| r.contains(&uid)) {
                    self.report_duplicate(source, &given);
                }
                duplicates.insert(uid);
                continue;
            }
            let existing = old.get(&uid);
            if let Some(held) = existing.filter(|held| held.was_given(&given)) {
                stored.insert(uid, held.clone());
                continue;
            }
            // A pod the source keeps too is copied; one it handed over is taken as it is.
            let (mut pod, given) = match Arc::try_unwrap(given) {
                Ok(pod) => (pod, None),
                Err(shared) => (Pod::clone(&shared), Some(shared)),
            };
            pod.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(annotations::CONFIG_SOURCE.to_owned(), source.as_str().to_owned());
            let merged = match existing {
                Some(held) => {
                    let (merged, change) = check_and_update(&held.merged, pod);
                    let merged = merged.map(Arc::new).unwrap_or_else(|| held.merged.clone());
                    match change {
                        Change::None => {}
                        Change::Update => changes.updates.push(merged.clone()),
                        Change::Delete => changes.deletes.push(merged.clone()),
                        Change::Reconcile => changes.reconciles.push(merged.clone()),
                    }
                    merged
                }
                None => {
                    if let Some(annotations) = pod.metadata.annotations.as_mut() {
                        annotations.insert(annotations::CONFIG_SEEN.to_owned(), now.to_string());
                    }
                    let pod = Arc::new(pod);
                    changes.adds.push(pod.clone());
                    pod
                }
            };
            stored.insert(uid, Held { merged, given });
        }
        duplicates
    }

    /// Upstream's event for a pod ignored because an earlier one of `source` has its full name.
    fn report_duplicate(&self, source: Source, pod: &Pod) {
        let message = format!(
            "Error validating pod {} from {source} due to duplicate pod name {:?}, ignoring",
            pod_full_name(pod),
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        self.recorder.record(Event::new(EventType::Warning, "FailedValidation", message, ObjectRef::pod(pod)));
    }
}

/// The positions in `pods` of those whose full name (namespace and name) an earlier one has:
/// upstream keeps the first.
fn repeated_names(pods: &[Arc<Pod>]) -> HashSet<usize> {
    let mut names = HashSet::new();
    let mut repeated = HashSet::new();
    for (index, pod) in pods.iter().enumerate() {
        let meta = &pod.metadata;
        let full_name = (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default());
        if !names.insert(full_name) {
            repeated.insert(index);
        }
    }
    repeated
}

enum Change {
    None,
    Update,
    Delete,
    Reconcile,
}

/// Upstream `checkAndUpdatePod`: the merged pod (when it changed) and what kind of change it is.
fn check_and_update(existing: &Pod, mut candidate: Pod) -> (Option<Pod>, Change) {
    if !differ_semantically(existing, &candidate) {
        if existing.status != candidate.status {
            let mut merged = existing.clone();
            merged.status = candidate.status;
            return (Some(merged), Change::Reconcile);
        }
        return (None, Change::None);
    }
    let mut merged = existing.clone();
    merged.spec = candidate.spec.take();
    merged.metadata.labels = candidate.metadata.labels.take();
    merged.metadata.deletion_timestamp = candidate.metadata.deletion_timestamp.take();
    merged.metadata.deletion_grace_period_seconds = candidate.metadata.deletion_grace_period_seconds;
    merged.status = candidate.status.take();
    // The candidate's annotations, plus the kubelet's own kept from the existing pod.
    let mut annotations: BTreeMap<String, String> = candidate.metadata.annotations.take().unwrap_or_default();
    for key in LOCAL_ANNOTATIONS {
        if let Some(value) = existing.metadata.annotations.as_ref().and_then(|a| a.get(key)) {
            annotations.insert(key.to_owned(), value.clone());
        }
    }
    merged.metadata.annotations = Some(annotations);
    let change = if merged.metadata.deletion_timestamp.is_some() { Change::Delete } else { Change::Update };
    (Some(merged), change)
}

#[cfg(test)]
mod tests;
