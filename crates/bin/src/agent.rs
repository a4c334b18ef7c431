//! The agent: builds the concrete components and runs them until a signal.
//!
//! It picks the concrete types (the CRI runtime manager or the fake runtime, the evented PLEG, the
//! pod workers), hands them to the library's `Agent` builder, and adds the static pod sources,
//! cluster mode (`--kubeconfig`, in [`crate::cluster`]) and the local API.

use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};

use anyhow::{Context, Result};
use config::{PodConfig, file, http};
use cri_client::{
    Client, Config as CriConfig, CriRuntime,
    log_rotation::{LogRotationPolicy, LogRotator},
    manager,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubelet::{
    Agent,
    admission::NodeResources,
    agent,
    image_gc::{ImageGc, ImageGcPolicy},
    server,
};
use kubelet_cluster::objects::ApiObjects;
use kubelet_core::{
    Runtime, Source, StartupTracker,
    events::RingRecorder,
    fake::{FakeRuntime, Method},
    hook::BoxFuture,
    runtime::RuntimeEvents,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, info, info_span, warn};

use crate::settings::Settings;

/// Runs the agent until `cancel` fires; returns once every task has stopped.
///
/// `containerRuntimeEndpoint` names a CRI socket, or `fake://` for the in-memory runtime.
pub(crate) async fn run(
    settings: Settings,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    cancel: CancellationToken,
) -> Result<()> {
    let recorder = Arc::new(RingRecorder::default());
    // Cluster mode: the client comes first, as the runtime reads pull secrets through it; the
    // volumes and the runtime share one watch of each object.
    let watches = TaskTracker::new();
    let client = match &settings.kubeconfig {
        Some(_) => {
            // A TLS bootstrap may wait an hour for its certificate: a signal ends the wait.
            let Some(client) = cancel.run_until_cancelled(crate::cluster::connect(&settings)).await else {
                return Ok(());
            };
            let clients = client?;
            let objects = ApiObjects::new(clients.api.clone(), watches.clone(), cancel.child_token());
            Some(Cluster { clients, objects: Arc::new(objects) })
        }
        None => None,
    };
    let result = run_with(client, settings, recorder, metrics, cancel.clone()).await;
    // The agent has stopped (or never started): the watches stop too.
    cancel.cancel();
    watches.close();
    watches.wait().await;
    result
}

/// The API server's clients and the objects read through them, in cluster mode.
struct Cluster {
    clients: crate::cluster::Clients,
    objects: Arc<ApiObjects>,
}

/// [`run`] once cluster mode's client (if any) is made.
async fn run_with(
    client: Option<Cluster>,
    settings: Settings,
    recorder: Arc<RingRecorder>,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    cancel: CancellationToken,
) -> Result<()> {
    let file = &settings.file;
    if let Some(fake) = FakeEndpoint::parse(&file.container_runtime_endpoint)? {
        warn!(endpoint = %file.container_runtime_endpoint, "running on the in-memory fake runtime: no containers run");
        let runtime = Arc::new(fake.build());
        let parts = RunParts {
            recorder,
            startup: Arc::new(StartupTracker::new()),
            cgroups: None,
            log_rotator: None,
            host_evictions: false,
        };
        return run_on(runtime, parts, client, settings, metrics, cancel).await;
    }
    let mut cri_config = CriConfig::new(&file.container_runtime_endpoint).request_timeout(file.runtime_request_timeout);
    if let Some(endpoint) = &file.image_service_endpoint {
        cri_config = cri_config.image_endpoint(endpoint);
    }
    let cri = Client::connect(&cri_config).context("invalid containerRuntimeEndpoint")?;
    let log_rotator = log_rotator(&cri, file);
    let node = node_allocatable(&settings);
    let runtime_config = manager::Config::new(&settings.node_name)
        .pod_logs_dir(&file.pod_logs_dir)
        .container_logs_dir(&settings.container_logs_dir)
        .pods_dir(settings.root_dir.join("pods"))
        .seccomp_dir(settings.root_dir.join("seccomp"))
        .cgroup_root(&settings.pods_cgroup)
        .node_ip(&settings.node_ip)
        .secondary_node_ip(settings.secondary_node_ip.map(|ip| ip.to_string()).unwrap_or_default())
        .image_pull_limit(file.image_pull_limit())
        .registry_pulls(f64::from(file.registry_pull_qps), file.registry_burst)
        .allocatable(allocatable_quantities(&node))
        .hugepage_sizes(node.hugepages.keys().copied().collect())
        .dns(
            file.resolv_conf.clone(),
            file.cluster_dns.iter().map(ToString::to_string).collect(),
            file.cluster_domain.clone(),
        );
    let startup = Arc::new(StartupTracker::new());
    let mut runtime = CriRuntime::new(cri, runtime_config, recorder.clone())
        .startup_tracker(startup.clone())
        .hooks(Arc::new(prober::Hooks::default()))
        .sub_paths(Arc::new(volumes::subpath::BindMounter::new(settings.root_dir.join("pods"))));
    if let Some(cluster) = &client {
        runtime = runtime.objects(cluster.objects.clone());
    }
    let cgroups = Some(pod_cgroups(&settings));
    let parts = RunParts { recorder, startup, cgroups, log_rotator, host_evictions: true };
    run_on(Arc::new(runtime), parts, client, settings, metrics, cancel).await
}

/// The pods' cgroups (`cgroupsPerQOS`): `kubepods` limited to the node's allocatable with
/// `enforceNodeAllocatable: [pods]` (the default), or to its capacity, and `podPidsLimit`.
fn pod_cgroups(settings: &Settings) -> cm::Config {
    let file = &settings.file;
    let node = if file.enforce_node_allocatable.iter().any(|e| e == "pods") {
        node_less_reserved(settings)
    } else {
        NodeResources::of_this_node()
    };
    cm::Config::new(cri_client::cgroups::CGROUP_ROOT, &settings.pods_cgroup)
        .node(node.cpu_milli, node.memory_bytes)
        .hugepages(node.hugepages)
        .pod_pids_limit(file.pod_pids_limit)
}

/// The daemons' cgroups `enforceNodeAllocatable` limits to their reservations.
fn reserved_cgroups(file: &config::KubeletConfiguration) -> Vec<cm::ReservedCgroup> {
    let enforced = |key: &str| file.enforce_node_allocatable.iter().any(|e| e == key);
    let reservation = |whose, cgroup: &str, reserved: &BTreeMap<String, String>| {
        let amount = |resource: &str, scaled: fn(&Quantity) -> Option<i64>| {
            reserved.get(resource).and_then(|q| scaled(&Quantity(q.clone())))
        };
        let cpu = amount("cpu", kubelet_core::resources::milli);
        let memory = amount("memory", kubelet_core::resources::units);
        cm::ReservedCgroup::new(whose, cgroup, cpu, memory)
    };
    let mut reserved = Vec::new();
    if enforced("system-reserved") {
        reserved.push(reservation("System Reserved", &file.system_reserved_cgroup, &file.system_reserved));
    }
    if enforced("kube-reserved") {
        reserved.push(reservation("Kube Reserved", &file.kube_reserved_cgroup, &file.kube_reserved));
    }
    reserved
}

/// The eviction manager's settings: the `eviction*` fields, checked when the file was read.
fn eviction_config(file: &config::KubeletConfiguration) -> Result<eviction::Config> {
    let thresholds = file.eviction_thresholds().context("invalid eviction thresholds")?;
    let mut config = eviction::Config::new(thresholds.thresholds);
    config.pressure_transition_period = file.eviction_pressure_transition_period;
    config.max_pod_grace_period = file.eviction_max_pod_grace_period;
    config.local_storage_limits = file.local_storage_capacity_isolation;
    Ok(config)
}

/// Where the eviction manager reads: the root directory's filesystem (`nodefs`), the pods' logs
/// and, with pod cgroups, the pods' cgroup and the node's allocatable memory.
fn eviction_paths(settings: &Settings, cgroups: Option<&cm::Config>) -> eviction::HostPaths {
    let paths = eviction::HostPaths::new(&settings.root_dir, &settings.file.pod_logs_dir);
    match cgroups {
        Some(cgroups) => {
            let allocatable = node_less_reserved(settings).memory_bytes.max(0).unsigned_abs();
            paths.pods_cgroup(&cgroups.mount, &cgroups.pods_cgroup, allocatable)
        }
        None => paths,
    }
}

/// What the eviction manager reclaims before evicting pods for disk: dead containers (the
/// runtime's garbage collection) and unused images.
struct NodeReclaimer<R> {
    image_gc: Arc<ImageGc<R>>,
    runtime: Arc<R>,
}

impl<R: Runtime> eviction::NodeReclaim for NodeReclaimer<R> {
    fn delete_unused_containers(&self) -> BoxFuture<'_, Result<(), eviction::ReclaimError>> {
        Box::pin(async move {
            let policy = kubelet_core::runtime::GcPolicy::default();
            self.runtime.garbage_collect(&policy, true, true).await.map_err(|e| Box::new(e) as eviction::ReclaimError)
        })
    }

    fn delete_unused_images(&self) -> BoxFuture<'_, Result<(), eviction::ReclaimError>> {
        Box::pin(async move {
            let freed = self.image_gc.delete_unused_images().await?;
            info!(freed, "eviction manager: removed unused images");
            Ok(())
        })
    }
}

/// Container log rotation (`containerLogMaxSize` and the rest), unless the size is negative.
fn log_rotator(cri: &Client, file: &config::KubeletConfiguration) -> Option<LogRotator> {
    let max_size = file.container_log_max_size?;
    let policy = LogRotationPolicy::new(
        max_size,
        file.container_log_max_files as usize,
        file.container_log_max_workers as usize,
        file.container_log_monitor_interval,
    );
    Some(LogRotator::new(cri.clone(), &file.pod_logs_dir, policy))
}

/// Image garbage collection as the configuration file asks.
fn image_gc_policy(file: &config::KubeletConfiguration) -> ImageGcPolicy {
    ImageGcPolicy::new(
        file.image_gc_high_threshold_percent,
        file.image_gc_low_threshold_percent,
        file.image_minimum_gc_age,
        file.image_maximum_gc_age,
    )
}

/// Rotates container logs until `cancel`; a watch that cannot be made is logged, and the
/// agent runs on without rotation.
async fn rotate_logs(rotator: LogRotator, cancel: CancellationToken) {
    if let Err(err) = rotator.run(cancel).await {
        warn!(error = %err, "container logs are not rotated: the log directories cannot be watched");
    }
}

/// What the node offers pods: capacity minus `systemReserved`, `kubeReserved`, the hard
/// `memory.available` threshold and the huge pages, and the root directory's filesystem minus
/// the hard `nodefs.available` threshold (upstream's node allocatable), `maxPods`, the labels
/// it registers with (for `nodeSelector` and the required node affinity) and
/// `allowedUnsafeSysctls`.
fn node_allocatable(settings: &Settings) -> NodeResources {
    let mut node = node_less_reserved(settings);
    let capacity = NodeResources::of_this_node().memory_bytes.max(0).unsigned_abs();
    let storage = root_dir_capacity(&settings.root_dir);
    let thresholds = settings.file.eviction_thresholds().unwrap_or_default();
    let (memory_held, storage_held) = thresholds.hard_reservation(capacity, storage.unwrap_or(0));
    let hugepages: u64 = node.hugepages.values().sum();
    let held = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
    node.memory_bytes = (node.memory_bytes - held(memory_held) - held(hugepages)).max(0);
    node.ephemeral_storage_bytes = storage.map(|bytes| (held(bytes) - held(storage_held)).max(0));
    if !settings.file.local_storage_capacity_isolation {
        // No allocatable ephemeral storage: a pod that asks for some does not fit, as upstream's.
        node.ephemeral_storage_bytes = Some(0);
    }
    node
}

/// The size of the filesystem holding `root_dir` (or its nearest existing parent): the node's
/// `ephemeral-storage` capacity.
fn root_dir_capacity(root_dir: &Path) -> Option<u64> {
    let fs = root_dir.ancestors().find_map(|dir| eviction::stats::fs_stats(dir).ok());
    fs.map(|fs| fs.capacity_bytes)
}

/// The node's capacity less `systemReserved` and `kubeReserved` (upstream's
/// `GetNodeAllocatableAbsolute`, without the eviction thresholds): what `kubepods` is limited to
/// and what `allocatableMemory.available` is measured against.
fn node_less_reserved(settings: &Settings) -> NodeResources {
    let file = &settings.file;
    let mut node = NodeResources::of_this_node();
    let (reserved_cpu, reserved_memory) = file.reserved();
    node.cpu_milli = (node.cpu_milli - reserved_cpu).max(0);
    node.memory_bytes = (node.memory_bytes - reserved_memory).max(0);
    node.max_pods = file.max_pods as usize;
    node.labels = kubelet_cluster::node_labels(&settings.node_name, &settings.node_labels);
    node.taints.clone_from(&file.register_with_taints);
    node.allowed_unsafe_sysctls.clone_from(&file.allowed_unsafe_sysctls);
    node
}

/// `node`'s allocatable CPU and memory as quantities, for `resourceFieldRef`s to limits a
/// container does not set.
fn allocatable_quantities(node: &NodeResources) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_owned(), Quantity(format!("{}m", node.cpu_milli))),
        ("memory".to_owned(), Quantity(node.memory_bytes.to_string())),
    ])
}

/// `fake://?startLatency=200ms&failureRate=0.1`: the in-memory runtime, each pod sync taking
/// `startLatency` and each container start failing with probability `failureRate`.
#[derive(Debug, Clone, PartialEq)]
struct FakeEndpoint {
    start_latency: Duration,
    failure_rate: f64,
}

impl FakeEndpoint {
    fn parse(endpoint: &str) -> Result<Option<Self>> {
        let Some(rest) = endpoint.strip_prefix("fake://") else { return Ok(None) };
        let mut fake = FakeEndpoint { start_latency: Duration::ZERO, failure_rate: 0.0 };
        let query = rest.trim_start_matches('/').trim_start_matches('?');
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("startLatency", value)) => {
                    fake.start_latency = config::configuration::parse_duration(value)
                        .map_err(|e| anyhow::anyhow!("fake:// startLatency: {e}"))?;
                }
                Some(("failureRate", value)) => {
                    fake.failure_rate = value
                        .parse::<f64>()
                        .ok()
                        .filter(|r| (0.0..=1.0).contains(r))
                        .with_context(|| format!("fake:// failureRate {value:?}: expected a number from 0 to 1"))?;
                }
                _ => anyhow::bail!("fake:// takes startLatency=DURATION and failureRate=0..1, not {pair:?}"),
            }
        }
        Ok(Some(fake))
    }

    fn build(&self) -> FakeRuntime {
        let runtime = FakeRuntime::new();
        runtime.set_latency(Method::SyncPod, self.start_latency);
        runtime.set_failure_rate(Method::StartContainer, self.failure_rate);
        // Init containers complete, so pods get past them as real ones do.
        runtime.set_init_exit_code(Some(0));
        runtime
    }
}

/// A static pod path that exists but cannot be read stops the agent with a clear error; one
/// that does not exist yet is watched for, as upstream does.
fn check_manifest_path(path: Option<&std::path::Path>) -> Result<()> {
    let Some(path) = path else { return Ok(()) };
    let readable = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            warn!(path = %path.display(), "the static pod path does not exist (yet); watching for it");
            return Ok(());
        }
        Err(e) => Err(e),
        Ok(meta) if meta.is_dir() => std::fs::read_dir(path).map(drop),
        Ok(_) => std::fs::File::open(path).map(drop),
    };
    readable.with_context(|| format!("cannot read the static pod path {}", path.display()))
}

/// What the runtime's set-up hands the agent: the events' recorder, the start-up tracker the
/// runtime reports its pulls into, and on a real runtime the pods' cgroups and the container
/// log rotator, set up once the runtime answers.
struct RunParts {
    recorder: Arc<RingRecorder>,
    startup: Arc<StartupTracker>,
    cgroups: Option<cm::Config>,
    log_rotator: Option<LogRotator>,
    /// Whether the eviction manager watches this host: not for the fake runtime, whose pods use
    /// none of it (upstream's hollow node reads fixed stats, so it never sees pressure either).
    host_evictions: bool,
}

/// The agent on any runtime: the library's [`Agent`] with the evented PLEG (which falls back to
/// relisting), the pod workers, the static pod sources and the local API.
async fn run_on<R: Runtime + RuntimeEvents + 'static>(
    runtime: Arc<R>,
    parts: RunParts,
    client: Option<Cluster>,
    settings: Settings,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    cancel: CancellationToken,
) -> Result<()> {
    let file = &settings.file;
    let version = runtime
        .version()
        .await
        .with_context(|| format!("cannot reach the container runtime at {}", file.container_runtime_endpoint))?;
    info!(runtime = %version.runtime_name, version = %version.runtime_version, api = %version.runtime_api_version, "connected to the container runtime");
    // Upstream speaks only CRI v1 since 1.26; v1alpha2 runtimes are refused.
    if version.runtime_api_version != "v1" && !version.runtime_api_version.starts_with("v1.") {
        anyhow::bail!(
            "the container runtime at {} speaks CRI {:?}; kubelet-rs needs CRI v1",
            file.container_runtime_endpoint,
            version.runtime_api_version
        );
    }
    check_manifest_path(file.static_pod_path.as_deref())?;

    let node = node_allocatable(&settings);
    let allocatable = allocatable_quantities(&node);
    let kubelet_config = kubelet::Config::new(&settings.node_name)
        .root_dir(&settings.root_dir)
        .node_ip(&settings.node_ip)
        .secondary_node_ip(settings.secondary_node_ip.map(|ip| ip.to_string()).unwrap_or_default())
        .node(node);
    let mut sources = Vec::new();
    if file.static_pod_path.is_some() {
        sources.push(Source::File);
    }
    if file.static_pod_url.is_some() {
        sources.push(Source::Http);
    }
    let api_client = client.as_ref().map(|cluster| cluster.clients.api.clone());
    let cluster = client.map(|client| {
        sources.push(Source::Api);
        (client, crate::cluster::facts(&settings, version))
    });
    let (file_period, http_period, sync_period) = settings.periods();
    let RunParts { recorder, startup, cgroups, log_rotator, host_evictions } = parts;
    let eviction_paths = eviction_paths(&settings, cgroups.as_ref());
    let cgroups = cgroups
        .map(|config| {
            let pods_cgroup = config.pods_cgroup.clone();
            cm::CgroupManager::new(config).with_context(|| format!("cannot set up the pods' cgroup {pods_cgroup}"))
        })
        .transpose()?;
    if cgroups.is_some() {
        for reserved in reserved_cgroups(file) {
            reserved.enforce(cri_client::cgroups::CGROUP_ROOT)?;
            info!(cgroup = %reserved.cgroup, "Updated limits on {} cgroup", reserved.whose.to_lowercase());
        }
    }
    let image_gc =
        Arc::new(ImageGc::new(runtime.clone(), image_gc_policy(file), recorder.clone(), &settings.node_name));
    let eviction_runtime = host_evictions.then(|| runtime.clone());
    let summary =
        eviction::summary::SummaryProvider::new(eviction::HostStats::new(runtime.clone(), eviction_paths.clone()));
    let mut builder = Agent::builder(runtime, agent::Config::new(kubelet_config, sources));
    if let Some(cgroups) = cgroups {
        builder = builder.pod_cgroups(cgroups);
    }
    let mut volumes = volumes::Manager::new(settings.root_dir.join("pods")).allocatable(allocatable);
    if let Some((Cluster { clients, objects, .. }, _)) = &cluster {
        builder = builder.mirror_client(crate::cluster::ApiMirrors::new(clients.api.clone(), &settings.node_name));
        // configMap, secret and projected volumes read the API server.
        volumes = volumes.objects(objects.clone());
    }
    let agent = builder
        .recorder(recorder.clone())
        .startup_tracker(startup)
        .cancel(cancel.clone())
        .volumes(volumes)
        .prober({
            let config = prober::Config::default().node_ip(&settings.node_ip);
            move |parts| {
                prober::Manager::new(
                    parts.runtime,
                    parts.cache,
                    parts.results,
                    parts.updates,
                    parts.recorder,
                    config,
                    parts.cancel,
                )
            }
        })
        .build(
            |runtime, cache| pleg::EventedPleg::new(runtime, cache, pleg::evented::Config::default()),
            |parts| {
                // `syncFrequency`: how soon a synced pod is synced again (upstream's resync interval).
                let config = podworkers::Config::default().resync_interval(sync_period);
                podworkers::PodWorkers::new(parts.syncer, parts.cache, parts.work_queue, config, parts.cancel)
            },
        );
    if let Some((Cluster { objects, .. }, _)) = &cluster {
        // A changed config map or secret reaches the volumes of the pods that show it at once.
        objects.sync_users_on_change(agent.work_queue().clone());
    }

    let (pod_config, updates) = PodConfig::new(recorder.clone());
    let tracker = TaskTracker::new();
    let fatal = crate::cluster::Fatal::default();
    tracker.spawn({
        let image_gc = image_gc.clone();
        let cancel = cancel.child_token();
        async move { image_gc.run(cancel).await }.instrument(info_span!("image_gc"))
    });
    if let Some(runtime) = eviction_runtime {
        let stats = eviction::HostStats::new(runtime.clone(), eviction_paths);
        let reclaim = Arc::new(NodeReclaimer { image_gc, runtime });
        let evictions = eviction::Manager::new(
            eviction_config(file)?,
            stats,
            agent.workers().clone(),
            agent.active_pods(),
            recorder.clone(),
            &settings.node_name,
            agent.pressure().clone(),
        )
        .node_reclaim(reclaim)
        .pod_cleaned_up(agent.pod_resources_reclaimed());
        tracker.spawn(evictions.run(cancel.child_token()).instrument(info_span!("eviction_manager")));
    } else {
        info!("the fake runtime's pods use nothing of this host: the eviction manager is off");
    }
    if let Some(rotator) = log_rotator {
        tracker.spawn(rotate_logs(rotator, cancel.child_token()).instrument(info_span!("log_rotation")));
    }
    // Memory freed by pod work (start-ups, removals) is returned to the system once it settles.
    let changes = Arc::new(tokio::sync::Notify::new());
    agent.statuses().add_sink(Arc::new(crate::alloc::PodChanges(changes.clone())));
    tracker.spawn(
        crate::alloc::trim_after_changes(
            changes,
            crate::alloc::TRIM_QUIET,
            || _ = crate::alloc::trim(),
            cancel.child_token(),
        )
        .instrument(info_span!("allocator_trim")),
    );
    if let Some(path) = &file.static_pod_path {
        let source = file::FileSource::new(
            file::Config::new(path, &settings.node_name).check_frequency(file_period),
            pod_config.source(Source::File),
            recorder.clone(),
        );
        tracker.spawn(source.run(cancel.child_token()).instrument(info_span!("file_source")));
    }
    if let Some(url) = &file.static_pod_url {
        let mut http_config = http::Config::new(url, &settings.node_name).check_frequency(http_period);
        for (name, values) in &file.static_pod_url_header {
            for value in values {
                http_config = http_config.header(name, value);
            }
        }
        let source = http::HttpSource::new(http_config, pod_config.source(Source::Http), recorder.clone());
        tracker.spawn(source.run(cancel.child_token()).instrument(info_span!("http_source")));
    }
    if let Some((Cluster { clients, .. }, facts)) = cluster {
        info!(node = %settings.node_name, "joining the cluster of --kubeconfig");
        let images = Arc::new(std::sync::Mutex::new(Vec::new()));
        let lister = crate::cluster::list_images(agent.runtime().clone(), images.clone(), cancel.child_token());
        tracker.spawn(lister.instrument(info_span!("image_list")));
        let node_state = crate::cluster::NodeState {
            runtime_state: agent.runtime_state().clone(),
            pressure: agent.pressure().clone(),
            api_node: agent.api_node().clone(),
            images,
        };
        crate::cluster::spawn(
            &fatal,
            &tracker,
            clients,
            facts,
            &settings,
            agent.statuses(),
            node_state,
            pod_config.source(Source::Api),
            &recorder,
            &cancel,
        );
    }

    let mut api_state = server::ApiState::of(&agent, recorder, file.pod_logs_dir.clone())
        .streaming_idle_timeout(file.server.streaming_connection_idle_timeout);
    if let Some(handle) = metrics {
        api_state = api_state.metrics(Arc::new(move || handle.render()));
    }
    let api_state = Arc::new(api_state);
    let mut servers = vec![
        server::serve_unix(
            &server::socket_path(&settings.root_dir),
            server::local_router(api_state.clone()),
            cancel.child_token(),
        )
        .await?,
    ];
    let stats = crate::stats::Stats::new(summary, agent.pods().clone(), agent.statuses().clone(), &settings.node_name);
    // Upstream's debugging handlers (exec, attach, port-forward, run, container logs, running
    // pods, configz) only with `enableDebuggingHandlers`; the local socket, root's alone, keeps
    // them.
    let api_routes = if settings.file.server.enable_debugging_handlers {
        let file = &settings.file;
        server::local_router(api_state.clone())
            .merge(crate::configz::router(&settings))
            .merge(crate::node_logs::router(file.enable_system_log_handler, crate::node_logs::NODE_LOG_DIR))
            .merge(crate::debug_flags::router(file.enable_debug_flags_handler))
    } else {
        server::read_only_router(api_state.clone())
    };
    let kubelet_api = api_routes.merge(crate::stats::router(stats)).merge(crate::spec::router());
    servers.extend(crate::kubelet_api::serve(&settings, api_client, kubelet_api, cancel.child_token()).await?);
    if let Some(addr) = settings.read_only {
        let router = server::read_only_router(api_state.clone());
        servers.push(server::serve(addr, router, "the read-only API", cancel.child_token()).await?);
    }
    if let Some(addr) = settings.healthz {
        let router = server::healthz_router(api_state.clone());
        servers.push(server::serve(addr, router, "the healthz API", cancel.child_token()).await?);
    }
    servers.extend(crate::systemd::spawn_watchdog(api_state, cancel.child_token()));
    crate::systemd::ready();
    // The config stays alive for the sources as long as the agent runs.
    agent.run(updates).await;
    crate::systemd::stopping();
    drop(pod_config);
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
    for server in servers {
        let _ = server.await;
    }
    match fatal.get() {
        Some(why) => anyhow::bail!("{why}"),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_endpoints_parse() {
        assert_eq!(FakeEndpoint::parse("unix:///run/containerd/containerd.sock").unwrap(), None);
        assert_eq!(
            FakeEndpoint::parse("fake://").unwrap(),
            Some(FakeEndpoint { start_latency: Duration::ZERO, failure_rate: 0.0 })
        );
        assert_eq!(
            FakeEndpoint::parse("fake://?startLatency=250ms&failureRate=0.1").unwrap(),
            Some(FakeEndpoint { start_latency: Duration::from_millis(250), failure_rate: 0.1 })
        );
        for bad in ["fake://?failureRate=2", "fake://?startLatency=soon", "fake://?color=blue"] {
            assert!(FakeEndpoint::parse(bad).is_err(), "{bad}");
        }
    }
}
