//! The pod status cache the PLEG writes and the pod workers read (upstream `kubecontainer.Cache`).
//!
//! Every entry carries the time its status was observed; a global timestamp says that every
//! entry, present or absent, is at least that fresh (the PLEG bumps it after each relist).
//! [`Cache::get_newer_than`] is the pod workers' barrier: it waits until the cache holds a status
//! of the pod observed after a given time, so a worker never acts on runtime state older than its
//! own last sync.

use std::{collections::HashMap, error::Error as StdError, sync::Arc, sync::Mutex};

use tokio::{sync::oneshot, time::Instant};

use crate::{PodUid, runtime::PodStatus, util::lock};

/// An error recorded for a pod whose status could not be read.
pub type StatusError = Arc<dyn StdError + Send + Sync>;

/// What the cache holds for one pod: its status and, if the last inspection failed, the error.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CachedStatus {
    /// The status (empty when the cache knows nothing of the pod).
    pub status: Arc<PodStatus>,
    /// The error of the last inspection, if it failed.
    pub error: Option<StatusError>,
}

#[derive(Clone, Debug)]
struct Entry {
    cached: CachedStatus,
    modified: Instant,
}

struct Subscriber {
    min_time: Option<Instant>,
    tx: oneshot::Sender<CachedStatus>,
}

#[derive(Default)]
struct Inner {
    pods: HashMap<PodUid, Entry>,
    /// Moves whenever a pod's entry is stored or forgotten (not when only the timestamp moves).
    generation: u64,
    timestamp: Option<Instant>,
    subscribers: HashMap<PodUid, Vec<Subscriber>>,
}

/// A thread-safe pod status cache with a "newer than" barrier.
#[derive(Default)]
pub struct Cache {
    inner: Mutex<Inner>,
    refresh: tokio::sync::Notify,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = lock(&self.inner);
        f.debug_struct("Cache").field("pods", &inner.pods.len()).field("timestamp", &inner.timestamp).finish()
    }
}

impl Cache {
    /// An empty cache.
    pub fn new() -> Self {
        Cache::default()
    }

    /// The cached status of `uid`, or an empty status when there is none.
    pub fn get(&self, uid: &PodUid) -> CachedStatus {
        lock(&self.inner).get(uid)
    }

    /// Waits until the cache holds a status of `uid` newer than `min_time`, or the global
    /// timestamp passes `min_time`, and returns it.
    ///
    /// `None` is upstream's zero time: any entry of the pod, or any global timestamp, will do;
    /// before the first relist it waits.
    ///
    /// A caller that has to wait also asks for a refresh ([`request_refresh`](Self::request_refresh)),
    /// so it waits for one relist, not for the PLEG's period (upstream waits for the next
    /// periodic relist, up to a second; with change hints the period is minutes).
    pub async fn get_newer_than(&self, uid: &PodUid, min_time: Option<Instant>) -> CachedStatus {
        let rx = {
            let mut inner = lock(&self.inner);
            if let Some(found) = inner.get_if_newer_than(uid, min_time) {
                return found;
            }
            let (tx, rx) = oneshot::channel();
            let list = inner.subscribers.entry(uid.clone()).or_default();
            list.retain(|s| !s.tx.is_closed());
            list.push(Subscriber { min_time, tx });
            rx
        };
        self.request_refresh();
        match rx.await {
            Ok(found) => found,
            // The cache was dropped while waiting: nothing newer will ever come.
            Err(_) => self.get(uid),
        }
    }

    /// Stores the status of `uid` observed at `timestamp`, unless the cache already holds a
    /// newer one; returns whether it was stored.
    pub fn set(&self, uid: &PodUid, status: PodStatus, error: Option<StatusError>, timestamp: Instant) -> bool {
        let mut inner = lock(&self.inner);
        if inner.pods.get(uid).is_some_and(|e| e.modified > timestamp) {
            return false;
        }
        let cached = CachedStatus { status: Arc::new(status), error };
        inner.pods.insert(uid.clone(), Entry { cached, modified: timestamp });
        inner.generation += 1;
        inner.notify(uid, timestamp);
        true
    }

    /// Every cached pod with its status: what the runtime held at the last look (for
    /// housekeeping, which finds orphans here rather than asking the runtime).
    pub fn pods(&self) -> Vec<(PodUid, CachedStatus)> {
        lock(&self.inner).pods.iter().map(|(uid, entry)| (uid.clone(), entry.cached.clone())).collect()
    }

    /// Forgets `uid`.
    pub fn delete(&self, uid: &PodUid) {
        let mut inner = lock(&self.inner);
        if inner.pods.remove(uid).is_some() {
            inner.generation += 1;
        }
    }

    /// A number that moves whenever a pod's entry is stored or forgotten, and only then (not
    /// when a relist finds nothing changed and moves the timestamp alone): housekeeping walks
    /// the pods again only when something it reads moved.
    pub fn generation(&self) -> u64 {
        lock(&self.inner).generation
    }

    /// Declares every entry at least as fresh as `timestamp` and wakes the waiters it satisfies.
    pub fn update_time(&self, timestamp: Instant) {
        let mut inner = lock(&self.inner);
        inner.timestamp = Some(timestamp);
        let uids: Vec<PodUid> = inner.subscribers.keys().cloned().collect();
        for uid in uids {
            inner.notify(&uid, timestamp);
        }
    }

    /// Asks whoever fills the cache (the PLEG) for a fresh look at the runtime now, rather than
    /// at its next period: a pod worker calls it when the runtime has just changed (a pod was
    /// stopped), and [`get_newer_than`](Self::get_newer_than) when it has to wait.
    pub fn request_refresh(&self) {
        self.refresh.notify_one();
    }

    /// Completes once a refresh was requested since the last call (for the PLEG's loop).
    pub async fn refresh_requested(&self) {
        self.refresh.notified().await;
    }

    /// The global timestamp, if set.
    pub fn timestamp(&self) -> Option<Instant> {
        lock(&self.inner).timestamp
    }

    /// The number of pods with an entry.
    pub fn len(&self) -> usize {
        lock(&self.inner).pods.len()
    }

    /// Whether no pod has an entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of waiters still registered (for leak checks).
    pub fn waiters(&self) -> usize {
        lock(&self.inner).subscribers.values().map(Vec::len).sum()
    }
}

impl Inner {
    fn get(&self, uid: &PodUid) -> CachedStatus {
        match self.pods.get(uid) {
            Some(entry) => entry.cached.clone(),
            None => CachedStatus { status: Arc::new(PodStatus::new(uid.clone(), "", "")), error: None },
        }
    }

    fn get_if_newer_than(&self, uid: &PodUid, min_time: Option<Instant>) -> Option<CachedStatus> {
        let newer = |t: Instant| min_time.is_none_or(|min| t > min);
        let global_newer = self.timestamp.is_some_and(newer);
        match self.pods.get(uid) {
            None if global_newer => Some(self.get(uid)),
            Some(entry) if newer(entry.modified) || global_newer => Some(entry.cached.clone()),
            _ => None,
        }
    }

    fn notify(&mut self, uid: &PodUid, timestamp: Instant) {
        let Some(list) = self.subscribers.remove(uid) else { return };
        let mut waiting = Vec::new();
        for sub in list {
            if sub.tx.is_closed() {
                continue;
            }
            if sub.min_time.is_some_and(|min| timestamp < min) {
                waiting.push(sub);
            } else {
                // A send fails only if the waiter went away meanwhile; nothing to do then.
                let _ = sub.tx.send(self.get(uid));
            }
        }
        if !waiting.is_empty() {
            self.subscribers.insert(uid.clone(), waiting);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn status(uid: &PodUid, ip: &str) -> PodStatus {
        let mut s = PodStatus::new(uid.clone(), "p", "ns");
        s.ips = vec![ip.to_owned()];
        s
    }

    #[tokio::test(start_paused = true)]
    async fn get_returns_empty_status_for_unknown_pod() {
        let cache = Cache::new();
        let uid = PodUid::new("a");
        let got = cache.get(&uid);
        assert_eq!(got.status.uid, uid);
        assert!(got.status.ips.is_empty());
        assert!(got.error.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_generation_moves_when_an_entry_is_stored_or_forgotten_and_only_then() {
        let cache = Cache::new();
        let uid = PodUid::new("a");
        let t0 = Instant::now();
        let start = cache.generation();
        assert!(cache.set(&uid, status(&uid, "10.0.0.2"), None, t0 + Duration::from_secs(2)));
        let stored = cache.generation();
        assert_ne!(stored, start);
        assert!(!cache.set(&uid, status(&uid, "10.0.0.3"), None, t0));
        cache.update_time(t0 + Duration::from_secs(3));
        assert_eq!(cache.generation(), stored, "an older status and a relist that found nothing move nothing");
        cache.delete(&uid);
        let forgotten = cache.generation();
        assert_ne!(forgotten, stored);
        cache.delete(&uid);
        assert_eq!(cache.generation(), forgotten, "forgetting what is gone moves nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn set_keeps_newer_entry() {
        let cache = Cache::new();
        let uid = PodUid::new("a");
        let t0 = Instant::now();
        assert!(cache.set(&uid, status(&uid, "10.0.0.2"), None, t0 + Duration::from_secs(2)));
        assert!(!cache.set(&uid, status(&uid, "10.0.0.1"), None, t0 + Duration::from_secs(1)));
        assert_eq!(cache.get(&uid).status.ips, ["10.0.0.2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn barrier_returns_at_once_when_entry_is_newer() {
        let cache = Cache::new();
        let uid = PodUid::new("a");
        let t0 = Instant::now();
        cache.set(&uid, status(&uid, "10.0.0.1"), None, t0 + Duration::from_millis(5));
        let got = cache.get_newer_than(&uid, Some(t0)).await;
        assert_eq!(got.status.ips, ["10.0.0.1"]);
    }

    #[tokio::test(start_paused = true)]
    async fn barrier_waits_for_a_newer_set() {
        let cache = Arc::new(Cache::new());
        let uid = PodUid::new("a");
        let t0 = Instant::now();
        cache.set(&uid, status(&uid, "old"), None, t0);
        let waiter = tokio::spawn({
            let (cache, uid) = (cache.clone(), uid.clone());
            async move { cache.get_newer_than(&uid, Some(t0)).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "an entry exactly at min_time is not newer");
        assert_eq!(cache.waiters(), 1);
        // A set for another pod does not wake it.
        cache.set(&PodUid::new("b"), status(&PodUid::new("b"), "x"), None, t0 + Duration::from_secs(1));
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        cache.set(&uid, status(&uid, "new"), None, t0 + Duration::from_secs(1));
        let got = waiter.await.unwrap();
        assert_eq!(got.status.ips, ["new"]);
        assert_eq!(cache.waiters(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn barrier_released_by_global_timestamp_even_without_entry() {
        let cache = Arc::new(Cache::new());
        let uid = PodUid::new("gone");
        let t0 = Instant::now();
        let waiter = tokio::spawn({
            let (cache, uid) = (cache.clone(), uid.clone());
            async move { cache.get_newer_than(&uid, Some(t0 + Duration::from_secs(1))).await }
        });
        tokio::task::yield_now().await;
        cache.update_time(t0 + Duration::from_millis(500));
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a global time before min_time does not release");
        cache.update_time(t0 + Duration::from_secs(2));
        let got = waiter.await.unwrap();
        assert_eq!(got.status.uid, uid);
        assert!(got.status.sandbox_statuses.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn barrier_returns_error_recorded_with_status() {
        let cache = Cache::new();
        let uid = PodUid::new("a");
        let err: StatusError = Arc::new(std::io::Error::other("inspect timed out"));
        let t0 = Instant::now();
        cache.set(&uid, status(&uid, "1"), Some(err), t0 + Duration::from_secs(1));
        let got = cache.get_newer_than(&uid, Some(t0)).await;
        assert_eq!(got.error.unwrap().to_string(), "inspect timed out");
    }

    #[tokio::test(start_paused = true)]
    async fn zero_time_waits_for_the_first_relist_only() {
        let cache = Arc::new(Cache::new());
        let uid = PodUid::new("a");
        let waiter = tokio::spawn({
            let (cache, uid) = (cache.clone(), uid.clone());
            async move { cache.get_newer_than(&uid, None).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "nothing is known before the first relist");
        cache.update_time(Instant::now());
        assert_eq!(waiter.await.unwrap().status.uid, uid);
        // Once anything is known, zero time returns at once.
        cache.get_newer_than(&PodUid::new("b"), None).await;
    }

    #[tokio::test(start_paused = true)]
    async fn abandoned_waiters_are_pruned() {
        let cache = Cache::new();
        let uid = PodUid::new("a");
        let t0 = Instant::now();
        for _ in 0..3 {
            let fut = cache.get_newer_than(&uid, Some(t0));
            // Poll once so it registers, then drop it (a cancelled worker).
            let _ = tokio::time::timeout(Duration::from_millis(1), fut).await;
        }
        cache.update_time(t0 + Duration::from_secs(1));
        assert_eq!(cache.waiters(), 0);
        cache.delete(&uid);
        assert!(cache.is_empty());
    }
}
