//! One test per `computePodActions` rule, each named after the rule.

use k8s_openapi::{
    api::core::v1::{EphemeralContainer, PodSpec},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use kubelet_core::{
    PodUid,
    runtime::{ContainerStatus, SandboxStatus},
};

use super::*;

fn container(name: &str) -> Container {
    Container { name: name.into(), image: Some("busybox:1".into()), ..Container::default() }
}

fn pod(policy: &str, init: &[&str], containers: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            uid: Some("u".into()),
            name: Some("p".into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some(policy.into()),
            init_containers: (!init.is_empty()).then(|| init.iter().map(|n| container(n)).collect()),
            containers: containers.iter().map(|n| container(n)).collect(),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// A status with a ready, networked sandbox at `attempt`.
fn ready(attempt: u32) -> PodStatus {
    let mut status = PodStatus::new(PodUid::new("u"), "p", "default");
    let mut sandbox = SandboxStatus::new("sb", attempt, SandboxState::Ready);
    sandbox.ips = vec!["10.85.0.2".into()];
    status.sandbox_statuses.push(sandbox);
    status
}

fn with(mut status: PodStatus, name: &str, state: ContainerState, exit_code: i32) -> PodStatus {
    let mut c = ContainerStatus::new(format!("id-{name}-{}", status.container_statuses.len()), name, state);
    c.exit_code = exit_code;
    c.hash = hash(&container(name));
    // Newest first, as the runtime reports them.
    status.container_statuses.insert(0, c);
    status
}

fn none() -> ProbeVerdicts {
    ProbeVerdicts::default()
}

fn killed(actions: &PodActions) -> Vec<(&str, KillReason)> {
    actions.containers_to_kill.iter().map(|k| (k.name.as_str(), k.reason)).collect()
}

#[test]
fn no_sandbox_creates_attempt_zero_and_starts_every_container() {
    let a = compute_pod_actions(
        &pod("Always", &[], &["a", "b"]),
        &PodStatus::new(PodUid::new("u"), "p", "default"),
        &none(),
    );
    assert!(a.create_sandbox && a.kill_pod);
    assert_eq!((a.attempt, a.containers_to_start.clone()), (0, vec![0, 1]));
}

#[test]
fn more_than_one_ready_sandbox_is_recreated() {
    let mut status = ready(2);
    status.sandbox_statuses.push(SandboxStatus::new("old", 1, SandboxState::Ready));
    let a = compute_pod_actions(&pod("Always", &[], &["a"]), &status, &none());
    assert!(a.create_sandbox && a.kill_pod);
    assert_eq!(a.attempt, 3);
}

#[test]
fn a_not_ready_newest_sandbox_is_recreated_with_the_next_attempt() {
    let mut status = ready(4);
    status.sandbox_statuses[0].state = SandboxState::NotReady;
    let a = compute_pod_actions(&pod("Always", &[], &["a"]), &status, &none());
    assert!(a.create_sandbox);
    assert_eq!((a.attempt, a.sandbox_id.as_str()), (5, "sb"));
}

#[test]
fn a_changed_network_mode_recreates_the_sandbox() {
    let mut p = pod("Always", &[], &["a"]);
    p.spec.as_mut().unwrap().host_network = Some(true);
    let a = compute_pod_actions(&p, &with(ready(0), "a", ContainerState::Running, 0), &none());
    assert!(a.create_sandbox);
    assert_eq!((a.attempt, a.sandbox_id.as_str()), (1, ""));
}

#[test]
fn a_pod_network_sandbox_without_ip_is_recreated() {
    let mut status = ready(0);
    status.sandbox_statuses[0].ips.clear();
    assert!(compute_pod_actions(&pod("Always", &[], &["a"]), &status, &none()).create_sandbox);
    let mut host = pod("Always", &[], &["a"]);
    host.spec.as_mut().unwrap().host_network = Some(true);
    status.sandbox_statuses[0].network_mode = NetworkMode::Host;
    let status = with(status, "a", ContainerState::Running, 0);
    assert!(!compute_pod_actions(&host, &status, &none()).create_sandbox, "host network needs no IP");
}

#[test]
fn restart_never_with_a_dead_sandbox_and_history_gets_no_new_sandbox() {
    let mut status = with(ready(1), "a", ContainerState::Exited, 1);
    status.sandbox_statuses[0].state = SandboxState::NotReady;
    let a = compute_pod_actions(&pod("Never", &[], &["a"]), &status, &none());
    assert!(a.kill_pod && !a.create_sandbox);
    assert!(a.containers_to_start.is_empty());
}

#[test]
fn recreated_sandbox_under_on_failure_skips_succeeded_containers() {
    let mut status = with(with(ready(0), "a", ContainerState::Exited, 0), "b", ContainerState::Exited, 2);
    status.sandbox_statuses[0].state = SandboxState::NotReady;
    let a = compute_pod_actions(&pod("OnFailure", &[], &["a", "b"]), &status, &none());
    assert!(a.create_sandbox);
    assert_eq!(a.containers_to_start, vec![1]);
}

#[test]
fn nothing_to_start_after_initialization_means_no_new_sandbox() {
    let mut status = with(ready(0), "a", ContainerState::Exited, 0);
    status.sandbox_statuses[0].state = SandboxState::NotReady;
    let a = compute_pod_actions(&pod("OnFailure", &[], &["a"]), &status, &none());
    assert!(a.kill_pod && !a.create_sandbox);
}

#[test]
fn a_new_sandbox_restarts_initialization_from_the_first_init_container() {
    let mut status = with(ready(0), "init", ContainerState::Exited, 0);
    status.sandbox_statuses[0].state = SandboxState::NotReady;
    let a = compute_pod_actions(&pod("Always", &["init", "init2"], &["a"]), &status, &none());
    assert!(a.create_sandbox);
    assert_eq!(a.init_containers_to_start, [0]);
    assert!(a.containers_to_start.is_empty());
}

#[test]
fn init_containers_run_strictly_one_at_a_time() {
    let p = pod("Always", &["i1", "i2"], &["a"]);
    let a = compute_pod_actions(&p, &ready(0), &none());
    assert_eq!((a.init_containers_to_start.clone(), a.containers_to_start.len()), (vec![0], 0));
    let status = with(ready(0), "i1", ContainerState::Running, 0);
    let a = compute_pod_actions(&p, &status, &none());
    assert!(a.init_containers_to_start.is_empty(), "wait while one runs");
    assert!(!a.kill_pod);
    let status = with(ready(0), "i1", ContainerState::Exited, 0);
    assert_eq!(compute_pod_actions(&p, &status, &none()).init_containers_to_start, [1]);
    let status = with(status, "i2", ContainerState::Exited, 0);
    let a = compute_pod_actions(&p, &status, &none());
    assert_eq!(
        (a.init_containers_to_start.clone(), a.containers_to_start.clone()),
        (vec![], vec![0]),
        "regular containers once init is done"
    );
}

#[test]
fn a_failed_init_container_under_never_kills_the_pod() {
    let a =
        compute_pod_actions(&pod("Never", &["i1"], &["a"]), &with(ready(0), "i1", ContainerState::Exited, 1), &none());
    assert!(a.kill_pod);
    assert!(a.init_containers_to_start.is_empty());
}

#[test]
fn a_failed_init_container_under_on_failure_is_restarted() {
    let a = compute_pod_actions(
        &pod("OnFailure", &["i1", "i2"], &["a"]),
        &with(ready(0), "i1", ContainerState::Exited, 1),
        &none(),
    );
    assert!(!a.kill_pod);
    assert_eq!(a.init_containers_to_start, [0]);
}

#[test]
fn an_unknown_init_container_is_killed_before_its_restart() {
    let a = compute_pod_actions(
        &pod("Always", &["i1"], &["a"]),
        &with(ready(0), "i1", ContainerState::Unknown, 0),
        &none(),
    );
    assert_eq!(killed(&a), [("i1", KillReason::Unknown)]);
    assert_eq!(a.init_containers_to_start, [0]);
}

#[test]
fn a_running_regular_container_means_initialization_happened() {
    // The init containers were garbage collected, but the app runs: do not re-run init.
    let a =
        compute_pod_actions(&pod("Always", &["i1"], &["a"]), &with(ready(0), "a", ContainerState::Running, 0), &none());
    assert!(a.init_containers_to_start.is_empty());
    assert!(a.containers_to_start.is_empty() && !a.kill_pod);
}

#[test]
fn ephemeral_containers_start_once_and_never_restart() {
    let mut p = pod("Always", &[], &["a"]);
    p.spec.as_mut().unwrap().ephemeral_containers = Some(vec![EphemeralContainer {
        name: "debug".into(),
        image: Some("busybox".into()),
        ..EphemeralContainer::default()
    }]);
    let status = with(ready(0), "a", ContainerState::Running, 0);
    assert_eq!(compute_pod_actions(&p, &status, &none()).ephemeral_containers_to_start, vec![0]);
    let status = with(status, "debug", ContainerState::Exited, 1);
    assert!(compute_pod_actions(&p, &status, &none()).ephemeral_containers_to_start.is_empty());
}

#[test]
fn restart_policy_always_restarts_any_exit() {
    let a = compute_pod_actions(&pod("Always", &[], &["a"]), &with(ready(0), "a", ContainerState::Exited, 0), &none());
    assert_eq!(a.containers_to_start, vec![0]);
}

#[test]
fn restart_policy_on_failure_restarts_only_failures() {
    let p = pod("OnFailure", &[], &["a"]);
    assert_eq!(
        compute_pod_actions(&p, &with(ready(0), "a", ContainerState::Exited, 1), &none()).containers_to_start,
        vec![0]
    );
    let a = compute_pod_actions(&p, &with(ready(0), "a", ContainerState::Exited, 0), &none());
    assert!(a.containers_to_start.is_empty());
    assert!(a.kill_pod, "nothing kept and nothing to start: the pod is done");
}

#[test]
fn restart_policy_never_restarts_nothing() {
    let a = compute_pod_actions(
        &pod("Never", &[], &["a", "b"]),
        &with(with(ready(0), "a", ContainerState::Exited, 1), "b", ContainerState::Running, 0),
        &none(),
    );
    assert!(a.containers_to_start.is_empty() && !a.kill_pod);
}

#[test]
fn an_unknown_container_is_killed_then_started() {
    let a = compute_pod_actions(&pod("Always", &[], &["a"]), &with(ready(0), "a", ContainerState::Unknown, 0), &none());
    assert_eq!(killed(&a), [("a", KillReason::Unknown)]);
    assert_eq!(a.containers_to_start, vec![0]);
}

#[test]
fn a_created_container_is_started_again() {
    let a = compute_pod_actions(&pod("Never", &[], &["a"]), &with(ready(0), "a", ContainerState::Created, 0), &none());
    assert_eq!(a.containers_to_start, vec![0]);
}

#[test]
fn a_changed_hash_restarts_the_container_whatever_the_policy() {
    let mut p = pod("Never", &[], &["a", "b"]);
    p.spec.as_mut().unwrap().containers[1].image = Some("busybox:2".into());
    let status = with(with(ready(0), "a", ContainerState::Running, 0), "b", ContainerState::Running, 0);
    let a = compute_pod_actions(&p, &status, &none());
    assert_eq!(killed(&a), [("b", KillReason::DefinitionChanged)]);
    assert_eq!(a.containers_to_kill[0].message, "Container b definition changed, will be restarted");
    assert_eq!(a.containers_to_start, vec![1], "only the changed container");
    assert!(!a.kill_pod && !a.create_sandbox);
}

#[test]
fn a_failed_liveness_probe_kills_and_restarts_when_the_policy_allows() {
    let status = with(ready(0), "a", ContainerState::Running, 0);
    let probes = ProbeVerdicts {
        liveness_failed: HashSet::from([status.container_statuses[0].id.clone()]),
        ..ProbeVerdicts::default()
    };
    let a = compute_pod_actions(&pod("Always", &[], &["a"]), &status, &probes);
    assert_eq!(killed(&a), [("a", KillReason::LivenessProbe)]);
    assert_eq!(a.containers_to_kill[0].message, "Container a failed liveness probe, will be restarted");
    assert_eq!(a.containers_to_start, vec![0]);
    let a = compute_pod_actions(&pod("Never", &[], &["a"]), &status, &probes);
    assert_eq!(a.containers_to_kill[0].message, "Container a failed liveness probe");
    assert!(a.containers_to_start.is_empty() && a.kill_pod);
}

#[test]
fn a_failed_startup_probe_kills_and_restarts() {
    let status = with(ready(0), "a", ContainerState::Running, 0);
    let probes = ProbeVerdicts {
        startup_failed: HashSet::from([status.container_statuses[0].id.clone()]),
        ..ProbeVerdicts::default()
    };
    let a = compute_pod_actions(&pod("OnFailure", &[], &["a"]), &status, &probes);
    assert_eq!(killed(&a), [("a", KillReason::StartupProbe)]);
    assert_eq!(a.containers_to_start, vec![0]);
}

#[test]
fn a_probe_kill_takes_the_probes_own_grace_period() {
    let status = with(with(ready(0), "a", ContainerState::Running, 0), "b", ContainerState::Running, 0);
    let (a, b) = (status.container_status("a").unwrap().id.clone(), status.container_status("b").unwrap().id.clone());
    let mut p = pod("Always", &[], &["a", "b"]);
    let probe = |grace| {
        Some(k8s_openapi::api::core::v1::Probe { termination_grace_period_seconds: grace, ..Default::default() })
    };
    let spec = p.spec.as_mut().unwrap();
    spec.containers[0].liveness_probe = probe(Some(7));
    spec.containers[1].startup_probe = probe(None);
    let probes = ProbeVerdicts { liveness_failed: HashSet::from([a]), startup_failed: HashSet::from([b]), ..none() };
    let actions = compute_pod_actions(&p, &status, &probes);
    let graces: Vec<_> = actions.containers_to_kill.iter().map(|k| (k.name.as_str(), k.grace_period)).collect();
    assert_eq!(graces, [("a", Some(7)), ("b", None)], "a probe without its own keeps the pod's");
    let mut changed = p.clone();
    changed.spec.as_mut().unwrap().containers[0].image = Some("busybox:2".into());
    let actions = compute_pod_actions(&changed, &status, &none());
    assert_eq!(actions.containers_to_kill[0].grace_period, None, "only a probe kill uses the probe's");
}

#[test]
fn an_unchanged_running_pod_is_kept_as_is() {
    let a = compute_pod_actions(
        &pod("Always", &[], &["a", "b"]),
        &with(with(ready(3), "a", ContainerState::Running, 0), "b", ContainerState::Running, 0),
        &none(),
    );
    assert_eq!(a, PodActions { sandbox_id: "sb".into(), attempt: 3, ..PodActions::default() });
}

#[test]
fn a_pod_with_a_deletion_timestamp_restarts_nothing() {
    let mut p = pod("Always", &[], &["a"]);
    p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let a = compute_pod_actions(&p, &with(ready(0), "a", ContainerState::Exited, 1), &none());
    assert!(a.containers_to_start.is_empty() && a.kill_pod);
}

#[test]
fn the_newest_instance_of_a_container_decides() {
    // An old failed instance and a newer running one: the running one counts.
    let status = with(with(ready(0), "a", ContainerState::Exited, 1), "a", ContainerState::Running, 0);
    let a = compute_pod_actions(&pod("Always", &[], &["a"]), &status, &none());
    assert!(a.containers_to_start.is_empty() && !a.kill_pod);
}

/// A pod whose init container `sc` is a sidecar (`restartPolicy: Always`), before `i2`.
fn with_sidecar(policy: &str) -> Pod {
    let mut p = pod(policy, &["sc", "i2"], &["a"]);
    p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy = Some("Always".into());
    p
}

#[test]
fn a_started_sidecar_counts_as_done_for_the_init_sequence() {
    let p = with_sidecar("Always");
    assert_eq!(compute_pod_actions(&p, &ready(0), &none()).init_containers_to_start, [0]);
    let status = with(ready(0), "sc", ContainerState::Running, 0);
    let a = compute_pod_actions(&p, &status, &none());
    assert_eq!((a.init_containers_to_start.clone(), a.containers_to_start.len()), (vec![1], 0), "the next one starts");
    let status = with(status, "i2", ContainerState::Exited, 0);
    let a = compute_pod_actions(&p, &status, &none());
    assert!(a.init_containers_to_start.is_empty() && !a.kill_pod, "the running sidecar is left alone: {a:?}");
    assert_eq!(a.containers_to_start, [0], "initialization is done while the sidecar runs");
}

#[test]
fn a_sidecars_startup_probe_gates_the_next_init_container_and_restarts_it_on_failure() {
    let mut p = with_sidecar("Always");
    p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].startup_probe = Some(Default::default());
    let status = with(ready(0), "sc", ContainerState::Running, 0);
    let id = status.container_statuses[0].id.clone();
    let a = compute_pod_actions(&p, &status, &none());
    assert!(a.init_containers_to_start.is_empty() && a.containers_to_kill.is_empty(), "not started yet: {a:?}");
    let failed = ProbeVerdicts { startup_failed: HashSet::from([id.clone()]), ..none() };
    let a = compute_pod_actions(&p, &status, &failed);
    assert_eq!(killed(&a), [("sc", KillReason::StartupProbe)]);
    assert_eq!(a.containers_to_kill[0].message, "Init container sc failed startup probe");
    assert_eq!(a.init_containers_to_start, [0]);
    let passed = ProbeVerdicts { startup_passed: HashSet::from([id]), ..none() };
    assert_eq!(compute_pod_actions(&p, &status, &passed).init_containers_to_start, [1], "started: the next one");
}

#[test]
fn a_sidecar_that_fails_liveness_restarts_without_holding_back_the_next() {
    let p = with_sidecar("Always");
    let status = with(ready(0), "sc", ContainerState::Running, 0);
    let failed = ProbeVerdicts { liveness_failed: HashSet::from([status.container_statuses[0].id.clone()]), ..none() };
    let a = compute_pod_actions(&p, &status, &failed);
    assert_eq!(killed(&a), [("sc", KillReason::LivenessProbe)]);
    assert_eq!(a.init_containers_to_start, [0, 1]);
}

#[test]
fn verdicts_are_taken_from_the_results_store_for_the_pods_containers() {
    let status = with(with(ready(0), "a", ContainerState::Running, 0), "b", ContainerState::Running, 0);
    let (a, b) = (status.container_status("a").unwrap().id.clone(), status.container_status("b").unwrap().id.clone());
    let results = ProbeResults::new();
    let uid = PodUid::new("u");
    results.set(ProbeKind::Liveness, &uid, &a, ProbeOutcome::Failure);
    results.set(ProbeKind::Startup, &uid, &a, ProbeOutcome::Success);
    results.set(ProbeKind::Startup, &uid, &b, ProbeOutcome::Failure);
    results.set(ProbeKind::Liveness, &uid, "other", ProbeOutcome::Failure);
    let verdicts = ProbeVerdicts::of(&results, &status);
    assert_eq!(verdicts.liveness_failed, HashSet::from([a.clone()]));
    assert_eq!(verdicts.startup_passed, HashSet::from([a]));
    assert_eq!(verdicts.startup_failed, HashSet::from([b]));
}

#[test]
fn a_sidecar_restarts_whatever_the_pods_policy() {
    for policy in ["Never", "OnFailure", "Always"] {
        let p = with_sidecar(policy);
        let status = with(with(ready(0), "i2", ContainerState::Exited, 0), "sc", ContainerState::Exited, 1);
        let status = with(status, "a", ContainerState::Running, 0);
        let a = compute_pod_actions(&p, &status, &none());
        assert_eq!(a.init_containers_to_start, [0], "{policy}");
        assert!(!a.kill_pod, "{policy}");
    }
    // Gone from the runtime after initialization: started again too.
    let status = with(ready(0), "a", ContainerState::Running, 0);
    assert_eq!(compute_pod_actions(&with_sidecar("Always"), &status, &none()).init_containers_to_start, [0]);
}

#[test]
fn a_pod_whose_regular_containers_finished_is_done_though_its_sidecar_runs() {
    let p = with_sidecar("OnFailure");
    let status = with(with(ready(0), "sc", ContainerState::Running, 0), "i2", ContainerState::Exited, 0);
    let status = with(status, "a", ContainerState::Exited, 0);
    let a = compute_pod_actions(&p, &status, &none());
    assert!(a.kill_pod, "{a:?}");
    assert!(a.init_containers_to_start.is_empty() && a.containers_to_start.is_empty());
}

#[test]
fn a_changed_sidecar_is_restarted() {
    let mut p = with_sidecar("Always");
    let status = with(with(ready(0), "sc", ContainerState::Running, 0), "i2", ContainerState::Exited, 0);
    let status = with(status, "a", ContainerState::Running, 0);
    p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].image = Some("busybox:2".into());
    let a = compute_pod_actions(&p, &status, &none());
    assert_eq!(killed(&a), [("sc", KillReason::DefinitionChanged)]);
    assert_eq!(a.init_containers_to_start, [0]);
}
