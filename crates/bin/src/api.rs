//! The agent's read-only local API, as upstream's read-only port serves it: `/healthz`, `/pods`,
//! `/runningpods/` and `/metrics` (Prometheus text).

use std::{net::SocketAddr, sync::Arc};

use anyhow::{Context, Result};
use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use k8s_openapi::{
    api::core::v1::{Container, Pod, PodSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kubelet_core::{PodManager, PodUid, Runtime, kubelet::status_store::StatusStore, state::LoopHealth};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// What the API reads.
pub(crate) struct ApiState<R> {
    pub(crate) pods: Arc<PodManager>,
    pub(crate) statuses: Arc<StatusStore>,
    pub(crate) runtime: Arc<R>,
    pub(crate) loop_health: Arc<LoopHealth>,
    pub(crate) pleg_health: Arc<dyn Fn() -> Result<(), String> + Send + Sync>,
    pub(crate) metrics: Option<PrometheusHandle>,
}

fn pod_list(items: Vec<Pod>) -> serde_json::Value {
    serde_json::json!({ "kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items })
}

async fn healthz<R: Runtime>(State(state): State<Arc<ApiState<R>>>) -> Response {
    if let Err(err) = state.loop_health.check() {
        return (StatusCode::INTERNAL_SERVER_ERROR, format!("[-]syncloop failed: {err}\nhealthz check failed\n"))
            .into_response();
    }
    if let Err(err) = (state.pleg_health)() {
        return (StatusCode::INTERNAL_SERVER_ERROR, format!("[-]pleg failed: {err}\nhealthz check failed\n"))
            .into_response();
    }
    (StatusCode::OK, "ok").into_response()
}

async fn pods<R: Runtime>(State(state): State<Arc<ApiState<R>>>) -> Json<serde_json::Value> {
    let items = state
        .pods
        .pods()
        .into_iter()
        .map(|pod| {
            let mut pod = (*pod).clone();
            if let Some(stored) = state.statuses.get(&PodUid::of(&pod)) {
                pod.status = Some(stored.status);
            }
            pod
        })
        .collect();
    Json(pod_list(items))
}

async fn running_pods<R: Runtime>(State(state): State<Arc<ApiState<R>>>) -> Response {
    match state.runtime.get_pods(false).await {
        Ok(running) => {
            let items = running
                .into_iter()
                .map(|p| Pod {
                    metadata: ObjectMeta {
                        name: Some(p.name),
                        namespace: Some(p.namespace),
                        uid: Some(p.uid.to_string()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(PodSpec {
                        containers: p
                            .containers
                            .into_iter()
                            .map(|c| Container { name: c.name, image: Some(c.image), ..Container::default() })
                            .collect(),
                        ..PodSpec::default()
                    }),
                    ..Pod::default()
                })
                .collect();
            Json(pod_list(items)).into_response()
        }
        Err(err) => {
            (StatusCode::INTERNAL_SERVER_ERROR, format!("listing the runtime's pods failed: {err}")).into_response()
        }
    }
}

async fn metrics<R: Runtime>(State(state): State<Arc<ApiState<R>>>) -> Response {
    match &state.metrics {
        Some(handle) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render()).into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are not enabled").into_response(),
    }
}

/// The router of the read-only API.
pub(crate) fn router<R: Runtime>(state: Arc<ApiState<R>>) -> Router {
    Router::new()
        .route("/healthz", get(healthz::<R>))
        .route("/pods", get(pods::<R>))
        .route("/runningpods/", get(running_pods::<R>))
        .route("/metrics", get(metrics::<R>))
        .with_state(state)
}

/// The `/healthz` router alone (upstream's healthz port).
pub(crate) fn healthz_router<R: Runtime>(state: Arc<ApiState<R>>) -> Router {
    Router::new().route("/healthz", get(healthz::<R>)).with_state(state)
}

/// Binds `addr` (failing clearly if the port is taken) and serves `router` until `cancel`.
pub(crate) async fn serve(
    addr: SocketAddr,
    router: Router,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    info!(%addr, "serving the local API");
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, router).with_graceful_shutdown(async move { cancel.cancelled().await }).await;
    }))
}
