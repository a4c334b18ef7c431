//! A bounded map whose entries expire: the token and access review answers.

use std::{collections::HashMap, hash::Hash, sync::Mutex, time::Duration};

use tokio::time::Instant;

/// At most `capacity` answers, each kept until its own time to live ends. Expired entries go
/// when the map is full; nothing runs in the background.
pub(crate) struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
    capacity: usize,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    pub(crate) fn new(capacity: usize) -> Self {
        TtlCache { entries: Mutex::new(HashMap::new()), capacity }
    }

    /// The answer for `key`, while it lives.
    pub(crate) fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.get(key).filter(|(_, until)| Instant::now() < *until).map(|(value, _)| value.clone())
    }

    /// Keeps `value` for `ttl` (a zero TTL keeps nothing, as upstream's).
    pub(crate) fn insert(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.len() >= self.capacity {
            entries.retain(|_, (_, until)| now < *until);
        }
        if entries.len() >= self.capacity {
            entries.clear();
        }
        entries.insert(key, (value, now + ttl));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn answers_expire_and_a_full_cache_makes_room() {
        let cache = TtlCache::new(2);
        cache.insert("a".to_owned(), 1, Duration::from_secs(10));
        cache.insert("b".to_owned(), 2, Duration::from_secs(1));
        cache.insert("z".to_owned(), 0, Duration::ZERO);
        assert_eq!((cache.get("a"), cache.get("b"), cache.get("z")), (Some(1), Some(2), None));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(cache.get("b"), None, "expired");
        cache.insert("c".to_owned(), 3, Duration::from_secs(10));
        assert_eq!((cache.get("a"), cache.get("c")), (Some(1), Some(3)), "the expired entry made room");
        cache.insert("d".to_owned(), 4, Duration::from_secs(10));
        assert_eq!(cache.get("d"), Some(4), "a full cache of live entries starts over");
    }
}
