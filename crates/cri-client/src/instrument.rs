//! Metrics of every CRI call, with upstream kubelet names, and the record of what the runtime
//! does not implement.
//!
//! A tower service around the gRPC channel sees every call the generated clients make, so no
//! call site can forget to be measured: `kubelet_runtime_operations_total`,
//! `kubelet_runtime_operations_errors_total` and `kubelet_runtime_operations_duration_seconds`,
//! labelled by `operation_type` with upstream's names (`list_podsandbox`, `update_container`;
//! [`OPERATIONS`], from `pkg/kubelet/kuberuntime/instrumented_services.go`).
//! It also applies the per-call timeout (`runtimeRequestTimeout`), except to the calls upstream
//! leaves unbounded: `PullImage` (containerd has its own progress deadline) and the
//! `GetContainerEvents` stream.

use std::{
    collections::BTreeSet,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::Instant;
use tonic::{
    body::Body,
    codegen::http::{Request, Response},
    transport::Channel,
};
use tracing::info;

/// Each CRI method with the `operation_type` upstream's kubelet records it under
/// (`pkg/kubelet/kuberuntime/instrumented_services.go`), so dashboards built on upstream's
/// metrics work unchanged.
pub const OPERATIONS: &[(&str, &str)] = &[
    ("Version", "version"),
    ("Status", "status"),
    ("CreateContainer", "create_container"),
    ("StartContainer", "start_container"),
    ("StopContainer", "stop_container"),
    ("RemoveContainer", "remove_container"),
    ("ListContainers", "list_containers"),
    ("ContainerStatus", "container_status"),
    ("UpdateContainerResources", "update_container"),
    ("ReopenContainerLog", "reopen_container_log"),
    ("ExecSync", "exec_sync"),
    ("Exec", "exec"),
    ("Attach", "attach"),
    ("RunPodSandbox", "run_podsandbox"),
    ("StopPodSandbox", "stop_podsandbox"),
    ("RemovePodSandbox", "remove_podsandbox"),
    ("PodSandboxStatus", "podsandbox_status"),
    ("ListPodSandbox", "list_podsandbox"),
    ("ContainerStats", "container_stats"),
    ("ListContainerStats", "list_container_stats"),
    ("PodSandboxStats", "podsandbox_stats"),
    ("ListPodSandboxStats", "list_podsandbox_stats"),
    ("PortForward", "port_forward"),
    ("UpdateRuntimeConfig", "update_runtime_config"),
    ("ListImages", "list_images"),
    ("ImageStatus", "image_status"),
    ("PullImage", "pull_image"),
    ("RemoveImage", "remove_image"),
    ("ImageFsInfo", "image_fs_info"),
    ("CheckpointContainer", "checkpoint_container"),
    ("GetContainerEvents", "get_container_events"),
    ("ListMetricDescriptors", "list_metric_descriptors"),
    ("ListPodSandboxMetrics", "list_podsandbox_metrics"),
    ("RuntimeConfig", "runtime_config"),
];

/// The `operation_type` of a gRPC path (`/runtime.v1.RuntimeService/ListPodSandbox` is
/// `list_podsandbox`); a method upstream does not record (a newer CRI's) in snake case.
pub(crate) fn operation(path: &str) -> String {
    let method = path.rsplit('/').next().unwrap_or(path);
    if let Some((_, operation)) = OPERATIONS.iter().find(|(m, _)| *m == method) {
        return (*operation).to_owned();
    }
    let mut out = String::with_capacity(method.len() + 4);
    for (i, c) in method.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Methods the runtime answered `Unimplemented`, shared by a client and its clones.
pub(crate) type Unimplemented = Arc<Mutex<BTreeSet<String>>>;

/// The calls that get no timeout, as upstream's CRI client gives them none.
const UNBOUNDED: [&str; 2] = ["pull_image", "get_container_events"];

/// The channel, measured, with the per-call timeout.
#[derive(Clone, Debug)]
pub struct Instrumented {
    inner: Channel,
    unimplemented: Unimplemented,
    timeout: Option<Duration>,
}

impl Instrumented {
    pub(crate) fn new(inner: Channel, unimplemented: Unimplemented, timeout: Option<Duration>) -> Self {
        Instrumented { inner, unimplemented, timeout }
    }
}

/// The gRPC status code carried in the response headers (a trailers-only error), if any.
fn header_status(response: &Response<Body>) -> Option<i32> {
    response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .filter(|code| *code != 0)
}

impl tower::Service<Request<Body>> for Instrumented {
    type Response = Response<Body>;
    /// A transport error, or a [`tonic::Status`] `DeadlineExceeded` when the call timed out
    /// (the generated clients turn both into a `Status`).
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.inner, cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let operation = operation(request.uri().path());
        let unimplemented = self.unimplemented.clone();
        let timeout = self.timeout.filter(|_| !UNBOUNDED.contains(&operation.as_str()));
        let call = tower::Service::call(&mut self.inner, request);
        Box::pin(async move {
            let started = Instant::now();
            let result: Result<Response<Body>, Self::Error> = match timeout {
                None => call.await.map_err(Into::into),
                Some(timeout) => match tokio::time::timeout(timeout, call).await {
                    Ok(result) => result.map_err(Into::into),
                    Err(_) => Err(Box::new(tonic::Status::deadline_exceeded(format!(
                        "no answer within the request timeout ({timeout:?})"
                    )))),
                },
            };
            let label = operation.clone();
            metrics::counter!("kubelet_runtime_operations_total", "operation_type" => label.clone()).increment(1);
            metrics::histogram!("kubelet_runtime_operations_duration_seconds", "operation_type" => label.clone())
                .record(started.elapsed().as_secs_f64());
            let code = match &result {
                Err(err) if err.is::<tonic::Status>() => Some(tonic::Code::DeadlineExceeded as i32),
                Err(_) => Some(tonic::Code::Unavailable as i32),
                Ok(response) => header_status(response),
            };
            if let Some(code) = code {
                metrics::counter!("kubelet_runtime_operations_errors_total", "operation_type" => label).increment(1);
                if code == tonic::Code::Unimplemented as i32 {
                    let mut known = unimplemented.lock().unwrap_or_else(|p| p.into_inner());
                    if known.insert(operation.clone()) {
                        info!(operation = %operation, "the container runtime does not implement this CRI method; using fallbacks");
                    }
                }
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_carry_upstreams_names() {
        assert_eq!(operation("/runtime.v1.RuntimeService/ListPodSandbox"), "list_podsandbox");
        assert_eq!(operation("/runtime.v1.RuntimeService/RunPodSandbox"), "run_podsandbox");
        assert_eq!(operation("/runtime.v1.RuntimeService/UpdateContainerResources"), "update_container");
        assert_eq!(operation("/runtime.v1.RuntimeService/NewerMethod"), "newer_method");
        assert_eq!(operation("/runtime.v1.RuntimeService/Version"), "version");
        assert_eq!(operation("/runtime.v1.ImageService/PullImage"), "pull_image");
    }
}
