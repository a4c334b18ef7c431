//! The kubelet's generic runtime manager over CRI (upstream `pkg/kubelet/kuberuntime`):
//! [`CriRuntime`] implements `kubelet_core::Runtime`.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Container as ApiContainer, Pod as ApiPod};
use kubelet_core::{
    Backoff, PodUid, Runtime,
    events::{Event, EventRecorder, EventType, ObjectRef},
    runtime::{
        self, ContainerState, ExecResult, GcPolicy, Image, PodStatus, PodSyncResult, RuntimeCondition, RuntimeStatus,
        SandboxState, SyncAction, SyncFailure, SyncResult, Version, reasons,
    },
};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::{
    Client, Error,
    actions::{self, ProbeFailures, compute_pod_actions},
    cgroups, container, convert, labels, pb,
    sandbox::{self, ResolvConf},
};

/// How the runtime manager lays things out on the node; defaults are upstream's.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Where pod log directories go (`podLogsDir`, `/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// Where the legacy container log symlinks go (`/var/log/containers`).
    pub container_logs_dir: PathBuf,
    /// The cgroupfs root of pod cgroups (`/kubepods`).
    pub cgroup_root: String,
    /// Where cgroup hierarchies are mounted, for cleanup (`/sys/fs/cgroup`).
    pub cgroup_mount: PathBuf,
    /// The runtime handler for sandboxes (empty: the runtime's default).
    pub runtime_handler: String,
    /// The node's resolver configuration (`/etc/resolv.conf`).
    pub resolv_conf: PathBuf,
    /// The node's name, for the downward API.
    pub node_name: String,
    /// The node's IP, for the downward API.
    pub node_ip: String,
    /// Where per-pod directories go (`<root-dir>/pods`, `/var/lib/kubelet/pods`); termination
    /// message files live under them.
    pub pods_dir: PathBuf,
    /// How many image pulls may run at once: `Some(1)` is upstream's `serializeImagePulls`
    /// (the default), `None` no limit (`maxParallelImagePulls` unset).
    pub image_pull_limit: Option<usize>,
}

impl Config {
    /// Upstream's layout for node `node_name`.
    pub fn new(node_name: impl Into<String>) -> Self {
        Config {
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            container_logs_dir: PathBuf::from("/var/log/containers"),
            cgroup_root: "/kubepods".to_owned(),
            cgroup_mount: PathBuf::from(cgroups::CGROUP_ROOT),
            runtime_handler: String::new(),
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            node_name: node_name.into(),
            node_ip: String::new(),
            pods_dir: PathBuf::from("/var/lib/kubelet/pods"),
            image_pull_limit: Some(1),
        }
    }

    /// Sets how many image pulls may run at once (`None`: no limit).
    #[must_use]
    pub fn image_pull_limit(mut self, limit: Option<usize>) -> Self {
        self.image_pull_limit = limit.map(|l| l.max(1));
        self
    }

    /// Sets the per-pod directory root.
    #[must_use]
    pub fn pods_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.pods_dir = dir.into();
        self
    }

    /// Sets the pod log directory root.
    #[must_use]
    pub fn pod_logs_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.pod_logs_dir = dir.into();
        self
    }

    /// Sets the container log symlink directory.
    #[must_use]
    pub fn container_logs_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.container_logs_dir = dir.into();
        self
    }

    /// Sets the cgroupfs root of pod cgroups.
    #[must_use]
    pub fn cgroup_root(mut self, root: impl Into<String>) -> Self {
        self.cgroup_root = root.into();
        self
    }

    /// Sets the node's IP.
    #[must_use]
    pub fn node_ip(mut self, ip: impl Into<String>) -> Self {
        self.node_ip = ip.into();
        self
    }
}

/// The minimum grace period of a container stop (upstream `minimumGracePeriodInSeconds`).
pub const MIN_GRACE_PERIOD_SECONDS: i64 = 2;

/// `kubelet_core::Runtime` over a CRI runtime.
pub struct CriRuntime {
    client: Client,
    config: Config,
    image_backoff: Backoff,
    recorder: Arc<dyn EventRecorder>,
    probes: Mutex<ProbeFailures>,
    memory_capacity: i64,
    image_pulls: Option<tokio::sync::Semaphore>,
    startup: Option<Arc<kubelet_core::startup::StartupTracker>>,
}

impl std::fmt::Debug for CriRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriRuntime").field("config", &self.config).finish_non_exhaustive()
    }
}

fn memory_capacity() -> i64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        .map_or(i64::MAX, |kib| kib * 1024)
}

/// The `container_type` label of upstream's container metrics.
fn container_type(pod: &ApiPod, name: &str) -> &'static str {
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.init_containers.as_ref()).is_some_and(|c| c.iter().any(|c| c.name == name)) {
        "init_container"
    } else if spec.and_then(|s| s.ephemeral_containers.as_ref()).is_some_and(|c| c.iter().any(|c| c.name == name)) {
        "ephemeral_container"
    } else {
        "container"
    }
}

fn pod_meta(pod: &ApiPod) -> (&str, &str, &str) {
    (
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default(),
    )
}

/// The crash-loop backoff key (upstream `getStableKey`).
fn backoff_key(pod: &ApiPod, container: &ApiContainer) -> String {
    let (name, namespace, uid) = pod_meta(pod);
    format!("{name}_{namespace}_{uid}_{}_{:x}", container.name, actions::hash(container))
}

/// The highest `N` of `N.log` files in a container's log directory, plus one (0 when none).
fn restart_count_from_logs(dir: &Path) -> u32 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| name.split('.').next().and_then(|n| n.parse::<u32>().ok()).filter(|_| name.contains(".log")))
        .max()
        .map_or(0, |n| n + 1)
}

/// Upstream's limits on termination messages: the file, and the log tail used as fallback.
const MAX_MESSAGE_BYTES: usize = 4096;
const MAX_LOG_TAIL_LINES: usize = 80;
const MAX_LOG_TAIL_BYTES: usize = 2048;

/// The message content of CRI log lines (`<time> <stream> <P|F> <message>`).
fn log_message(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut parts = line.splitn(4, ' ');
        let (_, _, tag, message) = (parts.next(), parts.next(), parts.next(), parts.next().unwrap_or_default());
        out.push_str(message);
        if tag != Some("P") {
            out.push('\n');
        }
    }
    out
}

/// The last lines of a container's log, within upstream's limits.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(MAX_LOG_TAIL_LINES)..].join("\n");
    let message = log_message(&tail);
    let start = message.len().saturating_sub(MAX_LOG_TAIL_BYTES);
    let start = (start..message.len()).find(|i| message.is_char_boundary(*i)).unwrap_or(message.len());
    message[start..].to_owned()
}

/// A dead container's termination message: its termination file, or with
/// `FallbackToLogsOnError` and a failure, the tail of its log.
fn termination_message(status: &pb::ContainerStatus) -> String {
    let path = status.annotations.get(labels::TERMINATION_MESSAGE_PATH);
    let file = status.mounts.iter().find(|m| Some(&m.container_path) == path).map(|m| m.host_path.clone());
    let mut message = String::new();
    if let Some(file) = file
        && let Ok(bytes) = std::fs::read(&file)
    {
        message = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_MESSAGE_BYTES)]).into_owned();
    }
    let fallback =
        status.annotations.get(labels::TERMINATION_MESSAGE_POLICY).is_some_and(|p| p == "FallbackToLogsOnError");
    if message.is_empty() && fallback && status.exit_code != 0 && !status.log_path.is_empty() {
        message = log_tail(Path::new(&status.log_path));
    }
    message
}

impl CriRuntime {
    /// A runtime manager over `client`; events go to `recorder`.
    pub fn new(client: Client, config: Config, recorder: Arc<dyn EventRecorder>) -> Self {
        CriRuntime {
            client,
            image_backoff: Backoff::default(),
            recorder,
            probes: Mutex::new(ProbeFailures::default()),
            memory_capacity: memory_capacity(),
            image_pulls: config.image_pull_limit.map(tokio::sync::Semaphore::new),
            startup: None,
            config,
        }
    }

    /// Reports image pulls to `tracker`, which the kubelet shares, for the start-up SLI metric.
    #[must_use]
    pub fn startup_tracker(mut self, tracker: Arc<kubelet_core::startup::StartupTracker>) -> Self {
        self.startup = Some(tracker);
        self
    }

    /// The CRI client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Replaces the failed-probe set the next syncs act on (fed by the prober).
    pub fn set_probe_failures(&self, failures: ProbeFailures) {
        *self.probes.lock().unwrap_or_else(|p| p.into_inner()) = failures;
    }

    fn event(&self, pod: &ApiPod, kind: EventType, reason: &str, message: String) {
        self.recorder.record(Event::new(kind, reason, message, ObjectRef::pod(pod)));
    }

    fn pod_log_dir(&self, pod: &ApiPod) -> PathBuf {
        let (name, namespace, uid) = pod_meta(pod);
        sandbox::pod_log_dir(&self.config.pod_logs_dir, namespace, name, uid)
    }

    async fn list_sandboxes(&self, filter: Option<pb::PodSandboxFilter>) -> Result<Vec<pb::PodSandbox>, Error> {
        let request = pb::ListPodSandboxRequest { filter };
        Ok(self
            .client
            .runtime_service()
            .list_pod_sandbox(request)
            .await
            .map_err(|s| Error::status("ListPodSandbox", s))?
            .into_inner()
            .items)
    }

    async fn list_containers(&self, filter: Option<pb::ContainerFilter>) -> Result<Vec<pb::Container>, Error> {
        let request = pb::ListContainersRequest { filter };
        Ok(self
            .client
            .runtime_service()
            .list_containers(request)
            .await
            .map_err(|s| Error::status("ListContainers", s))?
            .into_inner()
            .containers)
    }

    fn uid_selector(uid: &PodUid) -> HashMap<String, String> {
        HashMap::from([(labels::POD_UID.to_owned(), uid.to_string())])
    }

    async fn stop_container(&self, id: &str, grace: i64) -> Result<(), Error> {
        let request = pb::StopContainerRequest { container_id: id.to_owned(), timeout: grace };
        match self.client.runtime_service().stop_container(request).await {
            Ok(_) => Ok(()),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
            Err(status) => Err(Error::status("StopContainer", status)),
        }
    }

    /// Kills one container with upstream's grace rules (`killContainer`).
    async fn kill_container(
        &self,
        pod: Option<&ApiPod>,
        id: &str,
        name: &str,
        annotations_grace: Option<i64>,
        grace_override: Option<i64>,
        message: &str,
    ) -> Result<(), Error> {
        let mut grace = pod
            .and_then(|p| {
                p.metadata
                    .deletion_grace_period_seconds
                    .or_else(|| p.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
            })
            .or(annotations_grace)
            .unwrap_or(30);
        if let Some(pod) = pod {
            let message = if message.is_empty() { format!("Stopping container {name}") } else { message.to_owned() };
            self.event(pod, EventType::Normal, "Killing", message);
        }
        // The preStop hook (delivered with the probes and hooks) would run here and shorten `grace`.
        grace = grace.max(MIN_GRACE_PERIOD_SECONDS);
        if let Some(grace_override) = grace_override {
            grace = grace_override;
        }
        debug!(container.id = id, container.name = name, grace, "stopping container");
        self.stop_container(id, grace).await
    }

    async fn ensure_image(&self, pod: &ApiPod, container: &ApiContainer) -> Result<String, SyncFailure> {
        let image = container.image.clone().unwrap_or_default();
        if image.trim().is_empty() {
            return Err(SyncFailure::new(
                reasons::INVALID_IMAGE_NAME,
                format!("container {} has no image", container.name),
            ));
        }
        let policy = container.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
        let present = self
            .image_ref(&image)
            .await
            .map_err(|e| SyncFailure::new("ImageInspectError", format!("Failed to inspect image {image:?}: {e}")))?;
        if let Some(reference) = present.as_ref().filter(|_| policy != "Always") {
            self.event(
                pod,
                EventType::Normal,
                "Pulled",
                format!("Container image {image:?} already present on machine"),
            );
            return Ok(reference.clone());
        }
        if policy == "Never" {
            let message = format!("Container image {image:?} is not present with pull policy of Never");
            self.event(pod, EventType::Warning, reasons::ERR_IMAGE_NEVER_PULL, message.clone());
            return Err(SyncFailure::new(reasons::ERR_IMAGE_NEVER_PULL, message));
        }
        let key = format!("{}_{image}", pod_meta(pod).2);
        if self.image_backoff.is_in_backoff_since_update(&key, Instant::now()) {
            let message = format!("Back-off pulling image {image:?}");
            self.event(pod, EventType::Normal, "BackOff", message.clone());
            return Err(SyncFailure::new(reasons::IMAGE_PULL_BACK_OFF, message));
        }
        self.event(pod, EventType::Normal, "Pulling", format!("Pulling image {image:?}"));
        let started = Instant::now();
        let uid = kubelet_core::PodUid::of(pod);
        if let Some(tracker) = &self.startup {
            tracker.pulling_started(&uid, started);
        }
        let pulled = self.pull_image(&image).await;
        if let Some(tracker) = &self.startup {
            tracker.pulling_finished(&uid, Instant::now());
        }
        match pulled {
            Ok(reference) => {
                self.image_backoff.reset(&key);
                self.event(
                    pod,
                    EventType::Normal,
                    "Pulled",
                    format!("Successfully pulled image {image:?} in {:?}", started.elapsed()),
                );
                Ok(reference)
            }
            Err(err) => {
                self.image_backoff.next(&key, Instant::now());
                let message = format!("Failed to pull image {image:?}: {err}");
                self.event(pod, EventType::Warning, "Failed", message.clone());
                Err(SyncFailure::new(reasons::ERR_IMAGE_PULL, message))
            }
        }
    }

    async fn image_user(&self, image_ref: &str) -> container::ImageUser {
        let request = pb::ImageStatusRequest {
            image: Some(pb::ImageSpec { image: image_ref.to_owned(), ..Default::default() }),
            verbose: false,
        };
        let image = match self.client.image_service().image_status(request).await {
            Ok(response) => response.into_inner().image,
            Err(_) => None,
        };
        let Some(image) = image else { return container::ImageUser::default() };
        container::ImageUser { uid: image.uid.map(|u| u.value), username: image.username }
    }

    /// Starts one container (upstream `startContainer`, after `doBackOff`).
    #[allow(clippy::too_many_arguments)] // Reason: the steps of one start, as upstream threads them.
    async fn start_container(
        &self,
        pod: &ApiPod,
        status: &PodStatus,
        spec: &ApiContainer,
        sandbox_id: &str,
        sandbox_config: &pb::PodSandboxConfig,
        pod_ips: &[String],
        backoff: &Backoff,
    ) -> Result<(), SyncFailure> {
        let previous = status.container_status(&spec.name);
        // Crash-loop backoff: the newest dead instance decides.
        if let Some(dead) = previous.filter(|c| c.state == ContainerState::Exited)
            && let Some(finished) = dead.finished_at
        {
            let key = backoff_key(pod, spec);
            let now = Instant::now();
            let finished = kubelet_core::clock::instant_of(finished);
            if backoff.is_in_backoff_since(&key, finished, now) {
                let (name, namespace, uid) = pod_meta(pod);
                let message = format!(
                    "back-off {:?} restarting failed container={} pod={name}_{namespace}({uid})",
                    backoff.get(&key),
                    spec.name
                );
                self.event(
                    pod,
                    EventType::Warning,
                    "BackOff",
                    format!("Back-off restarting failed container {} in pod {name}_{namespace}({uid})", spec.name),
                );
                let remaining = backoff.get(&key).saturating_sub(now.saturating_duration_since(finished));
                return Err(SyncFailure::new(reasons::CRASH_LOOP_BACK_OFF, message).with_retry_after(remaining));
            }
            backoff.next(&key, now);
        }
        let image_ref = self.ensure_image(pod, spec).await?;
        let log_dir = self.pod_log_dir(pod);
        let restart_count = match previous {
            Some(p) => p.restart_count + 1,
            None => restart_count_from_logs(&log_dir.join(&spec.name)),
        };
        let image_user = self.image_user(&image_ref).await;
        let input = container::ConfigInput {
            pod,
            container: spec,
            restart_count,
            image_ref: &image_ref,
            image_user: &image_user,
            downward: container::Downward { pod_ips, node_name: &self.config.node_name, host_ip: &self.config.node_ip },
            memory_capacity: self.memory_capacity,
        };
        let mut config = container::container_config(&input).map_err(|message| {
            self.event(pod, EventType::Warning, "Failed", format!("Error: {message}"));
            SyncFailure::new(reasons::CREATE_CONTAINER_CONFIG_ERROR, message)
        })?;
        // The termination message file: a host file mounted at `terminationMessagePath`.
        if let Some(path) = spec.termination_message_path.as_deref().filter(|p| !p.is_empty()) {
            let dir = self.config.pods_dir.join(pod_meta(pod).2).join("containers").join(&spec.name);
            let file = dir.join(format!("{restart_count}-termination-log"));
            let created = async {
                tokio::fs::create_dir_all(&dir).await?;
                tokio::fs::write(&file, b"").await?;
                use std::os::unix::fs::PermissionsExt;
                tokio::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).await
            };
            if let Err(err) = created.await {
                let message = format!("cannot create the termination message file: {err}");
                return Err(SyncFailure::new(reasons::CREATE_CONTAINER_CONFIG_ERROR, message));
            }
            config.mounts.push(pb::Mount {
                container_path: path.to_owned(),
                host_path: file.display().to_string(),
                ..pb::Mount::default()
            });
        }
        if let Err(err) = tokio::fs::create_dir_all(log_dir.join(&spec.name)).await {
            warn!(error = %err, "cannot create the container log directory");
        }
        let request = pb::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(sandbox_config.clone()),
        };
        let container_type = container_type(pod, &spec.name);
        metrics::counter!("kubelet_started_containers_total", "container_type" => container_type).increment(1);
        let count_error = |status: &tonic::Status| {
            let code = format!("{:?}", status.code());
            metrics::counter!("kubelet_started_containers_errors_total", "container_type" => container_type, "code" => code)
                .increment(1);
        };
        let id = match self.client.runtime_service().create_container(request).await {
            Ok(response) => response.into_inner().container_id,
            Err(status) => {
                count_error(&status);
                let message = format!("failed to create container {}: {}", spec.name, status.message());
                self.event(pod, EventType::Warning, "Failed", format!("Error: {message}"));
                return Err(SyncFailure::new(reasons::CREATE_CONTAINER_ERROR, message));
            }
        };
        self.event(pod, EventType::Normal, "Created", format!("Created container {}", spec.name));
        if let Err(status) =
            self.client.runtime_service().start_container(pb::StartContainerRequest { container_id: id.clone() }).await
        {
            count_error(&status);
            let message = format!("failed to start container {id:?}: {}", status.message());
            self.event(pod, EventType::Warning, "Failed", format!("Error: {message}"));
            return Err(SyncFailure::new(reasons::RUN_CONTAINER_ERROR, message));
        }
        self.event(pod, EventType::Normal, "Started", format!("Started container {}", spec.name));
        // The legacy symlink, created only when its target exists.
        let target = log_dir.join(&spec.name).join(format!("{restart_count}.log"));
        if target.exists() {
            let (name, namespace, _) = pod_meta(pod);
            let mut link_name = format!("{name}_{namespace}_{}-{id}.log", spec.name);
            link_name.truncate(255);
            let link = self.config.container_logs_dir.join(link_name);
            let _ = tokio::fs::create_dir_all(&self.config.container_logs_dir).await;
            if let Err(err) = tokio::fs::symlink(&target, &link).await
                && err.kind() != std::io::ErrorKind::AlreadyExists
            {
                warn!(error = %err, link = %link.display(), "cannot create the container log symlink");
            }
        }
        Ok(())
    }

    /// Removes every exited instance of each init container but the newest
    /// (upstream `pruneInitContainersBeforeStart`), or all of them when `all`.
    async fn prune_init_containers(&self, pod: &ApiPod, status: &PodStatus, all: bool) {
        let init: HashSet<&str> = pod
            .spec
            .as_ref()
            .map(|s| s.init_containers.iter().flatten().map(|c| c.name.as_str()).collect())
            .unwrap_or_default();
        let mut seen = HashSet::new();
        for c in &status.container_statuses {
            if !init.contains(c.name.as_str()) || c.state != ContainerState::Exited {
                continue;
            }
            if !all && seen.insert(c.name.as_str()) {
                continue;
            }
            if let Err(err) = self.delete_container(&c.id).await {
                warn!(error = %err, container.id = %c.id, "cannot remove an old init container");
            }
        }
    }

    fn running_pod_of(status: &PodStatus) -> runtime::Pod {
        let mut pod = runtime::Pod::new(status.uid.clone(), &status.name, &status.namespace);
        pod.containers = status
            .container_statuses
            .iter()
            .map(|c| {
                let mut container = runtime::Container::new(&c.id, &c.name, c.state);
                container.hash = c.hash;
                container
            })
            .collect();
        pod.sandboxes =
            status.sandbox_statuses.iter().map(|s| runtime::Sandbox::new(&s.id, s.attempt, s.state)).collect();
        pod
    }

    async fn host_dns(&self) -> ResolvConf {
        sandbox::parse_resolv_conf(&tokio::fs::read_to_string(&self.config.resolv_conf).await.unwrap_or_default())
    }

    /// Removes a pod's cgroup and log directory once nothing of it remains in the runtime.
    async fn cleanup_pod(&self, uid: &str, name: &str, namespace: &str, qos_parents: &[String]) {
        for parent in qos_parents {
            if let Err(err) = cgroups::remove_pod_cgroup(&self.config.cgroup_mount, parent) {
                debug!(error = %err, parent, "pod cgroup not removed");
            }
        }
        let dir = sandbox::pod_log_dir(&self.config.pod_logs_dir, namespace, name, uid);
        if dir.exists()
            && let Err(err) = tokio::fs::remove_dir_all(&dir).await
        {
            warn!(error = %err, dir = %dir.display(), "cannot remove the pod log directory");
        }
    }
}

impl Runtime for CriRuntime {
    type Error = Error;

    async fn version(&self) -> Result<Version, Error> {
        let v = self.client.version().await?;
        Ok(Version::new(v.runtime_name, v.runtime_version, v.runtime_api_version))
    }

    async fn status(&self) -> Result<RuntimeStatus, Error> {
        let status = self.client.status().await?;
        Ok(RuntimeStatus::new(
            status
                .conditions
                .into_iter()
                .map(|c| RuntimeCondition::new(c.r#type, c.status, c.reason, c.message))
                .collect(),
        ))
    }

    async fn get_pods(&self, all: bool) -> Result<Vec<runtime::Pod>, Error> {
        let sandbox_filter = (!all).then(|| pb::PodSandboxFilter {
            state: Some(pb::PodSandboxStateValue { state: pb::PodSandboxState::SandboxReady as i32 }),
            ..Default::default()
        });
        let container_filter = (!all).then(|| pb::ContainerFilter {
            state: Some(pb::ContainerStateValue { state: pb::ContainerState::ContainerRunning as i32 }),
            ..Default::default()
        });
        let (sandboxes, containers) =
            futures::try_join!(self.list_sandboxes(sandbox_filter), self.list_containers(container_filter))?;
        let mut pods: BTreeMap<PodUid, runtime::Pod> = BTreeMap::new();
        let mut created: HashMap<String, i64> = HashMap::new();
        for s in &sandboxes {
            let Some(uid) = convert::pod_uid(&s.labels) else { continue };
            let entry = pods.entry(uid.clone()).or_insert_with(|| {
                let name = s.labels.get(labels::POD_NAME).cloned().unwrap_or_default();
                let namespace = s.labels.get(labels::POD_NAMESPACE).cloned().unwrap_or_default();
                runtime::Pod::new(uid, name, namespace)
            });
            created.insert(s.id.clone(), s.created_at);
            entry.sandboxes.push(convert::sandbox(s));
        }
        for c in &containers {
            let Some(uid) = convert::pod_uid(&c.labels) else { continue };
            let entry = pods.entry(uid.clone()).or_insert_with(|| {
                let name = c.labels.get(labels::POD_NAME).cloned().unwrap_or_default();
                let namespace = c.labels.get(labels::POD_NAMESPACE).cloned().unwrap_or_default();
                runtime::Pod::new(uid, name, namespace)
            });
            created.insert(c.id.clone(), c.created_at);
            entry.containers.push(convert::container(c));
        }
        for pod in pods.values_mut() {
            pod.sandboxes.sort_by_key(|s| std::cmp::Reverse(created.get(&s.id).copied().unwrap_or(0)));
            pod.containers.sort_by_key(|c| std::cmp::Reverse(created.get(&c.id).copied().unwrap_or(0)));
        }
        Ok(pods.into_values().collect())
    }

    async fn get_pod_status(&self, uid: &PodUid, name: &str, namespace: &str) -> Result<PodStatus, Error> {
        let selector = Self::uid_selector(uid);
        let sandboxes = self
            .list_sandboxes(Some(pb::PodSandboxFilter { label_selector: selector.clone(), ..Default::default() }))
            .await?;
        let mut sandboxes: Vec<_> = sandboxes.into_iter().collect();
        sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let mut status = PodStatus::new(uid.clone(), name, namespace);
        for (i, s) in sandboxes.iter().enumerate() {
            let request = pb::PodSandboxStatusRequest { pod_sandbox_id: s.id.clone(), verbose: false };
            let response = match self.client.runtime_service().pod_sandbox_status(request).await {
                Ok(response) => response.into_inner(),
                Err(e) if e.code() == tonic::Code::NotFound => continue,
                Err(e) => return Err(Error::status("PodSandboxStatus", e)),
            };
            let Some(sandbox_status) = response.status else { continue };
            let converted = convert::sandbox_status(&sandbox_status);
            if i == 0 && converted.state == SandboxState::Ready {
                status.ips.clone_from(&converted.ips);
            }
            if status.name.is_empty()
                && let Some(meta) = &sandbox_status.metadata
            {
                status.name.clone_from(&meta.name);
                status.namespace.clone_from(&meta.namespace);
            }
            status.sandbox_statuses.push(converted);
        }
        let containers =
            self.list_containers(Some(pb::ContainerFilter { label_selector: selector, ..Default::default() })).await?;
        let mut statuses = Vec::new();
        for c in containers {
            let request = pb::ContainerStatusRequest { container_id: c.id.clone(), verbose: false };
            match self.client.runtime_service().container_status(request).await {
                Ok(response) => {
                    if let Some(s) = response.into_inner().status {
                        let mut converted = convert::container_status(&s);
                        if converted.state == ContainerState::Exited {
                            let message = termination_message(&s);
                            if !message.is_empty() {
                                converted.message = message;
                            }
                        }
                        statuses.push((s.created_at, converted));
                    }
                }
                // Removed between the listing and the inspection.
                Err(e) if e.code() == tonic::Code::NotFound => {}
                Err(e) => return Err(Error::status("ContainerStatus", e)),
            }
        }
        statuses.sort_by_key(|(created, _)| std::cmp::Reverse(*created));
        status.container_statuses = statuses.into_iter().map(|(_, s)| s).collect();
        Ok(status)
    }

    async fn sync_pod(&self, pod: &ApiPod, status: &PodStatus, backoff: &Backoff) -> PodSyncResult {
        let mut result = PodSyncResult::default();
        let full_name = kubelet_core::types::pod_full_name(pod);
        let probes = self.probes.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let actions = compute_pod_actions(pod, status, &probes);
        debug!(pod = %full_name, ?actions, "computed pod actions");
        let Some(spec) = pod.spec.as_ref() else {
            result.failure = Some(SyncFailure::new(reasons::CONFIG_POD_SANDBOX_ERROR, "pod has no spec"));
            return result;
        };

        // Step 1: kill the pod, or the containers that must go.
        if actions.kill_pod {
            if actions.create_sandbox {
                self.event(
                    pod,
                    EventType::Normal,
                    "SandboxChanged",
                    "Pod sandbox changed, it will be killed and re-created.".to_owned(),
                );
            }
            let running = Self::running_pod_of(status);
            if let Err(err) = self.kill_pod(Some(pod), &running, None).await {
                result.push(SyncResult::failed(
                    SyncAction::KillPodSandbox,
                    &full_name,
                    SyncFailure::new(reasons::KILL_POD_SANDBOX_ERROR, err.to_string()),
                ));
                return result;
            }
            if actions.create_sandbox {
                self.prune_init_containers(pod, status, true).await;
            }
        } else {
            for kill in &actions.containers_to_kill {
                match self.kill_container(Some(pod), &kill.id, &kill.name, None, None, &kill.message).await {
                    Ok(()) => result.push(SyncResult::ok(SyncAction::KillContainer, &kill.name)),
                    Err(err) => {
                        result.push(SyncResult::failed(
                            SyncAction::KillContainer,
                            &kill.name,
                            SyncFailure::new(reasons::KILL_CONTAINER_ERROR, err.to_string()),
                        ));
                        return result;
                    }
                }
            }
        }

        // Step 2: keep only the newest dead instance of each init container.
        if actions.next_init_container.is_some() && !actions.create_sandbox {
            self.prune_init_containers(pod, status, false).await;
        }

        // Step 3: a new sandbox, if needed.
        let host_dns = self.host_dns().await;
        let log_dir = self.pod_log_dir(pod);
        let mut sandbox_id = actions.sandbox_id.clone();
        let mut pod_ips = status.ips.clone();
        if actions.create_sandbox {
            if let Err(err) = tokio::fs::create_dir_all(&log_dir).await {
                result.push(SyncResult::failed(
                    SyncAction::CreatePodSandbox,
                    &full_name,
                    SyncFailure::new(
                        reasons::CREATE_POD_SANDBOX_ERROR,
                        format!("cannot create the pod log directory: {err}"),
                    ),
                ));
                return result;
            }
            let config = sandbox::sandbox_config(pod, actions.attempt, &log_dir, &self.config.cgroup_root, &host_dns);
            let request =
                pb::RunPodSandboxRequest { config: Some(config), runtime_handler: self.config.runtime_handler.clone() };
            metrics::counter!("kubelet_started_pods_total").increment(1);
            match self.client.runtime_service().run_pod_sandbox(request).await {
                Ok(response) => {
                    sandbox_id = response.into_inner().pod_sandbox_id;
                    result.push(SyncResult::ok(SyncAction::CreatePodSandbox, &full_name));
                }
                Err(status) => {
                    metrics::counter!("kubelet_started_pods_errors_total").increment(1);
                    let message = format!("Failed to create pod sandbox: {}", status.message());
                    self.event(pod, EventType::Warning, "FailedCreatePodSandBox", message.clone());
                    result.push(SyncResult::failed(
                        SyncAction::CreatePodSandbox,
                        &full_name,
                        SyncFailure::new(reasons::CREATE_POD_SANDBOX_ERROR, message),
                    ));
                    return result;
                }
            }
            let request = pb::PodSandboxStatusRequest { pod_sandbox_id: sandbox_id.clone(), verbose: false };
            match self.client.runtime_service().pod_sandbox_status(request).await {
                Ok(response) => {
                    pod_ips = response.into_inner().status.map(|s| convert::sandbox_status(&s).ips).unwrap_or_default();
                }
                Err(status) => {
                    result.failure = Some(SyncFailure::new(
                        reasons::CREATE_POD_SANDBOX_ERROR,
                        format!("cannot read the new sandbox: {}", status.message()),
                    ));
                    return result;
                }
            }
        }
        let sandbox_config =
            sandbox::sandbox_config(pod, actions.attempt, &log_dir, &self.config.cgroup_root, &host_dns);

        // Step 4: ephemeral, then the next init container, then regular containers.
        for &i in &actions.ephemeral_containers_to_start {
            let Some(ephemeral) = spec.ephemeral_containers.as_ref().and_then(|e| e.get(i)) else { continue };
            let as_container = ApiContainer {
                name: ephemeral.name.clone(),
                image: ephemeral.image.clone(),
                command: ephemeral.command.clone(),
                args: ephemeral.args.clone(),
                env: ephemeral.env.clone(),
                working_dir: ephemeral.working_dir.clone(),
                image_pull_policy: ephemeral.image_pull_policy.clone(),
                security_context: ephemeral.security_context.clone(),
                stdin: ephemeral.stdin,
                tty: ephemeral.tty,
                ..ApiContainer::default()
            };
            let outcome =
                self.start_container(pod, status, &as_container, &sandbox_id, &sandbox_config, &pod_ips, backoff).await;
            result.push(match outcome {
                Ok(()) => SyncResult::ok(SyncAction::StartContainer, &as_container.name),
                Err(failure) => SyncResult::failed(SyncAction::StartContainer, &as_container.name, failure),
            });
        }
        if let Some(i) = actions.next_init_container
            && let Some(init) = spec.init_containers.as_ref().and_then(|c| c.get(i))
        {
            let outcome =
                self.start_container(pod, status, init, &sandbox_id, &sandbox_config, &pod_ips, backoff).await;
            let failed = outcome.is_err();
            result.push(match outcome {
                Ok(()) => SyncResult::ok(SyncAction::InitContainer, &init.name),
                Err(failure) => SyncResult::failed(SyncAction::InitContainer, &init.name, failure),
            });
            if failed {
                return result;
            }
        }
        for &i in &actions.containers_to_start {
            let Some(c) = spec.containers.get(i) else { continue };
            let outcome = self.start_container(pod, status, c, &sandbox_id, &sandbox_config, &pod_ips, backoff).await;
            result.push(match outcome {
                Ok(()) => SyncResult::ok(SyncAction::StartContainer, &c.name),
                Err(failure) => SyncResult::failed(SyncAction::StartContainer, &c.name, failure),
            });
        }
        result
    }

    async fn kill_pod(
        &self,
        pod: Option<&ApiPod>,
        running: &runtime::Pod,
        grace_override: Option<i64>,
    ) -> Result<(), Error> {
        // Every container at once, each with its own grace period.
        let kills = running.containers.iter().filter(|c| c.state != ContainerState::Exited).map(|c| async move {
            let annotations_grace = None;
            self.kill_container(pod, &c.id, &c.name, annotations_grace, grace_override, "").await
        });
        let results = futures::future::join_all(kills).await;
        if let Some(err) = results.into_iter().find_map(Result::err) {
            return Err(err);
        }
        for sandbox in &running.sandboxes {
            let request = pb::StopPodSandboxRequest { pod_sandbox_id: sandbox.id.clone() };
            match self.client.runtime_service().stop_pod_sandbox(request).await {
                Ok(_) => {}
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) => return Err(Error::status("StopPodSandbox", status)),
            }
        }
        Ok(())
    }

    async fn pull_image(&self, image: &str) -> Result<String, Error> {
        // The semaphore is never closed, so `acquire` only fails if it were; then pull unlimited.
        let _permit = match &self.image_pulls {
            Some(pulls) => pulls.acquire().await.ok(),
            None => None,
        };
        let request = pb::PullImageRequest {
            image: Some(pb::ImageSpec { image: image.to_owned(), ..Default::default() }),
            ..Default::default()
        };
        Ok(self
            .client
            .image_service()
            .pull_image(request)
            .await
            .map_err(|s| Error::status("PullImage", s))?
            .into_inner()
            .image_ref)
    }

    async fn image_ref(&self, image: &str) -> Result<Option<String>, Error> {
        let request = pb::ImageStatusRequest {
            image: Some(pb::ImageSpec { image: image.to_owned(), ..Default::default() }),
            verbose: false,
        };
        let response =
            self.client.image_service().image_status(request).await.map_err(|s| Error::status("ImageStatus", s))?;
        Ok(response.into_inner().image.map(|i| i.id))
    }

    async fn list_images(&self) -> Result<Vec<Image>, Error> {
        let response = self
            .client
            .image_service()
            .list_images(pb::ListImagesRequest { filter: None })
            .await
            .map_err(|s| Error::status("ListImages", s))?;
        Ok(response
            .into_inner()
            .images
            .into_iter()
            .map(|i| {
                let mut image = Image::default();
                image.id = i.id;
                image.repo_tags = i.repo_tags;
                image.repo_digests = i.repo_digests;
                image.size = i.size;
                image.pinned = i.pinned;
                image
            })
            .collect())
    }

    async fn remove_image(&self, image: &str) -> Result<(), Error> {
        let request =
            pb::RemoveImageRequest { image: Some(pb::ImageSpec { image: image.to_owned(), ..Default::default() }) };
        self.client.image_service().remove_image(request).await.map_err(|s| Error::status("RemoveImage", s))?;
        Ok(())
    }

    async fn exec_sync(&self, container_id: &str, cmd: &[String], timeout: Duration) -> Result<ExecResult, Error> {
        let request = pb::ExecSyncRequest {
            container_id: container_id.to_owned(),
            cmd: cmd.to_vec(),
            timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        };
        let response = self
            .client
            .runtime_service()
            .exec_sync(request)
            .await
            .map_err(|s| Error::status("ExecSync", s))?
            .into_inner();
        let mut result = ExecResult::default();
        result.stdout = response.stdout;
        result.stderr = response.stderr;
        result.exit_code = response.exit_code;
        Ok(result)
    }

    async fn remove_pod_content(&self, uid: &PodUid) -> Result<(), Error> {
        let pods = self.get_pods(true).await?;
        let Some(pod) = pods.into_iter().find(|p| p.uid == *uid) else { return Ok(()) };
        if pod.containers.iter().any(|c| c.state == ContainerState::Running)
            || pod.sandboxes.iter().any(|s| s.state == SandboxState::Ready)
        {
            return Err(Error::PodStillRuns { uid: uid.to_string() });
        }
        let api = ApiPod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(pod.name),
                namespace: Some(pod.namespace),
                uid: Some(uid.to_string()),
                ..Default::default()
            },
            ..ApiPod::default()
        };
        self.remove_pod(&api).await
    }

    async fn delete_container(&self, container_id: &str) -> Result<(), Error> {
        let request = pb::RemoveContainerRequest { container_id: container_id.to_owned() };
        match self.client.runtime_service().remove_container(request).await {
            Ok(_) => {}
            Err(status) if status.code() == tonic::Code::NotFound => {}
            Err(status) => return Err(Error::status("RemoveContainer", status)),
        }
        // Its legacy log symlink goes with it.
        if let Ok(mut entries) = tokio::fs::read_dir(&self.config.container_logs_dir).await {
            while let Ok(Some(entry)) = entries.next_entry().await {
                if entry.file_name().to_string_lossy().ends_with(&format!("-{container_id}.log")) {
                    let _ = tokio::fs::remove_file(entry.path()).await;
                }
            }
        }
        Ok(())
    }

    async fn garbage_collect(
        &self,
        policy: &GcPolicy,
        _all_sources_ready: bool,
        _evict_non_deleted_pods: bool,
    ) -> Result<(), Error> {
        let pods = self.get_pods(true).await?;
        let now = k8s_openapi::jiff::Timestamp::from_second(
            i64::try_from(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs(),
            )
            .unwrap_or(0),
        )
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let min_age = i64::try_from(policy.min_age.as_secs()).unwrap_or(i64::MAX);
        let old_enough = |created: Option<k8s_openapi::jiff::Timestamp>| {
            created.is_none_or(|c| now.as_second() - c.as_second() >= min_age)
        };
        for pod in &pods {
            // Dead containers: keep the newest `max_per_pod_container` per name.
            let mut dead_seen: HashMap<&str, i32> = HashMap::new();
            for c in &pod.containers {
                if c.state == ContainerState::Running || !old_enough(c.created_at) {
                    continue;
                }
                let seen = dead_seen.entry(c.name.as_str()).or_default();
                *seen += 1;
                if policy.max_per_pod_container >= 0 && *seen > policy.max_per_pod_container {
                    self.delete_container(&c.id).await?;
                }
            }
            // Dead sandboxes, except the newest of the pod (it holds the pod's last IP and logs).
            for s in pod.sandboxes.iter().skip(1).filter(|s| s.state == SandboxState::NotReady) {
                let request = pb::RemovePodSandboxRequest { pod_sandbox_id: s.id.clone() };
                self.client
                    .runtime_service()
                    .remove_pod_sandbox(request)
                    .await
                    .map_err(|st| Error::status("RemovePodSandbox", st))?;
            }
        }
        Ok(())
    }
}

impl kubelet_core::runtime::RuntimeEvents for CriRuntime {
    async fn stream_events(
        &self,
        events: tokio::sync::mpsc::Sender<kubelet_core::runtime::ContainerEvent>,
    ) -> Result<(), kubelet_core::runtime::EventStreamError> {
        use kubelet_core::runtime::EventStreamError;
        let mut stream = match self.client.runtime_service().get_container_events(pb::GetEventsRequest {}).await {
            Ok(response) => response.into_inner(),
            Err(status) if status.code() == tonic::Code::Unimplemented => return Err(EventStreamError::Unimplemented),
            Err(status) => return Err(EventStreamError::Failed(status.to_string())),
        };
        loop {
            match stream.message().await {
                Ok(Some(message)) => {
                    let Some(event) = convert::container_event(&message) else {
                        debug!(container.id = %message.container_id, "ignoring a container event without a pod sandbox status");
                        continue;
                    };
                    if events.send(event).await.is_err() {
                        return Ok(());
                    }
                }
                Ok(None) => {
                    return Err(EventStreamError::Failed("the runtime closed the container event stream".to_owned()));
                }
                Err(status) => return Err(EventStreamError::Failed(status.to_string())),
            }
        }
    }
}

impl CriRuntime {
    /// Removes everything of a pod that is gone: its containers and sandboxes, its pod cgroup and
    /// its log directory (upstream leaves these to GC and housekeeping; this does all at once).
    pub async fn remove_pod(&self, pod: &ApiPod) -> Result<(), Error> {
        let (name, namespace, uid) = pod_meta(pod);
        let uid_key = PodUid::new(uid);
        let status = self.get_pod_status(&uid_key, name, namespace).await?;
        let running = Self::running_pod_of(&status);
        self.kill_pod(Some(pod), &running, Some(0)).await?;
        for c in &status.container_statuses {
            self.delete_container(&c.id).await?;
        }
        for s in &status.sandbox_statuses {
            let request = pb::RemovePodSandboxRequest { pod_sandbox_id: s.id.clone() };
            self.client
                .runtime_service()
                .remove_pod_sandbox(request)
                .await
                .map_err(|st| Error::status("RemovePodSandbox", st))?;
        }
        let parents: Vec<String> = ["", "burstable/", "besteffort/"]
            .iter()
            .map(|qos| format!("{}/{qos}pod{uid}", self.config.cgroup_root.trim_end_matches('/')))
            .collect();
        self.cleanup_pod(uid, name, namespace, &parents).await;
        let pod_dir = self.config.pods_dir.join(uid);
        if pod_dir.exists()
            && let Err(err) = tokio::fs::remove_dir_all(&pod_dir).await
        {
            warn!(error = %err, dir = %pod_dir.display(), "cannot remove the pod directory");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_messages_and_tails() {
        let text = "2026-11-22T07:41:24.897821647Z stdout F hello\n2026-11-22T07:41:24.9Z stderr P part\n2026-11-22T07:41:24.9Z stderr F ial\n";
        assert_eq!(log_message(text), "hello\npartial\n");
        let dir = std::env::temp_dir().join(format!("tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("0.log");
        let lines: String = (0..200).map(|i| format!("2026-11-22T07:41:24Z stdout F line {i}\n")).collect();
        std::fs::write(&log, lines).unwrap();
        let tail = log_tail(&log);
        assert!(tail.ends_with("line 199\n") && !tail.contains("line 119\n"), "80 lines at most");
        std::fs::write(&log, format!("2026-11-22T07:41:24Z stdout F {}\n", "x".repeat(5000))).unwrap();
        assert_eq!(log_tail(&log).len(), MAX_LOG_TAIL_BYTES, "2 KiB at most");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
