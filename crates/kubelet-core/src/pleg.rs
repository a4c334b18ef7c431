//! Pod lifecycle events and the `Pleg` trait (upstream `pkg/kubelet/pleg/pleg.go`).
//!
//! A PLEG watches the runtime (by relisting or from a CRI event stream), keeps the status
//! [`crate::Cache`] fresh and sends one [`PodLifecycleEvent`] per container transition on the
//! channel it was built with; the sync loop reads that channel.

use std::{fmt, future::Future};

use tokio_util::sync::CancellationToken;

use crate::{PodUid, state::HealthError};

/// What happened to a pod's container (upstream `PodLifeCycleEventType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PodLifecycleEventKind {
    /// A container (or sandbox) started running.
    ContainerStarted,
    /// A container (or sandbox) exited.
    ContainerDied,
    /// A container (or sandbox) is gone from the runtime.
    ContainerRemoved,
    /// The pod was re-inspected without a container transition; sync it.
    PodSync,
    /// A container went to an unknown state.
    ContainerChanged,
}

impl fmt::Display for PodLifecycleEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One pod lifecycle event.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PodLifecycleEvent {
    /// The pod concerned.
    pub id: PodUid,
    /// What happened.
    pub kind: PodLifecycleEventKind,
    /// The container or sandbox ID, when the event concerns one.
    pub container_id: Option<String>,
}

impl PodLifecycleEvent {
    /// Creates an event.
    pub fn new(id: PodUid, kind: PodLifecycleEventKind, container_id: Option<String>) -> Self {
        PodLifecycleEvent { id, kind, container_id }
    }
}

/// A pod lifecycle event generator.
pub trait Pleg: Send + Sync + 'static {
    /// Runs the generator until `cancel` fires.
    fn run(&self, cancel: CancellationToken) -> impl Future<Output = ()> + Send;

    /// Whether the generator is keeping up; the error says why not, in upstream's words.
    fn healthy(&self) -> Result<(), HealthError>;

    /// Asks for a relist as soon as possible, for example after the kubelet changed the runtime.
    /// Generators that do not relist ignore it.
    fn relist_now(&self) {}
}
