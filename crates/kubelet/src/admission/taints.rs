//! The node's `NoExecute` taints a pod must tolerate to be admitted (upstream `generalFilter`'s
//! `FindMatchingUntoleratedTaint`, and `Toleration.ToleratesTaint` of `k8s.io/api/core/v1`).

use k8s_openapi::api::core::v1::{Pod, Taint, Toleration};

/// Whether the node has a `NoExecute` taint none of `pod`'s tolerations tolerates.
pub(super) fn untolerated_no_execute(pod: &Pod, taints: &[Taint]) -> bool {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
    taints
        .iter()
        .filter(|taint| taint.effect == "NoExecute")
        .any(|taint| !tolerations.iter().any(|toleration| tolerates(toleration, taint)))
}

/// Whether `toleration` tolerates `taint`: an empty effect or key matches any, and the operator
/// is `Equal` (the default: the values must be equal) or `Exists` (any value).
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    let key = toleration.key.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => toleration.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
        "Exists" => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint { key: key.into(), value: value.map(Into::into), effect: effect.into(), time_added: None }
    }

    fn toleration(key: &str, operator: &str, value: &str, effect: &str) -> Toleration {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        Toleration {
            key: some(key),
            operator: some(operator),
            value: some(value),
            effect: some(effect),
            ..Default::default()
        }
    }

    #[test]
    fn a_toleration_matches_as_upstreams_tolerates_taint() {
        let dedicated = taint("dedicated", Some("gpu"), "NoExecute");
        assert!(tolerates(&toleration("dedicated", "Equal", "gpu", "NoExecute"), &dedicated));
        assert!(tolerates(&toleration("dedicated", "", "gpu", ""), &dedicated), "Equal by default, any effect");
        assert!(!tolerates(&toleration("dedicated", "Equal", "cpu", "NoExecute"), &dedicated), "another value");
        assert!(tolerates(&toleration("dedicated", "Exists", "", ""), &dedicated));
        assert!(tolerates(&toleration("", "Exists", "", ""), &dedicated), "no key and Exists: every taint");
        assert!(!tolerates(&toleration("", "", "", ""), &dedicated), "no key, Equal to an empty value");
        assert!(!tolerates(&toleration("dedicated", "Exists", "", "NoSchedule"), &dedicated), "another effect");
        assert!(!tolerates(&toleration("other", "Exists", "", ""), &dedicated), "another key");
        assert!(!tolerates(&toleration("dedicated", "Lt", "gpu", ""), &dedicated), "an unknown operator");
        let bare = taint("maintenance", None, "NoExecute");
        assert!(tolerates(&toleration("maintenance", "Equal", "", ""), &bare), "no value equals an empty one");
    }

    #[test]
    fn only_no_execute_taints_must_be_tolerated() {
        let mut pod = Pod::default();
        let taints = [taint("dedicated", Some("gpu"), "NoSchedule"), taint("soon", None, "PreferNoSchedule")];
        assert!(!untolerated_no_execute(&pod, &taints), "the scheduler's taints are not the kubelet's");
        let taints = [taint("dedicated", Some("gpu"), "NoExecute"), taint("maintenance", None, "NoExecute")];
        assert!(untolerated_no_execute(&pod, &taints));
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            tolerations: Some(vec![toleration("dedicated", "Exists", "", "")]),
            ..Default::default()
        });
        assert!(untolerated_no_execute(&pod, &taints), "one tolerated, one not");
        pod.spec.as_mut().unwrap().tolerations.as_mut().unwrap().push(toleration("maintenance", "Exists", "", ""));
        assert!(!untolerated_no_execute(&pod, &taints));
    }
}
