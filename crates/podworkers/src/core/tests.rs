//! Table tests of the pod worker state machine: every transition rule, without IO.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::core::v1::{PodSpec, PodStatus as ApiPodStatus},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kubelet_core::{CompletionFn, runtime, types::annotations};

use super::*;

fn mk(uid: &str, name: &str, is_static: bool) -> Pod {
    let mut annotations = BTreeMap::new();
    if is_static {
        annotations.insert(annotations::CONFIG_SOURCE.to_owned(), "file".to_owned());
    }
    Pod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            name: Some(name.into()),
            namespace: Some("default".into()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec { termination_grace_period_seconds: Some(30), ..PodSpec::default() }),
        ..Pod::default()
    }
}

fn pod(uid: &str) -> Arc<Pod> {
    Arc::new(mk(uid, &format!("pod-{uid}"), false))
}

fn deleted(mut p: Pod, grace: i64) -> Arc<Pod> {
    p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    p.metadata.deletion_grace_period_seconds = Some(grace);
    Arc::new(p)
}

fn with_phase(mut p: Pod, phase: &str) -> Arc<Pod> {
    p.status = Some(ApiPodStatus { phase: Some(phase.into()), ..ApiPodStatus::default() });
    Arc::new(p)
}

fn upd(kind: SyncPodType, pod: &Arc<Pod>) -> UpdatePodOptions {
    UpdatePodOptions::new(kind, pod.clone())
}

fn kill(pod: &Arc<Pod>, grace: Option<i64>, evict: bool) -> UpdatePodOptions {
    let mut options = KillPodOptions::default();
    options.grace_period_override = grace;
    options.evict = evict;
    UpdatePodOptions::new(SyncPodType::Kill, pod.clone()).with_kill(options)
}

fn uid(s: &str) -> PodUid {
    PodUid::new(s)
}

fn run(core: &mut Core, id: &str) -> Work {
    match core.start_pod_sync(&uid(id), Instant::now()) {
        Start::Run(work) => *work,
        Start::Exit => panic!("{id}: worker told to exit"),
        Start::Idle => panic!("{id}: no pending work"),
        Start::Wait => panic!("{id}: told to wait"),
    }
}

fn queued(spawn: bool, cancel: bool) -> UpdateEffect {
    UpdateEffect::Queued { spawn, cancel }
}

const OK: Outcome = Outcome::Synced { terminal: false };

#[test]
fn effective_grace_period_table() {
    struct Case {
        name: &'static str,
        current: i64,
        deletion: Option<i64>,
        kill: Option<i64>,
        spec: Option<i64>,
        want: (i64, bool),
    }
    let cases = [
        Case {
            name: "defaults to the spec",
            current: 0,
            deletion: None,
            kill: None,
            spec: Some(30),
            want: (30, false),
        },
        Case {
            name: "no spec gives the 1 s floor",
            current: 0,
            deletion: None,
            kill: None,
            spec: None,
            want: (1, false),
        },
        Case {
            name: "deletion grace wins over spec",
            current: 0,
            deletion: Some(10),
            kill: None,
            spec: Some(30),
            want: (10, false),
        },
        Case {
            name: "kill override wins over spec",
            current: 0,
            deletion: None,
            kill: Some(5),
            spec: Some(30),
            want: (5, false),
        },
        Case {
            name: "smaller of deletion and kill",
            current: 0,
            deletion: Some(10),
            kill: Some(20),
            spec: Some(30),
            want: (10, false),
        },
        Case {
            name: "shrinks an existing grace",
            current: 30,
            deletion: Some(10),
            kill: None,
            spec: Some(30),
            want: (10, true),
        },
        Case {
            name: "never grows",
            current: 10,
            deletion: Some(20),
            kill: Some(25),
            spec: Some(60),
            want: (10, false),
        },
        Case {
            name: "unchanged is not shortened",
            current: 10,
            deletion: Some(10),
            kill: None,
            spec: Some(30),
            want: (10, false),
        },
        Case {
            name: "explicit zero becomes the floor",
            current: 0,
            deletion: None,
            kill: Some(0),
            spec: Some(30),
            want: (1, false),
        },
        Case {
            name: "zero shrinks to the floor",
            current: 30,
            deletion: Some(0),
            kill: None,
            spec: Some(30),
            want: (1, true),
        },
        Case {
            name: "negative clamps to the floor",
            current: 0,
            deletion: None,
            kill: Some(-5),
            spec: Some(30),
            want: (1, false),
        },
    ];
    for case in cases {
        let mut p = mk("u", "p", false);
        p.metadata.deletion_grace_period_seconds = case.deletion;
        p.spec.as_mut().unwrap().termination_grace_period_seconds = case.spec;
        let mut options = KillPodOptions::default();
        options.grace_period_override = case.kill;
        assert_eq!(effective_grace_period(case.current, Some(&p), Some(&options)), case.want, "{}", case.name);
    }
}

#[test]
fn first_update_decides_the_first_work() {
    struct Case {
        name: &'static str,
        update: UpdatePodOptions,
        want: WorkType,
        evicted: bool,
        deleted: bool,
    }
    let cases = [
        Case {
            name: "create syncs",
            update: upd(SyncPodType::Create, &pod("a")),
            want: WorkType::Sync,
            evicted: false,
            deleted: false,
        },
        Case {
            name: "deletion timestamp terminates",
            update: upd(SyncPodType::Update, &deleted(mk("a", "a", false), 10)),
            want: WorkType::Terminating,
            evicted: false,
            deleted: true,
        },
        Case {
            name: "succeeded phase terminates",
            update: upd(SyncPodType::Create, &with_phase(mk("a", "a", false), "Succeeded")),
            want: WorkType::Terminating,
            evicted: false,
            deleted: false,
        },
        Case {
            name: "failed phase terminates",
            update: upd(SyncPodType::Create, &with_phase(mk("a", "a", false), "Failed")),
            want: WorkType::Terminating,
            evicted: false,
            deleted: false,
        },
        Case {
            name: "kill terminates",
            update: kill(&pod("a"), None, false),
            want: WorkType::Terminating,
            evicted: false,
            deleted: false,
        },
        Case {
            name: "eviction terminates",
            update: kill(&pod("a"), Some(0), true),
            want: WorkType::Terminating,
            evicted: true,
            deleted: false,
        },
    ];
    for case in cases {
        let mut core = Core::default();
        assert_eq!(
            core.update_pod(case.update, Instant::now(), || false),
            queued(true, case.want != WorkType::Sync),
            "{}",
            case.name
        );
        let work = run(&mut core, "a");
        assert_eq!(work.kind, case.want, "{}", case.name);
        let status = core.status(&uid("a")).unwrap();
        assert_eq!((status.evicted, status.deleted), (case.evicted, case.deleted), "{}", case.name);
        if case.want == WorkType::Terminating {
            assert!(work.grace_period >= 1, "{}", case.name);
            assert!(core.is_pod_termination_requested(&uid("a")));
        }
    }
}

#[test]
fn only_the_newest_pending_update_runs_and_keeps_the_oldest_start_time() {
    let mut core = Core::default();
    let t0 = Instant::now();
    let first = pod("a");
    let mut second = mk("a", "pod-a", false);
    second.metadata.resource_version = Some("2".into());
    let second = Arc::new(second);
    assert_eq!(
        core.update_pod(upd(SyncPodType::Create, &first).with_start_time(t0), t0, || false),
        queued(true, false)
    );
    let later = t0 + std::time::Duration::from_secs(1);
    assert_eq!(
        core.update_pod(upd(SyncPodType::Update, &second).with_start_time(later), later, || false),
        queued(false, false)
    );
    let work = run(&mut core, "a");
    assert_eq!(work.options.pod.as_ref().unwrap().metadata.resource_version.as_deref(), Some("2"));
    assert_eq!(work.options.start_time, Some(t0));
    assert!(work.first_start);
    assert!(matches!(core.start_pod_sync(&uid("a"), Instant::now()), Start::Idle));
}

#[test]
fn a_kill_is_never_overwritten_by_a_later_update() {
    let mut core = Core::default();
    let p = pod("a");
    core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || false);
    run(&mut core, "a");
    core.complete(&uid("a"), &run_work(WorkType::Sync, &p), OK, Instant::now());
    assert_eq!(core.update_pod(kill(&p, Some(7), false), Instant::now(), || false), queued(false, true));
    // A resync arrives before the worker picks the kill up.
    assert_eq!(core.update_pod(upd(SyncPodType::Sync, &p), Instant::now(), || false), queued(false, false));
    let work = run(&mut core, "a");
    assert_eq!(work.kind, WorkType::Terminating);
    assert_eq!(work.grace_period, 7, "the kill's grace survives the later update");
}

fn run_work(kind: WorkType, p: &Arc<Pod>) -> Work {
    Work { kind, options: upd(SyncPodType::Sync, p), grace_period: 0, status_fn: None, first_start: false }
}

#[test]
fn cancellation_happens_on_becoming_terminating_and_on_shorter_grace_only() {
    let mut core = Core::default();
    let p = pod("a");
    let now = Instant::now();
    assert_eq!(core.update_pod(upd(SyncPodType::Create, &p), now, || false), queued(true, false));
    run(&mut core, "a");
    assert_eq!(core.update_pod(upd(SyncPodType::Update, &p), now, || false), queued(false, false), "plain update");
    assert_eq!(core.update_pod(kill(&p, Some(20), false), now, || false), queued(false, true), "became terminating");
    assert_eq!(core.update_pod(kill(&p, Some(20), false), now, || false), queued(false, false), "same grace");
    assert_eq!(
        core.update_pod(kill(&p, Some(30), false), now, || false),
        queued(false, false),
        "longer grace is ignored"
    );
    assert_eq!(core.status(&uid("a")).unwrap().grace_period(), 20);
    assert_eq!(core.update_pod(kill(&p, Some(5), false), now, || false), queued(false, true), "shorter grace");
    assert_eq!(core.status(&uid("a")).unwrap().grace_period(), 5);
    assert_eq!(run(&mut core, "a").grace_period, 5);
}

#[test]
fn full_lifecycle_sync_terminating_terminated_finished_forgotten() {
    let mut core = Core::default();
    let p = pod("a");
    let a = uid("a");
    core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || false);
    let work = run(&mut core, "a");
    assert_eq!(work.kind, WorkType::Sync);
    assert_eq!(
        core.complete(&a, &work, OK, Instant::now()),
        Completion { exit: false, requeue: Some(Requeue::Resync), wake: false }
    );
    assert!(core.could_have_running_containers(&a));

    core.update_pod(kill(&p, None, false), Instant::now(), || false);
    let work = run(&mut core, "a");
    assert_eq!((work.kind, work.grace_period), (WorkType::Terminating, 30));
    let done = core.complete(&a, &work, OK, Instant::now());
    assert_eq!(
        done,
        Completion { exit: false, requeue: Some(Requeue::Immediately), wake: true },
        "terminated runs at once"
    );
    assert!(core.is_pod_known_terminated(&a));
    assert!(!core.could_have_running_containers(&a));

    let work = run(&mut core, "a");
    assert_eq!(work.kind, WorkType::Terminated);
    assert_eq!(core.complete(&a, &work, OK, Instant::now()), Completion { exit: true, requeue: None, wake: false });
    assert_eq!(
        core.update_pod(upd(SyncPodType::Update, &p), Instant::now(), || false),
        UpdateEffect::Ignored("pod is finished, no further updates")
    );

    // Still desired: kept. Gone from config: forgotten, and the UID may start again.
    core.sync_known_pods(&HashSet::from([a.clone()]), Instant::now());
    assert!(core.is_pod_known(&a));
    let (report, effects) = core.sync_known_pods(&HashSet::new(), Instant::now());
    assert!(report.is_empty() && effects.is_empty());
    assert_eq!(core.sizes(), (0, 0, 0));
    assert!(!core.could_have_running_containers(&a), "unknown after housekeeping means not running");
    assert_eq!(core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || false), queued(true, false));
}

#[test]
fn terminal_sync_result_moves_to_terminating_at_once() {
    let mut core = Core::default();
    let p = pod("a");
    core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || false);
    let work = run(&mut core, "a");
    let done = core.complete(&uid("a"), &work, Outcome::Synced { terminal: true }, Instant::now());
    assert_eq!(done, Completion { exit: false, requeue: Some(Requeue::Immediately), wake: true });
    let work = run(&mut core, "a");
    assert_eq!((work.kind, work.grace_period), (WorkType::Terminating, 30));
}

#[test]
fn requeue_delay_follows_the_outcome() {
    let cases = [
        (Outcome::Synced { terminal: false }, Requeue::Resync),
        (Outcome::Failed { network_not_ready: false }, Requeue::Backoff),
        (Outcome::Failed { network_not_ready: true }, Requeue::NetworkBackoff),
        (Outcome::Cancelled, Requeue::Backoff),
    ];
    for (outcome, want) in cases {
        let mut core = Core::default();
        let p = pod("a");
        core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || false);
        let work = run(&mut core, "a");
        // An update that arrived during the sync makes the worker run again at once.
        core.update_pod(upd(SyncPodType::Update, &p), Instant::now(), || false);
        assert_eq!(
            core.complete(&uid("a"), &work, outcome, Instant::now()),
            Completion { exit: false, requeue: Some(want), wake: true },
            "{outcome:?}"
        );
    }
}

#[test]
fn failed_terminating_sync_is_retried_until_it_succeeds() {
    let mut core = Core::default();
    let p = pod("a");
    core.update_pod(kill(&p, Some(3), false), Instant::now(), || false);
    let work = run(&mut core, "a");
    let done = core.complete(&uid("a"), &work, Outcome::Failed { network_not_ready: false }, Instant::now());
    assert_eq!(done.requeue, Some(Requeue::Backoff));
    assert!(!core.is_pod_known_terminated(&uid("a")));
    // The retry comes as a resync from the work queue; it is still a kill.
    core.update_pod(upd(SyncPodType::Sync, &p), Instant::now(), || false);
    assert_eq!(run(&mut core, "a").kind, WorkType::Terminating);
}

#[test]
fn housekeeping_retries_a_failed_termination_of_a_pod_that_left_the_config() {
    let mut core = Core::default();
    let a = uid("a");
    let p = pod("a");
    let start = Instant::now();
    core.update_pod(upd(SyncPodType::Create, &p), start, || false);
    let work = run(&mut core, "a");
    core.complete(&a, &work, OK, start);
    // The pod leaves the config; its kill fails (StopContainer error, containers still running,
    // or no status to act on: all are a failed sync).
    core.update_pod(kill(&p, None, false), start, || false);
    let work = run(&mut core, "a");
    assert_eq!(work.kind, WorkType::Terminating);
    core.complete(&a, &work, Outcome::Failed { network_not_ready: false }, start);
    core.note_retry(&a, start + Duration::from_secs(10));

    // The work queue never offers a UID the config no longer has; housekeeping does, once the
    // backoff has passed, and again after every failure until the kill succeeds.
    core.sync_known_pods(&HashSet::new(), start + Duration::from_secs(2));
    assert!(core.take_wakeups().is_empty(), "not before the backoff ends");
    for attempt in 1..=3 {
        let now = start + Duration::from_secs(10 * attempt);
        core.sync_known_pods(&HashSet::new(), now);
        assert_eq!(core.take_wakeups(), std::slice::from_ref(&a), "attempt {attempt}");
        let work = run(&mut core, "a");
        assert_eq!(work.kind, WorkType::Terminating);
        if attempt < 3 {
            core.complete(&a, &work, Outcome::Failed { network_not_ready: false }, now);
            core.note_retry(&a, now + Duration::from_secs(10));
            core.sync_known_pods(&HashSet::new(), now);
            assert!(core.take_wakeups().is_empty(), "a running or backing-off worker is left alone");
        } else {
            core.complete(&a, &work, OK, now);
        }
    }
    let work = run(&mut core, "a");
    assert_eq!(work.kind, WorkType::Terminated);
    core.complete(&a, &work, OK, start + Duration::from_secs(31));
    core.sync_known_pods(&HashSet::new(), start + Duration::from_secs(40));
    assert!(core.take_wakeups().is_empty());
    assert!(!core.is_pod_known(&a), "finished and forgotten");
}

#[test]
fn create_for_a_terminating_uid_is_remembered_and_replayed_after_forget() {
    let mut core = Core::default();
    let a = uid("a");
    let p = pod("a");
    core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || false);
    run(&mut core, "a");
    core.update_pod(kill(&p, None, false), Instant::now(), || false);
    assert!(matches!(
        core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || false),
        UpdateEffect::Ignored(_)
    ));
    let terminating = run(&mut core, "a");
    core.complete(&a, &terminating, OK, Instant::now());
    let terminated = run(&mut core, "a");
    core.complete(&a, &terminated, OK, Instant::now());
    // The UID is still desired, but the restart request purges its history.
    core.sync_known_pods(&HashSet::from([a.clone()]), Instant::now());
    assert!(!core.is_pod_known(&a));
    assert_eq!(core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || false), queued(true, false));
    assert_eq!(run(&mut core, "a").kind, WorkType::Sync);
}

#[test]
fn runtime_only_pods_are_killed_then_forgotten() {
    let mut core = Core::default();
    let running = runtime::Pod::new(uid("orphan"), "ghost", "default");
    let sync = UpdatePodOptions::kill_orphan(running.clone(), KillPodOptions::default());
    let mut not_kill = sync.clone();
    not_kill.update_type = SyncPodType::Sync;
    assert_eq!(
        core.update_pod(not_kill, Instant::now(), || false),
        UpdateEffect::Ignored("runtime pods can only be killed")
    );
    assert_eq!(core.update_pod(sync, Instant::now(), || false), queued(true, true));
    let work = run(&mut core, "orphan");
    assert_eq!(work.kind, WorkType::Terminating);
    assert!(work.options.running_pod.is_some());
    assert_eq!(work.options.pod.as_ref().unwrap().metadata.name.as_deref(), Some("ghost"));
    assert_eq!(
        core.complete(&uid("orphan"), &work, OK, Instant::now()),
        Completion { exit: true, requeue: None, wake: false }
    );
    assert_eq!(core.sizes(), (0, 0, 0));
}

#[test]
fn runtime_only_kill_uses_the_known_spec_of_a_configured_pod() {
    let mut core = Core::default();
    let p = pod("a");
    core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || false);
    run(&mut core, "a");
    let running = runtime::Pod::new(uid("a"), "pod-a", "default");
    core.update_pod(UpdatePodOptions::kill_orphan(running, KillPodOptions::default()), Instant::now(), || false);
    let work = run(&mut core, "a");
    assert_eq!(work.kind, WorkType::Terminating);
    assert!(work.options.running_pod.is_none(), "a pod with config is terminated through its spec");
    assert_eq!(work.grace_period, 30);
}

#[test]
fn terminal_pod_with_nothing_running_is_terminated_on_sight_after_a_restart() {
    let mut core = Core::default();
    let p = with_phase(mk("a", "a", false), "Succeeded");
    core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || true);
    assert!(core.is_pod_known_terminated(&uid("a")));
    assert!(core.active_pods().is_empty(), "not active for admission");
    assert_eq!(run(&mut core, "a").kind, WorkType::Terminated);
    // Something still running: it goes through terminating as usual.
    let mut core = Core::default();
    core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || false);
    assert_eq!(run(&mut core, "a").kind, WorkType::Terminating);
}

#[test]
fn static_pods_with_one_full_name_start_one_at_a_time_in_fifo_order() {
    let mut core = Core::default();
    let a = Arc::new(mk("a", "etcd", true));
    let b = Arc::new(mk("b", "etcd", true));
    let c = Arc::new(mk("c", "etcd", true));
    let other = Arc::new(mk("x", "other", true));
    for p in [&a, &b, &c, &other] {
        core.update_pod(upd(SyncPodType::Create, p), Instant::now(), || false);
    }
    assert_eq!(run(&mut core, "a").kind, WorkType::Sync);
    assert!(matches!(core.start_pod_sync(&uid("b"), Instant::now()), Start::Wait));
    assert!(matches!(core.start_pod_sync(&uid("c"), Instant::now()), Start::Wait));
    assert_eq!(run(&mut core, "x").kind, WorkType::Sync, "other names are independent");

    // b is killed before its turn: it can never start, and c is next.
    core.update_pod(kill(&b, None, false), Instant::now(), || false);
    assert!(matches!(core.start_pod_sync(&uid("b"), Instant::now()), Start::Exit));
    assert!(core.status(&uid("b")).unwrap().is_finished());

    // a terminates; c waits until a has finished.
    core.update_pod(kill(&a, None, false), Instant::now(), || false);
    let work = run(&mut core, "a");
    core.complete(&uid("a"), &work, OK, Instant::now());
    core.update_pod(upd(SyncPodType::Sync, &c), Instant::now(), || false);
    assert!(matches!(core.start_pod_sync(&uid("c"), Instant::now()), Start::Wait), "a is terminated but not finished");
    assert!(core.take_wakeups().is_empty(), "nothing released yet");
    let work = run(&mut core, "a");
    core.complete(&uid("a"), &work, OK, Instant::now());
    // a is gone: c is woken at once, without waiting for a resync.
    assert_eq!(core.take_wakeups(), [uid("c")]);
    assert_eq!(run(&mut core, "c").kind, WorkType::Sync);

    let (report, _) = core.sync_known_pods(&HashSet::from([uid("c"), uid("x")]), Instant::now());
    assert_eq!(report.len(), 2);
    assert!(report[&uid("c")].is_static && report[&uid("c")].has_config);
    assert_eq!(core.sizes(), (2, 0, 2));
}

#[test]
fn housekeeping_starts_termination_of_undesired_pods() {
    let mut core = Core::default();
    let p = pod("a");
    core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || false);
    let work = run(&mut core, "a");
    core.complete(&uid("a"), &work, OK, Instant::now());
    let (report, effects) = core.sync_known_pods(&HashSet::new(), Instant::now());
    assert_eq!(effects, vec![(uid("a"), queued(false, true))]);
    let sync = report[&uid("a")];
    assert_eq!((sync.state, sync.orphan, sync.has_config), (WorkerState::Terminating, true, true));
    let work = run(&mut core, "a");
    assert_eq!(work.kind, WorkType::Terminating);
    assert!(!core.should_pod_content_be_removed(&uid("a")), "content stays until terminated");
    core.complete(&uid("a"), &work, OK, Instant::now());
    assert!(core.should_pod_content_be_removed(&uid("a")), "deleted and terminated");
    assert!(core.should_pod_runtime_be_removed(&uid("a")));
}

#[test]
fn status_functions_of_kills_reach_the_terminating_sync() {
    let mut core = Core::default();
    let p = pod("a");
    let mut options = KillPodOptions::default();
    options.evict = true;
    options.status_fn = Some(Arc::new(|status: &mut ApiPodStatus| status.reason = Some("Evicted".into())));
    core.update_pod(UpdatePodOptions::new(SyncPodType::Kill, p).with_kill(options), Instant::now(), || false);
    assert_eq!(core.status_fns(&uid("a")), 1);
    let work = run(&mut core, "a");
    let mut status = ApiPodStatus::default();
    (work.status_fn.expect("status fn"))(&mut status);
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    assert!(core.should_pod_content_be_removed(&uid("a")), "evicted pods' content may go");
}

#[test]
fn queries_before_and_after_the_first_housekeeping() {
    let mut core = Core::default();
    let unknown = uid("nope");
    assert!(core.could_have_running_containers(&unknown), "before housekeeping anything may run");
    assert!(!core.should_pod_runtime_be_removed(&unknown));
    core.sync_known_pods(&HashSet::new(), Instant::now());
    assert!(!core.could_have_running_containers(&unknown));
    assert!(core.should_pod_runtime_be_removed(&unknown));
    assert!(!core.is_pod_termination_requested(&unknown));
}

#[test]
fn a_kills_completion_is_called_once_the_pod_has_stopped() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let on_complete = || {
        let calls = calls.clone();
        let f: CompletionFn = Arc::new(move || {
            calls.fetch_add(1, Ordering::SeqCst);
        });
        let mut options = KillPodOptions::default();
        options.on_complete = Some(f);
        options
    };
    let mut core = Core::default();
    let p = pod("a");
    core.update_pod(upd(SyncPodType::Create, &p), Instant::now(), || false);
    run(&mut core, "a");
    core.update_pod(
        UpdatePodOptions::new(SyncPodType::Kill, p.clone()).with_kill(on_complete()),
        Instant::now(),
        || false,
    );
    core.update_pod(
        UpdatePodOptions::new(SyncPodType::Kill, p.clone()).with_kill(on_complete()),
        Instant::now(),
        || false,
    );
    let work = run(&mut core, "a");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "not before the pod stopped");
    core.complete(&uid("a"), &work, OK, Instant::now());
    assert_eq!(calls.load(Ordering::SeqCst), 2, "every waiting kill");
    // A kill of an already stopped pod completes at once.
    core.update_pod(UpdatePodOptions::new(SyncPodType::Kill, p).with_kill(on_complete()), Instant::now(), || false);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}
