//! The pod status sink's rules (upstream `pkg/kubelet/status/status_manager.go`): which status
//! the kubelet sends for a pod, as a strategic merge patch of `pods/<name>/status`.
//!
//! Pure: the API's copy of the pod and the kubelet's status in, the patch (or nothing) out.

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde_json::{Value, json};

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
