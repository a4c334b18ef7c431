//! The API pod source (upstream `pkg/kubelet/config/apiserver.go`): the pods bound to this node,
//! watched with `spec.nodeName=<node>`, handed on as whole snapshots for the config merger.
//!
//! The first snapshot goes out only once the initial list is complete, so the source is not
//! "seen" (and housekeeping kills nothing of it) before the API server has said what runs here.
//! A watch that ends, fails or is told its version is gone (410) lists again, with a backoff.
//! A request that never answers after a failure (an API server that hangs, or is stopped) is
//! given up, and the watch started again, once nothing came for 45 s.

use std::{collections::BTreeMap, future::Future, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Watches the pods bound to `node` until `cancel` or until `deliver` returns `false` (its
/// receiver is gone); each change hands `deliver` the whole set, by UID.
pub async fn watch_pods<F, Fut>(client: Client, node: &str, mut deliver: F, cancel: CancellationToken)
where
    F: FnMut(Vec<Pod>) -> Fut,
    Fut: Future<Output = bool>,
{
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let start = || watcher(api.clone(), config.clone()).default_backoff().boxed();
    let mut events = start();
    let (mut pods, mut listing) = (BTreeMap::new(), None::<BTreeMap<String, Pod>>);
    // Since the last failure, until a list completes.
    let mut recovering = false;
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            event = events.next() => event,
            () = tokio::time::sleep(HUNG_AFTER_FAILURE), if recovering => {
                warn!(node = %node, silent_for = ?HUNG_AFTER_FAILURE, "no answer to the watch of this node's pods since it failed; starting it again");
                events = start();
                continue;
            }
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
                recovering = false;
                true
            }
            Ok(watcher::Event::Apply(pod)) => {
                pods.insert(uid(&pod), pod);
                true
            }
            Ok(watcher::Event::Delete(pod)) => pods.remove(&uid(&pod)).is_some(),
            Err(err) => {
                warn!(node = %node, error = %err, "the watch of this node's pods failed; listing again");
                recovering = true;
                false
            }
        };
        if changed && !deliver(pods.values().cloned().collect()).await {
            return;
        }
    }
}

/// How long the pod watch may be silent after a failure before its request is taken for hung:
/// the longest wait between attempts (30 s, kube's and client-go's backoff) and 15 s for the list
/// itself. The client's own read timeout (295 s, to outlast a watch) is far longer.
const HUNG_AFTER_FAILURE: Duration = Duration::from_secs(45);
