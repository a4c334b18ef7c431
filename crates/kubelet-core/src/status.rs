//! Pod status rules, as pure functions over API types: the phase (upstream `getPhase` in
//! `pkg/kubelet/kubelet_pods.go`), the kubelet-owned conditions (`pkg/kubelet/status/generate.go`)
//! and their transition times.

use k8s_openapi::{
    api::core::v1::{Container, ContainerStatus, Pod, PodCondition},
    apimachinery::pkg::apis::meta::v1::Time,
};

use crate::types::is_static_pod;

/// Phase `Pending`.
pub const PENDING: &str = "Pending";
/// Phase `Running`.
pub const RUNNING: &str = "Running";
/// Phase `Succeeded`.
pub const SUCCEEDED: &str = "Succeeded";
/// Phase `Failed`.
pub const FAILED: &str = "Failed";

fn is_restartable_init(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

fn status_of<'a>(statuses: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

fn running(s: &ContainerStatus) -> bool {
    s.state.as_ref().is_some_and(|st| st.running.is_some())
}

fn terminated_exit(s: &ContainerStatus) -> Option<i32> {
    s.state.as_ref().and_then(|st| st.terminated.as_ref()).map(|t| t.exit_code)
}

fn waiting(s: &ContainerStatus) -> bool {
    s.state.as_ref().is_some_and(|st| st.waiting.is_some())
}

fn last_terminated_exit(s: &ContainerStatus) -> Option<i32> {
    s.last_state.as_ref().and_then(|st| st.terminated.as_ref()).map(|t| t.exit_code)
}

/// The pod's phase (upstream `getPhase`).
///
/// `pod_is_terminal` says the kubelet has decided no container will run again;
/// `pod_has_initialized` says regular containers have run before.
pub fn pod_phase(
    pod: &Pod,
    statuses: &[ContainerStatus],
    pod_is_terminal: bool,
    pod_has_initialized: bool,
) -> &'static str {
    let Some(spec) = pod.spec.as_ref() else { return PENDING };
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let (mut pending_init, mut pending_restartable, mut failed_init) = (0, 0, 0);
    for c in init.iter().filter(|c| !is_restartable_init(c)) {
        let Some(s) = status_of(statuses, &c.name) else {
            pending_init += 1;
            continue;
        };
        if running(s) {
            pending_init += 1;
        } else if let Some(code) = terminated_exit(s) {
            if code != 0 {
                failed_init += 1;
            }
        } else if waiting(s) {
            match last_terminated_exit(s) {
                Some(code) if code != 0 => failed_init += 1,
                Some(_) => {}
                None => pending_init += 1,
            }
        } else {
            pending_init += 1;
        }
    }
    let (mut unknown, mut running_n, mut waiting_n, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for c in init.iter().filter(|c| is_restartable_init(c)) {
        let Some(s) = status_of(statuses, &c.name) else {
            unknown += 1;
            continue;
        };
        if running(s) {
            if s.started != Some(true) {
                pending_restartable += 1;
            }
            running_n += 1;
        } else if terminated_exit(s).is_some() {
            // Terminated restartable init containers do not count.
        } else if waiting(s) {
            if last_terminated_exit(s).is_none() {
                pending_restartable += 1;
                waiting_n += 1;
            }
        } else {
            pending_restartable += 1;
            unknown += 1;
        }
    }
    for c in &spec.containers {
        let Some(s) = status_of(statuses, &c.name) else {
            unknown += 1;
            continue;
        };
        if running(s) {
            running_n += 1;
        } else if let Some(code) = terminated_exit(s) {
            stopped += 1;
            if code == 0 {
                succeeded += 1;
            }
        } else if waiting(s) {
            if last_terminated_exit(s).is_some() {
                stopped += 1;
            } else {
                waiting_n += 1;
            }
        } else {
            unknown += 1;
        }
    }
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    if failed_init > 0 && policy == "Never" {
        return FAILED;
    }
    if pending_init > 0 || (pending_restartable > 0 && !pod_has_initialized) || waiting_n > 0 {
        return PENDING;
    }
    if running_n > 0 && unknown == 0 {
        return RUNNING;
    }
    if running_n == 0 && stopped > 0 && unknown == 0 {
        if pod_is_terminal && !is_static_pod(pod) {
            return if stopped == succeeded { SUCCEEDED } else { FAILED };
        }
        if policy == "Always" {
            return RUNNING;
        }
        if stopped == succeeded {
            return SUCCEEDED;
        }
        if policy == "Never" {
            return FAILED;
        }
        return RUNNING;
    }
    PENDING
}

/// A terminal phase is never left (upstream's phase stickiness): `old` wins when it is terminal.
pub fn sticky_phase<'a>(old: Option<&'a str>, new: &'a str) -> &'a str {
    match old {
        Some(old @ (SUCCEEDED | FAILED)) => old,
        _ => new,
    }
}

fn condition(kind: &str, status: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: kind.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: reason.map(str::to_owned),
        message,
        ..PodCondition::default()
    }
}

/// Go's formatting of a string list, as upstream's messages use it: `[a b]`.
fn go_list(names: &[&str]) -> String {
    format!("[{}]", names.join(" "))
}

fn terminal_reason(phase: &str) -> &'static str {
    if phase == FAILED { "PodFailed" } else { "PodCompleted" }
}

/// `ContainersReady` (upstream `GenerateContainersReadyCondition`).
pub fn containers_ready(pod: &Pod, statuses: &[ContainerStatus], phase: &str) -> PodCondition {
    let Some(spec) = pod.spec.as_ref() else {
        return condition("ContainersReady", false, Some("UnknownContainerStatuses"), None);
    };
    let mut unknown = Vec::new();
    let mut unready = Vec::new();
    let watched =
        spec.init_containers.iter().flatten().filter(|c| is_restartable_init(c)).chain(spec.containers.iter());
    for c in watched {
        match status_of(statuses, &c.name) {
            Some(s) if !s.ready => unready.push(c.name.as_str()),
            Some(_) => {}
            None => unknown.push(c.name.as_str()),
        }
    }
    if (phase == SUCCEEDED && unknown.is_empty()) || phase == FAILED {
        return condition("ContainersReady", false, Some(terminal_reason(phase)), None);
    }
    let mut messages = Vec::new();
    if !unknown.is_empty() {
        messages.push(format!("containers with unknown status: {}", go_list(&unknown)));
    }
    if !unready.is_empty() {
        messages.push(format!("containers with unready status: {}", go_list(&unready)));
    }
    if messages.is_empty() {
        condition("ContainersReady", true, None, None)
    } else {
        condition("ContainersReady", false, Some("ContainersNotReady"), Some(messages.join(", ")))
    }
}

/// `Ready` (upstream `GeneratePodReadyCondition`): `ContainersReady` and every readiness gate.
pub fn pod_ready(pod: &Pod, conditions: &[PodCondition], statuses: &[ContainerStatus], phase: &str) -> PodCondition {
    let ready = containers_ready(pod, statuses, phase);
    if ready.status != "True" {
        return PodCondition { type_: "Ready".to_owned(), ..ready };
    }
    let mut messages = Vec::new();
    for gate in pod.spec.as_ref().and_then(|s| s.readiness_gates.as_ref()).into_iter().flatten() {
        match conditions.iter().find(|c| c.type_ == gate.condition_type) {
            None => messages.push(format!(
                "corresponding condition of pod readiness gate {:?} does not exist.",
                gate.condition_type
            )),
            Some(c) if c.status != "True" => {
                messages.push(format!(
                    "the status of pod readiness gate {:?} is not \"True\", but {}",
                    gate.condition_type, c.status
                ));
            }
            Some(_) => {}
        }
    }
    if messages.is_empty() {
        condition("Ready", true, None, None)
    } else {
        condition("Ready", false, Some("ReadinessGatesNotReady"), Some(messages.join(", ")))
    }
}

/// `Initialized` (upstream `GeneratePodInitializedCondition`).
pub fn initialized(pod: &Pod, statuses: &[ContainerStatus], phase: &str) -> PodCondition {
    let Some(spec) = pod.spec.as_ref() else { return condition("Initialized", true, None, None) };
    let mut unknown = Vec::new();
    let mut incomplete = Vec::new();
    for c in spec.init_containers.iter().flatten() {
        let Some(s) = status_of(statuses, &c.name) else {
            unknown.push(c.name.as_str());
            continue;
        };
        let done = if is_restartable_init(c) { s.started == Some(true) } else { s.ready };
        if !done {
            incomplete.push(c.name.as_str());
        }
    }
    if phase == SUCCEEDED && unknown.is_empty() {
        return condition("Initialized", true, Some("PodCompleted"), None);
    }
    // A regular container that started means initialization happened before.
    let regular_started =
        spec.containers.iter().any(|c| status_of(statuses, &c.name).is_some_and(|s| s.started == Some(true)));
    if regular_started {
        return condition("Initialized", true, None, None);
    }
    let mut messages = Vec::new();
    if !unknown.is_empty() {
        messages.push(format!("containers with unknown status: {}", go_list(&unknown)));
    }
    if !incomplete.is_empty() {
        messages.push(format!("containers with incomplete status: {}", go_list(&incomplete)));
    }
    if messages.is_empty() {
        condition("Initialized", true, None, None)
    } else {
        condition("Initialized", false, Some("ContainersNotInitialized"), Some(messages.join(", ")))
    }
}

/// `PodReadyToStartContainers`: true once a ready, networked sandbox exists.
pub fn ready_to_start_containers(sandbox_ready: bool) -> PodCondition {
    condition("PodReadyToStartContainers", sandbox_ready, None, None)
}

/// `PodScheduled`: always true on the node.
pub fn scheduled() -> PodCondition {
    condition("PodScheduled", true, None, None)
}

/// Sets each condition's `lastTransitionTime`: kept from `old` when the status did not change,
/// `now` otherwise.
pub fn set_transition_times(conditions: &mut [PodCondition], old: &[PodCondition], now: &Time) {
    for c in conditions {
        c.last_transition_time = match old.iter().find(|o| o.type_ == c.type_) {
            Some(o) if o.status == c.status && o.last_transition_time.is_some() => o.last_transition_time.clone(),
            _ => Some(now.clone()),
        };
    }
}

#[cfg(test)]
mod tests;
