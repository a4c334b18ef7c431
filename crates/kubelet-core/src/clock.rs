//! Wall-clock time, and its bridge to tokio time.
//!
//! Timers, timeouts and backoffs use `tokio::time` so tests run with paused time; wall-clock
//! readings only label statuses and events, and runtime timestamps (a container's finish time, an
//! event's creation time) are brought onto the tokio clock with [`instant_of`].

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// The wall-clock time now, as the timestamps the API and the runtime use.
pub fn wall_now() -> Timestamp {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX);
    let nanos = i32::try_from(since_epoch.subsec_nanos()).unwrap_or(0);
    Timestamp::new(secs, nanos).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// The tokio instant of a past wall-clock time (now, for times in the future).
pub fn instant_of(at: Timestamp) -> Instant {
    let ago = wall_now().duration_since(at);
    let ago = std::time::Duration::try_from(ago).unwrap_or_default();
    let now = Instant::now();
    now.checked_sub(ago).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_of_a_past_time_is_that_long_ago() {
        let at = wall_now() - k8s_openapi::jiff::SignedDuration::from_secs(5);
        let ago = Instant::now() - instant_of(at);
        assert!(ago >= std::time::Duration::from_millis(4900) && ago < std::time::Duration::from_secs(6), "{ago:?}");
        let future = wall_now() + k8s_openapi::jiff::SignedDuration::from_secs(60);
        assert!(instant_of(future) <= Instant::now());
    }
}
