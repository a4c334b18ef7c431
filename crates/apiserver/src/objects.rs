//! The content of API-backed volumes from the API server (upstream's watch-based config map
//! and secret managers, and its token manager): [`ApiObjects`] implements
//! `kubelet_core::volume::ObjectSource`.
//!
//! Each config map and secret a pod uses is watched (a watch of its name alone, as the node
//! authorizer allows) from the first read on, and reads answer from what the watch last said,
//! so an idle node asks the API server nothing. A change reaches the files at the pod's next
//! sync; with [`ApiObjects::sync_users_on_change`] the watch queues every pod that uses the
//! object for a sync now (`WorkQueue::enqueue_now`, which wakes the sync loop), so the files
//! follow at once rather than at the periodic resync (upstream waits for that: a minute or more). A watch stops once no running pod
//! uses its object. Tokens come from the TokenRequest API, bound
//! to the pod, and are kept until 80% of their lifetime has passed (upstream's refresh point);
//! the cache drops every token due, so it holds no more than the tokens of the last lifetime.
//!
//! Services are watched all at once from the first read on (upstream's service informer), for
//! the service variables of containers; runtime classes likewise from the first lookup on
//! (upstream's runtime class manager), for the handler a pod's sandbox runs with. Each watch
//! lasts as long as the source.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt::Debug,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{Instrument, info_span, warn};

use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount},
    node::v1::RuntimeClass,
};
use kube::{Api, Client, api::PostParams};
use kubelet_core::{
    PodUid, WorkQueue,
    hook::BoxFuture,
    volume::{ObjectData, ObjectSource},
};
use tokio::time::Instant;

/// A token kept: the JWT and when it should be replaced.
#[derive(Debug)]
struct Token {
    jwt: String,
    refresh_at: Instant,
}

/// What an object holds: its text keys (a config map's `data`; a secret's are all bytes) and its
/// binary ones (a config map's `binaryData`).
#[derive(Clone, Debug, Default, PartialEq)]
struct Contents {
    text: BTreeMap<String, String>,
    bytes: ObjectData,
}

impl Contents {
    /// Every key, as volumes hold them.
    fn all(self) -> ObjectData {
        let text = self.text.into_iter().map(|(k, v)| (k, v.into_bytes()));
        text.chain(self.bytes).collect()
    }
}

/// What a watch of one object last said: nothing yet, then the object (`None`: it does not exist).
type Latest = Option<Option<Contents>>;

/// A watched object: the latest word of its watch, the pods that use it, and its watch's stop.
struct Watched {
    latest: watch::Receiver<Latest>,
    users: HashSet<PodUid>,
    stop: CancellationToken,
}

/// Watched objects by resource (`configmaps`, `secrets`), namespace and name.
type WatchedObjects = Mutex<HashMap<(&'static str, String, String), Watched>>;

/// How long a first read waits for its watch's initial list.
const FIRST_LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// Every object of a kind, as a cluster-wide watch keeps them, and whether it has listed them
/// once (services, runtime classes).
///
/// The readiness is the watch's own: the store's `wait_until_ready` keeps the waker of only the
/// last task that polled it, so of the pods that start together and wait for the first list,
/// all but one slept until their timeout.
struct WatchedKind<K: kube::Resource<DynamicType = ()> + 'static> {
    store: reflector::Store<K>,
    listed: watch::Receiver<bool>,
}

impl<K> WatchedKind<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Starts the watch of every `K` through `client` on `tracker`, until `stop`; `kind` names
    /// them in its span and warnings.
    fn start(client: Client, kind: &'static str, tracker: &TaskTracker, stop: CancellationToken) -> Self {
        let (store, writer) = reflector::store();
        let (listed_tx, listed) = watch::channel(false);
        let api: Api<K> = Api::all(client);
        let events = reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
        let watch = async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = stop.run_until_cancelled(events.next()).await.flatten() {
                match event {
                    // The reflector has stored the list before it passes this on.
                    Ok(watcher::Event::InitDone) => _ = listed_tx.send_replace(true),
                    Ok(_) => {}
                    Err(err) => warn!(kind, error = %err, "a watch failed; listing again"),
                }
            }
        };
        tracker.spawn(watch.instrument(info_span!("kind_watch", kind)));
        WatchedKind { store, listed }
    }

    /// Every object, once the watch has listed them; `kind` names them in the error.
    async fn all(&self, kind: &str) -> Result<Vec<Arc<K>>, String> {
        let mut listed = self.listed.clone();
        match tokio::time::timeout(FIRST_LIST_TIMEOUT, listed.wait_for(|listed| *listed)).await {
            Ok(Ok(_)) => Ok(self.store.state()),
            Ok(Err(_)) => Err(format!("the watch of {kind} has stopped")),
            Err(_) => Err(format!("timed out listing the {kind}")),
        }
    }
}

/// Config maps, secrets and service account tokens from the API server.
pub struct ApiObjects {
    client: Client,
    /// Tokens by pod UID, audience and lifetime.
    tokens: Mutex<HashMap<(String, String, i64), Token>>,
    watched: Arc<WatchedObjects>,
    /// Where the pods that use a changed object are queued for a sync, once set.
    sync_queue: Arc<OnceLock<Arc<WorkQueue>>>,
    /// Every service of the cluster, from the watch the first read starts.
    services: OnceLock<WatchedKind<Service>>,
    /// Every runtime class of the cluster, from the watch the first lookup starts.
    runtime_classes: OnceLock<WatchedKind<RuntimeClass>>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl std::fmt::Debug for ApiObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiObjects").finish_non_exhaustive()
    }
}

impl ApiObjects {
    /// Objects read through `client`; the watches run on `tracker` until `cancel`.
    pub fn new(client: Client, tracker: TaskTracker, cancel: CancellationToken) -> Self {
        ApiObjects {
            client,
            tokens: Mutex::default(),
            watched: Arc::default(),
            sync_queue: Arc::default(),
            services: OnceLock::new(),
            runtime_classes: OnceLock::new(),
            tracker,
            cancel,
        }
    }

    /// From now on, a change a watch reports queues every pod that uses the object on `queue`
    /// with no delay, so its volumes are written again at the sync loop's next tick. Set once;
    /// later calls change nothing.
    pub fn sync_users_on_change(&self, queue: Arc<WorkQueue>) {
        _ = self.sync_queue.set(queue);
    }

    fn watched(&self) -> std::sync::MutexGuard<'_, HashMap<(&'static str, String, String), Watched>> {
        lock_watched(&self.watched)
    }

    /// The object `name` of `resource` in `pod`'s namespace, from its watch (started now when
    /// no pod used it yet), once the watch has listed it.
    async fn read<K>(
        &self,
        resource: &'static str,
        pod: &Pod,
        name: &str,
        data: fn(K) -> Contents,
    ) -> Result<Option<Contents>, String>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + 'static,
    {
        let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let mut latest = {
            let mut watched = self.watched();
            let key = (resource, namespace.clone(), name.to_owned());
            let entry = watched.entry(key.clone()).or_insert_with(|| {
                let (tx, rx) = watch::channel(None);
                let stop = self.cancel.child_token();
                let api: Api<K> = Api::namespaced(self.client.clone(), &namespace);
                let span = info_span!("object_watch", resource, namespace = %namespace, name = %name);
                let changed = self.users_syncer(key);
                let watch = watch_object(api, name.to_owned(), tx, data, changed, stop.clone());
                self.tracker.spawn(watch.instrument(span));
                Watched { latest: rx, users: HashSet::new(), stop }
            });
            entry.users.insert(PodUid::of(pod));
            entry.latest.clone()
        };
        let listed = tokio::time::timeout(FIRST_LIST_TIMEOUT, latest.wait_for(Option::is_some)).await;
        match listed {
            Ok(Ok(value)) => Ok(value.clone().flatten()),
            Ok(Err(_)) => Err(format!("the watch of {resource} {namespace}/{name} has stopped")),
            Err(_) => Err(format!("timed out listing {resource} {namespace}/{name}")),
        }
    }

    /// What a watch calls when its object changes: queue the pods that use the object `key`
    /// names for a sync, if [`ApiObjects::sync_users_on_change`] was called.
    fn users_syncer(&self, key: (&'static str, String, String)) -> impl Fn() + Send + 'static {
        let (watched, sync_queue) = (self.watched.clone(), self.sync_queue.clone());
        move || {
            let Some(queue) = sync_queue.get() else { return };
            if let Some(object) = lock_watched(&watched).get(&key) {
                for uid in &object.users {
                    queue.enqueue_now(uid.clone());
                }
            }
        }
    }

    /// The services, their watch started on the first call.
    fn services_watched(&self) -> &WatchedKind<Service> {
        self.services
            .get_or_init(|| WatchedKind::start(self.client.clone(), "services", &self.tracker, self.cancel.clone()))
    }

    /// The runtime classes, their watch started on the first call (upstream's runtime class
    /// manager's informer).
    fn runtime_classes_watched(&self) -> &WatchedKind<RuntimeClass> {
        self.runtime_classes.get_or_init(|| {
            WatchedKind::start(self.client.clone(), "runtime classes", &self.tracker, self.cancel.clone())
        })
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String, i64), Token>> {
        // Each critical section inserts, reads or removes whole entries: a poisoned map is whole.
        self.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn lock_watched(
    watched: &WatchedObjects,
) -> std::sync::MutexGuard<'_, HashMap<(&'static str, String, String), Watched>> {
    // Each critical section inserts, reads or removes whole entries: a poisoned map is whole.
    watched.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn config_map_data(cm: ConfigMap) -> Contents {
    let bytes = cm.binary_data.into_iter().flatten().map(|(k, v)| (k, v.0)).collect();
    Contents { text: cm.data.unwrap_or_default(), bytes }
}

fn secret_data(secret: Secret) -> Contents {
    Contents { text: BTreeMap::new(), bytes: secret.data.into_iter().flatten().map(|(k, v)| (k, v.0)).collect() }
}

/// Watches object `name` through `api` until `stop`, telling `latest` what it is now, and
/// `changed` when that differs from what the watch said before (not on its first list, nor on a
/// list again after a broken watch that finds the object as it was).
async fn watch_object<K>(
    api: Api<K>,
    name: String,
    latest: watch::Sender<Latest>,
    data: fn(K) -> Contents,
    changed: impl Fn(),
    stop: CancellationToken,
) where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut listing: Option<Contents> = None;
    let tell = |now: Option<Contents>| {
        let mut was_known = false;
        let differs = latest.send_if_modified(|said| {
            was_known = said.is_some();
            let differs = said.as_ref() != Some(&now);
            *said = Some(now);
            differs
        });
        if differs && was_known {
            changed();
        }
    };
    while let Some(event) = stop.run_until_cancelled(events.next()).await.flatten() {
        match event {
            Ok(watcher::Event::Init) => listing = None,
            Ok(watcher::Event::InitApply(object)) => listing = Some(data(object)),
            Ok(watcher::Event::InitDone) => tell(listing.take()),
            Ok(watcher::Event::Apply(object)) => tell(Some(data(object))),
            Ok(watcher::Event::Delete(_)) => tell(None),
            Err(err) => warn!(object = %name, error = %err, "the watch of an object failed; listing again"),
        }
    }
}

impl ObjectSource for ApiObjects {
    fn config_map<'a>(&'a self, pod: &'a Pod, name: &'a str) -> BoxFuture<'a, Result<Option<ObjectData>, String>> {
        Box::pin(async move {
            let read = self.read::<ConfigMap>("configmaps", pod, name, config_map_data).await?;
            Ok(read.map(Contents::all))
        })
    }

    fn config_map_text<'a>(
        &'a self,
        pod: &'a Pod,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<BTreeMap<String, String>>, String>> {
        Box::pin(async move {
            let read = self.read::<ConfigMap>("configmaps", pod, name, config_map_data).await?;
            Ok(read.map(|contents| contents.text))
        })
    }

    fn secret<'a>(&'a self, pod: &'a Pod, name: &'a str) -> BoxFuture<'a, Result<Option<ObjectData>, String>> {
        Box::pin(async move {
            let read = self.read::<Secret>("secrets", pod, name, secret_data).await?;
            Ok(read.map(Contents::all))
        })
    }

    fn services<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Option<Vec<Service>>, String>> {
        Box::pin(async move {
            let services = self.services_watched().all("services").await?;
            let wanted = |service: &Service| {
                let (ns, name) = (service.metadata.namespace.as_deref(), service.metadata.name.as_deref());
                ns == Some(namespace) || (ns == Some("default") && name == Some("kubernetes"))
            };
            Ok(Some(services.iter().filter(|s| wanted(s)).map(|s| Service::clone(s)).collect()))
        })
    }

    fn runtime_handler<'a>(&'a self, class: &'a str) -> BoxFuture<'a, Result<Option<String>, String>> {
        Box::pin(async move {
            let classes = self.runtime_classes_watched().all("runtime classes").await;
            let classes = classes.map_err(|err| format!("failed to lookup RuntimeClass {class}: {err}"))?;
            match classes.iter().find(|c| c.metadata.name.as_deref() == Some(class)) {
                Some(found) => Ok(Some(found.handler.clone())),
                // The API's NotFound, as upstream's lister words it.
                None => Err(format!("runtimeclass.node.k8s.io {class:?} not found")),
            }
        })
    }

    fn release(&self, uid: &PodUid) {
        self.watched().retain(|_, watched| {
            watched.users.remove(uid);
            let used = !watched.users.is_empty();
            if !used {
                watched.stop.cancel();
            }
            used
        });
    }

    fn service_account_token<'a>(
        &'a self,
        pod: &'a Pod,
        audience: Option<&'a str>,
        expiration_seconds: i64,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let key = (uid.clone(), audience.unwrap_or_default().to_owned(), expiration_seconds);
            if let Some(token) = self.tokens().get(&key).filter(|t| Instant::now() < t.refresh_at) {
                return Ok(token.jwt.clone());
            }
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            let account = pod.spec.as_ref().and_then(|s| s.service_account_name.as_deref()).unwrap_or("default");
            let request = TokenRequest {
                spec: Some(TokenRequestSpec {
                    audiences: audience.map(|a| vec![a.to_owned()]),
                    expiration_seconds: Some(expiration_seconds),
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".to_owned()),
                        kind: Some("Pod".to_owned()),
                        name: pod.metadata.name.clone(),
                        uid: Some(uid),
                    }),
                }),
                ..TokenRequest::default()
            };
            let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
            let response = api
                .create_token_request(account, &PostParams::default(), &request)
                .await
                .map_err(|e| format!("cannot get a token of service account {namespace}/{account}: {e}"))?;
            let jwt = response
                .status
                .and_then(|s| s.token)
                .filter(|t| !t.is_empty())
                .ok_or("the API server sent no token")?;
            let lifetime = Duration::from_secs(u64::try_from(expiration_seconds).unwrap_or(3600));
            let refresh_at = Instant::now() + lifetime.mul_f64(0.8);
            let mut tokens = self.tokens();
            // Tokens due for refresh go (a gone pod's among them), so the cache stays small.
            tokens.retain(|_, t| Instant::now() < t.refresh_at);
            tokens.insert(key, Token { jwt: jwt.clone(), refresh_at });
            Ok(jwt)
        })
    }
}
