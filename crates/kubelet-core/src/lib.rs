//! The vocabulary and shared machinery of a Kubernetes node agent.
//!
//! `kubelet-core` is the part of kubelet-rs every node agent shares, whatever runtime or event
//! source it plugs in.
//! It follows upstream Kubernetes' `pkg/kubelet` closely:
//!
//! - The traits an agent is assembled from: [`Runtime`] (the container runtime), [`Pleg`] (the pod
//!   lifecycle event generator), [`PodWorkers`] (one serialized worker per pod) and the
//!   [`PodSyncer`] callbacks they call, and [`SyncHandler`] (what the sync loop dispatches to).
//! - The hooks of a runtime: [`HookRunner`] runs a container's postStart or preStop handler
//!   (module [`hook`]), [`ProbeManager`] is the prober the kubelet drives (module [`probe`]).
//! - The data they exchange: config updates ([`PodUpdate`]), the runtime's view of pods
//!   ([`runtime::Pod`], [`runtime::PodStatus`]) and lifecycle events ([`PodLifecycleEvent`]).
//! - Machinery: the status [`Cache`] with its "newer than" barrier, the [`PodManager`], the delayed
//!   [`WorkQueue`], keyed exponential [`Backoff`], the runtime and source state, and the
//!   [`sync_loop`] itself.
//!
//! It does no IO: implementations live in sibling crates (`kubelet-node` for the kubelet and the
//! `Agent` builder, `kubelet-config` for the pod config sources, `kubelet-cri-client`,
//! `kubelet-pleg`, `kubelet-podworkers`); the `kubelet-rs` binary picks them.
//! Pods are `k8s_openapi::api::core::v1::Pod`; this crate selects no k8s-openapi version feature,
//! so the final binary picks one.
//!
//! A complete custom node agent, with its own [`Runtime`] (each container a host process) and
//! the library's sync loop, pod workers, PLEG, status rules, static pod source and local API:
//! [`process_agent.rs`](https://github.com/kubelet-rs/kubelet-rs/blob/main/crates/sdk/examples/process_agent.rs)
//! (`cargo run -p kubelet-sdk --example process_agent -- MANIFESTS ROOT`).
//! A runtime without images, exec or dead containers to collect implements six methods; the
//! others have defaults that say so.
//!
//! # Example
//!
//! Plug a runtime (here the in-memory fake) and a handler into the sync loop:
//!
//! ```no_run
//! use std::{convert::Infallible, sync::Arc};
//!
//! use k8s_openapi::api::core::v1::Pod;
//! use kubelet_core::{
//!     Backoff, LoopHealth, PodManager, ProbeResults, Runtime, RuntimeState, Source, SourcesReady, SyncHandler, WorkQueue,
//!     fake::FakeRuntime,
//!     sync_loop::{self, Inputs, Shared},
//! };
//! use tokio::sync::mpsc;
//! use tokio_util::sync::CancellationToken;
//!
//! /// A handler that starts every added pod at once, without pod workers.
//! struct Direct<R> {
//!     runtime: R,
//!     backoff: Backoff,
//! }
//!
//! impl<R: Runtime> SyncHandler for Direct<R> {
//!     type Error = Infallible;
//!
//!     async fn handle_pod_additions(&self, pods: Vec<Arc<Pod>>) {
//!         for pod in pods {
//!             let status = kubelet_core::runtime::PodStatus::new(kubelet_core::PodUid::of(&pod), "", "");
//!             let result = self.runtime.sync_pod(&pod, &status, &self.backoff, &ProbeResults::new(), &Default::default()).await;
//!             println!("synced {:?}: {} steps", pod.metadata.name, result.results.len());
//!         }
//!     }
//!     async fn handle_pod_updates(&self, _: Vec<Arc<Pod>>) {}
//!     async fn handle_pod_removes(&self, _: Vec<Arc<Pod>>) {}
//!     async fn handle_pod_reconcile(&self, _: Vec<Arc<Pod>>) {}
//!     async fn handle_pod_syncs(&self, _: Vec<Arc<Pod>>) {}
//!     async fn handle_pod_cleanups(&self) -> Result<(), Infallible> {
//!         Ok(())
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() {
//!     let handler = Direct { runtime: FakeRuntime::new(), backoff: Backoff::default() };
//!     let (_config_tx, config) = mpsc::channel(64);
//!     let (_pleg_tx, pleg) = mpsc::channel(1000);
//!     let (_probe_tx, probes) = mpsc::channel(64);
//!     let runtime_state = Arc::new(RuntimeState::default());
//!     runtime_state.update_from_status(handler.runtime.status().await.as_ref(), tokio::time::Instant::now());
//!     let shared = Shared::new(
//!         Arc::new(PodManager::new()),
//!         Arc::new(WorkQueue::new()),
//!         Arc::new(SourcesReady::new([Source::File])),
//!         runtime_state,
//!         Arc::new(LoopHealth::new(std::time::Duration::from_secs(60))),
//!     );
//!     let cancel = CancellationToken::new();
//!     sync_loop::run(&handler, Inputs::new(config, pleg, probes), &shared, &Default::default(), cancel).await;
//! }
//! ```
//!
//! # Feature flags
//!
//! - `fake-runtime`: `fake::FakeRuntime`, an in-memory, recording, scriptable runtime for unit
//!   tests, benchmarks, demos and downstream users.
//! - `test-util`: `testing::RealRuntime`, which finds the real runtime `cargo xtask ci` starts
//!   for `real_*` tests, and test pod builders.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]

pub mod apparmor;
mod backoff;
mod cache;
pub mod cgroups;
pub mod clock;
mod error;
pub mod events;
pub mod eviction;
mod handler;
pub mod hook;
pub mod metrics;
pub mod network;
mod pleg;
mod podmanager;
pub mod probe;
mod queue;
pub mod ratelimit;
pub mod resources;
pub mod runtime;
mod startup;
mod state;
pub mod sync_loop;
pub mod sysctl;
pub mod types;
pub mod volume;
mod workers;

#[cfg(feature = "fake-runtime")]
#[cfg_attr(docsrs, doc(cfg(feature = "fake-runtime")))]
pub mod fake;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod testing;

mod util;

#[doc(inline)]
pub use crate::{
    backoff::{Backoff, DEFAULT_INITIAL as BACKOFF_INITIAL, DEFAULT_MAX as BACKOFF_MAX},
    cache::{Cache, CachedStatus, StatusError},
    error::ErrorChain,
    handler::SyncHandler,
    hook::HookRunner,
    pleg::{Pleg, PodLifecycleEvent, PodLifecycleEventKind},
    podmanager::PodManager,
    probe::{ProbeKind, ProbeManager, ProbeOutcome, ProbeResult, ProbeResults},
    queue::WorkQueue,
    runtime::Runtime,
    startup::{StartupDurations, StartupTracker},
    state::{HealthCheck, HealthError, LoopHealth, RuntimeState, SourcesReady},
    types::{Operation, PodUid, PodUpdate, Source, SyncPodType},
    volume::{VolumeManager, VolumePlugin},
    workers::{
        CompletionFn, KillPodOptions, NETWORK_NOT_READY_MESSAGE, PodStatusFn, PodSyncer, PodWorkers, UpdatePodOptions,
        WorkerState, WorkerSync,
    },
};

/// Re-exported so downstream code names the same k8s-openapi as this crate.
pub use k8s_openapi;
/// Re-exported so downstream code names the same cancellation types as this crate.
pub use tokio_util;
