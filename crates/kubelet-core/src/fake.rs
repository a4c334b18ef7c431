//! An in-memory, recording, scriptable [`Runtime`] (feature `fake-runtime`).
//!
//! `FakeRuntime` keeps sandboxes and containers in memory and follows the kubelet's rules closely
//! enough for unit tests of the layers above the runtime and for benchmarks at scale:
//! `sync_pod` creates a sandbox when none is ready, runs init containers one at a time, starts
//! regular containers, honours the restart policy and the crash-loop backoff, and restarts
//! containers whose hash changed.
//! Every call is recorded; latencies, exit codes and CRI-like errors can be scripted per method.
//! Lifecycle hooks succeed at once, so pods with hooks are accepted as on a real node.
//! It never replaces a test against a real runtime.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Mutex,
    time::Duration,
};

use k8s_openapi::api::core::v1::{Container as ApiContainer, Pod as ApiPod};
use tokio::time::Instant;

use crate::{
    PodUid, ProbeKind, ProbeResults,
    backoff::Backoff,
    runtime::{
        ChangeHint, Container, ContainerEvent, ContainerEventKind, ContainerState, ContainerStatus, EventStreamError,
        ExecResult, FsStats, GcPolicy, Image, NETWORK_READY, Pod, PodStatus, PodSyncResult, RUNTIME_READY, Runtime,
        RuntimeCondition, RuntimeEvents, RuntimeStatus, Sandbox, SandboxState, SandboxStatus, SyncAction, SyncFailure,
        SyncResult, Version, container_hash, reasons,
    },
    util::{lock, wall_now},
};

/// The CRI-like class of a scripted error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// The object does not exist.
    NotFound,
    /// The runtime is not reachable.
    Unavailable,
    /// The call timed out.
    DeadlineExceeded,
    /// The runtime does not implement the call.
    Unimplemented,
    /// Anything else.
    Internal,
}

/// An error from the fake runtime.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct FakeError {
    /// The error class.
    pub code: Code,
    /// The message.
    pub message: String,
}

impl FakeError {
    /// Creates an error.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        FakeError { code, message: message.into() }
    }
}

/// A `Runtime` method, for scripting and for the call record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Method {
    /// `version`.
    Version,
    /// `status`.
    Status,
    /// `get_pods`.
    GetPods,
    /// `get_pod_status`.
    GetPodStatus,
    /// `sync_pod`.
    SyncPod,
    /// `kill_pod`.
    KillPod,
    /// `pull_image`.
    PullImage,
    /// `image_ref`.
    ImageRef,
    /// `list_images`.
    ListImages,
    /// `remove_image`.
    RemoveImage,
    /// `exec_sync`.
    ExecSync,
    /// `delete_container`.
    DeleteContainer,
    /// `garbage_collect`.
    GarbageCollect,
    /// `remove_pod_content`.
    RemovePodContent,
    /// Starting one container inside `sync_pod` (scripted errors become `RunContainerError`).
    StartContainer,
    /// Creating a sandbox inside `sync_pod` (scripted errors become `CreatePodSandboxError`).
    RunPodSandbox,
    /// `stream_events` (a scripted `Unimplemented` error is reported as such).
    StreamEvents,
    /// `watch_changes` (a scripted `Unimplemented` error is reported as such).
    WatchChanges,
}

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Call {
    /// The method.
    pub method: Method,
    /// Its main argument: a pod UID, container ID or image, or empty.
    pub target: String,
}

#[derive(Clone, Debug)]
struct FakeContainer {
    status: ContainerStatus,
    sandbox_id: String,
    finished: Option<Instant>,
}

#[derive(Clone, Debug, Default)]
struct FakePod {
    name: String,
    namespace: String,
    sandboxes: Vec<SandboxStatus>,
    containers: Vec<FakeContainer>,
}

#[derive(Default)]
struct State {
    pods: BTreeMap<PodUid, FakePod>,
    images: BTreeMap<String, Image>,
    image_fs: Option<FsStats>,
    next_id: u64,
    latencies: HashMap<Method, Duration>,
    errors: HashMap<Method, VecDeque<FakeError>>,
    failure_rates: HashMap<Method, f64>,
    exit_codes: HashMap<String, i32>,
    init_exit_code: Option<i32>,
    exec_results: HashMap<String, ExecResult>,
    status: Option<RuntimeStatus>,
    pod_status_latency: HashMap<PodUid, Duration>,
    event_streams: Vec<(tokio::sync::mpsc::Sender<ContainerEvent>, std::sync::Arc<tokio::sync::Notify>)>,
    hint_streams: Vec<(tokio::sync::mpsc::Sender<ChangeHint>, std::sync::Arc<tokio::sync::Notify>)>,
    muted: bool,
    /// The fake's clock: wall time that moves with tokio time, so paused-time tests stay consistent.
    anchor: Option<(k8s_openapi::jiff::Timestamp, Instant)>,
}

/// The in-memory runtime.
pub struct FakeRuntime {
    state: Mutex<State>,
    calls: Mutex<Vec<Call>>,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        FakeRuntime::new()
    }
}

impl std::fmt::Debug for FakeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeRuntime").field("pods", &lock(&self.state).pods.len()).finish()
    }
}

fn healthy_status() -> RuntimeStatus {
    RuntimeStatus::new(vec![
        RuntimeCondition::new(RUNTIME_READY, true, "", ""),
        RuntimeCondition::new(NETWORK_READY, true, "", ""),
    ])
}

fn backoff_key(pod: &ApiPod, container: &ApiContainer) -> String {
    format!(
        "{}_{}_{}_{}_{:x}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default(),
        container.name,
        container_hash(&container.name, container.image.as_deref().unwrap_or_default()),
    )
}

impl FakeRuntime {
    /// An empty runtime that reports itself ready.
    pub fn new() -> Self {
        FakeRuntime { state: Mutex::new(State::default()), calls: Mutex::new(Vec::new()) }
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.calls).clone()
    }

    /// The calls of one method so far.
    pub fn calls_of(&self, method: Method) -> Vec<Call> {
        lock(&self.calls).iter().filter(|c| c.method == method).cloned().collect()
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        lock(&self.calls).clear();
    }

    /// Makes every call of `method` take `latency` (virtual time under paused tokio time).
    pub fn set_latency(&self, method: Method, latency: Duration) {
        lock(&self.state).latencies.insert(method, latency);
    }

    /// Init containers without a scripted exit code exit with `code` as soon as they start;
    /// `None` (the default) lets them run until stopped, like regular containers.
    pub fn set_init_exit_code(&self, code: Option<i32>) {
        lock(&self.state).init_exit_code = code;
    }

    /// Makes each call of `method` fail at random with probability `rate` (0 to 1), after any
    /// queued errors; for demos and scale tests of the agent.
    pub fn set_failure_rate(&self, method: Method, rate: f64) {
        lock(&self.state).failure_rates.insert(method, rate.clamp(0.0, 1.0));
    }

    /// Makes the next call of `method` fail with `error`; queued errors are used in order.
    pub fn fail_next(&self, method: Method, error: FakeError) {
        lock(&self.state).errors.entry(method).or_default().push_back(error);
    }

    /// Containers named `name` exit with `code` as soon as they start.
    pub fn set_exit_code(&self, name: impl Into<String>, code: i32) {
        lock(&self.state).exit_codes.insert(name.into(), code);
    }

    /// What `exec_sync` returns for containers named `name`.
    pub fn set_exec_result(&self, name: impl Into<String>, result: ExecResult) {
        lock(&self.state).exec_results.insert(name.into(), result);
    }

    /// Makes `get_pod_status` of one pod take `latency` (a hung inspection).
    pub fn set_pod_status_latency(&self, uid: &PodUid, latency: Duration) {
        lock(&self.state).pod_status_latency.insert(uid.clone(), latency);
    }

    /// Sets a container's state behind the kubelet's back (an exit gets code 0).
    pub fn set_container_state(&self, container_id: &str, state: ContainerState) -> Result<(), FakeError> {
        if state == ContainerState::Exited {
            return self.stop_container(container_id, 0);
        }
        let kind =
            if state == ContainerState::Running { ContainerEventKind::Started } else { ContainerEventKind::Stopped };
        self.change_container(container_id, kind, |c, _| {
            c.status.state = state;
            c.finished = None;
        })
    }

    /// Applies `change` to a container behind the kubelet's back and reports it as `kind`.
    fn change_container(
        &self,
        container_id: &str,
        kind: ContainerEventKind,
        change: impl FnOnce(&mut FakeContainer, k8s_openapi::jiff::Timestamp),
    ) -> Result<(), FakeError> {
        let mut st = lock(&self.state);
        let at = st.now();
        let c = st
            .pods
            .values_mut()
            .flat_map(|p| p.containers.iter_mut())
            .find(|c| c.status.id == container_id)
            .ok_or_else(|| FakeError::new(Code::NotFound, format!("container {container_id} not found")))?;
        change(c, at);
        if let Some(uid) = st.pod_of(container_id) {
            st.emit(&uid, container_id, kind);
        }
        Ok(())
    }

    /// Removes a container behind the kubelet's back, whatever its state.
    pub fn remove_container(&self, container_id: &str) -> Result<(), FakeError> {
        let mut st = lock(&self.state);
        let uid = st
            .pod_of(container_id)
            .ok_or_else(|| FakeError::new(Code::NotFound, format!("container {container_id} not found")))?;
        if let Some(pod) = st.pods.get_mut(&uid) {
            pod.containers.retain(|c| c.status.id != container_id);
        }
        st.emit(&uid, container_id, ContainerEventKind::Deleted);
        Ok(())
    }

    /// Overrides what `status` reports.
    pub fn set_status(&self, status: RuntimeStatus) {
        lock(&self.state).status = Some(status);
    }

    /// Adds an image to the local store.
    pub fn add_image(&self, image: impl Into<String>) {
        let image = image.into();
        let mut st = lock(&self.state);
        st.images.insert(
            image.clone(),
            Image {
                id: format!("sha256:{:016x}", container_hash("", &image)),
                repo_tags: vec![image],
                ..Image::default()
            },
        );
    }

    /// Sets how full the image filesystem is (none by default: no image filesystem).
    pub fn set_image_fs(&self, stats: FsStats) {
        lock(&self.state).image_fs = Some(stats);
    }

    /// Sets the size of image `reference` (added first when missing).
    pub fn set_image_size(&self, reference: &str, size: u64) {
        if !lock(&self.state).images.contains_key(reference) {
            self.add_image(reference);
        }
        if let Some(image) = lock(&self.state).images.get_mut(reference) {
            image.size = size;
        }
    }

    /// Stops a running container behind the kubelet's back.
    pub fn stop_container(&self, container_id: &str, exit_code: i32) -> Result<(), FakeError> {
        self.change_container(container_id, ContainerEventKind::Stopped, |c, at| exit(c, exit_code, at))
    }

    /// Stops every sandbox of a pod behind the kubelet's back (its containers die with it).
    pub fn stop_sandbox(&self, uid: &PodUid) -> Result<(), FakeError> {
        let mut st = lock(&self.state);
        let at = st.now();
        let pod = st.pods.get_mut(uid).ok_or_else(|| FakeError::new(Code::NotFound, format!("pod {uid} not found")))?;
        for id in stop_pod(pod, 137, at) {
            st.emit(uid, &id, ContainerEventKind::Stopped);
        }
        Ok(())
    }

    /// Sends a change hint to every open hint stream, without changing anything.
    pub fn send_hint(&self, hint: ChangeHint) {
        lock(&self.state).hint(hint);
    }

    /// While muted, changes send no events and no hints (as a runtime whose notice of a change
    /// comes before or after its state shows it).
    pub fn set_events_muted(&self, muted: bool) {
        lock(&self.state).muted = muted;
    }

    /// Breaks every open event and hint stream, as a runtime restart would.
    pub fn break_event_streams(&self) {
        let mut st = lock(&self.state);
        for (_, broken) in st.event_streams.drain(..) {
            broken.notify_one();
        }
        for (_, broken) in st.hint_streams.drain(..) {
            broken.notify_one();
        }
    }

    /// The number of containers (of every state) the runtime holds.
    pub fn container_count(&self) -> usize {
        lock(&self.state).pods.values().map(|p| p.containers.len()).sum()
    }

    /// Creates `pods` pods with `containers_per_pod` running containers each, for benchmarks.
    pub fn populate(&self, pods: usize, containers_per_pod: usize) {
        let mut st = lock(&self.state);
        for p in 0..pods {
            let uid = PodUid::new(format!("bench-{p}"));
            let sandbox_id = st.new_id("sandbox");
            let mut sandbox = SandboxStatus::new(sandbox_id.clone(), 0, SandboxState::Ready);
            sandbox.ips = vec![format!("10.88.{}.{}", p / 250, p % 250 + 2)];
            sandbox.created_at = Some(wall_now());
            let mut pod = FakePod {
                name: format!("bench-{p}"),
                namespace: "default".into(),
                sandboxes: vec![sandbox],
                containers: Vec::new(),
            };
            for c in 0..containers_per_pod {
                let id = st.new_id("container");
                let mut status = ContainerStatus::new(id, format!("c{c}"), ContainerState::Running);
                status.image = "busybox".into();
                status.hash = container_hash(&status.name, &status.image);
                status.started_at = Some(wall_now());
                pod.containers.push(FakeContainer { status, sandbox_id: sandbox_id.clone(), finished: None });
            }
            st.pods.insert(uid, pod);
        }
    }

    async fn enter(&self, method: Method, target: &str) -> Result<(), FakeError> {
        lock(&self.calls).push(Call { method, target: target.to_owned() });
        let (latency, error) = {
            let mut st = lock(&self.state);
            (st.latencies.get(&method).copied(), st.take_error(method))
        };
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        error.map_or(Ok(()), Err)
    }
}

fn exit(c: &mut FakeContainer, exit_code: i32, at: k8s_openapi::jiff::Timestamp) {
    if c.status.state == ContainerState::Exited {
        return;
    }
    c.status.state = ContainerState::Exited;
    c.status.exit_code = exit_code;
    c.status.reason = if exit_code == 0 { "Completed" } else { "Error" }.to_owned();
    c.status.finished_at = Some(at);
    c.finished = Some(Instant::now());
}

/// Stops everything of the pod; returns the IDs that were running.
fn stop_pod(pod: &mut FakePod, exit_code: i32, at: k8s_openapi::jiff::Timestamp) -> Vec<String> {
    let mut stopped = Vec::new();
    for c in &mut pod.containers {
        if c.status.state != ContainerState::Exited {
            stopped.push(c.status.id.clone());
        }
        exit(c, exit_code, at);
    }
    for s in &mut pod.sandboxes {
        if s.state == SandboxState::Ready {
            stopped.push(s.id.clone());
        }
        s.state = SandboxState::NotReady;
        s.ips.clear();
    }
    stopped
}

impl State {
    /// The fake's wall-clock time: it advances with tokio time.
    fn now(&mut self) -> k8s_openapi::jiff::Timestamp {
        let (wall, instant) = *self.anchor.get_or_insert_with(|| (wall_now(), Instant::now()));
        let elapsed = Instant::now().saturating_duration_since(instant);
        wall.checked_add(elapsed).unwrap_or(wall)
    }

    /// Sends a hint to every open hint stream.
    fn hint(&mut self, hint: ChangeHint) {
        self.hint_streams.retain(|(tx, _)| !tx.is_closed());
        for (tx, _) in &self.hint_streams {
            // A full channel already holds hints that stand for this one.
            let _ = tx.try_send(hint);
        }
    }

    /// Sends a hint to every open hint stream, and an event with the pod's current status to
    /// every open event stream.
    fn emit(&mut self, uid: &PodUid, id: &str, kind: ContainerEventKind) {
        if self.muted {
            return;
        }
        self.hint(if kind == ContainerEventKind::Stopped { ChangeHint::Exited } else { ChangeHint::Changed });
        if self.event_streams.is_empty() {
            return;
        }
        let status = self.pod_status(uid, "", "");
        let event = ContainerEvent::new(id, kind, self.now(), status);
        self.event_streams.retain(|(tx, _)| !tx.is_closed());
        for (tx, _) in &self.event_streams {
            // A full stream loses the event, as a slow consumer of a real stream would.
            let _ = tx.try_send(event.clone());
        }
    }

    fn pod_of(&self, container_id: &str) -> Option<PodUid> {
        self.pods
            .iter()
            .find(|(_, p)| p.containers.iter().any(|c| c.status.id == container_id))
            .map(|(uid, _)| uid.clone())
    }

    fn new_id(&mut self, kind: &str) -> String {
        self.next_id += 1;
        format!("fake-{kind}-{:08}", self.next_id)
    }

    fn take_error(&mut self, method: Method) -> Option<FakeError> {
        if let Some(error) = self.errors.get_mut(&method).and_then(VecDeque::pop_front) {
            return Some(error);
        }
        let rate = self.failure_rates.get(&method).copied().unwrap_or(0.0);
        (rate > 0.0 && fastrand::f64() < rate)
            .then(|| FakeError::new(Code::Internal, format!("simulated failure of {method:?} (failure rate {rate})")))
    }

    fn pod_status(&self, uid: &PodUid, name: &str, namespace: &str) -> PodStatus {
        let Some(pod) = self.pods.get(uid) else { return PodStatus::new(uid.clone(), name, namespace) };
        let mut status = PodStatus::new(uid.clone(), &pod.name, &pod.namespace);
        status.sandbox_statuses = pod.sandboxes.iter().rev().cloned().collect();
        status.container_statuses = pod.containers.iter().rev().map(|c| c.status.clone()).collect();
        status.ips = pod
            .sandboxes
            .iter()
            .rev()
            .find(|s| s.state == SandboxState::Ready)
            .map(|s| s.ips.clone())
            .unwrap_or_default();
        status
    }

    /// Starts `spec` in the pod's ready sandbox, honouring scripted exit codes and start errors.
    fn start_container(
        &mut self,
        uid: &PodUid,
        spec: &ApiContainer,
        restart_count: u32,
        init: bool,
    ) -> Result<(), FakeError> {
        if let Some(err) = self.take_error(Method::StartContainer) {
            return Err(err);
        }
        let id = self.new_id("container");
        let at = self.now();
        let exit_code = self.exit_codes.get(&spec.name).copied().or(if init { self.init_exit_code } else { None });
        let pod = self.pods.get_mut(uid).ok_or_else(|| FakeError::new(Code::NotFound, "pod sandbox not found"))?;
        let sandbox_id = pod.sandboxes.last().map(|s| s.id.clone()).unwrap_or_default();
        let image = spec.image.clone().unwrap_or_default();
        let mut status = ContainerStatus::new(id, &spec.name, ContainerState::Running);
        status.hash = container_hash(&spec.name, &image);
        status.image_id = format!("sha256:{:016x}", container_hash("", &image));
        status.image = image;
        status.restart_count = restart_count;
        status.created_at = Some(at);
        status.started_at = status.created_at;
        let mut container = FakeContainer { status, sandbox_id, finished: None };
        if let Some(code) = exit_code {
            exit(&mut container, code, at);
        }
        let (id, exited) = (container.status.id.clone(), container.status.state == ContainerState::Exited);
        pod.containers.push(container);
        self.emit(uid, &id, ContainerEventKind::Created);
        self.emit(uid, &id, ContainerEventKind::Started);
        if exited {
            self.emit(uid, &id, ContainerEventKind::Stopped);
        }
        Ok(())
    }
}

/// Whether a container whose newest instance is `last` should be started again under `policy`
/// (upstream `ShouldContainerBeRestarted`).
fn should_restart(last: Option<&ContainerStatus>, policy: &str) -> bool {
    match last {
        None => true,
        Some(s) if matches!(s.state, ContainerState::Created | ContainerState::Unknown) => true,
        Some(s) if s.state == ContainerState::Running => false,
        Some(_) if policy == "Never" => false,
        Some(s) if policy == "OnFailure" => s.exit_code != 0,
        Some(_) => true,
    }
}

impl Runtime for FakeRuntime {
    type Error = FakeError;

    async fn version(&self) -> Result<Version, FakeError> {
        self.enter(Method::Version, "").await?;
        Ok(Version::new("fake", "0.1.0", "v1"))
    }

    /// Hooks succeed at once: a hollow node runs no processes, so a postStart or preStop hook
    /// has nothing to act on, and a pod with hooks is accepted as a real node accepts it.
    fn runs_hooks(&self) -> bool {
        true
    }

    async fn status(&self) -> Result<RuntimeStatus, FakeError> {
        self.enter(Method::Status, "").await?;
        Ok(lock(&self.state).status.clone().unwrap_or_else(healthy_status))
    }

    async fn get_pods(&self, all: bool) -> Result<Vec<Pod>, FakeError> {
        self.enter(Method::GetPods, "").await?;
        let st = lock(&self.state);
        let pods = st.pods.iter().map(|(uid, p)| {
            let mut pod = Pod::new(uid.clone(), &p.name, &p.namespace);
            pod.sandboxes = p
                .sandboxes
                .iter()
                .rev()
                .map(|s| Sandbox { id: s.id.clone(), attempt: s.attempt, state: s.state, created_at: s.created_at })
                .collect();
            pod.containers = p
                .containers
                .iter()
                .rev()
                .map(|c| Container {
                    id: c.status.id.clone(),
                    name: c.status.name.clone(),
                    image: c.status.image.clone(),
                    image_id: c.status.image_id.clone(),
                    hash: c.status.hash,
                    state: c.status.state,
                    created_at: c.status.created_at,
                })
                .collect();
            pod
        });
        Ok(if all { pods.collect() } else { pods.filter(Pod::is_running).collect() })
    }

    async fn get_pod_status(&self, uid: &PodUid, name: &str, namespace: &str) -> Result<PodStatus, FakeError> {
        self.enter(Method::GetPodStatus, uid.as_str()).await?;
        let latency = lock(&self.state).pod_status_latency.get(uid).copied();
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        Ok(lock(&self.state).pod_status(uid, name, namespace))
    }

    async fn sync_pod(
        &self,
        pod: &ApiPod,
        _status: &PodStatus,
        backoff: &Backoff,
        probes: &ProbeResults,
        _volumes: &crate::volume::PodVolumes,
    ) -> PodSyncResult {
        let uid = PodUid::of(pod);
        let mut result = PodSyncResult::default();
        if let Err(err) = self.enter(Method::SyncPod, uid.as_str()).await {
            result.failure = Some(SyncFailure::new("SyncPodError", err.to_string()));
            return result;
        }
        let Some(spec) = pod.spec.as_ref() else {
            result.failure = Some(SyncFailure::new(reasons::CONFIG_POD_SANDBOX_ERROR, "pod has no spec"));
            return result;
        };
        let policy = spec.restart_policy.as_deref().unwrap_or("Always");
        let full_name = crate::types::pod_full_name(pod);
        let mut st = lock(&self.state);

        // A ready sandbox, or a new one (killing what ran in the old one).
        let ready =
            st.pods.get(&uid).is_some_and(|p| p.sandboxes.last().is_some_and(|s| s.state == SandboxState::Ready));
        if !ready {
            if let Some(err) = st.take_error(Method::RunPodSandbox) {
                result.push(SyncResult::failed(
                    SyncAction::CreatePodSandbox,
                    &full_name,
                    SyncFailure::new(reasons::CREATE_POD_SANDBOX_ERROR, err.to_string()),
                ));
                return result;
            }
            let id = st.new_id("sandbox");
            let ip_seq = st.next_id;
            let at = st.now();
            let entry = st.pods.entry(uid.clone()).or_insert_with(|| FakePod {
                name: pod.metadata.name.clone().unwrap_or_default(),
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                ..FakePod::default()
            });
            let attempt = entry.sandboxes.last().map_or(0, |s| s.attempt + 1);
            let stopped = stop_pod(entry, 137, at);
            if attempt > 0 {
                // Init containers run again in a new sandbox.
                let init: Vec<&str> = spec.init_containers.iter().flatten().map(|c| c.name.as_str()).collect();
                entry.containers.retain(|c| !init.contains(&c.status.name.as_str()));
            }
            let mut sandbox = SandboxStatus::new(id.clone(), attempt, SandboxState::Ready);
            sandbox.created_at = Some(at);
            sandbox.ips = vec![format!("10.88.{}.{}", (ip_seq / 250) % 250, ip_seq % 250 + 2)];
            entry.sandboxes.push(sandbox);
            for old in stopped {
                st.emit(&uid, &old, ContainerEventKind::Stopped);
            }
            st.emit(&uid, &id, ContainerEventKind::Created);
            st.emit(&uid, &id, ContainerEventKind::Started);
            result.push(SyncResult::ok(SyncAction::CreatePodSandbox, &full_name));
        }
        let status = st.pod_status(&uid, "", "");
        let now = Instant::now();
        let at = st.now();

        // Init containers strictly one at a time.
        for init in spec.init_containers.iter().flatten() {
            let last = status.container_status(&init.name);
            match last {
                Some(s) if s.state == ContainerState::Exited && s.exit_code == 0 => continue,
                Some(s) if s.state == ContainerState::Running => return result,
                Some(s) if s.state == ContainerState::Exited && policy == "Never" => {
                    let _ = s;
                    return result;
                }
                _ => {}
            }
            let restart_count = last.map_or(0, |s| s.restart_count + 1);
            start_one(
                &mut st,
                &uid,
                pod,
                init,
                restart_count,
                last,
                backoff,
                now,
                SyncAction::InitContainer,
                &mut result,
            );
            return result;
        }

        // Regular containers.
        for container in spec.containers.iter() {
            let last = status.container_status(&container.name);
            let hash = container_hash(&container.name, container.image.as_deref().unwrap_or_default());
            if let Some(s) = last.filter(|s| s.state == ContainerState::Running) {
                let probe_failed =
                    probes.failed(ProbeKind::Liveness, &s.id) || probes.failed(ProbeKind::Startup, &s.id);
                if s.hash == hash && !probe_failed {
                    continue;
                }
                if let Some(c) =
                    st.pods.get_mut(&uid).and_then(|p| p.containers.iter_mut().find(|c| c.status.id == s.id))
                {
                    exit(c, 137, at);
                }
                result.push(SyncResult::ok(SyncAction::KillContainer, &container.name));
                // A changed definition restarts whatever the policy; a failed probe as the policy says.
                if s.hash == hash && policy == "Never" {
                    continue;
                }
            } else if !should_restart(last, policy) {
                continue;
            }
            let restart_count = last.map_or(0, |s| s.restart_count + 1);
            start_one(
                &mut st,
                &uid,
                pod,
                container,
                restart_count,
                last.filter(|s| s.state == ContainerState::Exited),
                backoff,
                now,
                SyncAction::StartContainer,
                &mut result,
            );
        }
        result
    }

    async fn kill_pod(
        &self,
        _pod: Option<&ApiPod>,
        running: &Pod,
        _grace_override: Option<i64>,
    ) -> Result<(), FakeError> {
        self.enter(Method::KillPod, running.uid.as_str()).await?;
        let mut st = lock(&self.state);
        let at = st.now();
        let stopped = st.pods.get_mut(&running.uid).map(|pod| stop_pod(pod, 137, at)).unwrap_or_default();
        for id in stopped {
            st.emit(&running.uid, &id, ContainerEventKind::Stopped);
        }
        Ok(())
    }

    async fn pull_image(&self, image: &str) -> Result<String, FakeError> {
        self.enter(Method::PullImage, image).await?;
        self.add_image(image);
        Ok(lock(&self.state).images.get(image).map(|i| i.id.clone()).unwrap_or_default())
    }

    async fn image_ref(&self, image: &str) -> Result<Option<String>, FakeError> {
        self.enter(Method::ImageRef, image).await?;
        Ok(lock(&self.state).images.get(image).map(|i| i.id.clone()))
    }

    async fn list_images(&self) -> Result<Vec<Image>, FakeError> {
        self.enter(Method::ListImages, "").await?;
        Ok(lock(&self.state).images.values().cloned().collect())
    }

    async fn remove_image(&self, image: &str) -> Result<(), FakeError> {
        self.enter(Method::RemoveImage, image).await?;
        // By reference or by ID, as a CRI runtime takes either.
        lock(&self.state).images.retain(|reference, i| reference != image && i.id != image);
        Ok(())
    }

    async fn image_fs_stats(&self) -> Result<Option<FsStats>, FakeError> {
        Ok(lock(&self.state).image_fs)
    }

    async fn exec_sync(
        &self,
        container_id: &str,
        _cmd: &[String],
        _timeout: Duration,
    ) -> Result<ExecResult, FakeError> {
        self.enter(Method::ExecSync, container_id).await?;
        let st = lock(&self.state);
        let c = st
            .pods
            .values()
            .flat_map(|p| p.containers.iter())
            .find(|c| c.status.id == container_id)
            .ok_or_else(|| FakeError::new(Code::NotFound, format!("container {container_id} not found")))?;
        if c.status.state != ContainerState::Running {
            return Err(FakeError::new(Code::Internal, format!("container {container_id} is not running")));
        }
        Ok(st.exec_results.get(&c.status.name).cloned().unwrap_or_default())
    }

    async fn delete_container(&self, container_id: &str) -> Result<(), FakeError> {
        self.enter(Method::DeleteContainer, container_id).await?;
        let mut st = lock(&self.state);
        let uid = st
            .pod_of(container_id)
            .ok_or_else(|| FakeError::new(Code::NotFound, format!("container {container_id} not found")))?;
        let Some(pod) = st.pods.get_mut(&uid) else { return Err(FakeError::new(Code::NotFound, "pod gone")) };
        if pod.containers.iter().any(|c| c.status.id == container_id && c.status.state == ContainerState::Running) {
            return Err(FakeError::new(Code::Internal, format!("container {container_id} is running")));
        }
        pod.containers.retain(|c| c.status.id != container_id);
        st.emit(&uid, container_id, ContainerEventKind::Deleted);
        Ok(())
    }

    async fn remove_pod_content(&self, uid: &PodUid) -> Result<(), FakeError> {
        self.enter(Method::RemovePodContent, uid.as_str()).await?;
        let mut st = lock(&self.state);
        let Some(pod) = st.pods.get(uid) else { return Ok(()) };
        if pod.containers.iter().any(|c| c.status.state == ContainerState::Running)
            || pod.sandboxes.iter().any(|s| s.state == SandboxState::Ready)
        {
            return Err(FakeError::new(Code::Internal, format!("pod {uid} still runs")));
        }
        let ids: Vec<String> = pod.containers.iter().map(|c| c.status.id.clone()).collect();
        st.pods.remove(uid);
        for id in ids {
            st.emit(uid, &id, ContainerEventKind::Deleted);
        }
        Ok(())
    }

    async fn garbage_collect(
        &self,
        policy: &GcPolicy,
        _all_sources_ready: bool,
        _evict: bool,
    ) -> Result<(), FakeError> {
        self.enter(Method::GarbageCollect, "").await?;
        let mut st = lock(&self.state);
        if policy.max_per_pod_container >= 0 {
            let keep = usize::try_from(policy.max_per_pod_container).unwrap_or(usize::MAX);
            for pod in st.pods.values_mut() {
                let mut dead_seen: HashMap<String, usize> = HashMap::new();
                // Newest last in storage: walk newest first so the newest dead instances are kept.
                let mut kept: Vec<FakeContainer> = Vec::new();
                for c in pod.containers.drain(..).rev() {
                    if c.status.state != ContainerState::Exited {
                        kept.push(c);
                        continue;
                    }
                    let n = dead_seen.entry(c.status.name.clone()).or_default();
                    *n += 1;
                    if *n <= keep {
                        kept.push(c);
                    }
                }
                kept.reverse();
                pod.containers = kept;
                let live_sandboxes: Vec<String> = pod.containers.iter().map(|c| c.sandbox_id.clone()).collect();
                let newest = pod.sandboxes.last().map(|s| s.id.clone());
                pod.sandboxes.retain(|s| {
                    s.state == SandboxState::Ready || live_sandboxes.contains(&s.id) || Some(&s.id) == newest.as_ref()
                });
            }
        }
        st.pods.retain(|_, p| !p.containers.is_empty() || p.sandboxes.iter().any(|s| s.state == SandboxState::Ready));
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)] // Reason: a private helper that threads sync_pod's locals.
fn start_one(
    st: &mut State,
    uid: &PodUid,
    pod: &ApiPod,
    spec: &ApiContainer,
    restart_count: u32,
    last_exited: Option<&ContainerStatus>,
    backoff: &Backoff,
    now: Instant,
    action: SyncAction,
    result: &mut PodSyncResult,
) {
    let key = backoff_key(pod, spec);
    if let Some(last) = last_exited {
        let finished = st
            .pods
            .get(uid)
            .and_then(|p| p.containers.iter().find(|c| c.status.id == last.id))
            .and_then(|c| c.finished);
        if let Some(finished) = finished {
            if backoff.is_in_backoff_since(&key, finished, now) {
                let message = format!(
                    "back-off {:?} restarting failed container={} pod={}",
                    backoff.get(&key),
                    spec.name,
                    crate::types::pod_full_name(pod)
                );
                let remaining = backoff.get(&key).saturating_sub(now.saturating_duration_since(finished));
                result.push(SyncResult::failed(
                    action,
                    &spec.name,
                    SyncFailure::new(reasons::CRASH_LOOP_BACK_OFF, message).with_retry_after(remaining),
                ));
                return;
            }
            backoff.next(&key, now);
        }
    }
    match st.start_container(uid, spec, restart_count, action == SyncAction::InitContainer) {
        Ok(()) => result.push(SyncResult::ok(action, &spec.name)),
        Err(err) => result.push(SyncResult::failed(
            action,
            &spec.name,
            SyncFailure::new(reasons::RUN_CONTAINER_ERROR, err.to_string()),
        )),
    }
}

#[cfg(test)]
mod tests;

/// A scripted error as a stream's: `Unimplemented` is reported as such.
fn stream_error(err: FakeError) -> EventStreamError {
    if err.code == Code::Unimplemented {
        EventStreamError::Unimplemented
    } else {
        EventStreamError::Failed(Box::new(err))
    }
}

/// Keeps a stream open until its receiver goes (`Ok`) or it is broken
/// ([`FakeRuntime::break_event_streams`]).
async fn hold_open<T>(
    sender: &tokio::sync::mpsc::Sender<T>,
    broken: &tokio::sync::Notify,
) -> Result<(), EventStreamError> {
    tokio::select! {
        () = sender.closed() => Ok(()),
        () = broken.notified() => Err(EventStreamError::Closed),
    }
}

impl RuntimeEvents for FakeRuntime {
    async fn stream_events(&self, events: tokio::sync::mpsc::Sender<ContainerEvent>) -> Result<(), EventStreamError> {
        self.enter(Method::StreamEvents, "").await.map_err(stream_error)?;
        let broken = std::sync::Arc::new(tokio::sync::Notify::new());
        lock(&self.state).event_streams.push((events.clone(), broken.clone()));
        hold_open(&events, &broken).await
    }

    /// A hint for every event [`stream_events`](Self::stream_events) would send.
    async fn watch_changes(&self, changed: tokio::sync::mpsc::Sender<ChangeHint>) -> Result<(), EventStreamError> {
        self.enter(Method::WatchChanges, "").await.map_err(stream_error)?;
        let broken = std::sync::Arc::new(tokio::sync::Notify::new());
        lock(&self.state).hint_streams.push((changed.clone(), broken.clone()));
        hold_open(&changed, &broken).await
    }
}
