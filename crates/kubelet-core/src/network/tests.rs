//! The network seam without IO: a recording runtime and an in-memory plugin around `Networked`.

use std::{
    convert::Infallible,
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod as ApiPod;

use super::*;
use crate::{runtime::ContainerState, testing::pod};

/// What happened, in order, across the runtime and the plugin.
type Log = Arc<Mutex<Vec<String>>>;

fn entries(log: &Log) -> Vec<String> {
    log.lock().unwrap().clone()
}

/// A runtime that records its syncs (with the namespace it was given) and kills.
struct Recording {
    log: Log,
}

impl Runtime for Recording {
    type Error = Infallible;

    async fn version(&self) -> Result<Version, Infallible> {
        Ok(Version::new("recording", "1", "v1"))
    }

    async fn status(&self) -> Result<RuntimeStatus, Infallible> {
        Ok(RuntimeStatus::ready())
    }

    async fn get_pods(&self, _all: bool) -> Result<Vec<Pod>, Infallible> {
        Ok(Vec::new())
    }

    async fn get_pod_status(&self, uid: &PodUid, name: &str, namespace: &str) -> Result<PodStatus, Infallible> {
        let mut status = PodStatus::new(uid.clone(), name, namespace);
        status.container_statuses.push(runtime::ContainerStatus::new("c1", "app", ContainerState::Running));
        Ok(status)
    }

    async fn sync_pod(
        &self,
        _pod: &ApiPod,
        status: &PodStatus,
        _backoff: &Backoff,
        _probes: &ProbeResults,
        _volumes: &PodVolumes,
    ) -> PodSyncResult {
        let namespace = status.network_namespace().map_or("none".to_owned(), |path| path.display().to_string());
        self.log.lock().unwrap().push(format!("sync in {namespace} with ips {:?}", status.ips));
        PodSyncResult::default()
    }

    async fn kill_pod(&self, _pod: Option<&ApiPod>, running: &Pod, _grace: Option<i64>) -> Result<(), Infallible> {
        self.log.lock().unwrap().push(format!("kill {} sandboxes", running.sandboxes.len()));
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct PluginFailed(String);

/// A plugin that keeps networks in memory, with failures to script.
struct InMemory {
    log: Log,
    networks: Mutex<HashMap<PodUid, PodNetworkStatus>>,
    not_ready: Option<String>,
    fail_set_up: bool,
}

impl InMemory {
    fn new(log: &Log) -> Self {
        InMemory { log: log.clone(), networks: Mutex::default(), not_ready: None, fail_set_up: false }
    }

    fn with_network(self, uid: &str, name: &str) -> Self {
        let network = network_of(PodUid::new(uid), name, Ipv4Addr::new(10, 0, 0, 9));
        self.networks.lock().unwrap().insert(PodUid::new(uid), network);
        self
    }
}

fn network_of(uid: PodUid, name: &str, ip: Ipv4Addr) -> PodNetworkStatus {
    let path = PathBuf::from(format!("/run/netns/{uid}"));
    let mut network = PodNetworkStatus::new(uid, name, "default", path);
    network.ips.push(IpAddr::V4(ip));
    network
}

impl NetworkPlugin for InMemory {
    type Error = PluginFailed;

    async fn status(&self) -> Result<(), PluginFailed> {
        self.not_ready.clone().map_or(Ok(()), |reason| Err(PluginFailed(reason)))
    }

    async fn set_up_pod(&self, pod: &ApiPod) -> Result<PodNetworkStatus, PluginFailed> {
        let uid = PodUid::of(pod);
        self.log.lock().unwrap().push(format!("set up {uid}"));
        if self.fail_set_up {
            return Err(PluginFailed("no address left".into()));
        }
        let network = network_of(uid.clone(), "p", Ipv4Addr::new(10, 0, 0, 2));
        self.networks.lock().unwrap().insert(uid, network.clone());
        Ok(network)
    }

    async fn check_pod(&self, _pod: &ApiPod, network: &PodNetworkStatus) -> Result<PodNetworkStatus, PluginFailed> {
        self.log.lock().unwrap().push(format!("check {}", network.uid));
        Ok(network.clone())
    }

    async fn tear_down_pod(&self, uid: &PodUid) -> Result<(), PluginFailed> {
        if self.networks.lock().unwrap().remove(uid).is_some() {
            self.log.lock().unwrap().push(format!("tear down {uid}"));
        }
        Ok(())
    }

    fn pod_network(&self, uid: &PodUid) -> Option<PodNetworkStatus> {
        self.networks.lock().unwrap().get(uid).cloned()
    }

    fn pod_networks(&self) -> Vec<PodNetworkStatus> {
        self.networks.lock().unwrap().values().cloned().collect()
    }
}

fn networked(log: &Log, plugin: InMemory) -> Networked<Recording, InMemory> {
    Networked::new(Recording { log: log.clone() }, plugin)
}

async fn sync(runtime: &Networked<Recording, InMemory>, pod: &ApiPod) -> PodSyncResult {
    let status = PodStatus::of(pod);
    runtime.sync_pod(pod, &status, &Backoff::default(), &ProbeResults::new(), &PodVolumes::default()).await
}

#[tokio::test]
async fn a_pod_is_networked_before_its_containers_start_and_after_they_are_killed() {
    let log = Log::default();
    let runtime = networked(&log, InMemory::new(&log));
    let pod = pod("u1", &["app"]);

    let result = sync(&runtime, &pod).await;
    assert!(!result.is_err(), "{result:?}");
    assert_eq!(entries(&log), ["set up u1", "sync in /run/netns/u1 with ips [\"10.0.0.2\"]"]);

    let status = runtime.get_pod_status(&PodUid::new("u1"), "p", "default").await.unwrap();
    assert_eq!(status.ips, ["10.0.0.2"]);
    assert_eq!(status.network_namespace(), Some(Path::new("/run/netns/u1")));
    assert_eq!(status.sandbox_statuses[0].id, "network-u1");
    assert!(status.is_running());

    let listed = runtime.get_pods(true).await.unwrap();
    assert_eq!(listed.len(), 1);
    runtime.kill_pod(Some(&pod), &listed[0], None).await.unwrap();
    assert_eq!(
        entries(&log)[2..],
        ["kill 0 sandboxes", "tear down u1"],
        "containers first, without the network's sandbox"
    );
    assert!(runtime.get_pods(true).await.unwrap().is_empty());
    let status = runtime.get_pod_status(&PodUid::new("u1"), "p", "default").await.unwrap();
    assert!(status.ips.is_empty() && status.network_namespace().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_synced_pod_is_checked_once_per_interval() {
    let log = Log::default();
    let runtime = networked(&log, InMemory::new(&log)).with_check_interval(Duration::from_secs(60));
    let pod = pod("u1", &["app"]);
    sync(&runtime, &pod).await;
    sync(&runtime, &pod).await;
    tokio::time::advance(Duration::from_secs(59)).await;
    sync(&runtime, &pod).await;
    assert!(!entries(&log).iter().any(|entry| entry.starts_with("check")), "{:?}", entries(&log));
    tokio::time::advance(Duration::from_secs(1)).await;
    sync(&runtime, &pod).await;
    sync(&runtime, &pod).await;
    assert_eq!(entries(&log).iter().filter(|entry| entry.starts_with("check")).count(), 1, "{:?}", entries(&log));
}

#[tokio::test]
async fn a_failed_set_up_starts_nothing() {
    let log = Log::default();
    let runtime = networked(&log, InMemory { fail_set_up: true, ..InMemory::new(&log) });
    let result = sync(&runtime, &pod("u1", &["app"])).await;
    let failure = result.errors().next().expect("the set-up failure");
    assert_eq!(failure.reason, reasons::CREATE_POD_SANDBOX_ERROR);
    assert!(failure.message.contains("no address left"), "{}", failure.message);
    assert_eq!(entries(&log), ["set up u1"], "the runtime was not asked to start containers");
}

#[tokio::test]
async fn host_network_pods_are_passed_through() {
    let log = Log::default();
    let runtime = networked(&log, InMemory::new(&log));
    let mut pod = pod("u1", &["app"]);
    pod.spec.as_mut().unwrap().host_network = Some(true);
    sync(&runtime, &pod).await;
    assert_eq!(entries(&log), ["sync in none with ips []"]);
}

#[tokio::test]
async fn a_network_left_from_before_a_restart_is_listed_for_the_agent_to_kill() {
    let log = Log::default();
    let runtime = networked(&log, InMemory::new(&log).with_network("gone", "old"));
    let listed = runtime.get_pods(false).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].uid.as_str(), listed[0].name.as_str()), ("gone", "old"));
    assert!(listed[0].is_running(), "a ready sandbox keeps it listed as running");
    runtime.kill_pod(None, &listed[0], None).await.unwrap();
    assert_eq!(entries(&log), ["kill 0 sandboxes", "tear down gone"]);
}

#[tokio::test]
async fn the_plugin_decides_network_readiness() {
    let log = Log::default();
    let runtime = networked(&log, InMemory { not_ready: Some("no network config".into()), ..InMemory::new(&log) });
    let status = runtime.status().await.unwrap();
    assert!(status.runtime_ready());
    assert!(!status.network_ready());
    let condition = status.condition(NETWORK_READY).unwrap();
    assert_eq!(condition.reason, "NetworkPluginNotReady");
    assert!(condition.message.contains("no network config"), "{}", condition.message);
}
