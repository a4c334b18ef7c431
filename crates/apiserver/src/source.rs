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

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Watches the pods bound to `node` until `cancel` or until `deliver` returns `false` (its
/// receiver is gone); each change hands `deliver` the whole set, by UID. Each notification of
/// `api_back` (the heartbeats answered again, [`crate::heartbeat::run`]) lists and watches
/// afresh.
pub async fn watch_pods<F, Fut>(
    client: Client,
    node: &str,
    mut deliver: F,
    api_back: Arc<Notify>,
    cancel: CancellationToken,
) where
    F: FnMut(Vec<Pod>) -> Fut,
    Fut: Future<Output = bool>,
{
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let watch = || watcher(api.clone(), config.clone()).default_backoff().boxed();
    let mut events = watch();
    let (mut pods, mut listing) = (BTreeMap::new(), None::<BTreeMap<String, Pod>>);
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
        let uid = |pod: &Pod| pod.metadata.uid.clone().unwrap_or_default();
        let changed = match event {
            Ok(watcher::Event::Init) => {
                listing = Some(BTreeMap::new());
                false
            }
            Ok(watcher::Event::InitApply(pod)) => {
                listing.get_or_insert_with(BTreeMap::new).insert(uid(&pod), pod);
                false
            }
            Ok(watcher::Event::InitDone) => {
                pods = listing.take().unwrap_or_default();
                true
            }
            Ok(watcher::Event::Apply(pod)) => {
                pods.insert(uid(&pod), pod);
                true
            }
            Ok(watcher::Event::Delete(pod)) => pods.remove(&uid(&pod)).is_some(),
            Err(err) => {
                warn!(node = %node, error = %err, "the watch of this node's pods failed; listing again");
                false
            }
        };
        if changed && !deliver(pods.values().cloned().collect()).await {
            return;
        }
    }
}
