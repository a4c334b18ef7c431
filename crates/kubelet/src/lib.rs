//! The kubelet of kubelet-rs: the [`SyncHandler`](kubelet_core::SyncHandler) and
//! [`PodSyncer`](kubelet_core::PodSyncer) implementations over any
//! [`Runtime`](kubelet_core::Runtime), the pod status rules, admission, and an [`Agent`] builder
//! that wires a whole node agent from parts.
//!
//! It follows upstream Kubernetes' `pkg/kubelet`:
//!
//! - [`PodSync`] is what the pod workers call (`SyncPod`, `SyncTerminatingPod`,
//!   `SyncTerminatingRuntimePod`, `SyncTerminatedPod`): the active deadline, the network gate,
//!   pod directories, the reason cache, and the CRI-violation check after a kill.
//! - [`Kubelet`] is what the sync loop calls: admission ([`admission`]), dispatch to the pod
//!   workers, and housekeeping that kills orphans found in the PLEG's cache and has
//!   [`cleanup::Cleanups`] remove what is left of pods that are gone, in the background.
//! - [`status`] holds the status rules as pure functions (`getPhase`, the kubelet-owned
//!   conditions, container statuses); [`StatusStore`] keeps the versioned statuses.
//! - [`Agent`] builds the rest around them: cache, work queue, pod manager, runtime state, a
//!   runtime status poll, and the sync loop.
//!
//! - [`server`] (feature `server`) is the local API: upstream's read-only API (`/healthz`,
//!   `/pods`, `/metrics`) and, on a unix socket, running pods, container logs and events.
//!
//! The crate names no concrete runtime, PLEG or pod workers: the caller picks them (the
//! `kubelet-rs` binary picks `kubelet-cri-client`, `kubelet-pleg` and `kubelet-podworkers`).
//! `kubelet-sdk` wires it with defaults; its `examples/process_agent.rs` is a whole agent around
//! a runtime of its own.
//!
//! # Example
//!
//! An agent on the in-memory fake runtime, with the relisting PLEG and the pod workers of
//! kubelet-rs (any [`Pleg`](kubelet_core::Pleg) and [`PodWorkers`](kubelet_core::PodWorkers) do):
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use kubelet_core::{Source, fake::FakeRuntime};
//! use kubelet_node::{Agent, agent};
//!
//! #[tokio::main]
//! async fn main() {
//!     let config = agent::Config::new(kubelet_node::Config::new("node-1"), [Source::File]);
//!     let agent = Agent::builder(Arc::new(FakeRuntime::new()), config).build(
//!         |runtime, cache| kubelet_pleg::GenericPleg::new(runtime, cache, Default::default()),
//!         |parts| {
//!             let config = kubelet_podworkers::Config::default();
//!             kubelet_podworkers::PodWorkers::new(parts.syncer, parts.cache, parts.work_queue, config, parts.cancel)
//!         },
//!     );
//!     // Config sources (for example `kubelet-config`'s file source) send pod updates here.
//!     let (_updates_tx, updates) = tokio::sync::mpsc::channel(50);
//!     agent.run(updates).await;
//! }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]

pub mod admission;
pub mod agent;
pub mod cleanup;
mod handler;
pub mod image_gc;
pub mod mirror;
mod pod_sync;
#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
pub mod server;
pub mod status;
pub mod status_store;
pub mod unsupported;

#[cfg(test)]
mod tests;

#[doc(inline)]
pub use crate::{
    agent::Agent,
    handler::Kubelet,
    mirror::MirrorClient,
    pod_sync::{BoxError, Config, Error, PodSync, Result},
    status_store::{StatusSink, StatusStore},
};

/// Locks `mutex`, recovering the data if a previous holder panicked.
///
/// Every critical section in this crate leaves its data consistent before it can panic (they
/// only insert, remove or overwrite whole entries), so a poisoned lock still guards valid data.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
