//! The API pod source against the in-process API server: the pods bound to this node, as
//! snapshots, through a list, watch events, and a 410 after compaction.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use kubelet_apiserver::{heartbeat, source, testing::ApiServer};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn pod(name: &str, node: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})
}

async fn next_names(snapshots: &mut tokio::sync::mpsc::Receiver<Vec<String>>) -> Vec<String> {
    tokio::time::timeout(Duration::from_secs(10), snapshots.recv()).await.expect("a snapshot within 10 s").unwrap()
}

#[tokio::test]
async fn the_nodes_pods_arrive_as_snapshots_through_list_watch_and_a_410() {
    let server = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    server.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
    let client = heartbeat::connect(&dir.path().join("kubeconfig")).await.unwrap();
    server.put_pod(pod("a", "node-1"));
    server.put_pod(pod("elsewhere", "node-2"));

    let (tx, mut snapshots) = tokio::sync::mpsc::channel(16);
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            let deliver = |pods: Vec<k8s_openapi::api::core::v1::Pod>| {
                let tx = tx.clone();
                async move {
                    let mut names: Vec<String> = pods.into_iter().filter_map(|p| p.metadata.name).collect();
                    names.sort();
                    tx.send(names).await.is_ok()
                }
            };
            source::watch_pods(client, "node-1", deliver, cancel).await;
        }
    });

    assert_eq!(next_names(&mut snapshots).await, ["a"], "the first snapshot is the whole initial list");
    server.put_pod(pod("b", "node-1"));
    assert_eq!(next_names(&mut snapshots).await, ["a", "b"]);
    server.put_pod(pod("not-ours", "node-2"));
    server.delete_pod("default", "a");
    assert_eq!(next_names(&mut snapshots).await, ["b"], "only this node's pods");

    // Another node's pod moves the version past what this watch saw (it has no bookmarks); the
    // history is compacted and the watch ends: the next watch gets 410 and lists again.
    server.put_pod(pod("also-not-ours", "node-2"));
    server.compact();
    server.put_pod(pod("c", "node-1"));
    let mut names = next_names(&mut snapshots).await;
    while names != ["b", "c"] {
        names = next_names(&mut snapshots).await;
    }
    assert!(server.requests("LIST pods") >= 2, "listed again after the 410");
    assert!(server.requests("WATCH pods") >= 2);

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the source stops when cancelled").unwrap();
}
