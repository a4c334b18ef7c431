//! The agent's local API (feature `server`), as upstream's read-only port serves it: `/healthz`,
//! `/pods` and `/metrics` (Prometheus text), its debugging handlers answering 405; and on the
//! unix socket under the root directory (and as the kubelet API, behind its authentication)
//! also upstream's `/runningpods/`, `/containerLogs/{namespace}/{pod}/{container}`, `/exec`,
//! `/attach`, `/portForward` and `/run`, and `/events/{namespace}/{pod}`, which `kubelet-rs
//! get`, `describe` and `logs` use.
//!
//! [`ApiState::of`] reads an [`Agent`]; [`local_router`], [`read_only_router`] and
//! [`healthz_router`] are the three APIs; [`serve_unix`] and [`serve`] run one until cancelled,
//! within `kubelet-server`'s bounds of every listener.

mod logs;
mod stream;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use axum::{
    Json, Router,
    body::Body,
    extract::{Path as UrlPath, Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{any, get, post},
};
use k8s_openapi::{
    List,
    api::core::v1::{Container, Pod, PodSpec},
    apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta},
};
use kubelet_core::{LoopHealth, Pleg, PodManager, PodUid, PodWorkers, Runtime, events::RingRecorder};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span};

use crate::{Agent, StatusStore};

/// The local API could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another agent serves the socket.
    #[error("{} is in use: another agent runs with this root directory", .0.display())]
    InUse(PathBuf),
    /// The socket or port could not be set up.
    #[error("cannot listen on {what}")]
    Listen {
        /// The socket path or address.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Renders the Prometheus text of the metrics an agent installed (the binary's exporter).
pub type MetricsRender = Arc<dyn Fn() -> String + Send + Sync>;

/// What the API reads.
#[non_exhaustive]
pub struct ApiState<R> {
    /// The desired pods.
    pub pods: Arc<PodManager>,
    /// The statuses the kubelet computed.
    pub statuses: Arc<StatusStore>,
    /// The runtime, for `/runningpods/`.
    pub runtime: Arc<R>,
    /// The sync loop's health, for `/healthz`.
    pub loop_health: Arc<LoopHealth>,
    /// The PLEG's health, for `/healthz`.
    pub pleg_health: Arc<dyn Fn() -> Result<(), String> + Send + Sync>,
    /// `/metrics`, when the agent exports metrics (without: 404).
    pub metrics: Option<MetricsRender>,
    /// `podLogsDir`, where `/containerLogs` reads.
    pub pod_logs_dir: PathBuf,
    /// The recent events, for `/events`.
    pub events: Arc<RingRecorder>,
    /// The runtime's health from the status poll, for `/healthz`.
    pub runtime_state: Arc<kubelet_core::RuntimeState>,
    /// How long an exec, attach or port-forward session may go without a byte either way
    /// (`streamingConnectionIdleTimeout`).
    pub streaming_idle_timeout: Duration,
    /// What `/pods` made of each pod.
    pods_json: PodsJson,
}

impl<R: Runtime> ApiState<R> {
    /// What `agent` knows, with the events it records in `events` and the container logs under
    /// `pod_logs_dir`; no `/metrics` until [`ApiState::metrics`].
    pub fn of<P: Pleg + 'static, W: PodWorkers>(
        agent: &Agent<R, P, W>,
        events: Arc<RingRecorder>,
        pod_logs_dir: impl Into<PathBuf>,
    ) -> Self {
        let pleg = agent.pleg().clone();
        ApiState {
            pods: agent.pods().clone(),
            statuses: agent.statuses().clone(),
            runtime: agent.runtime().clone(),
            loop_health: agent.loop_health().clone(),
            pleg_health: Arc::new(move || pleg.healthy().map_err(|e| e.to_string())),
            metrics: None,
            pod_logs_dir: pod_logs_dir.into(),
            events,
            runtime_state: agent.runtime_state().clone(),
            streaming_idle_timeout: STREAMING_IDLE_TIMEOUT,
            pods_json: PodsJson::default(),
        }
    }

    /// Closes an exec, attach or port-forward session that goes `timeout` without a byte either
    /// way (4 h until set, upstream's default `streamingConnectionIdleTimeout`).
    #[must_use]
    pub fn streaming_idle_timeout(mut self, timeout: Duration) -> Self {
        self.streaming_idle_timeout = timeout;
        self
    }

    /// Serves `/metrics` with `render`'s text (and the process metrics).
    #[must_use]
    pub fn metrics(mut self, render: MetricsRender) -> Self {
        self.metrics = Some(render);
        self
    }
}

/// Upstream's default `streamingConnectionIdleTimeout`.
const STREAMING_IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 3600);

/// A `PodList` of `items`, as upstream's `/pods` and `/runningpods/` answer: serialized straight
/// from the pods, not through a JSON value tree, which doubled the work of every read.
fn pod_list(items: Vec<Pod>) -> Json<List<Pod>> {
    Json(List { items, metadata: ListMeta::default() })
}

impl<R: Runtime> ApiState<R> {
    /// The agent's health as `/healthz` checks it: the sync loop, the PLEG and (beyond upstream)
    /// the runtime; `Err` names the first failed check (`[-]pleg failed: ...`).
    pub fn health(&self) -> Result<(), String> {
        if let Err(err) = self.loop_health.check() {
            return Err(format!("[-]syncloop failed: {err}"));
        }
        if let Err(err) = (self.pleg_health)() {
            return Err(format!("[-]pleg failed: {err}"));
        }
        // Not in upstream's /healthz: a runtime that is gone makes the node useless, so say so.
        if let Some(err) = self.runtime_state.runtime_down() {
            return Err(format!("[-]runtime failed: {err}"));
        }
        Ok(())
    }
}

async fn healthz<R: Runtime>(State(state): State<Arc<ApiState<R>>>) -> Response {
    match state.health() {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(failed) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{failed}\nhealthz check failed\n")).into_response(),
    }
}

async fn pods<R: Runtime>(State(state): State<Arc<ApiState<R>>>) -> Response {
    let json = state.pods_json.list(state.pods.pods(), &state.statuses);
    ([(header::CONTENT_TYPE, "application/json")], json).into_response()
}

/// What `/pods` made of each pod: its JSON with its stored status, kept while neither changes.
/// A client that polls `/pods` (monitoring agents do, and the bench does every 10 ms while pods
/// start) then costs the agent a copy and a serialization of the pods that changed since, not
/// of every pod: a read of 110 pods took 2.0 ms of the agent's CPU when each was copied and
/// serialized anew.
#[derive(Default)]
struct PodsJson(std::sync::Mutex<std::collections::HashMap<PodUid, PodJson>>);

/// One pod's entry in [`PodsJson`]: the pod it was made from (the same `Arc` while the pod is
/// not updated), the stamp of the status it holds, and the JSON.
struct PodJson {
    pod: Arc<Pod>,
    status_stamp: Option<u64>,
    json: Vec<u8>,
}

impl PodsJson {
    /// The `PodList` of `pods`, each with its status from `statuses`, as JSON: the same document
    /// as [`pod_list`] serializes.
    fn list(&self, pods: Vec<Arc<Pod>>, statuses: &StatusStore) -> Vec<u8> {
        let mut kept = crate::lock(&self.0);
        let mut made = std::collections::HashMap::with_capacity(pods.len());
        let mut json = Vec::with_capacity(kept.values().map(|entry| entry.json.len() + 1).sum::<usize>() + 64);
        json.extend_from_slice(br#"{"apiVersion":"v1","kind":"PodList","items":["#);
        for (i, pod) in pods.into_iter().enumerate() {
            let uid = PodUid::of(&pod);
            let stamp = statuses.stamp(&uid);
            let entry = match kept.remove(&uid) {
                Some(entry) if Arc::ptr_eq(&entry.pod, &pod) && entry.status_stamp == stamp => entry,
                _ => PodJson::of(pod, statuses.get(&uid)),
            };
            if i > 0 {
                json.push(b',');
            }
            json.extend_from_slice(&entry.json);
            made.insert(uid, entry);
        }
        json.extend_from_slice(br#"],"metadata":{}}"#);
        // Only the pods listed now are kept.
        *kept = made;
        json
    }
}

impl PodJson {
    fn of(pod: Arc<Pod>, stored: Option<crate::status_store::StoredStatus>) -> PodJson {
        let status_stamp = stored.as_ref().map(|stored| stored.stamp);
        let mut with_status = (*pod).clone();
        if let Some(stored) = stored {
            with_status.status = Some(stored.status);
        }
        // A pod has string keys and no floats, so this does not fail; if it did, the list
        // stays a valid document.
        let json = serde_json::to_vec(&with_status).unwrap_or_else(|err| {
            tracing::warn!(pod.uid = %PodUid::of(&pod), "a pod did not serialize for /pods: {err}");
            b"{}".to_vec()
        });
        PodJson { pod, status_stamp, json }
    }
}

async fn running_pods<R: Runtime>(State(state): State<Arc<ApiState<R>>>) -> Response {
    match state.runtime.get_pods(false).await {
        Ok(running) => {
            let items = running
                .into_iter()
                .map(|p| Pod {
                    metadata: ObjectMeta {
                        name: Some(p.name),
                        namespace: Some(p.namespace),
                        uid: Some(p.uid.to_string()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(PodSpec {
                        containers: p
                            .containers
                            .into_iter()
                            .map(|c| Container { name: c.name, image: Some(c.image), ..Container::default() })
                            .collect(),
                        ..PodSpec::default()
                    }),
                    ..Pod::default()
                })
                .collect();
            pod_list(items).into_response()
        }
        Err(err) => {
            (StatusCode::INTERNAL_SERVER_ERROR, format!("listing the runtime's pods failed: {err}")).into_response()
        }
    }
}

async fn metrics<R: Runtime>(State(state): State<Arc<ApiState<R>>>) -> Response {
    match &state.metrics {
        Some(render) => {
            let mut text = render();
            text.push_str(&process_metrics());
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
        }
        None => (StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}

/// `/metrics/probes`: upstream's probe metrics alone (`prober_probe_total`,
/// `prober_probe_duration_seconds`).
async fn probe_metrics<R: Runtime>(State(state): State<Arc<ApiState<R>>>) -> Response {
    match &state.metrics {
        Some(render) => {
            let text = families_named(&render(), "prober_probe_");
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
        }
        None => (StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}

/// The metric families of the Prometheus text `text` whose names start with `prefix`: their
/// `# HELP` and `# TYPE` lines and their samples.
fn families_named(text: &str, prefix: &str) -> String {
    let name_of = |line: &str| match line.strip_prefix("# ") {
        Some(comment) => comment.split_whitespace().nth(1).unwrap_or_default().to_owned(),
        None => line.split(['{', ' ']).next().unwrap_or_default().to_owned(),
    };
    let mut kept = String::new();
    for line in text.lines().filter(|line| name_of(line).starts_with(prefix)) {
        kept.push_str(line);
        kept.push('\n');
    }
    kept
}

/// The standard process metrics (as Go's process collector names them), read from `/proc` at
/// scrape time: CPU seconds, resident and virtual memory, open and maximum file descriptors,
/// and the start time.
fn process_metrics() -> String {
    // /proc reports times in USER_HZ, which is 100 on Linux.
    const TICKS: f64 = 100.0;
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|v| v * 1024.0)
    };
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse::<f64>().ok()));
    let open_fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as f64).ok();
    let max_fds = std::fs::read_to_string("/proc/self/limits").ok().and_then(|l| {
        l.lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3))
            .and_then(|v| v.parse::<f64>().ok())
    });
    let cpu = field(14).zip(field(15)).map(|(user, system)| (user + system) / TICKS);
    let start = boot.zip(field(22)).map(|(boot, ticks)| boot + ticks / TICKS);
    let mut out = String::new();
    for (name, kind, help, value) in [
        ("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", cpu),
        ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", kib("VmRSS:")),
        ("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", kib("VmSize:")),
        ("process_open_fds", "gauge", "Number of open file descriptors.", open_fds),
        ("process_max_fds", "gauge", "Maximum number of open file descriptors.", max_fds),
        ("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", start),
    ] {
        if let Some(value) = value {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"));
        }
    }
    out
}

/// Query parameters of `/containerLogs`, as upstream names them.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogQuery {
    #[serde(default)]
    follow: bool,
    #[serde(default)]
    previous: bool,
    tail_lines: Option<i64>,
    limit_bytes: Option<i64>,
    since_seconds: Option<i64>,
    since_time: Option<String>,
    #[serde(default)]
    timestamps: bool,
}

impl LogQuery {
    /// The read these parameters ask for, at `now`; `None` for what upstream's
    /// `ValidatePodLogOptions` refuses (a negative `tailLines`, a `limitBytes` or `sinceSeconds`
    /// under 1, both `sinceSeconds` and `sinceTime`, a `sinceTime` that is not RFC 3339).
    fn options(&self, now: k8s_openapi::jiff::Timestamp) -> Option<logs::LogOptions> {
        let positive = |value: Option<i64>, least: i64| match value {
            None => Some(None),
            Some(v) if v >= least => Some(u64::try_from(v).ok()),
            Some(_) => None,
        };
        let since = match (self.since_seconds, &self.since_time) {
            (Some(_), Some(_)) => return None,
            // Further back than a timestamp goes is the beginning of the log.
            (Some(seconds), None) if seconds >= 1 => Some(
                now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(seconds))
                    .unwrap_or(k8s_openapi::jiff::Timestamp::MIN),
            ),
            (Some(_), None) => return None,
            (None, Some(time)) => Some(time.parse().ok()?),
            (None, None) => None,
        };
        Some(logs::LogOptions {
            tail: positive(self.tail_lines, 0)?,
            limit_bytes: positive(self.limit_bytes, 1)?,
            since,
            timestamps: self.timestamps,
            follow: self.follow && !self.previous,
        })
    }
}

async fn container_logs<R: Runtime>(
    State(state): State<Arc<ApiState<R>>>,
    UrlPath((namespace, name, container)): UrlPath<(String, String, String)>,
    Query(query): Query<LogQuery>,
) -> Response {
    let Some(pod) = state.pods.pod_by_name(&namespace, &name) else {
        return (StatusCode::NOT_FOUND, format!("pod {namespace}/{name} not found\n")).into_response();
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    // Upstream answers 404 for a container its spec does not have; a name is then never joined
    // to a path unchecked (`..`, or `a/b` from `a%2Fb`).
    if !in_spec(&pod, &container) {
        let message = format!("container {container:?} not found in pod {name:?}");
        return (StatusCode::NOT_FOUND, message).into_response();
    }
    let Some(options) = query.options(kubelet_core::clock::wall_now()) else {
        return (StatusCode::UNPROCESSABLE_ENTITY, r#"{"message": "Invalid request."}"#).into_response();
    };
    let dir = kubelet_core::types::pod_log_dir(&state.pod_logs_dir, &namespace, &name, &uid).join(&container);
    let files = match logs::files_for(&dir, query.previous) {
        Ok(files) => files,
        // Upstream's `validateContainerLogStatus`: a 400 that kubectl shows as it is.
        Err(_) if query.previous => {
            let message = format!("previous terminated container {container:?} in pod {name:?} not found");
            return (StatusCode::BAD_REQUEST, message).into_response();
        }
        Err(e) => return (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
    };
    let start = match logs::tail_start(&files, options.tail).await {
        Ok(start) => start,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("cannot read the logs: {e}\n")).into_response(),
    };
    let (sink, chunks) = tokio::sync::mpsc::channel(4);
    let span = info_span!("read_logs", pod.uid = %uid, pod.name = %name, container = %container);
    let still_running = {
        let (statuses, uid) = (state.statuses.clone(), PodUid::from(uid.as_str()));
        Box::new(move || container_running(&statuses, &uid, &container))
    };
    tokio::spawn(logs::send(files, start, options, still_running, sink).instrument(span));
    let stream = futures::stream::unfold(chunks, |mut chunks| async move { chunks.recv().await.map(|c| (c, chunks)) });
    ([(header::CONTENT_TYPE, "text/plain")], Body::from_stream(stream)).into_response()
}

/// Whether `container` of the pod `uid` runs, by the status the kubelet last computed.
fn container_running(statuses: &StatusStore, uid: &PodUid, container: &str) -> bool {
    let Some(stored) = statuses.get(uid) else { return false };
    let status = &stored.status;
    let regular = status.container_statuses.iter().chain(status.init_container_statuses.iter()).flatten();
    let ephemeral = status.ephemeral_container_statuses.iter().flatten();
    regular
        .chain(ephemeral)
        .any(|c| c.name == container && c.state.as_ref().is_some_and(|state| state.running.is_some()))
}

/// Whether `pod`'s spec has a container, init container or ephemeral container named
/// `container` (upstream `GetContainerSpec`), and the name is one path component.
fn in_spec(pod: &Pod, container: &str) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let one_component = !container.is_empty() && !container.contains('/') && container != "." && container != "..";
    let regular = spec.containers.iter().chain(spec.init_containers.iter().flatten()).map(|c| c.name.as_str());
    let ephemeral = spec.ephemeral_containers.iter().flatten().map(|c| c.name.as_str());
    one_component && regular.chain(ephemeral).any(|name| name == container)
}

/// `/events/{namespace}/{pod}`: the events kept about a pod, oldest first, as an EventList.
async fn pod_events<R: Runtime>(
    State(state): State<Arc<ApiState<R>>>,
    UrlPath((namespace, name)): UrlPath<(String, String)>,
) -> Response {
    let Some(pod) = state.pods.pod_by_name(&namespace, &name) else {
        return (StatusCode::NOT_FOUND, format!("pod {namespace}/{name} not found\n")).into_response();
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let items: Vec<serde_json::Value> = state
        .events
        .events_for(&uid)
        .into_iter()
        .map(|e| {
            serde_json::json!({
                "type": e.kind.to_string(),
                "reason": e.reason,
                "message": e.message,
                "lastTimestamp": e.timestamp.to_string(),
                "involvedObject": {"kind": e.object.kind, "namespace": e.object.namespace, "name": e.object.name, "uid": e.object.uid},
            })
        })
        .collect();
    Json(serde_json::json!({ "kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items })).into_response()
}

/// The router of the unix-socket API: the read-only API plus container logs and pod events.
pub fn local_router<R: Runtime>(state: Arc<ApiState<R>>) -> Router {
    let extra = Router::new()
        .route("/containerLogs/{namespace}/{pod}/{container}", get(container_logs::<R>))
        .route("/events/{namespace}/{pod}", get(pod_events::<R>))
        .route("/exec/{namespace}/{pod}/{container}", get(stream::exec::<R>).post(stream::exec::<R>))
        .route("/exec/{namespace}/{pod}/{uid}/{container}", get(stream::exec::<R>).post(stream::exec::<R>))
        .route("/attach/{namespace}/{pod}/{container}", get(stream::attach::<R>).post(stream::attach::<R>))
        .route("/attach/{namespace}/{pod}/{uid}/{container}", get(stream::attach::<R>).post(stream::attach::<R>))
        .route("/portForward/{namespace}/{pod}", get(stream::port_forward::<R>).post(stream::port_forward::<R>))
        .route("/portForward/{namespace}/{pod}/{uid}", get(stream::port_forward::<R>).post(stream::port_forward::<R>))
        .route("/run/{namespace}/{pod}/{container}", post(stream::run::<R>))
        .route("/run/{namespace}/{pod}/{uid}/{container}", post(stream::run::<R>))
        .with_state(state.clone());
    read_only_routes::<R>().route("/runningpods/", get(running_pods::<R>)).with_state(state).merge(extra)
}

/// The unix socket of the local API under the root directory.
pub fn socket_path(root_dir: &Path) -> PathBuf {
    root_dir.join("kubelet-rs.sock")
}

/// Serves `router` on a unix socket only root can open (mode 0600), replacing a stale one, within
/// the local socket's [`Limits`](kubelet_server::Limits).
///
/// The socket is bound under a name of its own, given its mode, and only then renamed into
/// place: no client ever finds it at `path` with a wider mode.
pub async fn serve_unix(
    path: &Path,
    router: Router,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    use std::os::unix::fs::PermissionsExt;
    let listen = |source| Error::Listen { what: path.display().to_string(), source };
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(crate::pod_sync::PRIVATE_DIR_MODE)
            .create(dir)
            .map_err(listen)?;
    }
    if tokio::net::UnixStream::connect(path).await.is_ok() {
        return Err(Error::InUse(path.to_owned()));
    }
    let mut binding = path.as_os_str().to_owned();
    binding.push(format!(".{}.binding", std::process::id()));
    let binding = PathBuf::from(binding);
    let _ = std::fs::remove_file(&binding);
    let listener = tokio::net::UnixListener::bind(&binding).map_err(listen)?;
    let placed = std::fs::set_permissions(&binding, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&binding, path));
    if let Err(source) = placed {
        let _ = std::fs::remove_file(&binding);
        return Err(Error::Listen { what: binding.display().to_string(), source });
    }
    info!(socket = %path.display(), "serving the local API");
    let path = path.to_owned();
    Ok(tokio::spawn(async move {
        kubelet_server::listen::serve_router(
            listener,
            router,
            kubelet_server::Limits::local(),
            "the local API",
            cancel,
        )
        .await;
        let _ = std::fs::remove_file(path);
    }))
}

/// The read-only API's routes but upstream's debugging handler among them (`/runningpods/`).
fn read_only_routes<R: Runtime>() -> Router<Arc<ApiState<R>>> {
    Router::new()
        .route("/healthz", get(healthz::<R>))
        .route("/pods", get(pods::<R>))
        .route("/metrics", get(metrics::<R>))
        .route("/metrics/probes", get(probe_metrics::<R>))
}

/// The paths of upstream's debugging handlers, which answer 405 with `enableDebuggingHandlers:
/// false` (upstream `InstallDebuggingDisabledHandlers`).
const DEBUGGING_PATHS: [&str; 8] =
    ["/run", "/exec", "/attach", "/portForward", "/containerLogs", "/runningpods", "/debug/pprof", "/logs"];

/// The router of the read-only port, and the kubelet API's routes of this module with
/// `enableDebuggingHandlers: false`: `/healthz`, `/pods` and `/metrics`, and every path of the
/// debugging handlers (`/runningpods/` among them) answering 405 `Debug endpoints are disabled.`
/// as upstream's do.
pub fn read_only_router<R: Runtime>(state: Arc<ApiState<R>>) -> Router {
    async fn disabled() -> Response {
        (StatusCode::METHOD_NOT_ALLOWED, "Debug endpoints are disabled.\n").into_response()
    }
    let mut router = read_only_routes::<R>();
    for path in DEBUGGING_PATHS {
        router = router.route(path, any(disabled)).route(&format!("{path}/"), any(disabled));
        router = router.route(&format!("{path}/{{*rest}}"), any(disabled));
    }
    router.with_state(state)
}

/// The `/healthz` router alone (upstream's healthz port).
pub fn healthz_router<R: Runtime>(state: Arc<ApiState<R>>) -> Router {
    Router::new().route("/healthz", get(healthz::<R>)).with_state(state)
}

/// Binds `addr` (failing clearly if the port is taken) and serves `router` as `what` (the
/// read-only API, healthz) within the [`Limits`](kubelet_server::Limits) of every port until
/// `cancel`.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    what: &'static str,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Listen { what: addr.to_string(), source })?;
    info!(%addr, "serving {what}");
    Ok(tokio::spawn(kubelet_server::listen::serve_router(
        listener,
        router,
        kubelet_server::Limits::default(),
        what,
        cancel,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_parameters_are_checked_as_upstream_checks_them() {
        let now: k8s_openapi::jiff::Timestamp = "2026-12-07T10:00:00Z".parse().unwrap();
        let query = |text: &str| -> LogQuery { serde_urlencoded::from_str(text).unwrap() };
        let options =
            query("tailLines=0&limitBytes=1&sinceSeconds=60&timestamps=true&follow=true").options(now).unwrap();
        assert_eq!(
            options,
            logs::LogOptions {
                tail: Some(0),
                limit_bytes: Some(1),
                since: Some("2026-12-07T09:59:00Z".parse().unwrap()),
                timestamps: true,
                follow: true,
            }
        );
        let since = query("sinceTime=2026-12-07T09:00:00Z").options(now).unwrap().since;
        assert_eq!(since, Some("2026-12-07T09:00:00Z".parse().unwrap()));
        assert!(
            !query("follow=true&previous=true").options(now).unwrap().follow,
            "a previous instance is not followed"
        );
        let forever = query("sinceSeconds=9223372036854775807").options(now).unwrap().since;
        assert_eq!(forever, Some(k8s_openapi::jiff::Timestamp::MIN), "further back than time goes: all of it");
        for refused in [
            "tailLines=-1",
            "limitBytes=0",
            "sinceSeconds=0",
            "sinceSeconds=1&sinceTime=2026-12-07T09:00:00Z",
            "sinceTime=yesterday",
        ] {
            assert_eq!(query(refused).options(now), None, "{refused}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 2000,
            failure_persistence: None,
            rng_seed: proptest::test_runner::RngSeed::Fixed(kubelet_core::testing::proptest_seed(module_path!())),
            ..proptest::test_runner::Config::default()
        })]

        /// Any query string is read or refused by axum's decoder, and what is read is checked
        /// without a panic (numbers at their extremes, times of any shape).
        #[test]
        fn any_log_query_is_read_or_refused(
            query in "((follow|previous|timestamps|tailLines|limitBytes|sinceSeconds|sinceTime)=(-?[0-9]{1,20}|true|[0-9T:Z.+-]{0,30}|%[0-9A-F]{2})&?){0,5}",
        ) {
            if let Ok(parsed) = serde_urlencoded::from_str::<LogQuery>(&query) {
                let _ = parsed.options(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
                let _ = parsed.options(k8s_openapi::jiff::Timestamp::MAX);
            }
        }
    }

    #[test]
    fn container_logs_are_read_only_for_a_container_of_the_spec() {
        let mut pod = (*pod_named("web", "busybox")).clone();
        let spec = pod.spec.as_mut().unwrap();
        spec.init_containers =
            Some(vec![k8s_openapi::api::core::v1::Container { name: "init".into(), ..Default::default() }]);
        spec.ephemeral_containers =
            Some(vec![k8s_openapi::api::core::v1::EphemeralContainer { name: "debug".into(), ..Default::default() }]);
        let app = spec.containers[0].name.clone();
        for known in [app.as_str(), "init", "debug"] {
            assert!(in_spec(&pod, known), "{known}");
        }
        // Names a path would resolve elsewhere, or no container has.
        for unknown in ["..", ".", "", "../../etc", "a/b", "other", "web/../web"] {
            assert!(!in_spec(&pod, unknown), "{unknown:?}");
        }
        // A spec that names a container `..` (nothing validated it) still gets no path of it.
        pod.spec.as_mut().unwrap().containers[0].name = "..".into();
        assert!(!in_spec(&pod, ".."));
    }

    #[test]
    fn a_pod_list_is_upstreams_with_each_pod_whole() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
            "spec": {"containers": [{"name": "app", "image": "busybox"}]},
            "status": {"phase": "Running"},
        }))
        .unwrap();
        let Json(list) = pod_list(vec![pod]);
        assert_eq!(
            serde_json::to_value(&list).unwrap(),
            serde_json::json!({
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {},
                "items": [{
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "web", "namespace": "default", "uid": "u1"},
                    "spec": {"containers": [{"name": "app", "image": "busybox"}]},
                    "status": {"phase": "Running"},
                }],
            })
        );
    }

    fn pod_named(name: &str, image: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
                "spec": {"containers": [{"name": "app", "image": image}]},
            }))
            .unwrap(),
        )
    }

    fn phase(phase: &str) -> k8s_openapi::api::core::v1::PodStatus {
        k8s_openapi::api::core::v1::PodStatus { phase: Some(phase.into()), ..Default::default() }
    }

    /// What `pod_list` serializes of `pods`, each with its stored status.
    fn expected(pods: &[Arc<Pod>], statuses: &StatusStore) -> serde_json::Value {
        let items = pods
            .iter()
            .map(|pod| {
                let mut pod = (**pod).clone();
                pod.status = statuses.get(&PodUid::of(&pod)).map(|stored| stored.status);
                pod
            })
            .collect();
        serde_json::to_value(pod_list(items).0).unwrap()
    }

    fn listed(json: &PodsJson, pods: &[Arc<Pod>], statuses: &StatusStore) -> serde_json::Value {
        serde_json::from_slice(&json.list(pods.to_vec(), statuses)).unwrap()
    }

    #[test]
    fn the_pods_json_kept_is_made_again_when_a_pod_or_its_status_changes() {
        let (statuses, json) = (StatusStore::new(), PodsJson::default());
        let (web, db) = (pod_named("web", "nginx"), pod_named("db", "postgres"));
        statuses.set(&web, phase("Pending"));
        let mut pods = vec![web.clone(), db.clone()];
        assert_eq!(listed(&json, &pods, &statuses), expected(&pods, &statuses));
        // Read again unchanged, then with one status changed, and with a status set first.
        assert_eq!(listed(&json, &pods, &statuses), expected(&pods, &statuses));
        statuses.set(&web, phase("Running"));
        statuses.set(&db, phase("Pending"));
        let now = listed(&json, &pods, &statuses);
        assert_eq!(now, expected(&pods, &statuses));
        assert_eq!(now["items"][0]["status"]["phase"], "Running");
        // A status removed and set again starts its version again, at the version listed last;
        // its stamp does not.
        statuses.remove(&PodUid::of(&web));
        statuses.set(&web, phase("Pending"));
        assert_eq!(listed(&json, &pods, &statuses)["items"][0]["status"]["phase"], "Pending");
        statuses.remove(&PodUid::of(&web));
        statuses.set(&web, phase("Failed"));
        assert_eq!(statuses.get(&PodUid::of(&web)).unwrap().version, 1);
        assert_eq!(listed(&json, &pods, &statuses)["items"][0]["status"]["phase"], "Failed");
        // An updated pod (a new `Arc`) with the same status, and a pod gone.
        pods = vec![pod_named("web", "nginx:2")];
        let now = listed(&json, &pods, &statuses);
        assert_eq!(now, expected(&pods, &statuses));
        assert_eq!(now["items"][0]["spec"]["containers"][0]["image"], "nginx:2");
        assert_eq!(now["items"].as_array().unwrap().len(), 1);
        assert_eq!(crate::lock(&json.0).len(), 1, "only the pods listed are kept");
    }

    #[test]
    fn the_probe_metrics_are_their_families_alone() {
        let text = "# HELP kubelet_running_pods Number of pods\n# TYPE kubelet_running_pods gauge\n\
                    kubelet_running_pods 3\n# HELP prober_probe_total Cumulative number of probes\n\
                    # TYPE prober_probe_total counter\nprober_probe_total{probe_type=\"Readiness\"} 2\n\
                    prober_probe_duration_seconds_sum{probe_type=\"Readiness\"} 0.1\nprocess_open_fds 9\n";
        assert_eq!(
            families_named(text, "prober_probe_"),
            "# HELP prober_probe_total Cumulative number of probes\n# TYPE prober_probe_total counter\n\
             prober_probe_total{probe_type=\"Readiness\"} 2\n\
             prober_probe_duration_seconds_sum{probe_type=\"Readiness\"} 0.1\n"
        );
    }
}
