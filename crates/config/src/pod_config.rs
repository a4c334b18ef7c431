//! [`PodConfig`], the merger behind a channel: each source sends through its [`SourceSender`], the
//! sync loop reads the merged updates.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{Mutex, mpsc};

use kubelet_core::{Operation, PodUpdate, Source, clock::wall_now, events::EventRecorder};

use crate::Merger;

/// Capacity of the channel from the merger to the sync loop (upstream's 50).
pub const UPDATE_CHANNEL_CAPACITY: usize = 50;

/// The merger behind a channel: sources send through [`SourceSender`]s, the sync loop reads the
/// receiver returned by [`PodConfig::new`].
#[derive(Clone)]
pub struct PodConfig {
    merger: Arc<Mutex<Merger>>,
    out: mpsc::Sender<PodUpdate>,
}

impl std::fmt::Debug for PodConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodConfig").finish_non_exhaustive()
    }
}

/// The sync loop went away: nobody reads updates any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the pod config channel is closed")]
pub struct Closed;

impl PodConfig {
    /// A config whose merged updates arrive on the returned receiver.
    pub fn new(recorder: Arc<dyn EventRecorder>) -> (PodConfig, mpsc::Receiver<PodUpdate>) {
        let (out, rx) = mpsc::channel(UPDATE_CHANNEL_CAPACITY);
        (PodConfig { merger: Arc::new(Mutex::new(Merger::new(recorder))), out }, rx)
    }

    /// The sender for one source.
    pub fn source(&self, source: Source) -> SourceSender {
        SourceSender { source, config: self.clone() }
    }

    /// The pods `source` currently contributes.
    pub async fn pods_of(&self, source: Source) -> Vec<Arc<Pod>> {
        self.merger.lock().await.pods_of(source)
    }
}

/// How one source hands its pods to the [`PodConfig`].
#[derive(Clone, Debug)]
pub struct SourceSender {
    source: Source,
    config: PodConfig,
}

impl SourceSender {
    /// The source this sender speaks for.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Sends the complete current set of the source's pods, owned or shared: a source that keeps
    /// its pods behind `Arc`s hands on those, and a pod it hands on again unchanged costs the
    /// merger no copy.
    pub async fn set(&self, pods: impl IntoIterator<Item = impl Into<Arc<Pod>>>) -> Result<(), Closed> {
        self.send(Operation::Set, pods).await
    }

    /// Sends an increment (or a snapshot, with [`Operation::Set`]).
    pub async fn send(&self, op: Operation, pods: impl IntoIterator<Item = impl Into<Arc<Pod>>>) -> Result<(), Closed> {
        // The merger's lock is held while sending, so updates leave in the order they were merged.
        let mut merger = self.config.merger.lock().await;
        for update in merger.merge(self.source, op, pods, wall_now()) {
            self.config.out.send(update).await.map_err(|_| Closed)?;
        }
        Ok(())
    }
}
