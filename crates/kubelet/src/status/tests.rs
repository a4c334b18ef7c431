//! One test per phase and condition rule (upstream `getPhase` and `status/generate.go`).

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, PodReadinessGate,
        PodSpec,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};

use super::*;
use kubelet_core::types::annotations;

fn c(name: &str) -> Container {
    Container { name: name.into(), ..Container::default() }
}

fn sidecar(name: &str) -> Container {
    Container { name: name.into(), restart_policy: Some("Always".into()), ..Container::default() }
}

fn pod(policy: &str, init: Vec<Container>, containers: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta { name: Some("p".into()), ..ObjectMeta::default() },
        spec: Some(PodSpec {
            restart_policy: Some(policy.into()),
            init_containers: (!init.is_empty()).then_some(init),
            containers: containers.iter().map(|n| c(n)).collect(),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

fn run(name: &str) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(ContainerState { running: Some(ContainerStateRunning::default()), ..Default::default() }),
        started: Some(true),
        ready: true,
        ..ContainerStatus::default()
    }
}

fn done(name: &str, code: i32) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated { exit_code: code, ..Default::default() }),
            ..Default::default()
        }),
        ready: code == 0,
        ..ContainerStatus::default()
    }
}

fn wait(name: &str, last_exit: Option<i32>) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        state: Some(ContainerState {
            waiting: Some(ContainerStateWaiting { reason: Some("CrashLoopBackOff".into()), ..Default::default() }),
            ..Default::default()
        }),
        last_state: last_exit.map(|code| ContainerState {
            terminated: Some(ContainerStateTerminated { exit_code: code, ..Default::default() }),
            ..Default::default()
        }),
        ..ContainerStatus::default()
    }
}

fn phase(p: &Pod, statuses: &[ContainerStatus]) -> &'static str {
    pod_phase(p, statuses, false, false)
}

#[test]
fn failed_init_container_under_never_is_failed() {
    assert_eq!(phase(&pod("Never", vec![c("i")], &["a"]), &[done("i", 1)]), FAILED);
    assert_eq!(
        phase(&pod("Never", vec![c("i")], &["a"]), &[wait("i", Some(2))]),
        FAILED,
        "a waiting restart of a failure"
    );
    assert_eq!(phase(&pod("OnFailure", vec![c("i")], &["a"]), &[done("i", 1)]), PENDING, "restarted otherwise");
}

#[test]
fn pending_init_containers_keep_the_pod_pending() {
    let p = pod("Always", vec![c("i1"), c("i2")], &["a"]);
    assert_eq!(phase(&p, &[]), PENDING);
    assert_eq!(phase(&p, &[run("i1")]), PENDING);
    assert_eq!(phase(&p, &[done("i1", 0)]), PENDING, "i2 has no status yet");
    assert_eq!(phase(&p, &[done("i1", 0), done("i2", 0), run("a")]), RUNNING);
}

#[test]
fn a_waiting_container_without_history_is_pending() {
    assert_eq!(phase(&pod("Always", vec![], &["a", "b"]), &[run("a"), wait("b", None)]), PENDING);
}

#[test]
fn running_with_nothing_unknown_is_running() {
    assert_eq!(phase(&pod("Always", vec![], &["a", "b"]), &[run("a"), done("b", 0)]), RUNNING);
    assert_eq!(phase(&pod("Always", vec![], &["a", "b"]), &[run("a")]), PENDING, "b unknown");
}

#[test]
fn all_stopped_under_always_is_running() {
    assert_eq!(phase(&pod("Always", vec![], &["a"]), &[done("a", 0)]), RUNNING, "it will be restarted");
    assert_eq!(
        phase(&pod("Always", vec![], &["a"]), &[wait("a", Some(1))]),
        RUNNING,
        "waiting with a last termination counts as stopped"
    );
}

#[test]
fn all_succeeded_is_succeeded_unless_always() {
    assert_eq!(phase(&pod("OnFailure", vec![], &["a", "b"]), &[done("a", 0), done("b", 0)]), SUCCEEDED);
    assert_eq!(phase(&pod("Never", vec![], &["a"]), &[done("a", 0)]), SUCCEEDED);
}

#[test]
fn a_failure_under_never_is_failed_and_under_on_failure_is_running() {
    assert_eq!(phase(&pod("Never", vec![], &["a", "b"]), &[done("a", 0), done("b", 3)]), FAILED);
    assert_eq!(phase(&pod("OnFailure", vec![], &["a"]), &[done("a", 3)]), RUNNING, "it will be restarted");
}

#[test]
fn a_terminal_pod_is_succeeded_or_failed_whatever_the_policy() {
    let p = pod("Always", vec![], &["a", "b"]);
    assert_eq!(pod_phase(&p, &[done("a", 0), done("b", 0)], true, true), SUCCEEDED);
    assert_eq!(pod_phase(&p, &[done("a", 0), done("b", 137)], true, true), FAILED);
    // Static pods are not given a terminal phase that way (upstream TODO #116484).
    let mut static_pod = p.clone();
    static_pod.metadata.annotations =
        Some(BTreeMap::from([(annotations::CONFIG_SOURCE.to_owned(), "file".to_owned())]));
    assert_eq!(pod_phase(&static_pod, &[done("a", 0), done("b", 137)], true, true), RUNNING);
}

#[test]
fn restartable_init_containers_count_as_running_and_pending_until_started() {
    let p = pod("Always", vec![sidecar("log")], &["a"]);
    let mut not_started = run("log");
    not_started.started = Some(false);
    assert_eq!(pod_phase(&p, &[not_started.clone()], false, false), PENDING);
    assert_eq!(pod_phase(&p, &[run("log"), run("a")], false, true), RUNNING);
    // Once initialized, a restarting sidecar does not send the pod back to Pending.
    assert_eq!(pod_phase(&p, &[not_started, run("a")], false, true), RUNNING);
    // A terminated sidecar is ignored.
    assert_eq!(
        pod_phase(&pod("Never", vec![sidecar("log")], &["a"]), &[done("log", 137), done("a", 0)], false, true),
        SUCCEEDED
    );
}

#[test]
fn terminal_phases_are_sticky() {
    assert_eq!(sticky_phase(Some(SUCCEEDED), RUNNING), SUCCEEDED);
    assert_eq!(sticky_phase(Some(FAILED), PENDING), FAILED);
    assert_eq!(sticky_phase(Some(RUNNING), FAILED), FAILED);
    assert_eq!(sticky_phase(None, PENDING), PENDING);
}

#[test]
fn containers_ready_lists_unknown_and_unready_containers() {
    let p = pod("Always", vec![sidecar("log")], &["a", "b", "c"]);
    let mut unready = run("b");
    unready.ready = false;
    let got = containers_ready(&p, &[run("log"), run("a"), unready], RUNNING);
    assert_eq!((got.status.as_str(), got.reason.as_deref()), ("False", Some("ContainersNotReady")));
    assert_eq!(
        got.message.as_deref(),
        Some("containers with unknown status: [c], containers with unready status: [b]")
    );
    let ready = containers_ready(&p, &[run("log"), run("a"), run("b"), run("c")], RUNNING);
    assert_eq!((ready.status.as_str(), ready.reason), ("True", None));
}

#[test]
fn terminal_pods_are_not_ready_with_pod_completed_or_pod_failed() {
    let p = pod("Never", vec![], &["a"]);
    assert_eq!(containers_ready(&p, &[done("a", 0)], SUCCEEDED).reason.as_deref(), Some("PodCompleted"));
    assert_eq!(containers_ready(&p, &[done("a", 1)], FAILED).reason.as_deref(), Some("PodFailed"));
    assert_eq!(pod_ready(&p, &[], &[done("a", 0)], SUCCEEDED).reason.as_deref(), Some("PodCompleted"));
}

#[test]
fn ready_follows_containers_ready_and_readiness_gates() {
    let mut p = pod("Always", vec![], &["a"]);
    let not_ready = pod_ready(&p, &[], &[wait("a", None)], PENDING);
    assert_eq!((not_ready.type_.as_str(), not_ready.reason.as_deref()), ("Ready", Some("ContainersNotReady")));
    p.spec.as_mut().unwrap().readiness_gates = Some(vec![PodReadinessGate { condition_type: "example.com/lb".into() }]);
    let gated = pod_ready(&p, &[], &[run("a")], RUNNING);
    assert_eq!(gated.reason.as_deref(), Some("ReadinessGatesNotReady"));
    assert_eq!(
        gated.message.as_deref(),
        Some("corresponding condition of pod readiness gate \"example.com/lb\" does not exist.")
    );
    let lb = condition("example.com/lb", true, None, None);
    assert_eq!(pod_ready(&p, &[lb], &[run("a")], RUNNING).status, "True");
}

#[test]
fn a_gate_condition_changed_by_another_controller_needs_the_ready_condition_reconciled() {
    let mut p = pod("Always", vec![], &["a"]);
    let gate = "example.com/lb";
    let with_status = |p: &Pod, conditions: Vec<PodCondition>| Pod {
        status: Some(ApiPodStatus {
            phase: Some(RUNNING.into()),
            conditions: Some(conditions),
            container_statuses: Some(vec![run("a")]),
            ..ApiPodStatus::default()
        }),
        ..p.clone()
    };
    let ready = |p: &Pod, gates: &[PodCondition]| pod_ready(p, gates, &[run("a")], RUNNING);
    // Without gates, never: Ready follows the containers alone.
    let ungated = with_status(&p, vec![condition("Ready", false, None, None)]);
    assert!(!readiness_needs_reconcile(&ungated));

    p.spec.as_mut().unwrap().readiness_gates = Some(vec![PodReadinessGate { condition_type: gate.into() }]);
    let gate_true = condition(gate, true, None, None);
    let unset = with_status(&p, vec![ready(&p, &[])]);
    assert!(!readiness_needs_reconcile(&unset), "Ready already says the gate is missing");
    let set = with_status(&p, vec![ready(&p, &[]), gate_true.clone()]);
    assert!(readiness_needs_reconcile(&set), "the gate turned True: Ready must follow");
    let followed = with_status(&p, vec![ready(&p, std::slice::from_ref(&gate_true)), gate_true]);
    assert!(!readiness_needs_reconcile(&followed));
    let gate_false = condition(gate, false, None, None);
    let unset_again = with_status(&p, vec![ready(&p, &[]), gate_false]);
    assert!(readiness_needs_reconcile(&unset_again), "the message names the False gate, not a missing one");
    assert!(!readiness_needs_reconcile(&with_status(&p, vec![])), "no Ready condition yet: the sync sets it");
}

#[test]
fn the_next_status_takes_others_conditions_from_the_config_and_the_kubelets_from_its_own() {
    let with = |conditions: Vec<PodCondition>| ApiPodStatus { conditions: Some(conditions), ..ApiPodStatus::default() };
    let stored = with(vec![
        condition("Ready", false, Some("ReadinessGatesNotReady"), None),
        condition("DisruptionTarget", true, Some("TerminationByKubelet"), None),
        condition("example.com/lb", false, None, None),
    ]);
    // A disruption another controller marks, which the kubelet did not: kept from the config.
    let marked = with(vec![condition("DisruptionTarget", true, Some("PreemptionByScheduler"), None)]);
    let base = with_others_conditions(with(vec![]), Some(&marked));
    assert_eq!(base.conditions.unwrap()[0].reason.as_deref(), Some("PreemptionByScheduler"));
    let config = with(vec![
        condition("Ready", true, None, None),
        condition("example.com/lb", true, None, None),
        condition("example.com/other", true, None, None),
    ]);
    let base = with_others_conditions(stored, Some(&config));
    let said: Vec<(&str, &str)> =
        base.conditions.iter().flatten().map(|c| (c.type_.as_str(), c.status.as_str())).collect();
    assert_eq!(
        said,
        [("Ready", "False"), ("DisruptionTarget", "True"), ("example.com/lb", "True"), ("example.com/other", "True")]
    );
}

#[test]
fn initialized_waits_for_every_init_container() {
    let p = pod("Always", vec![c("i1"), c("i2")], &["a"]);
    let got = initialized(&p, &[done("i1", 0)], PENDING);
    assert_eq!((got.status.as_str(), got.reason.as_deref()), ("False", Some("ContainersNotInitialized")));
    assert_eq!(got.message.as_deref(), Some("containers with unknown status: [i2]"));
    // A running regular init container is not ready: that takes a successful exit.
    let mut i2 = run("i2");
    i2.ready = false;
    let got = initialized(&p, &[done("i1", 0), i2], PENDING);
    assert_eq!(got.message.as_deref(), Some("containers with incomplete status: [i2]"));
    assert_eq!(initialized(&p, &[done("i1", 0), done("i2", 0)], PENDING).status, "True");
    assert_eq!(initialized(&p, &[], SUCCEEDED).status, "False", "unknown init containers even when succeeded");
    assert_eq!(initialized(&p, &[run("a")], RUNNING).status, "True", "a started regular container means initialized");
    assert_eq!(
        initialized(&p, &[done("i1", 0), done("i2", 0), done("a", 0)], SUCCEEDED).reason.as_deref(),
        Some("PodCompleted")
    );
}

#[test]
fn transition_time_changes_only_with_the_status() {
    let t0 = Time(Timestamp::from_second(1_700_000_000).unwrap());
    let t1 = Time(Timestamp::from_second(1_700_000_100).unwrap());
    let mut old = vec![condition("Ready", false, None, None), condition("PodScheduled", true, None, None)];
    set_transition_times(&mut old, &[], &t0);
    let mut new = vec![condition("Ready", true, None, None), condition("PodScheduled", true, None, None)];
    set_transition_times(&mut new, &old, &t1);
    assert_eq!(new[0].last_transition_time, Some(t1), "Ready changed");
    assert_eq!(new[1].last_transition_time, Some(t0), "PodScheduled did not");
    assert_eq!(ready_to_start_containers(true).status, "True");
    assert_eq!(scheduled().status, "True");
}

mod api {
    use k8s_openapi::api::core::v1::PodStatus as ApiPodStatus;

    use super::*;
    use kubelet_core::{
        PodUid,
        runtime::{self, ContainerState as Rt, SandboxState, SandboxStatus},
    };

    fn rt_status(containers: &[(&str, Rt, i32, u32)]) -> runtime::PodStatus {
        let mut s = runtime::PodStatus::new(PodUid::new("u"), "p", "ns");
        let mut sandbox = SandboxStatus::new("sb", 0, SandboxState::Ready);
        sandbox.ips = vec!["10.85.0.4".into()];
        s.sandbox_statuses.push(sandbox);
        s.ips = vec!["10.85.0.4".into()];
        // Newest first, as the runtime reports them: the list is given oldest first.
        for (i, (name, state, code, restarts)) in containers.iter().enumerate() {
            let mut c = runtime::ContainerStatus::new(format!("id{i}"), *name, *state);
            c.exit_code = *code;
            c.restart_count = *restarts;
            c.reason = if *state == Rt::Exited {
                if *code == 0 { "Completed" } else { "Error" }.into()
            } else {
                String::new()
            };
            s.container_statuses.insert(0, c);
        }
        s
    }

    fn no_failures(_: &str) -> Option<StartFailure> {
        None
    }

    fn now() -> Time {
        Time(Timestamp::from_second(1_700_000_000).unwrap())
    }

    fn reason(s: &ContainerStatus) -> Option<&str> {
        s.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
    }

    #[test]
    fn never_seen_containers_wait_with_container_creating_or_pod_initializing() {
        let p = pod("Always", vec![], &["a"]);
        let got = container_statuses(
            &p,
            &rt_status(&[]),
            &[],
            &p.spec.as_ref().unwrap().containers,
            false,
            &no_failures,
            "containerd",
        );
        assert_eq!(reason(&got[0]), Some("ContainerCreating"));
        let p = pod("Always", vec![c("i")], &["a"]);
        let got = container_statuses(
            &p,
            &rt_status(&[]),
            &[],
            &p.spec.as_ref().unwrap().containers,
            false,
            &no_failures,
            "containerd",
        );
        assert_eq!(reason(&got[0]), Some("PodInitializing"));
    }

    #[test]
    fn newest_instance_is_the_state_and_the_one_before_the_last_state() {
        let p = pod("Always", vec![], &["a"]);
        let status = rt_status(&[("a", Rt::Exited, 1, 0), ("a", Rt::Exited, 2, 1), ("a", Rt::Running, 0, 2)]);
        let got = &container_statuses(
            &p,
            &status,
            &[],
            &p.spec.as_ref().unwrap().containers,
            false,
            &no_failures,
            "containerd",
        )[0];
        assert!(running(got));
        assert_eq!(got.restart_count, 2);
        assert_eq!(
            got.last_state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code,
            2,
            "only the two newest count"
        );
        assert_eq!(got.container_id.as_deref(), Some("containerd://id2"));
        assert_eq!((got.ready, got.started), (true, Some(true)));
    }

    #[test]
    fn a_container_to_restart_waits_with_the_reason_of_its_last_failed_start() {
        let p = pod("Always", vec![], &["a"]);
        let status = rt_status(&[("a", Rt::Exited, 1, 3)]);
        let failures = |name: &str| {
            (name == "a").then(|| StartFailure::new("CrashLoopBackOff", "back-off 40s restarting failed container=a"))
        };
        let got =
            &container_statuses(&p, &status, &[], &p.spec.as_ref().unwrap().containers, false, &failures, "containerd")
                [0];
        assert_eq!(reason(got), Some("CrashLoopBackOff"));
        assert_eq!(got.last_state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code, 1);
        assert!(!got.ready);
        // A container that will not be restarted keeps its terminated state.
        let never = pod("Never", vec![], &["a"]);
        let got = &container_statuses(
            &never,
            &status,
            &[],
            &never.spec.as_ref().unwrap().containers,
            false,
            &failures,
            "containerd",
        )[0];
        assert!(got.state.as_ref().unwrap().terminated.is_some());
    }

    #[test]
    fn a_running_container_that_vanished_terminated_with_unknown_status() {
        let p = pod("Always", vec![], &["a"]);
        let mut previous = run("a");
        previous.restart_count = 4;
        let got = &container_statuses(
            &p,
            &rt_status(&[]),
            &[previous.clone()],
            &p.spec.as_ref().unwrap().containers,
            false,
            &no_failures,
            "containerd",
        )[0];
        let last = got.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!((last.reason.as_deref(), last.exit_code), (Some("ContainerStatusUnknown"), 137));
        assert_eq!(got.restart_count, 5);
        let unknown = rt_status(&[("a", Rt::Unknown, 0, 4)]);
        let got = &container_statuses(
            &p,
            &unknown,
            &[previous],
            &p.spec.as_ref().unwrap().containers,
            false,
            &no_failures,
            "containerd",
        )[0];
        let term = got.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!((term.reason.as_deref(), term.exit_code), (Some("ContainerStatusUnknown"), 137));
    }

    #[test]
    fn the_api_status_brings_it_together() {
        let mut p = pod("Always", vec![c("setup")], &["a", "b"]);
        let status = rt_status(&[("setup", Rt::Exited, 0, 0), ("a", Rt::Running, 0, 0), ("b", Rt::Running, 0, 0)]);
        let got = api_pod_status(&StatusInput::new(&p, &status, &no_failures, now()).host_ip("192.0.2.2"));
        assert_eq!(got.phase.as_deref(), Some(RUNNING));
        assert_eq!(got.pod_ip.as_deref(), Some("10.85.0.4"));
        assert_eq!(got.host_ip.as_deref(), Some("192.0.2.2"));
        assert_eq!(got.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(got.start_time, Some(now()));
        let conditions: Vec<(String, String)> =
            got.conditions.clone().unwrap().into_iter().map(|c| (c.type_, c.status)).collect();
        for kind in ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"] {
            assert!(conditions.contains(&(kind.to_owned(), "True".to_owned())), "{kind}: {conditions:?}");
        }
        assert!(got.init_container_statuses.as_ref().unwrap()[0].ready, "an init container that exited 0 is ready");
        assert_eq!(got.container_statuses.as_ref().unwrap().len(), 2);

        // A terminal phase in the last status sticks, with its reason.
        p.status = Some(ApiPodStatus {
            phase: Some(FAILED.into()),
            reason: Some("DeadlineExceeded".into()),
            ..ApiPodStatus::default()
        });
        let got = api_pod_status(&StatusInput::new(&p, &status, &no_failures, now()));
        assert_eq!((got.phase.as_deref(), got.reason.as_deref()), (Some(FAILED), Some("DeadlineExceeded")));
    }

    #[test]
    fn conditions_others_own_are_kept_as_they_are_and_the_kubelets_get_times() {
        let mut p = pod("Always", vec![], &["a"]);
        let gate = condition("example.com/lb", true, None, None);
        p.status = Some(ApiPodStatus { conditions: Some(vec![gate.clone()]), ..ApiPodStatus::default() });
        let status = rt_status(&[("a", Rt::Running, 0, 0)]);
        let got = api_pod_status(&StatusInput::new(&p, &status, &no_failures, now())).conditions.unwrap();
        assert_eq!(got.iter().find(|c| c.type_ == "example.com/lb"), Some(&gate), "untouched, its time too");
        let ready = got.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.last_transition_time, Some(now()));
    }

    #[test]
    fn ephemeral_containers_have_statuses_of_their_own_and_no_say_in_the_phase() {
        let mut p = pod("Always", vec![], &["a"]);
        p.spec.as_mut().unwrap().ephemeral_containers = Some(vec![
            k8s_openapi::api::core::v1::EphemeralContainer { name: "debug".into(), ..Default::default() },
            k8s_openapi::api::core::v1::EphemeralContainer { name: "later".into(), ..Default::default() },
        ]);
        let status = rt_status(&[("a", Rt::Running, 0, 0), ("debug", Rt::Exited, 1, 0)]);
        let got = api_pod_status(&StatusInput::new(&p, &status, &no_failures, now()));
        assert_eq!(got.phase.as_deref(), Some(RUNNING), "an ephemeral container that failed fails nothing");
        let ephemeral = got.ephemeral_container_statuses.unwrap();
        let states: Vec<(&str, bool, bool)> = ephemeral
            .iter()
            .map(|s| {
                let state = s.state.as_ref().unwrap();
                (s.name.as_str(), state.terminated.is_some(), state.waiting.is_some())
            })
            .collect();
        assert_eq!(states, [("debug", true, false), ("later", false, true)]);
        assert!(ephemeral.iter().all(|s| !s.ready && s.started.is_none()), "nothing probes them");
        assert_eq!(got.container_statuses.unwrap().len(), 1);
    }

    #[test]
    fn a_host_network_pods_ips_are_the_nodes() {
        let mut p = pod("Always", vec![], &["a"]);
        p.spec.as_mut().unwrap().host_network = Some(true);
        let mut status = rt_status(&[("a", Rt::Running, 0, 0)]);
        status.ips.clear();
        let got = api_pod_status(&StatusInput::new(&p, &status, &no_failures, now()).host_ip("192.0.2.2"));
        assert_eq!(got.pod_ip.as_deref(), Some("192.0.2.2"));
        assert_eq!(got.pod_ips.unwrap()[0].ip, "192.0.2.2");
        // A dual-stack node's two, primary first, for its IPs and the pod's.
        let input =
            StatusInput::new(&p, &status, &no_failures, now()).host_ip("192.0.2.2").secondary_host_ip("fd00::2");
        let got = api_pod_status(&input);
        let pod_ips: Vec<String> = got.pod_ips.unwrap().into_iter().map(|ip| ip.ip).collect();
        let host_ips: Vec<String> = got.host_ips.unwrap().into_iter().map(|ip| ip.ip).collect();
        assert_eq!(pod_ips, ["192.0.2.2", "fd00::2"]);
        assert_eq!(host_ips, ["192.0.2.2", "fd00::2"]);
        assert_eq!(got.host_ip.as_deref(), Some("192.0.2.2"));
    }
}

#[test]
fn probes_decide_started_and_ready_of_running_containers() {
    use k8s_openapi::api::core::v1::Probe;
    use kubelet_core::{PodUid, ProbeKind, ProbeOutcome, ProbeResults, runtime::ContainerStatus as Runtime};

    let mut gated = c("gated");
    gated.startup_probe = Some(Probe::default());
    gated.readiness_probe = Some(Probe::default());
    let containers = [gated, c("plain")];
    let mut runtime = runtime::PodStatus::new(PodUid::new("u"), "p", "default");
    runtime.container_statuses.push(Runtime::new("id-g", "gated", RuntimeState::Running));
    runtime.container_statuses.push(Runtime::new("id-p", "plain", RuntimeState::Running));
    let statuses = || {
        let mut s = vec![run("gated"), run("plain")];
        for status in &mut s {
            status.started = Some(true);
            status.ready = true;
        }
        s
    };
    let results = ProbeResults::new();
    let uid = PodUid::new("u");
    let flags = |results: &ProbeResults| {
        let mut s = statuses();
        apply_probes(&mut s, &containers, &runtime, results);
        s.iter().map(|s| (s.started, s.ready)).collect::<Vec<_>>()
    };
    assert_eq!(flags(&results), [(Some(false), false), (Some(true), true)], "no verdict yet: not started");
    results.set(ProbeKind::Startup, &uid, "id-g", ProbeOutcome::Success);
    assert_eq!(flags(&results)[0], (Some(true), false), "started, not ready");
    results.set(ProbeKind::Readiness, &uid, "id-g", ProbeOutcome::Success);
    assert_eq!(flags(&results)[0], (Some(true), true));
    results.set(ProbeKind::Readiness, &uid, "id-g", ProbeOutcome::Failure);
    assert_eq!(flags(&results)[0], (Some(true), false));
}
