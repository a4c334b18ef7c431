//! The API pod source (upstream `pkg/kubelet/config/apiserver.go`): the pods bound to this node,
//! watched with `spec.nodeName=<node>`, handed on as whole snapshots for the config merger.
//!
//! The first snapshot goes out only once the initial list is complete, so the source is not
//! "seen" (and housekeeping kills nothing of it) before the API server has said what runs here.
//! A watch that ends, fails or is told its version is gone (410) lists again, with a backoff.
//! When the node's heartbeats reach the API server again after failing, the watch is made
//! afresh at once: one made into a server that hung would wait for its answer
//! ([`crate::heartbeat::UNANSWERED_AFTER`]) and then its backoff, up to a minute more, before
//! the node saw a pod bound meanwhile.

use std::{collections::BTreeMap, future::Future, sync::Arc};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Watches the pods bound to `node` until `cancel` or until `deliver` returns `false` (its
/// receiver is gone); each change hands `deliver` the whole set, by UID, and the changes that
/// arrived together are handed on as one. The pods are shared: one the watch has not changed
/// since is the same `Arc` as in the set before (the config merger then neither copies nor
/// compares it). Each notification of
/// `api_back` (the heartbeats answered again, [`crate::heartbeat::run`]) lists and watches
/// afresh.
pub async fn watch_pods<F, Fut>(
    client: Client,
    node: &str,
    mut deliver: F,
    api_back: Arc<Notify>,
    cancel: CancellationToken,
) where
    F: FnMut(Vec<Arc<Pod>>) -> Fut,
    Fut: Future<Output = bool>,
{
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let watch = || watcher(api.clone(), config.clone()).default_backoff().boxed();
    let mut events = watch();
    let mut bound = BoundPods::default();
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            () = api_back.notified() => {
                info!(node = %node, "the API server answers again: watching this node's pods afresh");
                events = watch();
                continue;
            }
            event = events.next() => event,
        };
        let Some(event) = event else { return };
        let mut changed = bound.apply(node, event);
        // The events already here go in before the snapshot: a burst (50 pods marked for
        // deletion at once) is one snapshot, not one for each event, and waits for nothing.
        let mut ended = false;
        while let Some(next) = events.next().now_or_never() {
            let Some(event) = next else {
                ended = true;
                break;
            };
            changed |= bound.apply(node, event);
        }
        if changed && !deliver(bound.pods.values().cloned().collect()).await {
            return;
        }
        if ended {
            return;
        }
    }
}

/// The pods bound to the node as the watch has told them, by UID; a list in progress is kept
/// apart until it is complete.
#[derive(Default)]
struct BoundPods {
    pods: BTreeMap<String, Arc<Pod>>,
    listing: Option<BTreeMap<String, Arc<Pod>>>,
}

impl BoundPods {
    /// Takes one event of the watch in; whether the bound pods changed.
    fn apply(&mut self, node: &str, event: Result<watcher::Event<Pod>, watcher::Error>) -> bool {
        let uid = |pod: &Pod| pod.metadata.uid.clone().unwrap_or_default();
        match event {
            Ok(watcher::Event::Init) => {
                self.listing = Some(BTreeMap::new());
                false
            }
            Ok(watcher::Event::InitApply(pod)) => {
                self.listing.get_or_insert_with(BTreeMap::new).insert(uid(&pod), without_managed_fields(pod));
                false
            }
            Ok(watcher::Event::InitDone) => {
                self.pods = self.listing.take().unwrap_or_default();
                true
            }
            Ok(watcher::Event::Apply(pod)) => {
                self.pods.insert(uid(&pod), without_managed_fields(pod));
                true
            }
            Ok(watcher::Event::Delete(pod)) => self.pods.remove(&uid(&pod)).is_some(),
            Err(err) => {
                warn!(node = %node, error = %err, "the watch of this node's pods failed; listing again");
                false
            }
        }
    }
}

/// `pod` without its `managedFields`, which nothing on the node reads: they are most of what a
/// pod from the API holds, and each change copies the pod.
fn without_managed_fields(mut pod: Pod) -> Arc<Pod> {
    pod.metadata.managed_fields = None;
    Arc::new(pod)
}
