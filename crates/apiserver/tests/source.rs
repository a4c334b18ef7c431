//! The API pod source against the in-process API server: the pods bound to this node, as
//! snapshots, through a list, watch events, and a 410 after compaction.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kubelet_cluster::{
    heartbeat, source,
    testing::{ApiServer, Fault},
};
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

fn pod(name: &str, node: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})
}

/// The snapshots a source hands on.
type Snapshots = tokio::sync::mpsc::Receiver<Vec<Arc<Pod>>>;

async fn next_pods(snapshots: &mut Snapshots) -> Vec<Arc<Pod>> {
    tokio::time::timeout(Duration::from_secs(10), snapshots.recv()).await.expect("a snapshot within 10 s").unwrap()
}

/// The sorted names of a snapshot's pods.
fn names_of(pods: Vec<Arc<Pod>>) -> Vec<String> {
    let mut names: Vec<String> = pods.iter().filter_map(|p| p.metadata.name.clone()).collect();
    names.sort();
    names
}

async fn next_names(snapshots: &mut Snapshots) -> Vec<String> {
    names_of(next_pods(snapshots).await)
}

/// The source of node-1's pods on `server`, told by `api_back` that the API server is back, its
/// snapshots, and its task.
async fn watch_node_1(
    server: &ApiServer,
    api_back: &Arc<Notify>,
    cancel: &CancellationToken,
) -> (Snapshots, tokio::task::JoinHandle<()>) {
    watch_node_1_holding(server, api_back, cancel, 16).await
}

/// [`watch_node_1`], whose deliveries wait while `held` snapshots are not yet read.
async fn watch_node_1_holding(
    server: &ApiServer,
    api_back: &Arc<Notify>,
    cancel: &CancellationToken,
    held: usize,
) -> (Snapshots, tokio::task::JoinHandle<()>) {
    let dir = tempfile::tempdir().unwrap();
    server.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
    let client = heartbeat::connect(&dir.path().join("kubeconfig")).await.unwrap();
    let (tx, snapshots) = tokio::sync::mpsc::channel(held);
    let task = tokio::spawn({
        let (api_back, cancel) = (api_back.clone(), cancel.clone());
        async move {
            let deliver = |pods: Vec<Arc<Pod>>| {
                let tx = tx.clone();
                async move { tx.send(pods).await.is_ok() }
            };
            source::watch_pods(client, "node-1", deliver, api_back, cancel).await;
        }
    });
    (snapshots, task)
}

#[tokio::test]
async fn the_nodes_pods_arrive_as_snapshots_through_list_watch_and_a_410() {
    let server = ApiServer::start().await;
    server.put_pod(pod("a", "node-1"));
    server.put_pod(pod("elsewhere", "node-2"));
    let cancel = CancellationToken::new();
    let (mut snapshots, task) = watch_node_1(&server, &Arc::default(), &cancel).await;

    assert_eq!(next_names(&mut snapshots).await, ["a"], "the first snapshot is the whole initial list");
    server.put_pod(pod("b", "node-1"));
    assert_eq!(next_names(&mut snapshots).await, ["a", "b"]);
    server.put_pod(pod("not-ours", "node-2"));
    server.delete_pod("default", "a");
    assert_eq!(next_names(&mut snapshots).await, ["b"], "only this node's pods");

    // The API server restarts with another node's pod put while the watch was away (no bookmark
    // could tell it the new version) and its history compacted: the next watch gets 410 and lists
    // again.
    server.restart_with(vec![pod("also-not-ours", "node-2")]);
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

#[tokio::test]
async fn a_bookmark_lets_the_watch_resume_after_a_compaction_without_listing_again() {
    let server = ApiServer::start().await;
    server.put_pod(pod("a", "node-1"));
    let cancel = CancellationToken::new();
    let (mut snapshots, task) = watch_node_1(&server, &Arc::default(), &cancel).await;
    assert_eq!(next_names(&mut snapshots).await, ["a"]);

    // Other nodes' pods move the version on; the idle watch is told by a bookmark.
    server.put_pod(pod("not-ours", "node-2"));
    for _ in 0..100 {
        if server.requests("BOOKMARK pods") > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(server.requests("BOOKMARK pods") > 0, "a bookmark within 5 s of the idle watch");
    let watches = server.requests("WATCH pods");

    server.compact();
    server.put_pod(pod("b", "node-1"));
    assert_eq!(next_names(&mut snapshots).await, ["a", "b"]);
    assert!(server.requests("WATCH pods") > watches, "watched again after the compaction");
    assert_eq!(server.requests("LIST pods"), 1, "resumed from the bookmark's version: no second list");

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the source stops when cancelled").unwrap();
}

/// A watch made into a server that hangs waits for an answer that never comes; once the
/// heartbeats say the server answers again, the source lists and watches afresh, and a pod bound
/// meanwhile arrives at once instead of after the hung watch is given up (30 s) and its backoff.
#[tokio::test]
async fn a_watch_made_into_a_hang_is_made_afresh_when_the_api_server_is_back() {
    let server = ApiServer::start().await;
    server.put_pod(pod("a", "node-1"));
    let (api_back, cancel) = (Arc::new(Notify::new()), CancellationToken::new());
    let (mut snapshots, task) = watch_node_1(&server, &api_back, &cancel).await;
    assert_eq!(next_names(&mut snapshots).await, ["a"]);

    server.set_fault(Some(Fault::Hang));
    server.end_watches();
    for _ in 0..200 {
        if server.requests("HUNG requests") > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(server.requests("HUNG requests") > 0, "the watch was made again into the hang");
    server.set_fault(None);
    server.put_pod(pod("b", "node-1"));
    let lists = server.requests("LIST pods");
    api_back.notify_one();
    let names = tokio::time::timeout(Duration::from_secs(5), snapshots.recv()).await;
    assert_eq!(names_of(names.expect("a snapshot at once").unwrap()), ["a", "b"]);
    assert_eq!(server.requests("LIST pods"), lists + 1, "listed afresh");

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the source stops when cancelled").unwrap();
}

/// A burst of changes that came while the source was busy is one snapshot, not one for each
/// change (the sync loop's config merger compares every pod of each snapshot).
#[tokio::test]
async fn changes_that_came_together_are_one_snapshot() {
    let server = ApiServer::start().await;
    server.put_pod(pod("a", "node-1"));
    let cancel = CancellationToken::new();
    let (mut snapshots, task) = watch_node_1_holding(&server, &Arc::default(), &cancel, 1).await;
    assert_eq!(next_names(&mut snapshots).await, ["a"]);

    // With a snapshot unread, the source waits to deliver the next while 20 more pods come.
    let names: Vec<String> = (0..20).map(|i| format!("p{i:02}")).collect();
    for name in &names {
        server.put_pod(pod(name, "node-1"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut all = vec!["a".to_owned()];
    all.extend(names);
    let mut seen = 0;
    loop {
        seen += 1;
        if next_names(&mut snapshots).await == all {
            break;
        }
    }
    assert!(seen <= 3, "20 changes came in {seen} snapshots: one being delivered, one waiting, then the rest as one");
    cancel.cancel();
    task.await.unwrap();
}

/// The pods are handed on without their `managedFields`, which nothing on the node reads and
/// every snapshot would copy.
#[tokio::test]
async fn pods_are_handed_on_without_their_managed_fields() {
    let server = ApiServer::start().await;
    let mut managed = pod("a", "node-1");
    managed["metadata"]["managedFields"] = json!([{"manager": "kubectl", "operation": "Update",
        "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:containers": {}}}}]);
    server.put_pod(managed);
    let cancel = CancellationToken::new();
    let (mut snapshots, task) = watch_node_1(&server, &Arc::default(), &cancel).await;
    let pods = next_pods(&mut snapshots).await;
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].metadata.managed_fields, None);
    assert!(pods[0].spec.is_some(), "the rest of the pod is there");
    cancel.cancel();
    task.await.unwrap();
}

/// A pod the watch did not change since the snapshot before is handed on as the same `Arc`, so
/// the config merger neither copies nor compares it; a changed one is a new `Arc`.
#[tokio::test]
async fn a_pod_that_did_not_change_is_handed_on_as_the_same_arc() {
    let server = ApiServer::start().await;
    server.put_pod(pod("a", "node-1"));
    server.put_pod(pod("b", "node-1"));
    let cancel = CancellationToken::new();
    let (mut snapshots, task) = watch_node_1(&server, &Arc::default(), &cancel).await;
    let before = next_pods(&mut snapshots).await;
    let mut relabelled = pod("b", "node-1");
    relabelled["metadata"]["labels"] = json!({"app": "b"});
    server.put_pod(relabelled);
    let after = next_pods(&mut snapshots).await;
    let by_name = |pods: &[Arc<Pod>], name: &str| {
        pods.iter().find(|p| p.metadata.name.as_deref() == Some(name)).cloned().expect("the pod")
    };
    assert!(Arc::ptr_eq(&by_name(&before, "a"), &by_name(&after, "a")), "a did not change");
    assert!(!Arc::ptr_eq(&by_name(&before, "b"), &by_name(&after, "b")), "b changed");
    assert!(by_name(&after, "b").metadata.labels.is_some());
    cancel.cancel();
    task.await.unwrap();
}
