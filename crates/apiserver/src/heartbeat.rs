//! The node's heartbeats to the API server (upstream `kubelet_node_status.go` and the node lease
//! controller): register the Node (or adopt the one there, or under `registerNode: false` read
//! the one others registered), then report its status every
//! `nodeStatusUpdateFrequency` when it changed or `nodeStatusReportFrequency` has passed, and
//! renew its lease every 10 s.

use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};
use kubelet_core::{
    clock::wall_now,
    events::{Event, EventRecorder, EventType, ObjectRef},
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tower::timeout::TimeoutLayer;
use tracing::{info, warn};

use crate::{
    Facts, Health,
    client_metrics::{AttemptMetricsLayer, RequestMetricsLayer, host_label},
    credentials::{NodeCredentials, ReloadingService},
    lease,
    ratelimit::TokenBucketLayer,
    registration,
    retry::RetryAfterLayer,
    set_status, should_report,
};

/// What went wrong talking to the API server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The kubeconfig could not be read or used.
    #[error("cannot use the kubeconfig {path}")]
    Kubeconfig {
        /// Its path.
        path: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A request failed.
    #[error("{what}")]
    Api {
        /// What was asked.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

/// How often the heartbeats go.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// `nodeStatusUpdateFrequency` (10 s): how often the status is computed.
    pub status_update: Duration,
    /// `nodeStatusReportFrequency` (5 min): how often an unchanged status is reported anyway.
    pub status_report: Duration,
    /// How often the lease is renewed (10 s).
    pub lease_renew: Duration,
    /// `nodeLeaseDurationSeconds` (40).
    pub lease_duration_seconds: i32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            status_update: Duration::from_secs(10),
            status_report: Duration::from_secs(300),
            lease_renew: lease::RENEW_INTERVAL,
            lease_duration_seconds: lease::DURATION_SECONDS,
        }
    }
}

impl Config {
    /// Sets the lease's duration (`nodeLeaseDurationSeconds`), renewed every quarter of it.
    #[must_use]
    pub fn lease_duration(mut self, seconds: i32) -> Self {
        self.lease_duration_seconds = seconds;
        self.lease_renew = lease::renew_interval(seconds);
        self
    }

    /// How long a heartbeat request may wait for its answer: the smaller of the status update
    /// period and the lease duration, as upstream's `heartbeatClient` timeout.
    pub fn heartbeat_timeout(&self) -> Duration {
        let lease = Duration::from_secs(u64::try_from(self.lease_duration_seconds).unwrap_or(0).max(1));
        self.status_update.min(lease)
    }

    /// Sets all three periods (tests use short ones).
    #[must_use]
    pub fn periods(mut self, status_update: Duration, status_report: Duration, lease_renew: Duration) -> Self {
        (self.status_update, self.status_report, self.lease_renew) = (status_update, status_report, lease_renew);
        self
    }
}

/// A client for the cluster the kubeconfig at `path` names (upstream's `--kubeconfig`), with
/// upstream's client-side limits (`kubeAPIQPS` 50, `kubeAPIBurst` 100).
pub async fn connect(path: &Path) -> Result<Client, Error> {
    connect_limited(path, 50.0, 100).await
}

/// [`connect`] with `qps` requests per second on average and bursts of `burst`
/// (`kubeAPIQPS`, `kubeAPIBurst`), through a token bucket as client-go's
/// ([`crate::ratelimit`]).
///
/// A request the server asks to have retried is retried as client-go does
/// ([`crate::retry`]); the retries do not take tokens of the bucket.
pub async fn connect_limited(path: &Path, qps: f64, burst: u32) -> Result<Client, Error> {
    let config = client_config(path).await?;
    let host = host_label(&config.cluster_url);
    let builder = kube::client::ClientBuilder::try_from(config).map_err(|e| kubeconfig_error(path, e.into()))?;
    Ok(limited(builder, &host, qps, burst))
}

/// The layers of a rate-limited client over `builder`'s service, from the outside in: each
/// request measured as a whole ([`RequestMetricsLayer`]), its token of the bucket, the retries
/// the server asks for, each attempt counted ([`AttemptMetricsLayer`]), and the limit on the
/// wait for an answer to start.
fn limited<S, B>(builder: ClientBuilder<S>, host: &Arc<str>, qps: f64, burst: u32) -> Client
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError> + Send + Sync,
    B: http_body::Body<Data = AnswerData> + Send + Unpin + 'static,
    B::Error: Into<tower::BoxError>,
{
    builder
        .with_layer(&TimeoutLayer::new(UNANSWERED_AFTER))
        .with_layer(&AttemptMetricsLayer::new(host.clone()))
        .with_layer(&RetryAfterLayer)
        .with_layer(&TokenBucketLayer::new(qps, burst, host.clone()))
        .with_layer(&RequestMetricsLayer::new(host.clone()))
        .build()
}

/// The layers of a heartbeat client: [`limited`]'s without the rate limit, and without the
/// limit on the wait for an answer (the transport's read timeout is the heartbeat's).
fn unlimited<S, B>(builder: ClientBuilder<S>, host: &Arc<str>) -> Client
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError> + Send + Sync,
    B: http_body::Body<Data = AnswerData> + Send + Unpin + 'static,
    B::Error: Into<tower::BoxError>,
{
    builder
        .with_layer(&AttemptMetricsLayer::new(host.clone()))
        .with_layer(&RetryAfterLayer)
        .with_layer(&RequestMetricsLayer::new(host.clone()))
        .build()
}

/// The chunks an answer's body comes in, as kube reads them.
type AnswerData = <kube::client::Body as http_body::Body>::Data;

/// How long a request of [`connect_limited`] and [`connect_node`] may wait for the start of its
/// answer (the status line and headers) before it is given up as unanswered, as by an API server
/// that hangs or is stopped; the caller then retries as after any failure.
///
/// Only the start is timed: a watch's answer starts at once and then streams for minutes. The
/// transport's read timeout (kube's 295 s) must outlast a quiet watch, and would hold a watch
/// retried into a hung server for that long. Upstream's clients notice a silent HTTP/2
/// connection within 45 s (a ping after 30 s of silence, then 15 s for its answer).
pub const UNANSWERED_AFTER: Duration = Duration::from_secs(30);

/// A client for the node's heartbeats, its status and lease, as upstream's `heartbeatClient`:
/// no client-side rate limit, so heartbeats never queue behind other requests, and each request
/// given up when no answer came within `timeout` ([`Config::heartbeat_timeout`]), so that one
/// lost with its connection never holds the next heartbeat back.
pub async fn connect_heartbeat(path: &Path, timeout: Duration) -> Result<Client, Error> {
    let mut config = client_config(path).await?;
    config.read_timeout = Some(timeout);
    let host = host_label(&config.cluster_url);
    let builder = kube::client::ClientBuilder::try_from(config).map_err(|e| kubeconfig_error(path, e.into()))?;
    Ok(unlimited(builder, &host))
}

/// [`connect_limited`] for the node's own credentials, read again after each
/// [`NodeCredentials::reload`] (a rotated client certificate) without a restart.
pub async fn connect_node(credentials: &NodeCredentials, qps: f64, burst: u32) -> Result<Client, Error> {
    let (service, namespace, host) = ReloadingService::new(credentials.clone(), None).await?;
    Ok(limited(ClientBuilder::new(service, namespace), &host, qps, burst))
}

/// [`connect_heartbeat`] for the node's own credentials, read again after each
/// [`NodeCredentials::reload`].
pub async fn connect_node_heartbeat(credentials: &NodeCredentials, timeout: Duration) -> Result<Client, Error> {
    let (service, namespace, host) = ReloadingService::new(credentials.clone(), Some(timeout)).await?;
    Ok(unlimited(ClientBuilder::new(service, namespace), &host))
}

/// The client configuration the kubeconfig at `path` holds, with kube's own retry off (the
/// clients retry as client-go does, [`crate::retry`]).
async fn client_config(path: &Path) -> Result<kube::Config, Error> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| kubeconfig_error(path, e.into()))?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| kubeconfig_error(path, e.into()))?;
    config.default_retry = false;
    Ok(config)
}

fn kubeconfig_error(path: &Path, source: Box<dyn std::error::Error + Send + Sync>) -> Error {
    Error::Kubeconfig { path: path.display().to_string(), source }
}

/// Registers the node: creates it, or adopts the Node already there (upstream
/// `tryRegisterWithAPIServer`), making sure it carries the kubelet's own labels.
///
/// A Node created here carries its status as `health` has it now, as upstream's `initialNode`
/// sets the status before the create: the Node has its capacity, addresses and conditions from
/// the start, not only once the first status report is answered. The status' events (the
/// conditions' first values) are recorded once the Node is created.
pub async fn register(
    client: &Client,
    facts: &Facts,
    health: &Health,
    recorder: &dyn EventRecorder,
) -> Result<Node, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut wanted = registration(facts);
    let events = set_status(&mut wanted, facts, health, wall_now());
    match nodes.create(&PostParams::default(), &wanted).await {
        Ok(node) => {
            info!(node = %facts.name, "registered the node");
            record_node_events(recorder, &facts.name, events);
            Ok(node)
        }
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            let existing = nodes.get(&facts.name).await.map_err(api("reading the existing node"))?;
            let Some(patch) = adoption_patch(&wanted, &existing) else {
                info!(node = %facts.name, "adopted the existing node");
                return Ok(existing);
            };
            let node = nodes
                .patch(&facts.name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
                .map_err(api("updating the existing node's labels and annotations"))?;
            info!(node = %facts.name, "adopted the existing node and set the kubelet's labels and annotations");
            Ok(node)
        }
        Err(source) => Err(Error::Api { what: "registering the node".into(), source }),
    }
}

/// What the kubelet puts back on a Node it adopts (upstream's `updateDefaultLabels` and
/// `reconcileCMADAnnotationWithExistingNode`): its own labels and its annotations where
/// `existing` says otherwise; `None` when it says what `wanted` says.
fn adoption_patch(wanted: &Node, existing: &Node) -> Option<serde_json::Value> {
    let (ours, theirs) = (&wanted.metadata, &existing.metadata);
    let labels = differing(ours.labels.as_ref(), theirs.labels.as_ref(), |key| crate::labels::KUBELET.contains(&key));
    let annotations = differing(ours.annotations.as_ref(), theirs.annotations.as_ref(), |_| true);
    if labels.is_empty() && annotations.is_empty() {
        return None;
    }
    Some(serde_json::json!({ "metadata": { "labels": labels, "annotations": annotations } }))
}

/// The entries of `ours` that `owned` names and `theirs` does not hold as they are.
fn differing(
    ours: Option<&BTreeMap<String, String>>,
    theirs: Option<&BTreeMap<String, String>>,
    owned: impl Fn(&str) -> bool,
) -> BTreeMap<String, String> {
    let held = |key: &String| theirs.and_then(|theirs| theirs.get(key));
    ours.into_iter()
        .flatten()
        .filter(|(key, value)| owned(key) && held(key) != Some(*value))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// The Node `name` someone else registered, for a kubelet that does not register its own
/// (`registerNode: false`): upstream reads it before each status update and reports on it as on
/// a Node it registered, labels untouched. A Node that is not there is an `Api` error whose
/// source is the API server's `NotFound`.
pub async fn existing_node(client: &Client, name: &str) -> Result<Node, Error> {
    Api::<Node>::all(client.clone()).get(name).await.map_err(api("reading the node others registered"))
}

fn api(what: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api { what: what.to_owned(), source }
}

/// Runs the status and lease heartbeats of the registered `node` until `cancel`: the status is
/// computed every `status_update` from `facts` and `health()`, and patched when it changed or
/// `status_report` has passed; the lease is created if need be and renewed every `lease_renew`.
/// A renewal that succeeds after one failed notifies `api_back`: the API server answers again,
/// and what waits on it (the pod source's watch) need not wait for its own backoff.
// Reason: each is a separate part of the heartbeats; a struct would only name them again.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    node: Node,
    facts: Facts,
    health: impl Fn() -> Health + Send + Sync + 'static,
    recorder: Arc<dyn EventRecorder>,
    config: Config,
    api_back: Arc<Notify>,
    cancel: CancellationToken,
) {
    let uid = node.metadata.uid.clone();
    let renewals = renew_lease(client.clone(), facts.name.clone(), uid, config.clone(), api_back, cancel.clone());
    let leases = tokio::spawn(renewals);
    report_status(client, node, facts, health, recorder, config, cancel).await;
    let _ = leases.await;
}

async fn report_status(
    client: Client,
    mut node: Node,
    facts: Facts,
    health: impl Fn() -> Health,
    recorder: Arc<dyn EventRecorder>,
    config: Config,
    cancel: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut reported = None;
    let mut last_report = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(config.status_update);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut next = node.clone();
        let had_addresses = node.status.as_ref().and_then(|s| s.addresses.as_ref()).is_some_and(|a| !a.is_empty());
        record_node_events(recorder.as_ref(), &facts.name, set_status(&mut next, &facts, &health(), wall_now()));
        let status = next.status.clone().unwrap_or_default();
        if reported.as_ref().is_some_and(|r| !should_report(r, &status, last_report.elapsed(), config.status_report)) {
            node = next;
            continue;
        }
        let patch = Patch::Strategic(serde_json::json!({ "status": status_to_send(&status, &facts, had_addresses) }));
        match nodes.patch_status(&facts.name, &PatchParams::default(), &patch).await {
            Ok(updated) => {
                node = updated;
                reported = Some(status);
                last_report = tokio::time::Instant::now();
            }
            Err(err) => warn!(node = %facts.name, error = %err, "cannot update the node's status; trying again"),
        }
    }
}

/// The status as patched: under an external cloud provider, without the addresses once the
/// Node had any before this status (`had_addresses`), which are its controller's to change (a
/// merge by type would put back ours).
fn status_to_send(
    status: &k8s_openapi::api::core::v1::NodeStatus,
    facts: &Facts,
    had_addresses: bool,
) -> serde_json::Value {
    let mut sent = serde_json::to_value(status).unwrap_or_default();
    if facts.external_cloud_provider
        && had_addresses
        && let Some(fields) = sent.as_object_mut()
    {
        fields.remove("addresses");
    }
    sent
}

/// Records the events of the node `name`'s status changes.
fn record_node_events(recorder: &dyn EventRecorder, name: &str, events: Vec<crate::NodeEvent>) {
    for event in events {
        let kind = if event.kind == "Warning" { EventType::Warning } else { EventType::Normal };
        recorder.record(Event::new(kind, event.reason, event.message, ObjectRef::other("Node", name)));
    }
}

async fn renew_lease(
    client: Client,
    node: String,
    uid: Option<String>,
    config: Config,
    api_back: Arc<Notify>,
    cancel: CancellationToken,
) {
    let leases: Api<Lease> = Api::namespaced(client, lease::NAMESPACE);
    let mut base: Option<Lease> = None;
    let mut failures = 0;
    let mut renewed_last_time = true;
    loop {
        let current = match base.take() {
            Some(lease) => Ok(lease),
            None => ensure_lease(&leases, &node, uid.as_deref(), config.lease_duration_seconds).await,
        };
        let wait = match current {
            Err(err) => {
                let wait = lease::backoff(failures);
                failures += 1;
                renewed_last_time = false;
                warn!(node = %node, error = %err, retry_in = ?wait, "cannot read or create the node lease");
                wait
            }
            Ok(current) => {
                failures = 0;
                base = update_lease(&leases, &node, uid.as_deref(), config.lease_duration_seconds, current).await;
                let renewed = base.is_some();
                if renewed && !renewed_last_time {
                    api_back.notify_one();
                }
                renewed_last_time = renewed;
                config.lease_renew
            }
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// The lease as it is now, created when missing.
async fn ensure_lease(leases: &Api<Lease>, node: &str, uid: Option<&str>, seconds: i32) -> Result<Lease, kube::Error> {
    if let Some(lease) = leases.get_opt(node).await? {
        return Ok(lease);
    }
    leases.create(&PostParams::default(), &lease::new_lease(node, uid, seconds, wall_now())).await
}

/// Renews `base`, retrying at once up to [`lease::MAX_UPDATE_RETRIES`] times (after a conflict,
/// from the lease as it is now); the renewed lease, the base of the next renewal, or `None` to
/// read it again next time.
async fn update_lease(
    leases: &Api<Lease>,
    node: &str,
    uid: Option<&str>,
    seconds: i32,
    mut base: Lease,
) -> Option<Lease> {
    for _ in 0..lease::MAX_UPDATE_RETRIES {
        match leases.replace(node, &PostParams::default(), &lease::renewed(&base, node, uid, seconds, wall_now())).await
        {
            Ok(renewed) => return Some(renewed),
            Err(kube::Error::Api(status)) if status.is_conflict() => {
                match ensure_lease(leases, node, uid, seconds).await {
                    Ok(now) => base = now,
                    Err(_) => return None,
                }
            }
            Err(err) => warn!(node = %node, error = %err, "cannot renew the node lease"),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn node(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Node {
        let map = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Node {
            metadata: ObjectMeta {
                labels: Some(map(labels)),
                annotations: Some(map(annotations)),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn an_external_cloud_providers_addresses_are_left_alone_once_the_node_has_some() {
        let address = k8s_openapi::api::core::v1::NodeAddress { type_: "Hostname".into(), address: "node-1".into() };
        let status = k8s_openapi::api::core::v1::NodeStatus { addresses: Some(vec![address]), ..Default::default() };
        let mut facts = crate::Facts::new("node-1", kubelet_core::runtime::Version::new("containerd", "1.6", "v1"));
        assert!(status_to_send(&status, &facts, true).get("addresses").is_some(), "no cloud provider");
        facts.external_cloud_provider = true;
        assert!(status_to_send(&status, &facts, false).get("addresses").is_some(), "the first addresses go");
        assert!(status_to_send(&status, &facts, true).get("addresses").is_none(), "then the controller's stay");
    }

    #[test]
    fn an_adopted_node_gets_back_the_kubelets_labels_and_annotations_and_keeps_the_rest() {
        let cmad = crate::labels::CONTROLLER_MANAGED_ATTACH;
        let wanted = node(&[("kubernetes.io/os", "linux"), ("role", "edge")], &[(cmad, "true")]);
        let existing = node(&[("kubernetes.io/os", "windows"), ("role", "core")], &[]);
        let patch = adoption_patch(&wanted, &existing).expect("a patch");
        assert_eq!(
            patch,
            serde_json::json!({"metadata": {"labels": {"kubernetes.io/os": "linux"}, "annotations": {cmad: "true"}}}),
            "an administrator's label is not the kubelet's to put back"
        );
        let adopted = node(&[("kubernetes.io/os", "linux"), ("role", "core")], &[(cmad, "true")]);
        assert_eq!(adoption_patch(&wanted, &adopted), None);
    }
}
