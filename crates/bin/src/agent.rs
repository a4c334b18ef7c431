//! The agent: builds the concrete components and runs them until a signal.
//!
//! CRI runtime manager, evented PLEG (which falls back to relisting on runtimes without events),
//! pod workers, the kubelet, the static pod file source, a runtime status poll, and the sync loop.

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result};
use cri_client::{Client, Config as CriConfig, CriRuntime, RuntimeConfig};
use kubelet_core::{
    Cache, Pleg, PodManager, Runtime, Source, SourcesReady, WorkQueue,
    config::{PodConfig, file, http},
    events::RingRecorder,
    fake::{FakeRuntime, Method},
    kubelet::{self, Kubelet, PodSync, admission::NodeResources, status_store::StatusStore},
    runtime::RuntimeEvents,
    startup::StartupTracker,
    state::{LoopHealth, RuntimeState},
    sync_loop::{self, Inputs, Shared},
};
use tokio::time::Instant;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, info, info_span, warn};

use crate::settings::Settings;

/// Runs the agent until `cancel` fires; returns once every task has stopped.
///
/// `containerRuntimeEndpoint` names a CRI socket, or `fake://` for the in-memory runtime.
pub(crate) async fn run(
    config: Settings,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    cancel: CancellationToken,
) -> Result<()> {
    let file = &config.file;
    let recorder = Arc::new(RingRecorder::default());
    if let Some(fake) = FakeEndpoint::parse(&file.container_runtime_endpoint)? {
        warn!(endpoint = %file.container_runtime_endpoint, "running on the in-memory fake runtime: no containers run");
        let runtime = Arc::new(fake.build());
        return run_on(runtime, recorder, Arc::new(StartupTracker::new()), config, metrics, cancel).await;
    }
    let mut cri_config = CriConfig::new(&file.container_runtime_endpoint).request_timeout(file.runtime_request_timeout);
    if let Some(endpoint) = &file.image_service_endpoint {
        cri_config = cri_config.image_endpoint(endpoint);
    }
    let client = Client::connect(&cri_config).context("invalid containerRuntimeEndpoint")?;
    let runtime_config = RuntimeConfig::new(&config.node_name)
        .pod_logs_dir(&file.pod_logs_dir)
        .container_logs_dir(&config.container_logs_dir)
        .pods_dir(config.root_dir.join("pods"))
        .cgroup_root(&config.pods_cgroup)
        .node_ip(&config.node_ip)
        .image_pull_limit(file.image_pull_limit());
    let startup = Arc::new(StartupTracker::new());
    let runtime = Arc::new(CriRuntime::new(client, runtime_config, recorder.clone()).startup_tracker(startup.clone()));
    run_on(runtime, recorder, startup, config, metrics, cancel).await
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
                    fake.start_latency = kubelet_core::node_config::parse_duration(value)
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

/// The agent on any runtime.
async fn run_on<R: Runtime + RuntimeEvents + 'static>(
    runtime: Arc<R>,
    recorder: Arc<RingRecorder>,
    startup: Arc<StartupTracker>,
    config: Settings,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    cancel: CancellationToken,
) -> Result<()> {
    let file = &config.file;
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

    let cache = Arc::new(Cache::new());
    let (pleg, pleg_events) = pleg::EventedPleg::new(runtime.clone(), cache.clone(), pleg::EventedConfig::default());
    let pleg = Arc::new(pleg);
    let runtime_state = Arc::new(RuntimeState::default());
    runtime_state.add_health_check("PLEG", {
        let pleg = pleg.clone();
        Arc::new(move || pleg.healthy())
    });
    let work_queue = Arc::new(WorkQueue::new());
    let statuses = Arc::new(StatusStore::new());
    // Allocatable: capacity minus systemReserved and kubeReserved (upstream's node allocatable).
    let mut node = NodeResources::of_this_node();
    let (reserved_cpu, reserved_memory) = file.reserved();
    node.cpu_milli = (node.cpu_milli - reserved_cpu).max(0);
    node.memory_bytes = (node.memory_bytes - reserved_memory).max(0);
    node.max_pods = file.max_pods as usize;
    let kubelet_config =
        kubelet::Config::new(&config.node_name).root_dir(&config.root_dir).node_ip(&config.node_ip).node(node);
    let sync = Arc::new(
        PodSync::new(runtime.clone(), runtime_state.clone(), statuses.clone(), recorder.clone(), kubelet_config)
            .after_change({
                let pleg = pleg.clone();
                Arc::new(move || pleg.relist_now())
            })
            .work_queue(work_queue.clone())
            .startup_tracker(startup),
    );
    let (file_period, http_period, sync_period) = config.periods();
    let workers = Arc::new(podworkers::PodWorkers::new(
        sync.clone(),
        cache.clone(),
        work_queue.clone(),
        // `syncFrequency`: how soon a synced pod is synced again (upstream's resync interval).
        podworkers::Config::default().resync_interval(sync_period),
        cancel.child_token(),
    ));
    let pods = Arc::new(PodManager::new());
    let mut source_kinds = Vec::new();
    if file.static_pod_path.is_some() {
        source_kinds.push(Source::File);
    }
    if file.static_pod_url.is_some() {
        source_kinds.push(Source::Http);
    }
    let sources = Arc::new(SourcesReady::new(source_kinds));
    let kubelet = Kubelet::new(sync, workers.clone(), pods.clone(), sources.clone());
    let (pod_config, updates) = PodConfig::new(recorder.clone());

    let tracker = TaskTracker::new();
    if let Some(path) = &file.static_pod_path {
        let source = file::FileSource::new(
            file::Config::new(path, &config.node_name).check_frequency(file_period),
            pod_config.source(Source::File),
            recorder.clone(),
        );
        tracker.spawn(source.run(cancel.child_token()).instrument(info_span!("file_source")));
    }
    if let Some(url) = &file.static_pod_url {
        let mut http_config = http::Config::new(url, &config.node_name).check_frequency(http_period);
        for (name, values) in &file.static_pod_url_header {
            for value in values {
                http_config = http_config.header(name, value);
            }
        }
        let source = http::HttpSource::new(http_config, pod_config.source(Source::Http), recorder.clone());
        tracker.spawn(source.run(cancel.child_token()).instrument(info_span!("http_source")));
    }
    tracker.spawn({
        let (pleg, cancel) = (pleg.clone(), cancel.child_token());
        async move { pleg.run(cancel).await }.instrument(info_span!("pleg"))
    });
    // The runtime's health, every 5 s (upstream `updateRuntimeUp`).
    tracker.spawn({
        let (runtime, state, cancel) = (runtime.clone(), runtime_state.clone(), cancel.child_token());
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let status = runtime.status().await;
                if let Err(err) = &status {
                    warn!(error = %err, "container runtime status check failed");
                }
                state.update_from_status(status.as_ref(), Instant::now());
            }
        }
        .instrument(info_span!("runtime_status"))
    });

    // No probes yet: the channel stays open and silent.
    let (_probe_tx, probes) = tokio::sync::mpsc::channel(16);
    let loop_health = Arc::new(LoopHealth::new(Duration::from_secs(60)));
    let api_state = Arc::new(crate::api::ApiState {
        pods: pods.clone(),
        statuses,
        runtime: runtime.clone(),
        loop_health: loop_health.clone(),
        pleg_health: {
            let pleg = pleg.clone();
            Arc::new(move || pleg.healthy().map_err(|e| e.to_string()))
        },
        metrics,
        pod_logs_dir: file.pod_logs_dir.clone(),
        events: recorder.clone(),
        runtime_state: runtime_state.clone(),
    });
    let mut servers = vec![
        crate::api::serve_unix(
            &crate::api::socket_path(&config.root_dir),
            crate::api::local_router(api_state.clone()),
            cancel.child_token(),
        )
        .await?,
    ];
    if let Some(addr) = config.read_only {
        servers.push(crate::api::serve(addr, crate::api::router(api_state.clone()), cancel.child_token()).await?);
    }
    if let Some(addr) = config.healthz {
        servers.push(crate::api::serve(addr, crate::api::healthz_router(api_state), cancel.child_token()).await?);
    }
    let shared = Shared::new(pods, work_queue, sources, runtime_state, loop_health);
    // Keep the config alive for the sources as long as the loop runs.
    let _pod_config = pod_config;
    sync_loop::run(
        &kubelet,
        Inputs::new(updates, pleg_events, probes),
        &shared,
        &sync_loop::Config::default(),
        cancel.clone(),
    )
    .await;
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
    workers.wait().await;
    for server in servers {
        let _ = server.await;
    }
    Ok(())
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
