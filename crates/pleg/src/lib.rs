//! Pod lifecycle event generators (PLEG) for kubelet-rs.
//!
//! [`GenericPleg`] is upstream's relisting PLEG (`pkg/kubelet/pleg/generic.go`): every relist
//! period (1 s) it lists every pod from the runtime, compares each container's and sandbox's
//! state with the previous listing, inspects only the pods whose containers changed (so a relist
//! of unchanged pods costs the two list calls and nothing more), writes their status to the
//! [`kubelet_core::Cache`] stamped with the relist's start, sends one
//! [`kubelet_core::PodLifecycleEvent`] per transition, and finally bumps the cache's global
//! timestamp.
//!
//! [`EventedPleg`] is upstream's evented PLEG (`evented.go`): it consumes the runtime's container
//! event stream (CRI `GetContainerEvents`, through `kubelet_core::runtime::RuntimeEvents`),
//! updates the cache from each event at the event's time and sends the same events, while a slow
//! relist (300 s) runs as a safety net; after 5 stream failures it falls back to relisting every
//! second. A runtime without container events (containerd 1.6) may give change hints instead
//! (`RuntimeEvents::watch_changes`): the evented PLEG then relists shortly after each hint (at
//! most every 100 ms, or 25 ms after an exit) and otherwise at the safety net; with neither, it relists every second.
//!
//! Beyond upstream:
//! - pods are inspected concurrently, each with its own timeout, so one hung inspection never
//!   stalls the relist (upstream's "PLEG is not healthy" outages); a pod that fails is retried at
//!   the next relist with its old record kept;
//! - [`kubelet_core::Pleg::relist_now`] relists at once, so transitions the kubelet itself caused
//!   are seen in milliseconds rather than after up to a second.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use kubelet_core::{Cache, Pleg, fake::FakeRuntime, tokio_util::sync::CancellationToken};
//! use kubelet_pleg::{Config, GenericPleg};
//!
//! #[tokio::main]
//! async fn main() {
//!     let cache = Arc::new(Cache::new());
//!     let (pleg, mut events) = GenericPleg::new(Arc::new(FakeRuntime::new()), cache, Config::default());
//!     let cancel = CancellationToken::new();
//!     let pleg = Arc::new(pleg);
//!     tokio::spawn({
//!         let (pleg, cancel) = (pleg.clone(), cancel.clone());
//!         async move { pleg.run(cancel).await }
//!     });
//!     while let Some(event) = events.recv().await {
//!         println!("{} {:?}", event.id, event.kind);
//!     }
//! }
//! ```

pub mod evented;
mod events;
mod generic;
mod metrics;

#[doc(inline)]
pub use crate::{
    evented::EventedPleg,
    generic::{Config, GenericPleg},
};
