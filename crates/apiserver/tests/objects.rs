//! Config maps and secrets for volumes, watched through the in-process API server: reads answer
//! from the watch, changes and deletions arrive and queue the pods that use the object for a
//! sync, and a watch ends when no pod uses its object.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kubelet_cluster::{
    heartbeat,
    objects::ApiObjects,
    testing::{ApiServer, Fault},
};
use kubelet_core::{PodUid, WorkQueue, volume::ObjectSource};
use serde_json::json;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

fn pod(uid: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(uid.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

/// Reads config map `app` for `pod` until `done` holds (at most 10 s).
async fn until(objects: &ApiObjects, pod: &Pod, done: impl Fn(Option<&[u8]>) -> bool) {
    for _ in 0..200 {
        let data = objects.config_map(pod, "app").await.unwrap();
        if done(data.as_ref().and_then(|d| d.get("greeting")).map(Vec::as_slice)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out");
}

/// The pods `queue` has had due, by UID, once `expected` are among them (or after 10 s), and
/// what else came with them.
async fn queued(queue: &WorkQueue, expected: &[&str]) -> Vec<String> {
    let mut due = BTreeSet::new();
    for _ in 0..200 {
        due.extend(queue.take_due().iter().map(ToString::to_string));
        if expected.iter().all(|uid| due.contains(*uid)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    due.extend(queue.take_due().iter().map(ToString::to_string));
    due.into_iter().collect()
}

#[tokio::test]
async fn objects_are_watched_while_pods_use_them() {
    let server = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    server.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
    let client = heartbeat::connect(&dir.path().join("kubeconfig")).await.unwrap();
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let objects = ApiObjects::new(client, tracker.clone(), cancel.clone());
    let queue = Arc::new(WorkQueue::new());
    objects.sync_users_on_change(queue.clone());
    server.put_config_map("default", "app", json!({"greeting": "hello"}));
    server.put_secret("default", "db", &[("password", b"hunter2")]);
    let (web, job) = (pod("web"), pod("job"));

    let data = objects.config_map(&web, "app").await.unwrap().unwrap();
    assert_eq!(data["greeting"], b"hello");
    assert_eq!(objects.secret(&job, "db").await.unwrap().unwrap()["password"], b"hunter2");
    assert_eq!(objects.config_map(&web, "nope").await.unwrap(), None, "a missing object is None");
    // A second pod shares the watch.
    assert_eq!(objects.config_map(&job, "app").await.unwrap().unwrap()["greeting"], b"hello");
    assert!(queue.is_empty(), "reading an object queues no pod");

    // A change, then a deletion, each queue the pods that use the object, due at once.
    server.put_config_map("default", "app", json!({"greeting": "bye"}));
    until(&objects, &web, |g| g == Some(b"bye".as_slice())).await;
    assert_eq!(queued(&queue, &["job", "web"]).await, ["job", "web"], "the users of app, after its change");
    server.delete_object("configmaps", "default", "app");
    until(&objects, &web, |g| g.is_none()).await;
    assert_eq!(queued(&queue, &["job", "web"]).await, ["job", "web"], "the users of app, after its deletion");
    server.put_secret("default", "db", &[("password", b"letmein")]);
    for _ in 0..200 {
        if objects.secret(&job, "db").await.unwrap().unwrap()["password"] == b"letmein" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(queued(&queue, &["job"]).await, ["job"], "only the user of db, after its change");
    assert_eq!(server.requests("GET configmaps") + server.requests("GET secrets"), 0, "no reads: watches");
    assert_eq!(server.requests("LIST configmaps"), 2, "one watch of app, one of nope");
    assert_eq!(server.requests("LIST secrets"), 1);

    // Once no pod uses them, the watches end (the tracker empties without the cancel).
    objects.release(&PodUid::new("web"));
    objects.release(&PodUid::new("job"));
    tracker.close();
    tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await.expect("every watch ended");
}

/// Pods that start together all wait for the first list of services, and each goes on once it
/// is in: none sleeps until its timeout (30 s) because another waiter came after it.
#[tokio::test]
async fn every_pod_waiting_for_the_first_list_of_services_goes_on_once_it_is_in() {
    let server = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    server.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
    let client = heartbeat::connect(&dir.path().join("kubeconfig")).await.unwrap();
    let objects = Arc::new(ApiObjects::new(client, TaskTracker::new(), CancellationToken::new()));
    server.put_service("default", "web", json!({"clusterIP": "10.0.0.10", "ports": [{"port": 80}]}));
    // The first list fails, so every reader is waiting when the watch lists again.
    server.set_fault(Some(Fault::Unavailable));
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let objects = objects.clone();
            tokio::spawn(async move { objects.services("default").await })
        })
        .collect();
    // Two lists refused: the watch is retrying, and no reader has gone on without it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while server.requests("FAILED requests") < 2 {
        assert!(tokio::time::Instant::now() < deadline, "the watch retried its list within 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(readers.iter().all(|r| !r.is_finished()), "no reader went on without the services");
    assert_eq!(server.requests("LIST services"), 0, "no list has been answered yet");
    server.set_fault(None);

    let read = tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(readers)).await;
    let read = read.expect("every reader went on once the services were listed, not at its timeout");
    for services in read {
        let names: Vec<String> =
            services.unwrap().unwrap().unwrap().into_iter().filter_map(|s| s.metadata.name).collect();
        assert_eq!(names, ["web"]);
    }
}
