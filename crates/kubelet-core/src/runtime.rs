//! The container runtime as the kubelet sees it: the `Runtime` trait and the runtime's view of pods.
//!
//! These mirror upstream's `pkg/kubelet/container` types: a runtime pod groups the sandboxes and
//! containers that carry one pod UID label, and a `PodStatus` is the detailed inspection of one pod.

use std::{
    future::Future,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::{api::core::v1::Pod as ApiPod, jiff::Timestamp};

use crate::{PodUid, ProbeResults, backoff::Backoff};

/// The runtime condition type that says the runtime can run containers.
pub const RUNTIME_READY: &str = "RuntimeReady";
/// The runtime condition type that says pod networking is configured.
pub const NETWORK_READY: &str = "NetworkReady";

/// The runtime's name and versions (CRI `Version`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Version {
    /// Runtime name, e.g. `containerd`.
    pub runtime_name: String,
    /// Runtime version, e.g. `1.6.20~ds1`.
    pub runtime_version: String,
    /// Version of the CRI API the runtime speaks, e.g. `v1`.
    pub runtime_api_version: String,
}

impl Version {
    /// Creates a version record.
    pub fn new(name: impl Into<String>, version: impl Into<String>, api: impl Into<String>) -> Self {
        Version { runtime_name: name.into(), runtime_version: version.into(), runtime_api_version: api.into() }
    }
}

/// One runtime condition (CRI `RuntimeCondition`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeCondition {
    /// Condition type, such as [`RUNTIME_READY`] or [`NETWORK_READY`].
    pub kind: String,
    /// Whether the condition holds.
    pub status: bool,
    /// Machine-readable reason when it does not hold.
    pub reason: String,
    /// Human-readable message when it does not hold.
    pub message: String,
}

impl RuntimeCondition {
    /// Creates a condition.
    pub fn new(kind: impl Into<String>, status: bool, reason: impl Into<String>, message: impl Into<String>) -> Self {
        RuntimeCondition { kind: kind.into(), status, reason: reason.into(), message: message.into() }
    }
}

/// The runtime's health (CRI `Status`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeStatus {
    /// All conditions the runtime reported.
    pub conditions: Vec<RuntimeCondition>,
}

impl RuntimeStatus {
    /// Creates a status from its conditions.
    pub fn new(conditions: Vec<RuntimeCondition>) -> Self {
        RuntimeStatus { conditions }
    }

    /// Both conditions true: the runtime and its network are ready.
    pub fn ready() -> Self {
        RuntimeStatus::new(vec![
            RuntimeCondition::new(RUNTIME_READY, true, "", ""),
            RuntimeCondition::new(NETWORK_READY, true, "", ""),
        ])
    }

    /// The condition of the given type, if reported.
    pub fn condition(&self, kind: &str) -> Option<&RuntimeCondition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }

    /// Whether `RuntimeReady` is reported true.
    pub fn runtime_ready(&self) -> bool {
        self.condition(RUNTIME_READY).is_some_and(|c| c.status)
    }

    /// Whether `NetworkReady` is reported true.
    pub fn network_ready(&self) -> bool {
        self.condition(NETWORK_READY).is_some_and(|c| c.status)
    }
}

/// A container's state as the runtime reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerState {
    /// Created but never started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    Unknown,
}

/// A pod sandbox's state as the runtime reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SandboxState {
    /// The sandbox is running and networked.
    Ready,
    /// The sandbox is stopped (or failed).
    NotReady,
}

/// A container in a runtime pod listing (upstream `kubecontainer.Container`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Container {
    /// Runtime-assigned container ID.
    pub id: String,
    /// Container name from the pod spec.
    pub name: String,
    /// Image as the spec names it.
    pub image: String,
    /// Image ID the runtime resolved.
    pub image_id: String,
    /// Hash of the spec fields whose change restarts the container.
    pub hash: u64,
    /// Current state.
    pub state: ContainerState,
    /// Creation time.
    pub created_at: Option<Timestamp>,
}

impl Container {
    /// Creates a container record with the required fields; the rest stay empty.
    pub fn new(id: impl Into<String>, name: impl Into<String>, state: ContainerState) -> Self {
        Container {
            id: id.into(),
            name: name.into(),
            image: String::new(),
            image_id: String::new(),
            hash: 0,
            state,
            created_at: None,
        }
    }
}

/// A sandbox in a runtime pod listing.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sandbox {
    /// Runtime-assigned sandbox ID.
    pub id: String,
    /// Attempt number: how many sandboxes this pod had before this one.
    pub attempt: u32,
    /// Current state.
    pub state: SandboxState,
    /// Creation time.
    pub created_at: Option<Timestamp>,
}

impl Sandbox {
    /// Creates a sandbox record.
    pub fn new(id: impl Into<String>, attempt: u32, state: SandboxState) -> Self {
        Sandbox { id: id.into(), attempt, state, created_at: None }
    }
}

/// A pod as the runtime lists it: everything that carries one pod UID label.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pod {
    /// The pod UID.
    pub uid: PodUid,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Containers, newest first where the runtime reports creation times.
    pub containers: Vec<Container>,
    /// Sandboxes, newest first where the runtime reports creation times.
    pub sandboxes: Vec<Sandbox>,
}

impl Pod {
    /// Creates an empty runtime pod.
    pub fn new(uid: PodUid, name: impl Into<String>, namespace: impl Into<String>) -> Self {
        Pod { uid, name: name.into(), namespace: namespace.into(), containers: Vec::new(), sandboxes: Vec::new() }
    }

    /// Whether any container or sandbox of the pod is still running.
    pub fn is_running(&self) -> bool {
        self.containers.iter().any(|c| c.state == ContainerState::Running)
            || self.sandboxes.iter().any(|s| s.state == SandboxState::Ready)
    }
}

/// Whether a sandbox shares the host's network namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum NetworkMode {
    /// The sandbox has its own network namespace.
    #[default]
    Pod,
    /// The sandbox uses the host's network namespace (`hostNetwork: true`).
    Host,
}

/// The detailed status of one sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SandboxStatus {
    /// Sandbox ID.
    pub id: String,
    /// Attempt number.
    pub attempt: u32,
    /// State.
    pub state: SandboxState,
    /// Creation time.
    pub created_at: Option<Timestamp>,
    /// IP addresses, primary first; empty for host-network or stopped sandboxes.
    pub ips: Vec<String>,
    /// Network namespace mode.
    pub network_mode: NetworkMode,
    /// The path of the sandbox's network namespace, where the runtime reports it (a
    /// [`Networked`](crate::network::Networked) runtime's pods have one).
    pub network_namespace: Option<PathBuf>,
}

impl SandboxStatus {
    /// Creates a sandbox status with no IPs in pod network mode.
    pub fn new(id: impl Into<String>, attempt: u32, state: SandboxState) -> Self {
        SandboxStatus {
            id: id.into(),
            attempt,
            state,
            created_at: None,
            ips: Vec::new(),
            network_mode: NetworkMode::Pod,
            network_namespace: None,
        }
    }
}

/// The detailed status of one container (upstream `kubecontainer.Status`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerStatus {
    /// Container ID.
    pub id: String,
    /// Container name from the pod spec.
    pub name: String,
    /// State.
    pub state: ContainerState,
    /// Creation time.
    pub created_at: Option<Timestamp>,
    /// Start time, once started.
    pub started_at: Option<Timestamp>,
    /// Finish time, once exited.
    pub finished_at: Option<Timestamp>,
    /// Exit code, once exited.
    pub exit_code: i32,
    /// Image as the spec names it.
    pub image: String,
    /// Image ID the runtime resolved.
    pub image_id: String,
    /// Image reference (digest) the runtime resolved.
    pub image_ref: String,
    /// Hash of the spec fields whose change restarts the container.
    pub hash: u64,
    /// How many times this container was restarted before this instance.
    pub restart_count: u32,
    /// Runtime reason for the state, e.g. `Completed`, `Error`, `OOMKilled`.
    pub reason: String,
    /// Runtime message for the state (or the termination message).
    pub message: String,
}

impl ContainerStatus {
    /// Creates a status with the required fields; the rest stay empty.
    pub fn new(id: impl Into<String>, name: impl Into<String>, state: ContainerState) -> Self {
        ContainerStatus {
            id: id.into(),
            name: name.into(),
            state,
            created_at: None,
            started_at: None,
            finished_at: None,
            exit_code: 0,
            image: String::new(),
            image_id: String::new(),
            image_ref: String::new(),
            hash: 0,
            restart_count: 0,
            reason: String::new(),
            message: String::new(),
        }
    }
}

/// The detailed runtime status of one pod (upstream `kubecontainer.PodStatus`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodStatus {
    /// The pod UID.
    pub uid: PodUid,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod IPs, primary first.
    pub ips: Vec<String>,
    /// Sandbox statuses, newest first.
    pub sandbox_statuses: Vec<SandboxStatus>,
    /// Container statuses, newest first.
    pub container_statuses: Vec<ContainerStatus>,
}

impl PodStatus {
    /// An empty status: the runtime knows nothing of this pod.
    pub fn new(uid: PodUid, name: impl Into<String>, namespace: impl Into<String>) -> Self {
        PodStatus {
            uid,
            name: name.into(),
            namespace: namespace.into(),
            ips: Vec::new(),
            sandbox_statuses: Vec::new(),
            container_statuses: Vec::new(),
        }
    }

    /// An empty status for `pod`: its UID, name and namespace, nothing running.
    pub fn of(pod: &ApiPod) -> Self {
        let meta = &pod.metadata;
        let (name, namespace) = (meta.name.clone().unwrap_or_default(), meta.namespace.clone().unwrap_or_default());
        PodStatus::new(PodUid::of(pod), name, namespace)
    }

    /// The newest status of the container named `name`.
    pub fn container_status(&self, name: &str) -> Option<&ContainerStatus> {
        self.container_statuses.iter().find(|c| c.name == name)
    }

    /// The network namespace of the pod's newest ready sandbox, where the runtime reports one:
    /// the namespace its containers join.
    pub fn network_namespace(&self) -> Option<&Path> {
        let sandbox = self.sandbox_statuses.iter().find(|s| s.state == SandboxState::Ready)?;
        sandbox.network_namespace.as_deref()
    }

    /// Whether any container or sandbox of the pod is running.
    pub fn is_running(&self) -> bool {
        self.container_statuses.iter().any(|c| c.state == ContainerState::Running)
            || self.sandbox_statuses.iter().any(|s| s.state == SandboxState::Ready)
    }

    /// The pod as [`Runtime::get_pods`] lists it: its containers (with their hashes) and
    /// sandboxes, for a kill.
    pub fn to_running_pod(&self) -> Pod {
        let mut pod = Pod::new(self.uid.clone(), &self.name, &self.namespace);
        pod.containers = self
            .container_statuses
            .iter()
            .map(|c| {
                let mut container = Container::new(&c.id, &c.name, c.state);
                container.hash = c.hash;
                container
            })
            .collect();
        pod.sandboxes = self.sandbox_statuses.iter().map(|s| Sandbox::new(&s.id, s.attempt, s.state)).collect();
        pod
    }
}

/// A step of `SyncPod` (upstream `SyncAction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SyncAction {
    /// Start a container.
    StartContainer,
    /// Kill a container.
    KillContainer,
    /// Start an init container.
    InitContainer,
    /// Create a pod sandbox.
    CreatePodSandbox,
    /// Generate a sandbox config.
    ConfigPodSandbox,
    /// Stop a pod sandbox.
    KillPodSandbox,
}

/// Reasons a sync step can fail with, as upstream spells them; they become container waiting reasons.
pub mod reasons {
    /// Crash-loop backoff holds the container back.
    pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
    /// The image pull failed.
    pub const ERR_IMAGE_PULL: &str = "ErrImagePull";
    /// Image pull backoff holds the pull back.
    pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
    /// The image is absent and the pull policy is Never.
    pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
    /// The image name does not parse.
    pub const INVALID_IMAGE_NAME: &str = "InvalidImageName";
    /// The container config could not be generated.
    pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";
    /// `CreateContainer` failed.
    pub const CREATE_CONTAINER_ERROR: &str = "CreateContainerError";
    /// `StartContainer` failed.
    pub const RUN_CONTAINER_ERROR: &str = "RunContainerError";
    /// A postStart hook failed.
    pub const POST_START_HOOK_ERROR: &str = "PostStartHookError";
    /// Killing a container failed.
    pub const KILL_CONTAINER_ERROR: &str = "KillContainerError";
    /// Creating the pod sandbox failed.
    pub const CREATE_POD_SANDBOX_ERROR: &str = "CreatePodSandboxError";
    /// Generating the sandbox config failed.
    pub const CONFIG_POD_SANDBOX_ERROR: &str = "ConfigPodSandboxError";
    /// Stopping the pod sandbox failed.
    pub const KILL_POD_SANDBOX_ERROR: &str = "KillPodSandboxError";
    /// The network plugin is not ready; the worker retries after 1 s.
    pub const NETWORK_NOT_READY: &str = "NetworkNotReady";

    /// Whether `reason` is a backoff rather than a failure: such results are not sync errors.
    pub fn is_backoff(reason: &str) -> bool {
        reason == CRASH_LOOP_BACK_OFF || reason == IMAGE_PULL_BACK_OFF
    }
}

/// Why a sync step failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SyncFailure {
    /// A reason from [`reasons`].
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// For a backoff: how long until the step may be retried.
    pub retry_after: Option<Duration>,
}

impl SyncFailure {
    /// Creates a failure.
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Self {
        SyncFailure { reason: reason.into(), message: message.into(), retry_after: None }
    }

    /// The same failure, retryable after `delay`.
    #[must_use]
    pub fn with_retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }
}

/// The outcome of one `SyncPod` step.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SyncResult {
    /// What was attempted.
    pub action: SyncAction,
    /// What it was attempted on: a container name, or the pod's full name.
    pub target: String,
    /// The failure, if the step failed.
    pub failure: Option<SyncFailure>,
}

impl SyncResult {
    /// A successful step.
    pub fn ok(action: SyncAction, target: impl Into<String>) -> Self {
        SyncResult { action, target: target.into(), failure: None }
    }

    /// A failed step.
    pub fn failed(action: SyncAction, target: impl Into<String>, failure: SyncFailure) -> Self {
        SyncResult { action, target: target.into(), failure: Some(failure) }
    }
}

/// The outcome of `Runtime::sync_pod`: every step it took (upstream `PodSyncResult`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodSyncResult {
    /// Step results in the order they were taken.
    pub results: Vec<SyncResult>,
    /// A failure outside any step (for example listing the pod's state).
    pub failure: Option<SyncFailure>,
}

impl PodSyncResult {
    /// Appends a step result.
    pub fn push(&mut self, result: SyncResult) {
        self.results.push(result);
    }

    /// Appends all of another result's steps and takes its failure if this one has none.
    pub fn extend(&mut self, other: PodSyncResult) {
        self.results.extend(other.results);
        if self.failure.is_none() {
            self.failure = other.failure;
        }
    }

    /// Every failure, pod-level first.
    pub fn failures(&self) -> impl Iterator<Item = &SyncFailure> {
        self.failure.iter().chain(self.results.iter().filter_map(|r| r.failure.as_ref()))
    }

    /// The failures that make the sync an error: everything but crash-loop and image-pull backoffs.
    pub fn errors(&self) -> impl Iterator<Item = &SyncFailure> {
        self.failures().filter(|f| !reasons::is_backoff(&f.reason))
    }

    /// Whether the sync is an error (see [`PodSyncResult::errors`]).
    pub fn is_err(&self) -> bool {
        self.errors().next().is_some()
    }
}

/// An image the runtime stores (CRI `Image`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Image {
    /// Image ID.
    pub id: String,
    /// Tags naming it.
    pub repo_tags: Vec<String>,
    /// Digests naming it.
    pub repo_digests: Vec<String>,
    /// Size in bytes.
    pub size: u64,
    /// Whether GC must keep it.
    pub pinned: bool,
}

/// How full a filesystem is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FsStats {
    /// Its size in bytes.
    pub capacity_bytes: u64,
    /// The bytes an unprivileged writer may still use.
    pub available_bytes: u64,
    /// Its inodes, when known.
    pub inodes: Option<u64>,
    /// Its free inodes, when known.
    pub inodes_free: Option<u64>,
    /// Its ID (`statvfs`'s `f_fsid`), when known: two paths with the same ID share a filesystem.
    pub filesystem_id: Option<u64>,
}

impl FsStats {
    /// A filesystem of `capacity_bytes` with `available_bytes` free.
    pub fn new(capacity_bytes: u64, available_bytes: u64) -> Self {
        FsStats { capacity_bytes, available_bytes, inodes: None, inodes_free: None, filesystem_id: None }
    }

    /// Sets its inodes: `inodes` in all, `free` of them free.
    #[must_use]
    pub fn with_inodes(mut self, inodes: u64, free: u64) -> Self {
        self.inodes = Some(inodes);
        self.inodes_free = Some(free);
        self
    }
}

/// One container's use of the node, as the runtime reports it (CRI `ListContainerStats`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerStats {
    /// The container's ID.
    pub id: String,
    /// Its pod's UID.
    pub pod_uid: PodUid,
    /// The container's name in its pod.
    pub name: String,
    /// Its memory working set in bytes.
    pub memory_working_set_bytes: Option<u64>,
    /// The CPU time it has used, in nanoseconds (cumulative).
    pub cpu_usage_core_nanoseconds: Option<u64>,
    /// When the runtime read the CPU time, in nanoseconds since the epoch.
    pub cpu_timestamp_nanos: Option<i64>,
    /// The bytes its writable layer uses.
    pub writable_layer_bytes: Option<u64>,
    /// The inodes its writable layer uses.
    pub writable_layer_inodes: Option<u64>,
}

impl ContainerStats {
    /// Stats of container `name` (`id`) of pod `pod_uid`, with nothing measured yet.
    pub fn new(id: impl Into<String>, pod_uid: PodUid, name: impl Into<String>) -> Self {
        ContainerStats {
            id: id.into(),
            pod_uid,
            name: name.into(),
            memory_working_set_bytes: None,
            cpu_usage_core_nanoseconds: None,
            cpu_timestamp_nanos: None,
            writable_layer_bytes: None,
            writable_layer_inodes: None,
        }
    }
}

/// The traffic of one network interface since it was made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InterfaceStats {
    /// The interface's name in its network namespace (`eth0`).
    pub name: String,
    /// Bytes received.
    pub rx_bytes: Option<u64>,
    /// Receive errors.
    pub rx_errors: Option<u64>,
    /// Bytes sent.
    pub tx_bytes: Option<u64>,
    /// Send errors.
    pub tx_errors: Option<u64>,
}

impl InterfaceStats {
    /// Interface `name` with nothing measured.
    pub fn new(name: impl Into<String>) -> Self {
        InterfaceStats { name: name.into(), ..InterfaceStats::default() }
    }
}

/// One pod's network traffic, as the runtime reports it (CRI `ListPodSandboxStats`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodNetworkStats {
    /// The pod's UID.
    pub pod_uid: PodUid,
    /// Its default interface (the one its IP is on).
    pub default_interface: Option<InterfaceStats>,
    /// Its other interfaces.
    pub interfaces: Vec<InterfaceStats>,
}

impl PodNetworkStats {
    /// Pod `pod_uid` with no interface.
    pub fn new(pod_uid: PodUid) -> Self {
        PodNetworkStats { pod_uid, default_interface: None, interfaces: Vec::new() }
    }
}

/// The result of running a command in a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecResult {
    /// Captured standard output.
    pub stdout: Vec<u8>,
    /// Captured standard error.
    pub stderr: Vec<u8>,
    /// Exit code.
    pub exit_code: i32,
}

/// Which standard streams a stream carries, as the kubelet API's `stdin`, `stdout`, `stderr`
/// and `tty` parameters ask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamIo {
    /// The caller writes to the process's standard input.
    pub stdin: bool,
    /// The caller reads its standard output.
    pub stdout: bool,
    /// The caller reads its standard error (never with a TTY, which merges it into stdout).
    pub stderr: bool,
    /// The process gets a terminal.
    pub tty: bool,
}

impl StreamIo {
    /// The streams asked for; a TTY carries no separate stderr (upstream's rule).
    pub fn new(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> Self {
        StreamIo { stdin, stdout, stderr: stderr && !tty, tty }
    }
}

/// A stream to or from a pod that the runtime serves (upstream's CRI `Exec`, `Attach` and
/// `PortForward`): the runtime answers with the URL of its streaming server, which the kubelet
/// API proxies. These are CRI's three streaming calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamRequest {
    /// A new process in a running container.
    Exec {
        /// The container's ID.
        container_id: String,
        /// The command and its arguments.
        command: Vec<String>,
        /// The streams.
        io: StreamIo,
    },
    /// The streams of a running container's main process.
    Attach {
        /// The container's ID.
        container_id: String,
        /// The streams.
        io: StreamIo,
    },
    /// TCP connections to ports in the pod's network namespace.
    PortForward {
        /// The pod sandbox's ID.
        sandbox_id: String,
        /// The ports (none: the caller names them per stream).
        ports: Vec<i32>,
    },
}

/// Container garbage-collection policy (upstream `GCPolicy`; defaults are upstream's flag defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GcPolicy {
    /// Dead containers younger than this are kept.
    pub min_age: Duration,
    /// Dead instances kept per (pod, container name); negative means no limit.
    pub max_per_pod_container: i32,
    /// Dead containers kept in total; negative means no limit.
    pub max_containers: i32,
}

impl Default for GcPolicy {
    fn default() -> Self {
        GcPolicy { min_age: Duration::ZERO, max_per_pod_container: 1, max_containers: -1 }
    }
}

/// What happened to a container, as a runtime's event stream reports it (CRI `ContainerEventType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ContainerEventKind {
    /// The container (or sandbox) was created.
    Created,
    /// It started.
    Started,
    /// It stopped.
    Stopped,
    /// It was removed.
    Deleted,
}

/// One container event, with the pod's status as of the event (CRI `ContainerEventResponse`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerEvent {
    /// The container or sandbox concerned.
    pub container_id: String,
    /// What happened.
    pub kind: ContainerEventKind,
    /// When.
    pub created_at: Timestamp,
    /// The pod's status at that moment (sandbox and containers).
    pub pod_status: PodStatus,
}

impl ContainerEvent {
    /// Creates an event.
    pub fn new(
        container_id: impl Into<String>,
        kind: ContainerEventKind,
        created_at: Timestamp,
        pod_status: PodStatus,
    ) -> Self {
        ContainerEvent { container_id: container_id.into(), kind, created_at, pod_status }
    }
}

/// What a change hint (see [`RuntimeEvents::watch_changes`]) says changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChangeHint {
    /// A container or sandbox was created, started or removed.
    Changed,
    /// A container or sandbox stopped: its exit is about to show in the runtime's status, and
    /// the kubelet restarts containers on it, so the PLEG looks again sooner than for other hints.
    Exited,
}

/// Why a runtime's event stream ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventStreamError {
    /// The runtime has no event stream (containerd 1.6 answers `Unimplemented`).
    #[error("the runtime does not implement container events")]
    Unimplemented,
    /// The runtime ended the stream.
    #[error("the runtime closed the container event stream")]
    Closed,
    /// The stream failed; the runtime's error is the source.
    #[error("container event stream failed")]
    Failed(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// A runtime that can stream container events (CRI `GetContainerEvents`), for the evented PLEG.
pub trait RuntimeEvents: Runtime {
    /// Streams events into `events` until the stream fails or ends (an error), or the receiver
    /// goes away (`Ok`).
    fn stream_events(
        &self,
        events: tokio::sync::mpsc::Sender<ContainerEvent>,
    ) -> impl Future<Output = Result<(), EventStreamError>> + Send;

    /// For runtimes without [`stream_events`](Self::stream_events): sends a hint into `changed`
    /// whenever some container or sandbox may have changed, until the stream fails or ends (an
    /// error) or the receiver goes away (`Ok`).
    ///
    /// A hint carries no status, only what kind of change it was; the PLEG relists on it.
    /// Hints may be coalesced, never lost: when `changed` is full, the hints waiting in it stand
    /// for those that follow until they are taken.
    /// The default has no such stream and answers [`EventStreamError::Unimplemented`].
    fn watch_changes(
        &self,
        changed: tokio::sync::mpsc::Sender<ChangeHint>,
    ) -> impl Future<Output = Result<(), EventStreamError>> + Send {
        drop(changed);
        std::future::ready(Err(EventStreamError::Unimplemented))
    }
}

/// A container runtime, as the kubelet drives it (upstream `kubecontainer.Runtime`).
///
/// Implementations: `kubelet-cri-client` over CRI gRPC, and `fake::FakeRuntime` (feature
/// `test-util`) in memory.
/// Methods are coarse: `sync_pod` does all the work of bringing one pod to its spec.
/// The trait is used through generics (native `async fn`, no boxing); every future is `Send`.
pub trait Runtime: Send + Sync + 'static {
    /// The error every method may return; implementations keep their own rich errors.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The runtime's name and versions.
    fn version(&self) -> impl Future<Output = Result<Version, Self::Error>> + Send;

    /// Whether the runtime runs containers' `postStart` and `preStop` hooks (through a
    /// [`HookRunner`](crate::HookRunner)); the kubelet refuses pods with hooks when it does not.
    fn runs_hooks(&self) -> bool {
        false
    }

    /// Whether the runtime runs pods of a `runtimeClassName`, with the handler of the class it
    /// looks up in the API server's runtime classes; the kubelet refuses such pods when it does
    /// not (without an API server, no class can be looked up).
    fn runs_runtime_classes(&self) -> bool {
        false
    }

    /// The runtime's conditions (`RuntimeReady`, `NetworkReady`).
    fn status(&self) -> impl Future<Output = Result<RuntimeStatus, Self::Error>> + Send;

    /// Lists pods: every pod when `all`, else only pods with something running.
    fn get_pods(&self, all: bool) -> impl Future<Output = Result<Vec<Pod>, Self::Error>> + Send;

    /// Inspects one pod in detail.
    fn get_pod_status(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
    ) -> impl Future<Output = Result<PodStatus, Self::Error>> + Send;

    /// Inspects one pod as [`get_pods`](Self::get_pods)`(true)` has just listed it.
    ///
    /// A runtime may read the statuses of the listed sandboxes and containers alone, without
    /// listing the pod again: one created since the listing is then missing from the status
    /// until the next listing finds it.
    /// The default inspects the pod afresh with [`get_pod_status`](Self::get_pod_status).
    fn get_listed_pod_status(&self, pod: &Pod) -> impl Future<Output = Result<PodStatus, Self::Error>> + Send {
        self.get_pod_status(&pod.uid, &pod.name, &pod.namespace)
    }

    /// Brings the pod's sandbox and containers in line with its spec; `backoff` is the crash-loop
    /// backoff, and a running container that failed its liveness or startup probe in `probes` is
    /// killed and started again (an agent without a prober passes an empty store); `volumes` are
    /// the host paths of the pod's volumes, set up by the kubelet's volume manager, which the
    /// containers' `volumeMounts` name.
    fn sync_pod(
        &self,
        pod: &ApiPod,
        status: &PodStatus,
        backoff: &Backoff,
        probes: &ProbeResults,
        volumes: &crate::volume::PodVolumes,
    ) -> impl Future<Output = PodSyncResult> + Send;

    /// Kills every container and stops every sandbox of `running`.
    ///
    /// `pod` is the spec when known (for per-container grace periods); `grace_override` in seconds
    /// replaces the pod's grace period.
    fn kill_pod(
        &self,
        pod: Option<&ApiPod>,
        running: &Pod,
        grace_override: Option<i64>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Pulls an image and returns its reference.
    ///
    /// The default is a runtime without an image store: the image is its own reference.
    fn pull_image(&self, image: &str) -> impl Future<Output = Result<String, Self::Error>> + Send {
        std::future::ready(Ok(image.to_owned()))
    }

    /// The reference of a locally present image, or `None`.
    ///
    /// The default is a runtime without an image store: every image is present as itself.
    fn image_ref(&self, image: &str) -> impl Future<Output = Result<Option<String>, Self::Error>> + Send {
        std::future::ready(Ok(Some(image.to_owned())))
    }

    /// All locally stored images (by default none).
    fn list_images(&self) -> impl Future<Output = Result<Vec<Image>, Self::Error>> + Send {
        std::future::ready(Ok(Vec::new()))
    }

    /// Removes an image (by default there is nothing to remove).
    fn remove_image(&self, _image: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        std::future::ready(Ok(()))
    }

    /// The filesystem holding the images, for image garbage collection; `None` (the default)
    /// for a runtime without an image store.
    fn image_fs_stats(&self) -> impl Future<Output = Result<Option<FsStats>, Self::Error>> + Send {
        std::future::ready(Ok(None))
    }

    /// The running containers' use of memory and of their writable layers, for eviction;
    /// none (the default) for a runtime that does not measure it.
    fn container_stats(&self) -> impl Future<Output = Result<Vec<ContainerStats>, Self::Error>> + Send {
        std::future::ready(Ok(Vec::new()))
    }

    /// The pods' network traffic, for `/stats/summary`; none (the default) for a runtime that
    /// does not measure it, and no entry for a pod it has no figures of.
    fn pod_network_stats(&self) -> impl Future<Output = Result<Vec<PodNetworkStats>, Self::Error>> + Send {
        std::future::ready(Ok(Vec::new()))
    }

    /// Runs a command in a container and waits for it, at most `timeout`.
    ///
    /// The default is a runtime that cannot: exit code 126 (upstream's "cannot execute"), which
    /// fails an exec probe or hook, with the reason on stderr.
    fn exec_sync(
        &self,
        _container_id: &str,
        _cmd: &[String],
        _timeout: Duration,
    ) -> impl Future<Output = Result<ExecResult, Self::Error>> + Send {
        let stderr = b"this runtime cannot run commands in containers".to_vec();
        std::future::ready(Ok(ExecResult { stdout: Vec::new(), stderr, exit_code: 126 }))
    }

    /// The URL where the runtime's streaming server serves `request`; `None` (the default) for
    /// a runtime that cannot stream.
    fn stream_url(&self, _request: StreamRequest) -> impl Future<Output = Result<Option<String>, Self::Error>> + Send {
        std::future::ready(Ok(None))
    }

    /// Removes a dead container.
    ///
    /// The default suits a runtime that keeps nothing of exited containers; one that keeps
    /// them (as a CRI runtime does) must override it, or they pile up.
    fn delete_container(&self, _container_id: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        std::future::ready(Ok(()))
    }

    /// Removes everything left of a pod that is gone and has nothing running: its containers and
    /// sandboxes, and what the runtime keeps beside them (pod cgroups, log directory).
    /// Upstream leaves this to its periodic container GC; the kubelet calls it as soon as it knows
    /// the pod is gone, also for a pod the runtime holds nothing of (a start cut short may have
    /// left its log directory). A pod with a running container or a ready sandbox is an error.
    ///
    /// The default suits a runtime that keeps nothing of a pod once its containers are killed;
    /// one that keeps containers, sandboxes or files must override it.
    fn remove_pod_content(&self, _uid: &PodUid) -> impl Future<Output = Result<(), Self::Error>> + Send {
        std::future::ready(Ok(()))
    }

    /// Removes dead containers and sandboxes according to `policy`.
    ///
    /// The default suits a runtime that keeps nothing dead; one that does must override it.
    fn garbage_collect(
        &self,
        _policy: &GcPolicy,
        _all_sources_ready: bool,
        _evict_non_deleted_pods: bool,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        std::future::ready(Ok(()))
    }
}

/// The hash of the container spec fields whose change restarts a running container.
///
/// It covers the container's name and image only, as upstream does since v1.31, so adding API
/// fields never restarts containers on upgrade.
/// It is FNV-1a (64 bit) over `name`, a NUL byte and `image`: stable across our releases and
/// restarts, and not bit-compatible with the Go kubelet's hash.
pub fn container_hash(name: &str, image: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    name.bytes().chain([0]).chain(image.bytes()).fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_hash_is_stable_and_covers_name_and_image() {
        // Pinned values: a change here restarts every container on upgrade.
        assert_eq!(container_hash("app", "busybox:1.35"), 0x3a5f_3340_48b6_4537);
        assert_eq!(container_hash("", ""), 0xaf63_bd4c_8601_b7df);
        assert_ne!(container_hash("app", "busybox:1.35"), container_hash("app", "busybox:1.36"));
        assert_ne!(container_hash("ab", "c"), container_hash("a", "bc"), "the separator keeps fields apart");
    }

    #[test]
    fn sync_result_errors_exclude_backoffs() {
        let mut r = PodSyncResult::default();
        r.push(SyncResult::ok(SyncAction::StartContainer, "a"));
        r.push(SyncResult::failed(
            SyncAction::StartContainer,
            "b",
            SyncFailure::new(reasons::CRASH_LOOP_BACK_OFF, "back-off 10s"),
        ));
        assert!(!r.is_err());
        assert_eq!(r.failures().count(), 1);
        r.push(SyncResult::failed(
            SyncAction::StartContainer,
            "c",
            SyncFailure::new(reasons::RUN_CONTAINER_ERROR, "boom"),
        ));
        assert!(r.is_err());
        assert_eq!(r.errors().map(|f| f.reason.as_str()).collect::<Vec<_>>(), [reasons::RUN_CONTAINER_ERROR]);
    }
}
