//! The node's own Node as the API server has it (upstream's node informer in
//! `pkg/kubelet/kubelet.go`: a watch of that one name, as the Node authorizer allows), for pod
//! admission: upstream admits pods against that Node, so the labels and taints an administrator
//! sets (`kubectl label node`, `kubectl taint node`) count, and its API pod source starts only
//! once the watch has listed the Node.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Watches the Node `name` until `cancel`: `on_change` gets it after its first list and after
/// each change, `None` while it does not exist; `listed` turns true once the first list is in,
/// whatever it found. A failed watch lists again after kube-rs's default backoff, and what
/// `on_change` last got stands meanwhile.
pub async fn watch_node(
    client: Client,
    name: String,
    on_change: impl Fn(Option<&Node>),
    listed: watch::Sender<bool>,
    cancel: CancellationToken,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(Api::<Node>::all(client), config).default_backoff().boxed();
    let mut listing: Option<Node> = None;
    while let Some(event) = cancel.run_until_cancelled(events.next()).await.flatten() {
        match event {
            Ok(watcher::Event::Init) => listing = None,
            Ok(watcher::Event::InitApply(node)) => listing = Some(node),
            Ok(watcher::Event::InitDone) => {
                on_change(listing.take().as_ref());
                listed.send_replace(true);
            }
            Ok(watcher::Event::Apply(node)) => on_change(Some(&node)),
            Ok(watcher::Event::Delete(_)) => on_change(None),
            Err(err) => warn!(node = %name, error = %err, "the watch of the node failed; listing it again"),
        }
    }
}
