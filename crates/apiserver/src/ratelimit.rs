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
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::{Instant, Sleep};

/// The bucket's arithmetic, without IO: how long a request taken now must wait for its token.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    /// Tokens at `at`; negative when requests hold reservations for tokens still to come.
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens (at least one), refilled at `qps` a second (at least one
    /// token every 1000 s).
    pub fn new(qps: f64, burst: u32, now: Instant) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket { qps: qps.max(0.001), burst, tokens: burst, at: now }
    }

    /// Takes one token and returns how long the request must wait before it is sent: zero while
    /// the bucket holds a token, otherwise until the refill reaches this request's token (as
    /// `golang.org/x/time/rate`'s `Reserve`).
    pub fn take(&mut self, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / self.qps) }
    }
}

/// A [`tower::Layer`] that sends requests through a [`TokenBucket`].
#[derive(Debug, Clone)]
pub struct TokenBucketLayer {
    qps: f64,
    burst: u32,
}

impl TokenBucketLayer {
    /// Requests at `qps` a second on average, in bursts of up to `burst`.
    pub fn new(qps: f64, burst: u32) -> TokenBucketLayer {
        TokenBucketLayer { qps, burst }
    }
}

impl<S> tower::Layer<S> for TokenBucketLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: TokenBucket::new(self.qps, self.burst, Instant::now()),
            wait: None,
            reserved: false,
        }
    }
}

/// A service whose requests each wait for a token of its bucket.
#[derive(Debug)]
pub struct RateLimited<S> {
    inner: S,
    bucket: TokenBucket,
    /// The wait for the reserved token, while it has not come.
    wait: Option<Pin<Box<Sleep>>>,
    /// Whether a token is reserved for the next call.
    reserved: bool,
}

impl<S, Request> tower::Service<Request> for RateLimited<S>
where
    S: tower::Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if !self.reserved {
            let now = Instant::now();
            let wait = self.bucket.take(now);
            self.reserved = true;
            if !wait.is_zero() {
                self.wait = Some(Box::pin(tokio::time::sleep_until(now + wait)));
            }
        }
        if let Some(wait) = self.wait.as_mut() {
            if wait.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.wait = None;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> S::Future {
        self.reserved = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use tower::{Layer, Service, ServiceExt};

    use super::*;

    #[test]
    fn a_full_bucket_lets_a_burst_through_then_holds_to_qps() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(50.0, 100, start);
        for _ in 0..100 {
            assert_eq!(bucket.take(start), Duration::ZERO);
        }
        // The 101st waits for one refill (20 ms), the 102nd for two.
        assert_eq!(bucket.take(start), Duration::from_millis(20));
        assert_eq!(bucket.take(start), Duration::from_millis(40));
    }

    #[test]
    fn a_quiet_client_earns_its_burst_back_and_no_more() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 5, start);
        for _ in 0..5 {
            bucket.take(start);
        }
        // One second refills 10 tokens, but the bucket holds 5.
        let later = start + Duration::from_secs(1);
        for _ in 0..5 {
            assert_eq!(bucket.take(later), Duration::ZERO);
        }
        assert_eq!(bucket.take(later), Duration::from_millis(100));
    }

    /// Unlike a fixed window, two bursts cannot go out together across a window's edge.
    #[test]
    fn no_window_edge_lets_two_bursts_through() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(1.0, 10, start);
        let just_before_edge = start + Duration::from_millis(9_999);
        let sent_at_once = (0..20).filter(|_| bucket.take(just_before_edge).is_zero()).count();
        assert_eq!(sent_at_once, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_wait_for_their_tokens() {
        let start = Instant::now();
        let echo = tower::service_fn(|n: u32| async move { Ok::<_, std::convert::Infallible>((n, Instant::now())) });
        let mut service = TokenBucketLayer::new(10.0, 3).layer(echo);
        let mut sent = Vec::new();
        for n in 0..6 {
            sent.push(service.ready().await.unwrap().call(n).await.unwrap().1 - start);
        }
        let ms: Vec<u128> = sent.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![0, 0, 0, 100, 200, 300]);
    }
}
