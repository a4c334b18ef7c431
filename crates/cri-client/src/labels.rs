//! The labels and annotations the kubelet puts on sandboxes and containers, and reads back after
//! a restart (upstream `pkg/kubelet/kuberuntime/labels.go`).
//!
//! The kubelet keeps no checkpoint of its own: it lists sandboxes and containers, groups them by
//! the pod-UID label, and reads each container's hash and restart count from its annotations, so
//! an unchanged pod is neither restarted nor given a new sandbox.

use std::collections::HashMap;

use k8s_openapi::{
    api::core::v1::{Container, Lifecycle, LifecycleHandler, Pod, PodSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

/// Label: the pod's name.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
/// Label: the pod's namespace.
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Label: the pod's UID; everything with this label belongs to that pod.
pub const POD_UID: &str = "io.kubernetes.pod.uid";
/// Label: the container's name in the pod spec.
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Annotation: the container's hash, hex.
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Annotation: how many times the container was restarted before this instance.
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Annotation: the container's termination message path.
pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
/// Annotation: the container's termination message policy.
pub const TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
/// Annotation: the pod's deletion grace period when the container was created.
pub const POD_DELETION_GRACE_PERIOD: &str = "io.kubernetes.pod.deletionGracePeriod";
/// Annotation: the pod's termination grace period, to kill the container without the spec.
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Annotation: the container's ports, JSON.
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
/// Annotation: the container's preStop handler, JSON, to run it without the spec.
pub const PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";

fn meta(pod: &Pod) -> (&str, &str, &str) {
    (
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default(),
    )
}

/// A sandbox's labels: the pod's labels plus its name, namespace and UID.
pub fn sandbox_labels(pod: &Pod) -> HashMap<String, String> {
    let (name, namespace, uid) = meta(pod);
    let mut labels: HashMap<String, String> = pod.metadata.labels.clone().unwrap_or_default().into_iter().collect();
    labels.insert(POD_NAME.to_owned(), name.to_owned());
    labels.insert(POD_NAMESPACE.to_owned(), namespace.to_owned());
    labels.insert(POD_UID.to_owned(), uid.to_owned());
    labels
}

/// A sandbox's annotations: the pod's annotations.
pub fn sandbox_annotations(pod: &Pod) -> HashMap<String, String> {
    pod.metadata.annotations.clone().unwrap_or_default().into_iter().collect()
}

/// A container's labels: pod name, namespace, UID and the container's name.
pub fn container_labels(pod: &Pod, container: &Container) -> HashMap<String, String> {
    let (name, namespace, uid) = meta(pod);
    HashMap::from([
        (POD_NAME.to_owned(), name.to_owned()),
        (POD_NAMESPACE.to_owned(), namespace.to_owned()),
        (POD_UID.to_owned(), uid.to_owned()),
        (CONTAINER_NAME.to_owned(), container.name.clone()),
    ])
}

/// A container's annotations: hash, restart count, termination message settings, the pod's
/// grace periods, the container's ports and its preStop handler.
pub fn container_annotations(
    pod: &Pod,
    container: &Container,
    restart_count: u32,
    hash: u64,
) -> HashMap<String, String> {
    let mut annotations = HashMap::from([
        (CONTAINER_HASH.to_owned(), format!("{hash:x}")),
        (CONTAINER_RESTART_COUNT.to_owned(), restart_count.to_string()),
        (TERMINATION_MESSAGE_PATH.to_owned(), container.termination_message_path.clone().unwrap_or_default()),
        (TERMINATION_MESSAGE_POLICY.to_owned(), container.termination_message_policy.clone().unwrap_or_default()),
    ]);
    if let Some(grace) = pod.metadata.deletion_grace_period_seconds {
        annotations.insert(POD_DELETION_GRACE_PERIOD.to_owned(), grace.to_string());
    }
    if let Some(grace) = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds) {
        annotations.insert(POD_TERMINATION_GRACE_PERIOD.to_owned(), grace.to_string());
    }
    if let Some(ports) = container.ports.as_ref().filter(|p| !p.is_empty())
        && let Ok(json) = serde_json::to_string(ports)
    {
        annotations.insert(CONTAINER_PORTS.to_owned(), json);
    }
    if let Some(pre_stop) = container.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
        && let Ok(json) = serde_json::to_string(pre_stop)
    {
        annotations.insert(PRE_STOP_HANDLER.to_owned(), json);
    }
    annotations
}

/// The hash recorded in a container's annotations (0 when absent or unreadable).
pub fn hash_of(annotations: &HashMap<String, String>) -> u64 {
    annotations.get(CONTAINER_HASH).and_then(|h| u64::from_str_radix(h, 16).ok()).unwrap_or(0)
}

/// The restart count recorded in a container's annotations (0 when absent).
pub fn restart_count_of(annotations: &HashMap<String, String>) -> u32 {
    annotations.get(CONTAINER_RESTART_COUNT).and_then(|c| c.parse().ok()).unwrap_or(0)
}

/// The pod termination grace period recorded in a container's annotations.
pub fn termination_grace_of(annotations: &HashMap<String, String>) -> Option<i64> {
    annotations.get(POD_TERMINATION_GRACE_PERIOD).and_then(|g| g.parse().ok())
}

/// The pod deletion grace period recorded in a container's annotations.
pub fn deletion_grace_of(annotations: &HashMap<String, String>) -> Option<i64> {
    annotations.get(POD_DELETION_GRACE_PERIOD).and_then(|g| g.parse().ok())
}

/// The preStop handler recorded in a container's annotations (`None` when absent or unreadable).
pub fn pre_stop_of(annotations: &HashMap<String, String>) -> Option<LifecycleHandler> {
    annotations.get(PRE_STOP_HANDLER).and_then(|json| serde_json::from_str(json).ok())
}

/// What upstream's `restoreSpecsFromContainerLabels` rebuilds from a container's labels and
/// annotations to kill it without the pod's spec: a pod with its name, namespace, UID and grace
/// periods, and a container with its name, ports and preStop handler.
pub fn restore_specs(labels: &HashMap<String, String>, annotations: &HashMap<String, String>) -> (Pod, Container) {
    let label = |key: &str| labels.get(key).cloned();
    let pod = Pod {
        metadata: ObjectMeta {
            name: label(POD_NAME),
            namespace: label(POD_NAMESPACE),
            uid: label(POD_UID),
            deletion_grace_period_seconds: deletion_grace_of(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            termination_grace_period_seconds: termination_grace_of(annotations),
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let container = Container {
        name: label(CONTAINER_NAME).unwrap_or_default(),
        ports: annotations.get(CONTAINER_PORTS).and_then(|json| serde_json::from_str(json).ok()),
        lifecycle: pre_stop_of(annotations)
            .map(|pre_stop| Lifecycle { pre_stop: Some(pre_stop), ..Lifecycle::default() }),
        ..Container::default()
    };
    (pod, container)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{ContainerPort, SleepAction};

    use super::*;

    #[test]
    fn labels_and_annotations_round_trip() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                labels: Some(BTreeMap::from([("app".into(), "web".into())])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec { termination_grace_period_seconds: Some(30), ..PodSpec::default() }),
            ..Pod::default()
        };
        let pre_stop = LifecycleHandler { sleep: Some(SleepAction { seconds: 5 }), ..LifecycleHandler::default() };
        let container = Container {
            name: "httpd".into(),
            termination_message_path: Some("/dev/termination-log".into()),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 80,
                ..ContainerPort::default()
            }]),
            lifecycle: Some(Lifecycle { pre_stop: Some(pre_stop.clone()), ..Lifecycle::default() }),
            ..Container::default()
        };
        let labels = sandbox_labels(&pod);
        assert_eq!((labels["app"].as_str(), labels[POD_UID].as_str(), labels[POD_NAME].as_str()), ("web", "u1", "web"));
        assert_eq!(container_labels(&pod, &container)[CONTAINER_NAME], "httpd");
        let annotations = container_annotations(&pod, &container, 3, 0xdead_beef);
        assert_eq!(hash_of(&annotations), 0xdead_beef);
        assert_eq!(restart_count_of(&annotations), 3);
        assert_eq!(termination_grace_of(&annotations), Some(30));
        assert_eq!(hash_of(&HashMap::new()), 0);
        // Without the spec, enough comes back to kill the container as the spec says.
        let (restored_pod, restored) = restore_specs(&container_labels(&pod, &container), &annotations);
        assert_eq!(restored_pod.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(restored_pod.spec.and_then(|s| s.termination_grace_period_seconds), Some(30));
        assert_eq!(restored.name, "httpd");
        assert_eq!(restored.ports, container.ports);
        assert_eq!(restored.lifecycle.and_then(|l| l.pre_stop), Some(pre_stop));
        assert_eq!(pre_stop_of(&HashMap::from([(PRE_STOP_HANDLER.to_owned(), "{".to_owned())])), None);
    }
}
