//! Per-pod serialized workers for kubelet-rs (upstream `pkg/kubelet/pod_workers.go`).
//!
//! [`PodWorkers`] implements `kubelet_core::PodWorkers`: one tokio task per pod UID, at most one
//! sync in flight per pod, and only the newest pending update kept.
//! Each pod goes through upstream's lifecycle, syncing -> terminating -> terminated -> finished,
//! calling the kubelet's `PodSyncer` methods: `sync_pod` while the pod should run,
//! `sync_terminating_pod` (retried until it succeeds) once it must stop, `sync_terminated_pod` to
//! clean up, and `sync_terminating_runtime_pod` for orphans known only to the runtime.
//!
//! Rules kept from upstream:
//! - a pod becomes terminating on a deletion timestamp, a terminal phase, a kill, a terminal
//!   `sync_pod` result, or when housekeeping no longer desires it;
//! - the grace period comes from `deletionGracePeriodSeconds`, a kill override or
//!   `terminationGracePeriodSeconds`, only ever shrinks, is at least 1 s, and a shorter one
//!   cancels the sync in flight;
//! - before each sync the worker waits until the status cache is newer than its last sync;
//! - after a sync the pod is requeued: resync interval (1 min) with jitter on success, 10 s on
//!   error, 1 s when the network is not ready, at once on a phase transition;
//! - a finished UID never runs again until housekeeping forgets it; a create for a terminating
//!   UID is remembered and takes effect after that;
//! - among static pods with the same full name only one is started at a time, the others wait in
//!   FIFO order.
//!
//! The transition logic lives in a private, IO-free state machine tested by tables and property
//! tests; this crate's async layer only spawns, wakes and cancels.
//!
//! # Example
//!
//! ```no_run
//! use std::{convert::Infallible, sync::Arc};
//!
//! use k8s_openapi::api::core::v1::Pod;
//! use kubelet_core::{
//!     Cache, PodSyncer, PodWorkers as _, SyncPodType, UpdatePodOptions, WorkQueue,
//!     runtime::{self, PodStatus},
//!     tokio_util::sync::CancellationToken,
//!     PodStatusFn,
//! };
//! use kubelet_podworkers::{Config, PodWorkers};
//!
//! struct Printer;
//!
//! impl PodSyncer for Printer {
//!     type Error = Infallible;
//!     async fn sync_pod(&self, kind: SyncPodType, pod: &Arc<Pod>, _: Option<&Arc<Pod>>, _: &PodStatus) -> Result<bool, Infallible> {
//!         println!("{kind} {:?}", pod.metadata.name);
//!         Ok(false)
//!     }
//!     async fn sync_terminating_pod(&self, _: &Arc<Pod>, _: &PodStatus, grace: i64, _: Option<&PodStatusFn>) -> Result<(), Infallible> {
//!         println!("stopping within {grace} s");
//!         Ok(())
//!     }
//!     async fn sync_terminating_runtime_pod(&self, _: &runtime::Pod) -> Result<(), Infallible> {
//!         Ok(())
//!     }
//!     async fn sync_terminated_pod(&self, _: &Arc<Pod>, _: &PodStatus) -> Result<(), Infallible> {
//!         Ok(())
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() {
//!     let cancel = CancellationToken::new();
//!     let cache = Arc::new(Cache::new());
//!     let workers = PodWorkers::new(Arc::new(Printer), cache, Arc::new(WorkQueue::new()), Config::default(), cancel.clone());
//!     workers.update_pod(UpdatePodOptions::new(SyncPodType::Create, Arc::new(Pod::default())));
//!     cancel.cancel();
//!     workers.wait().await;
//! }
//! ```

mod core;
mod metrics;
mod workers;

#[doc(inline)]
pub use crate::workers::{Config, PodWorkers, Stats};
