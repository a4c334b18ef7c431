//! Kubelet tests with the fake runtime: the sync trio, status, admission, handlers and
//! housekeeping.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{ContainerPort, Pod, PodStatus as ApiPodStatus, ResourceRequirements},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Time},
};
use kubelet_core::{
    PodManager, PodStatusFn, PodSyncer, PodUid, RuntimeState, Source, SourcesReady, SyncHandler, SyncPodType,
    UpdatePodOptions, WorkQueue, WorkerSync,
    cgroups::{PodCgroupError, PodCgroups},
    clock::wall_now,
    events::RingRecorder,
    fake::{self, FakeRuntime},
    runtime::{self, NETWORK_READY, PodStatus, RUNTIME_READY, Runtime, RuntimeCondition, RuntimeStatus},
    testing::{self, RecordingWorkers},
};
use tokio::time::Instant;

use crate::{
    Config, Error, Kubelet, PodSync,
    admission::{NodeResources, admit},
    lock,
    status_store::StatusStore,
};

fn pod(uid: &str, policy: &str, containers: &[&str]) -> Arc<Pod> {
    let mut pod = testing::pod(uid, containers);
    if let Some(spec) = pod.spec.as_mut() {
        spec.restart_policy = Some(policy.into());
    }
    Arc::new(pod)
}

struct Fixture {
    runtime: Arc<FakeRuntime>,
    /// The PLEG's cache, which housekeeping reads; [`Fixture::relist`] fills it.
    cache: Arc<kubelet_core::Cache>,
    state: Arc<RuntimeState>,
    sync: Arc<PodSync<FakeRuntime>>,
    events: Arc<RingRecorder>,
    root: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let runtime = Arc::new(FakeRuntime::new());
    let state = Arc::new(RuntimeState::default());
    state.update_from_status(Ok::<_, String>(&ready_status(true)), Instant::now());
    let events = Arc::new(RingRecorder::default());
    let root = tempfile::tempdir().unwrap();
    let config =
        Config::new("node-1").root_dir(root.path()).node(NodeResources::new(4000, 8 << 30)).node_ip("192.0.2.2");
    let sync =
        Arc::new(PodSync::new(runtime.clone(), state.clone(), Arc::new(StatusStore::new()), events.clone(), config));
    Fixture { runtime, cache: Arc::new(kubelet_core::Cache::new()), state, sync, events, root }
}

fn ready_status(network: bool) -> RuntimeStatus {
    RuntimeStatus::new(vec![
        RuntimeCondition::new(RUNTIME_READY, true, "", ""),
        RuntimeCondition::new(NETWORK_READY, network, "NetworkPluginNotReady", "cni config uninitialized"),
    ])
}

impl Fixture {
    /// What a PLEG relist does to the cache: every pod of the runtime, inspected now.
    async fn relist(&self) {
        let now = Instant::now();
        let listed = self.runtime.get_pods(true).await.unwrap();
        for (uid, _) in self.cache.pods() {
            if !listed.iter().any(|p| p.uid == uid) {
                self.cache.delete(&uid);
            }
        }
        for pod in listed {
            let status = self.runtime.get_pod_status(&pod.uid, &pod.name, &pod.namespace).await.unwrap();
            self.cache.set(&pod.uid, status, None, now);
        }
        self.cache.update_time(now);
    }

    async fn runtime_status(&self, p: &Pod) -> PodStatus {
        self.runtime.get_pod_status(&PodUid::of(p), "", "").await.unwrap()
    }

    async fn sync(&self, p: &Arc<Pod>) -> Result<bool, Error> {
        let status = self.runtime_status(p).await;
        self.sync.sync_pod(SyncPodType::Sync, p, None, &status).await
    }

    fn phase(&self, p: &Pod) -> Option<String> {
        self.sync.statuses().get(&PodUid::of(p)).and_then(|s| s.status.phase)
    }

    fn stored(&self, p: &Pod) -> ApiPodStatus {
        self.sync.statuses().get(&PodUid::of(p)).unwrap().status
    }
}

#[tokio::test(start_paused = true)]
async fn sync_pod_starts_the_pod_and_reports_its_status() {
    let f = fixture();
    let p = pod("web", "Always", &["a", "b"]);
    assert!(!f.sync(&p).await.unwrap());
    assert_eq!(f.phase(&p).as_deref(), Some("Pending"), "the first status precedes the start");
    assert!(f.root.path().join("pods/web/volumes").is_dir(), "pod directories are made");
    assert!(!f.sync(&p).await.unwrap());
    let status = f.stored(&p);
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(status.pod_ip.as_deref().map(|ip| ip.starts_with("10.88.")), Some(true));
    assert_eq!(status.host_ip.as_deref(), Some("192.0.2.2"));
    let ready = status.conditions.unwrap().into_iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "True");
}

#[tokio::test(start_paused = true)]
async fn a_pod_whose_containers_all_succeeded_is_terminal() {
    let f = fixture();
    f.runtime.set_exit_code("job", 0);
    let p = pod("job", "OnFailure", &["job"]);
    assert!(!f.sync(&p).await.unwrap());
    assert!(f.sync(&p).await.unwrap(), "Succeeded is terminal");
    assert_eq!(f.phase(&p).as_deref(), Some("Succeeded"));
    let never = pod("never", "Never", &["job2"]);
    f.runtime.set_exit_code("job2", 1);
    f.sync(&never).await.unwrap();
    assert!(f.sync(&never).await.unwrap());
    assert_eq!(f.phase(&never).as_deref(), Some("Failed"));
}

#[tokio::test(start_paused = true)]
async fn crash_loop_backoff_becomes_the_waiting_reason() {
    let f = fixture();
    f.runtime.set_exit_code("app", 1);
    let p = pod("crash", "Always", &["app"]);
    f.sync(&p).await.unwrap();
    f.sync(&p).await.unwrap(); // the first restart is immediate
    f.sync(&p).await.unwrap(); // now in backoff: not an error, and the status shows it at once
    let status = f.stored(&p);
    let c = &status.container_statuses.unwrap()[0];
    let waiting = c.state.as_ref().unwrap().waiting.as_ref().unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("CrashLoopBackOff"));
    assert_eq!(c.last_state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code, 1);
    assert_eq!(status.phase.as_deref(), Some("Running"));
}

#[tokio::test(start_paused = true)]
async fn a_pod_in_crash_loop_backoff_is_queued_for_when_the_backoff_ends() {
    let (f, queue) = fixture_with_queue();
    f.runtime.set_exit_code("app", 1);
    let p = pod("crash", "Always", &["app"]);
    f.sync(&p).await.unwrap();
    f.sync(&p).await.unwrap(); // the first restart is immediate and starts a 10 s backoff
    assert!(queue.is_empty(), "no backoff yet");
    tokio::time::advance(Duration::from_secs(4)).await;
    f.sync(&p).await.unwrap(); // held back
    tokio::time::advance(Duration::from_millis(5990)).await;
    assert!(queue.take_due().is_empty(), "not before the backoff ends");
    tokio::time::advance(Duration::from_millis(20)).await;
    assert_eq!(queue.take_due(), [PodUid::of(&p)]);
}

/// A fixture whose syncer queues pods for their next timed sync on the returned queue.
fn fixture_with_queue() -> (Fixture, Arc<WorkQueue>) {
    let queue = Arc::new(WorkQueue::new());
    let mut f = fixture();
    f.sync = Arc::new(
        PodSync::new(
            f.runtime.clone(),
            f.state.clone(),
            Arc::new(StatusStore::new()),
            f.events.clone(),
            Config::new("node-1").root_dir(f.root.path()),
        )
        .work_queue(queue.clone()),
    );
    (f, queue)
}

#[tokio::test(start_paused = true)]
async fn a_pod_with_an_active_deadline_is_queued_for_the_deadline() {
    let (f, queue) = fixture_with_queue();
    let mut spec_pod = (*pod("deadline", "Always", &["a"])).clone();
    spec_pod.spec.as_mut().unwrap().active_deadline_seconds = Some(30);
    let p = Arc::new(spec_pod);
    f.sync(&p).await.unwrap();
    tokio::time::advance(Duration::from_secs(28)).await;
    assert!(queue.take_due().is_empty(), "not before the deadline");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(queue.take_due(), [PodUid::of(&p)]);
}

#[tokio::test(start_paused = true)]
async fn active_deadline_fails_the_pod() {
    let f = fixture();
    let mut spec_pod = (*pod("deadline", "Always", &["a"])).clone();
    spec_pod.spec.as_mut().unwrap().active_deadline_seconds = Some(1);
    let p = Arc::new(spec_pod);
    f.sync(&p).await.unwrap();
    // It started five seconds ago (the start time is set once, so the record is replaced).
    let mut status = f.stored(&p);
    status.start_time = Some(Time(wall_now() - k8s_openapi::jiff::SignedDuration::from_secs(5)));
    f.sync.statuses().remove(&PodUid::of(&p));
    f.sync.statuses().set(&p, status);
    assert!(f.sync(&p).await.unwrap(), "terminal");
    let status = f.stored(&p);
    assert_eq!((status.phase.as_deref(), status.reason.as_deref()), (Some("Failed"), Some("DeadlineExceeded")));
    assert!(f.events.events().iter().any(|e| e.reason == "DeadlineExceeded"));
}

#[tokio::test(start_paused = true)]
async fn a_network_that_is_not_ready_holds_pod_network_pods_only() {
    let f = fixture();
    f.state.update_from_status(Ok::<_, String>(&ready_status(false)), Instant::now());
    let p = pod("net", "Always", &["a"]);
    let err = f.sync(&p).await.unwrap_err();
    assert!(PodSync::<FakeRuntime>::is_network_not_ready(&err), "{err}");
    // Upstream's warning, with the error as its message.
    let event = f.events.events().into_iter().find(|e| e.reason == "NetworkNotReady").expect("a warning event");
    assert_eq!((event.kind, &event.message), (kubelet_core::events::EventType::Warning, &err.to_string()));
    assert!(event.message.starts_with("network is not ready: "), "{}", event.message);
    let mut host = (*pod("host", "Always", &["a"])).clone();
    host.spec.as_mut().unwrap().host_network = Some(true);
    assert!(!f.sync(&Arc::new(host)).await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn terminating_kills_with_the_grace_and_records_the_final_status() {
    let f = fixture();
    let p = pod("stop", "Always", &["a"]);
    f.sync(&p).await.unwrap();
    let status = f.runtime_status(&p).await;
    let evicted: PodStatusFn = Arc::new(|s: &mut ApiPodStatus| s.reason = Some("Evicted".into()));
    f.sync.sync_terminating_pod(&p, &status, 7, Some(&evicted)).await.unwrap();
    assert_eq!(f.runtime.calls_of(fake::Method::KillPod).len(), 1);
    assert!(!f.runtime_status(&p).await.is_running());
    let stored = f.stored(&p);
    assert_eq!(stored.reason.as_deref(), Some("Evicted"));
    assert_eq!(stored.phase.as_deref(), Some("Failed"), "a killed Always pod ends Failed");
    assert!(f.runtime_status(&p).await.ips.is_empty(), "a stopped sandbox reports no IP");
    assert_eq!(
        stored.pod_ip,
        status.ips.first().cloned(),
        "the IP it had, kept (upstream preserveDataFromBeforeStopping)"
    );
    assert!(stored.pod_ip.is_some());
    f.sync.sync_terminated_pod(&p, &f.runtime_status(&p).await).await.unwrap();
    let orphan = runtime::Pod::new(PodUid::new("ghost"), "ghost", "default");
    f.sync.sync_terminating_runtime_pod(&orphan).await.unwrap();
}

/// Pod workers that record what they are asked.
type Recorded = RecordingWorkers;

type TestKubelet = (Kubelet<FakeRuntime, Recorded>, Arc<Recorded>, Arc<SourcesReady>);

fn kubelet(f: &Fixture, max_pods: usize) -> TestKubelet {
    kubelet_with(f, max_pods, None)
}

/// A kubelet over the fixture's runtime, making pods' cgroups with `cgroups` when given.
fn kubelet_with(f: &Fixture, max_pods: usize, cgroups: Option<Arc<dyn PodCgroups>>) -> TestKubelet {
    let workers = Arc::new(Recorded::default());
    let sources = Arc::new(SourcesReady::new([Source::File]));
    let mut node = NodeResources::new(1000, 1 << 30);
    node.max_pods = max_pods;
    let config = Config::new("node-1").root_dir(f.root.path()).node(node);
    let mut sync =
        PodSync::new(f.runtime.clone(), f.state.clone(), f.sync.statuses().clone(), f.events.clone(), config);
    if let Some(cgroups) = cgroups {
        sync = sync.pod_cgroups(cgroups);
    }
    let sync = Arc::new(sync);
    let kubelet = Kubelet::new(sync, workers.clone(), Arc::new(PodManager::new()), sources.clone(), f.cache.clone());
    (kubelet, workers, sources)
}

/// The updates asked for since the last call, as (type, pod UID).
fn updates(w: &Recorded) -> Vec<(SyncPodType, String)> {
    let uid = |options: &UpdatePodOptions| {
        let from_config = options.pod.as_deref().map(PodUid::of);
        from_config.or_else(|| options.running_pod.as_ref().map(|r| r.uid.clone())).unwrap().to_string()
    };
    w.take_updates().iter().map(|options| (options.update_type, uid(options))).collect()
}

#[tokio::test(start_paused = true)]
async fn additions_are_admitted_or_rejected_with_upstream_reasons() {
    let f = fixture();
    let (k, w, _) = kubelet(&f, 2);
    k.handle_pod_additions(vec![pod("a", "Always", &["c"]), pod("b", "Always", &["c"])]).await;
    assert_eq!(updates(&w), [(SyncPodType::Create, "a".to_owned()), (SyncPodType::Create, "b".to_owned())]);
    // A third pod is one too many.
    let third = pod("c", "Always", &["c"]);
    k.handle_pod_additions(vec![third.clone()]).await;
    assert!(updates(&w).is_empty(), "a rejected pod is not started");
    let status = f.stored(&third);
    assert_eq!((status.phase.as_deref(), status.reason.as_deref()), (Some("Failed"), Some("OutOfpods")));
    assert!(status.message.unwrap().starts_with("Pod was rejected: Node didn't have enough resource: pods"));
    assert!(f.events.events().iter().any(|e| e.reason == "OutOfpods"));
}

/// One batch is admitted as the same pods one by one would be: each admitted pod holds its room
/// for the next, a rejected one holds none.
#[tokio::test(start_paused = true)]
async fn a_batch_of_additions_counts_each_admitted_pod_against_the_next() {
    let f = fixture();
    let (k, w, _) = kubelet(&f, 3);
    let mut host_port = pod("b", "Always", &["c"]);
    let mut unsupported = pod("x", "Always", &["c"]);
    Arc::make_mut(&mut unsupported).spec.as_mut().unwrap().host_users = Some(false);
    let ports = vec![k8s_openapi::api::core::v1::ContainerPort {
        container_port: 80,
        host_port: Some(8080),
        ..Default::default()
    }];
    Arc::make_mut(&mut host_port).spec.as_mut().unwrap().containers[0].ports = Some(ports);
    let mut same_port = host_port.clone();
    Arc::make_mut(&mut same_port).metadata.uid = Some("b2".into());
    Arc::make_mut(&mut same_port).metadata.name = Some("b2".into());
    let fourth = pod("d", "Always", &["c"]);
    let batch = vec![
        pod("a", "Always", &["c"]),
        unsupported,
        host_port,
        same_port.clone(),
        pod("c", "Always", &["c"]),
        fourth.clone(),
    ];
    k.handle_pod_additions(batch).await;
    // x is refused and holds no room; b2 wants b's host port; d is the fourth runnable pod.
    let created = ["a", "b", "c"].map(|uid| (SyncPodType::Create, uid.to_owned()));
    assert_eq!(updates(&w), created);
    assert_eq!(f.stored(&same_port).reason.as_deref(), Some("NodePorts"));
    assert_eq!(f.stored(&fourth).reason.as_deref(), Some("OutOfpods"));
}

#[tokio::test(start_paused = true)]
async fn pods_using_unimplemented_fields_are_refused_never_run_without_them() {
    let f = fixture();
    let (k, w, _) = kubelet(&f, 10);
    let mut probed = (*pod("p", "Always", &["app"])).clone();
    probed.spec.as_mut().unwrap().containers[0].readiness_probe = Some(k8s_openapi::api::core::v1::Probe::default());
    let probed = Arc::new(probed);
    k.handle_pod_additions(vec![probed.clone()]).await;
    assert!(updates(&w).is_empty(), "a refused pod is not started");
    let status = f.stored(&probed);
    assert_eq!((status.phase.as_deref(), status.reason.as_deref()), (Some("Failed"), Some("UnsupportedPodSpec")));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was rejected: this node agent does not implement spec.containers[0].readinessProbe")
    );
    let event = f.events.events().into_iter().find(|e| e.reason == "UnsupportedPodSpec").expect("a warning event");
    assert_eq!(event.kind, kubelet_core::events::EventType::Warning);
    assert!(event.message.contains("spec.containers[0].readinessProbe"), "{}", event.message);
}

#[test]
fn admission_counts_huge_pages_of_each_size() {
    let mut node = NodeResources::new(1000, 1 << 30);
    node.hugepages = BTreeMap::from([(2 << 20, 8 << 20), (1 << 30, 0)]);
    let with = |resource: &str, amount: &str| {
        let mut p = (*pod("x", "Always", &["c"])).clone();
        let both = BTreeMap::from([
            ("memory".to_owned(), Quantity("1Mi".into())),
            (resource.to_owned(), Quantity(amount.into())),
        ]);
        p.spec.as_mut().unwrap().containers[0].resources =
            Some(ResourceRequirements { requests: Some(both.clone()), limits: Some(both), ..Default::default() });
        p
    };
    let running = with("hugepages-2Mi", "6Mi");
    assert!(admit(&with("hugepages-2Mi", "2Mi"), &[&running], &node).is_ok());
    let rejection = admit(&with("hugepages-2Mi", "4Mi"), &[&running], &node).unwrap_err();
    assert_eq!(rejection.reason, "OutOfhugepages-2Mi");
    assert_eq!(
        rejection.message,
        "Node didn't have enough resource: hugepages-2Mi, requested: 4194304, used: 6291456, capacity: 8388608"
    );
    let no_gigantic = admit(&with("hugepages-1Gi", "1Gi"), &[], &node).unwrap_err();
    assert_eq!(no_gigantic.reason, "OutOfhugepages-1Gi", "a size with nothing allocated");
    let unknown = admit(&with("hugepages-64Ki", "64Ki"), &[], &node).unwrap_err();
    assert_eq!(unknown.reason, "OutOfhugepages-64Ki", "a size the kernel lacks");
}

#[test]
fn admission_counts_ephemeral_storage_requests_when_the_node_knows_its_storage() {
    let with = |amount: &str| {
        let mut p = (*pod("x", "Always", &["c"])).clone();
        let requests = BTreeMap::from([("ephemeral-storage".to_owned(), Quantity(amount.into()))]);
        p.spec.as_mut().unwrap().containers[0].resources =
            Some(ResourceRequirements { requests: Some(requests), ..Default::default() });
        p
    };
    let running = with("6Gi");
    let mut node = NodeResources::new(1000, 1 << 30);
    assert!(admit(&with("6Gi"), &[&running], &node).is_ok(), "unknown storage is not checked");
    node.ephemeral_storage_bytes = Some(10 << 30);
    assert!(admit(&with("4Gi"), &[&running], &node).is_ok());
    let rejection = admit(&with("5Gi"), &[&running], &node).unwrap_err();
    assert_eq!(rejection.reason, "OutOfephemeral-storage");
    assert_eq!(
        rejection.message,
        "Node didn't have enough resource: ephemeral-storage, requested: 5368709120, used: 6442450944, capacity: 10737418240"
    );
    assert!(admit(&(*pod("y", "Always", &["c"])).clone(), &[&running, &with("4Gi")], &node).is_ok(), "no request");
}

#[test]
fn a_pod_confined_by_apparmor_is_refused_where_the_host_cannot_enforce_it() {
    let confined = |annotation: &str| {
        let mut p = (*pod("x", "Always", &["c"])).clone();
        let key = "container.apparmor.security.beta.kubernetes.io/c".to_owned();
        p.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(key, annotation.to_owned());
        p
    };
    let mut node = NodeResources::new(1000, 1 << 30);
    assert!(admit(&confined("runtime/default"), &[], &node).is_ok(), "a host that enforces it");
    let rejection = admit(&confined("localhost/"), &[], &node).unwrap_err();
    assert_eq!(rejection.message, "Cannot enforce AppArmor: invalid empty AppArmor profile name: \"\"");
    node.apparmor_unavailable = Some("AppArmor is not enabled on the host");
    let rejection = admit(&confined("runtime/default"), &[], &node).unwrap_err();
    assert_eq!(
        (rejection.reason.as_str(), rejection.message.as_str()),
        ("AppArmor", "Cannot enforce AppArmor: AppArmor is not enabled on the host")
    );
    assert!(admit(&confined("unconfined"), &[], &node).is_ok(), "unconfined asks nothing of the host");
    let mut running = confined("runtime/default");
    running.status =
        Some(k8s_openapi::api::core::v1::PodStatus { phase: Some("Running".into()), ..Default::default() });
    assert!(admit(&running, &[], &node).is_ok(), "a running pod, admitted again after a restart, is not checked");
}

#[tokio::test(start_paused = true)]
async fn admission_checks_cpu_memory_selector_and_host_ports() {
    let node = NodeResources::new(1000, 1 << 30);
    let with = |cpu: &str, mem: &str, port: Option<i32>| {
        let mut p = (*pod("x", "Always", &["c"])).clone();
        let c = &mut p.spec.as_mut().unwrap().containers[0];
        c.resources = Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), Quantity(cpu.into())),
                ("memory".into(), Quantity(mem.into())),
            ])),
            ..Default::default()
        });
        c.ports = port.map(|h| vec![ContainerPort { container_port: 80, host_port: Some(h), ..Default::default() }]);
        p
    };
    let running = with("600m", "256Mi", Some(8080));
    assert_eq!(admit(&with("500m", "1Mi", None), &[&running], &node).unwrap_err().reason, "OutOfcpu");
    assert_eq!(admit(&with("100m", "900Mi", None), &[&running], &node).unwrap_err().reason, "OutOfmemory");
    assert_eq!(admit(&with("100m", "1Mi", Some(8080)), &[&running], &node).unwrap_err().reason, "NodePorts");
    let mut picky = with("100m", "1Mi", None);
    picky.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([("disk".into(), "ssd".into())]));
    assert_eq!(admit(&picky, &[], &node).unwrap_err().reason, "NodeAffinity");
    assert!(admit(&with("400m", "512Mi", Some(9090)), &[&running], &node).is_ok());
}

#[test]
fn admission_is_upstreams_predicates_in_upstreams_words() {
    use k8s_openapi::api::core::v1::{Container, PodOS, PodSecurityContext, Sysctl};
    let node = NodeResources::new(1000, 1 << 30);
    let requesting = |cpu: &str| ResourceRequirements {
        requests: Some(BTreeMap::from([("cpu".into(), Quantity(cpu.into()))])),
        ..Default::default()
    };
    let base = || (*pod("x", "Always", &["c"])).clone();

    let mut windows = base();
    windows.metadata.labels = Some(BTreeMap::from([("kubernetes.io/os".into(), "windows".into())]));
    let rejection = admit(&windows, &[], &node).unwrap_err();
    assert_eq!(rejection.reason, "PodOSSelectorNodeLabelDoesNotMatch");
    assert_eq!(rejection.message, "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label");
    let mut os_field = base();
    os_field.spec.as_mut().unwrap().os = Some(PodOS { name: "windows".into() });
    assert_eq!(admit(&os_field, &[], &node).unwrap_err().reason, "PodOSNotSupported");

    // Sidecars add to the sum and to later init containers; the overhead adds on top.
    let mut sidecars = base();
    let spec = sidecars.spec.as_mut().unwrap();
    spec.containers[0].resources = Some(requesting("300m"));
    spec.init_containers = Some(vec![
        Container {
            name: "proxy".into(),
            restart_policy: Some("Always".into()),
            resources: Some(requesting("200m")),
            ..Default::default()
        },
        Container { name: "setup".into(), resources: Some(requesting("700m")), ..Default::default() },
    ]);
    assert_eq!(crate::admission::pod_requests(&sidecars).0, 900, "the setup container with the sidecar running");
    sidecars.spec.as_mut().unwrap().overhead = Some(BTreeMap::from([("cpu".into(), Quantity("150m".into()))]));
    let rejection = admit(&sidecars, &[], &node).unwrap_err();
    assert_eq!(rejection.reason, "OutOfcpu");
    assert_eq!(rejection.message, "Node didn't have enough resource: cpu, requested: 1050, used: 0, capacity: 1000");

    let mut selector = base();
    selector.spec.as_mut().unwrap().node_selector = Some(BTreeMap::from([("disk".into(), "ssd".into())]));
    let rejection = admit(&selector, &[], &node).unwrap_err();
    assert_eq!(
        (rejection.reason.as_str(), rejection.message.as_str()),
        ("NodeAffinity", "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector")
    );
    let mut labelled = node.clone();
    labelled.labels.insert("disk".into(), "ssd".into());
    assert!(admit(&selector, &[], &labelled).is_ok(), "the node's own labels count");

    // Once the API's Node is known, its labels and taints count in place of the node's own.
    let api_node = crate::admission::ApiNode::default();
    assert!(admit(&selector, &[], &api_node.over(&node)).is_err(), "the node's own labels until then");
    let taint = k8s_openapi::api::core::v1::Taint {
        key: "dedicated".into(),
        value: Some("storage".into()),
        effect: "NoExecute".into(),
        time_added: None,
    };
    api_node.set(BTreeMap::from([("disk".into(), "ssd".into())]), vec![taint]);
    let rejection = admit(&selector, &[], &api_node.over(&node)).unwrap_err();
    assert_eq!(
        (rejection.reason.as_str(), rejection.message.as_str()),
        ("TaintToleration", "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"),
        "the label matches, the taint is not tolerated"
    );
    let mut from_a_file = selector.clone();
    from_a_file.metadata.annotations =
        Some(BTreeMap::from([(kubelet_core::types::annotations::CONFIG_SOURCE.into(), "file".into())]));
    assert!(admit(&from_a_file, &[], &api_node.over(&node)).is_ok(), "static pods need not tolerate it");
    selector.spec.as_mut().unwrap().tolerations = Some(vec![k8s_openapi::api::core::v1::Toleration {
        key: Some("dedicated".into()),
        operator: Some("Exists".into()),
        ..Default::default()
    }]);
    assert!(admit(&selector, &[], &api_node.over(&node)).is_ok());
    api_node.forget();
    assert!(admit(&selector, &[], &api_node.over(&node)).is_err(), "the Node gone, the node's own labels again");

    // Host ports collide on the same IP, or when either takes every address.
    let on = |ip: Option<&str>| {
        let mut p = base();
        p.spec.as_mut().unwrap().containers[0].ports = Some(vec![ContainerPort {
            container_port: 80,
            host_port: Some(8080),
            host_ip: ip.map(Into::into),
            ..Default::default()
        }]);
        p
    };
    let (first, second, every) = (on(Some("10.0.0.1")), on(Some("10.0.0.2")), on(None));
    assert!(admit(&second, &[&first], &node).is_ok(), "another IP");
    let rejection = admit(&every, &[&first], &node).unwrap_err();
    assert_eq!(
        rejection.message,
        "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
    );

    let with_sysctl = |name: &str, host_network: bool| {
        let mut p = base();
        let spec = p.spec.as_mut().unwrap();
        spec.host_network = Some(host_network);
        spec.security_context = Some(PodSecurityContext {
            sysctls: Some(vec![Sysctl { name: name.into(), value: "1".into() }]),
            ..Default::default()
        });
        p
    };
    assert!(admit(&with_sysctl("net.ipv4.tcp_syncookies", false), &[], &node).is_ok());
    let rejection = admit(&with_sysctl("net.core.somaxconn", false), &[], &node).unwrap_err();
    assert_eq!(
        (rejection.reason.as_str(), rejection.message.as_str()),
        ("SysctlForbidden", "forbidden sysctl: \"net.core.somaxconn\" not allowlisted")
    );
    let mut permissive = node.clone();
    permissive.allowed_unsafe_sysctls = vec!["net.core.*".into()];
    assert!(admit(&with_sysctl("net.core.somaxconn", false), &[], &permissive).is_ok());
    let rejection = admit(&with_sysctl("net.core.somaxconn", true), &[], &permissive).unwrap_err();
    assert_eq!(rejection.message, "forbidden sysctl: \"net.core.somaxconn\" not allowed with host net enabled");

    let mut full = node.clone();
    full.max_pods = 1;
    let rejection = admit(&base(), &[&base()], &full).unwrap_err();
    assert_eq!(rejection.message, "Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1");
}

#[tokio::test(start_paused = true)]
async fn removals_wait_for_every_source_then_kill() {
    let f = fixture();
    let (k, w, sources) = kubelet(&f, 110);
    let p = pod("a", "Always", &["c"]);
    k.handle_pod_additions(vec![p.clone()]).await;
    updates(&w);
    k.handle_pod_removes(vec![p.clone()]).await;
    assert!(updates(&w).is_empty(), "no kill before the sources are ready");
    sources.add_source(Source::File);
    k.handle_pod_updates(vec![p.clone()]).await;
    k.handle_pod_syncs(vec![p.clone()]).await;
    k.handle_pod_removes(vec![p]).await;
    assert_eq!(
        updates(&w),
        [
            (SyncPodType::Update, "a".to_owned()),
            (SyncPodType::Sync, "a".to_owned()),
            (SyncPodType::Kill, "a".to_owned())
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn housekeeping_kills_orphans_and_forgets_what_is_gone() {
    let f = fixture();
    let (k, w, sources) = kubelet(&f, 110);
    sources.add_source(Source::File);
    // Running in the runtime, unknown to config and workers: an orphan.
    let ghost = pod("ghost", "Always", &["c"]);
    f.sync(&ghost).await.unwrap();
    // Known to config: not an orphan.
    let kept = pod("kept", "Always", &["c"]);
    k.handle_pod_additions(vec![kept.clone()]).await;
    f.sync(&kept).await.unwrap();
    w.know(PodUid::new("kept"), WorkerSync::new(kubelet_core::WorkerState::Syncing, false, true, false));
    updates(&w);
    assert!(f.sync.statuses().get(&PodUid::new("ghost")).is_some());
    f.relist().await;
    f.runtime.clear_calls();
    k.handle_pod_cleanups().await.unwrap();
    assert!(f.runtime.calls().is_empty(), "housekeeping asks the runtime nothing: {:?}", f.runtime.calls());
    k.cleanups().run_queued().await;
    assert_eq!(updates(&w), [(SyncPodType::Kill, "ghost".to_owned())]);
    assert!(f.sync.statuses().get(&PodUid::new("ghost")).is_none(), "its status is forgotten");
    assert!(f.root.path().join("pods/ghost").exists(), "its directory stays while it still runs");
    assert!(f.root.path().join("pods/kept").exists());
    // Once it is stopped, its directory goes with what is left of it.
    let status = f.runtime_status(&ghost).await;
    f.sync.sync_terminating_pod(&ghost, &status, 0, None).await.unwrap();
    k.handle_pod_cleanups().await.unwrap();
    k.cleanups().run_queued().await;
    assert!(!f.root.path().join("pods/ghost").exists(), "its directory is removed");
    assert!(f.root.path().join("pods/kept").exists());
}

/// How many walks over the pods housekeeping made so far.
fn walks(w: &Recorded) -> usize {
    w.known_syncs.load(std::sync::atomic::Ordering::SeqCst)
}

/// Runs housekeeping `times` times; how many walks over the pods it made in all.
async fn housekeep(k: &Kubelet<FakeRuntime, Recorded>, w: &Recorded, times: usize) -> usize {
    for _ in 0..times {
        k.handle_pod_cleanups().await.unwrap();
    }
    walks(w)
}

#[tokio::test(start_paused = true)]
async fn an_idle_housekeeping_walks_no_pod_until_something_changes() {
    let f = fixture();
    let (k, w, sources) = kubelet(&f, 110);
    sources.add_source(Source::File);
    *w.lifecycle.lock().unwrap() = Some(0);
    let kept = pod("kept", "Always", &["c"]);
    k.handle_pod_additions(vec![kept.clone()]).await;
    f.sync(&kept).await.unwrap();
    w.know(PodUid::new("kept"), WorkerSync::new(kubelet_core::WorkerState::Syncing, false, true, false));
    f.relist().await;
    assert_eq!(housekeep(&k, &w, 1).await, 1, "the first housekeeping walks");
    assert_eq!(housekeep(&k, &w, 3).await, 1, "nothing moved: no walk");

    // Each input that moves brings one walk, which finds nothing to do.
    let other = pod("other", "Always", &["c"]);
    k.handle_pod_additions(vec![other.clone()]).await;
    w.know(PodUid::new("other"), WorkerSync::new(kubelet_core::WorkerState::Syncing, false, true, false));
    assert_eq!(housekeep(&k, &w, 2).await, 2, "a pod added");
    f.sync(&other).await.unwrap();
    f.relist().await;
    assert_eq!(housekeep(&k, &w, 2).await, 3, "the runtime changed (and the status with it)");
    *w.lifecycle.lock().unwrap() = Some(1);
    assert_eq!(housekeep(&k, &w, 2).await, 4, "a worker's lifecycle moved");
    f.sync
        .statuses()
        .set(&kept, k8s_openapi::api::core::v1::PodStatus { message: Some("x".into()), ..Default::default() });
    assert_eq!(housekeep(&k, &w, 2).await, 5, "a status changed");
    // Workers that cannot say (a termination under way): every housekeeping walks.
    *w.lifecycle.lock().unwrap() = None;
    assert_eq!(housekeep(&k, &w, 2).await, 7);
    assert!(updates(&w).iter().all(|(kind, _)| *kind != SyncPodType::Kill), "nothing was killed");
}

#[tokio::test(start_paused = true)]
async fn housekeeping_walks_every_time_while_an_orphan_is_left_and_settles_once_it_is_gone() {
    let f = fixture();
    let (k, w, sources) = kubelet(&f, 110);
    sources.add_source(Source::File);
    *w.lifecycle.lock().unwrap() = Some(0);
    let ghost = pod("ghost", "Always", &["c"]);
    f.sync(&ghost).await.unwrap();
    f.relist().await;
    k.handle_pod_cleanups().await.unwrap();
    assert_eq!(updates(&w), [(SyncPodType::Kill, "ghost".to_owned())]);
    // The kill has not reached the runtime yet (these workers only record it): nothing moved,
    // and still each housekeeping walks and asks again, since the last walk acted.
    for round in 2..=4 {
        k.handle_pod_cleanups().await.unwrap();
        assert_eq!(walks(&w), round);
        assert_eq!(updates(&w), [(SyncPodType::Kill, "ghost".to_owned())]);
    }
    // Stopped: what is left of it is removed, and the walks go on until the runtime holds
    // nothing of it.
    let status = f.runtime_status(&ghost).await;
    f.sync.sync_terminating_pod(&ghost, &status, 0, None).await.unwrap();
    f.relist().await;
    k.handle_pod_cleanups().await.unwrap();
    k.cleanups().run_queued().await;
    f.relist().await;
    assert!(f.runtime.get_pods(true).await.unwrap().is_empty(), "the runtime holds nothing of it");
    k.handle_pod_cleanups().await.unwrap();
    k.cleanups().run_queued().await;
    let settled = walks(&w);
    for _ in 0..3 {
        k.handle_pod_cleanups().await.unwrap();
    }
    assert_eq!(walks(&w), settled, "nothing is left: no walk");
    assert!(!f.root.path().join("pods/ghost").exists());
}

#[tokio::test(start_paused = true)]
async fn pod_directories_are_made_0750_as_upstream_makes_them() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture();
    f.sync(&pod("web", "Always", &["c"])).await.unwrap();
    for dir in ["pods", "pods/web", "pods/web/volumes", "pods/web/plugins", "pods/web/containers"] {
        let mode = std::fs::metadata(f.root.path().join(dir)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o750, "{dir}: {mode:o}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_orphan_killed_after_the_first_sweep_has_its_directory_swept_once_it_is_gone() {
    let f = fixture();
    let (k, w, sources) = kubelet(&f, 110);
    sources.add_source(Source::File);
    *w.lifecycle.lock().unwrap() = Some(0);
    // A pod deleted while the agent was down: in the runtime, with its directory, and a worker
    // killing it as an orphan when the first housekeeping sweeps the directories.
    let ghost = pod("ghost", "Always", &["c"]);
    f.sync(&ghost).await.unwrap();
    // The agent that started it is gone, and with it the status it kept.
    f.sync.forget(&PodUid::new("ghost"));
    f.relist().await;
    let ghost_dir = f.root.path().join("pods/ghost");
    assert!(ghost_dir.is_dir());
    let killing = WorkerSync::new(kubelet_core::WorkerState::Terminating, false, false, false);
    w.know(PodUid::new("ghost"), killing);
    k.handle_pod_cleanups().await.unwrap();
    k.cleanups().run_queued().await;
    assert!(ghost_dir.is_dir(), "its worker keeps it while it is killed");
    // Killed and removed from the runtime, its directory kept (a volume was still mounted
    // below it), and its worker gone: the walk that finds it gone sweeps the directories.
    let running = f.runtime.get_pods(false).await.unwrap().into_iter().find(|p| p.uid.as_str() == "ghost").unwrap();
    f.runtime.kill_pod(None, &running, Some(0)).await.unwrap();
    f.runtime.remove_pod_content(&PodUid::new("ghost")).await.unwrap();
    std::fs::create_dir_all(ghost_dir.join("volumes")).unwrap();

    f.relist().await;
    w.known.lock().unwrap().clear();
    *w.lifecycle.lock().unwrap() = Some(1);
    k.handle_pod_cleanups().await.unwrap();
    k.cleanups().run_queued().await;
    assert!(!ghost_dir.exists(), "swept once the orphan is gone from the runtime and the workers");
}

#[tokio::test(start_paused = true)]
async fn a_pod_gone_before_the_runtime_held_anything_of_it_has_its_leftovers_removed() {
    let f = fixture();
    let (k, w, sources) = kubelet(&f, 110);
    sources.add_source(Source::File);
    // Admitted, then removed before its sandbox existed (a start cut short by the kill): the
    // runtime holds nothing of it, but it may have left a log directory and a pod cgroup.
    let brief = pod("brief", "Always", &["c"]);
    k.handle_pod_additions(vec![brief.clone()]).await;
    // Its first sync stored a Pending status, and was cancelled before RunPodSandbox ended.
    f.sync.statuses().set(&brief, k8s_openapi::api::core::v1::PodStatus::default());
    k.handle_pod_removes(vec![brief]).await;
    updates(&w);
    f.relist().await;
    f.runtime.clear_calls();
    k.handle_pod_cleanups().await.unwrap();
    k.cleanups().run_queued().await;
    assert!(f.sync.statuses().get(&PodUid::new("brief")).is_none(), "its status is forgotten");
    let removals: Vec<String> =
        f.runtime.calls_of(kubelet_core::fake::Method::RemovePodContent).into_iter().map(|c| c.target).collect();
    assert_eq!(removals, ["brief"], "what it left beside the runtime is removed");
}

/// Pod cgroups that were there before the test: none of them claimed.
#[derive(Default)]
struct LeftCgroups {
    unclaimed: Vec<PodUid>,
    listings: Mutex<usize>,
}

impl PodCgroups for LeftCgroups {
    fn ensure(&self, _pod: &Pod) -> Result<(), PodCgroupError> {
        Ok(())
    }

    fn forget(&self, _uid: &PodUid) {}

    fn unclaimed_pods(&self) -> Result<Vec<PodUid>, PodCgroupError> {
        *lock(&self.listings) += 1;
        Ok(self.unclaimed.clone())
    }
}

#[tokio::test(start_paused = true)]
async fn housekeeping_removes_pod_cgroups_nobody_claims_at_start_and_when_a_pod_goes() {
    let f = fixture();
    let unclaimed = ["crashed", "kept", "in-runtime"].map(PodUid::new).to_vec();
    let cgroups = Arc::new(LeftCgroups { unclaimed, ..LeftCgroups::default() });
    let (k, w, sources) = kubelet_with(&f, 110, Some(cgroups.clone()));
    sources.add_source(Source::File);
    let kept = pod("kept", "Always", &["c"]);
    k.handle_pod_additions(vec![kept]).await;
    // Running in the runtime, unknown to config: killed as an orphan, its cgroup left to it.
    let in_runtime = pod("in-runtime", "Always", &["c"]);
    f.sync(&in_runtime).await.unwrap();
    // Without a directory, which the directory sweep would ask the runtime about.
    std::fs::remove_dir_all(f.root.path().join("pods/in-runtime")).unwrap();
    updates(&w);
    f.relist().await;
    let removals = || -> Vec<String> {
        let calls = f.runtime.calls_of(kubelet_core::fake::Method::RemovePodContent);
        calls.into_iter().map(|c| c.target).collect()
    };

    // The first housekeeping looks for what a crash left.
    k.handle_pod_cleanups().await.unwrap();
    k.cleanups().run_queued().await;
    assert_eq!(*lock(&cgroups.listings), 1);
    assert!(removals().contains(&"crashed".to_owned()), "{:?}", removals());
    assert!(!removals().contains(&"kept".to_owned()), "a desired pod keeps its cgroup: {:?}", removals());
    assert!(!removals().contains(&"in-runtime".to_owned()), "a pod the runtime holds keeps it: {:?}", removals());

    // Nothing changed: the cgroups are not listed again.
    f.runtime.clear_calls();
    k.handle_pod_cleanups().await.unwrap();
    k.cleanups().run_queued().await;
    assert_eq!(*lock(&cgroups.listings), 1, "an idle housekeeping lists no cgroups");

    // A pod went: they are.
    f.sync.statuses().set(&pod("brief", "Always", &["c"]), ApiPodStatus::default());
    k.handle_pod_cleanups().await.unwrap();
    k.cleanups().run_queued().await;
    assert_eq!(*lock(&cgroups.listings), 2);
}

#[tokio::test(start_paused = true)]
async fn orphaned_pod_directories_are_swept_when_a_pod_went_not_at_every_housekeeping() {
    let f = fixture();
    let (k, _, sources) = kubelet(&f, 110);
    sources.add_source(Source::File);
    let pods = f.root.path().join("pods");
    let housekeeping = || async {
        k.handle_pod_cleanups().await.unwrap();
        k.cleanups().run_queued().await;
    };

    // The first housekeeping looks for what a crash left.
    std::fs::create_dir_all(pods.join("crashed")).unwrap();
    housekeeping().await;
    assert!(!pods.join("crashed").exists());

    // Nothing went since: the directory is not listed again.
    std::fs::create_dir_all(pods.join("stray")).unwrap();
    housekeeping().await;
    assert!(pods.join("stray").exists(), "an idle housekeeping lists no pod directories");

    // A pod went: the directories are swept. The runtime is not done with the stray pod yet (nor
    // with the pod that went, asked first), so its directory stays, and the next housekeepings
    // sweep again until it goes.
    for _ in 0..2 {
        f.runtime.fail_next(
            kubelet_core::fake::Method::RemovePodContent,
            kubelet_core::fake::FakeError::new(kubelet_core::fake::Code::Internal, "a task is left"),
        );
    }
    f.sync.statuses().set(&pod("brief", "Always", &["c"]), ApiPodStatus::default());
    housekeeping().await;
    assert!(pods.join("stray").exists(), "the runtime refused to let it go");
    housekeeping().await;
    assert!(!pods.join("stray").exists(), "swept again, with no other pod gone");

    // Nothing left behind: idle again.
    std::fs::create_dir_all(pods.join("later")).unwrap();
    housekeeping().await;
    assert!(pods.join("later").exists());
}

#[tokio::test(start_paused = true)]
async fn a_pod_added_after_housekeeping_queued_its_sweeps_keeps_its_directory_and_cgroup() {
    let f = fixture();
    let cgroups = Arc::new(LeftCgroups { unclaimed: vec![PodUid::new("late")], ..LeftCgroups::default() });
    let (k, w, sources) = kubelet_with(&f, 110, Some(cgroups.clone()));
    sources.add_source(Source::File);
    // The first housekeeping queues both sweeps while the kubelet knows no pod.
    k.handle_pod_cleanups().await.unwrap();
    // A pod comes before they run. Its worker has made its directory and its cgroup (which the
    // sweep lists as nobody's) and is starting its sandbox: the runtime holds nothing of it yet.
    k.handle_pod_additions(vec![pod("late", "Always", &["c"])]).await;
    updates(&w);
    std::fs::create_dir_all(f.root.path().join("pods/late/volumes")).unwrap();
    f.runtime.clear_calls();
    k.cleanups().run_queued().await;
    assert_eq!(*lock(&cgroups.listings), 1, "the cgroup sweep ran");
    assert!(f.root.path().join("pods/late/volumes").is_dir(), "the new pod's directory stays");
    let removals = f.runtime.calls_of(kubelet_core::fake::Method::RemovePodContent);
    assert!(removals.is_empty(), "nothing of the new pod is removed: {removals:?}");
}

#[tokio::test(start_paused = true)]
async fn a_pod_removal_that_keeps_failing_is_retried_with_backoff() {
    let f = fixture();
    let (k, _w, _sources) = kubelet(&f, 110);
    // A pod that is gone, whose removal the runtime refuses (a task it cannot stop is left).
    for _ in 0..20 {
        f.runtime.fail_next(
            kubelet_core::fake::Method::RemovePodContent,
            kubelet_core::fake::FakeError::new(kubelet_core::fake::Code::Internal, "a task is left"),
        );
    }
    // Housekeeping every 2 s for a minute asks to remove it 30 times; the runtime is asked at
    // 0, 2, 6, 14 and 30 s only.
    for _ in 0..30 {
        k.cleanups().push(crate::cleanup::Job::RemovePodContent(PodUid::new("brief")));
        k.cleanups().run_queued().await;
        tokio::time::advance(std::time::Duration::from_secs(2)).await;
    }
    let attempts = f.runtime.calls_of(kubelet_core::fake::Method::RemovePodContent).len();
    assert_eq!(attempts, 5, "retried with a doubling backoff, not every housekeeping");
}

#[tokio::test(start_paused = true)]
async fn housekeeping_restarts_a_desired_pod_its_workers_forgot() {
    let f = fixture();
    let (k, w, sources) = kubelet(&f, 110);
    sources.add_source(Source::File);
    // A static pod re-added with its fixed UID while it terminated: the workers ignored the
    // create, then forgot the UID once its termination finished.
    let reused = pod("reused", "Always", &["c"]);
    k.handle_pod_additions(vec![reused.clone()]).await;
    // A rejected pod is desired too, but never runs.
    let mut refused = (*pod("refused", "Always", &["c"])).clone();
    refused.spec.as_mut().unwrap().runtime_class_name = Some("gvisor".into());
    k.handle_pod_additions(vec![Arc::new(refused)]).await;
    w.know(PodUid::new("running"), WorkerSync::new(kubelet_core::WorkerState::Syncing, false, true, false));
    updates(&w);
    k.handle_pod_cleanups().await.unwrap();
    assert_eq!(updates(&w), [(SyncPodType::Create, "reused".to_owned())], "started again, once");
    w.know(PodUid::new("reused"), WorkerSync::new(kubelet_core::WorkerState::Syncing, false, true, false));
    k.handle_pod_cleanups().await.unwrap();
    assert!(updates(&w).is_empty(), "a pod its workers know is left to them");
}

#[tokio::test(start_paused = true)]
async fn what_is_left_of_pods_that_are_gone_is_removed() {
    let f = fixture();
    let (k, w, sources) = kubelet(&f, 110);
    sources.add_source(Source::File);
    let in_runtime = |uid: &str| {
        let runtime = f.runtime.clone();
        let uid = PodUid::new(uid);
        async move { runtime.get_pods(true).await.unwrap().iter().any(|p| p.uid == uid) }
    };
    // Stopped, unknown to config and workers: housekeeping removes its containers and sandboxes.
    let stopped = pod("stopped", "Always", &["c"]);
    f.sync(&stopped).await.unwrap();
    let status = f.runtime_status(&stopped).await;
    f.sync.sync_terminating_pod(&stopped, &status, 0, None).await.unwrap();
    // Stopped but still wanted (a finished pod whose manifest is still there): kept.
    let done = pod("done", "Always", &["c"]);
    k.handle_pod_additions(vec![done.clone()]).await;
    f.sync(&done).await.unwrap();
    let status = f.runtime_status(&done).await;
    f.sync.sync_terminating_pod(&done, &status, 0, None).await.unwrap();
    updates(&w);
    f.relist().await;
    k.handle_pod_cleanups().await.unwrap();
    k.cleanups().run_queued().await;
    assert!(updates(&w).is_empty(), "nothing runs, so nothing is killed");
    assert!(!in_runtime("stopped").await, "removed");
    assert!(in_runtime("done").await, "kept");

    // An orphan that was running is removed once it is stopped.
    let ghost = pod("ghost", "Always", &["c"]);
    f.sync(&ghost).await.unwrap();
    let running = f.runtime.get_pods(false).await.unwrap().into_iter().find(|p| p.name == "ghost").unwrap();
    f.sync.sync_terminating_runtime_pod(&running).await.unwrap();
    assert!(!in_runtime("ghost").await);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_removal_never_delays_another_pods_sync() {
    let f = fixture();
    let (k, w, _) = kubelet(&f, 110);
    let cancel = tokio_util::sync::CancellationToken::new();
    let cleaner = tokio::spawn({
        let (cleanups, cancel) = (k.cleanups().clone(), cancel.clone());
        async move { cleanups.run(cancel).await }
    });
    // An evicted pod whose dead container the runtime takes 30 s to remove.
    let evicted = pod("evicted", "Never", &["c"]);
    f.sync(&evicted).await.unwrap();
    let id = f.runtime_status(&evicted).await.container_statuses[0].id.clone();
    f.runtime.stop_container(&id, 1).unwrap();
    f.runtime.set_latency(fake::Method::DeleteContainer, Duration::from_secs(30));
    let mut with_status = (*evicted).clone();
    with_status.status = Some(ApiPodStatus { reason: Some("Evicted".into()), ..ApiPodStatus::default() });
    updates(&w);

    // The loop's handlers return at once (paused time would run a 30 s wait out past the 1 ms).
    let quick = Duration::from_millis(1);
    tokio::time::timeout(quick, k.handle_pod_reconcile(vec![Arc::new(with_status)])).await.expect("queued, not run");
    tokio::time::timeout(quick, k.handle_container_died(&PodUid::new("evicted"), &id)).await.expect("queued");
    tokio::task::yield_now().await;
    assert_eq!(f.runtime.calls_of(fake::Method::DeleteContainer).len(), 1, "the removal runs in the background");
    tokio::time::timeout(quick, k.handle_pod_syncs(vec![pod("other", "Always", &["c"])])).await.expect("not delayed");
    assert_eq!(updates(&w), [(SyncPodType::Sync, "other".to_owned())]);

    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(f.runtime_status(&evicted).await.container_statuses.is_empty(), "removed in the end");
    cancel.cancel();
    cleaner.await.unwrap();
}

/// Mounts a tmpfs (root only): a real mount, as a volume would be.
#[tokio::test]
async fn real_an_orphaned_pod_directory_with_a_tmpfs_below_survives() {
    let f = fixture();
    let (k, _, sources) = kubelet(&f, 110);
    sources.add_source(Source::File);
    let pods = f.root.path().join("pods");
    std::fs::create_dir_all(pods.join("plain/volumes")).unwrap();
    let mounted = pods.join("mounted/volumes/kubernetes.io~empty-dir/data");
    std::fs::create_dir_all(&mounted).unwrap();
    let mount = std::process::Command::new("mount").args(["-t", "tmpfs", "kubelet-rs-test"]).arg(&mounted).output();
    if !mount.as_ref().is_ok_and(|o| o.status.success()) {
        let why = format!("mounting a tmpfs failed (it needs root): {mount:?}");
        kubelet_core::testing::skip("real_an_orphaned_pod_directory_with_a_tmpfs_below_survives", &why);
        return;
    }
    std::fs::write(mounted.join("keep.txt"), "data").unwrap();
    k.handle_pod_cleanups().await.unwrap();
    k.cleanups().run_queued().await;
    let kept = std::fs::read_to_string(mounted.join("keep.txt"));
    let events = f.events.events();
    let unmounted = std::process::Command::new("umount").arg(&mounted).status();
    assert_eq!(kept.ok().as_deref(), Some("data"), "the mounted data survives");
    assert!(pods.join("mounted").exists());
    assert!(!pods.join("plain").exists(), "an orphan's directory with nothing mounted goes");
    let warning = events.iter().find(|e| e.reason == "OrphanedPodMounted").expect("a warning event");
    assert!(warning.message.contains("mounted below"), "{}", warning.message);
    assert!(unmounted.is_ok_and(|s| s.success()));
    // Left behind, it is swept again at the next housekeeping, with no pod gone since.
    k.handle_pod_cleanups().await.unwrap();
    k.cleanups().run_queued().await;
    assert!(!pods.join("mounted").exists(), "unmounted, the orphan's directory goes");
}

#[tokio::test(start_paused = true)]
async fn containers_still_running_after_a_successful_kill_fail_the_termination() {
    let f = fixture();
    let p = pod("stubborn", "Always", &["c"]);
    f.sync(&p).await.unwrap();
    let status = f.runtime_status(&p).await;
    let id = status.container_statuses[0].id.clone();
    // The runtime reports success, yet the container runs again before the kubelet looks.
    f.runtime.set_pod_status_latency(&PodUid::of(&p), Duration::from_secs(1));
    let terminating = tokio::spawn({
        let (sync, p) = (f.sync.clone(), p.clone());
        async move { sync.sync_terminating_pod(&p, &status, 1, None).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    f.runtime.set_container_state(&id, runtime::ContainerState::Running).unwrap();
    let result = terminating.await.unwrap();
    assert!(matches!(result, Err(Error::StillRunning(ref names)) if names == "c"), "{result:?}");
}

/// A volume manager that does what the test says: set up, fail, or never finish.
#[derive(Default)]
struct ScriptedVolumes {
    /// `Some(message)`: setting up fails with it; `None`: it succeeds.
    fail: Mutex<Option<String>>,
    hang: std::sync::atomic::AtomicBool,
    unmounted: Mutex<Vec<PodUid>>,
}

impl kubelet_core::VolumeManager for ScriptedVolumes {
    fn mount_pod<'a>(
        &'a self,
        pod: &'a Pod,
    ) -> kubelet_core::hook::BoxFuture<'a, Result<kubelet_core::volume::PodVolumes, kubelet_core::volume::VolumeError>>
    {
        Box::pin(async move {
            if self.hang.load(std::sync::atomic::Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
            let failure = lock(&self.fail).clone();
            if let Some(message) = failure {
                return Err(kubelet_core::volume::VolumeError::Failed { volume: "cache".into(), message });
            }
            let mut volumes = kubelet_core::volume::PodVolumes::new();
            volumes.insert("cache", format!("/pods/{}/cache", PodUid::of(pod)));
            Ok(volumes)
        })
    }

    fn unmount_pod<'a>(
        &'a self,
        uid: &'a PodUid,
    ) -> kubelet_core::hook::BoxFuture<'a, Result<(), kubelet_core::volume::VolumeError>> {
        Box::pin(async move {
            lock(&self.unmounted).push(uid.clone());
            Ok(())
        })
    }

    fn supports(&self, volume: &k8s_openapi::api::core::v1::Volume) -> bool {
        volume.empty_dir.is_some()
    }
}

#[tokio::test(start_paused = true)]
async fn volumes_are_set_up_before_the_containers_and_torn_down_after_them() {
    let mut f = fixture();
    let volumes = Arc::new(ScriptedVolumes::default());
    let config = Config::new("node-1").root_dir(f.root.path()).node(NodeResources::new(4000, 8 << 30));
    f.sync = Arc::new(
        PodSync::new(f.runtime.clone(), f.state.clone(), Arc::new(StatusStore::new()), f.events.clone(), config)
            .volumes(volumes.clone()),
    );
    let p = pod("vol", "Always", &["app"]);
    let failed_mounts = |f: &Fixture| f.events.events().into_iter().filter(|e| e.reason == "FailedMount").count();

    // A failure: an event, no sandbox, the containers wait in ContainerCreating.
    *lock(&volumes.fail) = Some("hostPath type check failed: /x is not a directory".into());
    let err = f.sync(&p).await.unwrap_err();
    assert!(matches!(err, Error::Volume(_)), "{err}");
    let event = f.events.events().into_iter().find(|e| e.reason == "FailedMount").expect("a FailedMount event");
    assert_eq!(
        event.message,
        "Unable to attach or mount volumes: volume \"cache\": hostPath type check failed: /x is not a directory"
    );
    assert!(f.runtime.get_pods(true).await.unwrap().is_empty(), "nothing starts without its volumes");
    let status = f.stored(&p);
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    let waiting = status.container_statuses.unwrap()[0].state.clone().unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));

    // A set-up that never ends: the sync gives up after upstream's 2 min 3 s.
    *lock(&volumes.fail) = None;
    volumes.hang.store(true, std::sync::atomic::Ordering::Relaxed);
    let started = Instant::now();
    let err = f.sync(&p).await.unwrap_err();
    assert_eq!(started.elapsed(), kubelet_core::volume::MOUNT_TIMEOUT);
    assert!(err.to_string().contains("timed out after 123 s"), "{err}");
    assert_eq!(failed_mounts(&f), 2);
    assert!(f.runtime.get_pods(true).await.unwrap().is_empty());

    // Set up: the pod starts; once terminated, its volumes go.
    volumes.hang.store(false, std::sync::atomic::Ordering::Relaxed);
    f.sync(&p).await.unwrap();
    assert!(f.runtime_status(&p).await.is_running());
    assert!(lock(&volumes.unmounted).is_empty(), "nothing is torn down while the pod runs");
    let status = f.runtime_status(&p).await;
    f.sync.sync_terminating_pod(&p, &status, 1, None).await.unwrap();
    f.sync.sync_terminated_pod(&p, &f.runtime_status(&p).await).await.unwrap();
    assert_eq!(*lock(&volumes.unmounted), [PodUid::of(&p)]);
}

#[tokio::test(start_paused = true)]
async fn pod_directories_that_cannot_be_made_are_a_warning_and_nothing_starts() {
    let f = fixture();
    // A file where the pods directory should be: nothing below it can be made.
    std::fs::write(f.root.path().join("pods"), "not a directory").unwrap();
    let p = pod("nodirs", "Always", &["app"]);
    let err = f.sync(&p).await.unwrap_err();
    assert!(matches!(err, Error::Io(_)), "{err}");
    let event = f.events.events().into_iter().find(|e| e.reason == "Failed").expect("a Failed event");
    assert_eq!(event.kind, kubelet_core::events::EventType::Warning);
    assert!(event.message.starts_with("error making pod data directories: "), "{}", event.message);
    assert!(f.runtime.get_pods(true).await.unwrap().is_empty(), "nothing starts without its directories");

    // Once the directories can be made, the pod starts.
    std::fs::remove_file(f.root.path().join("pods")).unwrap();
    f.sync(&p).await.unwrap();
    assert_eq!(f.runtime.get_pods(true).await.unwrap().len(), 1);
}

/// A prober that records what the kubelet asks of it.
#[derive(Default)]
struct RecordedProber {
    calls: Mutex<Vec<String>>,
}

impl kubelet_core::ProbeManager for RecordedProber {
    fn add_pod(&self, pod: &Arc<Pod>) {
        lock(&self.calls).push(format!("add {}", PodUid::of(pod)));
    }

    fn remove_pod(&self, pod: &Pod) {
        lock(&self.calls).push(format!("remove {}", PodUid::of(pod)));
    }

    fn cleanup_pods(&self, _: &std::collections::HashSet<PodUid>) {}

    fn stop_liveness_and_startup(&self, pod: &Pod) {
        lock(&self.calls).push(format!("stop liveness and startup {}", PodUid::of(pod)));
    }

    fn probe_readiness_now(&self, uid: &PodUid, container: &str) {
        lock(&self.calls).push(format!("readiness now {uid}/{container}"));
    }
}

#[tokio::test(start_paused = true)]
async fn readiness_is_probed_at_once_once_started_and_kept_while_terminating() {
    let runtime = Arc::new(FakeRuntime::new());
    let state = Arc::new(RuntimeState::default());
    state.update_from_status(Ok::<_, String>(&ready_status(true)), Instant::now());
    let root = tempfile::tempdir().unwrap();
    let config = Config::new("node-1").root_dir(root.path()).node(NodeResources::new(4000, 8 << 30));
    let prober = Arc::new(RecordedProber::default());
    let sync =
        PodSync::new(runtime.clone(), state, Arc::new(StatusStore::new()), Arc::new(RingRecorder::default()), config)
            .prober(prober.clone(), Arc::new(kubelet_core::ProbeResults::new()));
    let mut spec = (*pod("web", "Always", &["app"])).clone();
    spec.spec.as_mut().unwrap().containers[0].readiness_probe = Some(k8s_openapi::api::core::v1::Probe::default());
    let p = Arc::new(spec);
    let status_now = || async { runtime.get_pod_status(&PodUid::of(&p), "", "").await.unwrap() };
    sync.sync_pod(SyncPodType::Create, &p, None, &status_now().await).await.unwrap();
    assert!(lock(&prober.calls).is_empty(), "nothing runs yet");
    sync.sync_pod(SyncPodType::Sync, &p, None, &status_now().await).await.unwrap();
    assert_eq!(*lock(&prober.calls), ["readiness now web/app"], "started, not ready: probed now");
    lock(&prober.calls).clear();
    sync.sync_terminating_pod(&p, &status_now().await, 0, None).await.unwrap();
    assert_eq!(lock(&prober.calls).first().map(String::as_str), Some("stop liveness and startup web"));
    assert!(!lock(&prober.calls).iter().any(|c| c.starts_with("remove")), "readiness goes on while it terminates");
    sync.sync_terminated_pod(&p, &status_now().await).await.unwrap();
    assert!(lock(&prober.calls).iter().any(|c| c == "remove web"), "every probe stops once it has terminated");
}
