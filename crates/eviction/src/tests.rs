//! The manager's rounds over stats and pod workers that record what they are asked.

use std::sync::{Arc, Mutex};

use k8s_openapi::{
    api::core::v1::{EmptyDirVolumeSource, Pod, PodStatus as ApiPodStatus, Volume},
    apimachinery::pkg::api::resource::Quantity,
};
use kubelet_core::{
    PodUid, SyncPodType, UpdatePodOptions,
    events::RingRecorder,
    eviction::{NodePressure, Pressure, Signal, Threshold, ThresholdValue},
    hook::BoxFuture,
    testing::{self, RecordingWorkers},
};

use super::*;
use crate::{
    rank::{ContainerUsage, DiskUsage, PodStatsMap},
    state::Observation,
};

const MI: u64 = 1024 * 1024;

#[derive(Default)]
struct FakeStats {
    observations: Mutex<Observations>,
    pods: Mutex<PodStatsMap>,
    /// The answers to `dedicated_image_fs`, the first first; `Some(false)` once they run out.
    dedicated: Mutex<Vec<Option<bool>>>,
    dedicated_asked: Mutex<u32>,
}

impl StatsProvider for Arc<FakeStats> {
    async fn observe(&self) -> Observations {
        self.observations.lock().unwrap().clone()
    }
    async fn dedicated_image_fs(&self) -> Option<bool> {
        *self.dedicated_asked.lock().unwrap() += 1;
        let mut answers = self.dedicated.lock().unwrap();
        if answers.is_empty() { Some(false) } else { answers.remove(0) }
    }
    async fn pod_stats(&self, pods: &[Arc<Pod>], _need: Need) -> PodStatsMap {
        let all = self.pods.lock().unwrap();
        pods.iter().filter_map(|p| all.get(&PodUid::of(p)).map(|s| (PodUid::of(p), s.clone()))).collect()
    }
}

/// Reclaim that frees `frees` bytes of nodefs in the stats when called.
struct Reclaim {
    stats: Arc<FakeStats>,
    frees: u64,
    calls: Mutex<u32>,
}

impl NodeReclaim for Reclaim {
    fn delete_unused_containers(&self) -> BoxFuture<'_, Result<(), ReclaimError>> {
        *self.calls.lock().unwrap() += 1;
        Box::pin(async { Ok(()) })
    }
    fn delete_unused_images(&self) -> BoxFuture<'_, Result<(), ReclaimError>> {
        let mut observations = self.stats.observations.lock().unwrap();
        if let Some(nodefs) = observations.get_mut(&Signal::NodeFsAvailable) {
            nodefs.available += self.frees;
        }
        Box::pin(async { Ok(()) })
    }
}

struct Fixture {
    stats: Arc<FakeStats>,
    workers: Arc<RecordingWorkers>,
    pressure: Arc<NodePressure>,
    pods: Arc<Mutex<Vec<Arc<Pod>>>>,
}

fn fixture(thresholds: Vec<Threshold>) -> (Fixture, Manager<Arc<FakeStats>, RecordingWorkers>) {
    let f = Fixture { stats: Arc::default(), workers: Arc::default(), pressure: Arc::default(), pods: Arc::default() };
    let active: ActivePods = {
        let pods = f.pods.clone();
        Arc::new(move || pods.lock().unwrap().clone())
    };
    let manager = Manager::new(
        Config::new(thresholds),
        f.stats.clone(),
        f.workers.clone(),
        active,
        Arc::new(RingRecorder::default()),
        "node-1",
        f.pressure.clone(),
    );
    (f, manager)
}

fn nodefs(available: u64) -> Observations {
    Observations::from([(Signal::NodeFsAvailable, Observation::new(available, 1000 * MI))])
}

fn pod_with(name: &str, qos_memory: Option<&str>) -> Arc<Pod> {
    let mut pod = testing::pod(name, &["c"]);
    if let Some(memory) = qos_memory {
        let both = [("memory".to_owned(), Quantity(memory.into())), ("cpu".to_owned(), Quantity("100m".into()))];
        pod.spec.as_mut().unwrap().containers[0].resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(both.clone().into()),
            limits: Some(both.into()),
            ..Default::default()
        });
    }
    Arc::new(pod)
}

fn logs(bytes: u64) -> PodStats {
    PodStats {
        containers: vec![ContainerUsage {
            name: "c".into(),
            logs: Some(DiskUsage::new(bytes, 1)),
            rootfs: Some(DiskUsage::new(0, 0)),
            ..ContainerUsage::default()
        }],
        ..PodStats::default()
    }
}

/// The kills asked for since the last call: the pod's name, the grace period and the final
/// status the kill gives it.
fn kills(workers: &RecordingWorkers) -> Vec<(String, Option<i64>, ApiPodStatus)> {
    let kill = |options: UpdatePodOptions| {
        assert_eq!(options.update_type, SyncPodType::Kill);
        let kill = options.kill.unwrap();
        let mut status = ApiPodStatus::default();
        (kill.status_fn.unwrap())(&mut status);
        (options.pod.unwrap().metadata.name.clone().unwrap(), kill.grace_period_override, status)
    };
    workers.take_updates().into_iter().map(kill).collect()
}

fn disk_threshold() -> Threshold {
    Threshold::hard(Signal::NodeFsAvailable, ThresholdValue::Percentage(0.1))
}

#[tokio::test(start_paused = true)]
async fn disk_pressure_reclaims_the_node_first_then_evicts_the_best_effort_pod() {
    let (f, manager) = fixture(vec![disk_threshold()]);
    let reclaim = Arc::new(Reclaim { stats: f.stats.clone(), frees: 10 * MI, calls: Mutex::new(0) });
    let manager = manager.node_reclaim(reclaim.clone());
    let (best_effort, guaranteed) = (pod_with("best-effort", None), pod_with("guaranteed", Some("64Mi")));
    *f.pods.lock().unwrap() = vec![guaranteed.clone(), best_effort.clone()];
    *f.stats.pods.lock().unwrap() =
        PodStatsMap::from([(PodUid::of(&best_effort), logs(40 * MI)), (PodUid::of(&guaranteed), logs(30 * MI))]);
    let mut state = State::new();

    *f.stats.observations.lock().unwrap() = nodefs(95 * MI);
    assert!(manager.synchronize(&mut state, false).await.is_empty(), "the reclaim freed enough");
    assert_eq!(*reclaim.calls.lock().unwrap(), 1);
    assert_eq!(f.pressure.conditions(), [Pressure::Disk]);
    assert!(kills(&f.workers).is_empty());

    *f.stats.observations.lock().unwrap() = nodefs(50 * MI);
    assert_eq!(manager.synchronize(&mut state, false).await.len(), 1);
    let killed = kills(&f.workers);
    let [(name, grace, status)] = killed.as_slice() else { panic!("{killed:?}") };
    assert_eq!(name, "best-effort");
    assert_eq!(*grace, Some(0), "a hard threshold gives no grace");
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    // 10 % of 1000Mi, through a float32 as upstream's percentage is: one byte over.
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "The node was low on resource: ephemeral-storage. Threshold quantity: 104857601, available: 50Mi. \
             Container c was using 40Mi, request is 0, has larger consumption of ephemeral-storage. "
        )
    );
    assert_eq!(status.conditions.as_ref().unwrap()[0].type_, "DisruptionTarget");
}

#[tokio::test(start_paused = true)]
async fn critical_pods_are_never_evicted_and_nothing_happens_without_pressure() {
    let (f, manager) = fixture(vec![disk_threshold()]);
    let mut critical = (*pod_with("critical", None)).clone();
    critical.spec.as_mut().unwrap().priority = Some(kubelet_core::types::SYSTEM_CRITICAL_PRIORITY);
    *f.pods.lock().unwrap() = vec![Arc::new(critical)];
    let mut state = State::new();
    *f.stats.observations.lock().unwrap() = nodefs(500 * MI);
    assert!(manager.synchronize(&mut state, false).await.is_empty());
    assert!(f.pressure.conditions().is_empty());
    *f.stats.observations.lock().unwrap() = nodefs(10 * MI);
    assert!(manager.synchronize(&mut state, false).await.is_empty());
    assert!(kills(&f.workers).is_empty());
    assert_eq!(f.pressure.conditions(), [Pressure::Disk]);
}

#[tokio::test(start_paused = true)]
async fn an_empty_dir_past_its_size_limit_is_evicted_without_node_pressure() {
    let (f, manager) = fixture(Vec::new());
    let mut pod = testing::pod("writer", &["c"]);
    pod.spec.as_mut().unwrap().volumes = Some(vec![Volume {
        name: "scratch".into(),
        empty_dir: Some(EmptyDirVolumeSource { size_limit: Some(Quantity("1Mi".into())), ..Default::default() }),
        ..Volume::default()
    }]);
    let pod = Arc::new(pod);
    *f.pods.lock().unwrap() = vec![pod.clone()];
    let mut usage = logs(0);
    usage.volumes.push(("scratch".into(), DiskUsage::new(MI, 3)));
    f.stats.pods.lock().unwrap().insert(PodUid::of(&pod), usage.clone());
    let mut state = State::new();
    assert!(manager.synchronize(&mut state, false).await.is_empty(), "at the limit is not past it");
    usage.volumes[0].1.bytes = 2 * MI;
    f.stats.pods.lock().unwrap().insert(PodUid::of(&pod), usage);
    assert_eq!(manager.synchronize(&mut state, false).await.len(), 1);
    let killed = kills(&f.workers);
    assert_eq!(
        killed[0].2.message.as_deref(),
        Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ")
    );
}

#[tokio::test(start_paused = true)]
async fn whether_the_images_have_their_own_filesystem_is_asked_until_known() {
    let (f, manager) = fixture(vec![disk_threshold()]);
    *f.stats.observations.lock().unwrap() = nodefs(500 * MI);
    *f.stats.dedicated.lock().unwrap() = vec![None, None, Some(true)];
    let cancel = CancellationToken::new();
    let run = tokio::spawn(manager.run(cancel.clone()));
    // Ten rounds of 10 s: asked at the first three, until it is known.
    tokio::time::sleep(Duration::from_secs(95)).await;
    assert_eq!(*f.stats.dedicated_asked.lock().unwrap(), 3);
    cancel.cancel();
    run.await.unwrap();
}
