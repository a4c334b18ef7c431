//! Cluster mode (`--kubeconfig`) end to end: the whole binary against the in-process API server
//! of `kubelet-cluster`, on the in-memory runtime and (`real_` tests) on the real containerd,
//! and against upstream's kube-apiserver with the node's own credentials when `cargo xtask
//! cluster up` runs one (`KUBELET_RS_TEST_KUBECONFIG`).
//!
//! One scenario: the node registers and renews its lease; a pod bound to it runs with its
//! config map and service account token volumes and its status reaches the API; a config map
//! change reaches the volume; a static pod gets a mirror pod, recreated after its deletion and
//! carrying the static pod's status; an API server restart with a compacted history (410)
//! duplicates nothing (in-process server only); a graceful deletion ends with the pod gone
//! from the API and the runtime, also when it was asked for while the agent was down; a removed
//! static pod takes its mirror with it.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Child,
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Event as CoreEvent, Namespace, Node, Pod, Secret, Service},
    node::v1::RuntimeClass,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use kubelet_cluster::testing::ApiServer;
use kubelet_core::{
    eviction::{Resource, format_amount},
    runtime::Runtime as _,
    testing::RealRuntime,
};
use serde_json::{Value, json};

/// An agent process, and the port of its kubelet API.
struct Agent(Child, u16);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Agent {
    /// Starts the agent as node `node` of the cluster `kubeconfig` names, with its configuration
    /// file at `dir/config.yaml` and `extra` flags, its health port off and its kubelet API on a
    /// free port (which the Node reports).
    fn join(endpoint: &str, dir: &Path, node: &str, kubeconfig: &Path, extra: &[&str]) -> Agent {
        let port = common::free_port();
        let child = common::agent_command(endpoint, dir, node)
            .args(["--healthz-port", "0"])
            .args(["--port", &port.to_string()])
            .args(extra)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--config")
            .arg(dir.join("config.yaml"))
            .spawn()
            .unwrap();
        Agent(child, port)
    }
}

/// What the scenario reads of the cluster at one moment.
#[derive(Debug, Default)]
struct View {
    /// The scenario's node, if registered, by name.
    nodes: BTreeMap<String, Value>,
    /// Pods of the scenario's namespace by `namespace/name`.
    pods: BTreeMap<String, Value>,
    /// The node's lease by `kube-node-lease/name`.
    leases: BTreeMap<String, Value>,
    /// The node's events and those of the scenario's namespace.
    events: Vec<Value>,
}

/// The cluster the scenario drives: the in-process API server, or the real one that
/// `KUBELET_RS_TEST_KUBECONFIG` names (in a namespace of its own, removed afterwards), which the
/// agent joins with the node's own credentials (`node_kubeconfig`).
enum Cluster {
    Local(ApiServer),
    /// A kube-apiserver, of Kubernetes 1.`minor`.
    Remote {
        client: kube::Client,
        node_kubeconfig: PathBuf,
        namespace: String,
        minor: u32,
    },
}

impl Cluster {
    /// Whether the API server keeps `what`, new in Kubernetes 1.`since`: the in-process one keeps
    /// every field; an older kube-apiserver drops it, and `test` records that it did not check
    /// it there (CI's summary names it).
    fn serves(&self, test: &str, what: &str, since: u32) -> bool {
        match self {
            Cluster::Local(_) => true,
            Cluster::Remote { minor, .. } if *minor >= since => true,
            Cluster::Remote { minor, .. } => {
                let why = format!("kube-apiserver v1.{minor} predates it (v1.{since})");
                kubelet_core::testing::not_checked(test, what, &why);
                false
            }
        }
    }

    /// The namespace the scenario's pods and config maps live in.
    fn namespace(&self) -> &str {
        match self {
            Cluster::Local(_) => "default",
            Cluster::Remote { namespace, .. } => namespace,
        }
    }

    /// The kubeconfig the agent is given.
    fn kubeconfig(&self, dir: &Path) -> PathBuf {
        match self {
            Cluster::Local(server) => {
                let path = dir.join("kubeconfig");
                server.write_kubeconfig(&path).unwrap();
                path
            }
            Cluster::Remote { node_kubeconfig, .. } => node_kubeconfig.clone(),
        }
    }

    async fn view(&self, node: &str) -> View {
        let ns = self.namespace();
        match self {
            Cluster::Local(server) => {
                let o = server.objects.lock().unwrap();
                View {
                    nodes: o.nodes.clone(),
                    pods: o.pods.clone(),
                    leases: o.leases.clone(),
                    events: o.events.values().cloned().collect(),
                }
            }
            Cluster::Remote { client, .. } => {
                let mut view = View::default();
                if let Some(n) = Api::<Node>::all(client.clone()).get_opt(node).await.unwrap() {
                    view.nodes.insert(node.to_owned(), json_of(&n));
                }
                let leases = Api::<Lease>::namespaced(client.clone(), "kube-node-lease");
                if let Some(l) = leases.get_opt(node).await.unwrap() {
                    view.leases.insert(format!("kube-node-lease/{node}"), json_of(&l));
                }
                for pod in Api::<Pod>::namespaced(client.clone(), ns).list(&ListParams::default()).await.unwrap() {
                    view.pods.insert(format!("{ns}/{}", pod.metadata.name.clone().unwrap_or_default()), json_of(&pod));
                }
                let about_node = ListParams::default().fields(&format!("involvedObject.name={node}"));
                for (namespace, params) in [("default", about_node), (ns, ListParams::default())] {
                    let events = Api::<CoreEvent>::namespaced(client.clone(), namespace);
                    view.events.extend(events.list(&params).await.unwrap().items.iter().map(json_of));
                }
                view
            }
        }
    }

    /// Creates pod `pod` (bound to the node by its `spec.nodeName`), in the scenario's namespace.
    async fn create_pod(&self, mut pod: Value) {
        pod["metadata"]["namespace"] = json!(self.namespace());
        match self {
            Cluster::Local(server) => server.put_pod(pod),
            Cluster::Remote { client, namespace, .. } => {
                let pod: Pod = serde_json::from_value(pod).unwrap();
                let pods = Api::<Pod>::namespaced(client.clone(), namespace);
                // A new namespace gets its `default` service account a moment after it is made.
                for attempt in 0.. {
                    match pods.create(&PostParams::default(), &pod).await {
                        Ok(_) => break,
                        Err(e) if attempt < 50 => eprintln!("creating the pod again: {e}"),
                        Err(e) => panic!("cannot create the pod: {e}"),
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Creates node `node` as an administrator would, for an agent that does not register it.
    async fn create_node(&self, node: Value) {
        match self {
            Cluster::Local(server) => server.put_node(node),
            Cluster::Remote { client, .. } => {
                let node: Node = serde_json::from_value(node).unwrap();
                Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap();
            }
        }
    }

    /// Creates or replaces config map `name` of the scenario's namespace with `data`.
    async fn put_config_map(&self, name: &str, data: Value) {
        match self {
            Cluster::Local(server) => server.put_config_map("default", name, data),
            Cluster::Remote { client, namespace, .. } => {
                let map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data});
                let params = PatchParams::apply("kubelet-rs-test").force();
                let maps = Api::<ConfigMap>::namespaced(client.clone(), namespace);
                maps.patch(name, &params, &Patch::Apply(map)).await.unwrap();
            }
        }
    }

    /// Creates or replaces secret `name` of the scenario's namespace with `data`.
    async fn put_secret(&self, name: &str, data: &[(&str, &[u8])]) {
        match self {
            Cluster::Local(server) => server.put_secret("default", name, data),
            Cluster::Remote { client, namespace, .. } => {
                let encoded: serde_json::Map<String, Value> =
                    data.iter().map(|(k, v)| ((*k).to_owned(), json!(k8s_openapi::ByteString(v.to_vec())))).collect();
                let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded});
                let params = PatchParams::apply("kubelet-rs-test").force();
                let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
                secrets.patch(name, &params, &Patch::Apply(secret)).await.unwrap();
            }
        }
    }

    /// Creates service `name` of the scenario's namespace with one TCP port `port` named
    /// `port_name`; the in-process server gives it `local_ip`, kube-apiserver one of its range.
    /// In the in-process server it also makes `kubernetes` of `default`, as kube-apiserver does.
    async fn put_service(&self, name: &str, port_name: &str, port: u16, local_ip: &str) {
        let ports = json!([{"name": port_name, "port": port, "protocol": "TCP"}]);
        match self {
            Cluster::Local(server) => {
                let https = json!([{"name": "https", "port": 443, "protocol": "TCP"}]);
                server.put_service("default", "kubernetes", json!({"clusterIP": "10.96.0.1", "ports": https}));
                server.put_service("default", name, json!({"clusterIP": local_ip, "ports": ports}));
            }
            Cluster::Remote { client, namespace, .. } => {
                let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                    "spec": {"ports": ports, "selector": {"app": name}}});
                let params = PatchParams::apply("kubelet-rs-test").force();
                let services = Api::<Service>::namespaced(client.clone(), namespace);
                services.patch(name, &params, &Patch::Apply(service)).await.unwrap();
            }
        }
    }

    /// Service `namespace/name`'s cluster IP and first port, as the API server holds them.
    async fn service_address(&self, namespace: &str, name: &str) -> (String, i32) {
        let service: Service = match self {
            Cluster::Local(server) => {
                let o = server.objects.lock().unwrap();
                serde_json::from_value(o.objects[&format!("services/{namespace}/{name}")].clone()).unwrap()
            }
            Cluster::Remote { client, .. } => {
                Api::<Service>::namespaced(client.clone(), namespace).get(name).await.unwrap()
            }
        };
        let spec = service.spec.unwrap();
        (spec.cluster_ip.unwrap(), spec.ports.unwrap()[0].port)
    }

    /// Sets label `key` of pod `name` to `value`.
    async fn label_pod(&self, name: &str, key: &str, value: &str) {
        match self {
            Cluster::Local(server) => {
                let mut pod = server.objects.lock().unwrap().pods[&format!("default/{name}")].clone();
                pod["metadata"]["labels"][key] = json!(value);
                server.put_pod(pod);
            }
            Cluster::Remote { client, namespace, .. } => {
                let patch = Patch::Merge(json!({"metadata": {"labels": {key: value}}}));
                Api::<Pod>::namespaced(client.clone(), namespace)
                    .patch(name, &PatchParams::default(), &patch)
                    .await
                    .unwrap();
            }
        }
    }

    /// Sets condition `kind` of pod `name`'s status to `status`, as the controller of a readiness
    /// gate does: a strategic merge patch of the status, which merges conditions by type.
    async fn set_pod_condition(&self, name: &str, kind: &str, status: &str) {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let patch = json!({"status": {"conditions": [{"type": kind, "status": status, "lastTransitionTime": now}]}});
        match self {
            Cluster::Local(server) => {
                let mut pod = server.objects.lock().unwrap().pods[&format!("default/{name}")].clone();
                kubelet_cluster::testing::strategic_merge(&mut pod, &patch);
                server.put_pod(pod);
            }
            Cluster::Remote { client, namespace, .. } => {
                Api::<Pod>::namespaced(client.clone(), namespace)
                    .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await
                    .unwrap();
            }
        }
    }

    /// Creates runtime class `name` with `handler` and `overhead` (its `podFixed`), replacing
    /// one an earlier run left (runtime classes belong to no namespace).
    async fn put_runtime_class(&self, name: &str, handler: &str, overhead: Value) {
        let Cluster::Remote { client, .. } = self else { panic!("the in-process API server has no runtime classes") };
        let class = json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
            "handler": handler, "overhead": {"podFixed": overhead}});
        let params = PatchParams::apply("kubelet-rs-test").force();
        Api::<RuntimeClass>::all(client.clone()).patch(name, &params, &Patch::Apply(class)).await.unwrap();
    }

    /// Deletes runtime class `name`, if it exists.
    async fn delete_runtime_class(&self, name: &str) {
        let Cluster::Remote { client, .. } = self else { return };
        let _ = Api::<RuntimeClass>::all(client.clone()).delete(name, &DeleteParams::default()).await;
    }

    /// Asks for the deletion of pod `name` with `grace` seconds (0: gone at once).
    async fn delete_pod(&self, name: &str, grace: u32) {
        match self {
            Cluster::Local(server) if grace == 0 => server.delete_pod("default", name),
            Cluster::Local(server) => server.request_deletion("default", name, i64::from(grace)),
            Cluster::Remote { client, namespace, .. } => {
                let params = DeleteParams { grace_period_seconds: Some(grace), ..DeleteParams::default() };
                Api::<Pod>::namespaced(client.clone(), namespace).delete(name, &params).await.unwrap();
            }
        }
    }

    /// The in-process server, whose requests the scenario can count and which it can restart.
    fn local(&self) -> Option<&ApiServer> {
        match self {
            Cluster::Local(server) => Some(server),
            Cluster::Remote { .. } => None,
        }
    }

    /// Removes what the scenario left in a real cluster: its namespace and its node.
    async fn clean_up(&self, node: &str) {
        if let Cluster::Remote { client, namespace, .. } = self {
            // No namespace controller runs here, so the namespace's pods would outlive it, still
            // bound to a node name the next scenario reuses: they go first, at once.
            let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
            let pods = Api::<Pod>::namespaced(client.clone(), namespace);
            let _ = pods.delete_collection(&now, &ListParams::default()).await;
            let _ = Api::<Namespace>::all(client.clone()).delete(namespace, &DeleteParams::default()).await;
            forget_node(client, node).await;
        }
    }
}

/// Deletes node `node` and its lease, which the garbage collector (not running here) would delete
/// with the node.
async fn forget_node(client: &kube::Client, node: &str) {
    let _ = Api::<Node>::all(client.clone()).delete(node, &DeleteParams::default()).await;
    let _ = Api::<Lease>::namespaced(client.clone(), "kube-node-lease").delete(node, &DeleteParams::default()).await;
}

/// An object as the JSON the scenario reads.
fn json_of(object: &impl serde::Serialize) -> Value {
    serde_json::to_value(object).unwrap()
}

/// Waits (at most 60 s) until `probe` on the cluster's view gives something.
async fn until<T>(cluster: &Cluster, node: &str, dir: &Path, what: &str, probe: impl Fn(&View) -> Option<T>) -> T {
    until_within(Duration::from_secs(60), cluster, node, dir, what, probe).await
}

/// Waits at most `limit` until `probe` on the cluster's view gives something.
async fn until_within<T>(
    limit: Duration,
    cluster: &Cluster,
    node: &str,
    dir: &Path,
    what: &str,
    probe: impl Fn(&View) -> Option<T>,
) -> T {
    let mut view = View::default();
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        view = cluster.view(node).await;
        if let Some(found) = probe(&view) {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let requests = cluster.local().map(|s| s.objects.lock().unwrap().requests.clone());
    panic!(
        "timed out waiting for {what}; pods: {:#?}\nevents: {:#?}\nrequests: {requests:?}\nagent log:\n{log}",
        view.pods, view.events
    );
}

fn bound_pod(name: &str, node: &str, image: &str) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "nodeName": node, "restartPolicy": "Always", "dnsPolicy": "Default", "terminationGracePeriodSeconds": 2,
            "schedulerName": "default-scheduler", "enableServiceLinks": true,
            "containers": [{"name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "echo \"env: $CFG_greeting $GREETING $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT $CACHE_SERVICE_HOST:$CACHE_SERVICE_PORT_REDIS $CACHE_PORT\"; trap 'exit 0' TERM; while true; do sleep 1; done"],
                "envFrom": [{"configMapRef": {"name": "app"}, "prefix": "CFG_"}],
                "env": [{"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "greeting"}}}],
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

/// The scenario on `endpoint` against `cluster`; `in_runtime` counts the ready sandboxes of pod
/// `uid` as the runtime itself says, or is `None` where the test cannot ask the runtime apart
/// from the agent (the fake runtime lives in the agent, so only the API's view is checked). A
/// real runtime (`real`) records the containers' events (`Pulled`, `Started`); the fake one does
/// not.
async fn scenario(
    cluster: &Cluster,
    endpoint: &str,
    dir: &Path,
    node: &str,
    image: &str,
    real: bool,
    in_runtime: impl AsyncFn(&str) -> Option<usize>,
) {
    let ns = cluster.namespace();
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    let kubeconfig = cluster.kubeconfig(dir);
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
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: static, namespace: {ns}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {image}\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1; done\"]\n"
        ),
    )
    .unwrap();
    let start = || Agent::join(endpoint, dir, node, &kubeconfig, &["--node-labels", "role=edge"]);
    let mut agent = start();
    let until = async |what: &str, probe: &dyn Fn(&View) -> Option<Value>| until(cluster, node, dir, what, probe).await;

    // Registered with its labels and taints, Ready, its lease renewed.
    let registered = until("the node to be Ready", &|v| {
        let node = v.nodes.get(node)?;
        let ready =
            node["status"]["conditions"].as_array()?.iter().any(|c| c["type"] == "Ready" && c["status"] == "True");
        ready.then(|| node.clone())
    })
    .await;
    assert_eq!(registered["metadata"]["labels"]["role"], "edge");
    // As upstream's: the host name label is the node's name, `--hostname-override` here.
    assert_eq!(registered["metadata"]["labels"]["kubernetes.io/hostname"], node);
    let addresses = registered["status"]["addresses"].as_array().unwrap();
    assert!(addresses.iter().any(|a| a["type"] == "Hostname" && a["address"] == node), "{addresses:?}");
    assert_eq!(registered["spec"]["taints"][0]["key"], "dedicated");
    // Created with its status, as upstream's initialNode: kube-apiserver's managed fields give the
    // status reports only what they changed, and the capacity was not among it.
    let test = "real_cluster_mode_against_kube_apiserver";
    if matches!(cluster, Cluster::Remote { .. }) {
        assert!(registered["status"]["capacity"]["cpu"].is_string(), "{registered}");
    }
    if matches!(cluster, Cluster::Remote { .. }) && cluster.serves(test, "the status report's managed fields", 22) {
        let fields = registered["metadata"]["managedFields"].as_array().expect("kube-apiserver's managed fields");
        let reports = fields.iter().find(|f| f["subresource"] == "status").expect("a status report");
        assert!(reports["fieldsV1"]["f:status"]["f:capacity"].is_null(), "set by the create: {fields:?}");
    }
    // A 4 s lease, the node's, in kube-node-lease, renewed every second.
    let lease_key = format!("kube-node-lease/{node}");
    let renewals = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let lease = until("three lease renewals", &|v| {
        let lease = v.leases.get(&lease_key)?;
        let mut seen = renewals.lock().unwrap();
        seen.insert(lease["spec"]["renewTime"].as_str()?.to_owned());
        (seen.len() >= 3).then(|| lease.clone())
    })
    .await;
    assert_eq!(lease["spec"]["holderIdentity"], node, "{lease}");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 4, "{lease}");

    // A bound pod runs with its volumes from the API, and its status reaches the API.
    cluster.put_config_map("app", json!({"greeting": "hello"})).await;
    cluster.put_service("cache", "redis", 6379, "10.96.0.20").await;
    if let Some(server) = cluster.local() {
        server.put_config_map("default", "kube-root-ca.crt", json!({"ca.crt": "CA"}));
    }
    // The projected token volume is a tmpfs: only the real (root) run has it.
    cluster
        .create_pod(if real { with_api_access(bound_pod("web", node, image)) } else { bound_pod("web", node, image) })
        .await;
    let web_key = format!("{ns}/web");
    let web = until("web to be Running and ready", &|v| {
        let pod = v.pods.get(&web_key)?;
        (phase(pod) == "Running" && pod["status"]["containerStatuses"][0]["ready"] == true).then(|| pod.clone())
    })
    .await;
    let web_uid = web["metadata"]["uid"].as_str().unwrap().to_owned();
    // The pod runs on the node's IP, the one the Node reports.
    let internal_ip = addresses.iter().find(|a| a["type"] == "InternalIP").map(|a| a["address"].clone());
    assert!(internal_ip.as_ref().is_some_and(|ip| ip.as_str().is_some_and(|ip| !ip.is_empty())), "{addresses:?}");
    assert_eq!(Some(&web["status"]["hostIP"]), internal_ip.as_ref(), "{web}");
    if cluster.serves(test, "status.hostIPs", 28) {
        assert_eq!(web["status"]["hostIPs"][0]["ip"], web["status"]["hostIP"], "{web}");
    }
    // Ready now: the reason it was not ready is gone, not merged into the new condition.
    let ready = web["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap();
    assert_eq!((ready["status"].as_str(), ready.get("reason")), (Some("True"), None), "{web}");
    let container = web["status"]["containerStatuses"][0]["containerID"].clone();
    assert!(container.as_str().is_some_and(|id| !id.is_empty()), "{web}");
    if let Some(sandboxes) = in_runtime(&web_uid).await {
        assert_eq!(sandboxes, 1, "one sandbox for the pod");
    }
    let volumes = dir.join("root/pods").join(&web_uid).join("volumes");
    let greeting = volumes.join("kubernetes.io~configmap/cfg/greeting");
    assert_eq!(std::fs::read_to_string(&greeting).unwrap(), "hello");
    if real {
        // The config map reaches the environment too, through envFrom and configMapKeyRef, and
        // so do the service variables: the API server's, and with enableServiceLinks the
        // namespace's.
        let log = dir.join("pods").join(format!("{ns}_web_{web_uid}")).join("app/0.log");
        let said = wait_for_text(&log, "env: ").await;
        let (api_ip, api_port) = cluster.service_address("default", "kubernetes").await;
        let (cache_ip, _) = cluster.service_address(ns, "cache").await;
        let expected = format!("env: hello hello {api_ip}:{api_port} {cache_ip}:6379 tcp://{cache_ip}:6379");
        assert!(said.ends_with(&expected), "web's first line: {said:?}, not {expected:?}");
    }
    if real {
        let access = volumes.join("kubernetes.io~projected/kube-api-access-abcde");
        let read = |file: &str| std::fs::read_to_string(access.join(file)).unwrap();
        match cluster.local() {
            Some(_) => {
                assert_eq!(read("token"), "token-0-default-web");
                assert_eq!(read("ca.crt"), "CA");
            }
            None => {
                assert_eq!(read("token").split('.').count(), 3, "a JWT from the TokenRequest API");
                assert!(read("ca.crt").contains("BEGIN CERTIFICATE"), "the cluster's CA");
            }
        }
        assert_eq!(read("namespace"), ns);
    }
    // A change of the config map reaches the volume at the pod's next sync.
    cluster.put_config_map("app", json!({"greeting": "bye"})).await;
    for _ in 0..100 {
        if std::fs::read_to_string(&greeting).unwrap() == "bye" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(std::fs::read_to_string(&greeting).unwrap(), "bye", "the config map's change is in the volume");
    if let Some(server) = cluster.local() {
        assert_eq!(server.requests("GET configmaps"), 0, "config maps are watched, not read at each sync");
    }
    // The agent's events reach the API: the node's, and on a real runtime the pod's, by UID.
    until("the node's and web's events", &|v| {
        let about = |kind: &str, uid: &str, reason: &str| {
            v.events.iter().any(|e| {
                e["involvedObject"]["kind"] == kind && e["involvedObject"]["uid"] == uid && e["reason"] == reason
            })
        };
        (about("Node", node, "NodeReady") && (!real || about("Pod", &web_uid, "Started"))).then_some(Value::Null)
    })
    .await;

    // The static pod's mirror: created, with the static pod's status, recreated after deletion.
    let mirror_key = format!("{ns}/static-{node}");
    let first = until("the mirror pod with the static pod's status", &|v| {
        let pod = v.pods.get(&mirror_key)?;
        (phase(pod) == "Running").then(|| pod.clone())
    })
    .await;
    assert!(first["metadata"]["annotations"]["kubernetes.io/config.mirror"].as_str().is_some(), "{first}");
    assert_eq!(first["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(first["metadata"]["ownerReferences"][0]["uid"], registered["metadata"]["uid"]);
    cluster.delete_pod(&format!("static-{node}"), 0).await;
    until("the mirror pod to be recreated, with the static pod's status", &|v| {
        let pod = v.pods.get(&mirror_key)?;
        (pod["metadata"]["uid"] != first["metadata"]["uid"] && phase(pod) == "Running").then_some(Value::Null)
    })
    .await;

    // The API server restarts with its history compacted: the watch gets 410 and lists again,
    // and nothing is started twice. A real cluster cannot be restarted from here: the pod is
    // only bound.
    let late = bound_pod("late", node, image);
    match cluster.local() {
        Some(server) => {
            let lists = server.requests("LIST pods");
            server.restart_with(vec![late]);
            until("a pod bound after the 410 to run", &|v| {
                (phase(v.pods.get("default/late")?) == "Running").then_some(Value::Null)
            })
            .await;
            assert!(server.requests("LIST pods") > lists, "the watch got 410 and listed again");
        }
        None => {
            let (test, why) = ("real_cluster_mode_against_kube_apiserver", "kube-apiserver is not restarted here");
            kubelet_core::testing::not_checked(test, "a 410 after a restart with a compacted history", why);
            cluster.create_pod(late).await;
        }
    }
    let late_key = format!("{ns}/late");
    let late = until("late to run", &|v| {
        let pod = v.pods.get(&late_key)?;
        (phase(pod) == "Running").then(|| pod.clone())
    })
    .await;
    let web = cluster.view(node).await.pods[&web_key].clone();
    assert_eq!(web["status"]["containerStatuses"][0]["containerID"], container, "web's container is the same one");
    assert_eq!(web["status"]["containerStatuses"][0]["restartCount"], 0);
    if let Some(sandboxes) = in_runtime(&web_uid).await {
        assert_eq!(sandboxes, 1, "still one sandbox for the pod");
    }

    // Web's sandbox dies (the real runtime): the agent makes a new one, whose IP differs, and the
    // API server takes the status that says so. A patch that merged the new IP into the old
    // `podIPs` (two IPs of one family) is a 422 on a real API server.
    if real {
        let before = web["status"]["podIP"].as_str().unwrap().to_owned();
        stop_sandbox(endpoint, &web_uid).await;
        let after = until("web to run in a new sandbox, its new IP in the API", &|v| {
            let pod = v.pods.get(&web_key)?;
            let ip = pod["status"]["podIP"].as_str()?;
            let ready = pod["status"]["containerStatuses"][0]["ready"] == true;
            (ip != before && ready && phase(pod) == "Running").then(|| pod.clone())
        })
        .await;
        let ips: Vec<&Value> = after["status"]["podIPs"].as_array().unwrap().iter().collect();
        assert_eq!(ips.len(), 1, "one IP of the family, the new one: {after}");
        assert_eq!(ips[0]["ip"], after["status"]["podIP"], "{after}");
    }

    // A graceful deletion: the agent stops the pod, then deletes it from the API.
    cluster.delete_pod("web", 10).await;
    until("web to be gone from the API", &|v| (!v.pods.contains_key(&web_key)).then_some(Value::Null)).await;
    if let Some(server) = cluster.local() {
        assert!(server.requests("DELETE pods") >= 1);
    }
    gone_from_runtime(&in_runtime, &web_uid, "web").await;

    // A pod whose deletion is asked for while the agent is down is stopped and deleted after
    // its restart.
    let late_uid = late["metadata"]["uid"].as_str().unwrap().to_owned();
    drop(agent);
    cluster.delete_pod("late", 10).await;
    agent = start();
    until("late to be gone from the API after the restart", &|v| {
        (!v.pods.contains_key(&late_key)).then_some(Value::Null)
    })
    .await;
    gone_from_runtime(&in_runtime, &late_uid, "late").await;

    // A static pod removed from disk takes its mirror with it.
    std::fs::remove_file(&manifest).unwrap();
    until("the mirror pod to go", &|v| (!v.pods.contains_key(&mirror_key)).then_some(Value::Null)).await;
    if let Some(server) = cluster.local() {
        eprintln!("requests served: {:?}", server.objects.lock().unwrap().requests);
    }
    drop(agent);
}

#[tokio::test]
async fn a_node_that_does_not_register_reports_on_the_node_others_register() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("manifests")).unwrap();
    let cluster = Cluster::Local(ApiServer::start().await);
    report_on_a_node_registered_by_others(&cluster, "fake://", "busybox", dir.path(), "node-unregistered").await;
}

/// The same against kube-apiserver, with node `kubelet-rs-node-1`'s credentials (the Node
/// authorizer lets a node read and report on its own Node whoever created it).
#[tokio::test]
async fn real_a_node_that_does_not_register_reports_on_the_node_others_register_from_kube_apiserver() {
    let test = "real_a_node_that_does_not_register_reports_on_the_node_others_register_from_kube_apiserver";
    let scenario = async |rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String| {
        report_on_a_node_registered_by_others(&cluster, &rt.endpoint, &rt.busybox_image, &dir, &node).await;
    };
    on_node("kubelet-rs-node-1", test, "unregistered", None, scenario).await;
}

/// Upstream's `registerNode: false`: the agent creates no Node, and once others create it,
/// reports its status and renews its lease as for a Node it registered, leaving its labels as
/// they were; and admits pods against that Node's labels and taints.
async fn report_on_a_node_registered_by_others(cluster: &Cluster, endpoint: &str, image: &str, dir: &Path, node: &str) {
    std::fs::write(
        dir.join("config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nregisterNode: false\n\
         nodeStatusUpdateFrequency: 1s\n",
    )
    .unwrap();
    let agent = Agent::join(endpoint, dir, node, &cluster.kubeconfig(dir), &[]);
    let waiting = "registerNode is false and the node is not readable yet";
    let log = dir.join("agent.log");
    wait_for_text(&log, waiting).await;
    // The second attempt, 200 ms after the first, shows the agent still waits.
    for _ in 0..100 {
        if std::fs::read_to_string(&log).unwrap_or_default().matches(waiting).count() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(cluster.view(node).await.nodes.is_empty(), "the agent registered no Node");

    let labels = json!({"team": "storage"});
    let taints = json!([{"key": "dedicated", "value": "storage", "effect": "NoExecute"}]);
    cluster
        .create_node(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": labels},
            "spec": {"taints": taints}}))
        .await;
    let (reported, lease) = until(cluster, node, dir, "the node's status and lease", |v| {
        let reported = v.nodes.get(node)?;
        let ready = reported["status"]["conditions"].as_array()?.iter().any(|c| c["type"] == "Ready");
        let lease = v.leases.get(&format!("kube-node-lease/{node}"))?;
        (ready && lease["metadata"]["ownerReferences"].is_array()).then(|| (reported.clone(), lease.clone()))
    })
    .await;
    assert_eq!(reported["metadata"]["labels"], labels, "the kubelet's own labels are set only when it registers");
    assert!(
        reported["status"]["nodeInfo"]["kubeletVersion"].as_str().is_some_and(|v| v.starts_with('v')),
        "{reported}"
    );
    assert!(reported["status"]["capacity"]["cpu"].is_string(), "{reported}");
    assert_eq!(lease["metadata"]["ownerReferences"][0]["uid"], reported["metadata"]["uid"], "{lease}");
    assert_eq!(lease["spec"]["holderIdentity"], node, "{lease}");

    // Pods are admitted against the Node as the API server has it (upstream's node informer): a
    // pod selecting a label only the administrator set runs, and one that does not tolerate the
    // Node's NoExecute taint is refused.
    let pod = |name: &str, tolerations: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1, "nodeSelector": labels,
                "tolerations": tolerations,
                "containers": [{"name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]}]}})
    };
    let tolerates = json!([{"key": "dedicated", "operator": "Equal", "value": "storage", "effect": "NoExecute"}]);
    cluster.create_pod(pod("tolerant", tolerates)).await;
    cluster.create_pod(pod("intolerant", json!([]))).await;
    let key = |name: &str| format!("{}/{name}", cluster.namespace());
    let refused = until(cluster, node, dir, "the tolerant pod to run and the other to be refused", |v| {
        let tolerant = v.pods.get(&key("tolerant"))?;
        let intolerant = v.pods.get(&key("intolerant"))?;
        (phase(tolerant) == "Running" && phase(intolerant) == "Failed").then(|| intolerant["status"].clone())
    })
    .await;
    assert_eq!(refused["reason"], "TaintToleration", "{refused}");
    assert_eq!(
        refused["message"],
        "Pod was rejected: Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
    );
    drop(agent);
}

/// Waits (at most 10 s) for a line containing `text` in the file at `path`, and returns it.
async fn wait_for_text(path: &Path, text: &str) -> String {
    for _ in 0..100 {
        let content = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = content.lines().find(|l| l.contains(text)) {
            return line.to_owned();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no line with {text:?} in {} within 10 s", path.display());
}

/// Stops the ready sandbox of pod `uid` behind the agent's back, as a crash of it would.
async fn stop_sandbox(endpoint: &str, uid: &str) {
    use cri_client::pb;
    let client = cri_client::Client::connect(&cri_client::Config::new(endpoint)).unwrap();
    let ready_sandboxes = async || {
        let filter = pb::PodSandboxFilter {
            label_selector: [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into(),
            state: Some(pb::PodSandboxStateValue { state: pb::PodSandboxState::SandboxReady.into() }),
            ..Default::default()
        };
        let request = pb::ListPodSandboxRequest { filter: Some(filter) };
        client.runtime_service().list_pod_sandbox(request).await.unwrap().into_inner().items
    };
    let sandboxes = ready_sandboxes().await;
    assert_eq!(sandboxes.len(), 1, "one ready sandbox for {uid}");
    let stop = pb::StopPodSandboxRequest { pod_sandbox_id: sandboxes[0].id.clone() };
    // The runtime stops the sandbox's containers before it tears its network down, and the agent,
    // seeing them stop, stops the sandbox too: of two teardowns at once, containerd may fail one
    // ("failed to delete \"eth0\": no such device"). The sandbox has stopped either way.
    if let Err(status) = client.runtime_service().stop_pod_sandbox(stop).await {
        assert!(ready_sandboxes().await.is_empty(), "the sandbox of {uid} still runs: {status:?}");
    }
}

/// Waits (at most 10 s) until nothing of pod `uid` runs, where the runtime can be asked.
async fn gone_from_runtime(in_runtime: &impl AsyncFn(&str) -> Option<usize>, uid: &str, name: &str) {
    for _ in 0..100 {
        if in_runtime(uid).await.is_none_or(|sandboxes| sandboxes == 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} still runs");
}

#[tokio::test]
async fn a_node_joins_runs_bound_pods_mirrors_static_ones_and_ends_deletions() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::Local(ApiServer::start().await);
    // The fake runtime is the agent's own: no view of it but the agent's, so none is counted.
    let in_runtime = async |_: &str| None;
    scenario(&cluster, "fake://", dir.path(), "node-fake", "busybox", false, in_runtime).await;
}

/// The scenario on the real containerd against `cluster`, as node `node`.
async fn real_scenario(rt: &RealRuntime, cluster: Arc<Cluster>, node: &str) {
    let dir = rt.scratch_dir.join(format!("cluster-{node}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let body = {
        let (rt, cluster, dir, node) = (rt.clone(), cluster.clone(), dir.clone(), node.to_owned());
        async move {
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
                Some(client.runtime_service().list_pod_sandbox(request).await.unwrap().into_inner().items.len())
            };
            scenario(&cluster, &rt.endpoint, &dir, &node, &rt.busybox_image, true, in_runtime).await;
        }
    };
    run_and_clean_up(rt, &dir, &cluster, node, body).await;
}

#[tokio::test]
async fn real_cluster_mode_against_the_in_process_api_server() {
    let Some(rt) = RealRuntime::from_env("real_cluster_mode_against_the_in_process_api_server") else { return };
    let node = format!("cluster-{}", std::process::id());
    real_scenario(&rt, Arc::new(Cluster::Local(ApiServer::start().await)), &node).await;
}

/// The same scenario against a real kube-apiserver (`cargo xtask cluster up`, which `cargo xtask
/// ci` starts when it has the binary): `KUBELET_RS_TEST_KUBECONFIG` names an admin's kubeconfig,
/// which makes the namespace and what a controller-manager would put there; the agent joins as
/// `kubelet-rs-node-0` with that node's kubeconfig from `KUBELET_RS_TEST_NODE_KUBECONFIGS`, so
/// the Node authorizer and NodeRestriction judge every request it makes.
#[tokio::test]
async fn real_cluster_mode_against_kube_apiserver() {
    let test = "real_cluster_mode_against_kube_apiserver";
    let Some(rt) = RealRuntime::from_env(test) else { return };
    let node = "kubelet-rs-node-0";
    let Some(cluster) = kube_apiserver(test, node).await else { return };
    real_scenario(&rt, Arc::new(cluster), node).await;
}

/// The kube-apiserver that `cargo xtask cluster up` started, as `test` sees it: a namespace of
/// the test's own made with the admin's kubeconfig (`KUBELET_RS_TEST_KUBECONFIG`), and node
/// `node`'s kubeconfig for the agent (from `KUBELET_RS_TEST_NODE_KUBECONFIGS`); `None`, after
/// saying that `test` skipped, without one.
async fn kube_apiserver(test: &str, node: &str) -> Option<Cluster> {
    let var = |key: &str| std::env::var_os(key).filter(|v| !v.is_empty()).map(PathBuf::from);
    let Some((admin, nodes)) = var("KUBELET_RS_TEST_KUBECONFIG").zip(var("KUBELET_RS_TEST_NODE_KUBECONFIGS")) else {
        let why = "no kube-apiserver (`cargo xtask cluster up` sets KUBELET_RS_TEST_KUBECONFIG)";
        kubelet_core::testing::skip(test, why);
        return None;
    };
    let client = kubelet_cluster::heartbeat::connect(&admin).await.unwrap();
    let version = client.apiserver_version().await.unwrap();
    let minor = version.minor.trim_end_matches('+').parse().unwrap();
    // What an interrupted run left of the node would be adopted as it was.
    forget_node(&client, node).await;
    let namespace = format!("kubelet-rs-{node}-{}", std::process::id());
    prepare_namespace(&client, &namespace, &admin, minor).await;
    Some(Cluster::Remote { client, node_kubeconfig: nodes.join(format!("{node}.kubeconfig")), namespace, minor })
}

/// Runs `body` on the real runtime as node `node` of `cluster`; once it has passed, the node's
/// pods are deleted from the API server and a fresh agent of the node removes them from the
/// runtime and the host, and must leave nothing of them. Whatever the outcome, the test's own
/// clean-up then removes the pods of the cluster's namespace and whatever is mounted below `dir`,
/// forgets the node, and reports the body's failure. The body borrows across awaits, so it is not
/// `Send`: it runs as a local task.
async fn run_and_clean_up(
    rt: &RealRuntime,
    dir: &Path,
    cluster: &Cluster,
    node: &str,
    body: impl Future<Output = ()> + 'static,
) {
    let result = tokio::task::LocalSet::new().run_until(async { tokio::task::spawn_local(body).await }).await;
    let left = match result {
        Ok(()) => Ok(left_by_a_fresh_agent(rt, dir, cluster, node).await),
        Err(err) => Err(err),
    };
    let namespace = cluster.namespace().to_owned();
    remove_pods_and_mounts(rt, dir, |pod| pod.namespace == namespace).await;
    cluster.clean_up(node).await;
    match left {
        Ok(left) => assert!(left.is_empty(), "the agent left, a minute after its pods were deleted: {left:#?}"),
        Err(err) => std::panic::resume_unwind(err.into_panic()),
    }
}

/// Deletes every pod of the cluster's namespace at once, and every static pod's manifest, then
/// starts an agent as node `node` in `dir` (its configuration file as the body left it) when the
/// pods left anything, and returns what is left once it has had a minute to remove it.
async fn left_by_a_fresh_agent(rt: &RealRuntime, dir: &Path, cluster: &Cluster, node: &str) -> Vec<String> {
    for manifest in std::fs::read_dir(dir.join("manifests")).into_iter().flatten() {
        std::fs::remove_file(manifest.unwrap().path()).unwrap();
    }
    let view = cluster.view(node).await;
    for key in view.pods.keys() {
        let (_, name) = key.split_once('/').unwrap();
        cluster.delete_pod(name, 0).await;
    }
    let runtime = cri_runtime(rt, dir);
    let namespace = cluster.namespace().to_owned();
    let ours = |pod: &kubelet_core::runtime::Pod| pod.namespace == namespace;
    let mut left = common::pods_left(&runtime, dir, ours).await;
    if left.is_empty() {
        return left;
    }
    // The node's own credentials, not whatever certificates the body left in the cert dir.
    let _ = std::fs::remove_dir_all(dir.join("pki"));
    let logged_before = std::fs::read_to_string(dir.join("agent.log")).map_or(0, |log| log.len());
    let _agent = Agent::join(&rt.endpoint, dir, node, &cluster.kubeconfig(dir), &[]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !left.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = common::pods_left(&runtime, dir, ours).await;
    }
    if !left.is_empty() {
        // What the agent said of it: its warnings and errors.
        let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
        let said = log.get(logged_before..).unwrap_or_default().lines();
        left.extend(said.filter(|l| l.starts_with(['W', 'E'])).map(|l| format!("agent: {l}")));
    }
    left
}

/// Makes namespace `namespace` with what the controller-manager would put in it: the `default`
/// service account and the `kube-root-ca.crt` config map (the CA of the admin's kubeconfig).
/// Before v1.21 (kube-apiserver `minor`), pods mount their service account's token secret, which
/// the ServiceAccount admission plugin requires before it admits a pod: the token controller's
/// secret is made too.
async fn prepare_namespace(client: &kube::Client, namespace: &str, admin: &Path, minor: u32) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let object = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
    let object: Namespace = serde_json::from_value(object).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &object).await.unwrap();
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
    let account: ServiceAccount = serde_json::from_value(account).unwrap();
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), namespace);
    let account = accounts.create(&PostParams::default(), &account).await.unwrap();
    let kubeconfig = std::fs::read_to_string(admin).unwrap();
    let ca_file = kubeconfig.lines().find_map(|l| l.trim().strip_prefix("certificate-authority: ")).unwrap();
    let ca = std::fs::read_to_string(ca_file.trim()).unwrap();
    if minor < 21 {
        add_token_secret(client, namespace, &account, &ca).await;
    }
    let map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": ca}});
    let map: ConfigMap = serde_json::from_value(map).unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), namespace).create(&PostParams::default(), &map).await.unwrap();
}

/// The secret kube-controller-manager's token controller makes for service account `account`
/// on a server before v1.21, referenced from the account as that controller does. Its token is
/// no credential: no test pod calls the API server with it.
async fn add_token_secret(
    client: &kube::Client,
    namespace: &str,
    account: &k8s_openapi::api::core::v1::ServiceAccount,
    ca: &str,
) {
    use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
    let account_name = account.metadata.name.clone().unwrap();
    let name = format!("{account_name}-token-test");
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
        "metadata": {"name": name, "annotations": {
            "kubernetes.io/service-account.name": account_name,
            "kubernetes.io/service-account.uid": account.metadata.uid.clone().unwrap(),
        }},
        "stringData": {"token": "not-a-credential", "ca.crt": ca, "namespace": namespace},
    });
    let secret: Secret = serde_json::from_value(secret).unwrap();
    Api::<Secret>::namespaced(client.clone(), namespace).create(&PostParams::default(), &secret).await.unwrap();
    let reference = Patch::Merge(json!({"secrets": [{"name": name}]}));
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), namespace);
    accounts.patch(&account_name, &PatchParams::default(), &reference).await.unwrap();
}

/// What the hostile container tries on each volume the agent writes, as root: plant links to
/// the host (`$CANARY`, a host directory the agent would delete if it followed `..data`), remove
/// and rename the writer's own names, and write files. Each attempt that works is an `ESCAPE`
/// line of its report; each volume it can read is a `read` line.
const HOSTILE_SCRIPT: &str = r#"
attempt() { if "$@" 2>/dev/null; then echo "ESCAPE $v: $*"; fi; }
for pair in cm:greeting secret:password down:labels proj:greeting; do
  v=${pair%%:*}; f=${pair#*:}; d=/v/$v
  if cat "$d/$f" >/dev/null; then echo "read $v"; fi
  attempt ln -sfn "$CANARY" "$d/..data"
  attempt ln -sfn "$CANARY/keep" "$d/$f"
  attempt mv "$d/..data" "$d/..moved"
  attempt rm -rf "$d/..data"
  attempt sh -c "echo planted > $d/planted"
  attempt mkdir "$d/..new"
done > /out/report
touch /out/done
trap 'exit 0' TERM; while true; do sleep 1; done
"#;

/// A pod whose root container attacks its configMap, secret, downwardAPI and projected volumes,
/// each mounted without `readOnly`.
fn hostile_pod(node: &str, image: &str, canary: &Path) -> Value {
    let labels = json!({"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]});
    let mount = |name: &str| json!({"name": name, "mountPath": format!("/v/{name}"), "readOnly": false});
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hostile", "namespace": "default", "labels": {"app": "hostile"}},
        "spec": {
            "nodeName": node, "restartPolicy": "Always", "dnsPolicy": "Default", "terminationGracePeriodSeconds": 1,
            "schedulerName": "default-scheduler", "enableServiceLinks": false,
            "volumes": [
                {"name": "cm", "configMap": {"name": "app"}},
                {"name": "secret", "secret": {"secretName": "db"}},
                {"name": "down", "downwardAPI": labels},
                {"name": "proj", "projected": {"sources": [{"configMap": {"name": "app"}}, {"downwardAPI": labels}]}},
                {"name": "out", "emptyDir": {}},
            ],
            "containers": [{"name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
                "securityContext": {"runAsUser": 0},
                "env": [{"name": "CANARY", "value": canary.display().to_string()}],
                "command": ["sh", "-c", HOSTILE_SCRIPT],
                "volumeMounts": [mount("cm"), mount("secret"), mount("down"), mount("proj"),
                    {"name": "out", "mountPath": "/out"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}],
        },
        "status": {"phase": "Pending"},
    })
}

/// A pod whose init container plants links in an emptyDir, then mounts parts of it by subPath:
/// container `inside` a directory of the volume and a config map's key, container `escape` a link
/// to the host.
fn sub_path_pod(node: &str, image: &str, canary: &Path) -> Value {
    let plant = format!("mkdir -p /work/ok && echo inside > /work/ok/file && ln -s {} /work/escape", canary.display());
    let sleep = "trap 'exit 0' TERM; while true; do sleep 1; done";
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "subpaths", "namespace": "default"},
        "spec": {
            "nodeName": node, "restartPolicy": "Always", "dnsPolicy": "Default", "terminationGracePeriodSeconds": 1,
            "schedulerName": "default-scheduler", "enableServiceLinks": false,
            "volumes": [{"name": "work", "emptyDir": {}}, {"name": "cm", "configMap": {"name": "app"}}],
            "initContainers": [{"name": "plant", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", plant], "volumeMounts": [{"name": "work", "mountPath": "/work"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}],
            "containers": [
                {"name": "inside", "image": image, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", format!("cat /data/file /etc/greeting > /data/seen; {sleep}")],
                    "volumeMounts": [{"name": "work", "mountPath": "/data", "subPath": "ok"},
                        {"name": "cm", "mountPath": "/etc/greeting", "subPath": "greeting"}],
                    "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"},
                {"name": "escape", "image": image, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", sleep],
                    "volumeMounts": [{"name": "work", "mountPath": "/data", "subPath": "escape"}],
                    "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"},
            ],
        },
        "status": {"phase": "Pending"},
    })
}

/// Every file below `dir` with its content (directories as `dir`), to compare before and after.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            found.extend(snapshot(&path));
            found.insert(path, "dir".to_owned());
        } else {
            found.insert(path.clone(), std::fs::read_to_string(&path).unwrap());
        }
    }
    found
}

/// Waits (at most 30 s) until `ready` holds, then returns; panics with `what` otherwise.
async fn wait_for(what: &str, dir: &Path, ready: impl Fn() -> bool) {
    for _ in 0..300 {
        if ready() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    panic!("timed out waiting for {what}; agent log:\n{log}");
}

/// No pod reaches outside itself: a root container cannot rewrite the volumes the agent writes
/// (they are mounted read-only whatever the pod says), the agent's next writes leave the host
/// alone, and a subPath that leads out of its volume is refused while one inside is bind-mounted
/// and unmounted with the pod. Against the in-process API server.
#[tokio::test]
async fn real_no_container_reaches_the_host_through_its_volumes() {
    let test = "real_no_container_reaches_the_host_through_its_volumes";
    let Some(rt) = RealRuntime::from_env(test) else { return };
    let node = format!("escape-{}", std::process::id());
    escape_test(&rt, Arc::new(Cluster::Local(ApiServer::start().await)), &node).await;
}

/// The same against upstream's kube-apiserver, the agent holding node `kubelet-rs-node-1`'s
/// credentials (see [`real_cluster_mode_against_kube_apiserver`]).
#[tokio::test]
async fn real_no_container_reaches_the_host_through_volumes_from_kube_apiserver() {
    let test = "real_no_container_reaches_the_host_through_volumes_from_kube_apiserver";
    let Some(rt) = RealRuntime::from_env(test) else { return };
    let node = "kubelet-rs-node-1";
    let Some(cluster) = kube_apiserver(test, node).await else { return };
    escape_test(&rt, Arc::new(cluster), node).await;
}

/// Runs [`attack_the_host_through_volumes`] as node `node` of `cluster`, then removes the pods and
/// mounts it left, whatever its outcome.
async fn escape_test(rt: &RealRuntime, cluster: Arc<Cluster>, node: &str) {
    let dir = rt.scratch_dir.join(format!("escape-{node}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    let body = attack_the_host_through_volumes(rt.clone(), dir.clone(), cluster.clone(), node.to_owned());
    run_and_clean_up(rt, &dir, &cluster, node, body).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The real runtime as the agent under `dir` sees it, for the test to ask and clean up.
fn cri_runtime(rt: &RealRuntime, dir: &Path) -> cri_client::manager::CriRuntime {
    let client = cri_client::Client::connect(&cri_client::Config::new(&rt.endpoint)).unwrap();
    let config = cri_client::manager::Config::new("cleanup")
        .pods_dir(dir.join("root/pods"))
        .pod_logs_dir(dir.join("pods"))
        .container_logs_dir(dir.join("containers"));
    let recorder = std::sync::Arc::new(kubelet_core::events::RingRecorder::default());
    cri_client::manager::CriRuntime::new(client, config, recorder)
}

/// Removes from the runtime every pod `ours` says is the test's, then unmounts whatever is
/// still mounted below `dir`: what a failed test leaves would otherwise confuse the next one.
async fn remove_pods_and_mounts(rt: &RealRuntime, dir: &Path, ours: impl Fn(&kubelet_core::runtime::Pod) -> bool) {
    let runtime = cri_runtime(rt, dir);
    for pod in runtime.get_pods(true).await.unwrap().into_iter().filter(|p| ours(p)) {
        let mut api = Pod::default();
        api.metadata.name = Some(pod.name.clone());
        api.metadata.namespace = Some(pod.namespace.clone());
        api.metadata.uid = Some(pod.uid.to_string());
        runtime.remove_pod(&api).await.unwrap();
    }
    common::unmount_below(dir);
}

/// The body of [`real_no_container_reaches_the_host_through_its_volumes`].
async fn attack_the_host_through_volumes(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    let canary = dir.join("canary");
    std::fs::create_dir_all(canary.join("sub")).unwrap();
    std::fs::write(canary.join("keep"), "host data").unwrap();
    std::fs::write(canary.join("sub/keep"), "more host data").unwrap();
    let host = snapshot(&canary);

    let kubeconfig = cluster.kubeconfig(&dir);
    std::fs::write(
        dir.join("config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: 2s\n",
    )
    .unwrap();
    let _agent = Agent::join(&rt.endpoint, &dir, &node, &kubeconfig, &[]);
    cluster.put_config_map("app", json!({"greeting": "hello"})).await;
    cluster.put_secret("db", &[("password", b"hunter2")]).await;
    let ns = cluster.namespace().to_owned();
    let uid_of = async |name: &str| {
        let key = format!("{ns}/{name}");
        let what = format!("pod {name} to be bound");
        until(&cluster, &node, &dir, &what, |v| v.pods.get(&key)?["metadata"]["uid"].as_str().map(str::to_owned)).await
    };

    // The hostile container runs its attempts.
    cluster.create_pod(hostile_pod(&node, &rt.busybox_image, &canary)).await;
    let pod_dir = dir.join("root/pods").join(uid_of("hostile").await);
    let volumes = pod_dir.join("volumes");
    let out = volumes.join("kubernetes.io~empty-dir/out");
    wait_for("the hostile container's report", &dir, || out.join("done").exists()).await;
    let report = std::fs::read_to_string(out.join("report")).unwrap();
    for volume in ["cm", "secret", "down", "proj"] {
        assert!(report.lines().any(|l| l == format!("read {volume}")), "the container reads {volume}:\n{report}");
    }
    assert!(!report.contains("ESCAPE"), "the container rewrote a volume the agent writes:\n{report}");

    // The agent writes every volume again; the host is untouched and each volume is whole.
    cluster.put_config_map("app", json!({"greeting": "bye"})).await;
    cluster.put_secret("db", &[("password", b"changed")]).await;
    cluster.label_pod("hostile", "round", "2").await;
    let read = |path: &str| std::fs::read_to_string(volumes.join(path)).unwrap_or_default();
    wait_for("the agent's next writes of all four volumes", &dir, || {
        read("kubernetes.io~configmap/cm/greeting") == "bye"
            && read("kubernetes.io~secret/secret/password") == "changed"
            && read("kubernetes.io~downward-api/down/labels").contains("round=\"2\"")
            && read("kubernetes.io~projected/proj/greeting") == "bye"
            && read("kubernetes.io~projected/proj/labels").contains("round=\"2\"")
    })
    .await;
    assert_eq!(snapshot(&canary), host, "nothing outside the volumes changed");
    for volume in [
        "kubernetes.io~configmap/cm",
        "kubernetes.io~secret/secret",
        "kubernetes.io~downward-api/down",
        "kubernetes.io~projected/proj",
    ] {
        let data = std::fs::read_link(volumes.join(volume).join("..data")).unwrap();
        assert!(data.to_str().is_some_and(|d| d.starts_with("..") && !d.contains('/')), "{volume}: ..data -> {data:?}");
    }

    // subPath: a directory inside the volume and a config map's key are mounted, a link out is refused.
    cluster.create_pod(sub_path_pod(&node, &rt.busybox_image, &canary)).await;
    let sub_dir = dir.join("root/pods").join(uid_of("subpaths").await);
    let seen = sub_dir.join("volumes/kubernetes.io~empty-dir/work/ok/seen");
    wait_for("container inside to read its subPaths", &dir, || {
        std::fs::read_to_string(&seen).is_ok_and(|s| s.starts_with("inside\n"))
    })
    .await;
    assert_eq!(std::fs::read_to_string(&seen).unwrap(), "inside\nbye", "the directory and the config map's key");
    let escape = until(&cluster, &node, &dir, "container escape to be refused", |v| {
        let statuses = v.pods.get(&format!("{ns}/subpaths"))?["status"]["containerStatuses"].as_array()?.clone();
        let escape = statuses.into_iter().find(|s| s["name"] == "escape")?;
        (escape["state"]["waiting"]["reason"] == "CreateContainerConfigError").then_some(escape)
    })
    .await;
    assert_eq!(
        escape["state"]["waiting"]["message"],
        "failed to prepare subPath for volumeMount \"work\" of container \"escape\"",
        "{escape}"
    );
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let bound = sub_dir.join("volume-subpaths/work/inside/0");
    assert!(table.contains(&format!(" {} ", bound.display())), "the subPath is a bind mount of the agent's");

    // Both pods deleted: their volumes and bind mounts go, and the host still has its data.
    cluster.delete_pod("hostile", 1).await;
    cluster.delete_pod("subpaths", 1).await;
    until(&cluster, &node, &dir, "both pods to be gone from the API", |v| v.pods.is_empty().then_some(())).await;
    let pods_dir = dir.join("root/pods");
    let mounted_below = || {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        kubelet_core::volume::mount_below(&table, &pods_dir)
    };
    wait_for("every volume and subPath of the pods to be unmounted", &dir, || mounted_below().is_none()).await;
    assert_eq!(snapshot(&canary), host, "nothing outside the volumes changed");
}

/// The node's lease in the outage test. The lease must be renewed, and the status reported
/// (every 2 s even unchanged there), before a lease taken after the API server's return could run
/// out, so the node is never taken for dead once the server is back. A lease the agent could not
/// read is tried again after a backoff of at most 7 s (upstream's `backoffEnsureLease`), so that
/// is the bound a 10 s lease leaves room for.
const OUTAGE_LEASE_SECONDS: u64 = 10;

/// How long a pod bound after the outages (once the lease was renewed) may take to run: the pod
/// source watches afresh when the heartbeats answer again, where the watch made into the hang
/// would otherwise wait to be given up as unanswered
/// ([`kubelet_cluster::heartbeat::UNANSWERED_AFTER`], 30 s from the hang's start) and then its
/// backoff.
const AFTER_THE_OUTAGES: Duration = Duration::from_secs(10);

/// The API server goes away in each way a node meets, each time for longer than the node's
/// lease: it refuses connections, answers 500, 503 and then 429 with `Retry-After`, and hangs
/// requests without ever answering them; at the start of each fault it ends every watch, so that
/// the agent's watches are made again into it. The pods keep running as they were (container
/// IDs, restart counts, the mirror pod's UID); after each return the lease is renewed and the
/// status reported before the lease could run out; and a pod bound afterwards runs.
#[tokio::test]
async fn real_a_node_rides_out_an_api_server_outage() {
    use kubelet_cluster::testing::Fault;
    let Some(rt) = RealRuntime::from_env("real_a_node_rides_out_an_api_server_outage") else { return };
    let node = format!("outage-{}", std::process::id());
    let phases = vec![
        ("refused connections", Away::Refused),
        (
            "500, 503, then 429 with Retry-After",
            Away::Faults(vec![
                Some(Fault::InternalError),
                Some(Fault::Unavailable),
                Some(Fault::TooManyRequests { retry_after_seconds: 2 }),
            ]),
        ),
        ("hung requests", Away::Faults(vec![Some(Fault::Hang)])),
    ];
    let cluster = Arc::new(Cluster::Local(ApiServer::start().await));
    outage_test(&rt, cluster, &node, phases).await;
}

/// The same against upstream's kube-apiserver, the agent holding node `kubelet-rs-node-2`'s
/// credentials: its port refuses every connection (a firewall rule resets them, as when the
/// process is gone), then the process is stopped (SIGSTOP: connections stay open and requests
/// hang), each for longer than the lease.
#[tokio::test]
async fn real_a_node_rides_out_a_kube_apiserver_outage() {
    let test = "real_a_node_rides_out_a_kube_apiserver_outage";
    let Some(rt) = RealRuntime::from_env(test) else { return };
    let node = "kubelet-rs-node-2";
    let Some(cluster) = kube_apiserver(test, node).await else { return };
    let phases = vec![("refused connections", Away::Refused), ("a stopped process", Away::Stopped)];
    outage_test(&rt, Arc::new(cluster), node, phases).await;
}

/// How the API server is away in one phase of the outage test.
enum Away {
    /// Connections are refused.
    Refused,
    /// The in-process server answers with these faults, one after the other.
    Faults(Vec<Option<kubelet_cluster::testing::Fault>>),
    /// kube-apiserver's process is stopped.
    Stopped,
}

async fn outage_test(rt: &RealRuntime, cluster: Arc<Cluster>, node: &str, phases: Vec<(&'static str, Away)>) {
    let dir = rt.scratch_dir.join(format!("cluster-{node}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    let body = {
        let (rt, cluster, dir, node) = (rt.clone(), cluster.clone(), dir.clone(), node.to_owned());
        async move { ride_out_outages(&rt, &cluster, &dir, &node, phases).await }
    };
    run_and_clean_up(rt, &dir, &cluster, node, body).await;
}

/// Keeps the API server away as `away` says for `how_long`.
async fn stay_away(cluster: &Cluster, dir: &Path, away: Away, how_long: Duration) {
    match (cluster, away) {
        (Cluster::Local(server), Away::Refused) => {
            server.refuse_connections().await;
            tokio::time::sleep(how_long).await;
            server.accept_connections().await;
        }
        (Cluster::Local(server), Away::Faults(faults)) => {
            let share = how_long / u32::try_from(faults.len()).unwrap();
            for fault in faults {
                server.set_fault(fault);
                server.end_watches();
                tokio::time::sleep(share).await;
            }
            // A hang never answers what it held, as a lost connection would not: the agent must
            // give those requests up by itself.
            server.set_fault(None);
        }
        (Cluster::Remote { .. }, Away::Refused) => {
            let _refusing = RefusedPort::start(api_server_port(&cluster.kubeconfig(dir)));
            tokio::time::sleep(how_long).await;
        }
        (Cluster::Remote { .. }, Away::Stopped) => {
            let _stopped = StoppedProcess::start(kube_apiserver_pid());
            tokio::time::sleep(how_long).await;
        }
        _ => panic!("this server cannot be away that way"),
    }
}

/// The port of the API server a kubeconfig names (`server: https://127.0.0.1:PORT`).
fn api_server_port(kubeconfig: &Path) -> u16 {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let server = text.lines().find_map(|l| l.trim().strip_prefix("server: ")).unwrap();
    server.rsplit(':').next().unwrap().trim_end_matches('/').parse().unwrap()
}

/// The PID of the kube-apiserver `cargo xtask cluster up` started.
fn kube_apiserver_pid() -> i32 {
    let file = std::env::var("KUBELET_RS_TEST_KUBE_APISERVER_PID_FILE").unwrap();
    std::fs::read_to_string(file).unwrap().trim().parse().unwrap()
}

/// A firewall rule that resets every connection to a loopback port while it lives.
struct RefusedPort(String);

impl RefusedPort {
    fn start(port: u16) -> RefusedPort {
        let rule = RefusedPort(port.to_string());
        rule.iptables("-I");
        rule
    }

    fn iptables(&self, action: &str) {
        let rule = ["INPUT", "-i", "lo", "-p", "tcp", "--dport", &self.0, "-j", "REJECT", "--reject-with", "tcp-reset"];
        let status = std::process::Command::new("iptables").arg(action).args(rule).status().unwrap();
        assert!(status.success(), "iptables {action} failed");
    }
}

impl Drop for RefusedPort {
    fn drop(&mut self) {
        self.iptables("-D");
    }
}

/// A process stopped (SIGSTOP) while this lives, and continued (SIGCONT) after.
struct StoppedProcess(nix::unistd::Pid);

impl StoppedProcess {
    fn start(pid: i32) -> StoppedProcess {
        let pid = nix::unistd::Pid::from_raw(pid);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        StoppedProcess(pid)
    }
}

impl Drop for StoppedProcess {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

async fn ride_out_outages(
    rt: &RealRuntime,
    cluster: &Cluster,
    dir: &Path,
    node: &str,
    phases: Vec<(&'static str, Away)>,
) {
    let ns = cluster.namespace();
    std::fs::write(
        dir.join("config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusUpdateFrequency: 1s\n\
             nodeStatusReportFrequency: 2s\nsyncFrequency: 2s\nnodeLeaseDurationSeconds: {OUTAGE_LEASE_SECONDS}\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("manifests/static.yaml"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: static, namespace: {ns}}}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {}\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 1; done\"]\n",
            rt.busybox_image
        ),
    )
    .unwrap();
    let kubeconfig = cluster.kubeconfig(dir);
    let _agent = Agent::join(&rt.endpoint, dir, node, &kubeconfig, &[]);
    cluster.put_config_map("app", json!({"greeting": "hello"})).await;
    cluster.create_pod(bound_pod("web", node, &rt.busybox_image)).await;
    let (web_key, mirror_key, after_key) = (format!("{ns}/web"), format!("{ns}/static-{node}"), format!("{ns}/after"));
    let (web, mirror) = until(cluster, node, dir, "web and the static pod's mirror to run", |v| {
        let web = v.pods.get(&web_key)?;
        let mirror = v.pods.get(&mirror_key)?;
        (phase(web) == "Running" && phase(mirror) == "Running").then(|| (web.clone(), mirror.clone()))
    })
    .await;
    let containers = |web: &Value, mirror: &Value| {
        let id = |pod: &Value| pod["status"]["containerStatuses"][0]["containerID"].as_str().unwrap_or("").to_owned();
        (id(web), id(mirror), mirror["metadata"]["uid"].clone())
    };
    let before = containers(&web, &mirror);

    let away = Duration::from_secs(OUTAGE_LEASE_SECONDS + 2);
    for (what, how) in phases {
        stay_away(cluster, dir, how, away).await;
        let back = std::time::SystemTime::now();
        let renewed = wait_for_heartbeats(cluster, node, back).await;
        eprintln!("after {what} for {away:?}: lease renewed and status reported {renewed:?} after the return");
        assert!(
            renewed < Duration::from_secs(OUTAGE_LEASE_SECONDS),
            "after {what}, the lease and status took {renewed:?}, longer than the lease; agent log:\n{}",
            std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
        );
    }

    // Everything ran through it as it was, and the pod source resumed.
    let created = tokio::time::Instant::now();
    cluster.create_pod(bound_pod("after", node, &rt.busybox_image)).await;
    let (web, mirror) =
        until_within(AFTER_THE_OUTAGES, cluster, node, dir, "a pod bound after the outages to run", |v| {
            let after = v.pods.get(&after_key)?;
            (phase(after) == "Running").then(|| (v.pods[&web_key].clone(), v.pods[&mirror_key].clone()))
        })
        .await;
    eprintln!("a pod bound after the outages ran {:?} after it was created", created.elapsed());
    assert_eq!(
        containers(&web, &mirror),
        before,
        "web's and the static pod's containers and the mirror pod are the ones from before"
    );
    for pod in [&web, &mirror] {
        assert_eq!(pod["status"]["containerStatuses"][0]["restartCount"], 0, "{pod}");
    }
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    assert!(!log.contains("panicked"), "{log}");
}

/// Waits until both the node's lease and its Ready condition's heartbeat are newer than `since`;
/// returns how long that took.
async fn wait_for_heartbeats(cluster: &Cluster, node: &str, since: std::time::SystemTime) -> Duration {
    // The Ready condition's times are whole seconds.
    let second = since.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let floor = std::time::UNIX_EPOCH + Duration::from_secs(second);
    let newer = |time: &Value| {
        let Some(time) = time.as_str().and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok()) else {
            return false;
        };
        std::time::SystemTime::from(time) >= floor
    };
    for _ in 0..600 {
        let view = cluster.view(node).await;
        let lease = view.leases.get(&format!("kube-node-lease/{node}")).map(|l| l["spec"]["renewTime"].clone());
        let ready = view.nodes.get(node).and_then(|n| {
            n["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Ready")
                .map(|c| c["lastHeartbeatTime"].clone())
        });
        if lease.is_some_and(|l| newer(&l)) && ready.is_some_and(|r| newer(&r)) {
            return since.elapsed().unwrap_or_default();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no lease renewal and status report within 60 s of the API server's return");
}

/// The eviction manager against upstream's kube-apiserver, as node `kubelet-rs-node-3`, on a
/// root directory of its own (a 64 MiB tmpfs, so `nodefs` is the test's): a pod writing past its
/// emptyDir's `sizeLimit` is evicted with upstream's message though the node has room; a
/// BestEffort pod filling the node's filesystem past `nodefs.available<50%` (the node's status
/// listing the runtime's images meanwhile) makes the node
/// report `DiskPressure` and is evicted while the Guaranteed pod beside it runs on untouched; a
/// pod bound meanwhile is refused; and the condition clears once the space is back.
#[tokio::test]
async fn real_disk_pressure_and_local_storage_limits_evict_pods_from_kube_apiserver() {
    let test = "real_disk_pressure_and_local_storage_limits_evict_pods_from_kube_apiserver";
    on_node(NODE_3, test, "evictions", Some("64m"), evict_under_pressure).await;
}

/// Upstream's memory eviction against kube-apiserver: with `memory.available` set 500 MiB below
/// what the node has, a BestEffort pod holding 1000 MiB in a memory-backed emptyDir makes the
/// node report `MemoryPressure` and is evicted with upstream's message, while the Guaranteed pod
/// beside it (under its request) runs on untouched; the condition clears once the memory is back.
#[tokio::test]
async fn real_memory_pressure_evicts_the_pod_over_its_request_from_kube_apiserver() {
    let test = "real_memory_pressure_evicts_the_pod_over_its_request_from_kube_apiserver";
    on_node(NODE_3, test, "memory-evictions", None, evict_under_memory_pressure).await;
}

/// Upstream's PID eviction against kube-apiserver: with `pid.available` set 1000 below what the
/// node has, a BestEffort pod starting 2000 processes makes the node report `PIDPressure` and is
/// evicted with upstream's message, while the Guaranteed pod beside it (two processes) runs on
/// untouched; the condition clears once the processes are gone.
#[tokio::test]
async fn real_pid_pressure_evicts_the_pod_with_the_most_processes_from_kube_apiserver() {
    let test = "real_pid_pressure_evicts_the_pod_with_the_most_processes_from_kube_apiserver";
    on_node(NODE_3, test, "pid-evictions", None, evict_under_pid_pressure).await;
}

/// The test node most kube-apiserver scenarios run as, one at a time.
const NODE_3: &str = "kubelet-rs-node-3";

/// Runs `scenario` as node `node` of kube-apiserver, in a fresh scratch directory `name` whose
/// `root` is a tmpfs of `root_size` when given (so `nodefs` is the test's), and cleans up after
/// it.
async fn on_node<Scenario>(
    node: &str,
    test: &str,
    name: &str,
    root_size: Option<&str>,
    scenario: impl FnOnce(RealRuntime, PathBuf, Arc<Cluster>, String) -> Scenario,
) where
    Scenario: Future<Output = ()> + 'static,
{
    let Some(rt) = RealRuntime::from_env(test) else { return };
    let Some(cluster) = kube_apiserver(test, node).await else { return };
    let cluster = Arc::new(cluster);
    let dir = rt.scratch_dir.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    if let Some(size) = root_size {
        std::fs::create_dir_all(dir.join("root")).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.join("root"))
            .status();
        assert!(mounted.unwrap().success(), "a tmpfs for the agent's root directory");
    }
    let body = scenario(rt.clone(), dir.clone(), cluster.clone(), node.to_owned());
    run_and_clean_up(&rt, &dir, &cluster, node, body).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The node's `memory.available` in MiB, computed as the agent computes it.
fn memory_available_mib() -> u64 {
    let read = |path: &str| std::fs::read_to_string(path).unwrap();
    let meminfo = read("/proc/meminfo");
    let root = "/sys/fs/cgroup/memory";
    let root_cgroup = std::fs::read_to_string(format!("{root}/memory.usage_in_bytes"))
        .ok()
        .map(|usage| (usage, read(&format!("{root}/memory.stat"))));
    let root_cgroup = root_cgroup.as_ref().map(|(usage, stat)| (usage.as_str(), stat.as_str()));
    let observed = eviction::stats::memory_observation(&meminfo, root_cgroup).expect("memory.available");
    observed.available / (1024 * 1024)
}

/// The body of [`real_memory_pressure_evicts_the_pod_over_its_request_from_kube_apiserver`].
async fn evict_under_memory_pressure(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    let threshold = memory_available_mib().saturating_sub(500);
    let fill = "dd if=/dev/zero of=/data/fill bs=1M count=1000";
    let mut hog = writer_pod("hog", &node, &rt.busybox_image, fill, None, json!({}));
    hog["spec"]["volumes"][0]["emptyDir"]["medium"] = json!("Memory");
    let pressure = NodePressure {
        eviction_hard: format!("memory.available: {threshold}Mi"),
        condition: "MemoryPressure",
        reason: "KubeletHasInsufficientMemory",
        message: "kubelet has insufficient memory available",
        hog,
    };
    let message = evict_the_hog(&rt, &dir, &cluster, &node, pressure).await;
    let quantity = format_amount(threshold * 1024 * 1024, Resource::Memory);
    let expected = format!("The node was low on resource: memory. Threshold quantity: {quantity}, available: ");
    assert!(message.starts_with(&expected), "upstream's message: {message}");
    assert!(message.contains("Container app was using "), "the container's usage: {message}");
}

/// The node's `pid.available`, computed as the agent computes it.
fn pids_available() -> u64 {
    let read = |path: &str| std::fs::read_to_string(path).unwrap();
    let observed = eviction::stats::pid_observation(&read("/proc/sys/kernel/pid_max"), &read("/proc/loadavg"));
    observed.expect("pid.available").available
}

/// The body of [`real_pid_pressure_evicts_the_pod_with_the_most_processes_from_kube_apiserver`].
async fn evict_under_pid_pressure(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    // The host's own tasks move by tens (the agent's blocking threads, shims, kube-apiserver):
    // the threshold is 1000 below what is free, and the hog takes 2000.
    let threshold = pids_available().saturating_sub(1000);
    let fork = "i=0; while [ $i -lt 2000 ]; do sleep 3600 & i=$((i+1)); done";
    let pressure = NodePressure {
        eviction_hard: format!("pid.available: \"{threshold}\""),
        condition: "PIDPressure",
        reason: "KubeletHasInsufficientPID",
        message: "kubelet has insufficient PID available",
        hog: writer_pod("hog", &node, &rt.busybox_image, fork, None, json!({})),
    };
    let message = evict_the_hog(&rt, &dir, &cluster, &node, pressure).await;
    let quantity = format_amount(threshold, Resource::Pids);
    let expected = format!("The node was low on resource: pids. Threshold quantity: {quantity}, available: ");
    assert!(message.starts_with(&expected), "upstream's message: {message}");
}

/// A node pressure a BestEffort pod makes, and how the node reports it.
struct NodePressure {
    /// The `evictionHard` entry the pod crosses.
    eviction_hard: String,
    /// The node condition, and its reason and message while it holds.
    condition: &'static str,
    reason: &'static str,
    message: &'static str,
    /// The BestEffort pod, named `hog`, that makes the pressure.
    hog: Value,
}

/// The agent joins as `node` with `pressure`'s threshold; a Guaranteed pod runs, then the hog
/// makes the node report the condition and is evicted, the condition clears once the hog is
/// gone, and the Guaranteed pod runs on untouched. Returns the evicted hog's message.
async fn evict_the_hog(rt: &RealRuntime, dir: &Path, cluster: &Cluster, node: &str, pressure: NodePressure) -> String {
    std::fs::write(
        dir.join("config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: 2s\n\
             evictionHard: {{{}}}\nevictionPressureTransitionPeriod: 5s\n",
            pressure.eviction_hard
        ),
    )
    .unwrap();
    let kubeconfig = cluster.kubeconfig(dir);
    let _agent = Agent::join(&rt.endpoint, dir, node, &kubeconfig, &[]);
    let ns = cluster.namespace().to_owned();
    let pod_of = |name: &str| {
        let key = format!("{ns}/{name}");
        move |v: &View| v.pods.get(&key).cloned()
    };
    let condition = |v: &View| {
        let conditions = v.nodes.get(node)?["status"]["conditions"].as_array()?.clone();
        conditions.into_iter().find(|c| c["type"] == pressure.condition)
    };

    let both = json!({"cpu": "100m", "memory": "32Mi"});
    let guaranteed = json!({"requests": both, "limits": both});
    cluster.create_pod(writer_pod("guaranteed", node, &rt.busybox_image, "true", None, guaranteed)).await;
    let running = until(cluster, node, dir, "the Guaranteed pod to run", |v| {
        pod_of("guaranteed")(v).filter(|p| phase(p) == "Running")
    })
    .await;
    let started = running["status"]["containerStatuses"][0]["containerID"].clone();
    let no_pressure = until(cluster, node, dir, "the node's condition", condition).await;
    assert_eq!(no_pressure["status"], "False", "{no_pressure}");

    cluster.create_pod(pressure.hog.clone()).await;
    let held = until(cluster, node, dir, pressure.condition, |v| condition(v).filter(|c| c["status"] == "True")).await;
    assert_eq!(held["reason"], pressure.reason, "{held}");
    assert_eq!(held["message"], pressure.message, "{held}");
    let pod = until(cluster, node, dir, "the hog to be evicted", |v| {
        pod_of("hog")(v).filter(|p| phase(p) == "Failed" && p["status"]["reason"] == "Evicted")
    })
    .await;

    // What the hog held goes with it, and the condition clears.
    until(cluster, node, dir, "the condition to clear", |v| condition(v).filter(|c| c["status"] == "False")).await;
    let view = cluster.view(node).await;
    let guaranteed = pod_of("guaranteed")(&view).unwrap();
    assert_eq!(phase(&guaranteed), "Running", "{guaranteed}");
    assert_eq!(guaranteed["status"]["containerStatuses"][0]["containerID"], started, "the same container");
    assert_eq!(guaranteed["status"]["containerStatuses"][0]["restartCount"], 0);
    pod["status"]["message"].as_str().unwrap_or_default().to_owned()
}

/// A pod of `node` running `script` in a busybox container with an emptyDir at `/data` (of at
/// most `size_limit`), and `resources`.
fn writer_pod(name: &str, node: &str, image: &str, script: &str, size_limit: Option<&str>, resources: Value) -> Value {
    let mut empty_dir = json!({});
    if let Some(limit) = size_limit {
        empty_dir["sizeLimit"] = json!(limit);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node, "restartPolicy": "Always", "terminationGracePeriodSeconds": 2,
            "enableServiceLinks": false,
            "volumes": [{"name": "data", "emptyDir": empty_dir}],
            "containers": [{"name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", format!("{script}; trap 'exit 0' TERM; while true; do sleep 1; done")],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "resources": resources}],
        },
    })
}

/// The body of [`real_disk_pressure_and_local_storage_limits_evict_pods_from_kube_apiserver`].
async fn evict_under_pressure(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    std::fs::write(
        dir.join("config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: 2s\n\
         evictionHard: {nodefs.available: 50%}\nevictionPressureTransitionPeriod: 20s\n",
    )
    .unwrap();
    let kubeconfig = cluster.kubeconfig(&dir);
    let _agent = Agent::join(&rt.endpoint, &dir, &node, &kubeconfig, &[]);
    let ns = cluster.namespace().to_owned();
    let pod_of = |name: &str| {
        let key = format!("{ns}/{name}");
        move |v: &View| v.pods.get(&key).cloned()
    };
    let evicted = |name: &str| {
        let pod = pod_of(name);
        move |v: &View| pod(v).filter(|p| phase(p) == "Failed" && p["status"]["reason"] == "Evicted")
    };
    let disk_pressure = |v: &View| {
        let conditions = v.nodes.get(&node)?["status"]["conditions"].as_array()?.clone();
        conditions.into_iter().find(|c| c["type"] == "DiskPressure")
    };
    let image = &rt.busybox_image;

    // An emptyDir past its sizeLimit: evicted though the node has room.
    let over_limit = "dd if=/dev/zero of=/data/fill bs=1M count=2";
    cluster.create_pod(writer_pod("over-limit", &node, image, over_limit, Some("1Mi"), json!({}))).await;
    let pod = until(&cluster, &node, &dir, "the pod past its sizeLimit to be evicted", evicted("over-limit")).await;
    assert_eq!(pod["status"]["message"], "Usage of EmptyDir volume \"data\" exceeds the limit \"1Mi\". ", "{pod}");
    let no_pressure = until(&cluster, &node, &dir, "the node's DiskPressure condition", disk_pressure).await;
    assert_eq!(no_pressure["status"], "False", "{no_pressure}");
    // The status lists the runtime's images, largest first, with their sizes.
    let images = until(&cluster, &node, &dir, "the node's images", |v| {
        let images = v.nodes.get(&node)?["status"]["images"].as_array()?.clone();
        let named = |i: &Value, part: &str| {
            i["names"].as_array().is_some_and(|n| n.iter().any(|n| n.as_str().is_some_and(|n| n.contains(part))))
        };
        images.iter().any(|i| named(i, "busybox")).then_some(images)
    })
    .await;
    let sizes: Vec<i64> = images.iter().map(|i| i["sizeBytes"].as_i64().unwrap_or(0)).collect();
    assert!(sizes.iter().all(|s| *s > 0) && sizes.windows(2).all(|w| w[0] >= w[1]), "largest first: {sizes:?}");

    // A Guaranteed pod, then a BestEffort one that fills the node's filesystem.
    let both = json!({"cpu": "100m", "memory": "32Mi"});
    let guaranteed = json!({"requests": both, "limits": both});
    cluster.create_pod(writer_pod("guaranteed", &node, image, "true", None, guaranteed)).await;
    let running = until(&cluster, &node, &dir, "the Guaranteed pod to run", |v| {
        pod_of("guaranteed")(v).filter(|p| phase(p) == "Running")
    })
    .await;
    let started = running["status"]["containerStatuses"][0]["containerID"].clone();
    let fill = "dd if=/dev/zero of=/data/fill bs=1M count=40";
    cluster.create_pod(writer_pod("filler", &node, image, fill, None, json!({}))).await;
    let pressure =
        until(&cluster, &node, &dir, "DiskPressure", |v| disk_pressure(v).filter(|c| c["status"] == "True")).await;
    assert_eq!(pressure["reason"], "KubeletHasDiskPressure", "{pressure}");
    assert_eq!(pressure["message"], "kubelet has disk pressure", "{pressure}");
    let pod = until(&cluster, &node, &dir, "the BestEffort pod to be evicted", evicted("filler")).await;
    let message = pod["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("The node was low on resource: ephemeral-storage. Threshold quantity: "),
        "upstream's message: {message}"
    );
    let disruption =
        pod["status"]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "DisruptionTarget");
    assert!(disruption.is_some_and(|c| c["reason"] == "TerminationByKubelet"), "{pod}");

    // Under pressure, a new pod is refused; the Guaranteed pod was never touched.
    cluster.create_pod(writer_pod("late", &node, image, "true", None, json!({}))).await;
    let refused = until(&cluster, &node, &dir, "the late pod to be refused", |v| {
        pod_of("late")(v).filter(|p| phase(p) == "Failed")
    })
    .await;
    assert_eq!(refused["status"]["reason"], "Evicted", "{refused}");
    assert_eq!(refused["status"]["message"], "Pod was rejected: The node had condition: [DiskPressure]. ", "{refused}");
    let view = cluster.view(&node).await;
    let guaranteed = pod_of("guaranteed")(&view).unwrap();
    assert_eq!(phase(&guaranteed), "Running", "{guaranteed}");
    assert_eq!(guaranteed["status"]["containerStatuses"][0]["containerID"], started, "the same container");
    assert_eq!(guaranteed["status"]["containerStatuses"][0]["restartCount"], 0);

    // The evicted pod's volume goes, and the condition clears after the transition period.
    until(&cluster, &node, &dir, "DiskPressure to clear", |v| disk_pressure(v).filter(|c| c["status"] == "False"))
        .await;
}

/// The kubelet API as kube-apiserver and other callers meet it: `kubectl logs` (the API server
/// calls the agent with its kubelet client certificate, which `clientCAFile` authenticates and
/// a SubjectAccessReview allows), and direct callers refused with upstream's 401 and 403 until
/// RBAC allows them (a service account's token through a TokenReview, another node's
/// certificate, nobody at all).
#[tokio::test]
async fn real_the_kubelet_api_serves_kubectl_logs_and_refuses_whom_rbac_does_not_allow() {
    let test = "real_the_kubelet_api_serves_kubectl_logs_and_refuses_whom_rbac_does_not_allow";
    on_node(NODE_3, test, "kubelet-api", None, serve_the_kubelet_api).await;
}

/// Config map and secret changes reach the volumes that show them (configMap, secret and
/// projected) within seconds, driven by the agent's watch of each object, not at the pod's
/// periodic resync (`syncFrequency` left at its minute, upstream's default, which is what a
/// change waited for before).
#[tokio::test]
async fn real_config_map_and_secret_changes_reach_their_volumes_within_seconds_from_kube_apiserver() {
    let test = "real_config_map_and_secret_changes_reach_their_volumes_within_seconds_from_kube_apiserver";
    on_node(NODE_3, test, "volume-updates", None, follow_object_changes).await;
}

/// A pod whose non-root user reads, through its fsGroup, a secret of mode 0400 and its projected
/// service account token, which is its own (0640, the fsGroup's), as upstream's kubelet writes
/// them.
async fn read_volumes_through_an_fs_group(rt: &RealRuntime, dir: &Path, cluster: &Cluster, node: &str) {
    let script = "echo \"secret: $(cat /db/password)\"; echo \"owners: $(stat -L -c %u:%g:%a /db/password) $(stat -L -c %u:%g:%a /tok/token)\"; \
                  echo \"token: $(head -c 3 /tok/token)\"";
    let mut pod = writer_pod("owned-reader", node, &rt.busybox_image, script, None, json!({}));
    pod["spec"]["securityContext"] = json!({"runAsUser": 1000, "fsGroup": 2000});
    pod["spec"]["volumes"] = json!([
        {"name": "db", "secret": {"secretName": "db", "defaultMode": 0o400}},
        {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
    ]);
    pod["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "db", "mountPath": "/db"}, {"name": "tok", "mountPath": "/tok"}]);
    cluster.create_pod(pod).await;
    let key = format!("{}/owned-reader", cluster.namespace());
    let uid = until(cluster, node, dir, "the owned reader to run", |v| {
        let pod = v.pods.get(&key).filter(|p| phase(p) == "Running")?;
        pod["metadata"]["uid"].as_str().map(str::to_owned)
    })
    .await;
    let log = dir.join("pods").join(format!("{}_owned-reader_{uid}", cluster.namespace())).join("app/0.log");
    wait_for_text(&log, "token: eyJ").await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("secret: hunter2\n"), "its user reads the 0400 secret through the fsGroup: {text}");
    assert!(text.contains("owners: 0:2000:440 1000:2000:640\n"), "{text}");
}

/// The body of [`real_config_map_and_secret_changes_reach_their_volumes_within_seconds_from_kube_apiserver`].
async fn follow_object_changes(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    std::fs::write(dir.join("config.yaml"), "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
        .unwrap();
    let _agent = Agent::join(&rt.endpoint, &dir, &node, &cluster.kubeconfig(&dir), &[]);
    cluster.put_config_map("app", json!({"greeting": "hello"})).await;
    cluster.put_secret("db", &[("password", b"hunter2")]).await;
    // Every 200 ms the container says what its three volumes show.
    let script = "while true; do echo \"seen: $(cat /cfg/greeting) $(cat /db/password) $(cat /all/greeting)\"; \
                  sleep 0.2; done";
    let mut pod = writer_pod("reader", &node, &rt.busybox_image, script, None, json!({}));
    pod["spec"]["volumes"] = json!([
        {"name": "cfg", "configMap": {"name": "app"}},
        {"name": "db", "secret": {"secretName": "db"}},
        {"name": "all", "projected": {"sources": [{"configMap": {"name": "app"}}, {"secret": {"name": "db"}}]}},
    ]);
    pod["spec"]["containers"][0]["volumeMounts"] = json!([
        {"name": "cfg", "mountPath": "/cfg"}, {"name": "db", "mountPath": "/db"}, {"name": "all", "mountPath": "/all"},
    ]);
    cluster.create_pod(pod).await;
    let key = format!("{}/reader", cluster.namespace());
    let uid = until(&cluster, &node, &dir, "the pod to run", |v| {
        let pod = v.pods.get(&key).filter(|p| phase(p) == "Running")?;
        pod["metadata"]["uid"].as_str().map(str::to_owned)
    })
    .await;
    let log = dir.join("pods").join(format!("{}_reader_{uid}", cluster.namespace())).join("app/0.log");
    wait_for_text(&log, "seen: hello hunter2 hello").await;
    read_volumes_through_an_fs_group(&rt, &dir, &cluster, &node).await;

    // Both objects change; the container sees both within 10 s (the resync would take a minute).
    let changed = tokio::time::Instant::now();
    cluster.put_config_map("app", json!({"greeting": "bye"})).await;
    cluster.put_secret("db", &[("password", b"letmein")]).await;
    wait_for_text(&log, "seen: bye letmein bye").await;
    eprintln!("the changes reached the container {:?} after the API", changed.elapsed());
}

/// A pod with a readiness gate is Ready only while the gate's condition, which another
/// controller sets in the API, is True (upstream's readiness gates): before, `Ready` is False
/// with reason `ReadinessGatesNotReady`; the condition outlives the kubelet's status patches; and
/// `Ready` follows each change of it, which the agent hears as a change of the pod's status.
#[tokio::test]
async fn real_readiness_gates_hold_ready_until_their_conditions_are_true_from_kube_apiserver() {
    let test = "real_readiness_gates_hold_ready_until_their_conditions_are_true_from_kube_apiserver";
    on_node(NODE_3, test, "readiness-gates", None, hold_ready_behind_a_gate).await;
}

/// Pod `name`'s condition `kind` in `view`, once the pod runs.
fn running_pod_condition<'a>(view: &'a View, cluster: &Cluster, name: &str, kind: &str) -> Option<&'a Value> {
    let pod = view.pods.get(&format!("{}/{name}", cluster.namespace())).filter(|p| phase(p) == "Running")?;
    pod["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == kind)
}

/// The body of [`real_readiness_gates_hold_ready_until_their_conditions_are_true_from_kube_apiserver`].
async fn hold_ready_behind_a_gate(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    // The periodic resync out of reach of every wait below: Ready can only follow the gate
    // because the agent hears the pod's status change.
    std::fs::write(
        dir.join("config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: 10m\n",
    )
    .unwrap();
    let _agent = Agent::join(&rt.endpoint, &dir, &node, &cluster.kubeconfig(&dir), &[]);
    let gate = "example.com/load-balancer";
    let mut pod = writer_pod("gated", &node, &rt.busybox_image, "true", None, json!({}));
    pod["spec"]["readinessGates"] = json!([{"conditionType": gate}]);
    cluster.create_pod(pod).await;
    let ready_with = |reason: &'static str| {
        let cluster = cluster.clone();
        move |v: &View| {
            let ready = running_pod_condition(v, &cluster, "gated", "Ready")?;
            (ready["reason"].as_str().unwrap_or_default() == reason).then(|| ready.clone())
        }
    };
    let held =
        until(&cluster, &node, &dir, "the gated pod to run, not Ready", ready_with("ReadinessGatesNotReady")).await;
    assert_eq!(held["status"], "False");
    let missing = format!("corresponding condition of pod readiness gate \"{gate}\" does not exist.");
    assert_eq!(held["message"], missing.as_str());
    let view = cluster.view(&node).await;
    let containers_ready = running_pod_condition(&view, &cluster, "gated", "ContainersReady").unwrap();
    assert_eq!(containers_ready["status"], "True", "only the gate holds it back");

    // The gate's controller opens it: Ready follows, and the kubelet's patch that says so keeps
    // the gate's condition.
    let opened = tokio::time::Instant::now();
    cluster.set_pod_condition("gated", gate, "True").await;
    let ready = until(&cluster, &node, &dir, "the pod to be Ready", ready_with("")).await;
    eprintln!("Ready followed the gate {:?} after the API took it", opened.elapsed());
    assert_eq!(ready["status"], "True");
    let view = cluster.view(&node).await;
    let kept = running_pod_condition(&view, &cluster, "gated", gate).expect("the gate's condition is kept");
    assert_eq!(kept["status"], "True");

    // And closes it again: Ready goes False, naming the gate's status.
    cluster.set_pod_condition("gated", gate, "False").await;
    let closed =
        until(&cluster, &node, &dir, "the pod to be unready again", ready_with("ReadinessGatesNotReady")).await;
    let message = format!("the status of pod readiness gate \"{gate}\" is not \"True\", but False");
    assert_eq!(closed["message"], message.as_str());
}

/// A pod of a runtime class runs with the class's handler and with the class's overhead in its
/// pod cgroup (upstream's runtime class manager and pod overhead). A class that does not exist
/// fails the sandbox with upstream's `FailedCreatePodSandBox` event, the pod is not refused, and
/// it runs once the class exists; a handler the runtime lacks fails it with the runtime's error.
#[tokio::test]
async fn real_runtime_classes_choose_the_sandbox_handler_and_add_their_overhead_from_kube_apiserver() {
    let test = "real_runtime_classes_choose_the_sandbox_handler_and_add_their_overhead_from_kube_apiserver";
    on_node(NODE_3, test, "runtime-classes", None, run_pods_of_runtime_classes).await;
}

/// Runtime classes the scenario makes (each name its own, as classes belong to no namespace).
const LATE_CLASS: &str = "kubelet-rs-test-late";
const BOGUS_CLASS: &str = "kubelet-rs-test-bogus";

/// A pod of runtime class `class` that sleeps, with `resources` for its container.
fn pod_of_class(name: &str, node: &str, image: &str, class: &str, resources: Value) -> Value {
    let mut pod = writer_pod(name, node, image, "true", None, resources);
    pod["spec"]["runtimeClassName"] = json!(class);
    pod
}

/// The event of `reason` about pod `name` in `view`, once there is one.
fn pod_event<'a>(view: &'a View, name: &str, reason: &str) -> Option<&'a Value> {
    view.events.iter().find(|e| e["involvedObject"]["name"] == name && e["reason"] == reason)
}

/// The handler of the ready sandbox of pod `uid`, as the runtime has it.
async fn sandbox_handler(endpoint: &str, uid: &str) -> String {
    use cri_client::pb;
    let client = cri_client::Client::connect(&cri_client::Config::new(endpoint)).unwrap();
    let filter = pb::PodSandboxFilter {
        label_selector: [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into(),
        state: Some(pb::PodSandboxStateValue { state: pb::PodSandboxState::SandboxReady.into() }),
        ..Default::default()
    };
    let request = pb::ListPodSandboxRequest { filter: Some(filter) };
    let sandboxes = client.runtime_service().list_pod_sandbox(request).await.unwrap().into_inner().items;
    assert_eq!(sandboxes.len(), 1, "one ready sandbox for {uid}");
    sandboxes[0].runtime_handler.clone()
}

/// The body of [`real_runtime_classes_choose_the_sandbox_handler_and_add_their_overhead_from_kube_apiserver`].
async fn run_pods_of_runtime_classes(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    for class in [LATE_CLASS, BOGUS_CLASS] {
        cluster.delete_runtime_class(class).await;
    }
    // A class deleted after its pod was made (the API server's admission refuses a pod of a
    // class that does not exist): the sandbox fails, in upstream's words, and the pod waits.
    let overhead = json!({"cpu": "100m", "memory": "32Mi"});
    cluster.put_runtime_class(LATE_CLASS, "runc", overhead.clone()).await;
    cluster.create_pod(pod_of_class("late", &node, &rt.busybox_image, LATE_CLASS, json!({}))).await;
    cluster.delete_runtime_class(LATE_CLASS).await;
    std::fs::write(dir.join("config.yaml"), "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
        .unwrap();
    let _agent = Agent::join(&rt.endpoint, &dir, &node, &cluster.kubeconfig(&dir), &[]);
    let failed = until(&cluster, &node, &dir, "the late pod's sandbox to fail", |v| {
        pod_event(v, "late", "FailedCreatePodSandBox").cloned()
    })
    .await;
    let not_found = format!("Failed to create pod sandbox: runtimeclass.node.k8s.io {LATE_CLASS:?} not found");
    assert_eq!(failed["message"], not_found.as_str());
    assert_eq!(failed["type"], "Warning");
    let view = cluster.view(&node).await;
    assert_eq!(phase(&view.pods[&format!("{}/late", cluster.namespace())]), "Pending", "waiting, not refused");

    // A class whose handler the runtime lacks: the runtime's error.
    cluster.put_runtime_class(BOGUS_CLASS, "no-such-handler", json!({})).await;
    cluster.create_pod(pod_of_class("bogus", &node, &rt.busybox_image, BOGUS_CLASS, json!({}))).await;
    let failed = until(&cluster, &node, &dir, "the bogus pod's sandbox to fail", |v| {
        pod_event(v, "bogus", "FailedCreatePodSandBox").cloned()
    })
    .await;
    let message = failed["message"].as_str().unwrap();
    assert!(message.starts_with("Failed to create pod sandbox: ") && message.contains("no-such-handler"), "{message}");

    // The class comes back: the late pod runs at its next try, on the class's handler; a pod
    // made now gets the class's overhead (the API server's admission sets it) and its pod cgroup
    // holds its limits and the overhead.
    cluster.put_runtime_class(LATE_CLASS, "runc", overhead.clone()).await;
    let limits = json!({"cpu": "200m", "memory": "64Mi"});
    let resources = json!({"requests": limits, "limits": limits});
    cluster.create_pod(pod_of_class("classy", &node, &rt.busybox_image, LATE_CLASS, resources)).await;
    let ns = cluster.namespace().to_owned();
    let uids = until(&cluster, &node, &dir, "the late and classy pods to run", |v| {
        let running_uid = |name: &str| {
            let pod = v.pods.get(&format!("{ns}/{name}")).filter(|p| phase(p) == "Running")?;
            pod["metadata"]["uid"].as_str().map(str::to_owned)
        };
        Some((running_uid("late")?, running_uid("classy")?))
    })
    .await;
    let view = cluster.view(&node).await;
    assert_eq!(view.pods[&format!("{ns}/classy")]["spec"]["overhead"], overhead, "the API server's admission");
    for uid in [&uids.0, &uids.1] {
        assert_eq!(sandbox_handler(&rt.endpoint, uid).await, "runc");
    }
    let cgroup = |controller: &str, file: &str| {
        let path = format!("/sys/fs/cgroup/{controller}/kubepods/pod{}/{file}", uids.1);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")).trim().to_owned()
    };
    assert_eq!(cgroup("memory", "memory.limit_in_bytes"), (96u64 << 20).to_string(), "64Mi and 32Mi of overhead");
    assert_eq!(cgroup("cpu", "cpu.cfs_quota_us"), "30000", "200m and 100m of overhead");
    for class in [LATE_CLASS, BOGUS_CLASS] {
        cluster.delete_runtime_class(class).await;
    }
}

/// `kubectl debug`: an ephemeral container added to a running pod runs in the process namespace
/// of its target container, with its `envFrom`, and its status is reported in the pod's
/// `ephemeralContainerStatuses` (upstream's ephemeral containers).
#[tokio::test]
async fn real_an_ephemeral_container_debugs_its_target_from_kube_apiserver() {
    let test = "real_an_ephemeral_container_debugs_its_target_from_kube_apiserver";
    on_node(NODE_3, test, "ephemeral-containers", None, debug_a_running_pod).await;
}

/// Adds `ephemeral` to pod `name` through its `ephemeralcontainers` subresource, as `kubectl
/// debug` does: read, then written back with the container added (before v1.22 the subresource
/// is an `EphemeralContainers` object, from then on the pod).
async fn add_ephemeral_container(client: &kube::Client, namespace: &str, name: &str, ephemeral: Value) {
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}/ephemeralcontainers");
    let read = axum::http::Request::get(&path).body(Vec::new()).unwrap();
    let mut object: Value = client.request(read).await.unwrap();
    let list = if object["kind"] == "EphemeralContainers" {
        &mut object["ephemeralContainers"]
    } else {
        &mut object["spec"]["ephemeralContainers"]
    };
    if list.is_null() {
        *list = json!([]);
    }
    list.as_array_mut().unwrap().push(ephemeral);
    let write = axum::http::Request::put(&path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&object).unwrap())
        .unwrap();
    let _: Value = client.request(write).await.unwrap();
}

/// The body of [`real_an_ephemeral_container_debugs_its_target_from_kube_apiserver`].
async fn debug_a_running_pod(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    let Cluster::Remote { client, namespace, .. } = &*cluster else { panic!("kube-apiserver only") };
    std::fs::write(dir.join("config.yaml"), "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
        .unwrap();
    let _agent = Agent::join(&rt.endpoint, &dir, &node, &cluster.kubeconfig(&dir), &[]);
    cluster.put_config_map("debug-env", json!({"greeting": "hello"})).await;
    // The target's command line names a word its own process alone shows. It reads the config
    // map the debugger's `envFrom` names too: kube-apiserver v1.20's node authorizer lets a node
    // read only what the pod's spec named when it was bound, not what an ephemeral container adds.
    let mut target = writer_pod("target", &node, &rt.busybox_image, "echo the-target-runs", None, json!({}));
    target["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "debug-env"}}]);
    cluster.create_pod(target).await;
    let key = format!("{namespace}/target");
    let uid = until(&cluster, &node, &dir, "the target to run", |v| {
        let pod = v.pods.get(&key).filter(|p| phase(p) == "Running")?;
        pod["metadata"]["uid"].as_str().map(str::to_owned)
    })
    .await;

    let debugger = json!({"name": "debugger", "image": rt.busybox_image, "imagePullPolicy": "IfNotPresent",
        "targetContainerName": "app", "envFrom": [{"configMapRef": {"name": "debug-env"}, "prefix": "CFG_"}],
        "command": ["sh", "-c", "echo \"greeting: $CFG_greeting\"; ps -o args; exec sleep 3600"],
        "terminationMessagePolicy": "File"});
    add_ephemeral_container(client, namespace, "target", debugger).await;
    let status = until(&cluster, &node, &dir, "the debugger's status", |v| {
        let statuses = v.pods.get(&key)?["status"]["ephemeralContainerStatuses"].as_array()?.clone();
        statuses.into_iter().find(|s| s["name"] == "debugger" && s["state"]["running"].is_object())
    })
    .await;
    assert!(status["containerID"].as_str().unwrap().starts_with("containerd://"), "{status}");
    let log = dir.join("pods").join(format!("{namespace}_target_{uid}")).join("debugger/0.log");
    wait_for_text(&log, "sleep 3600").await;
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("greeting: hello"), "its envFrom: {said}");
    assert!(said.contains("the-target-runs"), "it sees its target's processes: {said}");
    let view = cluster.view(&node).await;
    let pod = &view.pods[&key];
    assert_eq!(phase(pod), "Running");
    assert_eq!(pod["status"]["containerStatuses"].as_array().unwrap().len(), 1, "the debugger is not a container");
}

/// A node given a dual-stack `--node-ip` reports both addresses as `InternalIP`s, primary first,
/// and gives both to a host-network pod as its `podIPs` (and `hostIPs`, where the API server
/// keeps them), as upstream's kubelet does without a cloud provider.
#[tokio::test]
async fn real_a_dual_stack_node_reports_both_of_its_addresses_from_kube_apiserver() {
    let test = "real_a_dual_stack_node_reports_both_of_its_addresses_from_kube_apiserver";
    on_node(NODE_3, test, "dual-stack", None, |rt, dir, cluster, node| async move {
        report_both_addresses(test, rt, dir, cluster, node).await;
    })
    .await;
}

/// The body of [`real_a_dual_stack_node_reports_both_of_its_addresses_from_kube_apiserver`].
async fn report_both_addresses(test: &str, rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    std::fs::write(dir.join("config.yaml"), "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
        .unwrap();
    let node_ips = ["192.0.2.10", "2001:db8::10"];
    let flag = node_ips.join(",");
    let _agent = Agent::join(&rt.endpoint, &dir, &node, &cluster.kubeconfig(&dir), &["--node-ip", &flag]);
    let mut pod = writer_pod("on-host", &node, &rt.busybox_image, "true", None, json!({}));
    pod["spec"]["hostNetwork"] = json!(true);
    cluster.create_pod(pod).await;
    let key = format!("{}/on-host", cluster.namespace());
    let status = until(&cluster, &node, &dir, "the host-network pod to run", |v| {
        v.pods.get(&key).filter(|p| phase(p) == "Running").map(|p| p["status"].clone())
    })
    .await;
    let view = cluster.view(&node).await;
    let addresses: Vec<(&str, &str)> = view.nodes[&node]["status"]["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["type"].as_str().unwrap(), a["address"].as_str().unwrap()))
        .collect();
    assert_eq!(addresses, [("InternalIP", node_ips[0]), ("InternalIP", node_ips[1]), ("Hostname", node.as_str())]);
    let listed = |list: &Value| -> Vec<String> {
        list.as_array().into_iter().flatten().map(|ip| ip["ip"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(listed(&status["podIPs"]), node_ips, "{status}");
    assert_eq!(status["hostIP"], node_ips[0]);
    if cluster.serves(test, "a pod's status.hostIPs", 28) {
        assert_eq!(listed(&status["hostIPs"]), node_ips, "{status}");
    }
}

/// The Node a node registers, and puts back when it adopts one, as upstream's `initialNode`:
/// the stable and beta OS and architecture labels, `--node-labels` over the defaults, the
/// attach/detach annotation, `providerID`, and under `--cloud-provider=external` the
/// uninitialized taint and the given IP for the cloud's controller; without
/// `localStorageCapacityIsolation`, no `ephemeral-storage` in its capacity.
#[tokio::test]
async fn real_a_node_registers_and_adopts_its_node_as_upstream_from_kube_apiserver() {
    let test = "real_a_node_registers_and_adopts_its_node_as_upstream_from_kube_apiserver";
    on_node(NODE_3, test, "registration", None, register_and_adopt).await;
}

/// The body of [`real_a_node_registers_and_adopts_its_node_as_upstream_from_kube_apiserver`].
async fn register_and_adopt(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    let Cluster::Remote { client, .. } = &*cluster else { panic!("kube-apiserver only") };
    std::fs::write(
        dir.join("config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nproviderID: kubelet-rs://test/node-3\n\
         localStorageCapacityIsolation: false\n",
    )
    .unwrap();
    let flags = [
        "--cloud-provider=external",
        "--node-ip=192.0.2.10",
        "--node-labels=kubernetes.io/hostname=edge-3.example,node.kubernetes.io/pool=edge",
    ];
    let agent = Agent::join(&rt.endpoint, &dir, &node, &cluster.kubeconfig(&dir), &flags);
    let registered = until(&cluster, &node, &dir, "the node to register", |v| v.nodes.get(&node).cloned()).await;
    let (labels, annotations) = (&registered["metadata"]["labels"], &registered["metadata"]["annotations"]);
    assert_eq!(labels["kubernetes.io/hostname"], "edge-3.example", "--node-labels over the default");
    assert_eq!(labels["node.kubernetes.io/pool"], "edge");
    assert_eq!((&labels["kubernetes.io/os"], &labels["beta.kubernetes.io/os"]), (&json!("linux"), &json!("linux")));
    assert_eq!(labels["kubernetes.io/arch"], labels["beta.kubernetes.io/arch"]);
    assert_eq!(annotations["volumes.kubernetes.io/controller-managed-attach-detach"], "true");
    assert_eq!(annotations["alpha.kubernetes.io/provided-node-ip"], "192.0.2.10");
    assert_eq!(registered["spec"]["providerID"], "kubelet-rs://test/node-3");
    for list in ["capacity", "allocatable"] {
        let resources = &registered["status"][list];
        assert!(resources["cpu"].is_string() && resources["ephemeral-storage"].is_null(), "no isolation: {resources}");
    }
    let taints = registered["spec"]["taints"].as_array().unwrap();
    assert!(
        taints
            .iter()
            .any(|t| t["key"] == "node.cloudprovider.kubernetes.io/uninitialized" && t["effect"] == "NoSchedule"),
        "{taints:?}"
    );
    drop(agent);

    // An administrator takes the kubelet's beta label and annotation off; the node, started
    // again, puts them back and leaves the administrator's own label.
    let remove = json!({"metadata": {"labels": {"beta.kubernetes.io/os": null, "team": "ops"},
        "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": null}}});
    Api::<Node>::all(client.clone()).patch(&node, &PatchParams::default(), &Patch::Merge(remove)).await.unwrap();
    let _agent = Agent::join(&rt.endpoint, &dir, &node, &cluster.kubeconfig(&dir), &flags);
    let adopted = until(&cluster, &node, &dir, "the node to take its label and annotation back", |v| {
        let node = v.nodes.get(&node)?;
        let back = node["metadata"]["labels"]["beta.kubernetes.io/os"] == "linux"
            && node["metadata"]["annotations"]["volumes.kubernetes.io/controller-managed-attach-detach"] == "true";
        back.then(|| node.clone())
    })
    .await;
    assert_eq!(adopted["metadata"]["labels"]["team"], "ops");
}

#[tokio::test]
async fn real_api_pods_deleted_in_rounds_leave_nothing_on_the_node_from_kube_apiserver() {
    let test = "real_api_pods_deleted_in_rounds_leave_nothing_on_the_node_from_kube_apiserver";
    on_node(NODE_3, test, "deleted-in-rounds", None, delete_in_rounds).await;
}

/// The body of [`real_api_pods_deleted_in_rounds_leave_nothing_on_the_node_from_kube_apiserver`]:
/// rounds of pods created together and deleted together, each round as soon as the last is gone
/// from the API, so the node removes one round's leftovers while it starts the next. Once the
/// last round is gone, nothing of any of them stays on the node: no sandbox or container in the
/// runtime, no pod cgroup, no pod or log directory.
async fn delete_in_rounds(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    const ROUNDS: usize = 3;
    const PODS: usize = 40;
    std::fs::write(
        dir.join("config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nkubeAPIQPS: 50\nkubeAPIBurst: 100\n",
    )
    .unwrap();
    let _agent = Agent::join(&rt.endpoint, &dir, &node, &cluster.kubeconfig(&dir), &[]);
    let ns = cluster.namespace().to_owned();
    let names: Vec<String> = (0..PODS).map(|i| format!("churn-{i}")).collect();
    let mut uids = std::collections::BTreeSet::new();
    for round in 1..=ROUNDS {
        let pods = names.iter().map(|name| writer_pod(name, &node, &rt.busybox_image, "true", None, json!({})));
        futures::future::join_all(pods.map(|pod| cluster.create_pod(pod))).await;
        let running = until(&cluster, &node, &dir, &format!("round {round}'s pods to run"), |v| {
            let running: Vec<String> = names
                .iter()
                .filter_map(|name| v.pods.get(&format!("{ns}/{name}")).filter(|p| phase(p) == "Running"))
                .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
                .collect();
            (running.len() == PODS).then_some(running)
        })
        .await;
        uids.extend(running);
        futures::future::join_all(names.iter().map(|name| cluster.delete_pod(name, 2))).await;
        until(&cluster, &node, &dir, &format!("round {round}'s pods to go from the API"), |v| {
            (!names.iter().any(|name| v.pods.contains_key(&format!("{ns}/{name}")))).then_some(())
        })
        .await;
    }
    assert_eq!(uids.len(), ROUNDS * PODS, "each round's pods are new pods");
    let runtime = cri_runtime(&rt, &dir);
    let cleared = tokio::time::Instant::now();
    let deadline = cleared + Duration::from_secs(30);
    loop {
        let mut left: Vec<String> = runtime
            .get_pods(true)
            .await
            .unwrap()
            .into_iter()
            .filter(|pod| uids.contains(pod.uid.as_str()))
            .map(|pod| format!("{} in the runtime", pod.uid))
            .collect();
        left.extend(uids.iter().flat_map(|uid| leftovers_on_host(&dir, uid)));
        if left.is_empty() {
            eprintln!(
                "the node held nothing of the {} pods {:?} after the last round was gone",
                uids.len(),
                cleared.elapsed()
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "30 s after the last round was gone from the API, the node still held {left:#?}\nagent log:\n{}",
            std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What of pod `uid` is on the host beside the runtime: its pod cgroup under any hierarchy and
/// QoS class, its pod directory and its log directory.
fn leftovers_on_host(dir: &Path, uid: &str) -> Vec<String> {
    let mut left = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().filter_map(Result::ok) {
        for class in ["", "burstable/", "besteffort/"] {
            let cgroup = hierarchy.path().join(format!("kubepods/{class}pod{uid}"));
            if cgroup.exists() {
                left.push(cgroup.display().to_string());
            }
        }
    }
    let pod_dir = dir.join("root/pods").join(uid);
    if pod_dir.exists() {
        left.push(pod_dir.display().to_string());
    }
    let logs = std::fs::read_dir(dir.join("pods")).into_iter().flatten().filter_map(Result::ok);
    left.extend(
        logs.filter(|e| e.file_name().to_string_lossy().ends_with(&format!("_{uid}")))
            .map(|e| e.path().display().to_string()),
    );
    left
}

/// The directory of `cargo xtask cluster up`'s certificates (the admin kubeconfig's CA's).
fn cluster_pki() -> PathBuf {
    let admin = std::env::var("KUBELET_RS_TEST_KUBECONFIG").unwrap();
    let kubeconfig = std::fs::read_to_string(admin).unwrap();
    let ca = kubeconfig.lines().find_map(|l| l.trim().strip_prefix("certificate-authority: ")).unwrap();
    Path::new(ca.trim()).parent().unwrap().to_owned()
}

/// `curl` of `path` on the kubelet API at `port` with `credentials` (curl's options): the
/// status and the body.
fn call_kubelet(port: u64, path: &str, credentials: &[&str]) -> (u16, String) {
    let output = std::process::Command::new("curl")
        .args(["-sSk", "--max-time", "20", "-w", "\n%{http_code}"])
        .args(credentials)
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap();
    // No answer at all (status 000): what curl says goes in the body, so the assertion shows it.
    let status: u16 = status.parse().unwrap();
    let body = if status == 0 { String::from_utf8_lossy(&output.stderr).into_owned() } else { body.to_owned() };
    (status, body)
}

/// Starts the agent as `node` with its kubelet API trusting the cluster's CA for client
/// certificates and asking the API server (Webhook) who may do what, and `extra` in its
/// configuration; the agent and its kubelet API's port, once the Node reports it.
async fn join_with_the_kubelet_api(
    rt: &RealRuntime,
    dir: &Path,
    cluster: &Cluster,
    node: &str,
    extra: &str,
) -> (Agent, u64) {
    std::fs::write(
        dir.join("config.yaml"),
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             authentication: {{x509: {{clientCAFile: {}}}}}\n\
             authorization: {{mode: Webhook, webhook: {{cacheUnauthorizedTTL: 1s}}}}\n{extra}",
            cluster_pki().join("ca.crt").display()
        ),
    )
    .unwrap();
    let kubeconfig = cluster.kubeconfig(dir);
    let agent = Agent::join(&rt.endpoint, dir, node, &kubeconfig, &[]);
    // This agent's port: a Node of the same name that an earlier agent updated last would give
    // that one's.
    let port = until(cluster, node, dir, "the node's kubelet endpoint", |v| {
        let reported = v.nodes.get(node)?["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"].as_u64()?;
        (reported == u64::from(agent.1)).then_some(reported)
    })
    .await;
    (agent, port)
}

/// The body of [`real_the_kubelet_api_serves_kubectl_logs_and_refuses_whom_rbac_does_not_allow`].
async fn serve_the_kubelet_api(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    use k8s_openapi::api::{
        authentication::v1::TokenRequest,
        core::v1::ServiceAccount,
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    };
    let pki = cluster_pki();
    let (agent, port) = join_with_the_kubelet_api(&rt, &dir, &cluster, &node, "").await;
    let Cluster::Remote { client, namespace, .. } = &*cluster else { panic!("kube-apiserver only") };
    distinct_large_tokens_cost_the_agent_no_memory(agent.0.id(), port).await;
    let script = "echo hello through the kubelet API; sleep 3; echo and once more; while sleep 1; do echo tick; done";
    cluster.create_pod(writer_pod("talker", &node, &rt.busybox_image, script, None, json!({}))).await;
    let key = format!("{namespace}/talker");
    until(&cluster, &node, &dir, "the pod to run", |v| v.pods.get(&key).filter(|p| phase(p) == "Running").cloned())
        .await;

    // kubectl logs: pods/log, which kube-apiserver fetches from the agent's /containerLogs.
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let mut log = String::new();
    for _ in 0..50 {
        log = pods.logs("talker", &kube::api::LogParams::default()).await.unwrap_or_else(|e| e.to_string());
        if log.contains("hello") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(log.starts_with("hello through the kubelet API\n"), "{log:?}");
    let first = kube::api::LogParams { tail_lines: Some(1), timestamps: true, ..Default::default() };
    let log = pods.logs("talker", &first).await.unwrap();
    let (timestamp, line) = log.split_once(' ').unwrap();
    assert!(timestamp.starts_with("20") && timestamp.ends_with('Z'), "{log:?}");
    assert!(matches!(line, "hello through the kubelet API\n" | "and once more\n" | "tick\n"), "one line: {log:?}");
    // kubectl logs --previous of a container that never restarted: upstream's 400, as kubectl shows it.
    let previous = kube::api::LogParams { previous: true, ..Default::default() };
    let error = pods.logs("talker", &previous).await.unwrap_err().to_string();
    assert!(error.contains("previous terminated container \"app\" in pod \"talker\" not found"), "{error}");
    // kubectl logs --limit-bytes: the output cut where the bytes run out.
    let limited = kube::api::LogParams { limit_bytes: Some(5), ..Default::default() };
    assert_eq!(pods.logs("talker", &limited).await.unwrap(), "hello");
    // kubectl logs -f: the stream goes on with what the container writes next.
    let follow = kube::api::LogParams { follow: true, ..Default::default() };
    let mut lines = futures::AsyncBufReadExt::lines(pods.log_stream("talker", &follow).await.unwrap());
    let followed = tokio::time::timeout(Duration::from_secs(20), async {
        let mut seen = Vec::new();
        while let Some(line) = futures::StreamExt::next(&mut lines).await {
            seen.push(line.unwrap());
            if seen.last().is_some_and(|l| l == "and once more") {
                break;
            }
        }
        seen
    })
    .await
    .expect("the followed log's second line");
    assert_eq!(followed, ["hello through the kubelet API", "and once more"]);
    exec_attach_and_port_forward(&pods).await;
    stats_through_the_api_server(client, &node, namespace).await;
    exec_and_port_forward_over_spdy(namespace).await;

    // Nobody: 401. Another node: its certificate authenticates, the Node authorizer refuses.
    assert_eq!(call_kubelet(port, "/pods", &[]), (401, "Unauthorized".to_owned()));
    let (other_cert, other_key) = (pki.join("kubelet-rs-node-0.crt"), pki.join("kubelet-rs-node-0.key"));
    let other_node = ["--cert", other_cert.to_str().unwrap(), "--key", other_key.to_str().unwrap()];
    // Fine-grained kubelet authorization (v1.36): `pods` is asked first, then `proxy`.
    let forbidden = |user: &str, subresources: &str| {
        format!("Forbidden (user={user}, verb=get, resource=nodes, subresource(s)=[{subresources}])\n")
    };
    let refused = (403, forbidden("system:node:kubelet-rs-node-0", "pods proxy"));
    assert_eq!(call_kubelet(port, "/pods", &other_node), refused);
    // kube-apiserver's own certificate may do anything: /run runs a command to its end.
    let (master_cert, master_key) =
        (pki.join("apiserver-kubelet-client.crt"), pki.join("apiserver-kubelet-client.key"));
    let master = ["--cert", master_cert.to_str().unwrap(), "--key", master_key.to_str().unwrap(), "-X", "POST"];
    let run = format!("/run/{namespace}/talker/app?cmd=echo%20ran%20here");
    assert_eq!(call_kubelet(port, &run, &master), (200, "ran here\n".to_owned()));
    let missing = format!("/run/{namespace}/talker/nothing?cmd=true");
    assert_eq!(call_kubelet(port, &missing, &master), (404, "container not found (\"nothing\")".to_owned()));
    // With the pod's UID in the path, only that pod is meant.
    let uid = pods.get("talker").await.unwrap().metadata.uid.unwrap();
    let run_uid = format!("/run/{namespace}/talker/{uid}/app?cmd=echo%20this%20pod");
    assert_eq!(call_kubelet(port, &run_uid, &master), (200, "this pod\n".to_owned()));
    let other_uid = format!("/run/{namespace}/talker/00000000-0000-0000-0000-000000000000/app?cmd=true");
    assert_eq!(call_kubelet(port, &other_uid, &master), (404, "pod does not exist".to_owned()));
    // /spec/: the machine as cAdvisor describes it.
    let (status, spec) = call_kubelet(port, "/spec/", &master[..4]);
    assert_eq!(status, 200, "{spec}");
    let spec: Value = serde_json::from_str(&spec).unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert_eq!(spec["num_cores"].as_u64(), Some(cpus as u64), "{spec}");
    assert!(spec["memory_capacity"].as_u64().unwrap() > 0, "{spec}");
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(spec["boot_id"], boot_id.trim(), "{spec}");

    // A service account's token: a TokenReview names it, RBAC refuses it until a role allows it.
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), namespace);
    let request: TokenRequest = serde_json::from_value(json!({"spec": {"audiences": []}})).unwrap();
    let token = accounts.create_token_request("default", &PostParams::default(), &request).await.unwrap();
    let token = token.status.unwrap().token.unwrap();
    let bearer = format!("Authorization: Bearer {token}");
    let with_token = ["-H", bearer.as_str()];
    let account = format!("system:serviceaccount:{namespace}:default");
    assert_eq!(call_kubelet(port, "/pods", &with_token), (403, forbidden(&account, "pods proxy")));
    assert_eq!(call_kubelet(port, "/stats/summary", &with_token), (403, forbidden(&account, "stats")));
    assert_eq!(call_kubelet(port, "/pods", &["-H", "Authorization: Bearer not-a-token"]).0, 401);
    let name = format!("{namespace}-nodes-proxy");
    let role: ClusterRole = serde_json::from_value(json!({"metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]}))
    .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}]}))
    .unwrap();
    let roles = Api::<ClusterRole>::all(client.clone());
    let bindings = Api::<ClusterRoleBinding>::all(client.clone());
    roles.create(&PostParams::default(), &role).await.unwrap();
    bindings.create(&PostParams::default(), &binding).await.unwrap();
    // The denial is cached for cacheUnauthorizedTTL (1 s here), and RBAC takes a moment to see the binding.
    let mut answer = (0, String::new());
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        answer = call_kubelet(port, "/pods", &with_token);
        if answer.0 == 200 {
            break;
        }
    }
    let _ = bindings.delete(&name, &DeleteParams::default()).await;
    let _ = roles.delete(&name, &DeleteParams::default()).await;
    assert_eq!(answer.0, 200, "{answer:?}");
    let list: Value = serde_json::from_str(&answer.1).unwrap();
    assert!(list["items"].as_array().unwrap().iter().any(|p| p["metadata"]["name"] == "talker"), "{list}");
    assert_eq!(call_kubelet(port, "/stats/summary", &with_token).0, 403, "nodes/proxy is not nodes/stats");
}

/// Tokens a caller sends and kube-apiserver rejects: 400 MB that a cache keyed by the token
/// would hold (each takes kube-apiserver about 20 ms to review on two cores, so the token
/// cache's whole 4,096 would add over a minute to every CI run).
const FLOOD_TOKENS: usize = 1024;
/// The size of each.
const FLOOD_TOKEN_BYTES: usize = 400 * 1024;

/// 1,024 distinct tokens of 400 KB each, sent to the kubelet API over four kept-alive
/// connections: each is reviewed by kube-apiserver and refused (401), and the agent's resident
/// memory grows by less than 32 MiB, what the requests in flight and the allocator's arenas
/// hold (the token cache keeps a digest of each token, not the token: 400 MB before).
async fn distinct_large_tokens_cost_the_agent_no_memory(pid: u32, port: u64) {
    let resident = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap().to_owned();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    // A few first, as the flood sends them, so that the buffers its requests grow are in the
    // figure before.
    send_tokens_in_four(port, 0..64).await;
    let before = resident();
    let started = tokio::time::Instant::now();
    send_tokens_in_four(port, 64..64 + FLOOD_TOKENS).await;
    let after = resident();
    let grown = after.saturating_sub(before);
    println!(
        "{FLOOD_TOKENS} tokens of {} KiB refused in {:.1} s; the agent's resident memory {} -> {} MiB (+{:.1})",
        FLOOD_TOKEN_BYTES / 1024,
        started.elapsed().as_secs_f64(),
        before >> 20,
        after >> 20,
        grown as f64 / f64::from(1 << 20),
    );
    assert!(grown < 32 << 20, "the agent's resident memory grew by {grown} bytes");
}

/// Sends `tokens` over four kept-alive connections at once, a quarter on each.
async fn send_tokens_in_four(port: u64, tokens: std::ops::Range<usize>) {
    let quarter = tokens.len() / 4;
    let senders: Vec<_> = (0..4)
        .map(|i| tokens.start + i * quarter)
        .map(|first| tokio::spawn(send_tokens(port, first..first + quarter)))
        .collect();
    for sender in senders {
        sender.await.unwrap();
    }
}

/// Sends `GET /pods` with a distinct token of `FLOOD_TOKEN_BYTES` for each of `tokens` on one
/// kept-alive TLS connection, and checks that each is refused with 401.
async fn send_tokens(port: u64, tokens: std::ops::Range<usize>) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", u16::try_from(port).unwrap())).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("node").unwrap();
    let tls = common::trusting_connector().connect(name, stream).await.unwrap();
    let mut connection = tokio::io::BufReader::new(tls);
    let padding = "t".repeat(FLOOD_TOKEN_BYTES - 16);
    for token in tokens {
        let request = format!("GET /pods HTTP/1.1\r\nHost: node\r\nAuthorization: Bearer {token:016}{padding}\r\n\r\n");
        connection.get_mut().write_all(request.as_bytes()).await.unwrap();
        let mut status = String::new();
        connection.read_line(&mut status).await.unwrap();
        assert!(status.starts_with("HTTP/1.1 401"), "token {token}: {status:?}");
        let mut length = 0;
        loop {
            let mut line = String::new();
            connection.read_line(&mut line).await.unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; length];
        connection.read_exact(&mut body).await.unwrap();
        assert_eq!(body, b"Unauthorized", "token {token}");
    }
}

/// `kubectl exec`, `attach` and `port-forward` over WebSocket through kube-apiserver to the
/// pod `talker`: stdin in, stdout and stderr apart, the exit code, a terminal's size, and a
/// forwarded port.
async fn exec_attach_and_port_forward(pods: &Api<Pod>) {
    use kube::api::{AttachParams, TerminalSize};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let read_all = async |stream: Option<Box<dyn tokio::io::AsyncRead + Unpin + Send>>| {
        let mut text = String::new();
        stream.unwrap().read_to_string(&mut text).await.unwrap();
        text
    };
    let streams = AttachParams::default().container("app").stdin(true).stdout(true).stderr(true);
    let script = "read line; echo \"out:$line\"; echo err >&2; exit 3";
    let mut process = pods.exec("talker", ["sh", "-c", script], &streams).await.unwrap();
    let mut stdin = process.stdin().unwrap();
    stdin.write_all(b"ping\n").await.unwrap();
    let stdout = process.stdout().map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
    let stderr = process.stderr().map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
    let status = process.take_status().unwrap();
    let (out, err) = tokio::join!(read_all(stdout), read_all(stderr));
    assert_eq!((out.as_str(), err.as_str()), ("out:ping\n", "err\n"));
    let status = status.await.unwrap();
    let causes = status.details.and_then(|d| d.causes).unwrap_or_default();
    assert!(
        causes.iter().any(|c| c.reason.as_deref() == Some("ExitCode") && c.message.as_deref() == Some("3")),
        "{causes:?}"
    );

    // A terminal, resized before the command reads its size.
    let terminal = AttachParams::interactive_tty().container("app");
    let mut process = pods.exec("talker", ["sh", "-c", "sleep 1; stty size"], &terminal).await.unwrap();
    let mut resize = process.terminal_size().unwrap();
    futures::SinkExt::send(&mut resize, TerminalSize { width: 123, height: 45 }).await.unwrap();
    let stdout = process.stdout().map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>);
    let text = tokio::time::timeout(Duration::from_secs(20), read_all(stdout)).await.unwrap();
    assert_eq!(text.trim(), "45 123");

    // kubectl attach: the container's own output, from now on.
    let mut attached = pods.attach("talker", &AttachParams::default().container("app").stderr(false)).await.unwrap();
    let mut output = attached.stdout().unwrap();
    let mut chunk = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(20), output.read(&mut chunk)).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&chunk[..read]).starts_with("tick\n"), "{:?}", &chunk[..read]);
    attached.abort();

    // Port-forward to a web server the pod starts.
    let serve = AttachParams::default().container("app").stdout(true).stderr(true);
    let start = "echo forwarded > /tmp/index.html && httpd -p 8080 -h /tmp";
    let mut starting = pods.exec("talker", ["sh", "-c", start], &serve).await.unwrap();
    // The final status, not `join`: on v4.channel.k8s.io (containerd's), kube-rs's `join`
    // closes the whole WebSocket at once for want of a way to close stdin alone, which can cut
    // the command short.
    let status = starting.take_status().unwrap().await.unwrap();
    assert_eq!(status.status.as_deref(), Some("Success"), "{status:?}");
    drop(starting);
    let mut forwarder = pods.portforward("talker", &[8080]).await.unwrap();
    let mut connection = forwarder.take_stream(8080).unwrap();
    connection.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    connection.read_to_string(&mut answer).await.unwrap();
    drop(connection);
    let ended = forwarder.join().await;
    assert!(answer.starts_with("HTTP/1.") && answer.ends_with("forwarded\n"), "{answer:?}; the forwarder: {ended:?}");
}

/// `kubectl exec` and `kubectl port-forward` over SPDY (kubectl's protocol before WebSocket)
/// to the pod `talker` in `namespace`, when kubectl is installed.
async fn exec_and_port_forward_over_spdy(namespace: &str) {
    use std::io::{BufRead, Write};
    let admin = std::env::var("KUBELET_RS_TEST_KUBECONFIG").unwrap();
    let kubectl = || {
        let mut command = std::process::Command::new("kubectl");
        command.args(["--kubeconfig", &admin, "-n", namespace]);
        command.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false").env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false");
        command
    };
    if std::process::Command::new("kubectl").arg("version").arg("--client").output().is_err() {
        let why = "no kubectl on PATH (`cargo xtask setup` installs Debian's kubernetes-client)";
        kubelet_core::testing::skip("the SPDY half of the kubelet API test", why);
        return;
    }
    let script = "read line; echo \"spdy:$line\"; echo oops >&2; exit 4";
    let mut exec = kubectl()
        .args(["exec", "-i", "talker", "-c", "app", "--", "sh", "-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    exec.stdin.take().unwrap().write_all(b"pong\n").unwrap();
    let output = exec.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(stdout, "spdy:pong\n", "{stderr}");
    assert!(stderr.starts_with("oops\n"), "{stderr}");
    assert_eq!(output.status.code(), Some(4), "kubectl exits with the command's code");

    let mut forward = kubectl()
        .args(["port-forward", "pod/talker", "0:8080"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    // Kept open: kubectl writes a line per connection, and a closed pipe would end it.
    let mut said = std::io::BufReader::new(forward.stdout.take().unwrap());
    said.read_line(&mut first).unwrap();
    let port = first.split("127.0.0.1:").nth(1).and_then(|r| r.split(' ').next()).map(str::to_owned);
    let answer = port.map(|port| {
        std::process::Command::new("curl")
            .args(["-s", "--max-time", "20"])
            .arg(format!("http://127.0.0.1:{port}/index.html"))
            .output()
            .unwrap()
    });
    let _ = forward.kill();
    let _ = forward.wait();
    drop(said);
    let answer = answer.map(|a| String::from_utf8_lossy(&a.stdout).into_owned());
    assert_eq!(answer.as_deref(), Some("forwarded\n"), "kubectl port-forward said {first:?}");
}

/// `nodes/NODE/proxy/stats/summary` and `nodes/NODE/proxy/metrics/resource` through
/// kube-apiserver, as metrics-server reads them: the node's and the running pod `talker`'s CPU
/// and memory, in upstream's shapes; then `configz`, the node's `/var/log` at `logs/`, a new
/// verbosity put at `debug/flags/v`, and the agent's own metrics.
async fn stats_through_the_api_server(client: &kube::Client, node: &str, namespace: &str) {
    let get = |path: String| {
        let request = axum::http::Request::get(path).body(Vec::new()).unwrap();
        let client = client.clone();
        async move { client.request_text(request).await.unwrap() }
    };
    let summary: Value = serde_json::from_str(&get(format!("/api/v1/nodes/{node}/proxy/stats/summary")).await).unwrap();
    assert_eq!(summary["node"]["nodeName"], node);
    for path in [["cpu", "usageCoreNanoSeconds"], ["memory", "workingSetBytes"], ["fs", "capacityBytes"]] {
        assert!(summary["node"][path[0]][path[1]].as_u64().unwrap_or(0) > 0, "node {path:?}: {}", summary["node"]);
    }
    let pods = summary["pods"].as_array().unwrap();
    let talker = pods.iter().find(|p| p["podRef"]["name"] == "talker").unwrap();
    assert_eq!(talker["podRef"]["namespace"], namespace);
    let app = &talker["containers"][0];
    assert_eq!(app["name"], "app");
    assert!(app["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0, "{app}");
    assert!(app["memory"]["workingSetBytes"].as_u64().unwrap() > 0, "{app}");
    assert!(app["startTime"].as_str().unwrap().ends_with('Z'), "{app}");
    assert!(talker["ephemeral-storage"]["usedBytes"].as_u64().unwrap() > 0, "the log at least: {talker}");
    // The pod's network, from the runtime's ListPodSandboxStats, and the node's own interfaces.
    let network = &talker["network"];
    assert_eq!(network["name"], "eth0", "{talker}");
    assert!(network["rxBytes"].as_u64().is_some() && network["txErrors"].as_u64().is_some(), "{network}");
    assert!(summary["node"]["network"]["interfaces"].as_array().is_some_and(|i| !i.is_empty()), "{}", summary["node"]);
    // A second read has the CPU rates since the first (cAdvisor's `usageNanoCores`), as
    // metrics-server reads them at each scrape.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again: Value = serde_json::from_str(&get(format!("/api/v1/nodes/{node}/proxy/stats/summary")).await).unwrap();
    let talker = again["pods"].as_array().unwrap().iter().find(|p| p["podRef"]["name"] == "talker").unwrap();
    for cpu in [&again["node"]["cpu"], &talker["cpu"], &talker["containers"][0]["cpu"]] {
        assert!(cpu["usageNanoCores"].as_u64().is_some(), "{cpu}");
    }

    let metrics = get(format!("/api/v1/nodes/{node}/proxy/metrics/resource")).await;
    let labels = format!("{{container=\"app\",namespace=\"{namespace}\",pod=\"talker\"}}");
    for series in
        ["container_cpu_usage_seconds_total", "container_memory_working_set_bytes", "container_start_time_seconds"]
    {
        let prefix = format!("{series}{labels} ");
        let line =
            metrics.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{prefix}\nin:\n{metrics}"));
        let fields: Vec<&str> = line[prefix.len()..].split(' ').collect();
        assert!(fields.len() == 2 && fields[0].parse::<f64>().unwrap() > 0.0, "value and time: {line}");
    }
    for series in ["node_cpu_usage_seconds_total ", "node_memory_working_set_bytes ", "pod_cpu_usage_seconds_total{"] {
        assert!(metrics.lines().any(|l| l.starts_with(series)), "{series}\nin:\n{metrics}");
    }
    assert!(metrics.lines().any(|l| l == "scrape_error 0"), "{metrics}");

    // /metrics/cadvisor: cAdvisor's container series, labelled as Prometheus' kubelet job finds them.
    let cadvisor = get(format!("/api/v1/nodes/{node}/proxy/metrics/cadvisor")).await;
    let talker = |series: &str| {
        cadvisor
            .lines()
            .find(|l| l.starts_with(series) && l.contains(&format!("namespace=\"{namespace}\",pod=\"talker\"")))
            .unwrap_or_else(|| panic!("{series} of talker in:\n{cadvisor}"))
    };
    let cpu = talker("container_cpu_usage_seconds_total{container=\"app\",cpu=\"total\",id=\"/");
    assert!(cpu.contains("/kubepods/besteffort/pod") && cpu.contains("image=\"127.0.0.1:"), "{cpu}");
    talker("container_memory_working_set_bytes{container=\"app\"");
    let received = talker("container_network_receive_bytes_total{container=\"\"");
    assert!(received.contains("interface=\"eth0\""), "{received}");
    assert!(
        cadvisor
            .lines()
            .any(|l| l.starts_with("container_cpu_usage_seconds_total{container=\"\",cpu=\"total\",id=\"/\""))
    );

    // /configz, as `kubectl get --raw .../proxy/configz` reads it: the file's values, the defaults
    // and the flags in force.
    let configz: Value = serde_json::from_str(&get(format!("/api/v1/nodes/{node}/proxy/configz")).await).unwrap();
    let config = &configz["kubeletconfig"];
    assert_eq!(config["authorization"]["webhook"]["cacheUnauthorizedTTL"], "1s", "the file's: {configz}");
    assert_eq!(config["authorization"]["webhook"]["cacheAuthorizedTTL"], "5m0s", "a default: {configz}");
    assert_eq!(config["syncFrequency"], "1m0s", "{configz}");
    assert!(config["port"].as_u64().is_some_and(|p| p != 10250), "--port's: {configz}");
    assert_eq!(config["cgroupsPerQOS"], true, "{configz}");

    // /logs/, as `kubectl get --raw .../proxy/logs/...` reads the node's /var/log.
    let marker = format!("kubelet-rs-test-{}.log", std::process::id());
    std::fs::write(Path::new("/var/log").join(&marker), "a line of the node's log\n").unwrap();
    let listed = get(format!("/api/v1/nodes/{node}/proxy/logs/")).await;
    let read = get(format!("/api/v1/nodes/{node}/proxy/logs/{marker}")).await;
    let _ = std::fs::remove_file(Path::new("/var/log").join(&marker));
    assert!(listed.contains(&format!("<a href=\"{marker}\">{marker}</a>")), "{listed}");
    assert_eq!(read, "a line of the node's log\n");
    // /debug/flags/v, as `kubectl` PUTs a verbosity through the proxy.
    let put = |verbosity: &'static str| {
        let request = axum::http::Request::put(format!("/api/v1/nodes/{node}/proxy/debug/flags/v"))
            .body(verbosity.as_bytes().to_vec())
            .unwrap();
        let client = client.clone();
        async move { client.request_text(request).await.unwrap() }
    };
    assert_eq!(put("4").await, "successfully set klog.logging.verbosity to 4\n");
    assert_eq!(put("0").await, "successfully set klog.logging.verbosity to 0\n");

    // /metrics: the node's own requests to kube-apiserver, under client-go's names and labels.
    let metrics = get(format!("/api/v1/nodes/{node}/proxy/metrics")).await;
    let counted = |series: &str| -> f64 {
        let line =
            metrics.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("{series}\nin:\n{metrics}"));
        assert!(line.contains(",host=\"") && !line.contains("host=\"none\""), "the API server's host:port: {line}");
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(counted("rest_client_requests_total{code=\"200\",method=\"PATCH\"") > 0.0, "the pods' statuses");
    assert!(counted("rest_client_requests_total{code=\"200\",method=\"GET\"") > 0.0, "the pods' list");
    assert!(counted("rest_client_requests_total{code=\"201\",method=\"POST\"") > 0.0, "the events");
    assert!(counted("rest_client_rate_limiter_duration_seconds_count{verb=\"PATCH\"") > 0.0);
    assert!(counted("rest_client_request_duration_seconds_count{verb=\"GET\"") > 0.0);
    assert!(counted("rest_client_request_size_bytes_sum{verb=\"PATCH\"") > 0.0);
    assert!(counted("rest_client_response_size_bytes_sum{verb=\"GET\"") > 0.0);
    // Upstream's buckets, up to a minute.
    let bucket = "rest_client_request_duration_seconds_bucket{verb=\"GET\"";
    assert!(metrics.lines().any(|l| l.starts_with(bucket) && l.contains(",le=\"60\"} ")), "{metrics}");
}

/// TLS bootstrap as kubeadm's nodes join: the agent has a bootstrap token's kubeconfig and no
/// kubeconfig of its own. It asks for its client certificate with a CertificateSigningRequest,
/// which the test, standing in for kube-controller-manager's approver and signer, approves and
/// signs with the cluster's CA; the agent then writes its kubeconfig, joins as
/// `system:node:<node>` (registers, runs a pod and reports its status through the Node
/// authorizer and NodeRestriction). A restart uses the certificate without asking again; a
/// denied request stops the agent, saying so.
#[tokio::test]
async fn real_a_node_bootstraps_its_client_certificate_through_a_csr_the_test_approves() {
    let test = "real_a_node_bootstraps_its_client_certificate_through_a_csr_the_test_approves";
    on_node(NODE_3, test, "tls-bootstrap", None, bootstrap_a_node).await;
}

/// A bootstrap token (`<id>.<secret>`) in `kube-system`, allowed to ask for node certificates
/// (the ClusterRole `system:node-bootstrapper`, bound to the token's user), as kubeadm makes one.
async fn bootstrap_token(client: &kube::Client) -> (String, String) {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let id = format!("{:06x}", std::process::id() & 0xff_ffff);
    let secret = format!("{:016x}", nanos as u64);
    let token_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {"token-id": id, "token-secret": secret, "usage-bootstrap-authentication": "true"},
    }))
    .unwrap();
    let secrets = Api::<Secret>::namespaced(client.clone(), "kube-system");
    secrets.create(&PostParams::default(), &token_secret).await.unwrap();
    let user = format!("system:bootstrap:{id}");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("kubelet-rs-test-bootstrap-{id}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-bootstrapper"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &binding).await.unwrap();
    (format!("{id}.{secret}"), user)
}

/// Removes what [`bootstrap_token`] made.
async fn remove_bootstrap_token(client: &kube::Client, token: &str) {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let id = token.split('.').next().unwrap();
    let _ = Api::<Secret>::namespaced(client.clone(), "kube-system")
        .delete(&format!("bootstrap-token-{id}"), &DeleteParams::default())
        .await;
    let bindings = Api::<ClusterRoleBinding>::all(client.clone());
    let _ = bindings.delete(&format!("kubelet-rs-test-bootstrap-{id}"), &DeleteParams::default()).await;
}

/// Removes the certificate signing requests `user` made.
async fn remove_requests_of(client: &kube::Client, user: &str) {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    let requests = Api::<CertificateSigningRequest>::all(client.clone());
    for request in requests_of(client, user).await {
        let _ = requests.delete(&request.metadata.name.unwrap(), &DeleteParams::default()).await;
    }
}

/// The names of the certificate signing requests `user` made, oldest first.
async fn requests_of(
    client: &kube::Client,
    user: &str,
) -> Vec<k8s_openapi::api::certificates::v1::CertificateSigningRequest> {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    let requests = Api::<CertificateSigningRequest>::all(client.clone()).list(&ListParams::default()).await.unwrap();
    let mut mine: Vec<_> = requests.into_iter().filter(|r| r.spec.username.as_deref() == Some(user)).collect();
    mine.sort_by_key(|r| r.metadata.creation_timestamp.clone().map(|t| t.0));
    mine
}

/// Waits (60 s at most) for the `count`th request of `user`.
async fn wait_for_request(
    client: &kube::Client,
    user: &str,
    count: usize,
    dir: &Path,
) -> k8s_openapi::api::certificates::v1::CertificateSigningRequest {
    for _ in 0..600 {
        if let Some(request) = requests_of(client, user).await.into_iter().nth(count - 1) {
            return request;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    panic!("no certificate signing request #{count} of {user}; agent log:\n{log}");
}

/// The agent's exit code once it has exited by itself, looked at every 100 ms for `limit` at
/// most; `None` while it still runs.
async fn exit_code_within(agent: &mut Agent, limit: Duration) -> Option<i32> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(status) = agent.0.try_wait().unwrap() {
            return status.code();
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client certificate for the request `pem`, signed with the cluster's CA for `lifetime` from
/// now, as kube-controller-manager's signer issues it.
fn sign_with_the_cluster_ca(pem: &str, lifetime: time::Duration, usage: rcgen::ExtendedKeyUsagePurpose) -> String {
    let pki = cluster_pki();
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(pki.join("ca.key")).unwrap()).unwrap();
    let ca = std::fs::read_to_string(pki.join("ca.crt")).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca, ca_key).unwrap();
    let mut request = rcgen::CertificateSigningRequestParams::from_pem(pem).unwrap();
    let now = time::OffsetDateTime::now_utc();
    request.params.not_before = now;
    request.params.not_after = now + lifetime;
    request.params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    request.params.extended_key_usages = vec![usage];
    request.signed_by(&issuer).unwrap().pem()
}

/// Approves request `name` and sets its certificate, as kube-controller-manager's approver and
/// signer would.
async fn issue(client: &kube::Client, name: &str, certificate: &str) {
    use base64::Engine as _;
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    decide(client, name, "Approved").await;
    let encoded = base64::engine::general_purpose::STANDARD.encode(certificate);
    let status = Patch::Merge(json!({"status": {"certificate": encoded}}));
    let requests = Api::<CertificateSigningRequest>::all(client.clone());
    requests.patch_status(name, &PatchParams::default(), &status).await.unwrap();
}

/// Sets the `Approved` or `Denied` condition on request `name`.
async fn decide(client: &kube::Client, name: &str, decision: &str) {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    let condition = json!({"type": decision, "status": "True", "reason": "KubeletRsTest", "message": "by the test"});
    let patch = Patch::Merge(json!({"status": {"conditions": [condition]}}));
    let requests = Api::<CertificateSigningRequest>::all(client.clone());
    requests.patch_approval(name, &PatchParams::default(), &patch).await.unwrap();
}

/// The body of [`real_a_node_bootstraps_its_client_certificate_through_a_csr_the_test_approves`].
async fn bootstrap_a_node(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    let Cluster::Remote { client, namespace, .. } = &*cluster else { panic!("kube-apiserver only") };
    let (token, user) = bootstrap_token(client).await;
    // The node's own requests (rotations) of an earlier run would pass for this run's.
    let node_user = format!("system:node:{node}");
    remove_requests_of(client, &node_user).await;
    let pki = cluster_pki();
    let admin = std::fs::read_to_string(std::env::var("KUBELET_RS_TEST_KUBECONFIG").unwrap()).unwrap();
    let server = admin.lines().find_map(|l| l.trim().strip_prefix("server: ")).unwrap().trim().to_owned();
    let bootstrap = dir.join("bootstrap-kubelet.conf");
    std::fs::write(
        &bootstrap,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: '{server}', \
             certificate-authority: {}}}\nusers:\n- name: b\n  user: {{token: {token}}}\ncontexts:\n- name: x\n  \
             context: {{cluster: c, user: b}}\ncurrent-context: x\n",
            pki.join("ca.crt").display()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("config.yaml"),
        // A lease of 10 s is renewed every 2.5 s: the renewal after the first certificate's expiry
        // comes soon after it.
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nrotateCertificates: true\n\
         nodeLeaseDurationSeconds: 10\n",
    )
    .unwrap();
    let kubeconfig = dir.join("kubelet.conf");
    let bootstrap_flag = ["--bootstrap-kubeconfig", bootstrap.to_str().unwrap()];

    // The request: the node's name in system:nodes, for a client certificate of the kubelet signer.
    let agent = Agent::join(&rt.endpoint, &dir, &node, &kubeconfig, &bootstrap_flag);
    let request = wait_for_request(client, &user, 1, &dir).await;
    let name = request.metadata.name.clone().unwrap();
    assert!(name.starts_with("node-csr-"), "{name}");
    assert_eq!(request.spec.signer_name, "kubernetes.io/kube-apiserver-client-kubelet");
    assert_eq!(request.spec.usages.as_deref(), Some(&["digital signature".to_owned(), "client auth".to_owned()][..]));
    let pem = String::from_utf8(request.spec.request.0.clone()).unwrap();
    let asked = rcgen::CertificateSigningRequestParams::from_pem(&pem).unwrap();
    let subject = |kind| match asked.params.distinguished_name.get(&kind) {
        Some(rcgen::DnValue::Utf8String(text)) => text.clone(),
        Some(rcgen::DnValue::PrintableString(text)) => text.as_str().to_owned(),
        other => panic!("{other:?}"),
    };
    assert_eq!(subject(rcgen::DnType::CommonName), format!("system:node:{node}"));
    assert_eq!(subject(rcgen::DnType::OrganizationName), "system:nodes");
    // Nothing joins before the certificate comes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(cluster.view(&node).await.nodes.is_empty(), "registered without a certificate");
    assert!(!kubeconfig.exists());
    assert!(dir.join("pki/kubelet-client.key.tmp").exists(), "the key waits in --cert-dir");

    // A certificate of 20 s, so that it is rotated within the test: between 14 and 18 s, after
    // the registration, the pod and the restart below.
    let lifetime = time::Duration::seconds(20);
    let first_expiry = std::time::SystemTime::now() + Duration::from_secs(20);
    let certificate = sign_with_the_cluster_ca(&pem, lifetime, rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    issue(client, &name, &certificate).await;

    // The node joins with it and runs a pod bound to it.
    until(&cluster, &node, &dir, "the node to register", |v| v.nodes.get(&node).cloned()).await;
    let pod = writer_pod("after-bootstrap", &node, &rt.busybox_image, "sleep 3600", None, json!({}));
    cluster.create_pod(pod).await;
    let key = format!("{namespace}/after-bootstrap");
    until(&cluster, &node, &dir, "the pod to run", |v| v.pods.get(&key).filter(|p| phase(p) == "Running").cloned())
        .await;
    let written = std::fs::read_to_string(&kubeconfig).unwrap();
    let current = dir.join("pki/kubelet-client-current.pem");
    assert!(written.contains(&format!("client-certificate: \"{}\"", current.display())), "{written}");
    assert!(std::fs::symlink_metadata(&current).unwrap().file_type().is_symlink());
    let stored = std::fs::read_to_string(&current).unwrap();
    assert!(stored.starts_with(&certificate) && stored.contains("PRIVATE KEY"), "{stored}");
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(&kubeconfig), mode(&current)), (0o600, 0o600));
    assert!(!dir.join("pki/kubelet-client.key.tmp").exists(), "the pending key is gone");

    // A restart uses the certificate: no new request, and the node registers again with it.
    drop(agent);
    std::fs::rename(dir.join("agent.log"), dir.join("agent-before-restart.log")).unwrap();
    let agent = Agent::join(&rt.endpoint, &dir, &node, &kubeconfig, &bootstrap_flag);
    wait_for_text(&dir.join("agent.log"), "the kubeconfig's client certificate is still valid").await;
    wait_for_text(&dir.join("agent.log"), "adopted the existing node").await;
    assert_eq!(requests_of(client, &user).await.len(), 1, "asked again on a restart");

    // rotateCertificates: between 70% and 90% of its lifetime, the node asks for a new
    // certificate with its own credentials, and uses it from then on without a restart.
    let rotation = wait_for_request(client, &node_user, 1, &dir).await;
    let remaining = first_expiry.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    assert!(remaining <= Duration::from_secs(7), "asked {remaining:?} before the expiry, before 70% of the lifetime");
    assert_eq!(rotation.spec.signer_name, "kubernetes.io/kube-apiserver-client-kubelet");
    let rotation_pem = String::from_utf8(rotation.spec.request.0.clone()).unwrap();
    let renewed =
        sign_with_the_cluster_ca(&rotation_pem, time::Duration::days(1), rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    issue(client, &rotation.metadata.name.unwrap(), &renewed).await;
    wait_for_text(&dir.join("agent.log"), "certificate renewed").await;
    let stored = std::fs::read_to_string(&current).unwrap();
    assert!(stored.starts_with(&renewed), "the current pair is the renewed one");
    // Once the first certificate has expired, the node still reports and runs new pods.
    let after_expiry = first_expiry + Duration::from_secs(1);
    tokio::time::sleep(after_expiry.duration_since(std::time::SystemTime::now()).unwrap_or_default()).await;
    let pod = writer_pod("after-rotation", &node, &rt.busybox_image, "sleep 3600", None, json!({}));
    cluster.create_pod(pod).await;
    let key = format!("{namespace}/after-rotation");
    until(&cluster, &node, &dir, "the pod to run after the rotation", |v| {
        v.pods.get(&key).filter(|p| phase(p) == "Running").cloned()
    })
    .await;
    until(&cluster, &node, &dir, "a lease renewal after the expiry", |v| {
        let renewed = v.leases.get(&format!("kube-node-lease/{node}"))?["spec"]["renewTime"].as_str()?.to_owned();
        let renewed = std::time::SystemTime::from(renewed.parse::<k8s_openapi::jiff::Timestamp>().ok()?);
        (renewed > after_expiry).then_some(())
    })
    .await;
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap();
    // No request was refused for an expired certificate (the log's timestamps and pid are digits,
    // so the word, not the code, is looked for).
    assert!(!log.contains("Unauthorized"), "{log}");

    // Without its certificate, a node whose request is denied stops and says so.
    drop(agent);
    std::fs::remove_file(&kubeconfig).unwrap();
    for entry in std::fs::read_dir(dir.join("pki")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_str().unwrap().starts_with("kubelet-client") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let mut agent = Agent::join(&rt.endpoint, &dir, &node, &kubeconfig, &bootstrap_flag);
    let second = wait_for_request(client, &user, 2, &dir).await.metadata.name.unwrap();
    assert_ne!(second, name, "a new key, a new request");
    decide(client, &second, "Denied").await;
    let code = exit_code_within(&mut agent, Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap();
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains(&format!("the certificate signing request {second} was denied: KubeletRsTest by the test")),
        "{log}"
    );
    assert!(!kubeconfig.exists());

    // rotateCertificates: a client certificate that expires before its renewal is issued ends
    // the node once the API server answers it (upstream exits, so that its supervisor starts it
    // again into TLS bootstrap), with the reason said once. A new key, so a new request: the
    // denied one's key is kept, and would find that request again.
    std::fs::remove_file(dir.join("pki/kubelet-client.key.tmp")).unwrap();
    let mut agent = Agent::join(&rt.endpoint, &dir, &node, &kubeconfig, &bootstrap_flag);
    wait_for_request(client, &user, 3, &dir).await;
    // Told apart by name: made within a second of the denied one, the order of their creation
    // times may not say which came last.
    let earlier = [name.as_str(), second.as_str()];
    let third = requests_of(client, &user)
        .await
        .into_iter()
        .find(|r| !earlier.contains(&r.metadata.name.as_deref().unwrap_or_default()))
        .unwrap();
    let third_pem = String::from_utf8(third.spec.request.0.clone()).unwrap();
    let short =
        sign_with_the_cluster_ca(&third_pem, time::Duration::seconds(8), rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    issue(client, &third.metadata.name.unwrap(), &short).await;
    let code = exit_code_within(&mut agent, Duration::from_secs(40)).await;
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap();
    assert_eq!(code, Some(1), "{log}");
    let reason = kubelet_cluster::bootstrap::EXPIRED_AND_ANSWERED;
    assert_eq!(log.matches(reason).count(), 1, "{log}");
    let renewal = wait_for_request(client, &node_user, 2, &dir).await;
    assert!(renewal.status.and_then(|s| s.certificate).is_none(), "its renewal was asked, never issued");
    remove_bootstrap_token(client, &token).await;
    remove_requests_of(client, &user).await;
    remove_requests_of(client, &node_user).await;
}

/// `serverTLSBootstrap`: the kubelet API has no certificate until the API server issues one for
/// the node's name and IP (a `kubernetes.io/kubelet-serving` request the test approves and signs
/// with the cluster's CA); handshakes fail until then, and afterwards a caller that trusts the
/// cluster's CA verifies the kubelet API by the node's name.
#[tokio::test]
async fn real_the_kubelet_api_serves_the_certificate_the_api_server_issued() {
    let test = "real_the_kubelet_api_serves_the_certificate_the_api_server_issued";
    on_node(NODE_3, test, "server-tls-bootstrap", None, serve_an_issued_certificate).await;
}

/// The body of [`real_the_kubelet_api_serves_the_certificate_the_api_server_issued`].
async fn serve_an_issued_certificate(rt: RealRuntime, dir: PathBuf, cluster: Arc<Cluster>, node: String) {
    let Cluster::Remote { client, .. } = &*cluster else { panic!("kube-apiserver only") };
    let node_user = format!("system:node:{node}");
    remove_requests_of(client, &node_user).await;
    let pki = cluster_pki();
    let (_agent, port) = join_with_the_kubelet_api(&rt, &dir, &cluster, &node, "serverTLSBootstrap: true\n").await;
    let admin = [
        "--cert".to_owned(),
        pki.join("admin.crt").display().to_string(),
        "--key".to_owned(),
        pki.join("admin.key").display().to_string(),
    ];
    let admin: Vec<&str> = admin.iter().map(String::as_str).collect();
    let (status, _) = call_kubelet(port, "/healthz", &admin);
    assert_eq!(status, 0, "a handshake before the certificate is issued fails");

    let request = wait_for_request(client, &node_user, 1, &dir).await;
    assert_eq!(request.spec.signer_name, "kubernetes.io/kubelet-serving");
    assert_eq!(request.spec.usages.as_deref(), Some(&["digital signature".to_owned(), "server auth".to_owned()][..]));
    let pem = String::from_utf8(request.spec.request.0.clone()).unwrap();
    let asked = rcgen::CertificateSigningRequestParams::from_pem(&pem).unwrap();
    let dns_name = rcgen::SanType::DnsName(node.clone().try_into().unwrap());
    let names = &asked.params.subject_alt_names;
    assert!(names.contains(&dns_name), "{names:?}");
    assert!(names.iter().any(|n| matches!(n, rcgen::SanType::IpAddress(_))), "the node's IP: {names:?}");
    let serving = rcgen::ExtendedKeyUsagePurpose::ServerAuth;
    let certificate = sign_with_the_cluster_ca(&pem, time::Duration::days(1), serving);
    issue(client, &request.metadata.name.unwrap(), &certificate).await;
    wait_for_text(&dir.join("agent.log"), "the kubelet API presents the serving certificate").await;

    // Verified against the cluster's CA, by the node's name.
    let output = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "--cacert"])
        .arg(pki.join("ca.crt"))
        .args(&admin)
        .args(["--resolve", &format!("{node}:{port}:127.0.0.1")])
        .arg(format!("https://{node}:{port}/healthz"))
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "curl: {}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(body, "ok");
    let stored = std::fs::read_to_string(dir.join("pki/kubelet-server-current.pem")).unwrap();
    assert!(stored.starts_with(&certificate));
    remove_requests_of(client, &node_user).await;
}
