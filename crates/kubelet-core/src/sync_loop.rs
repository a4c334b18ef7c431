//! The sync loop: every reason the kubelet does work, as one closed event enum fed by one
//! `select!` (upstream `syncLoop` and `syncLoopIteration` in `pkg/kubelet/kubelet.go`).
//!
//! Inputs: config updates, PLEG events and probe results on channels; a 1 s tick that syncs the
//! pods whose work-queue time has come, and the work queue's wake for a pod queued to sync now
//! (which upstream has not); a 2 s housekeeping tick that runs only once every config source is
//! ready.
//! While the runtime reports errors the loop does no work and backs off from 100 ms doubling to
//! 5 s.

use std::{sync::Arc, time::Duration};

use tokio::{
    sync::mpsc,
    time::{Instant, MissedTickBehavior, interval_at},
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    Operation, PodUpdate,
    handler::SyncHandler,
    pleg::{PodLifecycleEvent, PodLifecycleEventKind},
    podmanager::PodManager,
    probe::ProbeResult,
    queue::WorkQueue,
    state::{LoopHealth, RuntimeState, SourcesReady},
};

/// Timing of the sync loop; defaults are upstream's.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// How often due work-queue items are synced (1 s).
    pub sync_period: Duration,
    /// How often housekeeping runs (2 s).
    pub housekeeping_period: Duration,
    /// Housekeeping slower than this logs a warning (1 s).
    pub housekeeping_warning: Duration,
    /// First wait while the runtime is unhealthy (100 ms).
    pub runtime_backoff_initial: Duration,
    /// Longest wait while the runtime is unhealthy (5 s).
    pub runtime_backoff_max: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            sync_period: Duration::from_secs(1),
            housekeeping_period: Duration::from_secs(2),
            housekeeping_warning: Duration::from_secs(1),
            runtime_backoff_initial: Duration::from_millis(100),
            runtime_backoff_max: Duration::from_secs(5),
        }
    }
}

impl Config {
    /// Sets the sync tick period.
    #[must_use]
    pub fn sync_period(mut self, period: Duration) -> Self {
        self.sync_period = period;
        self
    }

    /// Sets the housekeeping period.
    #[must_use]
    pub fn housekeeping_period(mut self, period: Duration) -> Self {
        self.housekeeping_period = period;
        self
    }
}

/// The channels the loop reads.
#[derive(Debug)]
#[non_exhaustive]
pub struct Inputs {
    /// Merged config updates; the loop exits when this channel closes, as upstream does.
    pub config: mpsc::Receiver<PodUpdate>,
    /// PLEG events.
    pub pleg: mpsc::Receiver<PodLifecycleEvent>,
    /// Probe results.
    pub probes: mpsc::Receiver<ProbeResult>,
}

impl Inputs {
    /// Bundles the three input channels.
    pub fn new(
        config: mpsc::Receiver<PodUpdate>,
        pleg: mpsc::Receiver<PodLifecycleEvent>,
        probes: mpsc::Receiver<ProbeResult>,
    ) -> Self {
        Inputs { config, pleg, probes }
    }
}

/// The shared state the loop reads besides its channels.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Shared {
    /// The desired pods; PLEG events and due work are resolved to pods here.
    pub pods: Arc<PodManager>,
    /// Pods waiting for their resync.
    pub work_queue: Arc<WorkQueue>,
    /// Which config sources have spoken.
    pub sources: Arc<SourcesReady>,
    /// The runtime's health; the loop idles while it reports errors.
    pub runtime_state: Arc<RuntimeState>,
    /// Progress marks for `/healthz`.
    pub health: Arc<LoopHealth>,
}

impl Shared {
    /// Bundles the shared state.
    pub fn new(
        pods: Arc<PodManager>,
        work_queue: Arc<WorkQueue>,
        sources: Arc<SourcesReady>,
        runtime_state: Arc<RuntimeState>,
        health: Arc<LoopHealth>,
    ) -> Self {
        Shared { pods, work_queue, sources, runtime_state, health }
    }
}

/// Every reason the loop wakes up.
#[derive(Debug)]
enum LoopEvent {
    Config(PodUpdate),
    Pleg(PodLifecycleEvent),
    Probe(ProbeResult),
    SyncTick,
    /// A pod was queued to sync now ([`WorkQueue::enqueue_now`]): the due work is taken as at a
    /// tick.
    WorkQueued,
    Housekeeping,
    Shutdown,
}

/// Runs the sync loop until `cancel` fires or the config channel closes.
pub async fn run<H: SyncHandler>(
    handler: &H,
    mut inputs: Inputs,
    shared: &Shared,
    config: &Config,
    cancel: CancellationToken,
) {
    info!("starting kubelet main sync loop");
    let start = Instant::now();
    let mut sync_ticker = interval_at(start + config.sync_period, config.sync_period);
    sync_ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut housekeeping_ticker = interval_at(start + config.housekeeping_period, config.housekeeping_period);
    housekeeping_ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut open = OpenInputs { pleg: true, probes: true };
    let mut backoff = config.runtime_backoff_initial;

    loop {
        let errors = shared.runtime_state.runtime_errors();
        if !errors.is_empty() {
            warn!(errors = ?errors, retry_in = ?backoff, "skipping pod synchronization");
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(config.runtime_backoff_max);
            continue;
        }
        backoff = config.runtime_backoff_initial;

        shared.health.mark();
        let tickers = Tickers { sync: &mut sync_ticker, housekeeping: &mut housekeeping_ticker };
        let event = next_event(&mut inputs, &mut open, tickers, &shared.work_queue, &cancel).await;
        if matches!(event, LoopEvent::Shutdown) {
            break;
        }
        dispatch(handler, shared, config, event).await;
        shared.health.mark();
    }
    info!("kubelet main sync loop exited");
}

struct OpenInputs {
    pleg: bool,
    probes: bool,
}

/// The loop's periodic wake-ups.
struct Tickers<'a> {
    sync: &'a mut tokio::time::Interval,
    housekeeping: &'a mut tokio::time::Interval,
}

async fn next_event(
    inputs: &mut Inputs,
    open: &mut OpenInputs,
    tickers: Tickers<'_>,
    work_queue: &WorkQueue,
    cancel: &CancellationToken,
) -> LoopEvent {
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => Some(LoopEvent::Shutdown),
            update = inputs.config.recv() => Some(update.map_or_else(|| {
                info!("config channel is closed, exiting the sync loop");
                LoopEvent::Shutdown
            }, LoopEvent::Config)),
            event = inputs.pleg.recv(), if open.pleg => match event {
                Some(event) => Some(LoopEvent::Pleg(event)),
                None => { open.pleg = false; None }
            },
            result = inputs.probes.recv(), if open.probes => match result {
                Some(result) => Some(LoopEvent::Probe(result)),
                None => { open.probes = false; None }
            },
            _ = tickers.sync.tick() => Some(LoopEvent::SyncTick),
            () = work_queue.woken() => Some(LoopEvent::WorkQueued),
            _ = tickers.housekeeping.tick() => Some(LoopEvent::Housekeeping),
        };
        if let Some(event) = event {
            return event;
        }
    }
}

async fn dispatch<H: SyncHandler>(handler: &H, shared: &Shared, config: &Config, event: LoopEvent) {
    match event {
        LoopEvent::Config(update) => {
            debug!(op = ?update.op, source = %update.source, pods = update.pods.len(), "config update");
            match update.op {
                Operation::Add => handler.handle_pod_additions(update.pods).await,
                Operation::Update | Operation::Delete => handler.handle_pod_updates(update.pods).await,
                Operation::Remove => handler.handle_pod_removes(update.pods).await,
                Operation::Reconcile => handler.handle_pod_reconcile(update.pods).await,
                Operation::Set => warn!("kubelet does not support snapshot update"),
            }
            shared.sources.add_source(update.source);
        }
        LoopEvent::Pleg(event) => {
            if event.kind != PodLifecycleEventKind::ContainerRemoved {
                match shared.pods.pod_by_uid(&event.id) {
                    Some(pod) => handler.handle_pod_syncs(vec![pod]).await,
                    // The pod may have been deleted meanwhile; housekeeping handles what is left.
                    None => debug!(pod.uid = %event.id, kind = %event.kind, "PLEG event for an unknown pod"),
                }
            }
            if event.kind == PodLifecycleEventKind::ContainerDied
                && let Some(container_id) = &event.container_id
            {
                handler.handle_container_died(&event.id, container_id).await;
            }
        }
        LoopEvent::Probe(result) => match shared.pods.pod_by_uid(&result.pod_uid) {
            Some(pod) => handler.handle_probe_result(result, pod).await,
            None => debug!(pod.uid = %result.pod_uid, "probe result for an unknown pod"),
        },
        LoopEvent::SyncTick | LoopEvent::WorkQueued => {
            let pods: Vec<_> =
                shared.work_queue.take_due().iter().filter_map(|uid| shared.pods.pod_by_uid(uid)).collect();
            if !pods.is_empty() {
                handler.handle_pod_syncs(pods).await;
            }
        }
        LoopEvent::Housekeeping => {
            if !shared.sources.all_ready() {
                debug!("skipping housekeeping: sources aren't ready yet");
                return;
            }
            let started = Instant::now();
            if let Err(err) = handler.handle_pod_cleanups().await {
                warn!(error = %err, "failed cleaning pods");
            }
            let took = started.elapsed();
            if took > config.housekeeping_warning {
                warn!(?took, expected = ?config.housekeeping_warning, "housekeeping took longer than expected");
            }
        }
        LoopEvent::Shutdown => {}
    }
}

#[cfg(test)]
mod tests;
