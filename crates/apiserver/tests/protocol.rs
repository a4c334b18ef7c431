//! The in-process API server speaks the protocol as the API server does where a client can get
//! it wrong: patch types by `Content-Type`, field selectors it cannot serve refused, bookmarks.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
};
use kubelet_apiserver::{heartbeat, testing::ApiServer};
use serde_json::{Value, json};

async fn client(server: &ApiServer) -> (Client, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    server.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
    (heartbeat::connect(&dir.path().join("kubeconfig")).await.unwrap(), dir)
}

fn pod_with_conditions() -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False"}]}})
}

fn condition_types(pod: &Pod) -> Vec<(String, String)> {
    let conditions = pod.status.as_ref().unwrap().conditions.clone().unwrap_or_default();
    conditions.into_iter().map(|c| (c.type_, c.status)).collect()
}

fn code(err: &kube::Error) -> u16 {
    match err {
        kube::Error::Api(status) => status.code,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn a_patch_is_applied_by_its_content_type() {
    let server = ApiServer::start().await;
    let (client, _dir) = client(&server).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});

    server.put_pod(pod_with_conditions());
    let merged = pods.patch_status("p", &PatchParams::default(), &Patch::Strategic(ready.clone())).await.unwrap();
    assert_eq!(
        condition_types(&merged),
        [("PodScheduled".into(), "True".into()), ("Ready".into(), "True".into())],
        "a strategic merge patch merges conditions by type"
    );

    server.put_pod(pod_with_conditions());
    let replaced = pods.patch_status("p", &PatchParams::default(), &Patch::Merge(ready.clone())).await.unwrap();
    assert_eq!(
        condition_types(&replaced),
        [("Ready".into(), "True".into())],
        "a JSON merge patch replaces the whole list"
    );
    let no_phase = Patch::Merge(json!({"status": {"phase": null}}));
    let phase = pods.patch_status("p", &PatchParams::default(), &no_phase).await.unwrap();
    assert_eq!(phase.status.unwrap().phase, None, "null deletes");

    let apply = Patch::Apply(ready.clone());
    let refused = pods.patch_status("p", &PatchParams::apply("test"), &apply).await.unwrap_err();
    assert_eq!(code(&refused), 415, "a patch type the server does not apply is refused: {refused}");

    let directive = json!({"status": {"$setElementOrder/conditions": [{"type": "Ready"}]}});
    let refused = pods.patch_status("p", &PatchParams::default(), &Patch::Strategic(directive)).await.unwrap_err();
    assert_eq!(code(&refused), 422, "a directive is named, not stored: {refused}");
    assert_eq!(server.requests("PATCH pods/status"), 5);

    // Nodes take the same rules: addresses merge by type in a strategic merge patch.
    let nodes: Api<Node> = Api::all(client);
    nodes
        .create(&Default::default(), &serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap())
        .await
        .unwrap();
    let address = |kind: &str, ip: &str| json!({"status": {"addresses": [{"type": kind, "address": ip}]}});
    nodes
        .patch_status("n", &PatchParams::default(), &Patch::Strategic(address("InternalIP", "192.0.2.1")))
        .await
        .unwrap();
    let node =
        nodes.patch_status("n", &PatchParams::default(), &Patch::Strategic(address("Hostname", "n"))).await.unwrap();
    assert_eq!(node.status.unwrap().addresses.unwrap().len(), 2);
}

/// As kube-apiserver: `podIPs` merge by `ip`, so a second IP of one family is a 422, unless
/// the list says `$patch: replace`.
#[tokio::test]
async fn pod_ips_are_validated_and_replaced_only_when_asked() {
    let server = ApiServer::start().await;
    let (client, _dir) = client(&server).await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    server.put_pod(pod_with_conditions());
    let ips = |ip: &str, list: Value| json!({"status": {"podIP": ip, "podIPs": list}});
    let first = ips("10.85.0.62", json!([{"ip": "10.85.0.62"}]));
    pods.patch_status("p", &PatchParams::default(), &Patch::Strategic(first)).await.unwrap();

    let merged = ips("10.85.0.64", json!([{"ip": "10.85.0.64"}]));
    let refused = pods.patch_status("p", &PatchParams::default(), &Patch::Strategic(merged)).await.unwrap_err();
    assert_eq!(code(&refused), 422, "two IPs of one family: {refused}");
    assert!(refused.to_string().contains("may specify no more than one IP for each IP family"), "{refused}");

    let replaced = ips("10.85.0.64", json!([{"$patch": "replace"}, {"ip": "10.85.0.64"}]));
    let pod = pods.patch_status("p", &PatchParams::default(), &Patch::Strategic(replaced)).await.unwrap();
    let status = pod.status.unwrap();
    assert_eq!(status.pod_ips.unwrap().iter().map(|p| p.ip.as_str()).collect::<Vec<_>>(), ["10.85.0.64"]);

    let mismatched = ips("10.85.0.65", json!([{"$patch": "replace"}, {"ip": "10.85.0.64"}]));
    let refused = pods.patch_status("p", &PatchParams::default(), &Patch::Strategic(mismatched)).await.unwrap_err();
    assert_eq!(code(&refused), 422, "podIPs[0] must be podIP: {refused}");
}

#[tokio::test]
async fn a_field_selector_the_resource_cannot_serve_is_refused() {
    let server = ApiServer::start().await;
    let (client, _dir) = client(&server).await;
    server.put_pod(pod_with_conditions());
    let mut other = pod_with_conditions();
    other["metadata"]["name"] = json!("q");
    other["spec"]["nodeName"] = json!("node-2");
    server.put_pod(other);
    let pods: Api<Pod> = Api::all(client);

    let names = |list: kube::core::ObjectList<Pod>| -> Vec<String> {
        list.items.into_iter().filter_map(|p| p.metadata.name).collect()
    };
    let on_node_1 = pods.list(&ListParams::default().fields("spec.nodeName=node-1")).await.unwrap();
    assert_eq!(names(on_node_1), ["p"]);
    let not_on_node_1 = pods.list(&ListParams::default().fields("spec.nodeName!=node-1")).await.unwrap();
    assert_eq!(names(not_on_node_1), ["q"]);
    let both = pods.list(&ListParams::default().fields("spec.nodeName=node-2,metadata.name=p")).await.unwrap();
    assert!(names(both).is_empty(), "every term must hold");

    let refused = pods.list(&ListParams::default().fields("spec.nodename=node-1")).await.unwrap_err();
    assert_eq!(code(&refused), 400, "a misspelt field is refused, not ignored: {refused}");
    assert!(refused.to_string().contains("field label not supported: spec.nodename"), "{refused}");
}
