//! Property tests: random interleavings of updates, kills, worker wake-ups, sync results,
//! cancellations and housekeeping, checked against a model of what the async layer does.
//!
//! Invariants: never two workers (so never two syncs) for one pod; the newest update is the one
//! that runs; a kill is never lost; the grace period only shrinks; a finished UID never syncs
//! again until housekeeping forgets it; one started static pod per full name; the lifecycle
//! generation moves exactly when a worker's lifecycle did, and is withheld exactly while a
//! termination is under way.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubelet_core::{runtime, types::annotations};
use proptest::{prelude::*, test_runner::RngSeed};

use super::*;

const PODS: [(&str, &str, bool); 4] =
    [("a", "etcd", true), ("b", "etcd", true), ("c", "web", false), ("d", "job", false)];

#[derive(Clone, Debug)]
enum Kind {
    Create,
    Update,
    Sync,
    Delete(i64),
    Kill(Option<i64>),
    Evict,
}

#[derive(Clone, Debug)]
enum Op {
    Update { pod: usize, kind: Kind },
    RuntimeKill { pod: usize },
    Wake { pod: usize },
    Finish { pod: usize, outcome: Outcome },
    Housekeeping { desired: u8 },
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => Just(Kind::Create),
        2 => Just(Kind::Update),
        2 => Just(Kind::Sync),
        1 => (0i64..40).prop_map(Kind::Delete),
        1 => proptest::option::of(0i64..40).prop_map(Kind::Kill),
        1 => Just(Kind::Evict),
    ]
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        4 => any::<bool>().prop_map(|terminal| Outcome::Synced { terminal }),
        1 => any::<bool>().prop_map(|network_not_ready| Outcome::Failed { network_not_ready }),
        1 => Just(Outcome::Cancelled),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let pod = 0..PODS.len();
    prop_oneof![
        4 => (pod.clone(), kind()).prop_map(|(pod, kind)| Op::Update { pod, kind }),
        1 => pod.clone().prop_map(|pod| Op::RuntimeKill { pod }),
        4 => pod.clone().prop_map(|pod| Op::Wake { pod }),
        4 => (pod, outcome()).prop_map(|(pod, outcome)| Op::Finish { pod, outcome }),
        1 => any::<u8>().prop_map(|desired| Op::Housekeeping { desired }),
    ]
}

#[derive(Default)]
struct Model {
    worker: bool,
    wake: bool,
    in_flight: Option<Work>,
    last_version: Option<String>,
    kill_requested: bool,
    grace: Option<i64>,
    finished: bool,
}

fn api_pod(index: usize, version: u64, kind: &Kind) -> Arc<Pod> {
    let (uid, name, is_static) = PODS[index];
    let mut annotations = BTreeMap::new();
    if is_static {
        annotations.insert(annotations::CONFIG_SOURCE.to_owned(), "file".to_owned());
    }
    let mut pod = Pod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            name: Some(name.into()),
            namespace: Some("default".into()),
            resource_version: Some(version.to_string()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            termination_grace_period_seconds: Some(30),
            ..Default::default()
        }),
        ..Pod::default()
    };
    if let Kind::Delete(grace) = kind {
        pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        pod.metadata.deletion_grace_period_seconds = Some(*grace);
    }
    Arc::new(pod)
}

fn options(index: usize, version: u64, kind: &Kind) -> UpdatePodOptions {
    let pod = api_pod(index, version, kind);
    match kind {
        Kind::Create => UpdatePodOptions::new(SyncPodType::Create, pod),
        Kind::Update | Kind::Delete(_) => UpdatePodOptions::new(SyncPodType::Update, pod),
        Kind::Sync => UpdatePodOptions::new(SyncPodType::Sync, pod),
        Kind::Kill(grace) => {
            let mut kill = KillPodOptions::default();
            kill.grace_period_override = *grace;
            UpdatePodOptions::new(SyncPodType::Kill, pod).with_kill(kill)
        }
        Kind::Evict => {
            let mut kill = KillPodOptions::default();
            kill.evict = true;
            kill.grace_period_override = Some(0);
            UpdatePodOptions::new(SyncPodType::Kill, pod).with_kill(kill)
        }
    }
}

fn queued(models: &mut HashMap<usize, Model>, index: usize, effect: UpdateEffect, version: Option<String>, kill: bool) {
    let m = models.entry(index).or_default();
    if let UpdateEffect::Queued { spawn, .. } = effect {
        assert!(!(spawn && m.worker), "a second worker would be spawned for pod {index}");
        if spawn {
            m.worker = true;
        }
        m.wake = true;
        if version.is_some() {
            m.last_version = version;
        }
        m.kill_requested |= kill;
    }
}

fn check_static(core: &Core) {
    let started = ["a", "b"]
        .iter()
        .filter(|u| core.status(&PodUid::new(u)).is_some_and(|s| s.is_started() && !s.is_finished()))
        .count();
    assert!(started <= 1, "two static pods with one full name are started");
}

/// Every pod's lifecycle, known or not.
fn lifecycles(core: &Core) -> Vec<Option<Lifecycle>> {
    PODS.iter().map(|(uid, _, _)| core.lifecycle_of(&PodUid::new(uid))).collect()
}

/// The lifecycle generation moved exactly when some pod's lifecycle did, and it is withheld
/// exactly while some pod is terminating and not finished.
fn check_lifecycle(core: &Core, before: &[Option<Lifecycle>], counted_before: u64) {
    let after = lifecycles(core);
    let moved = core.lifecycle != counted_before;
    assert_eq!(moved, before != after.as_slice(), "lifecycles {before:?} -> {after:?}; counted {moved}");
    let terminating = after.iter().flatten().any(|l| l.terminating());
    assert_eq!(core.lifecycle_generation().is_none(), terminating, "withheld exactly while terminating: {after:?}");
}

fn run_ops(ops: Vec<Op>) {
    let mut core = Core::default();
    let mut models: HashMap<usize, Model> = HashMap::new();
    let mut version = 0u64;
    let now = Instant::now();
    for op in ops {
        let (before, counted_before) = (lifecycles(&core), core.lifecycle);
        match op {
            Op::Update { pod, kind } => {
                version += 1;
                let is_kill = matches!(kind, Kind::Delete(_) | Kind::Kill(_) | Kind::Evict);
                let effect = core.update_pod(options(pod, version, &kind), now, || false);
                queued(&mut models, pod, effect, Some(version.to_string()), is_kill);
                if core.is_pod_termination_requested(&PodUid::new(PODS[pod].0)) {
                    models.entry(pod).or_default().kill_requested = true;
                }
            }
            Op::RuntimeKill { pod } => {
                let (uid, name, _) = PODS[pod];
                let running = runtime::Pod::new(PodUid::new(uid), name, "default");
                let effect =
                    core.update_pod(UpdatePodOptions::kill_orphan(running, KillPodOptions::default()), now, || false);
                queued(&mut models, pod, effect, None, true);
            }
            Op::Wake { pod } => {
                let m = models.entry(pod).or_default();
                if !m.worker || !m.wake || m.in_flight.is_some() {
                    continue;
                }
                m.wake = false;
                match core.start_pod_sync(&PodUid::new(PODS[pod].0), now) {
                    Start::Exit => m.worker = false,
                    Start::Idle | Start::Wait => {}
                    Start::Run(work) => {
                        assert!(!m.finished, "pod {pod} synced again after it finished");
                        if m.kill_requested {
                            assert_ne!(work.kind, WorkType::Sync, "pod {pod}: a kill was lost");
                        }
                        if work.options.running_pod.is_none() && work.kind == WorkType::Sync {
                            let got = work.options.pod.as_ref().and_then(|p| p.metadata.resource_version.clone());
                            assert_eq!(got, m.last_version, "pod {pod}: not the newest update");
                        }
                        if work.kind == WorkType::Terminating {
                            assert!(work.grace_period >= 1);
                            if let Some(previous) = m.grace {
                                assert!(
                                    work.grace_period <= previous,
                                    "pod {pod}: grace grew from {previous} to {}",
                                    work.grace_period
                                );
                            }
                            m.grace = Some(work.grace_period);
                        }
                        m.in_flight = Some(*work);
                    }
                }
            }
            Op::Finish { pod, outcome } => {
                let m = models.entry(pod).or_default();
                let Some(work) = m.in_flight.take() else { continue };
                let done = core.complete(&PodUid::new(PODS[pod].0), &work, outcome, now);
                if matches!(outcome, Outcome::Synced { .. }) && work.kind == WorkType::Terminated {
                    m.finished = true;
                }
                if outcome == (Outcome::Synced { terminal: true }) || work.kind != WorkType::Sync {
                    m.kill_requested = true;
                }
                if done.exit {
                    m.worker = false;
                }
                if done.wake {
                    m.wake = true;
                }
            }
            Op::Housekeeping { desired } => {
                let desired: HashSet<PodUid> =
                    (0..PODS.len()).filter(|i| desired & (1 << i) != 0).map(|i| PodUid::new(PODS[i].0)).collect();
                let (_, effects) = core.sync_known_pods(&desired, now);
                for (uid, effect) in effects {
                    let index = PODS.iter().position(|p| p.0 == uid.as_str()).unwrap();
                    let version = models.get(&index).and_then(|m| m.last_version.clone());
                    queued(&mut models, index, effect, version, true);
                }
            }
        }
        // Forgotten pods start over; their worker must be gone already.
        for (index, m) in &mut models {
            if !core.is_pod_known(&PodUid::new(PODS[*index].0)) && (m.finished || m.kill_requested || m.worker) {
                assert!(!m.worker || m.in_flight.is_none(), "pod {index} forgotten while its sync runs");
                if !m.worker {
                    *m = Model::default();
                }
            }
        }
        check_static(&core);
        check_lifecycle(&core, &before, counted_before);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(kubelet_core::testing::proptest_seed(module_path!())),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_interleavings_keep_the_invariants(ops in proptest::collection::vec(op(), 1..80)) {
        run_ops(ops);
    }
}

#[test]
fn churn_leaves_nothing_behind() {
    let mut core = Core::default();
    let now = Instant::now();
    for i in 0..100_000u32 {
        let uid = format!("churn-{i}");
        let pod = Arc::new(Pod {
            metadata: ObjectMeta {
                uid: Some(uid.clone()),
                name: Some(uid.clone()),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        });
        core.update_pod(UpdatePodOptions::new(SyncPodType::Create, pod.clone()), now, || false);
        let Start::Run(work) = core.start_pod_sync(&PodUid::new(&uid), now) else { panic!("start") };
        core.complete(&PodUid::new(&uid), &work, Outcome::Synced { terminal: false }, now);
        core.update_pod(UpdatePodOptions::new(SyncPodType::Kill, pod), now, || false);
        for _ in 0..2 {
            let Start::Run(work) = core.start_pod_sync(&PodUid::new(&uid), now) else { panic!("stop") };
            core.complete(&PodUid::new(&uid), &work, Outcome::Synced { terminal: false }, now);
        }
        if i % 1000 == 999 {
            core.sync_known_pods(&HashSet::new(), now);
        }
    }
    core.sync_known_pods(&HashSet::new(), now);
    assert_eq!(core.sizes(), (0, 0, 0));
}
