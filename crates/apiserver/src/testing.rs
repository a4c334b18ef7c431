//! An in-process API server for tests (feature `test-util`), written here: plain HTTP on
//! 127.0.0.1, the wire protocol of the resources cluster mode uses so far.
//!
//! - Nodes: create (409 `AlreadyExists` when present), get (404 `NotFound`), and patches of the
//!   Node and its `status`, conditions merged by `type` as the API server does.
//! - Leases: get, create, and replace with optimistic concurrency (409 `Conflict` when the
//!   `resourceVersion` sent is not the current one).
//! - Pods: create (`generateName` too), get, delete (grace 0 at once, otherwise a
//!   `deletionTimestamp`; a UID precondition is checked), patches of `status` (a UID in the patch
//!   is a precondition), list and watch (`fieldSelector`, `resourceVersion`, `timeoutSeconds`,
//!   `allowWatchBookmarks`), with the events tests make ([`ApiServer::put_pod`],
//!   [`ApiServer::delete_pod`]); after [`ApiServer::compact`] a watch from an older version gets
//!   the API server's 410 `Expired`.
//!
//! - Events: create and patches.
//! - Config maps and secrets: get ([`ApiServer::put_config_map`], [`ApiServer::put_secret`]);
//!   service accounts' TokenRequests (a pod must be the bound object).
//!
//! Every object gets a UID and a `resourceVersion` from one counter; every request is counted.
//!
//! Where a client can speak the protocol wrongly, the server answers as the API server does:
//! a patch is applied by its `Content-Type` (`application/strategic-merge-patch+json`: lists
//! with a merge key merge by it; `application/merge-patch+json`, RFC 7386: every list is
//! replaced; anything else is 415 `UnsupportedMediaType`), and a field selector on a field the
//! resource cannot be selected by is 400 `BadRequest` (`field label not supported: ...`), never
//! ignored. A watch that asked for bookmarks gets a `BOOKMARK` with the current
//! `resourceVersion` whenever it has been idle for [`WATCH_POLL`] while the version moved on (the
//! API server sends one about every minute), so a client that keeps bookmarks resumes after a
//! compaction without listing again, and one that ignores them lists again.
//!
//! It can also be away, as a real API server can: [`ApiServer::refuse_connections`] closes every
//! connection and refuses new ones until [`ApiServer::accept_connections`], and
//! [`ApiServer::set_fault`] answers every request 500, 503 or 429 with `Retry-After`, or never
//! answers it, until the fault is cleared.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path as UrlPath, State},
    http::{HeaderMap, StatusCode, header::CONTENT_TYPE},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde_json::{Value, json};

/// How long a watch waits between looks at the event log when nothing wakes it (a wake-up sent
/// between its look and its wait is not kept, so it looks again after this at the latest); a
/// watch idle this long is sent a bookmark when it asked for them and the version moved on.
pub const WATCH_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// What the server holds.
#[derive(Debug, Default)]
pub struct Objects {
    /// What makes this server's UIDs its own (`<pid>-<n>`): a pod a test left in the runtime
    /// never shares a UID with one of a later server, as no two pods of a real cluster do.
    pub uid_prefix: String,
    /// Nodes by name.
    pub nodes: BTreeMap<String, Value>,
    /// Leases by `namespace/name`.
    pub leases: BTreeMap<String, Value>,
    /// The last resource version given out.
    pub version: u64,
    /// Requests by `METHOD kind`, e.g. `PATCH nodes/status`.
    pub requests: BTreeMap<String, u32>,
    /// Pods by `namespace/name`.
    pub pods: BTreeMap<String, Value>,
    /// Watch events (`ADDED`, `MODIFIED`, `DELETED`) with their versions and resources
    /// (`pods`, `configmaps`, `secrets`, `services`), oldest first.
    pub watch_events: Vec<(u64, &'static str, &'static str, Value)>,
    /// Watches from versions up to this one are gone (410).
    pub compacted: u64,
    /// Wakes the watches when a pod event is added.
    pub changed: Arc<tokio::sync::Notify>,
    /// Bumped to end every open watch (as an API server restart does).
    pub watch_generation: u64,
    /// Events by `namespace/name`.
    pub events: BTreeMap<String, Value>,
    /// Config maps, secrets and services by `resource/namespace/name`.
    pub objects: BTreeMap<String, Value>,
    /// The TokenRequests served, as `namespace/serviceaccount` with the bound pod's name.
    pub token_requests: Vec<(String, String)>,
    /// Pod status fields this server does not store, dropped from every status patch, as an API
    /// server older than the field drops it (`hostIPs` before v1.28).
    pub unknown_status_fields: Vec<&'static str>,
    /// Pods (`namespace/name`) whose status patches are read and left unanswered until
    /// released ([`ApiServer::hold_status_patches`]).
    pub held_status_patches: BTreeSet<String>,
}

impl Objects {
    fn stamp(&mut self, object: &mut Value, new: bool) {
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        if new {
            object["metadata"]["uid"] = json!(format!("uid-{}-{}", self.uid_prefix, self.version));
            object["metadata"]["creationTimestamp"] = json!("2026-11-24T00:00:00Z");
        }
    }

    /// Stamps `pod` (a new UID when `kind` is `ADDED`), stores it under `key` (removes it for
    /// `DELETED`) and adds its watch event; the pod as stored.
    fn commit(&mut self, key: String, mut pod: Value, kind: &'static str) -> Value {
        self.stamp(&mut pod, kind == "ADDED");
        let version = self.version;
        if kind == "DELETED" {
            self.pods.remove(&key);
        } else {
            self.pods.insert(key, pod.clone());
        }
        self.watch_events.push((version, "pods", kind, pod.clone()));
        pod
    }

    fn count(&mut self, request: &str) {
        *self.requests.entry(request.to_owned()).or_default() += 1;
    }
}

/// A running test API server.
#[derive(Debug)]
pub struct ApiServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it holds; tests read and change it.
    pub objects: Arc<Mutex<Objects>>,
    router: Router,
    /// The task that accepts connections and serves them; aborting it closes them all.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    faults: tokio::sync::watch::Sender<Option<Fault>>,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(task) = lock_task(&self.task).take() {
            task.abort();
        }
    }
}

/// How the server answers every request while it has a fault ([`ApiServer::set_fault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// 500 `InternalError`.
    InternalError,
    /// 503 `ServiceUnavailable`.
    Unavailable,
    /// 429 `TooManyRequests` with `Retry-After`, as the API server's priority and fairness
    /// answers when it sheds load.
    TooManyRequests {
        /// The `Retry-After` header, in seconds.
        retry_after_seconds: u32,
    },
    /// The request is read and never answered, as over a connection that was lost: the client
    /// must give it up itself. Requests after the fault are answered.
    Hang,
}

fn lock_task(
    task: &Mutex<Option<tokio::task::JoinHandle<()>>>,
) -> std::sync::MutexGuard<'_, Option<tokio::task::JoinHandle<()>>> {
    // Reason: a test server; a panicking test already failed.
    task.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Answers as `faults` says before the request reaches the routes; a request held by
/// [`Fault::Hang`] is counted as `HUNG requests`.
async fn inject_faults(
    State((faults, objects)): State<(tokio::sync::watch::Receiver<Option<Fault>>, Shared)>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let fault = *faults.borrow();
    let message = || "the test API server is failing on purpose".to_owned();
    if fault.is_some_and(|fault| fault != Fault::Hang) {
        // Counted, so a test can wait for a client to have met the fault rather than sleep.
        lock(&objects).count("FAILED requests");
    }
    match fault {
        None => next.run(request).await,
        Some(Fault::InternalError) => failure(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message()),
        Some(Fault::Unavailable) => failure(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", message()),
        Some(Fault::TooManyRequests { retry_after_seconds }) => {
            let mut response = failure(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", message());
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, retry_after_seconds.into());
            response
        }
        Some(Fault::Hang) => {
            lock(&objects).count("HUNG requests");
            std::future::pending().await
        }
    }
}

/// Accepts connections on `listener` and serves each with `router` until aborted, which ends
/// every connection with it.
fn serve(listener: tokio::net::TcpListener, router: Router) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let service = hyper_util::service::TowerToHyperService::new(router.clone());
                    connections.spawn(async move {
                        let connection = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                        let _ = connection.await;
                    });
                }
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    })
}

type Shared = Arc<Mutex<Objects>>;

fn lock(objects: &Shared) -> std::sync::MutexGuard<'_, Objects> {
    // Reason: a test server; a panicking handler already failed the test.
    objects.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A `metav1.Status` failure, as the API server answers one.
fn failure(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, Json(body)).into_response()
}

/// A request the server refuses, answered as a `metav1.Status` failure.
#[derive(Debug)]
struct Refusal {
    code: StatusCode,
    reason: &'static str,
    message: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        failure(self.code, self.reason, self.message)
    }
}

/// A strategic merge patch as the API server applies one to the fields used here: objects merge
/// key by key, `null` deletes, lists with a merge key in the core types (`conditions` and
/// `addresses` by `type`, `podIPs` and `hostIPs` by `ip`, `ownerReferences` by `uid`) merge item
/// by item, unless one item is the directive `{"$patch": "replace"}`, which makes the rest of the
/// list replace it; other lists are replaced. Other directives (`$patch` elsewhere,
/// `$setElementOrder/...`, `$retainKeys`) are not applied: the server refuses a patch that carries
/// one (see `PatchType::of`).
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    if target.is_null() && patch.is_object() {
        *target = json!({});
    }
    let (Value::Object(target), Value::Object(patch)) = (target, patch) else { return };
    for (key, value) in patch {
        match (target.get_mut(key), value) {
            (_, Value::Null) => _ = target.remove(key),
            (Some(old @ Value::Object(_)), Value::Object(_)) => strategic_merge(old, value),
            (_, Value::Array(new)) if merge_key(key).is_some() && new.iter().any(is_replace) => {
                let rest: Vec<Value> = new.iter().filter(|item| !is_replace(item)).cloned().collect();
                target.insert(key.clone(), Value::Array(rest));
            }
            (Some(Value::Array(old)), Value::Array(new)) if merge_key(key).is_some() => {
                let merge_key = merge_key(key).unwrap_or_default();
                for item in new {
                    match old.iter_mut().find(|o| o[merge_key] == item[merge_key]) {
                        Some(existing) => strategic_merge(existing, item),
                        None => old.push(item.clone()),
                    }
                }
            }
            _ => _ = target.insert(key.clone(), value.clone()),
        }
    }
}

/// The merge key of the core types' lists that strategic merge patches merge item by item.
fn merge_key(list: &str) -> Option<&'static str> {
    match list {
        "conditions" | "addresses" => Some("type"),
        "podIPs" | "hostIPs" => Some("ip"),
        "ownerReferences" => Some("uid"),
        _ => None,
    }
}

/// A JSON merge patch (RFC 7386): objects merge key by key, `null` deletes, and anything else,
/// lists included, replaces what was there.
pub fn json_merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(target) = target else { return };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            json_merge(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Whether `item` of a list is the directive `{"$patch": "replace"}`.
fn is_replace(item: &Value) -> bool {
    *item == json!({ "$patch": "replace" })
}

/// The first key of `patch` that is a strategic merge directive this server does not apply
/// (`$patch` but a list's `replace`, `$setElementOrder/...`, `$retainKeys`).
fn directive(patch: &Value) -> Option<String> {
    match patch {
        Value::Object(map) => {
            map.iter().find_map(|(key, value)| if key.starts_with('$') { Some(key.clone()) } else { directive(value) })
        }
        Value::Array(items) => items.iter().filter(|item| !is_replace(item)).find_map(directive),
        _ => None,
    }
}

/// The API server's validation of a pod's IPs (`validatePodIPs`): at most one IP of each family,
/// the first of `podIPs` being `podIP`; the message of its 422.
fn invalid_pod_ips(name: &str, status: &Value) -> Option<String> {
    let ips: Vec<&str> = status["podIPs"].as_array().into_iter().flatten().filter_map(|p| p["ip"].as_str()).collect();
    let v6 = ips.iter().filter(|ip| ip.contains(':')).count();
    if v6 > 1 || ips.len() - v6 > 1 {
        return Some(format!(
            "Pod \"{name}\" is invalid: status.podIPs: Invalid value: {ips:?}: may specify no more than one IP for each IP family"
        ));
    }
    match (status["podIP"].as_str(), ips.first()) {
        (Some(ip), Some(first)) if ip != *first => Some(format!(
            "Pod \"{name}\" is invalid: status.podIPs[0]: Invalid value: {first:?}: must be equal to status.podIP ({ip:?})"
        )),
        _ => None,
    }
}

/// The patch types this server applies, chosen by the request's `Content-Type` as the API
/// server chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PatchType {
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/merge-patch+json`.
    Merge,
}

impl PatchType {
    /// The patch type `headers` ask for and the patch in `body`, or the API server's 415 for
    /// any other type; a body that is not JSON is a 400, and a strategic merge patch with a
    /// directive this server does not apply a 422 that names it.
    fn of(headers: &HeaderMap, body: &[u8]) -> Result<(PatchType, Value), Refusal> {
        let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let patch = || {
            serde_json::from_slice::<Value>(body).map_err(|e| Refusal {
                code: StatusCode::BAD_REQUEST,
                reason: "BadRequest",
                message: format!("the patch is not JSON: {e}"),
            })
        };
        match content_type.split(';').next().unwrap_or_default().trim() {
            "application/strategic-merge-patch+json" => match patch().map(|p| (directive(&p), p))? {
                (None, patch) => Ok((PatchType::Strategic, patch)),
                (Some(key), _) => Err(Refusal {
                    code: StatusCode::UNPROCESSABLE_ENTITY,
                    reason: "Invalid",
                    message: format!("the test API server applies no strategic merge directive: {key}"),
                }),
            },
            "application/merge-patch+json" => Ok((PatchType::Merge, patch()?)),
            other => Err(Refusal {
                code: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                reason: "UnsupportedMediaType",
                message: format!(
                    "the body of the request was in an unknown format - accepted media types include: \
                     application/strategic-merge-patch+json, application/merge-patch+json (got {other:?})"
                ),
            }),
        }
    }

    /// Applies `patch` to `target`.
    fn apply(self, target: &mut Value, patch: &Value) {
        match self {
            PatchType::Strategic => strategic_merge(target, patch),
            PatchType::Merge => json_merge(target, patch),
        }
    }
}

async fn create_node(State(objects): State<Shared>, Json(node): Json<Value>) -> Response {
    let mut objects = lock(&objects);
    objects.count("POST nodes");
    let name = node["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    if objects.nodes.contains_key(&name) {
        return failure(StatusCode::CONFLICT, "AlreadyExists", format!("nodes \"{name}\" already exists"));
    }
    let node = store_node(&mut objects, node, true);
    (StatusCode::CREATED, Json(node)).into_response()
}

/// Stamps `node` (a new UID when `new`), stores it and adds its watch event; the node as stored.
fn store_node(objects: &mut Objects, mut node: Value, new: bool) -> Value {
    objects.stamp(&mut node, new);
    let name = node["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let kind = if objects.nodes.contains_key(&name) { "MODIFIED" } else { "ADDED" };
    objects.nodes.insert(name, node.clone());
    objects.watch_events.push((objects.version, "nodes", kind, node.clone()));
    objects.changed.notify_waiters();
    node
}

async fn nodes(
    State(objects): State<Shared>,
    axum::extract::Query(query): axum::extract::Query<BTreeMap<String, String>>,
) -> Response {
    list_or_watch(objects, "nodes", None, query)
}

async fn get_node(State(objects): State<Shared>, UrlPath(name): UrlPath<String>) -> Response {
    let mut objects = lock(&objects);
    objects.count("GET nodes");
    match objects.nodes.get(&name) {
        Some(node) => Json(node.clone()).into_response(),
        None => failure(StatusCode::NOT_FOUND, "NotFound", format!("nodes \"{name}\" not found")),
    }
}

async fn patch_node(objects: Shared, name: String, headers: HeaderMap, body: Bytes, request: &str) -> Response {
    let mut objects = lock(&objects);
    objects.count(request);
    let (patch_type, patch) = match PatchType::of(&headers, &body) {
        Ok(patch) => patch,
        Err(refused) => return refused.into_response(),
    };
    let Some(mut node) = objects.nodes.get(&name).cloned() else {
        return failure(StatusCode::NOT_FOUND, "NotFound", format!("nodes \"{name}\" not found"));
    };
    patch_type.apply(&mut node, &patch);
    let node = store_node(&mut objects, node, false);
    Json(node).into_response()
}

async fn get_lease(State(objects): State<Shared>, UrlPath((ns, name)): UrlPath<(String, String)>) -> Response {
    let mut objects = lock(&objects);
    objects.count("GET leases");
    match objects.leases.get(&format!("{ns}/{name}")) {
        Some(lease) => Json(lease.clone()).into_response(),
        None => failure(StatusCode::NOT_FOUND, "NotFound", format!("leases.coordination.k8s.io \"{name}\" not found")),
    }
}

async fn create_lease(
    State(objects): State<Shared>,
    UrlPath(ns): UrlPath<String>,
    Json(mut lease): Json<Value>,
) -> Response {
    let mut objects = lock(&objects);
    objects.count("POST leases");
    let name = lease["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let key = format!("{ns}/{name}");
    if objects.leases.contains_key(&key) {
        return failure(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("leases.coordination.k8s.io \"{name}\" already exists"),
        );
    }
    objects.stamp(&mut lease, true);
    objects.leases.insert(key, lease.clone());
    (StatusCode::CREATED, Json(lease)).into_response()
}

async fn replace_lease(
    State(objects): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    Json(mut lease): Json<Value>,
) -> Response {
    let mut objects = lock(&objects);
    objects.count("PUT leases");
    let key = format!("{ns}/{name}");
    let Some(current) = objects.leases.get(&key) else {
        return failure(StatusCode::NOT_FOUND, "NotFound", format!("leases.coordination.k8s.io \"{name}\" not found"));
    };
    if current["metadata"]["resourceVersion"] != lease["metadata"]["resourceVersion"] {
        return failure(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        );
    }
    lease["metadata"]["uid"] = current["metadata"]["uid"].clone();
    objects.stamp(&mut lease, false);
    objects.leases.insert(key, lease.clone());
    Json(lease).into_response()
}

async fn get_pod(State(objects): State<Shared>, UrlPath((ns, name)): UrlPath<(String, String)>) -> Response {
    let mut objects = lock(&objects);
    objects.count("GET pods");
    match objects.pods.get(&format!("{ns}/{name}")) {
        Some(pod) => Json(pod.clone()).into_response(),
        None => failure(StatusCode::NOT_FOUND, "NotFound", format!("pods \"{name}\" not found")),
    }
}

async fn patch_pod_status(
    State(objects): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = format!("{ns}/{name}");
    lock(&objects).count("PATCH pods/status");
    wait_while_held(&objects, &key).await;
    let mut objects = lock(&objects);
    let (patch_type, patch) = match PatchType::of(&headers, &body) {
        Ok(patch) => patch,
        Err(refused) => return refused.into_response(),
    };
    let Some(mut pod) = objects.pods.get(&key).cloned() else {
        return failure(StatusCode::NOT_FOUND, "NotFound", format!("pods \"{name}\" not found"));
    };
    // A UID in the patch is a precondition, as the API server treats it.
    if let Some(uid) = patch["metadata"]["uid"].as_str()
        && pod["metadata"]["uid"] != uid
    {
        return failure(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on pods \"{name}\": the UID in the precondition ({uid}) does not match"
            ),
        );
    }
    // So is a resource version: the patch was made against that version of the pod.
    if let Some(version) = patch["metadata"]["resourceVersion"].as_str()
        && pod["metadata"]["resourceVersion"] != version
    {
        return failure(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on pods \"{name}\": the object has been modified; please apply your \
                 changes to the latest version and try again"
            ),
        );
    }
    // The status subresource takes only the status from a patch.
    if let Some(status) = patch.get("status") {
        patch_type.apply(&mut pod["status"], status);
    }
    if let Some(status) = pod["status"].as_object_mut() {
        for field in &objects.unknown_status_fields {
            status.remove(*field);
        }
    }
    if let Some(message) = invalid_pod_ips(&name, &pod["status"]) {
        return failure(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message);
    }
    let pod = objects.commit(key, pod, "MODIFIED");
    objects.changed.notify_waiters();
    Json(pod).into_response()
}

/// Waits while the status patches of pod `key` are held.
async fn wait_while_held(objects: &Shared, key: &str) {
    let changed = lock(objects).changed.clone();
    loop {
        let released = changed.notified();
        tokio::pin!(released);
        released.as_mut().enable();
        if !lock(objects).held_status_patches.contains(key) {
            return;
        }
        released.await;
    }
}

async fn create_pod(
    State(objects): State<Shared>,
    UrlPath(ns): UrlPath<String>,
    Json(mut pod): Json<Value>,
) -> Response {
    let mut objects = lock(&objects);
    objects.count("POST pods");
    if pod["metadata"]["name"].as_str().is_none_or(str::is_empty)
        && let Some(prefix) = pod["metadata"]["generateName"].as_str()
    {
        let name = format!("{prefix}{:05x}", objects.version + 1);
        pod["metadata"]["name"] = json!(name);
    }
    let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let key = format!("{ns}/{name}");
    if objects.pods.contains_key(&key) {
        return failure(StatusCode::CONFLICT, "AlreadyExists", format!("pods \"{name}\" already exists"));
    }
    pod["metadata"]["namespace"] = json!(ns);
    let pod = objects.commit(key, pod, "ADDED");
    objects.changed.notify_waiters();
    (StatusCode::CREATED, Json(pod)).into_response()
}

/// Deletes pod `ns/name` as the API server does: with a UID precondition (409 when another pod
/// has the name by now), at once with grace 0 (a `DELETED` event), else by setting its
/// `deletionTimestamp` and `deletionGracePeriodSeconds` (a `MODIFIED` event) for its kubelet.
fn delete(objects: &mut Objects, ns: &str, name: &str, options: &Value) -> Response {
    let key = format!("{ns}/{name}");
    let Some(mut pod) = objects.pods.get(&key).cloned() else {
        return failure(StatusCode::NOT_FOUND, "NotFound", format!("pods \"{name}\" not found"));
    };
    if let Some(uid) = options["preconditions"]["uid"].as_str()
        && pod["metadata"]["uid"] != uid
    {
        let theirs = pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
        return failure(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {theirs}"),
        );
    }
    let default_grace = pod["spec"]["terminationGracePeriodSeconds"].as_i64().unwrap_or(30);
    let grace = options["gracePeriodSeconds"].as_i64().unwrap_or(default_grace);
    let unbound = pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty);
    if grace == 0 || unbound {
        pod = objects.commit(key, pod, "DELETED");
    } else if pod["metadata"]["deletionTimestamp"].is_null() {
        pod["metadata"]["deletionTimestamp"] = json!("2026-11-24T00:00:30Z");
        pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
        pod = objects.commit(key, pod, "MODIFIED");
    }
    objects.changed.notify_waiters();
    Json(pod).into_response()
}

async fn delete_pod(
    State(objects): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let options: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut objects = lock(&objects);
    objects.count("DELETE pods");
    delete(&mut objects, &ns, &name, &options)
}

async fn create_event(
    State(objects): State<Shared>,
    UrlPath(ns): UrlPath<String>,
    Json(mut event): Json<Value>,
) -> Response {
    let mut objects = lock(&objects);
    objects.count("POST events");
    let name = event["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    let key = format!("{ns}/{name}");
    if objects.events.contains_key(&key) {
        return failure(StatusCode::CONFLICT, "AlreadyExists", format!("events \"{name}\" already exists"));
    }
    if event["involvedObject"]["kind"].as_str().is_none_or(str::is_empty) {
        return failure(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", "involvedObject.kind: Required value".to_owned());
    }
    objects.stamp(&mut event, true);
    objects.events.insert(key, event.clone());
    (StatusCode::CREATED, Json(event)).into_response()
}

async fn patch_event(
    State(objects): State<Shared>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut objects = lock(&objects);
    objects.count("PATCH events");
    let (patch_type, patch) = match PatchType::of(&headers, &body) {
        Ok(patch) => patch,
        Err(refused) => return refused.into_response(),
    };
    let key = format!("{ns}/{name}");
    let Some(mut event) = objects.events.get(&key).cloned() else {
        return failure(StatusCode::NOT_FOUND, "NotFound", format!("events \"{name}\" not found"));
    };
    patch_type.apply(&mut event, &patch);
    objects.stamp(&mut event, false);
    objects.events.insert(key, event.clone());
    Json(event).into_response()
}

async fn get_object(
    State(objects): State<Shared>,
    UrlPath((ns, kind, name)): UrlPath<(String, String, String)>,
) -> Response {
    let mut objects = lock(&objects);
    objects.count(&format!("GET {kind}"));
    match objects.objects.get(&format!("{kind}/{ns}/{name}")) {
        Some(object) => Json(object.clone()).into_response(),
        None => failure(StatusCode::NOT_FOUND, "NotFound", format!("{kind} \"{name}\" not found")),
    }
}

async fn create_token(
    State(objects): State<Shared>,
    UrlPath((ns, account)): UrlPath<(String, String)>,
    Json(mut request): Json<Value>,
) -> Response {
    let mut objects = lock(&objects);
    objects.count("POST serviceaccounts/token");
    let pod = request["spec"]["boundObjectRef"]["name"].as_str().unwrap_or_default().to_owned();
    if request["spec"]["boundObjectRef"]["kind"] != "Pod" || pod.is_empty() {
        return failure(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "spec.boundObjectRef: a pod is required".to_owned(),
        );
    }
    let n = objects.token_requests.len();
    objects.token_requests.push((format!("{ns}/{account}"), pod.clone()));
    request["status"] =
        json!({"token": format!("token-{n}-{account}-{pod}"), "expirationTimestamp": "2026-11-24T01:00:00Z"});
    (StatusCode::CREATED, Json(request)).into_response()
}

async fn pods(
    State(objects): State<Shared>,
    axum::extract::Query(query): axum::extract::Query<BTreeMap<String, String>>,
) -> Response {
    list_or_watch(objects, "pods", None, query)
}

async fn services(
    State(objects): State<Shared>,
    axum::extract::Query(query): axum::extract::Query<BTreeMap<String, String>>,
) -> Response {
    list_or_watch(objects, "services", None, query)
}

async fn namespaced_list(
    State(objects): State<Shared>,
    UrlPath((ns, resource)): UrlPath<(String, String)>,
    axum::extract::Query(query): axum::extract::Query<BTreeMap<String, String>>,
) -> Response {
    match resource.as_str() {
        "configmaps" => list_or_watch(objects, "configmaps", Some(ns), query),
        "secrets" => list_or_watch(objects, "secrets", Some(ns), query),
        _ => failure(StatusCode::NOT_FOUND, "NotFound", format!("the server could not find {resource}")),
    }
}

/// One term of a field selector: `field=value`, `field==value` or `field!=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    field: String,
    value: String,
    equal: bool,
}

/// The fields each resource can be selected by here (a subset of the API server's).
fn selectable(resource: &str) -> &'static [&'static str] {
    match resource {
        "pods" => &["metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"],
        _ => &["metadata.name", "metadata.namespace"],
    }
}

/// The request's `fieldSelector` for `resource`, or the API server's 400 for a field it cannot
/// be selected by.
fn field_selector(resource: &str, query: &BTreeMap<String, String>) -> Result<Vec<FieldTerm>, Refusal> {
    let Some(selector) = query.get("fieldSelector").filter(|s| !s.is_empty()) else { return Ok(Vec::new()) };
    selector
        .split(',')
        .map(|term| {
            let (field, value, equal) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, v, true)
            } else {
                let message = format!("invalid selector: '{selector}'; can't understand '{term}'");
                return Err(Refusal { code: StatusCode::BAD_REQUEST, reason: "BadRequest", message });
            };
            let field = field.trim();
            if !selectable(resource).contains(&field) {
                let message = format!("field label not supported: {field}");
                return Err(Refusal { code: StatusCode::BAD_REQUEST, reason: "BadRequest", message });
            }
            Ok(FieldTerm { field: field.to_owned(), value: value.trim().to_owned(), equal })
        })
        .collect()
}

/// Whether `object` (in namespace `ns`, when given) matches every term of a field selector.
fn matches(object: &Value, ns: Option<&str>, terms: &[FieldTerm]) -> bool {
    let in_namespace = ns.is_none_or(|ns| object["metadata"]["namespace"] == ns);
    in_namespace
        && terms.iter().all(|term| {
            let value = term.field.split('.').fold(object, |v, part| &v[part]);
            (value.as_str().unwrap_or_default() == term.value) == term.equal
        })
}

/// A list, or a watch from `resourceVersion` (410 `Expired` when compacted away), of `resource`.
fn list_or_watch(
    objects: Shared,
    resource: &'static str,
    ns: Option<String>,
    query: BTreeMap<String, String>,
) -> Response {
    let watching = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    let mut guard = lock(&objects);
    guard.count(&format!("{} {resource}", if watching { "WATCH" } else { "LIST" }));
    let terms = match field_selector(resource, &query) {
        Ok(terms) => terms,
        Err(refused) => return refused.into_response(),
    };
    if !watching {
        let all: Vec<&Value> = match resource {
            "pods" => guard.pods.values().collect(),
            "nodes" => guard.nodes.values().collect(),
            _ => guard.objects.iter().filter(|(k, _)| k.starts_with(&format!("{resource}/"))).map(|(_, v)| v).collect(),
        };
        let items: Vec<Value> = all.into_iter().filter(|o| matches(o, ns.as_deref(), &terms)).cloned().collect();
        let version = guard.version.to_string();
        return Json(
            json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": version}, "items": items}),
        )
        .into_response();
    }
    let from: u64 = query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let timeout = query.get("timeoutSeconds").and_then(|t| t.parse().ok()).unwrap_or(290);
    let bookmarks = query.get("allowWatchBookmarks").is_some_and(|b| b == "true" || b == "1");
    if from < guard.compacted {
        let expired = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": format!("too old resource version: {from} ({})", guard.compacted),
            "reason": "Expired", "code": 410}});
        return axum::body::Body::from(format!("{expired}\n")).into_response();
    }
    let (changed, generation) = (guard.changed.clone(), guard.watch_generation);
    drop(guard);
    let kind = match resource {
        "pods" => "Pod",
        "nodes" => "Node",
        "configmaps" => "ConfigMap",
        "services" => "Service",
        _ => "Secret",
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(timeout);
    let stream = futures::stream::unfold(from, move |last| {
        let (objects, changed, terms, ns) = (objects.clone(), changed.clone(), terms.clone(), ns.clone());
        async move {
            let mut idle = false;
            loop {
                // What to send, decided under the lock, which is never held across an await.
                let next = {
                    let mut guard = lock(&objects);
                    if guard.watch_generation != generation {
                        return None;
                    }
                    let lines: Vec<(u64, String)> = guard
                        .watch_events
                        .iter()
                        .filter(|(version, r, _, o)| {
                            *version > last && *r == resource && matches(o, ns.as_deref(), &terms)
                        })
                        .map(|(version, _, kind, o)| (*version, format!("{}\n", json!({"type": kind, "object": o}))))
                        .collect();
                    if let Some((newest, _)) = lines.last() {
                        Some((lines.iter().map(|(_, line)| line.as_str()).collect::<String>(), *newest))
                    } else if idle && bookmarks && guard.version > last {
                        // Idle for a whole look while the version moved on: a bookmark.
                        guard.count(&format!("BOOKMARK {resource}"));
                        let bookmark = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": "v1",
                            "metadata": {"resourceVersion": guard.version.to_string()}}});
                        Some((format!("{bookmark}\n"), guard.version))
                    } else {
                        None
                    }
                };
                if let Some((text, version)) = next {
                    return Some((Ok::<_, std::convert::Infallible>(text), version));
                }
                if tokio::time::Instant::now() >= deadline {
                    return None;
                }
                idle = tokio::time::timeout(WATCH_POLL, changed.notified()).await.is_err();
            }
        }
    });
    axum::body::Body::from_stream(stream).into_response()
}

/// Creates or replaces a config map, secret or service: an `ADDED` or `MODIFIED` event.
fn put_object(objects: &mut Objects, resource: &'static str, key: String, mut object: Value) {
    let kind = if objects.objects.contains_key(&key) { "MODIFIED" } else { "ADDED" };
    objects.stamp(&mut object, kind == "ADDED");
    let version = objects.version;
    objects.objects.insert(key, object.clone());
    objects.watch_events.push((version, resource, kind, object));
    objects.changed.notify_waiters();
}

/// Creates or replaces a pod: an `ADDED` or `MODIFIED` event.
fn put(objects: &mut Objects, mut pod: Value) {
    let key = format!(
        "{}/{}",
        pod["metadata"]["namespace"].as_str().unwrap_or("default"),
        pod["metadata"]["name"].as_str().unwrap_or_default()
    );
    let kind = match objects.pods.get(&key) {
        Some(old) => {
            pod["metadata"]["uid"] = old["metadata"]["uid"].clone();
            "MODIFIED"
        }
        None => "ADDED",
    };
    objects.commit(key, pod, kind);
}

impl ApiServer {
    /// Creates or replaces pod `pod` (its `metadata.namespace` and `name`), as a scheduler's
    /// binding or an update would: an `ADDED` or `MODIFIED` event.
    pub fn put_pod(&self, pod: Value) {
        let mut objects = lock(&self.objects);
        put(&mut objects, pod);
        objects.changed.notify_waiters();
    }

    /// Creates node `node` (its `metadata.name`) as an administrator or a provisioner would, for a
    /// kubelet that does not register its own.
    pub fn put_node(&self, node: Value) {
        store_node(&mut lock(&self.objects), node, true);
    }

    /// Sets label `key` of node `name` to `value`, as `kubectl label node` would.
    pub fn label_node(&self, name: &str, key: &str, value: &str) {
        let mut objects = lock(&self.objects);
        let Some(mut node) = objects.nodes.get(name).cloned() else { return };
        node["metadata"]["labels"][key] = json!(value);
        store_node(&mut objects, node, false);
    }

    /// Creates or replaces config map `namespace/name` with `data` (text values).
    pub fn put_config_map(&self, namespace: &str, name: &str, data: Value) {
        let mut objects = lock(&self.objects);
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace}, "data": data});
        put_object(&mut objects, "configmaps", format!("configmaps/{namespace}/{name}"), object);
    }

    /// Creates or replaces secret `namespace/name` with `data` (values as bytes, sent base64
    /// as the API server sends them).
    pub fn put_secret(&self, namespace: &str, name: &str, data: &[(&str, &[u8])]) {
        let encoded: serde_json::Map<String, Value> =
            data.iter().map(|(k, v)| ((*k).to_owned(), json!(k8s_openapi::ByteString(v.to_vec())))).collect();
        let mut objects = lock(&self.objects);
        let object = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace}, "data": encoded});
        put_object(&mut objects, "secrets", format!("secrets/{namespace}/{name}"), object);
    }

    /// Creates or replaces service `namespace/name` with `spec` (its `clusterIP` and `ports`).
    pub fn put_service(&self, namespace: &str, name: &str, spec: Value) {
        let mut objects = lock(&self.objects);
        let object = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec});
        put_object(&mut objects, "services", format!("services/{namespace}/{name}"), object);
    }

    /// Deletes config map, secret or service `namespace/name` (`resource` `configmaps`,
    /// `secrets` or `services`).
    pub fn delete_object(&self, resource: &'static str, namespace: &str, name: &str) {
        let mut objects = lock(&self.objects);
        if let Some(mut object) = objects.objects.remove(&format!("{resource}/{namespace}/{name}")) {
            objects.stamp(&mut object, false);
            let version = objects.version;
            objects.watch_events.push((version, resource, "DELETED", object));
            objects.changed.notify_waiters();
        }
    }

    /// Asks for the deletion of pod `namespace/name` with `grace` seconds, as `kubectl delete`
    /// does: a bound pod gets its `deletionTimestamp`, and its kubelet deletes it once stopped.
    pub fn request_deletion(&self, namespace: &str, name: &str, grace: i64) {
        let mut objects = lock(&self.objects);
        let _ = delete(&mut objects, namespace, name, &json!({ "gracePeriodSeconds": grace }));
    }

    /// Deletes pod `namespace/name`: a `DELETED` event.
    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let mut objects = lock(&self.objects);
        let key = format!("{namespace}/{name}");
        if let Some(pod) = objects.pods.get(&key).cloned() {
            objects.commit(key, pod, "DELETED");
            objects.changed.notify_waiters();
        }
    }

    /// Holds the status patches of pod `namespace/name`: each is counted and left unanswered
    /// until [`ApiServer::release_status_patches`], as a slow API server would leave it.
    pub fn hold_status_patches(&self, namespace: &str, name: &str) {
        lock(&self.objects).held_status_patches.insert(format!("{namespace}/{name}"));
    }

    /// Answers the held status patches of pod `namespace/name`, and every later one at once.
    pub fn release_status_patches(&self, namespace: &str, name: &str) {
        let mut objects = lock(&self.objects);
        objects.held_status_patches.remove(&format!("{namespace}/{name}"));
        objects.changed.notify_waiters();
    }

    /// Ends every open watch, as a server that drops its connections does: each watcher must
    /// watch again, from the version it saw last.
    pub fn end_watches(&self) {
        let mut objects = lock(&self.objects);
        objects.watch_generation += 1;
        objects.changed.notify_waiters();
    }

    /// Forgets the pod event history, as etcd's compaction does, and ends every open watch (as
    /// an API server restart does): a watch from an older version gets 410 `Expired` and must
    /// list again.
    pub fn compact(&self) {
        self.restart_with(Vec::new());
    }

    /// Restarts as an API server whose pods `pods` were put while its clients were away and
    /// whose history was compacted meanwhile: every watch ends, and since no client saw these
    /// changes, each one's next watch gets 410 `Expired` and must list again.
    pub fn restart_with(&self, pods: Vec<Value>) {
        let mut objects = lock(&self.objects);
        objects.watch_generation += 1;
        for pod in pods {
            put(&mut objects, pod);
        }
        objects.compacted = objects.version;
        objects.watch_events.clear();
        objects.changed.notify_waiters();
    }

    /// Starts a server on a free port of 127.0.0.1.
    ///
    /// # Panics
    ///
    /// When no port can be bound (a test cannot go on).
    pub async fn start() -> ApiServer {
        static SERVERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let objects: Shared = Arc::default();
        let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&objects).uid_prefix = format!("{}-{n}", std::process::id());
        let router = Router::new()
            .route("/api/v1/nodes", get(nodes).post(create_node))
            .route(
                "/api/v1/nodes/{name}",
                get(get_node).patch(|State(o): State<Shared>, UrlPath(n): UrlPath<String>, h: HeaderMap, b: Bytes| {
                    patch_node(o, n, h, b, "PATCH nodes")
                }),
            )
            .route(
                "/api/v1/nodes/{name}/status",
                axum::routing::patch(|State(o): State<Shared>, UrlPath(n): UrlPath<String>, h: HeaderMap, b: Bytes| {
                    patch_node(o, n, h, b, "PATCH nodes/status")
                }),
            )
            .route("/api/v1/pods", get(pods))
            .route("/api/v1/services", get(services))
            .route("/api/v1/namespaces/{ns}/pods", post(create_pod))
            .route("/api/v1/namespaces/{ns}/pods/{name}", get(get_pod).delete(delete_pod))
            .route("/api/v1/namespaces/{ns}/pods/{name}/status", axum::routing::patch(patch_pod_status))
            .route("/api/v1/namespaces/{ns}/events", post(create_event))
            .route("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token", post(create_token))
            .route("/api/v1/namespaces/{ns}/{kind}/{name}", get(get_object))
            .route("/api/v1/namespaces/{ns}/{resource}", get(namespaced_list))
            .route("/api/v1/namespaces/{ns}/events/{name}", axum::routing::patch(patch_event))
            .route("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", post(create_lease))
            .route("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}", get(get_lease).put(replace_lease))
            .with_state(objects.clone());
        let (faults, answers) = tokio::sync::watch::channel(None);
        let router = router.layer(axum::middleware::from_fn_with_state((answers, objects.clone()), inject_faults));
        // Reason: a test server that cannot listen leaves the test nothing to do.
        #[allow(clippy::expect_used)]
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a free port on 127.0.0.1");
        #[allow(clippy::expect_used)]
        let addr = listener.local_addr().expect("the bound address");
        let task = Mutex::new(Some(serve(listener, router.clone())));
        ApiServer { addr, objects, router, task, faults }
    }

    /// Closes every connection and refuses new ones, as an API server that went away; returns
    /// once the listener is closed.
    pub async fn refuse_connections(&self) {
        let task = lock_task(&self.task).take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }

    /// Listens again on the same address after [`ApiServer::refuse_connections`].
    ///
    /// # Panics
    ///
    /// When the address cannot be bound again (a test cannot go on).
    pub async fn accept_connections(&self) {
        // Reason: as in `start`.
        #[allow(clippy::expect_used)]
        let listener = tokio::net::TcpListener::bind(self.addr).await.expect("the server's address again");
        let old = lock_task(&self.task).replace(serve(listener, self.router.clone()));
        if let Some(old) = old {
            old.abort();
        }
    }

    /// Answers every request as `fault` says from now on; `None` serves them again (requests a
    /// [`Fault::Hang`] held stay unanswered).
    pub fn set_fault(&self, fault: Option<Fault>) {
        self.faults.send_replace(fault);
    }

    /// Writes a kubeconfig for this server (plain HTTP, no credentials) to `path`.
    ///
    /// # Errors
    ///
    /// When the file cannot be written.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: \"http://{}\"}}\n\
             users:\n- name: test\n  user: {{}}\ncontexts:\n- name: test\n  context: {{cluster: test, user: test}}\n\
             current-context: test\n",
            self.addr
        );
        std::fs::write(path, text)
    }

    /// How many requests `request` (`PATCH nodes/status`, `PUT leases`...) it has served.
    pub fn requests(&self, request: &str) -> u32 {
        lock(&self.objects).requests.get(request).copied().unwrap_or_default()
    }
}
