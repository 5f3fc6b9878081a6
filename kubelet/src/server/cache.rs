//! The expiring answer cache behind the TokenReview and SubjectAccessReview webhooks.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A small expiring map with hit/miss counters (upstream's webhook caches). Bounded: when it
/// holds [`TtlCache::MAX`] entries, expired ones are dropped, and if that is not enough, all.
pub struct TtlCache<K, V> {
    map: Mutex<HashMap<K, (V, Instant)>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<K, V> Default for TtlCache<K, V> {
    fn default() -> Self {
        TtlCache {
            map: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    pub const MAX: usize = 10_000;

    pub fn get(&self, k: &K) -> Option<V> {
        let now = Instant::now();
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(k) {
            Some((v, until)) if *until > now => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(v.clone())
            }
            _ => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// A zero TTL caches nothing.
    pub fn put(&self, k: K, v: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= Self::MAX {
            map.retain(|_, (_, until)| *until > now);
            if map.len() >= Self::MAX {
                map.clear();
            }
        }
        map.insert(k, (v, now + ttl));
    }

    /// (hits, misses).
    pub fn stats(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }
}
