//! The pod status sink's rules (upstream `pkg/kubelet/status/status_manager.go`): which status
//! the kubelet sends for a pod, as a strategic merge patch of `pods/<name>/status`.
//!
//! [`status_patch`] is pure: the API's copy of the pod and the kubelet's status in, the patch
//! (or nothing) out. [`report`] sends them: each change at once, and every resync period the
//! statuses the API does not have yet (after a failure, or a restart of the API server). It
//! patches a regular pod against its copy of the API's pod, with the copy's resource version as
//! a precondition, where upstream reads the pod before each patch. It also ends graceful
//! deletion: a pod that has terminated and whose deletion the API asked for is deleted with
//! grace 0 and its UID as a precondition. A static pod's status goes to its mirror pod.

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;

use k8s_openapi::{
    api::core::v1::{Pod, PodCondition, PodStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
};
use kubelet_core::types::{annotations, config_hash};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, trace, warn};

/// The pod conditions the kubelet owns; the others (readiness gates, a scheduler's) stay as the
/// API has them.
pub const KUBELET_CONDITIONS: [&str; 5] =
    ["PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "DisruptionTarget"];

fn is_kubelets(condition: &PodCondition) -> bool {
    KUBELET_CONDITIONS.contains(&condition.type_.as_str())
}

fn terminal(status: Option<&PodStatus>) -> bool {
    matches!(status.and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// The patch that brings the API's copy of the pod (`api`) to the kubelet's status `ours` for
/// the pod whose UID is `uid` (upstream `syncPod` of the status manager), or `None`:
///
/// - when the API's pod is another one by now (its UID differs: it was deleted and re-created);
/// - when the API already says it, or says a terminal phase the kubelet's status would revert;
///
/// Conditions the kubelet does not own are left to the API; the patch names the UID, so the API
/// server refuses it for a re-created pod.
pub fn status_patch(api: &Pod, uid: &str, ours: &PodStatus) -> Option<Value> {
    if api.metadata.uid.as_deref() != Some(uid) {
        return None;
    }
    if terminal(api.status.as_ref()) && !terminal(Some(ours)) {
        return None;
    }
    let mut merged = ours.clone();
    let theirs = api.status.as_ref().and_then(|s| s.conditions.as_ref()).into_iter().flatten();
    let kept: Vec<_> = theirs.filter(|c| !is_kubelets(c)).cloned().collect();
    let mut conditions: Vec<_> = merged.conditions.take().unwrap_or_default().into_iter().filter(is_kubelets).collect();
    conditions.extend(kept);
    merged.conditions = (!conditions.is_empty()).then_some(conditions);
    if api.status.as_ref().is_some_and(|theirs| says_the_same(theirs, &merged)) {
        return None;
    }
    // The patch names the kubelet's conditions alone: a strategic merge patch merges conditions
    // by type, so the others stay as the API has them, even when their writer changed one since
    // the copy was read (upstream's two-way patch leaves them out as unchanged).
    let mut sent = merged;
    sent.conditions = Some(ours.conditions.iter().flatten().filter(|c| is_kubelets(c)).cloned().collect());
    let mut status = serde_json::to_value(&sent).ok()?;
    if let Some(theirs) = api.status.as_ref().and_then(|s| serde_json::to_value(s).ok()) {
        delete_what_went(&theirs, &mut status);
    }
    replace_lists(&mut status);
    Some(json!({ "metadata": { "uid": uid }, "status": status }))
}

/// Whether two statuses say the same, whatever the order of their conditions: the API server
/// appends a condition it did not have, so its order is not the kubelet's.
fn says_the_same(theirs: &PodStatus, ours: &PodStatus) -> bool {
    let by_type = |status: &PodStatus| {
        let mut status = status.clone();
        if let Some(conditions) = status.conditions.as_mut() {
            conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        }
        status
    };
    by_type(theirs) == by_type(ours)
}

/// Says `null` for what the API's status (`theirs`) has and the kubelet's (`ours`) has not, as
/// upstream's two-way patch does: a top-level field, or a field of a condition the kubelet sends
/// (conditions merge by `type`, so a `reason` or `message` the condition no longer has would
/// otherwise stay). Lists replaced whole need nothing.
fn delete_what_went(theirs: &Value, ours: &mut Value) {
    let (Some(theirs), Some(ours)) = (theirs.as_object(), ours.as_object_mut()) else { return };
    for key in theirs.keys() {
        ours.entry(key.clone()).or_insert(Value::Null);
    }
    let (Some(Value::Array(old)), Some(Value::Array(new))) = (theirs.get("conditions"), ours.get_mut("conditions"))
    else {
        return;
    };
    for condition in new.iter_mut().filter_map(Value::as_object_mut) {
        let Some(before) = old.iter().find(|c| c.get("type") == condition.get("type")).and_then(Value::as_object)
        else {
            continue;
        };
        for key in before.keys() {
            condition.entry(key.clone()).or_insert(Value::Null);
        }
    }
}

/// The lists of a pod's status that a strategic merge patch merges item by item (by `ip`), which
/// the kubelet's status replaces whole: merged, a new sandbox's IP would sit beside the old one,
/// two IPs of one family, which the API server refuses (422). Upstream's two-way patch deletes
/// the old items; the `$patch: replace` element says the same in one item.
const REPLACED_LISTS: [&str; 2] = ["podIPs", "hostIPs"];

fn replace_lists(status: &mut Value) {
    for list in REPLACED_LISTS {
        if let Some(Value::Array(items)) = status.get_mut(list) {
            items.insert(0, json!({ "$patch": "replace" }));
        }
    }
}

/// A pod's status as the kubelet computed it, for [`report`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Change {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// For a static pod, its hash: the status goes to the mirror pod that records it.
    pub mirror_hash: Option<String>,
    /// Its status.
    pub status: PodStatus,
}

impl Change {
    /// The status of `pod` (its namespace, name and UID) is now `status`.
    pub fn new(pod: &Pod, status: PodStatus) -> Self {
        let meta = &pod.metadata;
        Change {
            namespace: meta.namespace.clone().unwrap_or_else(|| "default".to_owned()),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            mirror_hash: None,
            status,
        }
    }

    /// The status of static pod `pod` is now `status`: it goes to the pod's mirror pod, the one
    /// whose `kubernetes.io/config.mirror` annotation is the pod's hash.
    pub fn of_static(pod: &Pod, status: PodStatus) -> Self {
        Change { mirror_hash: config_hash(pod).map(str::to_owned), ..Change::new(pod, status) }
    }

    /// The patch that brings the API's `copy` of the pod to this status, if any.
    fn patch_against(&self, copy: &ApiCopy) -> Option<Value> {
        status_patch(&copy.pod, &self.uid, &self.status)
    }

    /// The UID the API's copy `api` must have to take this status: the pod's own, or for a
    /// static pod, the UID of the mirror that records its hash.
    fn target_uid<'a>(&'a self, api: &'a Pod) -> Option<&'a str> {
        match &self.mirror_hash {
            None => (api.metadata.uid.as_deref() == Some(self.uid.as_str())).then_some(self.uid.as_str()),
            Some(hash) => {
                let recorded = api.metadata.annotations.as_ref().and_then(|a| a.get(annotations::CONFIG_MIRROR));
                (recorded == Some(hash)).then_some(api.metadata.uid.as_deref()).flatten()
            }
        }
    }
}

/// What the pod status sink hears, in order.
// Reason: reports are transient, one at a time in a channel; boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Report {
    /// The kubelet computed a new status.
    Status(Change),
    /// Nothing of the pod with this UID runs and its volumes are gone: once the API asks for
    /// its deletion, it is deleted (upstream `canBeDeleted`).
    Terminated(String),
    /// The pods the API server has bound to this node now, by UID: what the API pod source
    /// last saw of each.
    Bound(BTreeMap<String, Bound>),
    /// The kubelet forgot the pod with this UID (gone from its configuration, nothing of it
    /// runs): nothing more is sent for it. Static pods, which the API never lists, end so.
    Removed(String),
}

impl Report {
    /// The [`Report::Bound`] of the API pod source's snapshot `pods`, which it shares: a pod
    /// given as an `Arc` is not copied.
    pub fn bound(pods: &[impl Clone + Into<Arc<Pod>>]) -> Report {
        let bound = pods.iter().map(|pod| Bound::of(pod.clone().into()));
        Report::Bound(bound.map(|bound| (bound.copy.uid().to_owned(), bound)).collect())
    }
}

/// What the sink takes of a pod the API pod source sees bound to this node.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Bound {
    /// Whether its deletion was asked for (a `deletionTimestamp`).
    pub deleting: bool,
    /// The API's copy of its status.
    copy: ApiCopy,
}

impl Bound {
    /// What the sink takes of `pod`: the pod itself, shared with the source.
    pub fn of(pod: Arc<Pod>) -> Self {
        Bound { deleting: pod.metadata.deletion_timestamp.is_some(), copy: ApiCopy { pod } }
    }
}

/// The API's copy of a pod's status, as of a resource version: what a status is patched
/// against, instead of a read of the pod before each patch (upstream reads it each time). The
/// patch names the version, so the API server refuses it (409) if the pod changed since, and
/// the sink then reads the pod and patches as upstream does.
#[derive(Clone, Debug, PartialEq)]
struct ApiCopy {
    /// The pod as the API pod source saw it (shared with the source), or as far as
    /// [`status_patch`] reads it: its UID, resource version and status, from an answer.
    pod: Arc<Pod>,
}

impl ApiCopy {
    /// What the sink keeps of the pod in an answer of the API server.
    fn of_answer(answer: Pod) -> Self {
        let metadata = ObjectMeta {
            uid: answer.metadata.uid,
            resource_version: answer.metadata.resource_version,
            ..ObjectMeta::default()
        };
        ApiCopy { pod: Arc::new(Pod { metadata, status: answer.status, ..Pod::default() }) }
    }

    fn uid(&self) -> &str {
        self.pod.metadata.uid.as_deref().unwrap_or_default()
    }

    fn resource_version(&self) -> &str {
        self.pod.metadata.resource_version.as_deref().unwrap_or_default()
    }

    fn status(&self) -> Option<&PodStatus> {
        self.pod.status.as_ref()
    }

    /// Whether `self` is a later version of the pod than `other`. The API server's resource
    /// versions are opaque strings, ordered in practice as the numbers they hold (etcd's
    /// revisions); one that is no number counts as later: at worst a patch is refused as stale
    /// and sent again after a read.
    fn is_later_than(&self, other: &ApiCopy) -> bool {
        match (self.resource_version().parse::<u64>(), other.resource_version().parse::<u64>()) {
            (Ok(ours), Ok(theirs)) => ours > theirs,
            _ => self.resource_version() != other.resource_version(),
        }
    }
}

/// What the sink keeps of one pod.
#[derive(Debug)]
struct Entry {
    /// Its latest status, once one came.
    change: Option<Change>,
    /// Whether the API has that status.
    sent: bool,
    /// Bumped each time the status is no longer sent ([`Entry::unsent`]): a send that began
    /// before marks nothing sent when it ends.
    generation: u64,
    /// The UID of the API's pod that has it: the pod's own, or a static pod's mirror.
    sent_to: Option<String>,
    /// Whether nothing of it runs any more.
    terminated: bool,
    /// Whether the API asked for its deletion.
    deleting: bool,
    /// The latest copy of the API's pod the sink knows (from the API pod source, or the answer
    /// to its own patch); never for a static pod, whose status goes to its mirror.
    copy: Option<ApiCopy>,
    /// The status last sent and the API's status in the answer.
    settled: Option<Settled>,
}

/// A status the API took, as the sink sent it (`ours`) and as the API answered it (`theirs`).
/// An API server may store a status other than the one patched: an older one drops fields it
/// does not know (`hostIPs` before v1.28), and every one fills in some (`lastState: {}`). While
/// both are still these, the API has the kubelet's status, however the two differ: without this,
/// every change of the pod (its deletion asked for, say) patched the same status again.
#[derive(Clone, Debug, PartialEq)]
struct Settled {
    ours: PodStatus,
    /// The API's copy the answer gave, shared with the entry's while that is the latest.
    theirs: ApiCopy,
}

impl Entry {
    fn new() -> Self {
        Entry {
            change: None,
            sent: false,
            generation: 0,
            sent_to: None,
            terminated: false,
            deleting: false,
            copy: None,
            settled: None,
        }
    }

    fn due(&self) -> bool {
        self.change.is_some() && (!self.sent || (self.terminated && self.deleting))
    }

    /// The API no longer has the latest status, or never had it.
    fn unsent(&mut self) {
        self.sent = false;
        self.generation += 1;
    }

    /// Whether the API's `copy` still holds `change` as the API took it last.
    fn settled_on(&self, change: &Change, copy: &ApiCopy) -> bool {
        self.settled.as_ref().is_some_and(|s| s.ours == change.status && s.theirs.status() == copy.status())
    }
}

/// How many pods' statuses [`report`] sends at once by default, each its own patch (the client's
/// rate limit, `kubeAPIQPS`, still holds).
pub const SENDS_IN_FLIGHT: usize = 8;

/// Sends pod statuses to the API server until `cancel` or until `reports` closes: each change
/// at once, and every `resync` (upstream's 10 s) each pod whose latest status is not yet sent.
/// Up to `sends_in_flight` pods' statuses are sent at a time, the next due pod starting as soon
/// as one is done, one send at a time for each pod. Reports that come while a pod's status is
/// being sent merge: its latest status goes next, once, however many it had meanwhile (upstream
/// sends every status it hears, one at a time). A regular pod's status is patched against the
/// sink's copy of the API's pod, from the API pod source ([`Report::Bound`]) or the answer to its
/// last patch, and sent again when the API pod source shows another writer changed what the
/// kubelet says.
/// A pod that has terminated and whose deletion the API asked for is deleted (grace 0, with its
/// UID as a precondition) once its last status is sent. A pod the API no longer has is forgotten.
/// A static pod's status goes to its mirror, at each resync until the mirror is there, and is
/// forgotten when the kubelet removes the pod ([`Report::Removed`]).
/// A status heard before its pod's removal and not yet being sent goes with it: the API pod is
/// gone by then, or the mirror is being deleted.
pub async fn report(
    client: Client,
    mut reports: mpsc::UnboundedReceiver<Report>,
    resync: Duration,
    sends_in_flight: usize,
    cancel: CancellationToken,
) {
    let mut sink = Sink::default();
    let mut sends = futures::stream::FuturesUnordered::new();
    let mut tick = tokio::time::interval(resync);
    loop {
        while sends.len() < sends_in_flight.max(1) {
            let Some(sending) = sink.next_send() else { break };
            sends.push(sending.send(client.clone()));
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            report = reports.recv() => match report {
                None => return,
                Some(report) => {
                    sink.hear(report);
                    // What came meanwhile merges before anything more is sent.
                    while let Ok(report) = reports.try_recv() {
                        sink.hear(report);
                    }
                }
            },
            _ = tick.tick() => sink.queue_every_due(),
            Some(done) = sends.next(), if !sends.is_empty() => sink.record(done),
        }
    }
}

/// What [`report`] keeps: each pod's entry, the pods whose status may be due in the order they
/// became so, and the pods whose status is being sent.
#[derive(Default)]
struct Sink {
    pods: HashMap<String, Entry>,
    waiting: VecDeque<String>,
    /// The pods in `waiting`.
    queued: HashSet<String>,
    in_flight: HashSet<String>,
}

impl Sink {
    /// Takes `report` in, and queues the pods whose status may be due now.
    fn hear(&mut self, report: Report) {
        for uid in hear(&mut self.pods, report) {
            self.queue(uid);
        }
    }

    /// Queues every pod whose status is due (the resync).
    fn queue_every_due(&mut self) {
        let due: Vec<String> = self.pods.iter().filter(|(_, e)| e.due()).map(|(uid, _)| uid.clone()).collect();
        for uid in due {
            self.queue(uid);
        }
    }

    /// Queues `uid` once; a pod being sent is looked at again when its send ends.
    fn queue(&mut self, uid: String) {
        if !self.in_flight.contains(&uid) && self.queued.insert(uid.clone()) {
            self.waiting.push_back(uid);
        }
    }

    /// The next queued pod whose status is due, now in flight.
    fn next_send(&mut self) -> Option<Sending> {
        while let Some(uid) = self.waiting.pop_front() {
            self.queued.remove(&uid);
            let Some(entry) = self.pods.get(&uid).filter(|e| e.due()) else { continue };
            let Some(change) = entry.change.clone() else { continue };
            let settled = entry.copy.as_ref().is_some_and(|copy| entry.settled_on(&change, copy));
            let delete = entry.terminated && entry.deleting;
            let due = Due { copy: entry.copy.clone(), settled, delete };
            let generation = entry.generation;
            self.in_flight.insert(uid.clone());
            return Some(Sending { uid, change, generation, due });
        }
        None
    }

    /// Records what became of a send, and queues its pod again if a later status came meanwhile
    /// (or its deletion is now due). A status that could not go waits for the next resync.
    fn record(&mut self, done: Done) {
        let Done { uid, change, generation, result } = done;
        self.in_flight.remove(&uid);
        let retry_at_resync = matches!(result, Ok(Sent::NoMirror) | Err(_));
        match result {
            Ok(Sent::Kept(to, copy)) => {
                let Some(entry) = self.pods.get_mut(&uid) else { return };
                entry.sent_to = Some(to);
                if entry.generation == generation {
                    entry.sent = true;
                }
                if let Some(copy) = copy {
                    entry.settled = Some(Settled { ours: change.status, theirs: copy.clone() });
                    if entry.copy.as_ref().is_none_or(|c| copy.is_later_than(c)) {
                        entry.copy = Some(copy);
                    }
                }
            }
            Ok(Sent::NoMirror) => {}
            Ok(Sent::Gone) => _ = self.pods.remove(&uid),
            Err(err) => warn!(pod = %change.name, error = %err, "cannot update the pod's status; trying again"),
        }
        let Some(entry) = self.pods.get(&uid) else { return };
        if entry.due() && (!retry_at_resync || entry.generation != generation) {
            self.queue(uid);
        }
    }
}

/// Takes `report` into `pods`; the pods whose status may be due now.
fn hear(pods: &mut HashMap<String, Entry>, report: Report) -> Vec<String> {
    match report {
        Report::Status(change) => {
            let uid = change.uid.clone();
            let entry = pods.entry(uid.clone()).or_insert_with(Entry::new);
            entry.change = Some(change);
            entry.unsent();
            vec![uid]
        }
        Report::Terminated(uid) => {
            pods.entry(uid.clone()).or_insert_with(Entry::new).terminated = true;
            vec![uid]
        }
        Report::Removed(uid) => {
            pods.remove(&uid);
            Vec::new()
        }
        Report::Bound(bound) => {
            // Pods gone from the API are forgotten; static pods' entries stay until the kubelet
            // removes them.
            let is_static = |e: &Entry| e.change.as_ref().is_some_and(|c| c.mirror_hash.is_some());
            pods.retain(|uid, e| bound.contains_key(uid) || is_static(e));
            let mut due = Vec::new();
            for (uid, entry) in pods.iter_mut().filter(|(_, e)| is_static(e)) {
                // A static pod's mirror that came, or was replaced, gets the status.
                if entry.sent_to.as_ref().is_none_or(|to| !bound.contains_key(to)) {
                    entry.unsent();
                    due.push(uid.clone());
                }
            }
            for (uid, seen) in bound {
                let entry = pods.entry(uid.clone()).or_insert_with(Entry::new);
                if is_static(entry) {
                    continue;
                }
                entry.deleting = seen.deleting;
                if entry.copy.as_ref().is_none_or(|copy| seen.copy.is_later_than(copy)) {
                    // The API's status changed under the kubelet's (another writer, a restored
                    // API server): the kubelet's is sent again.
                    let differs =
                        |c: &Change| c.patch_against(&seen.copy).is_some() && !entry.settled_on(c, &seen.copy);
                    if entry.sent && entry.change.as_ref().is_some_and(differs) {
                        entry.unsent();
                    }
                    entry.copy = Some(seen.copy);
                }
                due.push(uid);
            }
            due
        }
    }
}

/// A pod's status on its way to the API.
struct Sending {
    uid: String,
    change: Change,
    /// The pod entry's [`Entry::generation`] when the send began.
    generation: u64,
    due: Due,
}

impl Sending {
    /// Sends it.
    async fn send(self, client: Client) -> Done {
        let Sending { uid, change, generation, due } = self;
        let result = send(&client, &change, due).await;
        Done { uid, change, generation, result }
    }
}

/// A pod's status sent, or not.
struct Done {
    uid: String,
    change: Change,
    /// The pod entry's [`Entry::generation`] when the send began.
    generation: u64,
    result: Result<Sent, kube::Error>,
}

/// What became of a pod's status.
enum Sent {
    /// The API's pod with this UID has it; the copy its answer gave, where it was a regular
    /// pod's and the sink patched or read it.
    Kept(String, Option<ApiCopy>),
    /// A static pod's mirror is not there (yet, or again): the status goes at the next resync.
    NoMirror,
    /// The pod is gone from the API (or was re-created, or deleted now).
    Gone,
}

/// What the sink knows of a pod whose status is due.
struct Due {
    /// The API's copy of a regular pod, if the sink has one.
    copy: Option<ApiCopy>,
    /// Whether that copy holds the status as the API took it last ([`Settled`]).
    settled: bool,
    /// Whether the pod is to be deleted once its status is sent.
    delete: bool,
}

/// Sends one change, patched against `due.copy` (the API's copy of a regular pod the sink has)
/// or else against the pod read first, then deletes the pod when `due.delete`. A copy that holds
/// the status as the API took it last needs no patch.
async fn send(client: &Client, change: &Change, due: Due) -> Result<Sent, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &change.namespace);
    let copy = due.copy.filter(|c| change.mirror_hash.is_none() && c.uid() == change.uid);
    let sent = match copy {
        Some(_) if due.settled => Sent::Kept(change.uid.clone(), None),
        Some(copy) => match patch_on_copy(&pods, change, copy).await? {
            Some(sent) => sent,
            None => read_and_patch(&pods, change).await?,
        },
        None => read_and_patch(&pods, change).await?,
    };
    match sent {
        Sent::Kept(uid, _) if due.delete => delete_terminated(&pods, change, uid).await,
        sent => Ok(sent),
    }
}

/// Patches `change` against the API's `copy` of the pod, naming the copy's resource version:
/// `None` when the pod changed since (the API server refused the patch as stale).
async fn patch_on_copy(pods: &Api<Pod>, change: &Change, copy: ApiCopy) -> Result<Option<Sent>, kube::Error> {
    let Some(mut patch) = change.patch_against(&copy) else {
        return Ok(Some(Sent::Kept(change.uid.clone(), Some(copy))));
    };
    patch["metadata"]["resourceVersion"] = json!(copy.resource_version());
    debug!(pod = %change.name, "patching the pod's status");
    trace!(pod = %change.name, %patch, "the status patch");
    match pods.patch_status(&change.name, &PatchParams::default(), &Patch::Strategic(patch)).await {
        Ok(api) => Ok(Some(Sent::Kept(change.uid.clone(), Some(ApiCopy::of_answer(api))))),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(Some(Sent::Gone)),
        // Stale (or the pod was re-created): read it, as upstream does each time.
        Err(kube::Error::Api(status)) if status.is_conflict() => Ok(None),
        Err(err) => Err(err),
    }
}

/// Reads the pod, then patches `change` against what the API has (upstream's way).
async fn read_and_patch(pods: &Api<Pod>, change: &Change) -> Result<Sent, kube::Error> {
    // A static pod's mirror may come (back) later; a regular pod was deleted or re-created.
    let missing = || if change.mirror_hash.is_some() { Sent::NoMirror } else { Sent::Gone };
    let Some(api) = pods.get_opt(&change.name).await? else { return Ok(missing()) };
    let Some(uid) = change.target_uid(&api).map(str::to_owned) else { return Ok(missing()) };
    let regular = change.mirror_hash.is_none();
    let Some(patch) = status_patch(&api, &uid, &change.status) else {
        return Ok(Sent::Kept(uid, regular.then(|| ApiCopy::of_answer(api))));
    };
    debug!(pod = %change.name, "patching the pod's status");
    trace!(pod = %change.name, %patch, "the status patch");
    match pods.patch_status(&change.name, &PatchParams::default(), &Patch::Strategic(patch)).await {
        Ok(api) => Ok(Sent::Kept(uid, regular.then(|| ApiCopy::of_answer(api)))),
        // The UID precondition failed: the pod was re-created meanwhile.
        Err(kube::Error::Api(status)) if status.is_conflict() || status.is_not_found() => Ok(missing()),
        Err(err) => Err(err),
    }
}

/// Deletes the terminated pod whose UID is `uid` (grace 0, the UID as a precondition), once
/// the API asked for its deletion.
async fn delete_terminated(pods: &Api<Pod>, change: &Change, uid: String) -> Result<Sent, kube::Error> {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
        ..DeleteParams::default()
    };
    match pods.delete(&change.name, &params).await {
        Ok(_) => {
            info!(pod = %change.name, namespace = %change.namespace, "pod deleted from the API server: it has terminated");
            Ok(Sent::Gone)
        }
        Err(kube::Error::Api(status)) if status.is_conflict() || status.is_not_found() => Ok(Sent::Gone),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(kind: &str, status: &str) -> PodCondition {
        PodCondition { type_: kind.into(), status: status.into(), ..PodCondition::default() }
    }

    fn api_pod(uid: &str, status: PodStatus) -> Pod {
        Pod {
            metadata: ObjectMeta { name: Some("web".into()), uid: Some(uid.into()), ..ObjectMeta::default() },
            status: Some(status),
            ..Pod::default()
        }
    }

    fn running(ready: &str) -> PodStatus {
        PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![condition("Ready", ready)]),
            ..PodStatus::default()
        }
    }

    #[test]
    fn a_changed_status_is_patched_with_the_uid_and_others_conditions_kept() {
        let mut theirs = running("False");
        theirs.conditions.as_mut().unwrap().push(condition("example.com/gate", "True"));
        let patch = status_patch(&api_pod("u1", theirs), "u1", &running("True")).expect("a patch");
        assert_eq!(patch["metadata"]["uid"], "u1");
        assert_eq!(patch["status"]["phase"], "Running");
        assert_eq!(patch["status"]["conditions"], json!([{"type": "Ready", "status": "True"}]), "the kubelet's alone");
        // Applied as the API server applies it, after the gate's writer turned it False: the
        // gate keeps what its writer said last.
        let mut changed_since = running("False");
        changed_since.conditions.as_mut().unwrap().push(condition("example.com/gate", "False"));
        let mut api = serde_json::to_value(changed_since).unwrap();
        crate::testing::strategic_merge(&mut api, &patch["status"]);
        assert_eq!(
            api["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "example.com/gate", "status": "False"}])
        );
    }

    #[test]
    fn a_status_the_api_has_in_another_order_is_not_sent_again() {
        let mut ours = running("True");
        ours.conditions.as_mut().unwrap().push(condition("ContainersReady", "True"));
        let mut theirs = ours.clone();
        theirs.conditions.as_mut().unwrap().reverse();
        theirs.conditions.as_mut().unwrap().push(condition("example.com/gate", "True"));
        assert_eq!(status_patch(&api_pod("u1", theirs), "u1", &ours), None);
    }

    #[test]
    fn a_new_sandbox_ip_replaces_the_old_one_instead_of_joining_it() {
        let with_ip = |ip: &str| PodStatus {
            pod_ip: Some(ip.into()),
            pod_ips: Some(vec![k8s_openapi::api::core::v1::PodIP { ip: ip.into() }]),
            ..running("True")
        };
        let patch = status_patch(&api_pod("u1", with_ip("10.85.0.62")), "u1", &with_ip("10.85.0.64")).unwrap();
        assert_eq!(patch["status"]["podIPs"], json!([{"$patch": "replace"}, {"ip": "10.85.0.64"}]));
        // Applied as the API server applies a strategic merge patch: the new IP alone.
        let mut api = serde_json::to_value(with_ip("10.85.0.62")).unwrap();
        crate::testing::strategic_merge(&mut api, &patch["status"]);
        assert_eq!(api["podIPs"], json!([{"ip": "10.85.0.64"}]));
        assert_eq!(api["podIP"], "10.85.0.64");
    }

    #[test]
    fn what_the_kubelets_status_no_longer_says_is_deleted_from_the_apis() {
        let mut theirs = running("False");
        let ready = &mut theirs.conditions.as_mut().unwrap()[0];
        ready.reason = Some("ContainersNotReady".into());
        ready.message = Some("containers with unready status: [app]".into());
        theirs.nominated_node_name = Some("elsewhere".into());
        let patch = status_patch(&api_pod("u1", theirs.clone()), "u1", &running("True")).unwrap();
        // Applied as the API server applies it: the Ready condition has no reason left.
        let mut api = serde_json::to_value(theirs).unwrap();
        crate::testing::strategic_merge(&mut api, &patch["status"]);
        assert_eq!(api["conditions"], json!([{"type": "Ready", "status": "True"}]));
        assert!(api.get("nominatedNodeName").is_none(), "{api}");
    }

    #[test]
    fn a_status_heard_with_its_pods_removal_goes_with_it() {
        // The kubelet removes a pod it forgot: an API pod the API already deleted (its last
        // status went before the deletion), or a static pod whose mirror housekeeping deletes.
        // A status heard before it and not yet being sent has nothing left to go to.
        let mut sink = Sink::default();
        let change = Change::new(&api_pod("u1", PodStatus::default()), running("True"));
        sink.hear(Report::Status(change.clone()));
        sink.hear(Report::Removed("u1".into()));
        assert!(sink.pods.is_empty(), "nothing is kept");
        assert!(sink.next_send().is_none(), "so nothing is sent for it");
        // A status after the removal is a pod that came back with its UID: heard afresh.
        sink.hear(Report::Status(change));
        assert!(sink.next_send().is_some_and(|sending| sending.uid == "u1"));
    }

    #[test]
    fn a_status_heard_while_the_last_is_sent_goes_next_and_once() {
        let mut sink = Sink::default();
        let pod = api_pod("u1", PodStatus::default());
        sink.hear(Report::Status(Change::new(&pod, running("True"))));
        let first = sink.next_send().expect("the first status is due");
        // Two more while it is in flight: neither goes beside it, and only the last counts.
        sink.hear(Report::Status(Change::new(&pod, running("False"))));
        sink.hear(Report::Status(Change::new(&pod, running("True"))));
        sink.hear(Report::Status(Change::new(&pod, running("False"))));
        assert!(sink.next_send().is_none(), "one send at a time for a pod");

        let kept = Ok(Sent::Kept("u1".into(), None));
        sink.record(Done { uid: first.uid, change: first.change, generation: first.generation, result: kept });
        assert!(!sink.pods["u1"].sent, "the send that began before marks the later status nothing");
        let next = sink.next_send().expect("the latest status goes next");
        assert_eq!(next.change.status, running("False"));
        assert!(sink.next_send().is_none(), "once");

        let kept = Ok(Sent::Kept("u1".into(), None));
        sink.record(Done { uid: next.uid, change: next.change, generation: next.generation, result: kept });
        assert!(sink.pods["u1"].sent);
        assert!(sink.next_send().is_none(), "nothing more is due");
    }

    #[test]
    fn a_failed_send_waits_for_the_resync_unless_a_later_status_came_meanwhile() {
        let mut sink = Sink::default();
        let pod = api_pod("u1", PodStatus::default());
        // Any error of the client.
        let failed = || Err(kube::Error::LinesCodecMaxLineLengthExceeded);
        sink.hear(Report::Status(Change::new(&pod, running("True"))));
        let first = sink.next_send().expect("due");
        sink.record(Done { uid: first.uid, change: first.change, generation: first.generation, result: failed() });
        assert!(sink.next_send().is_none(), "the same status is tried again at the resync, not at once");
        sink.queue_every_due();
        let again = sink.next_send().expect("the resync sends it");

        sink.hear(Report::Status(Change::new(&pod, running("False"))));
        sink.record(Done { uid: again.uid, change: again.change, generation: again.generation, result: failed() });
        let later = sink.next_send().expect("the status heard during the failed send goes at once");
        assert_eq!(later.change.status, running("False"));
    }

    #[test]
    fn nothing_is_sent_for_the_same_status_a_recreated_pod_or_a_terminal_phase_reverted() {
        assert_eq!(status_patch(&api_pod("u1", running("True")), "u1", &running("True")), None);
        assert_eq!(status_patch(&api_pod("u2", running("False")), "u1", &running("True")), None, "another pod");
        let done = PodStatus { phase: Some("Succeeded".into()), ..PodStatus::default() };
        assert_eq!(status_patch(&api_pod("u1", done.clone()), "u1", &running("True")), None, "terminal stays");
        let failed = PodStatus { phase: Some("Failed".into()), ..PodStatus::default() };
        assert!(status_patch(&api_pod("u1", done), "u1", &failed).is_some(), "terminal to terminal is sent");
    }
}
