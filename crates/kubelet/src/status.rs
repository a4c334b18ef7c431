//! Pod status rules, as pure functions over API types: the phase (upstream `getPhase` in
//! `pkg/kubelet/kubelet_pods.go`), the kubelet-owned conditions (`pkg/kubelet/status/generate.go`)
//! and their transition times.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus as ApiPodStatus,
    },
    apimachinery::pkg::apis::meta::v1::Time,
};

use kubelet_core::{
    ProbeKind, ProbeOutcome, ProbeResults,
    runtime::{self, ContainerState as RuntimeState, SandboxState},
    types::{is_sidecar, is_static_pod},
};

/// Phase `Pending`.
pub const PENDING: &str = "Pending";
/// Phase `Running`.
pub const RUNNING: &str = "Running";
/// Phase `Succeeded`.
pub const SUCCEEDED: &str = "Succeeded";
/// Phase `Failed`.
pub const FAILED: &str = "Failed";

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
    for c in init.iter().filter(|c| !is_sidecar(c)) {
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
    for c in init.iter().filter(|c| is_sidecar(c)) {
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
    let watched = spec.init_containers.iter().flatten().filter(|c| is_sidecar(c)).chain(spec.containers.iter());
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

/// Whether the pod's `Ready` condition, as the API has it, is no longer what its readiness gates
/// and container statuses make it (upstream `NeedToReconcilePodReadiness`): a gate's condition,
/// set by another controller, changed. Only a pod with gates and a `Ready` condition needs it.
pub fn readiness_needs_reconcile(pod: &Pod) -> bool {
    if pod.spec.as_ref().and_then(|s| s.readiness_gates.as_ref()).is_none_or(Vec::is_empty) {
        return false;
    }
    let status = pod.status.clone().unwrap_or_default();
    let conditions = status.conditions.unwrap_or_default();
    let Some(current) = conditions.iter().find(|c| c.type_ == "Ready") else { return false };
    let statuses: Vec<ContainerStatus> = status
        .init_container_statuses
        .into_iter()
        .flatten()
        .chain(status.container_statuses.into_iter().flatten())
        .collect();
    let expected = pod_ready(pod, &conditions, &statuses, status.phase.as_deref().unwrap_or_default());
    current.status != expected.status || current.message != expected.message
}

/// The pod conditions the kubelet makes anew at each status (upstream `PodConditionsByKubelet`).
pub const OWNED_CONDITIONS: [&str; 5] =
    ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"];

/// The condition the kubelet shares with others: it sets it when it evicts a pod, and keeps
/// what it set (upstream `PodConditionSharedByKubelet`).
pub const SHARED_CONDITION: &str = "DisruptionTarget";

/// `stored`, the kubelet's last status of a pod, with the conditions others own (a readiness
/// gate's, a scheduler's) as `config`, the pod's status from its source, has them: the base of
/// its next status (upstream `generateAPIPodStatus` takes those from the API's pod).
pub fn with_others_conditions(mut stored: ApiPodStatus, config: Option<&ApiPodStatus>) -> ApiPodStatus {
    let owned = |c: &PodCondition| OWNED_CONDITIONS.contains(&c.type_.as_str());
    let mut conditions: Vec<PodCondition> = stored.conditions.take().unwrap_or_default();
    // The shared one stays when the kubelet set it; else it is the config's, as the others.
    conditions.retain(|c| owned(c) || c.type_ == SHARED_CONDITION);
    let others = config.and_then(|s| s.conditions.as_ref()).into_iter().flatten();
    let others: Vec<PodCondition> =
        others.filter(|c| !owned(c) && !conditions.iter().any(|k| k.type_ == c.type_)).cloned().collect();
    conditions.extend(others);
    stored.conditions = (!conditions.is_empty()).then_some(conditions);
    stored
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
        let done = if is_sidecar(c) { s.started == Some(true) } else { s.ready };
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

/// Why a container could not be started at the last sync (upstream's reason cache entry): it
/// becomes the container's waiting reason.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StartFailure {
    /// The reason, e.g. `CrashLoopBackOff`, `ErrImagePull`.
    pub reason: String,
    /// The message.
    pub message: String,
}

impl StartFailure {
    /// Creates a start failure.
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Self {
        StartFailure { reason: reason.into(), message: message.into() }
    }
}

fn waiting_state(reason: Option<&str>, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting { reason: reason.map(str::to_owned), message }),
        ..ContainerState::default()
    }
}

fn time(t: Option<k8s_openapi::jiff::Timestamp>) -> Option<Time> {
    t.map(Time)
}

/// The API status of one runtime container (upstream `convertContainerStatus`).
fn convert(cs: &runtime::ContainerStatus, old: Option<&ContainerStatus>, runtime_name: &str) -> ContainerStatus {
    let id = format!("{runtime_name}://{}", cs.id);
    let mut status = ContainerStatus {
        name: cs.name.clone(),
        restart_count: i32::try_from(cs.restart_count).unwrap_or(i32::MAX),
        image: cs.image.clone(),
        image_id: if cs.image_ref.is_empty() { cs.image_id.clone() } else { cs.image_ref.clone() },
        container_id: Some(id.clone()),
        ..ContainerStatus::default()
    };
    status.state = Some(match cs.state {
        RuntimeState::Running => ContainerState {
            running: Some(ContainerStateRunning { started_at: time(cs.started_at) }),
            ..Default::default()
        },
        RuntimeState::Created => waiting_state(None, None),
        RuntimeState::Exited => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: cs.exit_code,
                reason: (!cs.reason.is_empty()).then(|| cs.reason.clone()),
                message: (!cs.message.is_empty()).then(|| cs.message.clone()),
                started_at: time(cs.started_at),
                finished_at: time(cs.finished_at),
                container_id: Some(id),
                ..Default::default()
            }),
            ..Default::default()
        },
        RuntimeState::Unknown if old.is_some_and(running) => {
            // It ran and is gone: it did not "never run", so it is not shown as waiting.
            status.restart_count = old.map_or(0, |o| o.restart_count + 1);
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some("ContainerStatusUnknown".to_owned()),
                    message: Some("The container could not be located when the pod was terminated".to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            }
        }
        RuntimeState::Unknown => waiting_state(None, None),
    });
    status
}

/// The API statuses of `containers` (upstream `convertToAPIContainerStatuses`): the newest
/// instance of each container is its state and the one before its last state; containers never
/// seen wait with `ContainerCreating` (or `PodInitializing` in pods with init containers); a
/// container that will be restarted shows the reason its last start failed, from `failures`.
pub fn container_statuses(
    pod: &Pod,
    status: &runtime::PodStatus,
    previous: &[ContainerStatus],
    containers: &[Container],
    is_init: bool,
    failures: &dyn Fn(&str) -> Option<StartFailure>,
    runtime_name: &str,
) -> Vec<ContainerStatus> {
    let has_init = pod.spec.as_ref().and_then(|s| s.init_containers.as_ref()).is_some_and(|i| !i.is_empty());
    let default_reason = if has_init { "PodInitializing" } else { "ContainerCreating" };
    let old: BTreeMap<&str, &ContainerStatus> = previous.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut statuses: BTreeMap<String, ContainerStatus> = BTreeMap::new();
    for c in containers {
        let mut s = ContainerStatus {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            state: Some(waiting_state(Some(default_reason), None)),
            ..ContainerStatus::default()
        };
        if let Some(o) = old.get(c.name.as_str()) {
            if o.state.as_ref().is_some_and(|st| st.terminated.is_some()) {
                s = (*o).clone();
            } else {
                s.restart_count = o.restart_count;
                s.last_state.clone_from(&o.last_state);
            }
        }
        statuses.insert(c.name.clone(), s);
    }
    // A container that used to run and vanished from the runtime terminated, code unknown.
    for c in containers {
        if status.container_status(&c.name).is_some() {
            continue;
        }
        let Some(o) = old.get(c.name.as_str()) else { continue };
        if !running(o) {
            continue;
        }
        let Some(s) = statuses.get_mut(&c.name) else { continue };
        let default_waiting = s
            .state
            .as_ref()
            .and_then(|st| st.waiting.as_ref())
            .is_some_and(|w| w.reason.as_deref() == Some(default_reason));
        let has_last = s.last_state.as_ref().is_some_and(|l| l.terminated.is_some());
        if default_waiting && !has_last {
            s.last_state = Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some("ContainerStatusUnknown".to_owned()),
                    message: Some("The container could not be located when the pod was deleted.  The container used to be Running".to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            });
            if pod.metadata.deletion_timestamp.is_none() {
                s.restart_count += 1;
            }
        }
    }
    // The newest instance is the state, the one before it the last state.
    let mut seen: BTreeMap<&str, u8> = BTreeMap::new();
    for cs in &status.container_statuses {
        let Some(current) = statuses.get_mut(&cs.name) else { continue };
        let n = seen.entry(cs.name.as_str()).or_default();
        if *n >= 2 {
            continue;
        }
        let converted = convert(cs, old.get(cs.name.as_str()).copied(), runtime_name);
        if *n == 0 {
            *current = converted;
        } else {
            current.last_state = converted.state;
        }
        *n += 1;
    }
    // Containers the next sync restarts wait, with the reason their last start failed.
    for c in containers {
        if is_init
            && status.container_status(&c.name).is_some_and(|s| s.state == RuntimeState::Exited && s.exit_code == 0)
        {
            continue;
        }
        if !should_restart(c, pod, status) {
            continue;
        }
        let Some(failure) = failures(&c.name) else { continue };
        let Some(s) = statuses.get_mut(&c.name) else { continue };
        if s.state.as_ref().is_some_and(|st| st.terminated.is_some()) {
            s.last_state = s.state.take();
        }
        s.state = Some(waiting_state(Some(&failure.reason), Some(failure.message)));
    }
    // Readiness and start without probes: a running container (or sidecar) is started and
    // ready; a regular init container is ready once it exited 0.
    for s in statuses.values_mut() {
        let state = s.state.as_ref();
        let is_running = state.is_some_and(|st| st.running.is_some());
        let sidecar = containers.iter().any(|c| c.name == s.name && is_sidecar(c));
        s.started = Some(is_running);
        s.ready = if is_init && !sidecar {
            state.and_then(|st| st.terminated.as_ref()).is_some_and(|t| t.exit_code == 0)
        } else {
            is_running
        };
    }
    if is_init {
        // Init containers keep the spec's order.
        containers.iter().filter_map(|c| statuses.remove(&c.name)).collect()
    } else {
        statuses.into_values().collect()
    }
}

/// Started and ready from the probes (upstream `prober.Manager.UpdatePodStatus`): a running
/// container with a startup probe has started once it passed, and a started one with a readiness
/// probe is ready once that passed. Regular init containers (no probes) keep "ready once exited 0".
pub fn apply_probes(
    statuses: &mut [ContainerStatus],
    containers: &[Container],
    runtime: &runtime::PodStatus,
    results: &ProbeResults,
) {
    for s in statuses {
        let Some(c) = containers.iter().find(|c| c.name == s.name) else { continue };
        if c.startup_probe.is_none() && c.readiness_probe.is_none() {
            continue;
        }
        let running = s.state.as_ref().is_some_and(|st| st.running.is_some());
        let current = runtime.container_status(&c.name).filter(|r| r.state == RuntimeState::Running);
        let passed = |kind| current.is_some_and(|r| results.get(kind, &r.id) == Some(ProbeOutcome::Success));
        let started = running && (c.startup_probe.is_none() || passed(ProbeKind::Startup));
        s.started = Some(started);
        s.ready = started && (c.readiness_probe.is_none() || passed(ProbeKind::Readiness));
    }
}

/// Upstream `ShouldContainerBeRestarted`, over the runtime's view.
fn should_restart(container: &Container, pod: &Pod, status: &runtime::PodStatus) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(last) = status.container_status(&container.name) else { return true };
    match last.state {
        RuntimeState::Running => false,
        RuntimeState::Unknown | RuntimeState::Created => true,
        RuntimeState::Exited => match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always") {
            "Never" => false,
            "OnFailure" => last.exit_code != 0,
            _ => true,
        },
    }
}

/// Everything the API status of a pod is computed from.
#[derive(Clone)]
#[non_exhaustive]
pub struct StatusInput<'a> {
    /// The pod, with its last API status in `pod.status`.
    pub pod: &'a Pod,
    /// The runtime's view.
    pub runtime: &'a runtime::PodStatus,
    /// Whether the kubelet decided no container will run again.
    pub pod_is_terminal: bool,
    /// Reasons the last sync failed to start containers, by container name.
    pub failures: &'a dyn Fn(&str) -> Option<StartFailure>,
    /// The runtime's name, as container ID prefix (`containerd`).
    pub runtime_name: &'a str,
    /// The node's IP.
    pub host_ip: &'a str,
    /// The second address of a dual-stack node; empty when it has one.
    pub secondary_host_ip: &'a str,
    /// Now, for transition times and the start time.
    pub now: Time,
    /// The probes' verdicts, when the agent probes.
    pub probes: Option<&'a ProbeResults>,
}

impl std::fmt::Debug for StatusInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusInput")
            .field("pod", &self.pod.metadata.name)
            .field("pod_is_terminal", &self.pod_is_terminal)
            .finish_non_exhaustive()
    }
}

impl<'a> StatusInput<'a> {
    /// The input for `pod` with the runtime's view `runtime` at `now`.
    pub fn new(
        pod: &'a Pod,
        runtime: &'a runtime::PodStatus,
        failures: &'a dyn Fn(&str) -> Option<StartFailure>,
        now: Time,
    ) -> Self {
        StatusInput {
            pod,
            runtime,
            pod_is_terminal: false,
            failures,
            runtime_name: "containerd",
            host_ip: "",
            secondary_host_ip: "",
            now,
            probes: None,
        }
    }

    /// Marks the pod terminal.
    #[must_use]
    pub fn terminal(mut self, terminal: bool) -> Self {
        self.pod_is_terminal = terminal;
        self
    }

    /// Sets the runtime name used as container ID prefix.
    #[must_use]
    pub fn runtime_name(mut self, name: &'a str) -> Self {
        self.runtime_name = name;
        self
    }

    /// Sets the node's IP.
    #[must_use]
    pub fn host_ip(mut self, ip: &'a str) -> Self {
        self.host_ip = ip;
        self
    }

    /// Sets the second address of a dual-stack node.
    #[must_use]
    pub fn secondary_host_ip(mut self, ip: &'a str) -> Self {
        self.secondary_host_ip = ip;
        self
    }

    /// Sets `started` and `ready` of probed containers from `results`.
    #[must_use]
    pub fn probe_results(mut self, results: &'a ProbeResults) -> Self {
        self.probes = Some(results);
        self
    }
}

/// The pod's API status (upstream `generateAPIPodStatus`).
pub fn api_pod_status(input: &StatusInput<'_>) -> ApiPodStatus {
    let pod = input.pod;
    let old = pod.status.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let init = spec.init_containers.clone().unwrap_or_default();
    let init_statuses = container_statuses(
        pod,
        input.runtime,
        old.init_container_statuses.as_deref().unwrap_or_default(),
        &init,
        true,
        input.failures,
        input.runtime_name,
    );
    let mut statuses = container_statuses(
        pod,
        input.runtime,
        old.container_statuses.as_deref().unwrap_or_default(),
        &spec.containers,
        false,
        input.failures,
        input.runtime_name,
    );
    // Ephemeral containers as the containers they run as (upstream's `convertStatusToAPIStatus`).
    let ephemeral: Vec<Container> =
        spec.ephemeral_containers.iter().flatten().map(kubelet_core::types::ephemeral_as_container).collect();
    let mut ephemeral_statuses = container_statuses(
        pod,
        input.runtime,
        old.ephemeral_container_statuses.as_deref().unwrap_or_default(),
        &ephemeral,
        false,
        input.failures,
        input.runtime_name,
    );
    // Nothing probes them: never ready, and not said to have started (upstream's prober
    // manager sets both for regular and init containers alone).
    for status in &mut ephemeral_statuses {
        status.ready = false;
        status.started = None;
    }
    let mut init_statuses = init_statuses;
    if let Some(results) = input.probes {
        apply_probes(&mut init_statuses, &init, input.runtime, results);
        apply_probes(&mut statuses, &spec.containers, input.runtime, results);
    }
    let all: Vec<ContainerStatus> = init_statuses.iter().chain(statuses.iter()).cloned().collect();
    let initialized_before =
        statuses.iter().any(|s| s.started == Some(true) || s.state.as_ref().is_some_and(|st| st.terminated.is_some()));
    let phase =
        sticky_phase(old.phase.as_deref(), pod_phase(pod, &all, input.pod_is_terminal, initialized_before)).to_owned();
    let sandbox_ready = input.runtime.sandbox_statuses.first().is_some_and(|s| s.state == SandboxState::Ready);
    let old_conditions = old.conditions.clone().unwrap_or_default();
    let mut conditions = vec![
        ready_to_start_containers(sandbox_ready),
        initialized(pod, &init_statuses, &phase),
        pod_ready(pod, &old_conditions, &all, &phase),
        containers_ready(pod, &all, &phase),
        scheduled(),
    ];
    set_transition_times(&mut conditions, &old_conditions, &input.now);
    // Conditions the kubelet does not own are kept as they are, their times too.
    conditions.extend(old_conditions.iter().filter(|c| !OWNED_CONDITIONS.contains(&c.type_.as_str())).cloned());
    let mut ips = input.runtime.ips.clone();
    // The node's IPs, primary first (upstream `getHostIPsAnyWay`).
    let host_ips: Vec<String> =
        [input.host_ip, input.secondary_host_ip].into_iter().filter(|ip| !ip.is_empty()).map(str::to_owned).collect();
    // A host-network pod's IPs are the node's (upstream `generateAPIPodStatus`).
    if ips.is_empty() && !input.host_ip.is_empty() && pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
        ips.clone_from(&host_ips);
    }
    ApiPodStatus {
        phase: Some(phase.clone()),
        // Reason and message stay while the phase does.
        reason: old.reason.clone().filter(|_| old.phase.as_deref() == Some(phase.as_str())),
        message: old.message.clone().filter(|_| old.phase.as_deref() == Some(phase.as_str())),
        conditions: Some(conditions),
        host_ip: (!input.host_ip.is_empty()).then(|| input.host_ip.to_owned()),
        host_ips: (!input.host_ip.is_empty()).then(|| host_ips.iter().map(|ip| HostIP { ip: ip.clone() }).collect()),
        pod_ip: ips.first().cloned(),
        pod_ips: (!ips.is_empty()).then(|| ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        start_time: old.start_time.clone().or_else(|| Some(input.now.clone())),
        qos_class: Some(kubelet_core::resources::qos_class(pod).to_owned()),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        container_statuses: Some(statuses),
        ephemeral_container_statuses: (!ephemeral_statuses.is_empty()).then_some(ephemeral_statuses),
        ..old
    }
}

#[cfg(test)]
mod tests;
