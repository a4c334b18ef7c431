//! The API side of `cargo xtask bench`'s cluster-mode figures, built on kube's client.
//!
//! ```text
//! api_bench pods --kubeconfig FILE --node NODE --namespace NS --image IMG --pods N
//!     waits (60 s at most) for NODE to be Ready, creates N one-container pods bound to it all at
//!     once, and prints {"running_s": .., "deletes_answered_s": .., "marked_s": ..,
//!     "terminal_s": .., "gone_s": ..}: from the first create until the API shows every pod
//!     Running, then from the first delete until the API answered every delete, showed every pod
//!     marked for deletion, showed every pod's terminal status (the node's), and had none of them
//! api_bench configmap --kubeconfig FILE --node NODE --namespace NS --image IMG --root-dir DIR
//!         --updates N
//!     runs one pod on NODE with a config map mounted, and once it is Running, changes the config
//!     map N times, and prints
//!     {"update_s": [..]}: for each change, from the update until the file in the pod's volume,
//!     under the agent's root directory DIR, holds the new value
//! api_bench clean --kubeconfig FILE --namespace NS
//!     deletes what an interrupted run left in NS: the tool's pods and its config map, and
//!     prints {"pods": N}, how many pods it deleted (their node then removes them as usual)
//! api_bench forget-node --kubeconfig FILE --node NODE
//!     deletes the Node NODE, as an administrator does with a node taken out, once its agent
//!     has stopped
//! ```
//!
//! The pods run what the bench's static pods run (`sh` that exits on SIGTERM, so the deletion
//! measures the agent, not a grace period), carry the label `kubelet-rs.bench=api`, and mount no
//! service account token (there is no controller here to make the namespace's
//! `kube-root-ca.crt`). The namespace and its `default` service account are made when missing.
//! The times come from one watch opened before the first create, and read while the creates
//! and deletes are answered; where the API server ends it, it is opened again from the last
//! resource version seen (or, where that is too old, the pods are listed again).

// Reason: a measuring tool; wall time is what it measures.
#![allow(clippy::disallowed_methods)]

use std::{
    collections::{BTreeSet, VecDeque},
    path::Path,
    process::ExitCode,
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt, future::try_join_all, stream::BoxStream};
use k8s_openapi::{
    api::core::v1::{ConfigMap, ConfigMapVolumeSource, Namespace, Node, Pod, ServiceAccount, Volume, VolumeMount},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, Config,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The label every pod of the tool carries.
const LABEL: &str = "kubelet-rs.bench=api";

/// How long the pods may take to run, and to go.
const LIMIT: Duration = Duration::from_secs(180);

/// The config map of `configmap`, and the pod that mounts it.
const CONFIG_MAP: &str = "api-bench-config";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tokio = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(tokio) => tokio,
        Err(err) => {
            eprintln!("api_bench: {err}");
            return ExitCode::FAILURE;
        }
    };
    match tokio.block_on(run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("api_bench: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The value after `--name`.
fn required<'a>(args: &'a [String], name: &str) -> Result<&'a str, BoxError> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
        .ok_or_else(|| format!("{name} is required").into())
}

async fn run(args: &[String]) -> Result<(), BoxError> {
    match args.first().map(String::as_str) {
        Some("pods") => {
            let client = client(Path::new(required(args, "--kubeconfig")?)).await?;
            let pods: usize = required(args, "--pods")?.parse()?;
            let run = Run {
                node: required(args, "--node")?,
                namespace: required(args, "--namespace")?,
                image: required(args, "--image")?,
                pods,
            };
            let times = run.measure(&client).await?;
            let seconds = |d: Duration| d.as_secs_f64();
            let printed = json!({
                "running_s": seconds(times.running),
                "deletes_answered_s": seconds(times.answered),
                "marked_s": seconds(times.marked),
                "terminal_s": seconds(times.terminal),
                "gone_s": seconds(times.gone),
            });
            println!("{printed}");
            Ok(())
        }
        Some("configmap") => {
            let client = client(Path::new(required(args, "--kubeconfig")?)).await?;
            let run = Run {
                node: required(args, "--node")?,
                namespace: required(args, "--namespace")?,
                image: required(args, "--image")?,
                pods: 1,
            };
            let root_dir = Path::new(required(args, "--root-dir")?);
            let updates: usize = required(args, "--updates")?.parse()?;
            let took = run.config_map_updates(&client, root_dir, updates).await?;
            let seconds: Vec<f64> = took.iter().map(Duration::as_secs_f64).collect();
            println!("{}", json!({ "update_s": seconds }));
            Ok(())
        }
        Some("clean") => {
            let client = client(Path::new(required(args, "--kubeconfig")?)).await?;
            let pods = clean(&client, required(args, "--namespace")?).await?;
            println!("{}", json!({ "pods": pods }));
            Ok(())
        }
        Some("forget-node") => {
            let client = client(Path::new(required(args, "--kubeconfig")?)).await?;
            let node = required(args, "--node")?;
            match Api::<Node>::all(client).delete(node, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
                Err(err) => Err(err.into()),
            }
        }
        _ => Err("usage: api_bench pods|configmap --kubeconfig FILE --node NODE --namespace NS --image IMG \
                  (--pods N | --root-dir DIR --updates N); api_bench clean --kubeconfig FILE --namespace NS; \
                  api_bench forget-node --kubeconfig FILE --node NODE"
            .into()),
    }
}

async fn client(kubeconfig: &Path) -> Result<Client, BoxError> {
    let kubeconfig = Kubeconfig::read_from(kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// One round's times: from the first create until all Running; and from the first delete until
/// every delete was answered, every pod was seen marked for deletion, every pod was seen
/// terminal (its final status from the node), and every pod was gone.
struct Times {
    running: Duration,
    answered: Duration,
    marked: Duration,
    terminal: Duration,
    gone: Duration,
}

/// What the watch has shown of the pods' deletion.
#[derive(Default)]
struct Deletion {
    marked: BTreeSet<String>,
    terminal: BTreeSet<String>,
    gone: BTreeSet<String>,
    last_marked: Duration,
    last_terminal: Duration,
}

impl Deletion {
    /// A pod changed, `at` after the first delete: the first time it shows a deletion timestamp,
    /// and the first time it shows a terminal phase.
    fn modified(&mut self, pod: &Pod, at: Duration) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() && self.marked.insert(name.clone()) {
            self.last_marked = at;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) && self.terminal.insert(name) {
            self.last_terminal = at;
        }
    }
}

/// One measured round: N pods created, Running, deleted and gone.
struct Run<'a> {
    node: &'a str,
    namespace: &'a str,
    image: &'a str,
    pods: usize,
}

impl Run<'_> {
    async fn measure(&self, client: &Client) -> Result<Times, BoxError> {
        wait_node_ready(client, self.node).await?;
        self.make_namespace(client).await?;
        let api: Api<Pod> = Api::namespaced(client.clone(), self.namespace);
        let existing = api.list(&ListParams::default().labels(LABEL)).await?;
        if !existing.items.is_empty() {
            return Err(
                format!("{} pods of an earlier run are still in {}", existing.items.len(), self.namespace).into()
            );
        }
        let version = existing.metadata.resource_version.unwrap_or_default();
        let mut events = PodWatch::open(api.clone(), version).await?;
        let names: Vec<String> = (0..self.pods).map(|i| format!("api-bench-{i}")).collect();
        let pods: Vec<Pod> = names.iter().map(|name| self.pod(name)).collect();
        let (create, delete) = (PostParams::default(), DeleteParams::default());

        let began = Instant::now();
        let creates = try_join_all(pods.iter().map(|pod| api.create(&create, pod)));
        let mut creates = std::pin::pin!(creates);
        let mut created = false;
        let mut running = BTreeSet::new();
        while running.len() < self.pods || !created {
            // The watch is read while the creates are answered: the API server closes a watch
            // whose reader falls behind.
            let event = tokio::select! {
                result = &mut creates, if !created => {
                    result?;
                    created = true;
                    continue;
                }
                event = events.next(began) => event?,
            };
            match event {
                WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                    let status = pod.status.unwrap_or_default();
                    let name = pod.metadata.name.unwrap_or_default();
                    match status.phase.as_deref() {
                        Some("Running") => _ = running.insert(name),
                        // A pod the node refused (say, under disk pressure) never runs.
                        Some("Failed") => {
                            let why = [status.reason, status.message].into_iter().flatten().collect::<Vec<_>>();
                            return Err(format!("pod {name} failed: {}", why.join(": ")).into());
                        }
                        _ => {}
                    }
                }
                WatchEvent::Deleted(pod) => {
                    return Err(
                        format!("pod {} was deleted before it ran", pod.metadata.name.unwrap_or_default()).into()
                    );
                }
                // `PodWatch::next` gives a watch's error as its own `Err`.
                WatchEvent::Bookmark(_) | WatchEvent::Error(_) => {}
            }
        }
        let running_took = began.elapsed();

        let began = Instant::now();
        let deletes = try_join_all(names.iter().map(|name| api.delete(name, &delete)));
        let mut deletes = std::pin::pin!(deletes);
        let mut answered = None;
        let mut deletion = Deletion::default();
        while deletion.gone.len() < self.pods {
            // The deletes are answered while the watch is read, so its times are the API's; a
            // delete that fails ends the round at once.
            let event = tokio::select! {
                result = &mut deletes, if answered.is_none() => {
                    result?;
                    answered = Some(began.elapsed());
                    continue;
                }
                event = events.next(began) => event?,
            };
            match event {
                WatchEvent::Modified(pod) => deletion.modified(&pod, began.elapsed()),
                WatchEvent::Deleted(pod) => {
                    deletion.gone.insert(pod.metadata.name.unwrap_or_default());
                }
                _ => {}
            }
        }
        let gone_took = began.elapsed();
        let answered = match answered {
            Some(answered) => answered,
            None => {
                deletes.await?;
                began.elapsed()
            }
        };
        Ok(Times {
            running: running_took,
            answered,
            marked: deletion.last_marked,
            terminal: deletion.last_terminal,
            gone: gone_took,
        })
    }

    /// One pod with config map [`CONFIG_MAP`] mounted: each of `updates` changes of the map,
    /// from the update until the file in the pod's volume under `root_dir` holds it.
    async fn config_map_updates(
        &self,
        client: &Client,
        root_dir: &Path,
        updates: usize,
    ) -> Result<Vec<Duration>, BoxError> {
        wait_node_ready(client, self.node).await?;
        self.make_namespace(client).await?;
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), self.namespace);
        let pods: Api<Pod> = Api::namespaced(client.clone(), self.namespace);
        let map = serde_json::from_value(json!({ "metadata": { "name": CONFIG_MAP }, "data": { "value": "0" } }))?;
        maps.create(&PostParams::default(), &map).await?;
        let mut pod = self.pod(CONFIG_MAP);
        mount_config_map(&mut pod);
        let uid = pods.create(&PostParams::default(), &pod).await?.metadata.uid.unwrap_or_default();
        let file = root_dir.join(format!("pods/{uid}/volumes/kubernetes.io~configmap/config/value"));
        let measured = async {
            // A running pod's volume, as users change a config map: the first update does not
            // wait for the pod's start.
            wait_running(&pods, CONFIG_MAP).await?;
            wait_for_file(&file, "0").await?;
            let mut took = Vec::new();
            for update in 1..=updates {
                let value = update.to_string();
                let patch = json!({ "data": { "value": value } });
                let began = Instant::now();
                maps.patch(CONFIG_MAP, &PatchParams::default(), &Patch::Merge(patch)).await?;
                wait_for_file(&file, &value).await?;
                took.push(began.elapsed());
            }
            Ok::<_, BoxError>(took)
        }
        .await;
        pods.delete(CONFIG_MAP, &DeleteParams::default()).await?;
        let began = Instant::now();
        while pods.get_opt(CONFIG_MAP).await?.is_some() {
            if began.elapsed() > LIMIT {
                return Err(format!("pod {CONFIG_MAP} was not gone within {LIMIT:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        maps.delete(CONFIG_MAP, &DeleteParams::default()).await?;
        measured
    }

    /// The namespace and its `default` service account, which pod admission looks up.
    async fn make_namespace(&self, client: &Client) -> Result<(), BoxError> {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        if namespaces.get_opt(self.namespace).await?.is_none() {
            let namespace = serde_json::from_value(json!({ "metadata": { "name": self.namespace } }))?;
            namespaces.create(&PostParams::default(), &namespace).await?;
        }
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), self.namespace);
        if accounts.get_opt("default").await?.is_none() {
            let account = serde_json::from_value(json!({ "metadata": { "name": "default" } }))?;
            accounts.create(&PostParams::default(), &account).await?;
        }
        Ok(())
    }

    /// A pod bound to the node, as the bench's static pods.
    fn pod(&self, name: &str) -> Pod {
        let (key, value) = LABEL.split_once('=').unwrap_or((LABEL, ""));
        let pod = json!({
            "metadata": { "name": name, "labels": { key: value } },
            "spec": {
                "nodeName": self.node,
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 2,
                "containers": [{
                    "name": "app",
                    "image": self.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 36000 & wait"],
                }],
            },
        });
        // Reason: a literal of Pod's own fields, which always decodes.
        #[allow(clippy::expect_used)]
        serde_json::from_value(pod).expect("a pod literal decodes")
    }
}

/// Mounts config map [`CONFIG_MAP`] into `pod`'s container at `/config`.
fn mount_config_map(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else { return };
    spec.volumes = Some(vec![Volume {
        name: "config".into(),
        config_map: Some(ConfigMapVolumeSource { name: CONFIG_MAP.into(), ..ConfigMapVolumeSource::default() }),
        ..Volume::default()
    }]);
    for container in &mut spec.containers {
        let mount = VolumeMount { name: "config".into(), mount_path: "/config".into(), ..VolumeMount::default() };
        container.volume_mounts = Some(vec![mount]);
    }
}

/// Waits until `file` holds `value` (its first line), looking every 10 ms for [`LIMIT`] at
/// most; a file not there yet is not an error.
async fn wait_for_file(file: &Path, value: &str) -> Result<(), BoxError> {
    let began = Instant::now();
    loop {
        let holds = std::fs::read_to_string(file).is_ok_and(|text| text.trim_end() == value);
        if holds {
            return Ok(());
        }
        if began.elapsed() > LIMIT {
            return Err(format!("{} did not hold {value:?} within {LIMIT:?}", file.display()).into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the API shows pod `name` Running, looking every 100 ms for [`LIMIT`] at most.
async fn wait_running(pods: &Api<Pod>, name: &str) -> Result<(), BoxError> {
    let began = Instant::now();
    loop {
        let pod = pods.get(name).await?;
        if pod.status.and_then(|s| s.phase).as_deref() == Some("Running") {
            return Ok(());
        }
        if began.elapsed() > LIMIT {
            return Err(format!("pod {name} was not Running within {LIMIT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The watch of the tool's pods, carried on where the API server ends it.
///
/// The API server ends a watch when it chooses (its timeout, or a reader it finds too slow); a
/// client watches again from the last resource version it saw, and lists again once that
/// version is too old (410 Gone), as every client of the API must.
struct PodWatch {
    api: Api<Pod>,
    /// The resource version of the last event read, where the next watch begins.
    version: String,
    events: BoxStream<'static, Result<WatchEvent<Pod>, kube::Error>>,
    /// The pods the watch has shown and not seen deleted, so that a relist can tell which went.
    present: BTreeSet<String>,
    /// What a relist found, given out before the new watch's events.
    relisted: VecDeque<WatchEvent<Pod>>,
}

impl PodWatch {
    async fn open(api: Api<Pod>, version: String) -> Result<Self, kube::Error> {
        let events = api.watch(&WatchParams::default().labels(LABEL), &version).await?.boxed();
        Ok(Self { api, version, events, present: BTreeSet::new(), relisted: VecDeque::new() })
    }

    /// The next event, failing once [`LIMIT`] has passed since `began`.
    async fn next(&mut self, began: Instant) -> Result<WatchEvent<Pod>, BoxError> {
        loop {
            if let Some(event) = self.relisted.pop_front() {
                return Ok(event);
            }
            let left = LIMIT.saturating_sub(began.elapsed());
            let Ok(read) = tokio::time::timeout(left, self.events.try_next()).await else {
                return Err(format!("the pods did not get there within {LIMIT:?}").into());
            };
            match read {
                Ok(Some(WatchEvent::Error(status))) if status.code == 410 => self.relist().await?,
                Ok(Some(WatchEvent::Error(status))) => return Err(format!("the watch failed: {status}").into()),
                Ok(Some(event)) => {
                    self.saw(&event);
                    return Ok(event);
                }
                Ok(None) => {
                    eprintln!("api_bench: the API server ended the watch; watching again from {}", self.version);
                    self.watch_again().await?;
                }
                Err(kube::Error::Api(status)) if status.code == 410 => self.relist().await?,
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// Keeps the event's resource version, and which pods are there.
    fn saw(&mut self, event: &WatchEvent<Pod>) {
        let version = match event {
            WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                self.present.insert(pod.metadata.name.clone().unwrap_or_default());
                &pod.metadata.resource_version
            }
            WatchEvent::Deleted(pod) => {
                self.present.remove(pod.metadata.name.as_deref().unwrap_or_default());
                &pod.metadata.resource_version
            }
            WatchEvent::Bookmark(bookmark) => &Some(bookmark.metadata.resource_version.clone()),
            WatchEvent::Error(_) => &None,
        };
        if let Some(version) = version {
            self.version.clone_from(version);
        }
    }

    async fn watch_again(&mut self) -> Result<(), kube::Error> {
        let params = WatchParams::default().labels(LABEL);
        self.events = self.api.watch(&params, &self.version).await?.boxed();
        Ok(())
    }

    /// Lists the pods, gives each out as modified and each that went as deleted, and watches
    /// from the list's version.
    async fn relist(&mut self) -> Result<(), kube::Error> {
        eprintln!("api_bench: resource version {} is gone; listing again", self.version);
        let list = self.api.list(&ListParams::default().labels(LABEL)).await?;
        let listed: BTreeSet<String> = list.items.iter().filter_map(|pod| pod.metadata.name.clone()).collect();
        for name in self.present.difference(&listed) {
            let gone =
                Pod { metadata: ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() }, ..Pod::default() };
            self.relisted.push_back(WatchEvent::Deleted(gone));
        }
        self.relisted.extend(list.items.into_iter().map(WatchEvent::Modified));
        self.present = listed;
        self.version = list.metadata.resource_version.unwrap_or_default();
        self.watch_again().await
    }
}

/// Deletes the tool's pods and config map in `namespace`; how many pods it deleted.
async fn clean(client: &Client, namespace: &str) -> Result<usize, BoxError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let deleted = pods.delete_collection(&DeleteParams::default(), &ListParams::default().labels(LABEL)).await?;
    let count = deleted.left().map_or(0, |list| list.items.len());
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match maps.delete(CONFIG_MAP, &DeleteParams::default()).await {
        Ok(_) => Ok(count),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(count),
        Err(err) => Err(err.into()),
    }
}

/// Waits until the node reports Ready.
async fn wait_node_ready(client: &Client, node: &str) -> Result<(), BoxError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = nodes.get_opt(node).await?.is_some_and(|n| {
            let conditions = n.status.and_then(|s| s.conditions).unwrap_or_default();
            conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
        });
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("node {node} was not Ready within 60 s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
