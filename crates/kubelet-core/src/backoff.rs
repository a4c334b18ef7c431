//! Exponential backoff keyed by string (upstream client-go `flowcontrol.Backoff`).
//!
//! The kubelet keeps two: the crash-loop backoff (key: pod and container identity plus the
//! container hash) and the image-pull backoff (key: `<podUID>_<image>`), both 10 s doubling to
//! 300 s.
//! An entry that saw no new event for twice the maximum is forgotten, both when it is read and by
//! [`Backoff::gc`].
//! Time is `tokio::time::Instant`, so tests drive it with paused time.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use tokio::time::Instant;

use crate::util::lock;

/// Upstream's initial crash-loop and image-pull backoff.
pub const DEFAULT_INITIAL: Duration = Duration::from_secs(10);
/// Upstream's maximum crash-loop and image-pull backoff.
pub const DEFAULT_MAX: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug)]
struct Entry {
    backoff: Duration,
    last_update: Instant,
}

/// A thread-safe table of per-key exponential backoffs.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: Mutex<HashMap<String, Entry>>,
}

impl Default for Backoff {
    /// Upstream's container and image backoff: 10 s doubling to 300 s.
    fn default() -> Self {
        Backoff::new(DEFAULT_INITIAL, DEFAULT_MAX)
    }
}

impl Backoff {
    /// A backoff that starts at `initial` and doubles up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max, entries: Mutex::new(HashMap::new()) }
    }

    /// The current backoff of `key` (zero when it has none).
    pub fn get(&self, key: &str) -> Duration {
        lock(&self.entries).get(key).map_or(Duration::ZERO, |e| e.backoff)
    }

    /// Records an event for `key` at `now`: starts at the initial backoff, or doubles the current
    /// one up to the maximum; an entry idle for more than twice the maximum starts over.
    pub fn next(&self, key: &str, now: Instant) {
        let mut entries = lock(&self.entries);
        let backoff = match entries.get(key) {
            Some(e) if !self.has_expired(now, e.last_update) => (e.backoff * 2).min(self.max),
            _ => self.initial.min(self.max),
        };
        entries.insert(key.to_owned(), Entry { backoff, last_update: now });
    }

    /// Forgets `key`.
    pub fn reset(&self, key: &str) {
        lock(&self.entries).remove(key);
    }

    /// Whether `now` is still within the backoff that began at `event_time` (for example a
    /// container's finish time): upstream's `IsInBackOffSince`.
    pub fn is_in_backoff_since(&self, key: &str, event_time: Instant, now: Instant) -> bool {
        let entries = lock(&self.entries);
        let Some(entry) = entries.get(key) else { return false };
        if self.has_expired(now, entry.last_update) {
            return false;
        }
        now.saturating_duration_since(event_time) < entry.backoff
    }

    /// Whether `now` is still within the backoff counted from the key's last update: upstream's
    /// `IsInBackOffSinceUpdate`.
    pub fn is_in_backoff_since_update(&self, key: &str, now: Instant) -> bool {
        let entries = lock(&self.entries);
        let Some(entry) = entries.get(key) else { return false };
        if self.has_expired(now, entry.last_update) {
            return false;
        }
        now.saturating_duration_since(entry.last_update) < entry.backoff
    }

    /// How long `key` stays in the backoff counted from its last update (zero when it is not in
    /// one): when a sync held back by it should run again.
    pub fn remaining_since_update(&self, key: &str, now: Instant) -> Duration {
        let entries = lock(&self.entries);
        let Some(entry) = entries.get(key) else { return Duration::ZERO };
        if self.has_expired(now, entry.last_update) {
            return Duration::ZERO;
        }
        entry.backoff.saturating_sub(now.saturating_duration_since(entry.last_update))
    }

    /// Removes every entry idle for more than twice the maximum.
    pub fn gc(&self, now: Instant) {
        lock(&self.entries).retain(|_, e| !self.has_expired(now, e.last_update));
    }

    /// The number of keys with an entry.
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    /// Whether no key has an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn has_expired(&self, now: Instant, last_update: Instant) -> bool {
        now.saturating_duration_since(last_update) > self.max * 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[tokio::test(start_paused = true)]
    async fn doubles_from_initial_to_max() {
        let b = Backoff::default();
        assert_eq!(b.get("k"), Duration::ZERO);
        let mut seen = Vec::new();
        for _ in 0..8 {
            b.next("k", Instant::now());
            seen.push(b.get("k").as_secs());
            tokio::time::advance(S(1)).await;
        }
        assert_eq!(seen, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn keys_are_independent() {
        let b = Backoff::default();
        b.next("a", Instant::now());
        b.next("a", Instant::now());
        b.next("b", Instant::now());
        assert_eq!(b.get("a"), S(20));
        assert_eq!(b.get("b"), S(10));
    }

    #[tokio::test(start_paused = true)]
    async fn in_backoff_since_event_until_backoff_elapses() {
        let b = Backoff::default();
        let finished = Instant::now();
        b.next("k", finished);
        tokio::time::advance(S(9)).await;
        assert!(b.is_in_backoff_since("k", finished, Instant::now()));
        tokio::time::advance(S(2)).await;
        assert!(!b.is_in_backoff_since("k", finished, Instant::now()));
        assert!(!b.is_in_backoff_since("unknown", finished, Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn in_backoff_since_update() {
        let b = Backoff::default();
        b.next("k", Instant::now());
        b.next("k", Instant::now());
        assert_eq!(b.remaining_since_update("k", Instant::now()), S(20));
        tokio::time::advance(S(19)).await;
        assert!(b.is_in_backoff_since_update("k", Instant::now()));
        assert_eq!(b.remaining_since_update("k", Instant::now()), S(1));
        tokio::time::advance(S(2)).await;
        assert!(!b.is_in_backoff_since_update("k", Instant::now()));
        assert_eq!(b.remaining_since_update("k", Instant::now()), Duration::ZERO);
        assert_eq!(b.remaining_since_update("unknown", Instant::now()), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn resets_after_twice_max_without_events() {
        let b = Backoff::default();
        for _ in 0..4 {
            b.next("k", Instant::now());
        }
        assert_eq!(b.get("k"), S(80));
        // Exactly twice the maximum is not yet expired; one second more is.
        tokio::time::advance(S(600)).await;
        b.next("k", Instant::now());
        assert_eq!(b.get("k"), S(160));
        tokio::time::advance(S(601)).await;
        assert!(!b.is_in_backoff_since("k", Instant::now(), Instant::now()));
        b.next("k", Instant::now());
        assert_eq!(b.get("k"), S(10), "an expired entry starts over");
    }

    #[tokio::test(start_paused = true)]
    async fn gc_removes_only_expired_entries() {
        let b = Backoff::default();
        b.next("old", Instant::now());
        tokio::time::advance(S(500)).await;
        b.next("young", Instant::now());
        tokio::time::advance(S(101)).await;
        b.gc(Instant::now());
        assert_eq!(b.get("old"), Duration::ZERO);
        assert_eq!(b.get("young"), S(10));
        assert_eq!(b.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn reset_forgets_key() {
        let b = Backoff::default();
        b.next("k", Instant::now());
        b.reset("k");
        assert!(b.is_empty());
        assert!(!b.is_in_backoff_since_update("k", Instant::now()));
    }
}
