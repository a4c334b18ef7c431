//! Cluster mode (`--kubeconfig`) end to end: the whole binary against the in-process API server
//! of `kubelet-apiserver`, on the in-memory runtime and (`real_` test) on the real containerd.
//!
//! One scenario: the node registers and renews its lease; a pod bound to it runs and its status
//! reaches the API; a static pod gets a mirror pod, recreated after its deletion and carrying
//! the static pod's status; an API server restart with a compacted history (410) duplicates
//! nothing; a graceful deletion ends with the pod gone from the API and the runtime, also when
//! it was asked for while the agent was down; a removed static pod takes its mirror with it.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::{path::Path, process::Child, time::Duration};

use apiserver::testing::ApiServer;
use kubelet_core::testing::RealRuntime;
use serde_json::{Value, json};

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (at most 30 s) until `probe` on the server's objects gives something.
async fn until<T>(
    server: &ApiServer,
    dir: &Path,
    what: &str,
    probe: impl Fn(&apiserver::testing::Objects) -> Option<T>,
) -> T {
    for _ in 0..300 {
        if let Some(found) = probe(&server.objects.lock().unwrap()) {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let pods = server.objects.lock().unwrap().pods.clone();
    let (events, requests) = {
        let o = server.objects.lock().unwrap();
        (o.events.clone(), o.requests.clone())
    };
    panic!(
        "timed out waiting for {what}; pods: {pods:#?}\nevents: {events:#?}\nrequests: {requests:?}\nagent log:\n{log}"
    );
}

fn bound_pod(name: &str, node: &str, image: &str) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "nodeName": node, "restartPolicy": "Always", "dnsPolicy": "Default", "terminationGracePeriodSeconds": 2,
            "schedulerName": "default-scheduler", "enableServiceLinks": false,
            "containers": [{"name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}],
        },
        "status": {"phase": "Pending"},
    });
    pod["spec"]["volumes"] =
        json!([{"name": "cfg", "configMap": {"name": "app", "items": [{"key": "greeting", "path": "greeting"}]}}]);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([{"name": "cfg", "mountPath": "/etc/app"}]);
    pod
}

/// The pod's service account token, its cluster's CA and its namespace, as the API server's
/// admission adds them to every pod (`kube-api-access-*`).
fn with_api_access(mut pod: Value) -> Value {
    pod["spec"]["volumes"].as_array_mut().unwrap().push(json!({"name": "kube-api-access-abcde", "projected": {
        "defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}, "path": "namespace"}]}},
        ]}}));
    pod["spec"]["containers"][0]["volumeMounts"].as_array_mut().unwrap().push(json!(
        {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}));
    pod["spec"]["serviceAccountName"] = json!("default");
    pod
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or_default()
}

/// The scenario on `endpoint`; `in_runtime` says whether the runtime still holds pod `uid`.
/// A real runtime (`real`) records the containers' events (`Pulled`, `Started`); the fake one does not.
async fn scenario(
    endpoint: &str,
    dir: &Path,
    node: &str,
    image: &str,
    real: bool,
    in_runtime: impl AsyncFn(&str) -> usize,
) {
    let server = ApiServer::start().await;
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    server.write_kubeconfig(&dir.join("kubeconfig")).unwrap();
    std::fs::write(
        dir.join("config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusUpdateFrequency: 1s\n\
         registerWithTaints: [{key: dedicated, value: edge, effect: NoSchedule}]\nsyncFrequency: 2s\n\
         nodeLeaseDurationSeconds: 4\n",
    )
    .unwrap();
    let manifest = dir.join("manifests/static.yaml");
    std::fs::write(
        &manifest,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: static}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {image}\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1; done\"]\n"
        ),
    )
    .unwrap();
    let start = || {
        let child = common::agent_command(endpoint, dir, node)
            .args(["--healthz-port", "0", "--node-labels", "role=edge"])
            .arg("--kubeconfig")
            .arg(dir.join("kubeconfig"))
            .arg("--config")
            .arg(dir.join("config.yaml"))
            .spawn()
            .unwrap();
        Agent(child)
    };
    let mut agent = start();

    // Registered with its labels and taints, Ready, its lease renewed.
    let registered = until(&server, dir, "the node to be Ready", |o| {
        let node = o.nodes.get(node)?;
        let ready =
            node["status"]["conditions"].as_array()?.iter().any(|c| c["type"] == "Ready" && c["status"] == "True");
        ready.then(|| node.clone())
    })
    .await;
    assert_eq!(registered["metadata"]["labels"]["role"], "edge");
    assert!(registered["metadata"]["labels"]["kubernetes.io/hostname"].as_str().is_some());
    assert_eq!(registered["spec"]["taints"][0]["key"], "dedicated");
    // A 4 s lease is renewed every second.
    until(&server, dir, "lease renewals", |o| {
        (o.requests.get("PUT leases").copied().unwrap_or_default() >= 3).then_some(())
    })
    .await;
    assert!(o_has_lease(&server, node), "the lease is the node's, in kube-node-lease");

    // A bound pod runs with its volumes from the API, and its status reaches the API.
    server.put_config_map("default", "app", json!({"greeting": "hello"}));
    server.put_config_map("default", "kube-root-ca.crt", json!({"ca.crt": "CA"}));
    // The projected token volume is a tmpfs: only the real (root) run has it.
    server.put_pod(if real { with_api_access(bound_pod("web", node, image)) } else { bound_pod("web", node, image) });
    let web = until(&server, dir, "web to be Running and ready", |o| {
        let pod = o.pods.get("default/web")?;
        (phase(pod) == "Running" && pod["status"]["containerStatuses"][0]["ready"] == true).then(|| pod.clone())
    })
    .await;
    let web_uid = web["metadata"]["uid"].as_str().unwrap().to_owned();
    let container = web["status"]["containerStatuses"][0]["containerID"].clone();
    assert!(container.as_str().is_some_and(|id| !id.is_empty()), "{web}");
    assert_eq!(in_runtime(&web_uid).await, 1, "one sandbox for the pod");
    let volumes = dir.join("root/pods").join(&web_uid).join("volumes");
    let greeting = volumes.join("kubernetes.io~configmap/cfg/greeting");
    assert_eq!(std::fs::read_to_string(&greeting).unwrap(), "hello");
    if real {
        let access = volumes.join("kubernetes.io~projected/kube-api-access-abcde");
        assert_eq!(std::fs::read_to_string(access.join("token")).unwrap(), "token-0-default-web");
        assert_eq!(std::fs::read_to_string(access.join("ca.crt")).unwrap(), "CA");
        assert_eq!(std::fs::read_to_string(access.join("namespace")).unwrap(), "default");
    }
    // A change of the config map reaches the volume at the pod's next sync.
    server.put_config_map("default", "app", json!({"greeting": "bye"}));
    for _ in 0..100 {
        if std::fs::read_to_string(&greeting).unwrap() == "bye" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(std::fs::read_to_string(&greeting).unwrap(), "bye", "the config map's change is in the volume");
    assert_eq!(server.requests("GET configmaps"), 0, "config maps are watched, not read at each sync");
    // The agent's events reach the API: the node's, and on a real runtime the pod's, by UID.
    until(&server, dir, "the node's and web's events", |o| {
        let about = |kind: &str, uid: &str, reason: &str| {
            o.events.values().any(|e| {
                e["involvedObject"]["kind"] == kind && e["involvedObject"]["uid"] == uid && e["reason"] == reason
            })
        };
        (about("Node", node, "NodeReady") && (!real || about("Pod", &web_uid, "Started"))).then_some(())
    })
    .await;

    // The static pod's mirror: created, with the static pod's status, recreated after deletion.
    let mirror_key = format!("default/static-{node}");
    let first = until(&server, dir, "the mirror pod with the static pod's status", |o| {
        let pod = o.pods.get(&mirror_key)?;
        (phase(pod) == "Running").then(|| pod.clone())
    })
    .await;
    assert!(first["metadata"]["annotations"]["kubernetes.io/config.mirror"].as_str().is_some(), "{first}");
    assert_eq!(first["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(first["metadata"]["ownerReferences"][0]["uid"], registered["metadata"]["uid"]);
    server.delete_pod("default", &format!("static-{node}"));
    until(&server, dir, "the mirror pod to be recreated", |o| {
        let pod = o.pods.get(&mirror_key)?;
        (pod["metadata"]["uid"] != first["metadata"]["uid"]).then_some(())
    })
    .await;

    // The API server restarts with its history compacted: the watch gets 410 and lists again,
    // and nothing is started twice.
    let lists = server.requests("LIST pods");
    server.restart_with(vec![bound_pod("late", node, image)]);
    until(&server, dir, "a pod bound after the 410 to run", |o| {
        (phase(o.pods.get("default/late")?) == "Running").then_some(())
    })
    .await;
    assert!(server.requests("LIST pods") > lists, "the watch got 410 and listed again");
    let web = server.objects.lock().unwrap().pods["default/web"].clone();
    assert_eq!(web["status"]["containerStatuses"][0]["containerID"], container, "web's container is the same one");
    assert_eq!(web["status"]["containerStatuses"][0]["restartCount"], 0);
    assert_eq!(in_runtime(&web_uid).await, 1, "still one sandbox for the pod");

    // A graceful deletion: the agent stops the pod, then deletes it from the API.
    server.request_deletion("default", "web", 10);
    until(&server, dir, "web to be gone from the API", |o| (!o.pods.contains_key("default/web")).then_some(())).await;
    assert!(server.requests("DELETE pods") >= 1);
    for _ in 0..100 {
        if in_runtime(&web_uid).await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(in_runtime(&web_uid).await, 0, "nothing of web runs");

    // A pod whose deletion is asked for while the agent is down is stopped and deleted after
    // its restart.
    let late_uid = server.objects.lock().unwrap().pods["default/late"]["metadata"]["uid"].as_str().unwrap().to_owned();
    drop(agent);
    server.request_deletion("default", "late", 10);
    agent = start();
    until(&server, dir, "late to be gone from the API after the restart", |o| {
        (!o.pods.contains_key("default/late")).then_some(())
    })
    .await;
    for _ in 0..100 {
        if in_runtime(&late_uid).await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(in_runtime(&late_uid).await, 0, "nothing of late runs");

    // A static pod removed from disk takes its mirror with it.
    std::fs::remove_file(&manifest).unwrap();
    until(&server, dir, "the mirror pod to go", |o| (!o.pods.contains_key(&mirror_key)).then_some(())).await;
    eprintln!("requests served: {:?}", server.objects.lock().unwrap().requests);
    drop(agent);
}

fn o_has_lease(server: &ApiServer, node: &str) -> bool {
    let objects = server.objects.lock().unwrap();
    objects
        .leases
        .get(&format!("kube-node-lease/{node}"))
        .is_some_and(|l| l["spec"]["holderIdentity"] == node && l["spec"]["leaseDurationSeconds"] == 4)
}

#[tokio::test]
async fn a_node_joins_runs_bound_pods_mirrors_static_ones_and_ends_deletions() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let in_runtime = async |uid: &str| {
        // The fake runtime is the agent's own: ask the agent through its socket.
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_kubelet-rs"))
            .args(["get", "pods", "-o", "json", "--root-dir"])
            .arg(&root)
            .output()
            .unwrap();
        let pods: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        let running = pods["items"].as_array().into_iter().flatten().filter(|p| {
            p["metadata"]["uid"] == uid && p["status"]["containerStatuses"][0]["state"]["running"].is_object()
        });
        running.count()
    };
    scenario("fake://", dir.path(), "node-fake", "busybox", false, in_runtime).await;
}

#[tokio::test]
async fn real_cluster_mode_against_the_in_process_api_server() {
    let Some(rt) = RealRuntime::from_env("real_cluster_mode_against_the_in_process_api_server") else { return };
    let pid = std::process::id();
    let dir = rt.scratch_dir.join(format!("cluster-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let node = format!("cluster-{pid}");
    let client = cri_client::Client::connect(&cri_client::Config::new(&rt.endpoint)).unwrap();
    let in_runtime = async |uid: &str| {
        let filter = cri_client::pb::PodSandboxFilter {
            label_selector: [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into(),
            state: Some(cri_client::pb::PodSandboxStateValue {
                state: cri_client::pb::PodSandboxState::SandboxReady.into(),
            }),
            ..Default::default()
        };
        let request = cri_client::pb::ListPodSandboxRequest { filter: Some(filter) };
        client.runtime_service().list_pod_sandbox(request).await.unwrap().into_inner().items.len()
    };
    scenario(&rt.endpoint, &dir, &node, &rt.busybox_image, true, in_runtime).await;
}
