//! The in-process API server speaks the protocol as the API server does where a client can get
//! it wrong: patch types by `Content-Type`, field selectors it cannot serve refused, bookmarks.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
};
use kubelet_cluster::{heartbeat, testing::ApiServer};
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

/// A GET over a fresh connection, HTTP/1.0: the status code and the `Retry-After` header, or the
/// connection's error.
async fn raw_get(server: &ApiServer, path: &str) -> std::io::Result<(u16, Option<String>)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(server.addr).await?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let code = response.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let retry_after = response
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("retry-after: ").map(|v| v.trim().to_owned()));
    Ok((code, retry_after))
}

#[tokio::test]
async fn the_server_can_be_away_in_every_way_and_come_back() {
    use kubelet_cluster::testing::Fault;
    let server = ApiServer::start().await;
    let path = "/api/v1/nodes/node-1";
    assert_eq!(raw_get(&server, path).await.unwrap().0, 404, "served: no such node");

    server.set_fault(Some(Fault::InternalError));
    assert_eq!(raw_get(&server, path).await.unwrap().0, 500);
    server.set_fault(Some(Fault::Unavailable));
    assert_eq!(raw_get(&server, path).await.unwrap().0, 503);
    server.set_fault(Some(Fault::TooManyRequests { retry_after_seconds: 7 }));
    assert_eq!(raw_get(&server, path).await.unwrap(), (429, Some("7".to_owned())));

    server.set_fault(Some(Fault::Hang));
    let held = tokio::spawn({
        let addr = server.addr;
        async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream.write_all(b"GET /api/v1/nodes/node-1 HTTP/1.0\r\nHost: test\r\n\r\n").await.unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            response
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!held.is_finished(), "a hanging server answers nothing");
    server.set_fault(None);
    assert_eq!(raw_get(&server, path).await.unwrap().0, 404, "requests after the fault are answered");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!held.is_finished(), "what the hang held stays unanswered, as over a lost connection");
    held.abort();

    // A connection open when the server goes away is closed, and new ones are refused.
    let mut open = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    server.refuse_connections().await;
    let refused = raw_get(&server, path).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "{refused}");
    let mut rest = Vec::new();
    let read = tokio::io::AsyncReadExt::read_to_end(&mut open, &mut rest).await;
    assert!(read.is_err() || rest.is_empty(), "the open connection ends without an answer");
    server.accept_connections().await;
    assert_eq!(raw_get(&server, path).await.unwrap().0, 404);
}

#[tokio::test]
async fn a_request_the_server_asks_to_retry_is_retried_and_no_other() {
    use kubelet_cluster::testing::Fault;
    use std::{sync::Arc, time::Duration};
    let server = Arc::new(ApiServer::start().await);
    let (client, _dir) = client(&server).await;
    let nodes: Api<Node> = Api::all(client);

    let clear_later = |after: Duration| {
        let server = Arc::clone(&server);
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            server.set_fault(None);
        })
    };

    // 503 without Retry-After is the caller's: kube's own back-off would retry it until the
    // fault clears and answer 404.
    server.set_fault(Some(Fault::Unavailable));
    let clear = clear_later(Duration::from_millis(500));
    let unavailable = nodes.get("node-1").await.unwrap_err();
    assert_eq!(code(&unavailable), 503, "not retried: {unavailable}");
    clear.await.unwrap();

    // 429 with Retry-After: 1 is sent again each second until the server answers.
    server.set_fault(Some(Fault::TooManyRequests { retry_after_seconds: 1 }));
    let clear = clear_later(Duration::from_millis(1500));
    let answered = nodes.get("node-1").await.unwrap_err();
    assert_eq!(code(&answered), 404, "retried until the server answered: {answered}");
    clear.await.unwrap();
}
