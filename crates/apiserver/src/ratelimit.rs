//! The client-side rate limit of requests to the API server, as client-go's
//! (`flowcontrol.NewTokenBucketRateLimiter`, `kubeAPIQPS` and `kubeAPIBurst`): a bucket of
//! `burst` tokens, full at the start and refilled at `qps` tokens a second; each request takes
//! one, and waits for it when the bucket is empty.
//!
//! Unlike a fixed window, a client that has been quiet may send a whole burst at once, and a
//! busy one is held to `qps` on average with no window edge to let two bursts through together.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::Request;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::client_metrics::RequestLabels;

pub use kubelet_core::ratelimit::TokenBucket;

/// A [`tower::Layer`] that sends requests through a [`TokenBucket`], recording each request's
/// wait for its token (client-go's `rest_client_rate_limiter_duration_seconds`).
#[derive(Debug, Clone)]
pub struct TokenBucketLayer {
    qps: f64,
    burst: u32,
    host: Arc<str>,
}

impl TokenBucketLayer {
    /// Requests to the API server at `host` ([`crate::client_metrics::host_label`]) at `qps` a
    /// second on average, in bursts of up to `burst`.
    pub fn new(qps: f64, burst: u32, host: Arc<str>) -> TokenBucketLayer {
        TokenBucketLayer { qps, burst, host }
    }
}

impl<S> tower::Layer<S> for TokenBucketLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited { inner, bucket: TokenBucket::new(self.qps, self.burst, Instant::now()), host: self.host.clone() }
    }
}

/// A service whose requests each wait for a token of its bucket.
///
/// A request takes its token when it is called and waits for it in its own future, as each of
/// client-go's callers waits in its own goroutine: the service is always ready, and a request's
/// recorded wait is the whole of it, however many requests came before it.
#[derive(Debug)]
pub struct RateLimited<S> {
    inner: S,
    bucket: TokenBucket,
    host: Arc<str>,
}

impl<S, Body> tower::Service<Request<Body>> for RateLimited<S>
where
    S: tower::Service<Request<Body>> + Clone + Send + 'static,
    S::Future: Send,
    Body: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // The inner service's readiness is waited for in each request's future.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let taken = Instant::now();
        let token_comes = taken + self.bucket.take(taken);
        let labels = RequestLabels::of(&request, &self.host);
        let inner = self.inner.clone();
        Box::pin(async move {
            if token_comes > taken {
                tokio::time::sleep_until(token_comes).await;
            }
            labels.record_rate_limiter_wait(taken.elapsed());
            inner.oneshot(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tower::{Layer, Service, ServiceExt};

    use super::*;

    fn echo_when_sent()
    -> impl tower::Service<Request<u32>, Response = (u32, Instant), Error = std::convert::Infallible, Future = impl Send>
    + Clone
    + Send
    + 'static {
        tower::service_fn(|request: Request<u32>| async move { Ok((*request.body(), Instant::now())) })
    }

    #[tokio::test(start_paused = true)]
    async fn requests_wait_for_their_tokens() {
        let start = Instant::now();
        let mut service = TokenBucketLayer::new(10.0, 3, Arc::from("h:1")).layer(echo_when_sent());
        let mut sent = Vec::new();
        for n in 0..6 {
            sent.push(service.ready().await.unwrap().call(Request::new(n)).await.unwrap().1 - start);
        }
        let ms: Vec<u128> = sent.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![0, 0, 0, 100, 200, 300]);
    }

    /// Requests sent together each wait in their own future, and each records its whole wait.
    #[test]
    fn requests_sent_together_record_their_whole_waits() {
        let rendered = crate::client_metrics::tests::recorded(|| async {
            let start = Instant::now();
            let mut service = TokenBucketLayer::new(10.0, 3, Arc::from("h:1")).layer(echo_when_sent());
            let answers: Vec<_> = (0..6).map(|n| service.call(Request::patch("/").body(n).unwrap())).collect();
            let sent: Vec<u128> = futures::future::join_all(answers)
                .await
                .into_iter()
                .map(|a| (a.unwrap().1 - start).as_millis())
                .collect();
            assert_eq!(sent, vec![0, 0, 0, 100, 200, 300]);
        });
        let value = |series: &str| crate::client_metrics::tests::value(&rendered, series);
        assert_eq!(value("rest_client_rate_limiter_duration_seconds_count{verb=\"PATCH\",host=\"h:1\"}"), 6.0);
        let waited = value("rest_client_rate_limiter_duration_seconds_sum{verb=\"PATCH\",host=\"h:1\"}");
        assert!((waited - 0.6).abs() < 1e-9, "0.1 + 0.2 + 0.3 s: {waited}");
    }
}
