//! The pod status sink's rules (upstream `pkg/kubelet/status/status_manager.go`): which status
//! the kubelet sends for a pod, as a strategic merge patch of `pods/<name>/status`.
//!
//! [`status_patch`] is pure: the API's copy of the pod and the kubelet's status in, the patch
//! (or nothing) out. [`report`] sends them: each change at once, and every resync period the
//! statuses the API does not have yet (after a failure, or a restart of the API server).

use std::{collections::HashMap, time::Duration};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// The pod conditions the kubelet owns; the others (readiness gates, a scheduler's) stay as the
/// API has them.
pub const KUBELET_CONDITIONS: [&str; 5] =
    ["PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "DisruptionTarget"];

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
    let kept: Vec<_> = theirs.filter(|c| !KUBELET_CONDITIONS.contains(&c.type_.as_str())).cloned().collect();
    let mut conditions: Vec<_> = merged
        .conditions
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| KUBELET_CONDITIONS.contains(&c.type_.as_str()))
        .collect();
    conditions.extend(kept);
    merged.conditions = (!conditions.is_empty()).then_some(conditions);
    if api.status.as_ref() == Some(&merged) {
        return None;
    }
    Some(json!({ "metadata": { "uid": uid }, "status": merged }))
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
            status,
        }
    }
}

/// Sends pod statuses to the API server until `cancel` or until `changes` closes: each change
/// at once, and every `resync` (upstream's 10 s) each pod whose latest status is not yet sent.
/// A pod the API no longer has is forgotten.
pub async fn report(client: Client, mut changes: mpsc::Receiver<Change>, resync: Duration, cancel: CancellationToken) {
    // The latest status of each pod by UID, and whether the API has it.
    let mut latest: HashMap<String, (Change, bool)> = HashMap::new();
    let mut tick = tokio::time::interval(resync);
    loop {
        let due: Vec<String> = tokio::select! {
            () = cancel.cancelled() => return,
            change = changes.recv() => {
                let Some(change) = change else { return };
                let uid = change.uid.clone();
                latest.insert(uid.clone(), (change, false));
                vec![uid]
            }
            _ = tick.tick() => latest.iter().filter(|(_, (_, sent))| !sent).map(|(uid, _)| uid.clone()).collect(),
        };
        for uid in due {
            let Some((change, _)) = latest.get(&uid) else { continue };
            match send(&client, change).await {
                Ok(true) => _ = latest.get_mut(&uid).map(|entry| entry.1 = true),
                Ok(false) => _ = latest.remove(&uid),
                Err(err) => warn!(pod = %change.name, error = %err, "cannot update the pod's status; trying again"),
            }
        }
    }
}

/// Sends one change; `Ok(false)` when the API no longer has that pod (gone or re-created).
async fn send(client: &Client, change: &Change) -> Result<bool, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &change.namespace);
    let Some(api) = pods.get_opt(&change.name).await? else { return Ok(false) };
    if api.metadata.uid.as_deref() != Some(change.uid.as_str()) {
        return Ok(false);
    }
    let Some(patch) = status_patch(&api, &change.uid, &change.status) else { return Ok(true) };
    debug!(pod = %change.name, "patching the pod's status");
    match pods.patch_status(&change.name, &PatchParams::default(), &Patch::Strategic(patch)).await {
        Ok(_) => Ok(true),
        // The UID precondition failed: the pod was re-created meanwhile.
        Err(kube::Error::Api(status)) if status.is_conflict() || status.is_not_found() => Ok(false),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{api::core::v1::PodCondition, apimachinery::pkg::apis::meta::v1::ObjectMeta};

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
        let conditions = patch["status"]["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 2);
        assert!(conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
        assert!(conditions.iter().any(|c| c["type"] == "example.com/gate"), "a gate's condition stays");
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
