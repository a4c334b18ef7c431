//! Merging every source's pods into the op stream the sync loop consumes (upstream
//! `pkg/kubelet/config/config.go`, incremental mode).
//!
//! Each source's pods are stored by UID.
//! A source sends snapshots (SET) or increments (ADD, UPDATE, DELETE, REMOVE); the merger
//! compares them with what it holds and emits, in this order: REMOVE (UIDs gone from a snapshot),
//! ADD (new UIDs), UPDATE (spec, labels or non-local annotations changed), DELETE (the change sets
//! a deletion timestamp), an empty ADD the first time a source sends a snapshot that changes
//! nothing (so the source counts as seen), then RECONCILE (only the status changed).

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
    pods: HashMap<Source, HashMap<PodUid, Arc<Pod>>>,
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
        self.pods.get(&source).map(|p| p.values().cloned().collect()).unwrap_or_default()
    }

    /// Applies a change from `source` and returns the updates to send, in upstream's order.
    /// `now` stamps the `config.seen` annotation of new pods.
    pub fn merge(&mut self, source: Source, op: Operation, pods: Vec<Pod>, now: Timestamp) -> Vec<PodUpdate> {
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
                        changes.removes.push(existing);
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
                changes.removes.extend(removed.into_iter().map(|(_, pod)| pod));
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
        pods: Vec<Pod>,
        old: &HashMap<PodUid, Arc<Pod>>,
        stored: &mut HashMap<PodUid, Arc<Pod>>,
        changes: &mut Changes,
        now: Timestamp,
    ) -> HashSet<PodUid> {
        let mut names = HashSet::new();
        let mut duplicates = HashSet::new();
        let reported = self.duplicates.get(&source);
        for mut pod in pods {
            let full_name = pod_full_name(&pod);
            if !names.insert(full_name.clone()) {
                let uid = PodUid::of(&pod);
                if !reported.is_some_and(|r| r.contains(&uid)) {
                    let message = format!(
                        "Error validating pod {full_name} from {source} due to duplicate pod name {:?}, ignoring",
                        pod.metadata.name.as_deref().unwrap_or_default()
                    );
                    let event = Event::new(EventType::Warning, "FailedValidation", message, ObjectRef::pod(&pod));
                    self.recorder.record(event);
                }
                duplicates.insert(uid);
                continue;
            }
            pod.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(annotations::CONFIG_SOURCE.to_owned(), source.as_str().to_owned());
            let uid = PodUid::of(&pod);
            match old.get(&uid) {
                Some(existing) => {
                    let (merged, change) = check_and_update(existing, pod);
                    let merged = merged.map(Arc::new).unwrap_or_else(|| existing.clone());
                    match change {
                        Change::None => {}
                        Change::Update => changes.updates.push(merged.clone()),
                        Change::Delete => changes.deletes.push(merged.clone()),
                        Change::Reconcile => changes.reconciles.push(merged.clone()),
                    }
                    stored.insert(uid, merged);
                }
                None => {
                    if let Some(annotations) = pod.metadata.annotations.as_mut() {
                        annotations.insert(annotations::CONFIG_SEEN.to_owned(), now.to_string());
                    }
                    let pod = Arc::new(pod);
                    changes.adds.push(pod.clone());
                    stored.insert(uid, pod);
                }
            }
        }
        duplicates
    }
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
