//! Mirror pods (upstream `pkg/kubelet/pod/mirror_client.go`): the API server's copy of a static
//! pod, marked with the pod's hash in `kubernetes.io/config.mirror` and owned by the Node.

use k8s_openapi::{
    api::core::v1::{Node, Pod},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams, Preconditions},
};
use kubelet_core::types::{annotations, config_hash};

/// The mirror pod of static pod `pod` on node `node` (whose UID is `node_uid`): the pod with
/// the mirror annotation, an owner reference to the Node, and nothing the API server assigns.
pub fn mirror_pod(pod: &Pod, node: &str, node_uid: &str) -> Pod {
    let mut mirror = pod.clone();
    let meta = &mut mirror.metadata;
    let hash = config_hash(pod).unwrap_or_default().to_owned();
    meta.annotations.get_or_insert_with(Default::default).insert(annotations::CONFIG_MIRROR.to_owned(), hash);
    meta.owner_references = Some(vec![OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: node.to_owned(),
        uid: node_uid.to_owned(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    (meta.uid, meta.resource_version, meta.creation_timestamp, meta.generation) = (None, None, None, None);
    mirror.status = None;
    if let Some(spec) = mirror.spec.as_mut() {
        spec.node_name = Some(node.to_owned());
    }
    mirror
}

/// Creates the mirror pod of static pod `pod` on node `node`; a mirror already there with the
/// pod's hash is success (upstream `CreateMirrorPod`).
pub async fn create(client: &Client, pod: &Pod, node: &str) -> Result<(), kube::Error> {
    let node_uid = Api::<Node>::all(client.clone()).get(node).await?.metadata.uid.unwrap_or_default();
    let mirror = mirror_pod(pod, node, &node_uid);
    let namespace = mirror.metadata.namespace.clone().unwrap_or_else(|| "default".to_owned());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    match pods.create(&PostParams::default(), &mirror).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            let name = mirror.metadata.name.clone().unwrap_or_default();
            let there = pods.get_opt(&name).await?;
            let hash = there.as_ref().and_then(config_hash);
            if hash.is_some() && hash == config_hash(pod) { Ok(()) } else { Err(kube::Error::Api(status)) }
        }
        Err(err) => Err(err),
    }
}

/// Deletes mirror pod `namespace/name` at once, only if its UID is `uid` when one is given;
/// `Ok(false)` when it was not there (upstream `DeleteMirrorPod`).
pub async fn delete(client: &Client, namespace: &str, name: &str, uid: Option<&str>) -> Result<bool, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let preconditions = uid.map(|uid| Preconditions { uid: Some(uid.to_owned()), resource_version: None });
    let params = DeleteParams { grace_period_seconds: Some(0), preconditions, ..DeleteParams::default() };
    match pods.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(false),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{api::core::v1::PodSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta};
    use kubelet_core::types::is_mirror_pod;

    use super::*;

    #[test]
    fn a_mirror_records_the_hash_is_owned_by_the_node_and_carries_nothing_the_api_assigns() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("etcd-node-1".into()),
                namespace: Some("kube-system".into()),
                uid: Some("static-uid".into()),
                resource_version: Some("7".into()),
                annotations: Some(BTreeMap::from([
                    (annotations::CONFIG_HASH.to_owned(), "abc".to_owned()),
                    (annotations::CONFIG_SOURCE.to_owned(), "file".to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec::default()),
            ..Pod::default()
        };
        let mirror = mirror_pod(&pod, "node-1", "node-uid");
        assert!(is_mirror_pod(&mirror));
        assert_eq!(config_hash(&mirror), Some("abc"));
        assert_eq!(mirror.metadata.uid, None);
        assert_eq!(mirror.metadata.resource_version, None);
        let owner = &mirror.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Node", "node-1", "node-uid"));
        assert_eq!(owner.controller, Some(true));
        assert_eq!(mirror.spec.unwrap().node_name.as_deref(), Some("node-1"));
    }
}
