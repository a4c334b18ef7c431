//! Where a kubelet's pods and settings come from, as upstream's `pkg/kubelet/config` and the
//! `kubelet.config.k8s.io/v1beta1` configuration file.
//!
//! - Sources produce snapshots of the pods they want: [`file`](mod@file) (feature `file-source`)
//!   watches `staticPodPath`, [`http`] (feature `http-source`) polls `staticPodURL`, and later the
//!   API server.
//! - Each sends its snapshots through a [`SourceSender`] to the [`PodConfig`], whose [`Merger`]
//!   turns them into the ADD, UPDATE, DELETE, REMOVE and RECONCILE [`PodUpdate`]s the sync loop
//!   reads.
//! - [`manifest`] decodes, defaults and validates static pod manifests.
//! - [`configuration`] reads the node's configuration file (`--config`), a [`KubeletConfiguration`].
//!
//! Three things are called "config" in a kubelet, and this workspace names them apart:
//! [`PodConfig`] is the desired pods as the sources say them; [`KubeletConfiguration`] is the
//! node's settings file; and each component's `Config` (`file::Config`, `kubelet_node::Config`)
//! is how that component runs.
//!
//! # Example
//!
//! Watch a manifest directory and print what the sync loop would receive:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use kubelet_config::{PodConfig, file};
//! use kubelet_core::{Source, events::RingRecorder, tokio_util::sync::CancellationToken};
//!
//! #[tokio::main]
//! async fn main() {
//!     let recorder = Arc::new(RingRecorder::default());
//!     let (config, mut updates) = PodConfig::new(recorder.clone());
//!     let source = file::FileSource::new(
//!         file::Config::new("/etc/kubernetes/manifests", "node-1"),
//!         config.source(Source::File),
//!         recorder,
//!     );
//!     tokio::spawn(source.run(CancellationToken::new()));
//!     while let Some(update) = updates.recv().await {
//!         println!("{:?}: {} pods", update.op, update.pods.len());
//!     }
//! }
//! ```
//!
//! [`PodUpdate`]: kubelet_core::PodUpdate

#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]

pub mod configuration;
#[cfg(feature = "file-source")]
#[cfg_attr(docsrs, doc(cfg(feature = "file-source")))]
pub mod file;
#[cfg(feature = "http-source")]
#[cfg_attr(docsrs, doc(cfg(feature = "http-source")))]
pub mod http;
pub mod manifest;
mod merge;
mod pod_config;

/// Results of decoding manifests.
pub type Result<T, E = manifest::ManifestError> = std::result::Result<T, E>;

#[doc(inline)]
pub use crate::{
    configuration::KubeletConfiguration,
    merge::{Merger, differ_semantically},
    pod_config::{Closed, PodConfig, SourceSender, UPDATE_CHANNEL_CAPACITY},
};
