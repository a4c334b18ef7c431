//! The prober of a Kubernetes node agent (upstream `pkg/kubelet/prober` and `pkg/probe`):
//! liveness, readiness and startup probes with exec, httpGet, tcpSocket and grpc actions.
//!
//! [`Manager`] implements `kubelet_core::ProbeManager`: the kubelet adds the pods it runs and
//! removes those that terminate, and the manager runs one task per (pod, container, probe kind).
//! Each task reads the container from the PLEG's `Cache` at the probe's period, probes it, and
//! records the verdict in the shared `kubelet_core::ProbeResults` once `successThreshold` or
//! `failureThreshold` results came in a row; every change also goes to the sync loop as a
//! `ProbeResult`, which resyncs the pod.
//! The kubelet hands the same store to the runtime with each sync, which kills and restarts a
//! container that failed liveness or startup, and reads readiness and startup to set `ready`
//! and `started`.
//!
//! Upstream's rules hold: initial verdicts (readiness Failure, liveness Success, startup
//! Unknown), `initialDelaySeconds` from the container's start, the other probes only once the
//! startup probe has passed, a hold after a liveness or startup failure until a new container
//! appears, a jittered first run after the agent starts, `Unhealthy` events and the
//! `prober_probe_total` and `prober_probe_duration_seconds` metrics.
//! The decisions are a pure state machine (`worker.rs`), tested with paused time.
//!
//! [`Hooks`] implements `kubelet_core::HookRunner` with the same actions: it runs one `postStart`
//! or `preStop` handler (exec, httpGet, sleep) when a runtime asks; the runtime decides when, and
//! what a failure means.
//!
//! httpGet probes and hooks with `scheme: HTTPS` speak TLS without checking the server's
//! certificate against any authority, as upstream's (`InsecureSkipVerify`).
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use kubelet_core::{
//!     Cache, ProbeManager, ProbeResults, events::RingRecorder, fake::FakeRuntime,
//!     tokio_util::sync::CancellationToken,
//! };
//! use kubelet_prober::{Config, Manager};
//!
//! #[tokio::main]
//! async fn main() {
//!     let (updates, mut changes) = tokio::sync::mpsc::channel(64);
//!     let prober = Manager::new(
//!         Arc::new(FakeRuntime::new()),
//!         Arc::new(Cache::new()),
//!         Arc::new(ProbeResults::new()),
//!         updates,
//!         Arc::new(RingRecorder::default()),
//!         Config::default(),
//!         CancellationToken::new(),
//!     );
//!     let pod = Arc::new(kubelet_core::k8s_openapi::api::core::v1::Pod::default());
//!     prober.add_pod(&pod);
//!     while let Some(change) = changes.recv().await {
//!         println!("{:?} of {} is now {:?}", change.kind, change.container_id, change.outcome);
//!     }
//! }
//! ```

mod grpc;
mod handlers;
mod hook;
mod manager;
mod tls;
mod worker;

pub use crate::{
    hook::Hooks,
    manager::{Config, Manager},
};
