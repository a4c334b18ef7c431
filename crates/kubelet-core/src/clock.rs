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

/// Parses Go's duration syntax: a sequence of decimal numbers with units `ns`, `us`, `µs`,
/// `ms`, `s`, `m`, `h` (`"1m0s"`, `"1.5h"`, `"300ms"`); `"0"` alone is zero.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("invalid duration {text:?}: expected a number and unit such as \"20s\" or \"1m0s\"");
    if text == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    if text.is_empty() || text.starts_with('-') {
        return Err(bad());
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds;
        rest = &rest[unit_end..];
    }
    std::time::Duration::try_from_secs_f64(total).map_err(|_| bad())
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
