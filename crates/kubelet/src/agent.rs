//! [`Agent`]: a whole node agent wired from parts, generic over the [`Runtime`], the [`Pleg`]
//! and the [`PodWorkers`].
//!
//! The builder makes what every agent shares (the status cache, work queue, pod manager, status
//! store, runtime state and the kubelet itself) and takes the parts that vary as factories: a
//! PLEG over the runtime and the cache, and pod workers over the kubelet's [`PodSync`].
//! [`Agent::run`] then runs the PLEG, a runtime status poll and the sync loop until the
//! cancellation token fires or the config channel closes.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;

use kubelet_core::{
    Cache, LoopHealth, Pleg, PodLifecycleEvent, PodManager, PodUid, PodUpdate, PodWorkers, ProbeManager, ProbeResult,
    ProbeResults, Runtime, RuntimeState, Source, SourcesReady, StartupTracker, VolumeManager, WorkQueue,
    cgroups::PodCgroups,
    events::{EventRecorder, RingRecorder},
    eviction::NodePressure,
    sync_loop::{self, Inputs, Shared},
};
use tokio::{sync::mpsc, time::Instant};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, info_span, warn};

use crate::{Kubelet, MirrorClient, PodSync, admission::ApiNode, status_store::StatusStore};

/// How the agent runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The kubelet's settings: node name and IP, root directory, node resources.
    pub kubelet: crate::Config,
    /// The config sources that feed the agent; housekeeping waits until each has spoken.
    pub sources: Vec<Source>,
    /// The sync loop's periods.
    pub sync_loop: sync_loop::Config,
    /// How often the runtime's status is polled for `/healthz` and the loop's runtime gate
    /// (upstream `updateRuntimeUp`, 5 s).
    pub runtime_status_period: Duration,
    /// How long the sync loop may go without an iteration before `/healthz` fails (60 s).
    pub loop_health_threshold: Duration,
}

impl Config {
    /// Upstream's periods for a kubelet run with `kubelet`, fed by `sources`.
    pub fn new(kubelet: crate::Config, sources: impl IntoIterator<Item = Source>) -> Self {
        Config {
            kubelet,
            sources: sources.into_iter().collect(),
            sync_loop: sync_loop::Config::default(),
            runtime_status_period: Duration::from_secs(5),
            loop_health_threshold: Duration::from_secs(60),
        }
    }

    /// Sets the sync loop's periods.
    #[must_use]
    pub fn sync_loop(mut self, config: sync_loop::Config) -> Self {
        self.sync_loop = config;
        self
    }
}

/// What the pod workers factory of [`Builder::build`] gets: the kubelet's syncer, the cache the
/// workers wait on, the work queue they requeue pods on, and the token that stops them.
#[derive(Debug)]
#[non_exhaustive]
pub struct WorkerParts<R> {
    /// The syncer the workers call.
    pub syncer: Arc<PodSync<R>>,
    /// The status cache (the workers' "newer than" barrier).
    pub cache: Arc<Cache>,
    /// The work queue for resyncs.
    pub work_queue: Arc<WorkQueue>,
    /// Fires when the agent stops.
    pub cancel: CancellationToken,
}

/// What the prober factory of [`Builder::prober`] gets.
#[non_exhaustive]
pub struct ProberParts<R> {
    /// The runtime (exec probes run through it).
    pub runtime: Arc<R>,
    /// The PLEG's status cache: where the prober finds containers and their start times.
    pub cache: Arc<Cache>,
    /// Where verdicts go; the runtime and the status read them.
    pub results: Arc<ProbeResults>,
    /// Where changed verdicts go into the sync loop.
    pub updates: mpsc::Sender<ProbeResult>,
    /// Where events (`Unhealthy`) go.
    pub recorder: Arc<dyn EventRecorder>,
    /// Fires when the agent stops.
    pub cancel: CancellationToken,
}

impl<R> std::fmt::Debug for ProberParts<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProberParts").finish_non_exhaustive()
    }
}

type ProberFactory<R> = Box<dyn FnOnce(ProberParts<R>) -> Arc<dyn ProbeManager> + Send>;

/// Builds an [`Agent`]; see [`Agent::builder`].
pub struct Builder<R> {
    runtime: Arc<R>,
    config: Config,
    recorder: Arc<dyn EventRecorder>,
    startup: Arc<StartupTracker>,
    cancel: CancellationToken,
    prober: Option<ProberFactory<R>>,
    volumes: Option<Arc<dyn VolumeManager>>,
    mirrors: Option<Arc<dyn MirrorClient>>,
    cgroups: Option<Arc<dyn PodCgroups>>,
}

impl<R> std::fmt::Debug for Builder<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder").field("config", &self.config).finish_non_exhaustive()
    }
}

impl<R: Runtime> Builder<R> {
    /// Where events go (default: a [`RingRecorder`] nobody reads).
    #[must_use]
    pub fn recorder(mut self, recorder: Arc<dyn EventRecorder>) -> Self {
        self.recorder = recorder;
        self
    }

    /// Shares a start-up tracker with the runtime, which reports its image pulls into it.
    #[must_use]
    pub fn startup_tracker(mut self, tracker: Arc<StartupTracker>) -> Self {
        self.startup = tracker;
        self
    }

    /// Probes pods with the prober `factory` makes (`kubelet-prober`'s `Manager`, say); without
    /// one, pods with probes are refused (`UnsupportedPodSpec`).
    #[must_use]
    pub fn prober<M: ProbeManager>(mut self, factory: impl FnOnce(ProberParts<R>) -> M + Send + 'static) -> Self {
        self.prober = Some(Box::new(move |parts| Arc::new(factory(parts)) as Arc<dyn ProbeManager>));
        self
    }

    /// Sets up pods' volumes with `volumes` (`kubelet-volumes`' `Manager`, say); without one,
    /// pods with volumes are refused (`UnsupportedPodSpec`).
    #[must_use]
    pub fn volumes<V: VolumeManager>(mut self, volumes: V) -> Self {
        self.volumes = Some(Arc::new(volumes));
        self
    }

    /// Keeps a mirror pod in the API server for each static pod through `mirrors` (cluster
    /// mode); without one, static pods have no mirror.
    #[must_use]
    pub fn mirror_client<M: MirrorClient>(mut self, mirrors: M) -> Self {
        self.mirrors = Some(Arc::new(mirrors));
        self
    }

    /// Makes each pod's cgroup with `cgroups` (`kubelet-cm`'s `CgroupManager`, say) before
    /// its sandbox starts; without one, the runtime makes the cgroups it needs, unset.
    #[must_use]
    pub fn pod_cgroups<C: PodCgroups>(mut self, cgroups: C) -> Self {
        self.cgroups = Some(Arc::new(cgroups));
        self
    }

    /// The token that stops the agent (default: a new one, cancelled by nobody).
    #[must_use]
    pub fn cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }

    /// Wires the agent: `pleg` makes the PLEG over the runtime and the cache and returns it with
    /// its event channel, `workers` makes the pod workers over the kubelet's syncer.
    pub fn build<P, W>(
        self,
        pleg: impl FnOnce(Arc<R>, Arc<Cache>) -> (P, mpsc::Receiver<PodLifecycleEvent>),
        workers: impl FnOnce(WorkerParts<R>) -> W,
    ) -> Agent<R, P, W>
    where
        P: Pleg,
        W: PodWorkers,
    {
        let Builder { runtime, config, recorder, startup, cancel, prober, volumes, mirrors, cgroups } = self;
        let cache = Arc::new(Cache::new());
        let probe_results = Arc::new(ProbeResults::new());
        let (probe_tx, probes) = mpsc::channel(64);
        let prober = prober.map(|factory| {
            factory(ProberParts {
                runtime: runtime.clone(),
                cache: cache.clone(),
                results: probe_results.clone(),
                updates: probe_tx.clone(),
                recorder: recorder.clone(),
                cancel: cancel.child_token(),
            })
        });
        let (pleg, pleg_events) = pleg(runtime.clone(), cache.clone());
        let pleg = Arc::new(pleg);
        let runtime_state = Arc::new(RuntimeState::default());
        runtime_state.add_health_check("PLEG", {
            let pleg = pleg.clone();
            Arc::new(move || pleg.healthy())
        });
        let work_queue = Arc::new(WorkQueue::new());
        let statuses = Arc::new(StatusStore::new());
        let mut syncer = PodSync::new(
            runtime.clone(),
            runtime_state.clone(),
            statuses.clone(),
            recorder.clone(),
            config.kubelet.clone(),
        )
        .after_change({
            let pleg = pleg.clone();
            Arc::new(move || pleg.relist_now())
        })
        .work_queue(work_queue.clone())
        .startup_tracker(startup);
        if let Some(prober) = prober {
            syncer = syncer.prober(prober, probe_results);
        }
        if let Some(volumes) = volumes {
            syncer = syncer.volumes(volumes);
        }
        if let Some(mirrors) = mirrors {
            syncer = syncer.mirror_client(mirrors);
        }
        if let Some(cgroups) = cgroups {
            syncer = syncer.pod_cgroups(cgroups);
        }
        let syncer = Arc::new(syncer);
        let workers = Arc::new(workers(WorkerParts {
            syncer: syncer.clone(),
            cache: cache.clone(),
            work_queue: work_queue.clone(),
            cancel: cancel.child_token(),
        }));
        let pods = Arc::new(PodManager::new());
        let sources = Arc::new(SourcesReady::new(config.sources.iter().copied()));
        let pressure = Arc::new(NodePressure::new());
        let api_node = Arc::new(ApiNode::default());
        let kubelet = Kubelet::new(syncer, workers.clone(), pods.clone(), sources.clone(), cache)
            .with_pressure(pressure.clone())
            .with_api_node(api_node.clone());
        let health = Arc::new(LoopHealth::new(config.loop_health_threshold));
        let shared = Shared::new(pods, work_queue, sources, runtime_state, health);
        Agent {
            runtime,
            pleg,
            pleg_events,
            workers,
            kubelet,
            shared,
            statuses,
            pressure,
            api_node,
            recorder,
            config,
            cancel,
            probe_tx,
            probes,
        }
    }
}

/// A node agent: the kubelet over a runtime, a PLEG and pod workers, behind the sync loop.
pub struct Agent<R, P, W> {
    runtime: Arc<R>,
    pleg: Arc<P>,
    pleg_events: mpsc::Receiver<PodLifecycleEvent>,
    workers: Arc<W>,
    kubelet: Kubelet<R, W>,
    shared: Shared,
    statuses: Arc<StatusStore>,
    pressure: Arc<NodePressure>,
    api_node: Arc<ApiNode>,
    recorder: Arc<dyn EventRecorder>,
    config: Config,
    cancel: CancellationToken,
    probe_tx: mpsc::Sender<ProbeResult>,
    probes: mpsc::Receiver<ProbeResult>,
}

impl<R, P, W> std::fmt::Debug for Agent<R, P, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("config", &self.config).finish_non_exhaustive()
    }
}

impl<R: Runtime> Agent<R, (), ()> {
    /// Starts building an agent over `runtime`.
    pub fn builder(runtime: Arc<R>, config: Config) -> Builder<R> {
        Builder {
            runtime,
            config,
            recorder: Arc::new(RingRecorder::default()),
            startup: Arc::new(StartupTracker::new()),
            cancel: CancellationToken::new(),
            prober: None,
            volumes: None,
            mirrors: None,
            cgroups: None,
        }
    }
}

impl<R: Runtime, P: Pleg, W: PodWorkers> Agent<R, P, W> {
    /// The runtime.
    pub fn runtime(&self) -> &Arc<R> {
        &self.runtime
    }

    /// The queue of pods waiting for their resync: enqueue a pod with no delay to have it synced
    /// at the loop's next tick (within a second), as when an object its volumes show changes.
    pub fn work_queue(&self) -> &Arc<WorkQueue> {
        &self.shared.work_queue
    }

    /// The PLEG.
    pub fn pleg(&self) -> &Arc<P> {
        &self.pleg
    }

    /// The pod workers.
    pub fn workers(&self) -> &Arc<W> {
        &self.workers
    }

    /// The desired pods.
    pub fn pods(&self) -> &Arc<PodManager> {
        &self.shared.pods
    }

    /// The statuses the kubelet computed.
    pub fn statuses(&self) -> &Arc<StatusStore> {
        &self.statuses
    }

    /// The node's pressure conditions: an eviction manager sets them, admission refuses pods
    /// under them, and the node's status reports them.
    pub fn pressure(&self) -> &Arc<NodePressure> {
        &self.pressure
    }

    /// The node's labels and taints as the API server has its Node: a watch of the Node sets
    /// them (cluster mode), and admission uses them in place of the node's own once set.
    pub fn api_node(&self) -> &Arc<ApiNode> {
        &self.api_node
    }

    /// The pods that count against the node now (upstream `GetActivePods`): admitted, not
    /// terminal, not terminated; what an eviction manager chooses among.
    pub fn active_pods(&self) -> Arc<dyn Fn() -> Vec<Arc<Pod>> + Send + Sync> {
        let pods = self.shared.pods.clone();
        let statuses = self.statuses.clone();
        let workers = self.workers.clone();
        Arc::new(move || crate::handler::active_pods(&pods, &statuses, workers.as_ref(), None))
    }

    /// Whether a pod's resources are reclaimed: nothing of it runs and its volumes are gone, or
    /// the agent forgot it (upstream `podResourcesAreReclaimed`, which the eviction manager
    /// waits for after an eviction).
    pub fn pod_resources_reclaimed(&self) -> Arc<dyn Fn(&PodUid) -> bool + Send + Sync> {
        let statuses = self.statuses.clone();
        Arc::new(move |uid| statuses.get(uid).is_none_or(|stored| stored.terminated))
    }

    /// The runtime's health, as the loop and `/healthz` see it.
    pub fn runtime_state(&self) -> &Arc<RuntimeState> {
        &self.shared.runtime_state
    }

    /// The sync loop's progress, for `/healthz`.
    pub fn loop_health(&self) -> &Arc<LoopHealth> {
        &self.shared.health
    }

    /// Where events go.
    pub fn recorder(&self) -> &Arc<dyn EventRecorder> {
        &self.recorder
    }

    /// Where probe results go into the sync loop.
    pub fn probe_sender(&self) -> mpsc::Sender<ProbeResult> {
        self.probe_tx.clone()
    }

    /// Runs the agent on the merged config `updates` until the token fires or `updates` closes;
    /// returns once every task it started has stopped. Running pods keep running.
    pub async fn run(self, updates: mpsc::Receiver<PodUpdate>) {
        let Agent { runtime, pleg, pleg_events, workers, kubelet, shared, cancel, probe_tx, probes, config, .. } = self;
        let tracker = TaskTracker::new();
        tracker.spawn({
            let (pleg, cancel) = (pleg.clone(), cancel.child_token());
            async move { pleg.run(cancel).await }.instrument(info_span!("pleg"))
        });
        tracker.spawn(
            poll_runtime_status(
                runtime,
                shared.runtime_state.clone(),
                config.runtime_status_period,
                cancel.child_token(),
            )
            .instrument(info_span!("runtime_status")),
        );
        tracker.spawn({
            let (cleanups, cancel) = (kubelet.cleanups().clone(), cancel.child_token());
            async move { cleanups.run(cancel).await }.instrument(info_span!("cleanups"))
        });
        sync_loop::run(&kubelet, Inputs::new(updates, pleg_events, probes), &shared, &config.sync_loop, cancel.clone())
            .await;
        drop(probe_tx);
        cancel.cancel();
        tracker.close();
        tracker.wait().await;
        workers.wait().await;
        kubelet.prober_stopped().await;
    }
}

/// The runtime's health, every `period` (upstream `updateRuntimeUp`).
async fn poll_runtime_status<R: Runtime>(
    runtime: Arc<R>,
    state: Arc<RuntimeState>,
    period: Duration,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let status = runtime.status().await;
        if let Err(err) = &status {
            warn!(error = %kubelet_core::ErrorChain(err), "container runtime status check failed");
        }
        state.update_from_status(status.as_ref(), Instant::now());
    }
}
