//! Conversions from CRI messages to the runtime types of `kubelet-core`.

use k8s_openapi::jiff::Timestamp;
use kubelet_core::{
    PodUid,
    runtime::{
        ContainerState, ContainerStats, ContainerStatus, InterfaceStats, NetworkMode, PodNetworkStats, SandboxState,
        SandboxStatus,
    },
};

use crate::{labels, pb};

/// A CRI timestamp (nanoseconds since the epoch, 0 for unset).
pub(crate) fn timestamp(nanos: i64) -> Option<Timestamp> {
    (nanos > 0).then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok()).flatten()
}

pub(crate) fn container_state(state: i32) -> ContainerState {
    match pb::ContainerState::try_from(state) {
        Ok(pb::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(pb::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(pb::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

pub(crate) fn sandbox_state(state: i32) -> SandboxState {
    if state == pb::PodSandboxState::SandboxReady as i32 { SandboxState::Ready } else { SandboxState::NotReady }
}

/// A container's stats, when it names its pod (containers of other clients do not).
pub(crate) fn container_stats(stats: pb::ContainerStats) -> Option<ContainerStats> {
    let attributes = stats.attributes?;
    let uid = pod_uid(&attributes.labels)?;
    let name = attributes.metadata.map(|m| m.name).unwrap_or_default();
    let mut converted = ContainerStats::new(attributes.id, uid, name);
    converted.memory_working_set_bytes = stats.memory.and_then(|m| m.working_set_bytes).map(|v| v.value);
    if let Some(cpu) = stats.cpu {
        converted.cpu_usage_core_nanoseconds = cpu.usage_core_nano_seconds.map(|v| v.value);
        converted.cpu_timestamp_nanos = Some(cpu.timestamp).filter(|t| *t > 0);
    }
    if let Some(layer) = stats.writable_layer {
        converted.writable_layer_bytes = layer.used_bytes.map(|v| v.value);
        converted.writable_layer_inodes = layer.inodes_used.map(|v| v.value);
    }
    Some(converted)
}

/// A sandbox's network figures, when it names its pod and the runtime measured its network.
pub(crate) fn pod_network_stats(stats: pb::PodSandboxStats) -> Option<PodNetworkStats> {
    let uid = pod_uid(&stats.attributes?.labels)?;
    let network = stats.linux?.network?;
    let interface = |usage: pb::NetworkInterfaceUsage| {
        let mut converted = InterfaceStats::new(usage.name);
        converted.rx_bytes = usage.rx_bytes.map(|v| v.value);
        converted.rx_errors = usage.rx_errors.map(|v| v.value);
        converted.tx_bytes = usage.tx_bytes.map(|v| v.value);
        converted.tx_errors = usage.tx_errors.map(|v| v.value);
        converted
    };
    let mut converted = PodNetworkStats::new(uid);
    converted.default_interface = network.default_interface.map(interface);
    converted.interfaces = network.interfaces.into_iter().map(interface).collect();
    Some(converted)
}

/// The pod UID label of a listed object.
pub(crate) fn pod_uid(labels: &std::collections::HashMap<String, String>) -> Option<PodUid> {
    labels.get(labels::POD_UID).filter(|u| !u.is_empty()).map(PodUid::new)
}

/// A container's name: its label, else the CRI metadata's name.
fn container_name(
    labels: &std::collections::HashMap<String, String>,
    metadata: Option<&pb::ContainerMetadata>,
) -> String {
    labels.get(labels::CONTAINER_NAME).cloned().or_else(|| metadata.map(|m| m.name.clone())).unwrap_or_default()
}

pub(crate) fn sandbox_status(s: &pb::PodSandboxStatus) -> SandboxStatus {
    let mut status = SandboxStatus::new(&s.id, s.metadata.as_ref().map_or(0, |m| m.attempt), sandbox_state(s.state));
    status.created_at = timestamp(s.created_at);
    if let Some(network) = &s.network {
        status.ips = std::iter::once(network.ip.clone())
            .chain(network.additional_ips.iter().map(|ip| ip.ip.clone()))
            .filter(|ip| !ip.is_empty())
            .collect();
    }
    let network_mode =
        s.linux.as_ref().and_then(|l| l.namespaces.as_ref()).and_then(|n| n.options.as_ref()).map(|o| o.network);
    if network_mode == Some(pb::NamespaceMode::Node as i32) {
        status.network_mode = NetworkMode::Host;
    }
    status
}

pub(crate) fn container_status(c: &pb::ContainerStatus) -> ContainerStatus {
    let name = container_name(&c.labels, c.metadata.as_ref());
    let mut status = ContainerStatus::new(&c.id, name, container_state(c.state));
    status.created_at = timestamp(c.created_at);
    status.started_at = timestamp(c.started_at);
    status.finished_at = timestamp(c.finished_at);
    status.exit_code = c.exit_code;
    status.image = c.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
    status.image_id = if c.image_id.is_empty() { c.image_ref.clone() } else { c.image_id.clone() };
    status.image_ref = c.image_ref.clone();
    status.hash = labels::hash_of(&c.annotations);
    status.restart_count = labels::restart_count_of(&c.annotations);
    status.reason = c.reason.clone();
    status.message = c.message.clone();
    status
}

/// A CRI container event, with the pod status it carries.
pub(crate) fn container_event(e: &pb::ContainerEventResponse) -> Option<kubelet_core::runtime::ContainerEvent> {
    use kubelet_core::runtime::{ContainerEvent, ContainerEventKind, PodStatus};
    let kind = match pb::ContainerEventType::try_from(e.container_event_type).ok()? {
        pb::ContainerEventType::ContainerCreatedEvent => ContainerEventKind::Created,
        pb::ContainerEventType::ContainerStartedEvent => ContainerEventKind::Started,
        pb::ContainerEventType::ContainerStoppedEvent => ContainerEventKind::Stopped,
        pb::ContainerEventType::ContainerDeletedEvent => ContainerEventKind::Deleted,
    };
    let sandbox = e.pod_sandbox_status.as_ref()?;
    let meta = sandbox.metadata.as_ref()?;
    let mut status = PodStatus::new(PodUid::new(&meta.uid), &meta.name, &meta.namespace);
    let sandbox_status = sandbox_status(sandbox);
    if sandbox_status.state == SandboxState::Ready {
        status.ips.clone_from(&sandbox_status.ips);
    }
    status.sandbox_statuses.push(sandbox_status);
    let mut containers: Vec<_> = e.containers_statuses.iter().collect();
    containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    status.container_statuses = containers.into_iter().map(container_status).collect();
    Some(ContainerEvent::new(
        &e.container_id,
        kind,
        timestamp(e.created_at).unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        status,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_times() {
        assert_eq!(container_state(pb::ContainerState::ContainerRunning as i32), ContainerState::Running);
        assert_eq!(container_state(99), ContainerState::Unknown);
        assert_eq!(sandbox_state(pb::PodSandboxState::SandboxNotready as i32), SandboxState::NotReady);
        assert_eq!(timestamp(0), None);
        assert_eq!(timestamp(1_700_000_000_000_000_000).unwrap().as_second(), 1_700_000_000);
    }
}
