//! Retrying what the API server asks to have retried, as client-go's `rest.Request` does: an
//! answer 429, or 500 and above, that carries `Retry-After` in whole seconds is sent again after
//! that many seconds, up to [`MAX_RETRIES`] times. Every other answer goes to the caller at once.
//!
//! kube's own retry is turned off for the agent's clients: it retries 429, 503 and 504 whether or
//! not the server asked, with an exponential back-off that reaches minutes, so one request to an
//! API server that is away would hold its caller (a status patch, a heartbeat) far longer than
//! the agent's own loops wait before they try again.

use std::time::Duration;

use http::{HeaderMap, Request, Response, StatusCode};
use kube::client::Body;
use tower::{BoxError, buffer::Buffer, retry::Policy, retry::Retry};

/// How many times one request is sent again (client-go's `maxRetries`).
pub const MAX_RETRIES: u32 = 10;

/// How long the server asked the client to wait before sending `status`'s request again; `None`
/// when the answer is not one to retry.
pub fn retry_after(status: StatusCode, headers: &HeaderMap) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let seconds: u64 = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds))
}

/// The [`tower::retry::Policy`] of [`retry_after`]: at most [`MAX_RETRIES`] retries per request.
#[derive(Debug, Clone)]
pub struct RetryAfterPolicy {
    retries_left: u32,
}

impl Default for RetryAfterPolicy {
    fn default() -> Self {
        RetryAfterPolicy { retries_left: MAX_RETRIES }
    }
}

impl<B> Policy<Request<Body>, Response<B>, BoxError> for RetryAfterPolicy {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _request: &mut Request<Body>,
        result: &mut Result<Response<B>, BoxError>,
    ) -> Option<tokio::time::Sleep> {
        let response = result.as_ref().ok()?;
        let wait = retry_after(response.status(), response.headers())?;
        self.retries_left = self.retries_left.checked_sub(1)?;
        tracing::debug!(status = %response.status(), ?wait, "the API server asked for a retry");
        Some(tokio::time::sleep(wait))
    }

    fn clone_request(&mut self, request: &Request<Body>) -> Option<Request<Body>> {
        // A body kube sends whole can be sent again; a streamed one cannot, and is not retried.
        let body = request.body().try_clone()?;
        let mut copy = Request::new(body);
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

/// A [`tower::Layer`] that retries as [`RetryAfterPolicy`] says. The service below is put behind
/// a [`Buffer`] so that each retry can call it again (kube's stack is one boxed service).
#[derive(Debug, Clone, Default)]
pub struct RetryAfterLayer;

/// How many requests may wait for the buffered service: as kube's own buffer.
const BUFFERED_REQUESTS: usize = 1024;

impl<S, B> tower::Layer<S> for RetryAfterLayer
where
    S: tower::Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + Sync,
    B: Send + 'static,
{
    type Service = Retry<RetryAfterPolicy, Buffer<Request<Body>, S::Future>>;

    /// Must be called within a tokio runtime: the buffer spawns its worker.
    fn layer(&self, inner: S) -> Self::Service {
        Retry::new(RetryAfterPolicy::default(), Buffer::new(inner, BUFFERED_REQUESTS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(retry_after: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, retry_after.parse().unwrap());
        headers
    }

    #[test]
    fn only_a_429_or_5xx_with_whole_seconds_is_retried() {
        let two = Some(Duration::from_secs(2));
        assert_eq!(retry_after(StatusCode::TOO_MANY_REQUESTS, &headers("2")), two);
        assert_eq!(retry_after(StatusCode::INTERNAL_SERVER_ERROR, &headers("2")), two);
        assert_eq!(retry_after(StatusCode::SERVICE_UNAVAILABLE, &headers(" 2 ")), two);
        assert_eq!(retry_after(StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new()), None, "the server did not ask");
        assert_eq!(retry_after(StatusCode::CONFLICT, &headers("2")), None);
        assert_eq!(retry_after(StatusCode::TOO_MANY_REQUESTS, &headers("soon")), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_is_retried_at_most_ten_times() {
        let mut policy = RetryAfterPolicy::default();
        let mut request = Request::new(Body::empty());
        for _ in 0..MAX_RETRIES {
            let mut answer: Result<Response<()>, BoxError> =
                Ok(Response::builder().status(429).header("Retry-After", "1").body(()).unwrap());
            assert!(policy.retry(&mut request, &mut answer).is_some());
        }
        let mut answer: Result<Response<()>, BoxError> =
            Ok(Response::builder().status(429).header("Retry-After", "1").body(()).unwrap());
        assert!(policy.retry(&mut request, &mut answer).is_none(), "the eleventh answer is the caller's");
    }
}
