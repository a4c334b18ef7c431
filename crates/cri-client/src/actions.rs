//! What a sync must do to bring a pod to its spec: upstream's `computePodActions`
//! (`pkg/kubelet/kuberuntime/kuberuntime_manager.go`) as a pure function.
//!
//! Crash-loop and image-pull backoffs are not decided here: they apply when a container is
//! started (`SyncPod`'s start step), as upstream does.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_core::runtime::{ContainerState, ContainerStatus, NetworkMode, PodStatus, SandboxState, container_hash};

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
    /// The init container to start next (index into `spec.initContainers`).
    pub next_init_container: Option<usize>,
    /// Regular containers to start (indexes into `spec.containers`).
    pub containers_to_start: Vec<usize>,
    /// Running containers to kill.
    pub containers_to_kill: Vec<ContainerToKill>,
    /// Ephemeral containers to start (indexes into `spec.ephemeralContainers`).
    pub ephemeral_containers_to_start: Vec<usize>,
}

/// Containers whose probes failed, by runtime container ID.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeFailures {
    /// Failed liveness probes.
    pub liveness: HashSet<String>,
    /// Failed startup probes.
    pub startup: HashSet<String>,
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

fn is_init_failed(status: &ContainerStatus) -> bool {
    (status.state == ContainerState::Exited && status.exit_code != 0) || status.state == ContainerState::Unknown
}

/// Upstream `findNextInitContainerToRun`: the status of the last failed init container if any,
/// the next init container to run, and whether initialization is done.
pub fn next_init_container<'a>(pod: &Pod, status: &'a PodStatus) -> (Option<&'a ContainerStatus>, Option<usize>, bool) {
    let Some(spec) = pod.spec.as_ref() else { return (None, None, true) };
    let init = spec.init_containers.as_deref().unwrap_or_default();
    if init.is_empty() {
        return (None, None, true);
    }
    // A running regular container means initialization happened, even if the runtime forgot it.
    if spec
        .containers
        .iter()
        .any(|c| status.container_status(&c.name).is_some_and(|s| s.state == ContainerState::Running))
    {
        return (None, None, true);
    }
    for (i, c) in init.iter().enumerate().rev() {
        if let Some(s) = status.container_status(&c.name)
            && is_init_failed(s)
        {
            return (Some(s), Some(i), false);
        }
    }
    for (i, c) in init.iter().enumerate().rev() {
        let Some(s) = status.container_status(&c.name) else { continue };
        match s.state {
            ContainerState::Running => return (None, None, false),
            ContainerState::Exited if i == init.len() - 1 => return (None, None, true),
            ContainerState::Exited => return (None, Some(i + 1), false),
            _ => {}
        }
    }
    (None, Some(0), false)
}

fn succeeded(container: &Container, status: &PodStatus) -> bool {
    status.container_status(&container.name).is_some_and(|s| s.state != ContainerState::Running && s.exit_code == 0)
}

/// Upstream `computePodActions`.
pub fn compute_pod_actions(pod: &Pod, status: &PodStatus, probes: &ProbeFailures) -> PodActions {
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
        if to_start.is_empty() && next_init_container(pod, status).2 {
            actions.create_sandbox = false;
            return actions;
        }
        if spec.init_containers.as_ref().is_some_and(|i| !i.is_empty()) {
            // A new sandbox runs initialization again from the first init container.
            actions.next_init_container = Some(0);
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

    let (last_init, next_init, init_done) = next_init_container(pod, status);
    if !init_done {
        if let Some(next) = next_init {
            if last_init.is_some_and(is_init_failed) && !should_restart_on_failure(pod) {
                actions.kill_pod = true;
            } else {
                if let Some(last) = last_init.filter(|s| s.state == ContainerState::Unknown) {
                    actions.containers_to_kill.push(ContainerToKill {
                        id: last.id.clone(),
                        name: last.name.clone(),
                        reason: KillReason::Unknown,
                        message: "Init container is in \"unknown\" state, try killing it before restart".to_owned(),
                    });
                }
                actions.next_init_container = Some(next);
            }
        }
        return actions;
    }

    let mut keep = 0;
    for (i, container) in spec.containers.iter().enumerate() {
        let current = status.container_status(&container.name);
        let Some(running) = current.filter(|s| s.state == ContainerState::Running) else {
            if should_container_be_restarted(container, pod, status) {
                actions.containers_to_start.push(i);
                if let Some(unknown) = current.filter(|s| s.state == ContainerState::Unknown) {
                    actions.containers_to_kill.push(ContainerToKill {
                        id: unknown.id.clone(),
                        name: unknown.name.clone(),
                        reason: KillReason::Unknown,
                        message: "Container is in \"unknown\" state, try killing it before restart".to_owned(),
                    });
                }
            }
            continue;
        };
        let mut restart = should_restart_on_failure(pod);
        let (reason, message) = if running.hash != hash(container) {
            // The definition changed: restart whatever the policy.
            restart = true;
            (KillReason::DefinitionChanged, format!("Container {} definition changed", container.name))
        } else if probes.liveness.contains(&running.id) {
            (KillReason::LivenessProbe, format!("Container {} failed liveness probe", container.name))
        } else if probes.startup.contains(&running.id) {
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
        actions.containers_to_kill.push(ContainerToKill {
            id: running.id.clone(),
            name: container.name.clone(),
            reason,
            message,
        });
    }
    if keep == 0 && actions.containers_to_start.is_empty() {
        actions.kill_pod = true;
    }
    actions
}

#[cfg(test)]
mod tests;
