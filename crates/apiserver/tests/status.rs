//! The pod status sink against the in-process API server: changes patched at once with the UID
//! precondition, terminal phases kept, re-created pods left alone.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use kubelet_cluster::{heartbeat, status, testing::ApiServer};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn running(ready: &str) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![PodCondition { type_: "Ready".into(), status: ready.into(), ..PodCondition::default() }]),
        ..PodStatus::default()
    }
}

/// A status sink under test, reading the reports of its channel, and the client it patches with.
struct Sink {
    client: kube::Client,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Sink {
    /// Starts a sink against `server` that reads `reports`, resyncs every `resync` and sends
    /// `in_flight` pods' statuses at a time.
    async fn start(
        server: &ApiServer,
        reports: mpsc::UnboundedReceiver<status::Report>,
        resync: Duration,
        in_flight: usize,
    ) -> Sink {
        let dir = tempfile::tempdir().unwrap();
        server.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
        let client = heartbeat::connect(&dir.path().join("kubeconfig")).await.unwrap();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(status::report(client.clone(), reports, resync, in_flight, cancel.clone()));
        Sink { client, cancel, task }
    }

    /// Cancels the sink, which must then stop.
    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task).await.expect("the sink stops when cancelled").unwrap();
    }
}

/// Waits until a sink that sends one pod's status at a time has handled every report sent
/// before: a pod of its own (`barrier-<n>`) gets two statuses, the second sent once the API has
/// the first. The sink hears reports in order and sends the pods in the order they became due:
/// the first status goes after every earlier send, and a pod sent again meanwhile (a later
/// status, a deletion now due) is queued before the second is heard. What must not happen is
/// checked after it, not after a sleep.
async fn barrier(server: &ApiServer, tx: &mpsc::UnboundedSender<status::Report>, n: u32) {
    let name = format!("barrier-{n}");
    server.put_pod(json!({"metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}));
    let key = format!("default/{name}");
    for ready in ["True", "False"] {
        tx.send(status::Report::Status(status::Change::new(&api_pod(server, &key), running(ready)))).unwrap();
        wait_for_ready(server, &key, ready).await;
    }
}

/// Waits (at most 10 s) until pod `key`'s Ready condition in the API is `ready`.
async fn wait_for_ready(server: &ApiServer, key: &str, ready: &str) {
    for _ in 0..200 {
        if server.objects.lock().unwrap().pods[key]["status"]["conditions"][0]["status"] == ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the sink did not reach {key}");
}

/// The resource version of pod `key`: it changes with every write of the pod.
fn version(server: &ApiServer, key: &str) -> serde_json::Value {
    server.objects.lock().unwrap().pods[key]["metadata"]["resourceVersion"].clone()
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
    server.put_pod(json!({"metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]},
        "status": {"phase": "Pending", "conditions": [{"type": "example.com/gate", "status": "True"}]}}));
    let api_pod: Pod = serde_json::from_value(server.objects.lock().unwrap().pods["default/web"].clone()).unwrap();

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let sink = Sink::start(&server, rx, Duration::from_millis(100), 1).await;

    tx.send(status::Report::Status(status::Change::new(&api_pod, running("True")))).unwrap();
    until(&server, "Running and Ready", |s| {
        s["phase"] == "Running" && s["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Ready"))
    })
    .await;
    let conditions = server.objects.lock().unwrap().pods["default/web"]["status"]["conditions"].clone();
    assert!(conditions.as_array().unwrap().iter().any(|c| c["type"] == "example.com/gate"), "{conditions}");

    // The API says Succeeded (say, the kubelet's own earlier report): a Running status is not sent.
    tx.send(status::Report::Status(status::Change::new(
        &api_pod,
        PodStatus { phase: Some("Succeeded".into()), ..PodStatus::default() },
    )))
    .unwrap();
    until(&server, "Succeeded", |s| s["phase"] == "Succeeded").await;
    let before = version(&server, "default/web");
    tx.send(status::Report::Status(status::Change::new(&api_pod, running("True")))).unwrap();
    barrier(&server, &tx, 1).await;
    assert_eq!(version(&server, "default/web"), before, "a terminal phase is never reverted");

    // Re-created under another UID: the old pod's status is not written onto the new one.
    server.delete_pod("default", "web");
    server.put_pod(json!({"metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}));
    let before = version(&server, "default/web");
    tx.send(status::Report::Status(status::Change::new(
        &api_pod,
        PodStatus { phase: Some("Failed".into()), ..PodStatus::default() },
    )))
    .unwrap();
    barrier(&server, &tx, 2).await;
    assert_eq!(version(&server, "default/web"), before, "the new pod is untouched");

    sink.stop().await;
}

fn api_pod(server: &ApiServer, key: &str) -> Pod {
    serde_json::from_value(server.objects.lock().unwrap().pods[key].clone()).unwrap()
}

/// Waits (at most 10 s) until pod `key` is gone from the API.
async fn until_gone(server: &ApiServer, key: &str) {
    for _ in 0..200 {
        if !server.objects.lock().unwrap().pods.contains_key(key) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{key} is still there: {:?}", server.objects.lock().unwrap().pods[key]);
}

#[tokio::test]
async fn a_terminated_pod_whose_deletion_was_asked_for_is_deleted_with_its_uid_as_precondition() {
    let server = ApiServer::start().await;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let sink = Sink::start(&server, rx, Duration::from_millis(100), 1).await;
    for name in ["web", "job"] {
        server.put_pod(json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}));
    }
    let (web, job) = (api_pod(&server, "default/web"), api_pod(&server, "default/job"));
    tx.send(status::Report::Status(status::Change::new(&web, running("True")))).unwrap();
    tx.send(status::Report::Status(status::Change::new(&job, running("True")))).unwrap();
    until(&server, "web Running", |s| s["phase"] == "Running").await;

    // Deletion asked for while it runs: nothing is deleted before it has terminated.
    server.request_deletion("default", "web", 30);
    let web = api_pod(&server, "default/web");
    tx.send(status::Report::bound(&[web.clone(), job.clone()])).unwrap();
    barrier(&server, &tx, 1).await;
    assert!(server.objects.lock().unwrap().pods.contains_key("default/web"), "still running: not deleted");
    assert_eq!(server.requests("DELETE pods"), 0);
    let failed = PodStatus { phase: Some("Failed".into()), ..PodStatus::default() };
    tx.send(status::Report::Status(status::Change::new(&web, failed.clone()))).unwrap();
    tx.send(status::Report::Terminated(web.metadata.uid.clone().unwrap())).unwrap();
    until_gone(&server, "default/web").await;

    // Terminated first (a finished pod), deletion asked for later: deleted then.
    let done = PodStatus { phase: Some("Succeeded".into()), ..PodStatus::default() };
    tx.send(status::Report::Status(status::Change::new(&job, done))).unwrap();
    tx.send(status::Report::Terminated(job.metadata.uid.clone().unwrap())).unwrap();
    barrier(&server, &tx, 2).await;
    assert!(server.objects.lock().unwrap().pods.contains_key("default/job"), "no deletion asked for yet");
    server.request_deletion("default", "job", 30);
    tx.send(status::Report::bound(&[api_pod(&server, "default/job")])).unwrap();
    until_gone(&server, "default/job").await;
    assert_eq!(server.requests("DELETE pods"), 2);

    // A re-created pod of the same name is not deleted by the old one's termination.
    server.put_pod(json!({"metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]}}));
    server.request_deletion("default", "web", 30);
    let new_web = api_pod(&server, "default/web");
    tx.send(status::Report::Status(status::Change::new(&web, failed))).unwrap();
    tx.send(status::Report::Terminated(web.metadata.uid.clone().unwrap())).unwrap();
    tx.send(status::Report::bound(&[new_web])).unwrap();
    barrier(&server, &tx, 3).await;
    assert!(server.objects.lock().unwrap().pods.contains_key("default/web"), "another pod by now");

    sink.stop().await;
}

#[tokio::test]
async fn a_static_pods_status_goes_to_the_mirror_that_records_its_hash() {
    let server = ApiServer::start().await;
    let static_pod: Pod =
        serde_json::from_value(json!({"metadata": {"name": "etcd-node-1", "namespace": "kube-system",
        "uid": "static-uid", "annotations": {"kubernetes.io/config.hash": "h1", "kubernetes.io/config.source": "file"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "etcd"}]}}))
        .unwrap();
    let mirror = serde_json::to_value(kubelet_cluster::mirror::mirror_pod(&static_pod, "node-1", "node-uid")).unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let sink = Sink::start(&server, rx, Duration::from_millis(100), 1).await;
    let mirror_phase = || server.objects.lock().unwrap().pods["kube-system/etcd-node-1"]["status"]["phase"].clone();

    // The status comes before the mirror does: it is kept, and sent once the mirror is there
    // (at the next resync at the latest).
    tx.send(status::Report::Status(status::Change::of_static(&static_pod, running("True")))).unwrap();
    barrier(&server, &tx, 1).await;
    assert_eq!(server.requests("PATCH pods/status"), 2, "the barrier's two alone: no mirror yet");
    server.put_pod(mirror.clone());
    for _ in 0..200 {
        if mirror_phase() == "Running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(mirror_phase(), "Running", "the mirror shows the static pod's status");

    // A re-created mirror gets it again once the API pod source shows it.
    server.delete_pod("kube-system", "etcd-node-1");
    server.put_pod(mirror.clone());
    tx.send(status::Report::bound(&[api_pod(&server, "kube-system/etcd-node-1")])).unwrap();
    for _ in 0..200 {
        if mirror_phase() == "Running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(mirror_phase(), "Running", "the re-created mirror shows the static pod's status");

    // Once the kubelet has removed the static pod, nothing more goes to a mirror.
    tx.send(status::Report::Removed("static-uid".into())).unwrap();
    server.delete_pod("kube-system", "etcd-node-1");
    server.put_pod(mirror);
    tx.send(status::Report::bound(&[api_pod(&server, "kube-system/etcd-node-1")])).unwrap();
    let before = version(&server, "kube-system/etcd-node-1");
    // The entry went with `Removed`; a resync only retries entries there are.
    barrier(&server, &tx, 2).await;
    assert_eq!(version(&server, "kube-system/etcd-node-1"), before, "the removed static pod's entry is gone");
    assert_ne!(mirror_phase(), "Running", "no status for the new mirror");
    sink.stop().await;
}

/// Reports that pile up while the sink is busy merge: each pod's latest status is patched once,
/// and none is lost.
#[tokio::test]
async fn statuses_heard_meanwhile_merge_into_one_patch_per_pod() {
    let server = ApiServer::start().await;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..20 {
        let name = format!("pod-{i}");
        server.put_pod(json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}));
        let pod = api_pod(&server, &format!("default/{name}"));
        // Five statuses of each pod, in order, before the sink starts: only the last counts.
        for step in 0..5 {
            let mut status = running(if step % 2 == 0 { "True" } else { "False" });
            status.message = Some(format!("step {step}"));
            tx.send(status::Report::Status(status::Change::new(&pod, status))).unwrap();
        }
    }
    let sink = Sink::start(&server, rx, Duration::from_secs(3600), status::SENDS_IN_FLIGHT).await;
    for i in 0..20 {
        let key = format!("default/pod-{i}");
        for _ in 0..200 {
            if server.objects.lock().unwrap().pods[&key]["status"]["message"] == "step 4" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let pod = server.objects.lock().unwrap().pods[&key].clone();
        assert_eq!(pod["status"]["message"], "step 4", "{pod}");
        assert_eq!(pod["status"]["conditions"][0]["status"], "True", "{pod}");
    }
    assert_eq!(server.requests("PATCH pods/status"), 20, "one patch per pod");
    sink.stop().await;
}

/// A pod the API pod source has shown is patched against that copy, with no read first; the
/// copy the patch's answer gives serves the next one. A copy that is stale by then (another
/// writer changed the pod) is refused by the API server, and the sink reads the pod and patches
/// again, keeping the other writer's condition. A field of the kubelet's that another writer
/// changed is set back once the API pod source shows it.
#[tokio::test]
async fn statuses_are_patched_against_the_watched_copy_and_a_stale_copy_is_read_again() {
    let server = ApiServer::start().await;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let sink = Sink::start(&server, rx, Duration::from_secs(3600), status::SENDS_IN_FLIGHT).await;
    server.put_pod(json!({"metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}));
    let web = api_pod(&server, "default/web");
    let ready = |s: &serde_json::Value, want: &str| {
        s["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == want))
    };

    tx.send(status::Report::bound(std::slice::from_ref(&web))).unwrap();
    tx.send(status::Report::Status(status::Change::new(&web, running("True")))).unwrap();
    until(&server, "Ready", |s| ready(s, "True")).await;
    tx.send(status::Report::Status(status::Change::new(&web, running("False")))).unwrap();
    until(&server, "not Ready", |s| ready(s, "False")).await;
    assert_eq!((server.requests("GET pods"), server.requests("PATCH pods/status")), (0, 2), "no read before a patch");

    // Another writer adds its condition; the sink's copy is stale.
    let pods: kube::Api<Pod> = kube::Api::namespaced(sink.client.clone(), "default");
    let gate = json!({"status": {"conditions": [{"type": "example.com/gate", "status": "True"}]}});
    let params = kube::api::PatchParams::default();
    pods.patch_status("web", &params, &kube::api::Patch::Strategic(gate)).await.unwrap();
    tx.send(status::Report::Status(status::Change::new(&web, running("True")))).unwrap();
    until(&server, "Ready again", |s| ready(s, "True")).await;
    assert_eq!(server.requests("GET pods"), 1, "the stale copy was refused and the pod read");
    assert_eq!(server.requests("PATCH pods/status"), 5, "ours refused, then sent again; the gate's");
    until(&server, "the gate kept", |s| {
        s["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "example.com/gate"))
    })
    .await;

    // Another writer says not Ready: once the API pod source shows it, the kubelet's status goes again.
    let unready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    pods.patch_status("web", &params, &kube::api::Patch::Strategic(unready)).await.unwrap();
    tx.send(status::Report::bound(&[api_pod(&server, "default/web")])).unwrap();
    until(&server, "Ready set back", |s| ready(s, "True")).await;

    sink.stop().await;
}

/// An API server that stores a status other than the one patched (here an older one, which
/// drops `hostIPs`) is patched once per status: the pod's deletion asked for, which shows the
/// sink a later copy of the pod and the kubelet's status again, patches nothing; a change of the
/// kubelet's status still goes.
#[tokio::test]
async fn a_status_the_api_stores_otherwise_is_not_patched_again_when_nothing_changed() {
    let server = ApiServer::start().await;
    server.objects.lock().unwrap().unknown_status_fields = vec!["hostIPs"];
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let sink = Sink::start(&server, rx, Duration::from_secs(3600), 1).await;
    server.put_pod(json!({"metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}));
    let web = api_pod(&server, "default/web");
    let with_host_ips = |ready: &str| PodStatus {
        host_ip: Some("192.0.2.2".into()),
        host_ips: Some(vec![k8s_openapi::api::core::v1::HostIP { ip: "192.0.2.2".into() }]),
        ..running(ready)
    };
    tx.send(status::Report::bound(std::slice::from_ref(&web))).unwrap();
    tx.send(status::Report::Status(status::Change::new(&web, with_host_ips("True")))).unwrap();
    wait_for_ready(&server, "default/web", "True").await;
    assert_eq!(server.requests("PATCH pods/status"), 1);
    assert!(server.objects.lock().unwrap().pods["default/web"]["status"].get("hostIPs").is_none());

    // The deletion is asked for: the API pod source shows the new copy, and the kubelet sets
    // its unchanged status again, as it does for a pod being deleted.
    server.request_deletion("default", "web", 30);
    tx.send(status::Report::bound(&[api_pod(&server, "default/web")])).unwrap();
    tx.send(status::Report::Status(status::Change::new(&web, with_host_ips("True")))).unwrap();
    barrier(&server, &tx, 1).await;
    assert_eq!(server.requests("PATCH pods/status"), 1 + 2, "web's status is not patched again (the barrier's two)");

    tx.send(status::Report::Status(status::Change::new(&web, with_host_ips("False")))).unwrap();
    wait_for_ready(&server, "default/web", "False").await;
    assert_eq!(server.requests("PATCH pods/status"), 1 + 2 + 1, "a change goes");
    sink.stop().await;
}

/// One pod's slow patch holds up no other pod's status, and a status heard while the pod's last
/// one is being sent goes after it, however that send ends.
#[tokio::test]
async fn a_slow_patch_holds_up_no_other_pod_and_a_status_heard_during_it_follows() {
    let server = ApiServer::start().await;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let sink = Sink::start(&server, rx, Duration::from_secs(3600), status::SENDS_IN_FLIGHT).await;
    for name in ["slow", "quick"] {
        server.put_pod(json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}));
    }
    let (slow, quick) = (api_pod(&server, "default/slow"), api_pod(&server, "default/quick"));
    server.hold_status_patches("default", "slow");
    tx.send(status::Report::Status(status::Change::new(&slow, running("True")))).unwrap();
    for _ in 0..200 {
        if server.requests("PATCH pods/status") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.requests("PATCH pods/status"), 1, "slow's patch is at the server, unanswered");

    tx.send(status::Report::Status(status::Change::new(&slow, running("False")))).unwrap();
    tx.send(status::Report::Status(status::Change::new(&quick, running("True")))).unwrap();
    wait_for_ready(&server, "default/quick", "True").await;
    assert!(server.objects.lock().unwrap().pods["default/slow"]["status"].get("conditions").is_none(), "still held");

    server.release_status_patches("default", "slow");
    wait_for_ready(&server, "default/slow", "False").await;
    assert_eq!(server.requests("PATCH pods/status"), 3, "slow's two statuses and quick's, each once");
    sink.stop().await;
}
