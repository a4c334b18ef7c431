//! Cluster mode (`--kubeconfig`): the glue between the agent and `kubelet-cluster`.
//!
//! The binary registers the Node and keeps its status and lease, watches the pods bound to it
//! as config source "api", sends pod statuses (static pods' to their mirror pods) and ends
//! graceful deletions through the status sink, and keeps a mirror pod for each static pod.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use anyhow::{Context, Result};
use config::SourceSender;
use k8s_openapi::api::core::v1::{Node, Pod, PodStatus};
use kube::Client;
use kubelet::{
    MirrorClient, StatusSink,
    admission::{ApiNode, NodeResources},
};
use kubelet_cluster::{
    Facts, Health, bootstrap, certificate,
    credentials::NodeCredentials,
    heartbeat,
    status::{self, Change, Report},
};
use kubelet_core::{
    ErrorChain, PodUid, Runtime, RuntimeState,
    events::{Event, EventRecorder, RingRecorder},
    eviction::NodePressure,
    hook::BoxFuture,
    runtime::{Image, Version},
    types::{is_static_pod, pod_full_name},
};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, info, info_span, warn};

use crate::settings::Settings;

/// How often statuses the API server does not have yet are sent again (upstream's 10 s).
const STATUS_RESYNC: Duration = Duration::from_secs(10);

/// How often the runtime's images are listed for the Node's status (upstream's image cache).
const IMAGE_LIST_PERIOD: Duration = Duration::from_secs(30);

/// What the Node's status reads of the agent: the runtime's health, the node's pressure
/// conditions and the runtime's images.
pub(crate) struct NodeState {
    pub(crate) runtime_state: Arc<RuntimeState>,
    pub(crate) pressure: Arc<NodePressure>,
    /// The node's labels and taints as the API server has its Node, for admission.
    pub(crate) api_node: Arc<ApiNode>,
    pub(crate) images: Arc<Mutex<Vec<Image>>>,
}

/// Lists the runtime's images into `images` every [`IMAGE_LIST_PERIOD`] until `cancel`.
pub(crate) async fn list_images<R: Runtime>(
    runtime: Arc<R>,
    images: Arc<Mutex<Vec<Image>>>,
    cancel: CancellationToken,
) {
    let mut ticks = tokio::time::interval(IMAGE_LIST_PERIOD);
    while cancel.run_until_cancelled(ticks.tick()).await.is_some() {
        match runtime.list_images().await {
            // The list is replaced whole: a poisoned lock's list is whole too.
            Ok(listed) => *images.lock().unwrap_or_else(PoisonError::into_inner) = listed,
            Err(err) => warn!(error = %ErrorChain(&err), "cannot list the runtime's images for the node's status"),
        }
    }
}

/// The clients of cluster mode, as upstream's `KubeClient` and `EventClient`.
pub(crate) struct Clients {
    /// Everything but events and heartbeats, held to `kubeAPIQPS` and `kubeAPIBurst`.
    pub(crate) api: Client,
    /// Events, held to a budget of their own (`eventRecordQPS`, `eventBurst`), so that a burst
    /// of them (four for each pod started) never holds back pod statuses, nor they events.
    pub(crate) events: Client,
    /// The credentials both read (rotated with `rotateCertificates`, see [`spawn`]).
    pub(crate) credentials: NodeCredentials,
}

/// The clients for the cluster of `--kubeconfig`, whose client certificate is first asked for
/// with `--bootstrap-kubeconfig` when given and needed ([`bootstrap::load_client_cert`]).
pub(crate) async fn connect(settings: &Settings) -> Result<Clients> {
    let Some(path) = &settings.kubeconfig else { anyhow::bail!("cluster mode without --kubeconfig") };
    if let Some(bootstrap) = &settings.bootstrap_kubeconfig {
        bootstrap::load_client_cert(path, bootstrap, &settings.cert_dir, &settings.node_name)
            .await
            .context("TLS bootstrap with --bootstrap-kubeconfig failed")?;
    }
    let file = &settings.file;
    let credentials = if file.rotate_certificates {
        NodeCredentials::rotated(path, &certificate::CLIENT.current_file(&settings.cert_dir))
    } else {
        NodeCredentials::new(path)
    };
    let cannot_join = || {
        format!(
            "cannot join the cluster with --kubeconfig {}: it must exist and hold the node's credentials, or \
             --bootstrap-kubeconfig must give credentials to ask for them with",
            path.display()
        )
    };
    let api = heartbeat::connect_node(&credentials, file.kube_api_qps, file.kube_api_burst)
        .await
        .with_context(cannot_join)?;
    let events = heartbeat::connect_node(&credentials, file.event_record_qps, file.event_burst)
        .await
        .with_context(cannot_join)?;
    Ok(Clients { api, events, credentials })
}

/// What the node says of itself when it registers.
pub(crate) fn facts(settings: &Settings, runtime: Version) -> Facts {
    let file = &settings.file;
    let mut facts = Facts::new(&settings.node_name, runtime).read_host(&settings.root_dir);
    facts.ip = settings.node_ip.parse().ok();
    facts.secondary_ip = settings.secondary_node_ip;
    facts.provider_id.clone_from(&file.provider_id);
    if !file.local_storage_capacity_isolation {
        // No ephemeral-storage capacity or allocatable, as upstream's without the isolation.
        facts.ephemeral_storage_bytes = None;
    }
    facts.external_cloud_provider = settings.external_cloud_provider;
    if settings.external_cloud_provider && !settings.node_ip_given {
        // The cloud's controller gives the addresses; a found IP is nobody's to announce.
        facts.ip = None;
    }
    facts.labels.clone_from(&settings.node_labels);
    facts.taints.clone_from(&file.register_with_taints);
    let node = NodeResources::of_this_node();
    facts.cpu_milli = node.cpu_milli;
    facts.memory_bytes = node.memory_bytes;
    facts.hugepages = node.hugepages;
    facts.max_pods = file.max_pods;
    facts.max_images = file.node_status_max_images;
    facts.reserved = file.reserved();
    facts.eviction = file.eviction_thresholds().unwrap_or_default();
    facts.kubelet_version = crate::kubelet_version();
    facts.kubelet_port = settings.kubelet_api.map(|address| address.port());
    facts
}

/// Where the kubelet's statuses go: the API pod statuses, static pods' to their mirrors.
struct ApiStatuses(mpsc::UnboundedSender<Report>);

impl StatusSink for ApiStatuses {
    fn status_changed(&self, pod: &Pod, status: &PodStatus, _version: u64) {
        let change =
            if is_static_pod(pod) { Change::of_static(pod, status.clone()) } else { Change::new(pod, status.clone()) };
        let _ = self.0.send(Report::Status(change));
    }

    fn pod_terminated(&self, pod: &Pod) {
        if !is_static_pod(pod) {
            let _ = self.0.send(Report::Terminated(PodUid::of(pod).as_str().to_owned()));
        }
    }

    fn pod_removed(&self, uid: &PodUid) {
        let _ = self.0.send(Report::Removed(uid.as_str().to_owned()));
    }
}

/// Hands the agent's events to the API sender, dropping them when it is that far behind (as
/// upstream's broadcaster does).
struct ApiEvents(mpsc::Sender<Event>);

impl EventRecorder for ApiEvents {
    fn record(&self, event: Event) {
        let _ = self.0.try_send(event);
    }
}

/// Mirror pods in the API server.
pub(crate) struct ApiMirrors {
    client: Client,
    node: String,
}

impl ApiMirrors {
    pub(crate) fn new(client: Client, node: &str) -> Self {
        ApiMirrors { client, node: node.to_owned() }
    }
}

impl MirrorClient for ApiMirrors {
    fn create_mirror_pod<'a>(&'a self, pod: &'a Pod) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            kubelet_cluster::mirror::create(&self.client, pod, &self.node).await.map_err(|e| e.to_string())?;
            info!(pod = %pod_full_name(pod), "created the mirror pod");
            Ok(())
        })
    }

    fn delete_mirror_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(async move {
            kubelet_cluster::mirror::delete(&self.client, namespace, name, uid).await.map_err(|e| e.to_string())
        })
    }
}

/// Watches the Node `node` on `tracker` until `cancel`, keeping `api_node` to its labels and
/// taints; the receiver turns true once the Node's first list is in.
fn follow_node(
    tracker: &TaskTracker,
    client: Client,
    node: String,
    api_node: Arc<ApiNode>,
    cancel: &CancellationToken,
) -> watch::Receiver<bool> {
    let (node_listed, listed) = watch::channel(false);
    let follow = move |found: Option<&Node>| match found {
        Some(found) => {
            let labels = found.metadata.labels.clone().unwrap_or_default();
            api_node.set(labels, found.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default());
        }
        None => api_node.forget(),
    };
    let watch = kubelet_cluster::node_watch::watch_node(client, node, follow, node_listed, cancel.child_token());
    tracker.spawn(watch.instrument(info_span!("node_watch")));
    listed
}

/// Why cluster mode ended the agent, when it did (an expired client certificate it cannot
/// renew): set once, before it cancels the agent, and returned as the agent's error.
pub(crate) type Fatal = Arc<std::sync::OnceLock<String>>;

/// Everything cluster mode runs beside the agent, on `tracker` until `cancel`: the Node's
/// registration (under `registerNode: false`, waiting for others to register it) and
/// heartbeats, the API pod source feeding `source`, the pod status sink, and
/// the agent's events (from `recorder`) sent to the API server. Under `rotateCertificates`, a
/// client certificate that expires unrenewed while the API server answers sets `fatal` and
/// cancels `cancel`, as upstream exits then.
#[allow(clippy::too_many_arguments)] // Reason: one call site, each part named.
pub(crate) fn spawn(
    fatal: &Fatal,
    tracker: &TaskTracker,
    clients: Clients,
    facts: Facts,
    settings: &Settings,
    statuses: &kubelet::StatusStore,
    node_state: NodeState,
    source: SourceSender,
    recorder: &Arc<RingRecorder>,
    cancel: &CancellationToken,
) {
    let Clients { api: client, events: event_client, credentials } = clients;
    let (events, pending) = mpsc::channel(kubelet_cluster::events::QUEUE);
    recorder.forward_to(Arc::new(ApiEvents(events)));
    tracker.spawn(
        kubelet_cluster::events::send(event_client, settings.node_name.clone(), pending, cancel.child_token())
            .instrument(info_span!("event_sink")),
    );
    let recorder: Arc<dyn EventRecorder> = recorder.clone();
    let (reports, received) = mpsc::unbounded_channel();
    statuses.add_sink(Arc::new(ApiStatuses(reports.clone())));
    tracker.spawn(
        status::report(client.clone(), received, STATUS_RESYNC, status::SENDS_IN_FLIGHT, cancel.child_token())
            .instrument(info_span!("pod_status_sink")),
    );
    let node = settings.node_name.clone();
    // Pods are admitted against the Node's labels and taints, so they are watched only once the
    // Node has been listed, as upstream's API source waits for its node informer.
    let mut listed = follow_node(tracker, client.clone(), node.clone(), node_state.api_node.clone(), cancel);
    // The heartbeats tell the pod source when the API server answers again after an outage.
    let api_back = Arc::new(Notify::new());
    tracker.spawn({
        let (client, api_back, cancel) = (client.clone(), api_back.clone(), cancel.child_token());
        async move {
            if cancel.run_until_cancelled(listed.wait_for(|listed| *listed)).await.is_none() {
                return;
            }
            let deliver = move |pods: Vec<Arc<Pod>>| {
                let _ = reports.send(Report::bound(&pods));
                let source = source.clone();
                async move { source.set(pods).await.is_ok() }
            };
            kubelet_cluster::source::watch_pods(client, &node, deliver, api_back, cancel).await;
        }
        .instrument(info_span!("api_source"))
    });
    let file = &settings.file;
    let register_node = file.register_node;
    if !register_node {
        info!("registerNode is false: the node reports its status and lease on the Node others register");
    }
    let lease = kubelet_cluster::lease::renew_interval(file.node_lease_duration_seconds);
    let config = heartbeat::Config::default()
        .periods(file.node_status_update_frequency, file.node_status_report_frequency, lease)
        .lease_duration(file.node_lease_duration_seconds);
    let agent_cancel = cancel.clone();
    let cancel = cancel.child_token();
    if file.rotate_certificates {
        let rotation = bootstrap::rotate_client_certificate(
            client.clone(),
            credentials.clone(),
            settings.cert_dir.clone(),
            settings.node_name.clone(),
            cancel.child_token(),
        );
        tracker.spawn(rotation.instrument(info_span!("certificate_rotation")));
        let (client, credentials, fatal, child) =
            (client.clone(), credentials.clone(), fatal.clone(), cancel.child_token());
        let expiry = async move {
            if let Some(why) = bootstrap::wait_for_unrenewable_expiry(client, credentials, child).await {
                let _ = fatal.set(why);
                agent_cancel.cancel();
            }
        };
        tracker.spawn(expiry.instrument(info_span!("certificate_expiry")));
    }
    tracker.spawn(
        async move {
            let heartbeats = match heartbeat::connect_node_heartbeat(&credentials, config.heartbeat_timeout()).await {
                Ok(heartbeats) => heartbeats,
                Err(err) => {
                    warn!(error = %kubelet_core::ErrorChain(&err), "cannot make the heartbeat client; the node's status and lease go through the main client");
                    client.clone()
                }
            };
            let health = move || {
                let mut health = Health::default();
                health.runtime_errors = node_state.runtime_state.runtime_errors();
                health.network_errors = node_state.runtime_state.network_errors();
                health.pressure = node_state.pressure.conditions();
                health.images = node_state.images.lock().unwrap_or_else(PoisonError::into_inner).clone();
                health
            };
            let mut failures = 0;
            let node = loop {
                let found = if register_node {
                    heartbeat::register(&client, &facts, &health(), recorder.as_ref()).await
                } else {
                    heartbeat::existing_node(&client, &facts.name).await
                };
                match found {
                    Ok(node) => break node,
                    Err(err) => {
                        let wait = kubelet_cluster::lease::backoff(failures);
                        failures += 1;
                        let error = kubelet_core::ErrorChain(&err).to_string();
                        if register_node {
                            warn!(node = %facts.name, %error, retry_in = ?wait, "unable to register the node with the API server");
                        } else {
                            warn!(node = %facts.name, %error, retry_in = ?wait, "registerNode is false and the node is not readable yet; its status and lease wait for it");
                        }
                        tokio::select! {
                            () = cancel.cancelled() => return,
                            () = tokio::time::sleep(wait) => {}
                        }
                    }
                }
            };
            heartbeat::run(heartbeats, node, facts, health, recorder, config, api_back, cancel).await;
        }
        .instrument(info_span!("node_status")),
    );
}
