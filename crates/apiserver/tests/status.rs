//! The pod status sink against the in-process API server: changes patched at once with the UID
//! precondition, terminal phases kept, re-created pods left alone.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use kubelet_apiserver::{heartbeat, status, testing::ApiServer};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn running(ready: &str) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![PodCondition { type_: "Ready".into(), status: ready.into(), ..PodCondition::default() }]),
        ..PodStatus::default()
    }
}

/// Waits (at most 10 s) until the API's status of pod `web` satisfies `done`.
async fn until(server: &ApiServer, what: &str, done: impl Fn(&serde_json::Value) -> bool) {
    for _ in 0..200 {
        if server.objects.lock().unwrap().pods.get("default/web").is_some_and(|p| done(&p["status"])) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}: {:?}", server.objects.lock().unwrap().pods);
}

#[tokio::test]
async fn statuses_reach_the_api_with_their_uid_and_never_revert_a_terminal_phase() {
    let server = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    server.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
    let client = heartbeat::connect(&dir.path().join("kubeconfig")).await.unwrap();
    server.put_pod(json!({"metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]},
        "status": {"phase": "Pending", "conditions": [{"type": "example.com/gate", "status": "True"}]}}));
    let api_pod: Pod = serde_json::from_value(server.objects.lock().unwrap().pods["default/web"].clone()).unwrap();

    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(status::report(client, rx, Duration::from_millis(100), cancel.clone()));

    tx.send(status::Change::new(&api_pod, running("True"))).await.unwrap();
    until(&server, "Running and Ready", |s| {
        s["phase"] == "Running" && s["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Ready"))
    })
    .await;
    let conditions = server.objects.lock().unwrap().pods["default/web"]["status"]["conditions"].clone();
    assert!(conditions.as_array().unwrap().iter().any(|c| c["type"] == "example.com/gate"), "{conditions}");

    // The API says Succeeded (say, the kubelet's own earlier report): a Running status is not sent.
    tx.send(status::Change::new(&api_pod, PodStatus { phase: Some("Succeeded".into()), ..PodStatus::default() }))
        .await
        .unwrap();
    until(&server, "Succeeded", |s| s["phase"] == "Succeeded").await;
    let patches = server.requests("PATCH pods/status");
    tx.send(status::Change::new(&api_pod, running("True"))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(server.requests("PATCH pods/status"), patches, "a terminal phase is never reverted");
    until(&server, "still Succeeded", |s| s["phase"] == "Succeeded").await;

    // Re-created under another UID: the old pod's status is not written onto the new one.
    server.delete_pod("default", "web");
    server.put_pod(json!({"metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}));
    let patches = server.requests("PATCH pods/status");
    tx.send(status::Change::new(&api_pod, PodStatus { phase: Some("Failed".into()), ..PodStatus::default() }))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(server.requests("PATCH pods/status"), patches);
    until(&server, "the new pod untouched", |s| s["phase"] == "Pending").await;

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the sink stops when cancelled").unwrap();
}
