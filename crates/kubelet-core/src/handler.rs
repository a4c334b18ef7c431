//! The `SyncHandler` the sync loop dispatches to (upstream `SyncHandler` in `pkg/kubelet/kubelet.go`),
//! which the probe results the sync loop receives are forwarded to.

use std::{future::Future, sync::Arc};

use k8s_openapi::api::core::v1::Pod;

use crate::{
    PodUid,
    probe::{ProbeKind, ProbeOutcome, ProbeResult},
};

/// What the sync loop calls for each kind of work.
///
/// The six required methods are upstream's handlers.
/// Handlers return quickly: they record desired state and dispatch to pod workers; all runtime
/// work happens on the workers.
/// Used through generics, so futures are `Send` and unboxed.
pub trait SyncHandler: Send + Sync + 'static {
    /// The error `handle_pod_cleanups` may return; the loop logs it and goes on.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Pods new to the kubelet (config op ADD).
    fn handle_pod_additions(&self, pods: Vec<Arc<Pod>>) -> impl Future<Output = ()> + Send;

    /// Pods whose config changed (ops UPDATE and DELETE: a graceful delete is an update carrying
    /// `deletionTimestamp`).
    fn handle_pod_updates(&self, pods: Vec<Arc<Pod>>) -> impl Future<Output = ()> + Send;

    /// Pods gone from their source (op REMOVE): kill them.
    fn handle_pod_removes(&self, pods: Vec<Arc<Pod>>) -> impl Future<Output = ()> + Send;

    /// Pods whose status alone changed in the source (op RECONCILE).
    fn handle_pod_reconcile(&self, pods: Vec<Arc<Pod>>) -> impl Future<Output = ()> + Send;

    /// Pods to resync: PLEG events, due work-queue items and probe results.
    fn handle_pod_syncs(&self, pods: Vec<Arc<Pod>>) -> impl Future<Output = ()> + Send;

    /// Housekeeping, every 2 s once every source is ready.
    fn handle_pod_cleanups(&self) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// A container of a known pod died: prune that pod's old dead containers.
    /// The default does nothing.
    fn handle_container_died(&self, uid: &PodUid, container_id: &str) -> impl Future<Output = ()> + Send {
        let _ = (uid, container_id);
        async {}
    }

    /// A probe result changed for a container of `pod`.
    /// The default resyncs the pod on every result but a liveness success, as upstream does after
    /// recording readiness and startup in the status manager.
    fn handle_probe_result(&self, result: ProbeResult, pod: Arc<Pod>) -> impl Future<Output = ()> + Send {
        async move {
            if result.kind == ProbeKind::Liveness && result.outcome != ProbeOutcome::Failure {
                return;
            }
            self.handle_pod_syncs(vec![pod]).await;
        }
    }
}
