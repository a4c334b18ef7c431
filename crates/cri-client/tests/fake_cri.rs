//! Error paths against an in-process fake CRI server (tonic, on a unix socket): NotFound on stop
//! is success, an unavailable runtime recovers, deadlines and unimplemented methods are
//! classified, and CRI failures become sync results while the client keeps working.

// Reason: test helpers outside `#[test]` functions may panic on broken invariants.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Container, Pod, PodSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kubelet_core::{
    Backoff, PodUid, Runtime,
    events::RingRecorder,
    runtime::{self, ContainerState, PodStatus, SandboxState, reasons},
};
use kubelet_cri_client::{
    Client, Config, CriRuntime, manager,
    pb::{self, runtime_service_server::RuntimeServiceServer},
};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

#[derive(Clone, Default)]
struct FakeCri {
    /// When set, `GetContainerEvents` streams these and ends; otherwise it is unimplemented.
    events: Arc<Mutex<Option<Vec<pb::ContainerEventResponse>>>>,
    errors: Arc<Mutex<HashMap<&'static str, VecDeque<Status>>>>,
    delay: Arc<Mutex<Duration>>,
    /// A delay for one method, in place of `delay`.
    method_delays: Arc<Mutex<HashMap<&'static str, Duration>>>,
    calls: Arc<Mutex<Vec<&'static str>>>,
    /// The calls that ran to their end (a call the client cancels is dropped while it waits).
    finished: Arc<Mutex<Vec<&'static str>>>,
    /// What `ListContainers` answers; `RemoveContainer` removes from it.
    containers: Arc<Mutex<Vec<pb::Container>>>,
    /// What `ListPodSandbox` answers (its filter aside) and `PodSandboxStatus` looks up;
    /// `RemovePodSandbox` removes from it.
    sandboxes: Arc<Mutex<Vec<pb::PodSandbox>>>,
    /// The filter of every `ListPodSandbox`, in order.
    sandbox_filters: Arc<Mutex<Vec<Option<pb::PodSandboxFilter>>>>,
    /// What `ContainerStatus` answers; unimplemented when unset.
    container_status: Arc<Mutex<Option<pb::ContainerStatus>>>,
    /// The timeout of every `StopContainer`, in order.
    stop_timeouts: Arc<Mutex<Vec<i64>>>,
}

impl FakeCri {
    fn fail(&self, method: &'static str, status: Status) {
        self.errors.lock().unwrap().entry(method).or_default().push_back(status);
    }

    async fn enter(&self, method: &'static str) -> Result<(), Status> {
        self.calls.lock().unwrap().push(method);
        let delay = self.method_delays.lock().unwrap().get(method).copied();
        let delay = delay.unwrap_or(*self.delay.lock().unwrap());
        tokio::time::sleep(delay).await;
        self.finished.lock().unwrap().push(method);
        match self.errors.lock().unwrap().get_mut(method).and_then(VecDeque::pop_front) {
            Some(status) => Err(status),
            None => Ok(()),
        }
    }
}

/// RPCs the fake does not implement: `Unimplemented`, as an old runtime answers.
macro_rules! unimplemented_rpcs {
    ($($name:ident: $req:ty => $resp:ty),* $(,)?) => {$(
        fn $name<'life0, 'async_trait>(&'life0 self, _request: Request<$req>)
            -> Pin<Box<dyn Future<Output = Result<Response<$resp>, Status>> + Send + 'async_trait>>
        where
            'life0: 'async_trait,
            Self: 'async_trait,
        {
            Box::pin(async move {
                self.enter(stringify!($name)).await?;
                Err(Status::unimplemented(concat!("method ", stringify!($name), " not implemented")))
            })
        }
    )*};
}

#[tonic::async_trait]
impl pb::runtime_service_server::RuntimeService for FakeCri {
    type GetContainerEventsStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ContainerEventResponse, Status>> + Send>>;

    async fn version(&self, _: Request<pb::VersionRequest>) -> Result<Response<pb::VersionResponse>, Status> {
        self.enter("version").await?;
        Ok(Response::new(pb::VersionResponse {
            runtime_name: "fake".into(),
            runtime_version: "0".into(),
            runtime_api_version: "v1".into(),
            version: "0.1.0".into(),
        }))
    }

    async fn status(&self, _: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        self.enter("status").await?;
        let condition = |t: &str| pb::RuntimeCondition { r#type: t.into(), status: true, ..Default::default() };
        Ok(Response::new(pb::StatusResponse {
            status: Some(pb::RuntimeStatus { conditions: vec![condition("RuntimeReady"), condition("NetworkReady")] }),
            ..Default::default()
        }))
    }

    async fn stop_container(
        &self,
        request: Request<pb::StopContainerRequest>,
    ) -> Result<Response<pb::StopContainerResponse>, Status> {
        self.enter("stop_container").await?;
        self.stop_timeouts.lock().unwrap().push(request.into_inner().timeout);
        Ok(Response::new(pb::StopContainerResponse {}))
    }

    async fn container_status(
        &self,
        _: Request<pb::ContainerStatusRequest>,
    ) -> Result<Response<pb::ContainerStatusResponse>, Status> {
        self.enter("container_status").await?;
        let Some(status) = self.container_status.lock().unwrap().clone() else {
            return Err(Status::unimplemented("method container_status not implemented"));
        };
        Ok(Response::new(pb::ContainerStatusResponse { status: Some(status), ..Default::default() }))
    }

    async fn stop_pod_sandbox(
        &self,
        _: Request<pb::StopPodSandboxRequest>,
    ) -> Result<Response<pb::StopPodSandboxResponse>, Status> {
        self.enter("stop_pod_sandbox").await?;
        Ok(Response::new(pb::StopPodSandboxResponse {}))
    }

    async fn run_pod_sandbox(
        &self,
        _: Request<pb::RunPodSandboxRequest>,
    ) -> Result<Response<pb::RunPodSandboxResponse>, Status> {
        self.enter("run_pod_sandbox").await?;
        Ok(Response::new(pb::RunPodSandboxResponse { pod_sandbox_id: "sb-1".into() }))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<pb::ListPodSandboxRequest>,
    ) -> Result<Response<pb::ListPodSandboxResponse>, Status> {
        self.enter("list_pod_sandbox").await?;
        self.sandbox_filters.lock().unwrap().push(request.into_inner().filter);
        Ok(Response::new(pb::ListPodSandboxResponse { items: self.sandboxes.lock().unwrap().clone() }))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<pb::PodSandboxStatusRequest>,
    ) -> Result<Response<pb::PodSandboxStatusResponse>, Status> {
        self.enter("pod_sandbox_status").await?;
        let id = request.into_inner().pod_sandbox_id;
        let sandboxes = self.sandboxes.lock().unwrap();
        let sandbox = sandboxes.iter().find(|s| s.id == id).ok_or_else(|| Status::not_found("no such sandbox"))?;
        let status = pb::PodSandboxStatus {
            id: sandbox.id.clone(),
            metadata: sandbox.metadata.clone(),
            state: sandbox.state,
            labels: sandbox.labels.clone(),
            ..Default::default()
        };
        Ok(Response::new(pb::PodSandboxStatusResponse { status: Some(status), ..Default::default() }))
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<pb::RemovePodSandboxRequest>,
    ) -> Result<Response<pb::RemovePodSandboxResponse>, Status> {
        self.enter("remove_pod_sandbox").await?;
        let id = request.into_inner().pod_sandbox_id;
        self.sandboxes.lock().unwrap().retain(|s| s.id != id);
        Ok(Response::new(pb::RemovePodSandboxResponse {}))
    }

    async fn list_containers(
        &self,
        _: Request<pb::ListContainersRequest>,
    ) -> Result<Response<pb::ListContainersResponse>, Status> {
        self.enter("list_containers").await?;
        Ok(Response::new(pb::ListContainersResponse { containers: self.containers.lock().unwrap().clone() }))
    }

    async fn remove_container(
        &self,
        request: Request<pb::RemoveContainerRequest>,
    ) -> Result<Response<pb::RemoveContainerResponse>, Status> {
        self.enter("remove_container").await?;
        let id = request.into_inner().container_id;
        self.containers.lock().unwrap().retain(|c| c.id != id);
        Ok(Response::new(pb::RemoveContainerResponse {}))
    }

    fn get_container_events<'life0, 'async_trait>(
        &'life0 self,
        _request: Request<pb::GetEventsRequest>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Self::GetContainerEventsStream>, Status>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            self.enter("get_container_events").await?;
            let Some(events) = self.events.lock().unwrap().clone() else {
                return Err(Status::unimplemented("method GetContainerEvents not implemented"));
            };
            let stream: Self::GetContainerEventsStream = Box::pin(tokio_stream::iter(events.into_iter().map(Ok)));
            Ok(Response::new(stream))
        })
    }

    unimplemented_rpcs! {
        create_container: pb::CreateContainerRequest => pb::CreateContainerResponse,
        start_container: pb::StartContainerRequest => pb::StartContainerResponse,
        update_container_resources: pb::UpdateContainerResourcesRequest => pb::UpdateContainerResourcesResponse,
        reopen_container_log: pb::ReopenContainerLogRequest => pb::ReopenContainerLogResponse,
        exec_sync: pb::ExecSyncRequest => pb::ExecSyncResponse,
        exec: pb::ExecRequest => pb::ExecResponse,
        attach: pb::AttachRequest => pb::AttachResponse,
        port_forward: pb::PortForwardRequest => pb::PortForwardResponse,
        container_stats: pb::ContainerStatsRequest => pb::ContainerStatsResponse,
        list_container_stats: pb::ListContainerStatsRequest => pb::ListContainerStatsResponse,
        pod_sandbox_stats: pb::PodSandboxStatsRequest => pb::PodSandboxStatsResponse,
        list_pod_sandbox_stats: pb::ListPodSandboxStatsRequest => pb::ListPodSandboxStatsResponse,
        update_runtime_config: pb::UpdateRuntimeConfigRequest => pb::UpdateRuntimeConfigResponse,
        checkpoint_container: pb::CheckpointContainerRequest => pb::CheckpointContainerResponse,
        list_metric_descriptors: pb::ListMetricDescriptorsRequest => pb::ListMetricDescriptorsResponse,
        list_pod_sandbox_metrics: pb::ListPodSandboxMetricsRequest => pb::ListPodSandboxMetricsResponse,
        runtime_config: pb::RuntimeConfigRequest => pb::RuntimeConfigResponse,
    }
}

#[tonic::async_trait]
impl pb::image_service_server::ImageService for FakeCri {
    async fn pull_image(&self, _: Request<pb::PullImageRequest>) -> Result<Response<pb::PullImageResponse>, Status> {
        self.enter("pull_image").await?;
        Ok(Response::new(pb::PullImageResponse { image_ref: "sha256:pulled".into() }))
    }

    unimplemented_rpcs! {
        list_images: pb::ListImagesRequest => pb::ListImagesResponse,
        image_status: pb::ImageStatusRequest => pb::ImageStatusResponse,
        remove_image: pb::RemoveImageRequest => pb::RemoveImageResponse,
        image_fs_info: pb::ImageFsInfoRequest => pb::ImageFsInfoResponse,
    }
}

fn serve(fake: FakeCri, socket: &Path) -> tokio::task::JoinHandle<()> {
    let listener = UnixListener::bind(socket).unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(fake.clone()))
            .add_service(pb::image_service_server::ImageServiceServer::new(fake))
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await
            .unwrap();
    })
}

fn endpoint(socket: &Path) -> String {
    format!("unix://{}", socket.display())
}

struct Fixture {
    dir: tempfile::TempDir,
    socket: PathBuf,
    fake: FakeCri,
    server: tokio::task::JoinHandle<()>,
}

/// A runtime manager's configuration with every directory it writes under `dir`, never the
/// host's.
fn manager_config(dir: &Path) -> manager::Config {
    manager::Config::new("n")
        .pod_logs_dir(dir.join("pods"))
        .container_logs_dir(dir.join("containers"))
        .pods_dir(dir.join("kubelet-pods"))
}

fn start() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let fake = FakeCri::default();
    let server = serve(fake.clone(), &socket);
    Fixture { dir, socket, fake, server }
}

#[tokio::test]
async fn not_found_on_stop_counts_as_stopped() {
    let f = start();
    f.fake.fail("stop_container", Status::not_found("container gone"));
    f.fake.fail("stop_pod_sandbox", Status::not_found("sandbox gone"));
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    let runtime = CriRuntime::new(client, manager_config(f.dir.path()), Arc::new(RingRecorder::default()));
    let mut running = runtime::Pod::new(PodUid::new("u"), "p", "ns");
    running.containers.push(runtime::Container::new("c1", "app", ContainerState::Running));
    running.sandboxes.push(runtime::Sandbox::new("s1", 0, SandboxState::Ready));
    runtime.kill_pod(None, &running, Some(1)).await.unwrap();
    // Without the spec, the container's annotations are asked for first (here: unanswered).
    assert_eq!(*f.fake.calls.lock().unwrap(), ["container_status", "stop_container", "stop_pod_sandbox"]);

    // Any other error is an error.
    f.fake.fail("stop_container", Status::internal("boom"));
    let err = runtime.kill_pod(None, &running, Some(1)).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Internal));
    f.server.abort();
}

#[tokio::test]
async fn an_unavailable_runtime_is_reported_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("late.sock");
    let client = Client::connect(&Config::new(endpoint(&socket))).unwrap();
    let err = client.version().await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    // The runtime comes up: the same client connects on its next call.
    let server = serve(FakeCri::default(), &socket);
    let version = client.version().await.unwrap();
    assert_eq!(version.runtime_name, "fake");
    server.abort();
}

#[tokio::test]
async fn a_slow_runtime_gives_deadline_exceeded() {
    let f = start();
    *f.fake.delay.lock().unwrap() = Duration::from_secs(2);
    let client =
        Client::connect(&Config::new(endpoint(&f.socket)).request_timeout(Duration::from_millis(200))).unwrap();
    let err = client.version().await.unwrap_err();
    assert!(err.is_deadline_exceeded(), "a timeout is classified as such: {err:?}");
    f.server.abort();
}

#[tokio::test]
async fn image_pulls_have_no_call_timeout() {
    let f = start();
    *f.fake.delay.lock().unwrap() = Duration::from_millis(600);
    let client =
        Client::connect(&Config::new(endpoint(&f.socket)).request_timeout(Duration::from_millis(200))).unwrap();
    let request = pb::PullImageRequest {
        image: Some(pb::ImageSpec { image: "slow/image".into(), ..Default::default() }),
        ..Default::default()
    };
    let pulled = client.image_service().pull_image(request).await.expect("a slow pull is not cut short");
    assert_eq!(pulled.into_inner().image_ref, "sha256:pulled");
    let err = client.image_service().list_images(pb::ListImagesRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "other image calls keep the timeout: {err:?}");
    f.server.abort();
}

#[tokio::test]
async fn garbage_collection_goes_on_past_a_failed_removal() {
    let f = start();
    let dead = |id: &str, name: &str, created_at: i64| pb::Container {
        id: id.into(),
        metadata: Some(pb::ContainerMetadata { name: name.into(), attempt: 0 }),
        state: pb::ContainerState::ContainerExited as i32,
        created_at,
        labels: [
            ("io.kubernetes.pod.uid".to_owned(), "u".to_owned()),
            ("io.kubernetes.pod.name".to_owned(), "p".to_owned()),
            ("io.kubernetes.pod.namespace".to_owned(), "ns".to_owned()),
            ("io.kubernetes.container.name".to_owned(), name.to_owned()),
        ]
        .into(),
        ..Default::default()
    };
    // Three dead instances of each of two containers: GC keeps the newest of each.
    *f.fake.containers.lock().unwrap() = vec![
        dead("c1", "c", 1),
        dead("c2", "c", 2),
        dead("c3", "c", 3),
        dead("d1", "d", 1),
        dead("d2", "d", 2),
        dead("d3", "d", 3),
    ];
    f.fake.fail("remove_container", Status::internal("device or resource busy"));
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    let runtime = CriRuntime::new(client, manager_config(f.dir.path()), Arc::new(RingRecorder::default()));
    let err = runtime.garbage_collect(&runtime::GcPolicy::default(), true, false).await.unwrap_err();
    assert!(err.to_string().contains("RemoveContainer"), "the first failure is reported: {err}");
    let removals = f.fake.calls.lock().unwrap().iter().filter(|c| **c == "remove_container").count();
    assert_eq!(removals, 4, "every old container was tried");
    let mut left: Vec<String> = f.fake.containers.lock().unwrap().iter().map(|c| c.id.clone()).collect();
    left.sort();
    assert_eq!(left.len(), 3, "only the one whose removal failed stays besides the newest: {left:?}");
    assert!(left.contains(&"c3".to_owned()) && left.contains(&"d3".to_owned()));
    f.server.abort();
}

#[tokio::test]
async fn a_pod_the_runtime_holds_nothing_of_leaves_no_log_directory_or_cgroup() {
    let f = start();
    let scratch = tempfile::tempdir().unwrap();
    let logs = scratch.path().join("logs");
    let cgroups = scratch.path().join("cgroup");
    // What a start cut short between creating the log directory and the end of RunPodSandbox
    // leaves: the log directory, and the pod cgroup the runtime made below its cgroup parent.
    std::fs::create_dir_all(logs.join("ns_p_u")).unwrap();
    std::fs::create_dir_all(logs.join("ns_other_v")).unwrap();
    std::fs::create_dir_all(cgroups.join("memory/kubepods/besteffort/podu")).unwrap();
    std::fs::create_dir_all(cgroups.join("memory/kubepods/besteffort/podv")).unwrap();
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    let mut config = manager_config(f.dir.path()).pod_logs_dir(&logs);
    config.cgroup_mount = cgroups.clone();
    let runtime = CriRuntime::new(client, config, Arc::new(RingRecorder::default()));
    runtime.remove_pod_content(&PodUid::new("u")).await.unwrap();
    assert!(!logs.join("ns_p_u").exists(), "its log directory is removed");
    assert!(!cgroups.join("memory/kubepods/besteffort/podu").exists(), "its cgroup is removed");
    assert!(logs.join("ns_other_v").exists() && cgroups.join("memory/kubepods/besteffort/podv").exists());
    f.server.abort();
}

/// A pod that has stopped, as the runtime holds it until its removal: sandbox `s1`, not ready,
/// and container `c1`, exited.
fn stopped_pod(fake: &FakeCri) {
    let labels: HashMap<String, String> = [
        ("io.kubernetes.pod.uid", "u"),
        ("io.kubernetes.pod.name", "p"),
        ("io.kubernetes.pod.namespace", "ns"),
        ("io.kubernetes.container.name", "app"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let metadata = pb::PodSandboxMetadata { name: "p".into(), uid: "u".into(), namespace: "ns".into(), attempt: 0 };
    fake.sandboxes.lock().unwrap().push(pb::PodSandbox {
        id: "s1".into(),
        metadata: Some(metadata),
        state: pb::PodSandboxState::SandboxNotready as i32,
        labels: labels.clone(),
        ..Default::default()
    });
    fake.containers.lock().unwrap().push(pb::Container {
        id: "c1".into(),
        pod_sandbox_id: "s1".into(),
        state: pb::ContainerState::ContainerExited as i32,
        labels: labels.clone(),
        ..Default::default()
    });
    *fake.container_status.lock().unwrap() = Some(pb::ContainerStatus {
        id: "c1".into(),
        state: pb::ContainerState::ContainerExited as i32,
        labels,
        ..Default::default()
    });
}

#[tokio::test]
async fn a_stopped_pods_removal_asks_for_that_pod_alone_and_stops_nothing_again() {
    let f = start();
    stopped_pod(&f.fake);
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    let runtime = CriRuntime::new(client, manager_config(f.dir.path()), Arc::new(RingRecorder::default()));
    runtime.remove_pod_content(&PodUid::new("u")).await.unwrap();
    let calls = f.fake.calls.lock().unwrap().clone();
    assert!(!calls.contains(&"stop_pod_sandbox") && !calls.contains(&"stop_container"), "{calls:?}");
    assert!(calls.contains(&"remove_container") && calls.contains(&"remove_pod_sandbox"), "{calls:?}");
    assert!(f.fake.sandboxes.lock().unwrap().is_empty() && f.fake.containers.lock().unwrap().is_empty());
    // Every listing named the pod: a node's whole listing grows with its pods.
    for filter in f.fake.sandbox_filters.lock().unwrap().iter() {
        let selector = filter.as_ref().map(|f| f.label_selector.clone()).unwrap_or_default();
        assert_eq!(selector.get("io.kubernetes.pod.uid").map(String::as_str), Some("u"), "{filter:?}");
    }
    f.server.abort();
}

#[tokio::test]
async fn a_listed_pod_is_inspected_without_listing_it_again() {
    let f = start();
    stopped_pod(&f.fake);
    // The pod's newer sandbox, ready, beside the stopped one.
    let mut newer = f.fake.sandboxes.lock().unwrap()[0].clone();
    newer.id = "s2".into();
    newer.state = pb::PodSandboxState::SandboxReady as i32;
    newer.created_at = 2;
    f.fake.sandboxes.lock().unwrap().push(newer);
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    let runtime = CriRuntime::new(client, manager_config(f.dir.path()), Arc::new(RingRecorder::default()));
    let listed = runtime.get_pods(true).await.unwrap().remove(0);
    f.fake.calls.lock().unwrap().clear();

    let status = runtime.get_listed_pod_status(&listed).await.unwrap();
    let calls = f.fake.calls.lock().unwrap().clone();
    assert_eq!(calls, ["pod_sandbox_status", "pod_sandbox_status", "container_status"], "statuses alone");
    let sandboxes: Vec<&str> = status.sandbox_statuses.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(sandboxes, ["s2", "s1"], "newest first");
    assert_eq!(status, runtime.get_pod_status(&PodUid::new("u"), "p", "ns").await.unwrap(), "as a fresh inspection");

    // A sandbox removed since the listing is left out.
    f.fake.sandboxes.lock().unwrap().retain(|s| s.id != "s2");
    let status = runtime.get_listed_pod_status(&listed).await.unwrap();
    let sandboxes: Vec<&str> = status.sandbox_statuses.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(sandboxes, ["s1"]);
    assert_eq!(status.container_statuses.len(), 1);
    f.server.abort();
}

#[tokio::test]
async fn a_stopped_sandbox_the_runtime_will_not_remove_is_stopped_again_then_removed() {
    let f = start();
    stopped_pod(&f.fake);
    // containerd's answer while a stopped sandbox's network teardown has not succeeded.
    let message = "sandbox network namespace \"/var/run/netns/cni-1\" is not fully closed";
    f.fake.fail("remove_pod_sandbox", Status::unknown(message));
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    let runtime = CriRuntime::new(client, manager_config(f.dir.path()), Arc::new(RingRecorder::default()));
    runtime.remove_pod_content(&PodUid::new("u")).await.unwrap();
    let calls = f.fake.calls.lock().unwrap().clone();
    let tail: Vec<&str> =
        calls.iter().copied().filter(|c| c.contains("pod_sandbox") && !c.starts_with("list")).collect();
    assert_eq!(tail, ["pod_sandbox_status", "remove_pod_sandbox", "stop_pod_sandbox", "remove_pod_sandbox"]);
    assert!(f.fake.sandboxes.lock().unwrap().is_empty());

    // A runtime that refuses again: the removal fails, and the caller tries again later.
    stopped_pod(&f.fake);
    f.fake.fail("remove_pod_sandbox", Status::unknown(message));
    f.fake.fail("remove_pod_sandbox", Status::unknown(message));
    let err = runtime.remove_pod_content(&PodUid::new("u")).await.unwrap_err();
    assert!(err.to_string().contains("RemovePodSandbox"), "{err}");
    f.server.abort();
}

#[tokio::test]
async fn a_container_with_a_task_left_is_stopped_then_removed() {
    let f = start();
    // containerd's answer for a container whose start was cut short by the agent's death.
    f.fake.fail("remove_container", Status::failed_precondition("cannot delete running task c1: failed precondition"));
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    let runtime = CriRuntime::new(client, manager_config(f.dir.path()), Arc::new(RingRecorder::default()));
    // Its log files, rotated ones included, go with it; another instance's stay.
    let logs = f.dir.path().join("pods/ns_p_u/app");
    std::fs::create_dir_all(&logs).unwrap();
    for name in ["0.log", "0.log.20261126-100000.gz", "0.log.20261126-100010", "1.log"] {
        std::fs::write(logs.join(name), "x").unwrap();
    }
    *f.fake.container_status.lock().unwrap() = Some(pb::ContainerStatus {
        id: "c1".into(),
        log_path: logs.join("0.log").display().to_string(),
        ..Default::default()
    });
    runtime.delete_container("c1").await.unwrap();
    assert_eq!(
        *f.fake.calls.lock().unwrap(),
        ["container_status", "remove_container", "stop_container", "remove_container"]
    );
    let left: Vec<String> =
        std::fs::read_dir(&logs).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(left, ["1.log"]);
    f.server.abort();
}

#[tokio::test]
async fn unimplemented_methods_are_classified_not_fatal() {
    let f = start();
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    let err = client.runtime_config().await.unwrap_err();
    assert!(err.is_unimplemented(), "{err:?}");
    assert_eq!(client.unimplemented(), ["runtime_config"], "remembered and reported");
    let events = client.runtime_service().get_container_events(pb::GetEventsRequest {}).await.unwrap_err();
    assert_eq!(events.code(), tonic::Code::Unimplemented);
    // A runtime that is not containerd has no change hints either.
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let hints = client.watch_containerd_changes(tx).await;
    assert!(matches!(hints, Err(kubelet_core::runtime::EventStreamError::Unimplemented)), "{hints:?}");
    client.version().await.unwrap();
    f.server.abort();
}

/// Pod `ns/p` (UID `u`) with one container `c` of image `i`.
fn one_container_pod() -> Pod {
    Pod {
        metadata: ObjectMeta {
            uid: Some("u".into()),
            name: Some("p".into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container { name: "c".into(), image: Some("i".into()), ..Container::default() }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

#[tokio::test]
async fn a_cri_failure_becomes_a_sync_result_and_the_runtime_goes_on() {
    let f = start();
    let logs = tempfile::tempdir().unwrap();
    f.fake.fail(
        "run_pod_sandbox",
        Status::internal("failed to setup network for sandbox: plugin type=\"bridge\" failed (add): boom"),
    );
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    let config = manager_config(logs.path());
    let recorder = Arc::new(RingRecorder::default());
    let runtime = CriRuntime::new(client, config, recorder.clone());
    let pod = one_container_pod();
    let result = runtime
        .sync_pod(
            &pod,
            &PodStatus::new(PodUid::new("u"), "p", "ns"),
            &Backoff::default(),
            &kubelet_core::ProbeResults::new(),
            &Default::default(),
        )
        .await;
    let failure = result.errors().next().expect("a sync error");
    assert_eq!(failure.reason, reasons::CREATE_POD_SANDBOX_ERROR);
    assert!(failure.message.contains("plugin type=\"bridge\" failed"), "{}", failure.message);
    assert!(runtime.status().await.unwrap().runtime_ready(), "the runtime still answers");
    let reasons_of = |recorder: &RingRecorder| recorder.events().into_iter().map(|e| e.reason).collect::<Vec<_>>();
    assert!(!reasons_of(&recorder).contains(&"SandboxChanged".to_owned()), "a new pod has no old sandbox");

    // A stopped sandbox is replaced: now the event says so.
    let mut status = PodStatus::new(PodUid::new("u"), "p", "ns");
    status.sandbox_statuses.push(runtime::SandboxStatus::new("sb-0", 0, SandboxState::NotReady));
    let _ = runtime
        .sync_pod(&pod, &status, &Backoff::default(), &kubelet_core::ProbeResults::new(), &Default::default())
        .await;
    assert!(reasons_of(&recorder).contains(&"SandboxChanged".to_owned()), "{:?}", reasons_of(&recorder));
    f.server.abort();
}

#[tokio::test]
async fn a_sandbox_start_runs_to_its_end_when_the_sync_is_dropped() {
    let f = start();
    let logs = tempfile::tempdir().unwrap();
    f.fake.method_delays.lock().unwrap().insert("run_pod_sandbox", Duration::from_millis(400));
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    let mut config = manager_config(logs.path());
    let cgroups = logs.path().join("cgroup");
    config.cgroup_mount = cgroups.clone();
    let pod_cgroup = cgroups.join("memory/kubepods/besteffort/podu");
    std::fs::create_dir_all(&pod_cgroup).unwrap();
    let runtime = CriRuntime::new(client, config, Arc::new(RingRecorder::default()));
    let pod = one_container_pod();
    let status = PodStatus::new(PodUid::new("u"), "p", "ns");
    let (backoff, probes) = (Backoff::default(), kubelet_core::ProbeResults::new());
    let volumes = kubelet_core::volume::PodVolumes::default();
    let sync = runtime.sync_pod(&pod, &status, &backoff, &probes, &volumes);
    // The pod worker drops its sync like this when the pod is deleted while it starts.
    let dropped = tokio::time::timeout(Duration::from_millis(150), sync).await;
    assert!(dropped.is_err(), "the sync was still waiting for its sandbox");
    assert!(f.fake.calls.lock().unwrap().contains(&"run_pod_sandbox"), "the sandbox was asked for");
    // Not listed yet, the sandbox being made already runs in the pod's cgroup: what is left of
    // the pod is not removed from under it.
    let removal = runtime.remove_pod_content(&PodUid::new("u")).await;
    assert!(matches!(removal, Err(kubelet_cri_client::Error::PodStillRuns { .. })), "{removal:?}");
    assert!(pod_cgroup.exists(), "the pod's cgroup stays while its sandbox is made");

    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        f.fake.finished.lock().unwrap().contains(&"run_pod_sandbox"),
        "the runtime saw the RunPodSandbox call cancelled: {:?}",
        f.fake.finished.lock().unwrap()
    );
    f.server.abort();
}

fn event(id: &str, kind: pb::ContainerEventType, state: pb::ContainerState) -> pb::ContainerEventResponse {
    pb::ContainerEventResponse {
        container_id: id.into(),
        container_event_type: kind as i32,
        created_at: 1_700_000_000_000_000_000,
        pod_sandbox_status: Some(pb::PodSandboxStatus {
            id: "sb".into(),
            metadata: Some(pb::PodSandboxMetadata {
                name: "web".into(),
                uid: "u1".into(),
                namespace: "ns".into(),
                attempt: 0,
            }),
            state: pb::PodSandboxState::SandboxReady as i32,
            network: Some(pb::PodSandboxNetworkStatus { ip: "10.85.0.9".into(), ..Default::default() }),
            ..Default::default()
        }),
        containers_statuses: vec![pb::ContainerStatus {
            id: id.into(),
            metadata: Some(pb::ContainerMetadata { name: "app".into(), attempt: 0 }),
            state: state as i32,
            ..Default::default()
        }],
    }
}

#[tokio::test]
async fn container_events_stream_as_runtime_events() {
    use kubelet_core::runtime::{ContainerEventKind, EventStreamError, RuntimeEvents};
    let f = start();
    *f.fake.events.lock().unwrap() = Some(vec![
        event("c1", pb::ContainerEventType::ContainerStartedEvent, pb::ContainerState::ContainerRunning),
        event("c1", pb::ContainerEventType::ContainerStoppedEvent, pb::ContainerState::ContainerExited),
    ]);
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    let runtime = CriRuntime::new(client.clone(), manager_config(f.dir.path()), Arc::new(RingRecorder::default()));
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let ended = runtime.stream_events(tx).await;
    assert!(matches!(ended, Err(EventStreamError::Closed)), "{ended:?}");
    let first = rx.recv().await.unwrap();
    assert_eq!((first.container_id.as_str(), first.kind), ("c1", ContainerEventKind::Started));
    assert_eq!(first.pod_status.uid, PodUid::new("u1"));
    assert_eq!(first.pod_status.ips, ["10.85.0.9"]);
    assert_eq!(first.pod_status.container_status("app").unwrap().state, ContainerState::Running);
    assert_eq!(rx.recv().await.unwrap().kind, ContainerEventKind::Stopped);

    // A runtime without events says so.
    *f.fake.events.lock().unwrap() = None;
    let (tx, _rx) = tokio::sync::mpsc::channel(8);
    let refused = runtime.stream_events(tx).await;
    assert!(matches!(refused, Err(EventStreamError::Unimplemented)), "{refused:?}");
    f.server.abort();
}

#[tokio::test]
async fn every_call_is_measured_with_upstream_metric_names() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    // The only global recorder of this test binary.
    metrics::set_global_recorder(recorder).unwrap();
    let f = start();
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    client.version().await.unwrap();
    client.version().await.unwrap();
    client.runtime_config().await.unwrap_err();
    let mut service = client.runtime_service();
    let _ = service.list_pod_sandbox(pb::ListPodSandboxRequest::default()).await;
    let _ = service.run_pod_sandbox(pb::RunPodSandboxRequest::default()).await;
    let _ = service.pod_sandbox_status(pb::PodSandboxStatusRequest::default()).await;
    let _ = service.update_container_resources(pb::UpdateContainerResourcesRequest::default()).await;
    let _ = service.list_pod_sandbox_stats(pb::ListPodSandboxStatsRequest::default()).await;
    let text = handle.render();
    assert!(text.contains("kubelet_runtime_operations_total{operation_type=\"version\"} 2"), "{text}");
    assert!(text.contains("kubelet_runtime_operations_errors_total{operation_type=\"runtime_config\"} 1"), "{text}");
    assert!(text.contains("kubelet_runtime_operations_duration_seconds"), "{text}");
    // Upstream's `operation_type` values (`pkg/kubelet/kuberuntime/instrumented_services.go`).
    let upstream = [
        "version",
        "status",
        "create_container",
        "start_container",
        "stop_container",
        "remove_container",
        "list_containers",
        "container_status",
        "update_container",
        "reopen_container_log",
        "exec_sync",
        "exec",
        "attach",
        "run_podsandbox",
        "stop_podsandbox",
        "remove_podsandbox",
        "podsandbox_status",
        "list_podsandbox",
        "container_stats",
        "list_container_stats",
        "podsandbox_stats",
        "list_podsandbox_stats",
        "port_forward",
        "update_runtime_config",
        "list_images",
        "image_status",
        "pull_image",
        "remove_image",
        "image_fs_info",
        "checkpoint_container",
        "get_container_events",
        "list_metric_descriptors",
        "list_podsandbox_metrics",
        "runtime_config",
    ];
    let ours: Vec<&str> = kubelet_cri_client::OPERATIONS.iter().map(|(_, operation)| *operation).collect();
    assert_eq!(ours, upstream);
    let exported: std::collections::BTreeSet<&str> =
        text.split("operation_type=\"").skip(1).filter_map(|rest| rest.split('"').next()).collect();
    for expected in
        ["list_podsandbox", "run_podsandbox", "podsandbox_status", "update_container", "list_podsandbox_stats"]
    {
        assert!(exported.contains(expected), "{expected} is exported: {exported:?}");
    }
    for label in &exported {
        assert!(upstream.contains(label), "{label} is one of upstream's operation types");
    }
    f.server.abort();
}

/// A hook runner that records the handlers it is given and sleeps a sleep handler's seconds.
#[derive(Default)]
struct SleepHooks {
    ran: Mutex<Vec<String>>,
}

impl kubelet_core::HookRunner for SleepHooks {
    fn run<'a>(
        &'a self,
        _exec: &'a dyn kubelet_core::hook::Exec,
        target: kubelet_core::hook::Target<'a>,
        handler: &'a k8s_openapi::api::core::v1::LifecycleHandler,
    ) -> kubelet_core::hook::BoxFuture<'a, Result<(), kubelet_core::hook::HookError>> {
        Box::pin(async move {
            self.ran.lock().unwrap().push(format!("{} in {}", target.container.name, target.container_id));
            let seconds = handler.sleep.as_ref().map_or(0, |s| s.seconds);
            tokio::time::sleep(Duration::from_secs(u64::try_from(seconds).unwrap())).await;
            Ok(())
        })
    }
}

#[tokio::test]
async fn without_the_spec_the_annotations_bring_back_the_pre_stop_hook_and_its_grace() {
    let f = start();
    // What the runtime kept of a pod whose manifest is gone: a 1 s preStop and a 30 s grace.
    let pre_stop = r#"{"sleep":{"seconds":1}}"#;
    *f.fake.container_status.lock().unwrap() = Some(pb::ContainerStatus {
        id: "c1".into(),
        labels: HashMap::from([
            ("io.kubernetes.pod.name".into(), "p".into()),
            ("io.kubernetes.pod.namespace".into(), "ns".into()),
            ("io.kubernetes.pod.uid".into(), "u".into()),
            ("io.kubernetes.container.name".into(), "app".into()),
        ]),
        annotations: HashMap::from([
            ("io.kubernetes.pod.terminationGracePeriod".into(), "30".into()),
            ("io.kubernetes.container.preStopHandler".into(), pre_stop.into()),
        ]),
        ..Default::default()
    });
    let client = Client::connect(&Config::new(endpoint(&f.socket))).unwrap();
    let hooks = Arc::new(SleepHooks::default());
    let recorder = Arc::new(RingRecorder::default());
    let runtime = CriRuntime::new(client, manager_config(f.dir.path()), recorder.clone()).hooks(hooks.clone());
    assert!(runtime.runs_hooks());
    let mut running = runtime::Pod::new(PodUid::new("u"), "p", "ns");
    running.containers.push(runtime::Container::new("c1", "app", ContainerState::Running));
    runtime.kill_pod(None, &running, None).await.unwrap();
    assert_eq!(*hooks.ran.lock().unwrap(), ["app in c1"], "the preStop hook ran without the spec");
    // The hook's whole second comes off the grace period StopContainer gets.
    assert_eq!(*f.fake.stop_timeouts.lock().unwrap(), [29]);
    let killing = recorder.events_for("u");
    assert!(killing.iter().any(|e| e.reason == "Killing"), "{killing:?}");

    // A grace override of 0 (a forced removal) runs no hook and stays 0.
    runtime.kill_pod(None, &running, Some(0)).await.unwrap();
    assert_eq!(hooks.ran.lock().unwrap().len(), 1);
    assert_eq!(*f.fake.stop_timeouts.lock().unwrap(), [29, 0]);
    f.server.abort();
}
