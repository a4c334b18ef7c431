//! Metrics of every CRI call, with upstream kubelet names, and the record of what the runtime
//! does not implement.
//!
//! A tower service around the gRPC channel sees every call the generated clients make, so no
//! call site can forget to be measured: `kubelet_runtime_operations_total`,
//! `kubelet_runtime_operations_errors_total` and `kubelet_runtime_operations_duration_seconds`,
//! labelled by `operation_type` (the CRI method in snake case, e.g. `list_pod_sandbox`).

use std::{
    collections::BTreeSet,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use tokio::time::Instant;
use tonic::{
    body::Body,
    codegen::http::{Request, Response},
    transport::Channel,
};
use tracing::info;

/// The CRI method of a gRPC path (`/runtime.v1.RuntimeService/ListPodSandbox`), in snake case.
pub(crate) fn operation(path: &str) -> String {
    let method = path.rsplit('/').next().unwrap_or(path);
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

/// The channel, measured.
#[derive(Clone, Debug)]
pub struct Instrumented {
    inner: Channel,
    unimplemented: Unimplemented,
}

impl Instrumented {
    pub(crate) fn new(inner: Channel, unimplemented: Unimplemented) -> Self {
        Instrumented { inner, unimplemented }
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
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, tonic::transport::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let operation = operation(request.uri().path());
        let unimplemented = self.unimplemented.clone();
        let call = tower::Service::call(&mut self.inner, request);
        Box::pin(async move {
            let started = Instant::now();
            let result = call.await;
            let label = operation.clone();
            metrics::counter!("kubelet_runtime_operations_total", "operation_type" => label.clone()).increment(1);
            metrics::histogram!("kubelet_runtime_operations_duration_seconds", "operation_type" => label.clone())
                .record(started.elapsed().as_secs_f64());
            let code = match &result {
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
    fn operations_are_snake_case_method_names() {
        assert_eq!(operation("/runtime.v1.RuntimeService/ListPodSandbox"), "list_pod_sandbox");
        assert_eq!(operation("/runtime.v1.RuntimeService/Version"), "version");
        assert_eq!(operation("/runtime.v1.ImageService/PullImage"), "pull_image");
    }
}
