//! A token bucket, as client-go's `flowcontrol.NewTokenBucketRateLimiter`: `burst` tokens, full
//! at the start and refilled at `qps` tokens a second. The API clients wait for their tokens
//! (`kubeAPIQPS`); image pulls that find none fail (`registryPullQPS`, upstream's `TryAccept`).
//!
//! Unlike a fixed window, a client that has been quiet may send a whole burst at once, and a
//! busy one is held to `qps` on average with no window edge to let two bursts through together.

use std::time::Duration;

use tokio::time::Instant;

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
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / self.qps) }
    }

    /// Takes one token if the bucket holds one now, and says whether it did: nothing is
    /// reserved for later (as `golang.org/x/time/rate`'s `Allow`, client-go's `TryAccept`).
    pub fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now;
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn a_try_takes_a_token_only_when_one_is_there() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(5.0, 2, start);
        assert!(bucket.try_take(start) && bucket.try_take(start));
        assert!(!bucket.try_take(start), "the burst is spent");
        assert!(!bucket.try_take(start + Duration::from_millis(100)), "half a token");
        assert!(bucket.try_take(start + Duration::from_millis(200)), "one token refilled");
        assert!(!bucket.try_take(start + Duration::from_millis(200)), "a refused try reserves nothing");
    }
}
