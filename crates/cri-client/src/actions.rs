//! What a sync must do to bring a pod to its spec: upstream's `computePodActions`
//! (`pkg/kubelet/kuberuntime/kuberuntime_manager.go`) as a pure function.
//!
//! Crash-loop and image-pull backoffs are not decided here: they apply when a container is
//! started (`SyncPod`'s start step), as upstream does.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_core::{
    ProbeKind, ProbeOutcome, ProbeResults,
    runtime::{ContainerState, NetworkMode, PodStatus, SandboxState, container_hash},
    types::is_sidecar,
};

/// Why a running container is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KillReason {
    /// Its definition (hash) changed.
    DefinitionChanged,
    /// It failed its liveness probe.
    LivenessProbe,
    /// It failed its startup probe.
    StartupProbe,
    /// Its state is unknown; it is killed before being started again.
    Unknown,
}

/// One container to kill.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerToKill {
    /// Runtime container ID.
    pub id: String,
    /// Container name.
    pub name: String,
    /// Why.
    pub reason: KillReason,
    /// Event message, as upstream words it.
    pub message: String,
    /// The failed probe's own `terminationGracePeriodSeconds`, for a kill by a liveness or
    /// startup probe that sets one; it replaces the pod's (upstream `setTerminationGracePeriod`).
    pub grace_period: Option<i64>,
}

impl ContainerToKill {
    fn new(id: &str, container: &Container, reason: KillReason, message: String) -> Self {
        let probe = match reason {
            KillReason::LivenessProbe => container.liveness_probe.as_ref(),
            KillReason::StartupProbe => container.startup_probe.as_ref(),
            _ => None,
        };
        ContainerToKill {
            id: id.to_owned(),
            name: container.name.clone(),
            reason,
            message,
            grace_period: probe.and_then(|p| p.termination_grace_period_seconds),
        }
    }
}

/// The actions of one sync (upstream `podActions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodActions {
    /// Stop everything of the pod first (containers, then sandboxes).
    pub kill_pod: bool,
    /// Create a new sandbox.
    pub create_sandbox: bool,
    /// The sandbox to use (or, when creating, the one being replaced).
    pub sandbox_id: String,
    /// The attempt number of the sandbox to create.
    pub attempt: u32,
    /// Init containers to start, in spec order (indexes into `spec.initContainers`): the next
    /// regular init container, and sidecars (`restartPolicy: Always`) that must run.
    pub init_containers_to_start: Vec<usize>,
    /// Regular containers to start (indexes into `spec.containers`).
    pub containers_to_start: Vec<usize>,
    /// Running containers to kill.
    pub containers_to_kill: Vec<ContainerToKill>,
    /// Ephemeral containers to start (indexes into `spec.ephemeralContainers`).
    pub ephemeral_containers_to_start: Vec<usize>,
}

/// The probe verdicts a sync acts on, by runtime container ID (upstream reads them from its
/// liveness and startup results managers).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeVerdicts {
    /// Containers that failed their liveness probe: killed and restarted.
    pub liveness_failed: HashSet<String>,
    /// Containers that failed their startup probe: killed and restarted.
    pub startup_failed: HashSet<String>,
    /// Containers whose startup probe passed: a sidecar with a startup probe lets the containers
    /// after it start only then.
    pub startup_passed: HashSet<String>,
}

impl ProbeVerdicts {
    /// The verdicts in `results` about the containers of `status`.
    pub fn of(results: &ProbeResults, status: &PodStatus) -> Self {
        let mut verdicts = ProbeVerdicts::default();
        for c in &status.container_statuses {
            if results.failed(ProbeKind::Liveness, &c.id) {
                verdicts.liveness_failed.insert(c.id.clone());
            }
            match results.get(ProbeKind::Startup, &c.id) {
                Some(ProbeOutcome::Failure) => verdicts.startup_failed.insert(c.id.clone()),
                Some(ProbeOutcome::Success) => verdicts.startup_passed.insert(c.id.clone()),
                _ => false,
            };
        }
        verdicts
    }
}

fn restart_policy(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always")
}

fn should_restart_on_failure(pod: &Pod) -> bool {
    restart_policy(pod) != "Never"
}

fn host_network(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false)
}

/// The hash of a container as the kubelet computes and records it.
pub fn hash(container: &Container) -> u64 {
    container_hash(&container.name, container.image.as_deref().unwrap_or_default())
}

/// Upstream `PodSandboxChanged`: whether a new sandbox is needed, its attempt, and the current
/// sandbox ID.
pub fn sandbox_changed(pod: &Pod, status: &PodStatus) -> (bool, u32, String) {
    let Some(newest) = status.sandbox_statuses.first() else { return (true, 0, String::new()) };
    let ready = status.sandbox_statuses.iter().filter(|s| s.state == SandboxState::Ready).count();
    let next = newest.attempt + 1;
    if ready > 1 || newest.state != SandboxState::Ready {
        return (true, next, newest.id.clone());
    }
    let wanted = if host_network(pod) { NetworkMode::Host } else { NetworkMode::Pod };
    if newest.network_mode != wanted {
        return (true, next, String::new());
    }
    if !host_network(pod) && newest.ips.is_empty() {
        return (true, next, newest.id.clone());
    }
    (false, newest.attempt, newest.id.clone())
}

/// Upstream `ShouldContainerBeRestarted`.
pub fn should_container_be_restarted(container: &Container, pod: &Pod, status: &PodStatus) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(last) = status.container_status(&container.name) else { return true };
    match last.state {
        ContainerState::Running => false,
        ContainerState::Unknown | ContainerState::Created => true,
        ContainerState::Exited => match restart_policy(pod) {
            "Never" => false,
            "OnFailure" => last.exit_code != 0,
            _ => true,
        },
    }
}

/// What the init containers need (upstream `computeInitContainerActions`): the init containers
/// to start, the ones to kill first, whether the pod must be killed (a failed init container
/// under `restartPolicy: Never`), and whether initialization is done.
/// A sidecar with a startup probe counts as started only once the probe passed; a sidecar that
/// failed its startup or liveness probe is killed and started again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct InitActions {
    to_start: Vec<usize>,
    to_kill: Vec<ContainerToKill>,
    kill_pod: bool,
    initialized: bool,
}

fn init_actions(pod: &Pod, status: &PodStatus, probes: &ProbeVerdicts) -> InitActions {
    let mut actions = InitActions::default();
    let Some(spec) = pod.spec.as_ref() else {
        actions.initialized = true;
        return actions;
    };
    let init = spec.init_containers.as_deref().unwrap_or_default();
    if init.is_empty() {
        actions.initialized = true;
        return actions;
    }
    // A regular container that ran means initialization happened, even if the runtime forgot
    // the init containers since.
    let mut initialized = spec.containers.iter().any(|c| {
        status
            .container_status(&c.name)
            .is_some_and(|s| matches!(s.state, ContainerState::Running | ContainerState::Exited))
    });
    let mut previously_initialized = initialized;
    let restart_on_failure = should_restart_on_failure(pod);
    // Backwards: the last init container with a status says how far initialization got, as
    // finished ones may have been removed since.
    for (i, container) in init.iter().enumerate().rev() {
        let sidecar = is_sidecar(container);
        let Some(current) = status.container_status(&container.name) else {
            // Gone after initialization: only a sidecar needs to run again.
            if previously_initialized && sidecar {
                actions.to_start.push(i);
            }
            continue;
        };
        if previously_initialized && !sidecar {
            continue;
        }
        match current.state {
            ContainerState::Created => actions.to_start.push(i),
            ContainerState::Running if sidecar => {
                let kill = |reason, what: &str| {
                    let message = format!("Init container {} failed {what} probe", container.name);
                    ContainerToKill::new(&current.id, container, reason, message)
                };
                if container.startup_probe.is_some() && !probes.startup_passed.contains(&current.id) {
                    // Not started until its startup probe passed; restarted when it failed.
                    if probes.startup_failed.contains(&current.id) {
                        actions.to_kill.push(kill(KillReason::StartupProbe, "startup"));
                        actions.to_start.push(i);
                    }
                    previously_initialized = true;
                    continue;
                }
                // A started sidecar counts as done: the next init container may start.
                if i == init.len() - 1 {
                    initialized = true;
                } else if !previously_initialized {
                    actions.to_start.push(i + 1);
                }
                if current.hash != hash(container) {
                    let message = format!("Init container {} definition changed, will be restarted", container.name);
                    actions.to_kill.push(ContainerToKill::new(
                        &current.id,
                        container,
                        KillReason::DefinitionChanged,
                        message,
                    ));
                    actions.to_start.push(i);
                } else if probes.liveness_failed.contains(&current.id) {
                    // Its liveness does not hold back the next init container; it restarts.
                    actions.to_kill.push(kill(KillReason::LivenessProbe, "liveness"));
                    actions.to_start.push(i);
                }
            }
            ContainerState::Running => {}
            ContainerState::Exited if current.exit_code == 0 || sidecar => {
                if sidecar {
                    // A sidecar that exited restarts whatever the pod's policy (with back-off).
                    actions.to_start.push(i);
                } else if i == init.len() - 1 {
                    initialized = true;
                } else {
                    actions.to_start.push(i + 1);
                }
            }
            ContainerState::Exited => {
                if !restart_on_failure {
                    actions.kill_pod = true;
                    actions.to_start.clear();
                    actions.initialized = false;
                    return actions;
                }
                actions.to_start.push(i);
            }
            ContainerState::Unknown => {
                let message = "Init container is in \"unknown\" state, try killing it before restart".to_owned();
                actions.to_kill.push(ContainerToKill::new(&current.id, container, KillReason::Unknown, message));
                actions.to_start.push(i);
            }
        }
        previously_initialized = true;
    }
    if !previously_initialized {
        // Nothing started yet: the first one.
        actions.to_start.push(0);
    }
    actions.to_start.reverse();
    actions.to_start.dedup();
    actions.initialized = initialized;
    actions
}

fn succeeded(container: &Container, status: &PodStatus) -> bool {
    status.container_status(&container.name).is_some_and(|s| s.state != ContainerState::Running && s.exit_code == 0)
}

/// Upstream `computePodActions`.
pub fn compute_pod_actions(pod: &Pod, status: &PodStatus, probes: &ProbeVerdicts) -> PodActions {
    let (create_sandbox, attempt, sandbox_id) = sandbox_changed(pod, status);
    let mut actions =
        PodActions { kill_pod: create_sandbox, create_sandbox, sandbox_id, attempt, ..PodActions::default() };
    let Some(spec) = pod.spec.as_ref() else { return actions };

    if create_sandbox {
        if !should_restart_on_failure(pod) && attempt != 0 && !status.container_statuses.is_empty() {
            // A finished pod that must not restart gets no new sandbox: it is only killed.
            actions.create_sandbox = false;
            return actions;
        }
        let to_start: Vec<usize> = spec
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| !(restart_policy(pod) == "OnFailure" && succeeded(c, status)))
            .map(|(i, _)| i)
            .collect();
        if to_start.is_empty() && init_actions(pod, status, probes).initialized {
            actions.create_sandbox = false;
            return actions;
        }
        if spec.init_containers.as_ref().is_some_and(|i| !i.is_empty()) {
            // A new sandbox runs initialization again from the first init container.
            actions.init_containers_to_start = vec![0];
            return actions;
        }
        actions.containers_to_start = to_start;
        return actions;
    }

    // Ephemeral containers start once, even before initialization is done, and never restart.
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        if status.container_status(&c.name).is_none() {
            actions.ephemeral_containers_to_start.push(i);
        }
    }

    let init = init_actions(pod, status, probes);
    if init.kill_pod {
        actions.kill_pod = true;
        return actions;
    }
    actions.containers_to_kill = init.to_kill;
    actions.init_containers_to_start = init.to_start;
    if !init.initialized {
        return actions;
    }

    let mut keep = 0;
    for (i, container) in spec.containers.iter().enumerate() {
        let current = status.container_status(&container.name);
        let Some(running) = current.filter(|s| s.state == ContainerState::Running) else {
            if should_container_be_restarted(container, pod, status) {
                actions.containers_to_start.push(i);
                if let Some(unknown) = current.filter(|s| s.state == ContainerState::Unknown) {
                    let message = "Container is in \"unknown\" state, try killing it before restart".to_owned();
                    actions.containers_to_kill.push(ContainerToKill::new(
                        &unknown.id,
                        container,
                        KillReason::Unknown,
                        message,
                    ));
                }
            }
            continue;
        };
        let mut restart = should_restart_on_failure(pod);
        let (reason, message) = if running.hash != hash(container) {
            // The definition changed: restart whatever the policy.
            restart = true;
            (KillReason::DefinitionChanged, format!("Container {} definition changed", container.name))
        } else if probes.liveness_failed.contains(&running.id) {
            (KillReason::LivenessProbe, format!("Container {} failed liveness probe", container.name))
        } else if probes.startup_failed.contains(&running.id) {
            (KillReason::StartupProbe, format!("Container {} failed startup probe", container.name))
        } else {
            keep += 1;
            continue;
        };
        let message = if restart {
            actions.containers_to_start.push(i);
            format!("{message}, will be restarted")
        } else {
            message
        };
        actions.containers_to_kill.push(ContainerToKill::new(&running.id, container, reason, message));
    }
    // Nothing left to run (sidecars do not count): the pod is done.
    if keep == 0 && actions.containers_to_start.is_empty() {
        actions.kill_pod = true;
        actions.init_containers_to_start.clear();
    }
    actions
}

#[cfg(test)]
mod tests;
