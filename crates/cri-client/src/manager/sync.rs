//! `SyncPod` in upstream's order: kill what must go, prune init containers, make the sandbox,
//! then start ephemeral, init and regular containers, each behind the crash-loop backoff.

use super::*;
use crate::hosts;

/// The mode of a pod's directory where this manager makes it (upstream's 0750).
const POD_DIR_MODE: u32 = 0o750;

/// The `container_type` label of upstream's container metrics.
pub(super) fn container_type(pod: &ApiPod, name: &str) -> &'static str {
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.init_containers.as_ref()).is_some_and(|c| c.iter().any(|c| c.name == name)) {
        "init_container"
    } else if spec.and_then(|s| s.ephemeral_containers.as_ref()).is_some_and(|c| c.iter().any(|c| c.name == name)) {
        "ephemeral_container"
    } else {
        "container"
    }
}

/// The crash-loop backoff key (upstream `getStableKey`).
pub(super) fn backoff_key(pod: &ApiPod, container: &ApiContainer) -> String {
    let (name, namespace, uid) = pod_meta(pod);
    format!("{name}_{namespace}_{uid}_{}_{:x}", container.name, actions::hash(container))
}

/// The highest `N` of `N.log` files in a container's log directory, plus one (0 when none).
pub(super) fn restart_count_from_logs(dir: &Path) -> u32 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| name.split('.').next().and_then(|n| n.parse::<u32>().ok()).filter(|_| name.contains(".log")))
        .max()
        .map_or(0, |n| n + 1)
}

impl CriRuntime {
    /// Starts one container (upstream `startContainer`, after `doBackOff`).
    #[allow(clippy::too_many_arguments)] // Reason: the steps of one start, as upstream threads them.
    pub(super) async fn start_container(
        &self,
        pod: &ApiPod,
        status: &PodStatus,
        start: StartSpec<'_>,
        sandbox_id: &str,
        sandbox_config: &pb::PodSandboxConfig,
        pod_ips: &[String],
        backoff: &Backoff,
        volumes: &PodVolumes,
    ) -> Result<(), SyncFailure> {
        let spec = start.container;
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
        let (image_ref, image_user) = self.ensure_image(pod, spec).await?;
        let log_dir = self.pod_log_dir(pod);
        let restart_count = match previous {
            Some(p) => p.restart_count + 1,
            None => restart_count_from_logs(&log_dir.join(&spec.name)),
        };
        let image_user = match image_user {
            Some(user) => user,
            None => self.image_user(&image_ref).await,
        };
        let config_error = |message: String| {
            self.event(pod, EventType::Warning, "Failed", format!("Error: {message}"));
            SyncFailure::new(reasons::CREATE_CONTAINER_CONFIG_ERROR, message)
        };
        let pid_target = start.target_id(status).map_err(config_error)?;
        let env_objects = self.env_objects(pod, spec).await.map_err(config_error)?;
        // A host-network pod's IPs are the node's (upstream gives them to its downward API).
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        let node_ips = self.config.node_ips();
        let pod_ips = if host_network && pod_ips.is_empty() { &node_ips[..] } else { pod_ips };
        let downward = container::Downward {
            pod_ips,
            node_name: &self.config.node_name,
            host_ips: &node_ips,
            allocatable: &self.config.allocatable,
        };
        let env = container::environment(pod, spec, &downward, &env_objects).map_err(config_error)?;
        for message in &env.invalid_names {
            self.event(pod, EventType::Warning, "InvalidEnvironmentVariableNames", message.clone());
        }
        // After the environment, as upstream's `makeMounts`: a `subPathExpr` expands with it.
        let sub_paths = self.prepare_sub_paths(pod, spec, volumes, &env.vars).await.map_err(config_error)?;
        let input = container::ConfigInput {
            pod,
            container: spec,
            restart_count,
            image_ref: &image_ref,
            image_user: &image_user,
            env: &env.vars,
            memory_capacity: self.memory_capacity,
            hugepage_sizes: &self.config.hugepage_sizes,
            volumes,
            sub_paths: &sub_paths,
            seccomp_profiles: &self.config.seccomp_dir,
            pid_target: pid_target.as_deref(),
        };
        let mut config = container::container_config(&input).map_err(config_error)?;
        if let Some(hosts) = self.etc_hosts_mount(pod, spec, pod_ips).await.map_err(config_error)? {
            config.mounts.push(hosts);
        }
        // The termination message file: a host file mounted at `terminationMessagePath`.
        if let Some(path) = spec.termination_message_path.as_deref().filter(|p| !p.is_empty()) {
            let dir = self.config.pods_dir.join(pod_meta(pod).2).join("containers").join(&spec.name);
            let file = dir.join(format!("{restart_count}-termination-log"));
            let created = async {
                tokio::fs::DirBuilder::new().recursive(true).mode(POD_DIR_MODE).create(&dir).await?;
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
                // Upstream's `selinux.GetEnabled()`: relabelled where SELinux is on.
                selinux_relabel: std::path::Path::new("/sys/fs/selinux/enforce").exists(),
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
        self.post_start(pod, spec, &id, pod_ips).await
    }

    /// Runs the container's postStart hook, if any; a failure kills the container (upstream
    /// `startContainer` step 4): event `FailedPostStartHook`, waiting reason `PostStartHookError`.
    async fn post_start(
        &self,
        pod: &ApiPod,
        spec: &ApiContainer,
        id: &str,
        pod_ips: &[String],
    ) -> Result<(), SyncFailure> {
        let Some(handler) = spec.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else { return Ok(()) };
        let Some(hooks) = &self.hooks else { return Ok(()) };
        let ip = if handler.http_get.is_some() { self.hook_ip(pod, pod_ips).await } else { None };
        let target = kubelet_core::hook::Target::new(pod, spec, id, ip.as_deref());
        let Err(err) = hooks.run(self, target, handler).await else { return Ok(()) };
        warn!(error = %err, container.name = %spec.name, "the postStart hook failed");
        // The message stays out of the event, as upstream's: it may carry secrets.
        self.event(pod, EventType::Warning, "FailedPostStartHook", "PostStartHook failed".to_owned());
        if let Err(kill) = self.kill_container(Some(pod), id, &spec.name, None, None, "FailedPostStartHook").await {
            warn!(error = %kill, container.name = %spec.name, "cannot kill the container whose postStart hook failed");
        }
        Err(SyncFailure::new(reasons::POST_START_HOOK_ERROR, err.to_string()))
    }

    /// Removes every exited instance of each init container but the newest
    /// (upstream `pruneInitContainersBeforeStart`), or all of them when `all`.
    pub(super) async fn prune_init_containers(&self, pod: &ApiPod, status: &PodStatus, all: bool) {
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

    /// What pods' DNS is built from, with the node's resolver read now.
    pub(super) async fn dns(&self) -> Dns {
        let host = match &self.config.resolv_conf {
            Some(path) => Some(sandbox::parse_resolv_conf(&tokio::fs::read_to_string(path).await.unwrap_or_default())),
            None => None,
        };
        Dns { host, cluster_dns: self.config.cluster_dns.clone(), cluster_domain: self.config.cluster_domain.clone() }
    }
}

impl CriRuntime {
    /// Writes the pod's managed hosts file ([`crate::hosts`]) and returns its mount, for a
    /// container that mounts nothing at `/etc/hosts`; nothing for a pod on its own network whose
    /// IPs are not known, as upstream. The file is written anew for each container, as upstream
    /// writes it, and never through a link. It is mounted writable, as upstream mounts it.
    async fn etc_hosts_mount(
        &self,
        pod: &ApiPod,
        spec: &ApiContainer,
        pod_ips: &[String],
    ) -> Result<Option<pb::Mount>, String> {
        if !hosts::wanted_by(spec) {
            return Ok(None);
        }
        let text = if pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false) {
            let node = tokio::fs::read_to_string(hosts::ETC_HOSTS)
                .await
                .map_err(|e| format!("cannot read the node's {}: {e}", hosts::ETC_HOSTS))?;
            hosts::host_network(&node, hosts::aliases(pod))
        } else if pod_ips.is_empty() {
            return Ok(None);
        } else {
            let domain = hosts::domain(pod, &self.config.cluster_domain);
            hosts::managed(pod_ips, &sandbox::hostname(pod), &domain, hosts::aliases(pod))
        };
        let pod_dir = self.config.pods_dir.join(pod_meta(pod).2);
        let file = pod_dir.join(hosts::FILE_NAME);
        let written = async {
            tokio::fs::DirBuilder::new().recursive(true).mode(POD_DIR_MODE).create(&pod_dir).await?;
            write_without_following(&file, text.as_bytes()).await
        };
        written.await.map_err(|e| format!("cannot write the pod's hosts file {}: {e}", file.display()))?;
        Ok(Some(pb::Mount {
            container_path: hosts::ETC_HOSTS.to_owned(),
            host_path: file.display().to_string(),
            // The file is the pod's own: relabelled for its SELinux label, as upstream's.
            selinux_relabel: true,
            ..pb::Mount::default()
        }))
    }

    /// The request that runs `pod`'s sandbox (upstream `createPodSandbox`): its config, and the
    /// handler of its runtime class (the runtime's default handler without one), or why it
    /// cannot be made, in upstream's words.
    async fn sandbox_request(
        &self,
        pod: &ApiPod,
        attempt: u32,
        log_dir: &Path,
        dns: &sandbox::Dns,
    ) -> Result<pb::RunPodSandboxRequest, String> {
        let config = sandbox::sandbox_config(pod, attempt, log_dir, &self.config.cgroup_root, dns)?;
        let runtime_handler = self.runtime_handler(pod).await?;
        Ok(pb::RunPodSandboxRequest { config: Some(config), runtime_handler })
    }

    /// The handler of `pod`'s runtime class, looked up in the object source's runtime classes
    /// (upstream's runtime class manager), or the runtime's default handler for a pod without
    /// a class.
    async fn runtime_handler(&self, pod: &ApiPod) -> Result<String, String> {
        let class = pod.spec.as_ref().and_then(|s| s.runtime_class_name.as_deref()).filter(|c| !c.is_empty());
        let Some(class) = class else { return Ok(self.config.runtime_handler.clone()) };
        let no_classes = || format!("no runtime classes to look runtime class {class:?} up in");
        let source = self.objects.as_ref().ok_or_else(no_classes)?;
        let handler = source.runtime_handler(class).await?.ok_or_else(no_classes)?;
        debug!(runtime_class = class, handler = %handler, "running the pod with its runtime class's handler");
        Ok(handler)
    }

    /// Reads the config maps and secrets the container's environment names, and the services
    /// whose variables it gets, from the runtime's object source; without one, none is read (the
    /// environment then says so of a config map or secret, and has no service variables).
    ///
    /// As upstream, a pod from the API server waits until the services have been listed once,
    /// so that no container misses `KUBERNETES_SERVICE_HOST` after a restart; a static pod does
    /// not wait for the API server.
    async fn env_objects(&self, pod: &ApiPod, spec: &ApiContainer) -> Result<container::EnvObjects, String> {
        let mut objects = container::EnvObjects::default();
        let Some(source) = &self.objects else { return Ok(objects) };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        match source.services(namespace).await {
            Ok(services) => objects.services = services.unwrap_or_default(),
            Err(error) if kubelet_core::types::is_static_pod(pod) => {
                debug!(%error, "a static pod starts without service variables");
            }
            Err(error) => {
                warn!(%error, "services have not been listed");
                return Err("services have not yet been read at least once, cannot construct envvars".to_owned());
            }
        }
        let (config_maps, secrets) = container::EnvObjects::references(spec);
        for name in config_maps {
            let data = source.config_map_text(pod, &name).await?;
            objects.config_maps.insert(name, data);
        }
        for name in secrets {
            let data = source.secret(pod, &name).await?;
            objects.secrets.insert(name, data);
        }
        Ok(objects)
    }

    /// Prepares each `subPath` of the container's mounts (upstream `makeMounts` with
    /// `PrepareSafeSubpath`) with the runtime's [`SubPathMounter`](kubelet_core::volume::SubPathMounter).
    /// As upstream, the error the pod shows does not say what was found on the host; the log does.
    async fn prepare_sub_paths(
        &self,
        pod: &ApiPod,
        spec: &ApiContainer,
        volumes: &PodVolumes,
        env: &[(String, String)],
    ) -> Result<container::SubPathMounts, String> {
        let mut prepared = container::SubPathMounts::new();
        for (index, mount) in spec.volume_mounts.iter().flatten().enumerate() {
            // A volume that is not there is the mounts' error to tell, as upstream's first.
            let Some(volume) = volumes.get(&mount.name) else { continue };
            let Some(sub_path) = container::sub_path_of(mount, env)? else { continue };
            let sub_path = sub_path.as_str();
            kubelet_core::volume::validate_sub_path(sub_path)?;
            let Some(mounter) = &self.sub_paths else {
                return Err(format!(
                    "volumeMount {:?} of container {:?} has a subPath, and this runtime has no subPath mounter",
                    mount.name, spec.name
                ));
            };
            let uid = PodUid::of(pod);
            let request = kubelet_core::volume::SubPath::new(uid, (&mount.name, volume), &spec.name, index, sub_path);
            match mounter.prepare(&request).await {
                Ok(target) => {
                    prepared.insert(index, target);
                }
                Err(error) => {
                    warn!(volume = %mount.name, container = %spec.name, %error, "cannot prepare a subPath");
                    return Err(format!(
                        "failed to prepare subPath for volumeMount {:?} of container {:?}",
                        mount.name, spec.name
                    ));
                }
            }
        }
        Ok(prepared)
    }
}

/// The pods whose RunPodSandbox is in flight, each counted while its call runs: a pod whose
/// sync was cancelled is still here until the runtime has answered.
#[derive(Clone, Debug, Default)]
pub(super) struct StartingSandboxes(Arc<std::sync::Mutex<HashMap<PodUid, usize>>>);

impl StartingSandboxes {
    /// Whether a RunPodSandbox of pod `uid` is in flight.
    pub(super) fn contains(&self, uid: &PodUid) -> bool {
        self.lock().contains_key(uid)
    }

    /// Counts a call for pod `uid` until the returned guard drops.
    fn start(&self, uid: PodUid) -> StartingSandbox {
        *self.lock().entry(uid.clone()).or_default() += 1;
        StartingSandbox { set: self.clone(), uid }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PodUid, usize>> {
        // A panic while holding the lock leaves the counts whole: each change is one statement.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One RunPodSandbox in flight, counted in its [`StartingSandboxes`] until dropped.
struct StartingSandbox {
    set: StartingSandboxes,
    uid: PodUid,
}

impl Drop for StartingSandbox {
    fn drop(&mut self) {
        let mut counts = self.set.lock();
        if let Some(count) = counts.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.uid);
            }
        }
    }
}

/// Asks the runtime for a sandbox and lets the call finish even when the sync that made it is
/// cancelled (the pod was deleted, or its grace period cut, while it started); `starting` holds
/// the pod until the runtime answers, so that nothing kills the processes of the sandbox being
/// made in the pod's cgroup meanwhile.
///
/// containerd 1.6 keeps the shim of a RunPodSandbox cancelled in flight running after it forgets
/// the sandbox (containerd issues 6860, 8931 and 9309), and no CRI call can reach that shim again.
/// A sandbox that finishes is seen by the next relist and removed with its pod like any other.
/// The spawned call ends by itself: the client's request timeout bounds it.
async fn run_sandbox_to_completion(
    mut client: pb::runtime_service_client::RuntimeServiceClient<crate::CriChannel>,
    request: pb::RunPodSandboxRequest,
    starting: StartingSandbox,
) -> Result<tonic::Response<pb::RunPodSandboxResponse>, tonic::Status> {
    let call = tokio::spawn(async move {
        let answer = client.run_pod_sandbox(request).await;
        drop(starting);
        answer
    });
    match call.await {
        Ok(answer) => answer,
        Err(ended) => Err(tonic::Status::internal(format!("the RunPodSandbox call ended early: {ended}"))),
    }
}

/// Writes `bytes` to `file` (mode 0644), refusing to follow a link in its place.
async fn write_without_following(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    use tokio::io::AsyncWriteExt as _;
    let mut out = tokio::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(file)
        .await?;
    out.write_all(bytes).await?;
    out.set_permissions(std::fs::Permissions::from_mode(0o644)).await?;
    out.flush().await
}

/// A container to start (upstream's `startSpec`): the container, and for an ephemeral one the
/// container whose process namespace it joins.
#[derive(Clone, Copy)]
pub(super) struct StartSpec<'a> {
    container: &'a ApiContainer,
    /// The `targetContainerName` of an ephemeral container.
    pid_target: Option<&'a str>,
}

impl<'a> StartSpec<'a> {
    fn of(container: &'a ApiContainer) -> Self {
        StartSpec { container, pid_target: None }
    }

    /// The runtime ID of the target container, which must run (upstream `getTargetID`).
    fn target_id(&self, status: &PodStatus) -> Result<Option<String>, String> {
        let Some(name) = self.pid_target else { return Ok(None) };
        match status.container_status(name).filter(|c| c.state == ContainerState::Running) {
            Some(target) => Ok(Some(target.id.clone())),
            None => Err(format!("unable to find target container {name}")),
        }
    }
}

pub(super) async fn sync_pod(
    rt: &CriRuntime,
    pod: &ApiPod,
    status: &PodStatus,
    backoff: &Backoff,
    results: &kubelet_core::ProbeResults,
    volumes: &PodVolumes,
) -> PodSyncResult {
    let mut result = PodSyncResult::default();
    let full_name = kubelet_core::types::pod_full_name(pod);
    let probes = ProbeVerdicts::of(results, status);
    let actions = compute_pod_actions(pod, status, &probes);
    debug!(pod = %full_name, ?actions, "computed pod actions");
    let Some(spec) = pod.spec.as_ref() else {
        result.failure = Some(SyncFailure::new(reasons::CONFIG_POD_SANDBOX_ERROR, "pod has no spec"));
        return result;
    };

    // Step 1: kill the pod, or the containers that must go.
    if actions.kill_pod {
        // Upstream records SandboxChanged only when there is an old sandbox to replace.
        if actions.create_sandbox && !actions.sandbox_id.is_empty() {
            rt.event(
                pod,
                EventType::Normal,
                "SandboxChanged",
                "Pod sandbox changed, it will be killed and re-created.".to_owned(),
            );
        } else if actions.create_sandbox {
            debug!(pod = %full_name, "SyncPod received new pod, will create a sandbox for it");
        }
        let running = status.to_running_pod();
        if let Err(err) = rt.kill_pod(Some(pod), &running, None).await {
            result.push(SyncResult::failed(
                SyncAction::KillPodSandbox,
                &full_name,
                SyncFailure::new(reasons::KILL_POD_SANDBOX_ERROR, err.to_string()),
            ));
            return result;
        }
        if actions.create_sandbox {
            rt.prune_init_containers(pod, status, true).await;
        }
    } else {
        for kill in &actions.containers_to_kill {
            match rt.kill_container(Some(pod), &kill.id, &kill.name, kill.grace_period, None, &kill.message).await {
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
    if !actions.init_containers_to_start.is_empty() && !actions.create_sandbox {
        rt.prune_init_containers(pod, status, false).await;
    }

    // A resync of a pod that needs nothing reads no file: the sandbox config (and the host's
    // resolv.conf in it) is built only when something is created.
    let creates = actions.create_sandbox
        || !actions.ephemeral_containers_to_start.is_empty()
        || !actions.init_containers_to_start.is_empty()
        || !actions.containers_to_start.is_empty();
    if !creates {
        return result;
    }

    // Step 3: a new sandbox, if needed.
    let dns = rt.dns().await;
    let log_dir = rt.pod_log_dir(pod);
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
        if dns.cluster_dns.is_empty() && sandbox::wants_cluster_dns(pod) {
            let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
            let message = format!(
                "kubelet does not have ClusterDNS IP configured and cannot create Pod using {policy:?} policy. Falling back to \"Default\" policy."
            );
            rt.event(pod, EventType::Warning, "MissingClusterDNS", message);
        }
        // Counted as upstream counts them: a start whose request cannot be made failed too.
        metrics::counter!("kubelet_started_pods_total").increment(1);
        let request = match rt.sandbox_request(pod, actions.attempt, &log_dir, &dns).await {
            Ok(request) => request,
            Err(message) => {
                metrics::counter!("kubelet_started_pods_errors_total").increment(1);
                // Upstream's words: the request could not be made, so the sandbox was not created.
                rt.event(
                    pod,
                    EventType::Warning,
                    "FailedCreatePodSandBox",
                    format!("Failed to create pod sandbox: {message}"),
                );
                let failure = SyncFailure::new(reasons::CREATE_POD_SANDBOX_ERROR, message);
                result.push(SyncResult::failed(SyncAction::CreatePodSandbox, &full_name, failure));
                return result;
            }
        };
        let starting = rt.sandboxes_starting.start(PodUid::of(pod));
        match run_sandbox_to_completion(rt.client.runtime_service(), request, starting).await {
            Ok(response) => {
                sandbox_id = response.into_inner().pod_sandbox_id;
                result.push(SyncResult::ok(SyncAction::CreatePodSandbox, &full_name));
            }
            Err(status) => {
                metrics::counter!("kubelet_started_pods_errors_total").increment(1);
                let message = format!("Failed to create pod sandbox: {}", status.message());
                rt.event(pod, EventType::Warning, "FailedCreatePodSandBox", message.clone());
                result.push(SyncResult::failed(
                    SyncAction::CreatePodSandbox,
                    &full_name,
                    SyncFailure::new(reasons::CREATE_POD_SANDBOX_ERROR, message),
                ));
                return result;
            }
        }
        let request = pb::PodSandboxStatusRequest { pod_sandbox_id: sandbox_id.clone(), verbose: false };
        match rt.client.runtime_service().pod_sandbox_status(request).await {
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
    let sandbox_config = match sandbox::sandbox_config(pod, actions.attempt, &log_dir, &rt.config.cgroup_root, &dns) {
        Ok(config) => config,
        // Only when the config changed under a running sandbox (another `clusterDomain` after a
        // restart): its containers cannot be configured as its sandbox was.
        Err(message) => {
            result.failure = Some(SyncFailure::new(reasons::CREATE_POD_SANDBOX_ERROR, message));
            return result;
        }
    };

    // Step 4: ephemeral, then the next init container, then regular containers.
    for &i in &actions.ephemeral_containers_to_start {
        let Some(ephemeral) = spec.ephemeral_containers.as_ref().and_then(|e| e.get(i)) else { continue };
        let as_container = kubelet_core::types::ephemeral_as_container(ephemeral);
        let target = ephemeral.target_container_name.as_deref().filter(|name| !name.is_empty());
        let start = StartSpec { container: &as_container, pid_target: target };
        let outcome =
            rt.start_container(pod, status, start, &sandbox_id, &sandbox_config, &pod_ips, backoff, volumes).await;
        result.push(match outcome {
            Ok(()) => SyncResult::ok(SyncAction::StartContainer, &as_container.name),
            Err(failure) => SyncResult::failed(SyncAction::StartContainer, &as_container.name, failure),
        });
    }
    for &i in &actions.init_containers_to_start {
        let Some(init) = spec.init_containers.as_ref().and_then(|c| c.get(i)) else { continue };
        let start = StartSpec::of(init);
        let outcome =
            rt.start_container(pod, status, start, &sandbox_id, &sandbox_config, &pod_ips, backoff, volumes).await;
        let failed = outcome.is_err();
        result.push(match outcome {
            Ok(()) => SyncResult::ok(SyncAction::InitContainer, &init.name),
            Err(failure) => SyncResult::failed(SyncAction::InitContainer, &init.name, failure),
        });
        // A sidecar that cannot start yet (a back-off) holds back nothing after it; a regular
        // init container does.
        if failed && !kubelet_core::types::is_sidecar(init) {
            return result;
        }
    }
    for &i in &actions.containers_to_start {
        let Some(c) = spec.containers.get(i) else { continue };
        let start = StartSpec::of(c);
        let outcome =
            rt.start_container(pod, status, start, &sandbox_id, &sandbox_config, &pod_ips, backoff, volumes).await;
        result.push(match outcome {
            Ok(()) => SyncResult::ok(SyncAction::StartContainer, &c.name),
            Err(failure) => SyncResult::failed(SyncAction::StartContainer, &c.name, failure),
        });
    }
    result
}
