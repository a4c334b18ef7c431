//! [`Manager`]: one task per (pod, container, probe kind), each driving a [`Worker`] (upstream
//! `prober/prober_manager.go` and `worker.go` `run`).

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use kubelet_core::{
    Cache, PodUid, ProbeKind, ProbeManager, ProbeOutcome, ProbeResult, ProbeResults, Runtime,
    clock::instant_of,
    events::{Event, EventRecorder, EventType, ObjectRef},
    runtime::{ContainerState, PodStatus},
    types::is_sidecar,
};
use tokio::{
    sync::{Notify, mpsc},
    time::{Instant, MissedTickBehavior},
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, debug, info_span};

use crate::{
    handlers::{self, HttpTarget, Verdict},
    worker::{Effect, Seen, Step, Thresholds, Worker},
};

/// How the prober runs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// The `User-Agent` of httpGet probes (upstream: `kube-probe/<major>.<minor>`).
    pub user_agent: String,
    /// The address probes of host-network pods go to (default `127.0.0.1`).
    pub node_ip: String,
}

impl Default for Config {
    fn default() -> Self {
        Config { user_agent: "kube-probe/1.36".to_owned(), node_ip: "127.0.0.1".to_owned() }
    }
}

impl Config {
    /// Sets the address probes of host-network pods go to.
    #[must_use]
    pub fn node_ip(mut self, ip: impl Into<String>) -> Self {
        self.node_ip = ip.into();
        self
    }
}

type Key = (PodUid, String, ProbeKind);

struct Inner<R> {
    runtime: Arc<R>,
    cache: Arc<Cache>,
    results: Arc<ProbeResults>,
    updates: mpsc::Sender<ProbeResult>,
    recorder: Arc<dyn EventRecorder>,
    config: Config,
    /// The running workers.
    workers: Mutex<HashMap<Key, Running>>,
    generation: AtomicU64,
    tracker: TaskTracker,
    cancel: CancellationToken,
    started: Instant,
}

/// The prober: runs the liveness, readiness and startup probes of the pods the kubelet adds,
/// records their verdicts in [`ProbeResults`] and sends each change to the sync loop.
pub struct Manager<R> {
    inner: Arc<Inner<R>>,
}

impl<R> std::fmt::Debug for Manager<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

impl<R: Runtime> Manager<R> {
    /// A prober over `runtime` (for exec probes), reading containers from `cache`, writing
    /// verdicts into `results` and their changes into `updates`; `Unhealthy` events go to
    /// `recorder`; every worker stops when `cancel` fires.
    pub fn new(
        runtime: Arc<R>,
        cache: Arc<Cache>,
        results: Arc<ProbeResults>,
        updates: mpsc::Sender<ProbeResult>,
        recorder: Arc<dyn EventRecorder>,
        config: Config,
        cancel: CancellationToken,
    ) -> Self {
        Manager {
            inner: Arc::new(Inner {
                runtime,
                cache,
                results,
                updates,
                recorder,
                config,
                workers: Mutex::new(HashMap::new()),
                generation: AtomicU64::new(0),
                tracker: TaskTracker::new(),
                cancel,
                started: Instant::now(),
            }),
        }
    }

    /// How many workers run.
    pub fn worker_count(&self) -> usize {
        lock(&self.inner.workers).len()
    }

    /// Waits until every worker has stopped (after the cancellation token fired).
    pub async fn wait(&self) {
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
    }

    fn stop_where(&self, mut matches: impl FnMut(&Key) -> bool) {
        for (key, running) in lock(&self.inner.workers).iter() {
            if matches(key) {
                running.cancel.cancel();
            }
        }
    }
}

/// A running worker: its generation (a newer worker may replace it), its token, and what
/// wakes it before its next period.
struct Running {
    generation: u64,
    cancel: CancellationToken,
    trigger: Arc<Notify>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The probes of a container, by kind.
fn probes(container: &Container) -> impl Iterator<Item = (ProbeKind, &Probe)> {
    [
        (ProbeKind::Startup, container.startup_probe.as_ref()),
        (ProbeKind::Readiness, container.readiness_probe.as_ref()),
        (ProbeKind::Liveness, container.liveness_probe.as_ref()),
    ]
    .into_iter()
    .filter_map(|(kind, probe)| Some((kind, probe?)))
}

/// The containers that are probed: the regular ones and the sidecars (init containers with
/// `restartPolicy: Always`), as upstream since sidecars exist.
pub(crate) fn probed_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    let sidecars = spec.and_then(|s| s.init_containers.as_ref()).into_iter().flatten().filter(|c| is_sidecar(c));
    sidecars.chain(spec.map(|s| s.containers.as_slice()).unwrap_or_default())
}

impl<R: Runtime> ProbeManager for Manager<R> {
    fn add_pod(&self, pod: &Arc<Pod>) {
        let uid = PodUid::of(pod);
        let mut workers = lock(&self.inner.workers);
        for container in probed_containers(pod) {
            for (kind, probe) in probes(container) {
                let key = (uid.clone(), container.name.clone(), kind);
                if workers.get(&key).is_some_and(|running| !running.cancel.is_cancelled()) {
                    continue;
                }
                let generation = self.inner.generation.fetch_add(1, Ordering::Relaxed);
                let token = self.inner.cancel.child_token();
                let trigger = Arc::new(Notify::new());
                let running = Running { generation, cancel: token.clone(), trigger: trigger.clone() };
                workers.insert(key.clone(), running);
                let span = info_span!(
                    "probe",
                    pod.uid = %uid,
                    pod.name = pod.metadata.name.as_deref().unwrap_or_default(),
                    container = %container.name,
                    probe = kind.as_str(),
                );
                let task = WorkerTask {
                    inner: self.inner.clone(),
                    key,
                    generation,
                    pod: pod.clone(),
                    container: container.clone(),
                    probe: probe.clone(),
                    cancel: token,
                    trigger,
                };
                self.inner.tracker.spawn(task.run().instrument(span));
            }
        }
    }

    fn remove_pod(&self, pod: &Pod) {
        let uid = PodUid::of(pod);
        self.stop_where(|(key_uid, _, _)| *key_uid == uid);
    }

    fn cleanup_pods(&self, desired: &HashSet<PodUid>) {
        self.stop_where(|(uid, _, _)| !desired.contains(uid));
    }

    fn stop_liveness_and_startup(&self, pod: &Pod) {
        let uid = PodUid::of(pod);
        self.stop_where(|(key_uid, _, kind)| *key_uid == uid && *kind != ProbeKind::Readiness);
    }

    fn probe_readiness_now(&self, uid: &PodUid, container: &str) {
        let key = (uid.clone(), container.to_owned(), ProbeKind::Readiness);
        if let Some(running) = lock(&self.inner.workers).get(&key) {
            running.trigger.notify_one();
        }
    }

    fn stopped(&self) -> kubelet_core::hook::BoxFuture<'_, ()> {
        Box::pin(self.wait())
    }
}

/// One worker's task.
struct WorkerTask<R> {
    inner: Arc<Inner<R>>,
    key: Key,
    generation: u64,
    pod: Arc<Pod>,
    container: Container,
    probe: Probe,
    cancel: CancellationToken,
    /// Wakes the worker before its next period ([`ProbeManager::probe_readiness_now`]).
    trigger: Arc<Notify>,
}

/// Seconds from a probe field, at least `min`.
fn seconds(value: Option<i32>, default: i32, min: i32) -> Duration {
    Duration::from_secs(u64::try_from(value.unwrap_or(default).max(min)).unwrap_or(0))
}

impl<R: Runtime> WorkerTask<R> {
    async fn run(self) {
        let kind = self.key.2;
        let period = seconds(self.probe.period_seconds, 10, 1);
        let timeout = seconds(self.probe.timeout_seconds, 1, 1);
        let one = |v: Option<i32>, default: i32| u32::try_from(v.unwrap_or(default).max(1)).unwrap_or(1);
        let thresholds = Thresholds {
            initial_delay: seconds(self.probe.initial_delay_seconds, 0, 0),
            success: one(self.probe.success_threshold, 1),
            failure: one(self.probe.failure_threshold, 3),
        };
        // Probes of pods found when the agent starts would all run at once: each waits a random
        // part of its period first (upstream).
        if self.inner.started.elapsed() < period {
            let jitter = period.mul_f64(fastrand::f64());
            tokio::select! {
                () = self.cancel.cancelled() => return self.finish(None),
                () = tokio::time::sleep(jitter) => {}
            }
        }
        let restart_never = self.pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never");
        let has_startup = self.container.startup_probe.is_some();
        let mut worker = Worker::new(kind, thresholds);
        let mut effects = Vec::new();
        // The container instance and its start on the tokio clock, taken when first seen.
        let mut since: Option<(String, Instant)> = None;
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.cancel.cancelled() => break,
                _ = ticker.tick() => {}
                () = self.trigger.notified() => {}
            }
            let status = self.inner.cache.get(&self.key.0).status;
            let seen = match status.container_status(&self.container.name) {
                None => Seen::Absent,
                Some(c) if c.id.is_empty() => Seen::Absent,
                Some(c) if c.state == ContainerState::Running => {
                    if since.as_ref().is_none_or(|(id, _)| *id != c.id) {
                        let started_at = c.started_at.map_or_else(Instant::now, instant_of);
                        since = Some((c.id.clone(), started_at));
                    }
                    Seen::Running { id: &c.id, since: since.as_ref().map_or_else(Instant::now, |(_, at)| *at) }
                }
                Some(c) => Seen::NotRunning { id: &c.id, exited: c.state == ContainerState::Exited },
            };
            let started = match seen {
                Seen::Running { id, .. } => {
                    !has_startup || self.inner.results.get(ProbeKind::Startup, id) == Some(ProbeOutcome::Success)
                }
                _ => false,
            };
            let step = worker.tick(seen, started, restart_never, Instant::now(), &mut effects);
            for effect in effects.drain(..) {
                self.apply(effect).await;
            }
            let id = match step {
                Step::Wait => continue,
                Step::Stop => break,
                Step::Probe(id) => id,
            };
            let outcome = tokio::select! {
                () = self.cancel.cancelled() => break,
                outcome = self.probe_once(&id, &status, timeout) => outcome,
            };
            if let Some(effect) = worker.record(outcome) {
                self.apply(effect).await;
            }
        }
        self.finish(worker.container_id());
    }

    /// Forgets the verdict of the container probed last, and the worker itself unless a newer
    /// one has taken its place.
    fn finish(&self, container_id: Option<&str>) {
        if let Some(id) = container_id {
            self.inner.results.remove(self.key.2, id);
        }
        let mut workers = lock(&self.inner.workers);
        if workers.get(&self.key).is_some_and(|running| running.generation == self.generation) {
            workers.remove(&self.key);
        }
        debug!("probe worker stopped");
    }

    async fn apply(&self, effect: Effect) {
        let kind = self.key.2;
        match effect {
            Effect::Remove(id) => self.inner.results.remove(kind, &id),
            Effect::Set(id, outcome) => {
                if self.inner.results.set(kind, &self.key.0, &id, outcome) {
                    let result = ProbeResult::new(kind, self.key.0.clone(), id, outcome);
                    tokio::select! {
                        () = self.cancel.cancelled() => {}
                        _ = self.inner.updates.send(result) => {}
                    }
                }
            }
        }
    }

    /// Runs the probe once: its verdict, counted and reported as upstream does.
    async fn probe_once(&self, container_id: &str, status: &PodStatus, timeout: Duration) -> ProbeOutcome {
        let kind = self.key.2;
        let started = Instant::now();
        let verdict = self.verdict(container_id, status, timeout).await;
        let pod = self.pod.metadata.name.clone().unwrap_or_default();
        let namespace = self.pod.metadata.namespace.clone().unwrap_or_default();
        let (result, outcome) = match &verdict {
            Ok(Verdict::Success | Verdict::Warning(_)) => ("successful", ProbeOutcome::Success),
            Ok(Verdict::Failure(_)) => ("failed", ProbeOutcome::Failure),
            Err(_) => ("unknown", ProbeOutcome::Unknown),
        };
        metrics::counter!(
            "prober_probe_total",
            "probe_type" => kind.as_str(),
            "result" => result,
            "container" => self.container.name.clone(),
            "pod" => pod.clone(),
            "namespace" => namespace.clone(),
            "pod_uid" => self.key.0.to_string(),
        )
        .increment(1);
        if outcome != ProbeOutcome::Failure {
            metrics::histogram!(
                "prober_probe_duration_seconds",
                "probe_type" => kind.as_str(),
                "container" => self.container.name.clone(),
                "pod" => pod,
                "namespace" => namespace,
            )
            .record(started.elapsed().as_secs_f64());
        }
        let event = match verdict {
            Ok(Verdict::Success) => None,
            Ok(Verdict::Warning(output)) => {
                Some((EventType::Warning, "ProbeWarning", format!("{} probe warning: {output}", kind.as_str())))
            }
            Ok(Verdict::Failure(output)) => {
                Some((EventType::Warning, "Unhealthy", format!("{} probe failed: {output}", kind.as_str())))
            }
            Err(err) => Some((EventType::Warning, "Unhealthy", format!("{} probe errored: {err}", kind.as_str()))),
        };
        if let Some((event_type, reason, message)) = event {
            debug!(%message, "probe did not pass");
            self.inner.recorder.record(Event::new(event_type, reason, message, ObjectRef::pod(&self.pod)));
        }
        outcome
    }

    async fn verdict(
        &self,
        container_id: &str,
        status: &PodStatus,
        timeout: Duration,
    ) -> Result<Verdict, handlers::ProbeError> {
        let host_network = self.pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
        let pod_ip = match status.ips.first() {
            Some(ip) if !host_network => ip.as_str(),
            _ => self.inner.config.node_ip.as_str(),
        };
        let probe = &self.probe;
        if let Some(action) = &probe.exec {
            handlers::exec(self.inner.runtime.as_ref(), container_id, action, timeout).await
        } else if let Some(action) = &probe.http_get {
            let target = HttpTarget::of(action, &self.container, pod_ip)?;
            Ok(handlers::http(&target, &self.inner.config.user_agent, timeout).await)
        } else if let Some(action) = &probe.tcp_socket {
            let host = action.host.as_deref().filter(|h| !h.is_empty()).unwrap_or(pod_ip);
            let port = handlers::resolve_port(&action.port, &self.container)?;
            Ok(handlers::tcp(host, port, timeout).await)
        } else if let Some(action) = &probe.grpc {
            Ok(handlers::grpc(pod_ip, action, timeout).await)
        } else {
            Err(handlers::ProbeError("missing probe handler".to_owned()))
        }
    }
}

#[cfg(test)]
mod tests;
