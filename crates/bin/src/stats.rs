//! `/stats/summary`, `/metrics/resource` and `/metrics/cadvisor` on the kubelet API: what
//! `kubectl top` (through metrics-server), Prometheus and other monitors read, sampled when asked
//! (`kubelet_eviction::summary`).

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::State,
    http::header,
    response::{IntoResponse, Response},
    routing::get,
};
use eviction::summary::{PodSample, SummaryProvider, cadvisor_metrics, resource_metrics, summary};
use kubelet::StatusStore;
use kubelet_core::{PodManager, PodUid, Runtime};

/// What the endpoints read.
pub(crate) struct Stats<R> {
    provider: SummaryProvider<R>,
    pods: Arc<PodManager>,
    statuses: Arc<StatusStore>,
    node_name: String,
}

impl<R: Runtime> Stats<R> {
    pub(crate) fn new(
        provider: SummaryProvider<R>,
        pods: Arc<PodManager>,
        statuses: Arc<StatusStore>,
        node_name: impl Into<String>,
    ) -> Self {
        Stats { provider, pods, statuses, node_name: node_name.into() }
    }
}

/// The routes of the three endpoints.
pub(crate) fn router<R: Runtime>(stats: Stats<R>) -> Router {
    Router::new()
        .route("/stats/summary", get(summary_of::<R>))
        .route("/metrics/resource", get(resource_metrics_of::<R>))
        .route("/metrics/cadvisor", get(cadvisor_metrics_of::<R>))
        .with_state(Arc::new(stats))
}

/// Samples the node and the desired pods, and hands them to `render` with the pods' statuses.
async fn sample<R: Runtime, T>(
    stats: &Stats<R>,
    render: impl FnOnce(&eviction::summary::NodeSample, &[PodSample<'_>], bool) -> T,
) -> T {
    let pods = stats.pods.pods();
    let node = stats.provider.node().await;
    let (measured, scrape_error) = stats.provider.pods(&pods).await;
    let statuses: Vec<_> = pods.iter().map(|pod| stats.statuses.get(&PodUid::of(pod)).map(|s| s.status)).collect();
    let samples: Vec<PodSample<'_>> = pods
        .iter()
        .zip(&statuses)
        .filter_map(|(pod, status)| {
            let measured = measured.get(&PodUid::of(pod))?;
            Some(PodSample::new(pod, status.as_ref(), measured))
        })
        .collect();
    render(&node, &samples, scrape_error)
}

async fn summary_of<R: Runtime>(State(stats): State<Arc<Stats<R>>>) -> Json<serde_json::Value> {
    Json(sample(&stats, |node, pods, _| summary(&stats.node_name, node, pods)).await)
}

async fn resource_metrics_of<R: Runtime>(State(stats): State<Arc<Stats<R>>>) -> Response {
    let text = sample(&stats, resource_metrics).await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn cadvisor_metrics_of<R: Runtime>(State(stats): State<Arc<Stats<R>>>) -> Response {
    let text = sample(&stats, |node, pods, _| cadvisor_metrics(node, pods)).await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
