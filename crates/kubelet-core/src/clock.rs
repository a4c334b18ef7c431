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

/// Writes a duration as Go's `Duration.String` does (`"1m0s"`, `"1h30m0s"`, `"500ms"`, `"0s"`), so
/// what is read back with [`parse_duration`] looks as upstream writes it.
pub fn format_duration(duration: std::time::Duration) -> String {
    const NANOS_PER_SECOND: u128 = 1_000_000_000;
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < NANOS_PER_SECOND {
        let (unit, scale) = if nanos < 1_000 {
            ("ns", 1)
        } else if nanos < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", decimal(nanos, scale));
    }
    let whole_seconds = duration.as_secs();
    let hours = whole_seconds / 3600;
    let minutes = whole_seconds % 3600 / 60;
    let seconds = decimal(
        u128::from(whole_seconds % 60) * NANOS_PER_SECOND + u128::from(duration.subsec_nanos()),
        NANOS_PER_SECOND,
    );
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, _) => format!("{minutes}m{seconds}s"),
        _ => format!("{hours}h{minutes}m{seconds}s"),
    }
}

/// `value / scale` in decimal, without trailing zeros after the point (`scale` a power of ten).
fn decimal(value: u128, scale: u128) -> String {
    let whole = value / scale;
    let fraction = value % scale;
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = scale.ilog10() as usize;
    format!("{whole}.{}", format!("{fraction:0digits$}").trim_end_matches('0'))
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

    #[test]
    fn durations_are_written_as_go_writes_them_and_read_back() {
        use std::time::Duration;
        for (duration, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::from_nanos(1500), "1.5µs"),
            (Duration::from_millis(100), "100ms"),
            (Duration::from_micros(2250), "2.25ms"),
            (Duration::from_secs(20), "20s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(300), "5m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_secs(5430), "1h30m30s"),
        ] {
            assert_eq!(format_duration(duration), text);
            assert_eq!(parse_duration(text), Ok(duration), "{text}");
        }
    }
}
