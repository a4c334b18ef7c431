//! Registration and heartbeats against the in-process API server, over HTTP with the real client.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use kubelet_cluster::{Facts, Health, heartbeat, testing::ApiServer};
use kubelet_core::{events::RingRecorder, runtime::Version};
use tokio_util::sync::CancellationToken;

fn facts() -> Facts {
    let mut facts = Facts::new("node-1", Version::new("containerd", "1.6.20", "v1"));
    facts.cpu_milli = 2000;
    facts.memory_bytes = 4 << 30;
    facts.boot_id = "boot-a".into();
    facts
}

async fn client(server: &ApiServer) -> (kube::Client, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    (heartbeat::connect(&path).await.unwrap(), dir)
}

/// Waits (at most 10 s) until `done` holds of the server's objects.
async fn until(server: &ApiServer, what: &str, done: impl Fn(&kubelet_cluster::testing::Objects) -> bool) {
    for _ in 0..200 {
        if done(&server.objects.lock().unwrap()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}: {:?}", server.objects.lock().unwrap());
}

#[tokio::test]
async fn a_node_registers_once_and_adopts_an_existing_node_with_the_kubelets_labels() {
    let server = ApiServer::start().await;
    let (client, _dir) = client(&server).await;
    let recorder = RingRecorder::default();
    let node = heartbeat::register(&client, &facts(), &Health::default(), &recorder).await.unwrap();
    assert_eq!(node.metadata.labels.unwrap()["kubernetes.io/hostname"], "node-1");
    assert!(node.metadata.uid.is_some(), "the server's answer is kept");
    // Created with its status, as upstream's initialNode: capacity and conditions from the start.
    let created = server.objects.lock().unwrap().nodes["node-1"]["status"].clone();
    assert_eq!(created["capacity"]["cpu"], "2", "{created}");
    let ready = created["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap().clone();
    assert_eq!(ready["status"], "True", "{created}");
    let reasons = |recorder: &RingRecorder| recorder.events().iter().map(|e| e.reason.clone()).collect::<Vec<_>>();
    assert!(reasons(&recorder).contains(&"NodeReady".to_owned()), "{:?}", reasons(&recorder));
    // Registered again (an agent restart): the Node is adopted, nothing is created twice, and
    // its conditions' first values are not told again.
    let again = RingRecorder::default();
    heartbeat::register(&client, &facts(), &Health::default(), &again).await.unwrap();
    assert_eq!((server.requests("POST nodes"), server.requests("PATCH nodes")), (2, 0));
    assert!(reasons(&again).is_empty(), "{:?}", reasons(&again));
    // A Node someone else made without the kubelet's labels gets them.
    server.objects.lock().unwrap().nodes.get_mut("node-1").unwrap()["metadata"]["labels"] =
        serde_json::json!({"team": "edge"});
    let adopted = heartbeat::register(&client, &facts(), &Health::default(), &again).await.unwrap();
    let labels = adopted.metadata.labels.unwrap();
    assert_eq!((labels["kubernetes.io/hostname"].as_str(), labels["team"].as_str()), ("node-1", "edge"));
    assert_eq!(server.requests("PATCH nodes"), 1);

    let Err(missing) = heartbeat::connect(std::path::Path::new("/nonexistent/kubeconfig")).await else {
        panic!("a missing kubeconfig is an error")
    };
    assert!(missing.to_string().contains("/nonexistent/kubeconfig"), "{missing}");
}

#[tokio::test]
async fn the_status_is_reported_on_change_and_the_lease_renewed_across_a_conflict() {
    let server = ApiServer::start().await;
    let (client, _dir) = client(&server).await;
    let health = Arc::new(Mutex::new(Health::default()));
    let recorder = Arc::new(RingRecorder::default());
    let node = heartbeat::register(&client, &facts(), &Health::default(), recorder.as_ref()).await.unwrap();
    let cancel = CancellationToken::new();
    let config = heartbeat::Config::default().periods(
        Duration::from_millis(50),
        Duration::from_secs(3600),
        Duration::from_millis(100),
    );
    let api_back = Arc::new(tokio::sync::Notify::new());
    let task = tokio::spawn(heartbeat::run(
        client,
        node,
        facts(),
        {
            let health = health.clone();
            move || health.lock().unwrap().clone()
        },
        recorder.clone(),
        config,
        api_back.clone(),
        cancel.clone(),
    ));

    let ready = |objects: &kubelet_cluster::testing::Objects, status: &str| {
        objects.nodes["node-1"]["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == status))
    };
    until(&server, "a Ready node", |o| ready(o, "True")).await;
    let node_ready = recorder.events().iter().filter(|e| e.reason == "NodeReady").count();
    assert_eq!(node_ready, 1, "recorded once, at the registration: {:?}", recorder.events());
    until(&server, "a lease renewed twice", |o| {
        o.leases.contains_key("kube-node-lease/node-1") && o.requests.get("PUT leases").copied().unwrap_or(0) >= 2
    })
    .await;
    let lease = server.objects.lock().unwrap().leases["kube-node-lease/node-1"].clone();
    assert_eq!(lease["spec"]["holderIdentity"], "node-1");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
    assert_eq!(lease["metadata"]["ownerReferences"][0]["kind"], "Node");

    // Ticks with nothing new report nothing (the report period is an hour here): three lease
    // renewals, each after the status checks of its period, and no PATCH.
    let patches = server.requests("PATCH nodes/status");
    let renewals = server.requests("PUT leases");
    until(&server, "three more lease renewals", |o| o.requests.get("PUT leases").copied().unwrap_or(0) >= renewals + 3)
        .await;
    assert_eq!(server.requests("PATCH nodes/status"), patches, "heartbeat-only changes wait for the report period");

    // The runtime goes: reported at the next tick, with upstream's reason.
    health.lock().unwrap().runtime_errors = vec!["container runtime is down".into()];
    until(&server, "a NotReady node", |o| ready(o, "False")).await;
    let conditions = server.objects.lock().unwrap().nodes["node-1"]["status"]["conditions"].clone();
    let ready_condition = conditions.as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap().clone();
    assert_eq!(ready_condition["reason"], "KubeletNotReady");
    assert_eq!(ready_condition["message"], "container runtime is down");

    // Someone else writes the lease: the next renewal conflicts, reads it again, and wins.
    let (renew_time, version) = {
        let mut objects = server.objects.lock().unwrap();
        objects.version += 1;
        let version = objects.version.to_string();
        let lease = objects.leases.get_mut("kube-node-lease/node-1").unwrap();
        lease["metadata"]["resourceVersion"] = serde_json::json!(version.clone());
        (lease["spec"]["renewTime"].clone(), version)
    };
    until(&server, "a renewal after the conflict", |o| {
        let lease = &o.leases["kube-node-lease/node-1"];
        lease["metadata"]["resourceVersion"] != version.as_str() && lease["spec"]["renewTime"] != renew_time
    })
    .await;
    let renewals = server.requests("PUT leases");
    until(&server, "three more lease renewals", |o| o.requests.get("PUT leases").copied().unwrap_or(0) >= renewals + 3)
        .await;
    // A notification with nobody waiting is kept for the next waiter, so this sees any made.
    let quiet = tokio::time::timeout(Duration::ZERO, api_back.notified()).await;
    assert!(quiet.is_err(), "renewals that never failed tell nobody the API server is back");

    // The API server is away for a few renewals, then back: the first renewal after says so.
    server.set_fault(Some(kubelet_cluster::testing::Fault::Unavailable));
    let failed = server.requests("FAILED requests");
    until(&server, "three requests failed", |o| o.requests.get("FAILED requests").copied().unwrap_or(0) >= failed + 3)
        .await;
    server.set_fault(None);
    let back = tokio::time::timeout(Duration::from_secs(5), api_back.notified()).await;
    assert!(back.is_ok(), "the renewal after the outage tells the API server is back");

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the heartbeats stop when cancelled").unwrap();
}

#[tokio::test]
async fn the_client_keeps_to_its_burst_and_rate() {
    let server = ApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    server.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
    // A bucket of 2 tokens refilled at one every 10 s: the third request waits far longer than 2 s.
    let client = heartbeat::connect_limited(&dir.path().join("kubeconfig"), 0.1, 2).await.unwrap();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    let mut done = 0;
    for _ in 0..3 {
        if tokio::time::timeout(Duration::from_secs(2), nodes.get_opt("node-1")).await.is_ok() {
            done += 1;
        }
    }
    assert_eq!(done, 2, "two requests within the burst, the third held back");
    assert_eq!(server.requests("GET nodes"), 2);
}
