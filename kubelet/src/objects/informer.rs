//! A list+watch cache of every object of one kind (upstream's shared informer + lister, as
//! the kubelet keeps them for Services and RuntimeClasses): each object is reduced to the
//! few fields the kubelet reads, keyed by `namespace/name` (or `name` when cluster-scoped).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio_util::sync::CancellationToken;

use super::client::{ClientHandle, WATCH_TIMEOUT_SECS};

/// The cache: filled by [`run`], read by anyone.
#[derive(Debug)]
pub struct Store<T> {
    items: RwLock<HashMap<String, T>>,
    synced: AtomicBool,
    /// Bumped on every change, for readers that react to them ([`Store::subscribe`]).
    changes: tokio::sync::watch::Sender<u64>,
    /// Which keys changed, for readers that follow changes one by one
    /// ([`Store::changed_since`]); only in a store made by [`Store::with_journal`].
    journal: Option<Mutex<Journal>>,
}

/// The last changes to a store, oldest first: a key applied or deleted, or `None` for a
/// fresh list (everything may have changed).
#[derive(Debug)]
struct Journal {
    /// The position of `entries[0]`.
    start: u64,
    entries: VecDeque<Option<String>>,
    cap: usize,
}

/// What changed in a store since a position ([`Store::changed_since`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    /// Only these keys (applied or deleted).
    Keys(BTreeSet<String>),
    /// Anything: a fresh list came, the journal no longer reaches back that far, or the store
    /// keeps no journal. The reader starts over from the whole store.
    All,
}

impl<T> Default for Store<T> {
    fn default() -> Self {
        Store {
            items: RwLock::new(HashMap::new()),
            synced: AtomicBool::new(false),
            changes: tokio::sync::watch::channel(0).0,
            journal: None,
        }
    }
}

impl<T> Store<T> {
    /// A store that remembers its last `cap` changed keys, so that a reader can apply just
    /// those ([`Store::changed_since`]) instead of going over every item.
    pub fn with_journal(cap: usize) -> Self {
        Store {
            journal: Some(Mutex::new(Journal {
                start: 0,
                entries: VecDeque::new(),
                cap: cap.max(1),
            })),
            ..Store::default()
        }
    }

    /// The journal's current position: read it *before* reading the items, and pass it to
    /// [`Store::changed_since`] later to learn what changed after that read.
    pub fn position(&self) -> u64 {
        self.journal.as_ref().map_or(0, |j| {
            let j = j.lock().unwrap_or_else(|p| p.into_inner());
            j.start + j.entries.len() as u64
        })
    }

    /// What changed after `position`, and the position to ask from next time. The items may
    /// already show later changes too (each is recorded after the item is written), so a
    /// reader applying the keys it is given, by their current items, never misses one.
    pub fn changed_since(&self, position: u64) -> (u64, Changed) {
        let Some(j) = &self.journal else {
            return (0, Changed::All);
        };
        let j = j.lock().unwrap_or_else(|p| p.into_inner());
        let end = j.start + j.entries.len() as u64;
        if position < j.start || position > end {
            return (end, Changed::All);
        }
        let mut keys = BTreeSet::new();
        for e in j.entries.range((position - j.start) as usize..) {
            match e {
                Some(k) => {
                    keys.insert(k.clone());
                }
                None => return (end, Changed::All),
            }
        }
        (end, Changed::Keys(keys))
    }

    fn record(&self, key: Option<&str>) {
        if let Some(j) = &self.journal {
            let mut j = j.lock().unwrap_or_else(|p| p.into_inner());
            if j.entries.len() >= j.cap {
                j.entries.pop_front();
                j.start += 1;
            }
            j.entries.push_back(key.map(str::to_string));
        }
    }
}

impl<T: Clone> Store<T> {
    /// True once the first list arrived (upstream's HasSynced).
    pub fn has_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// A receiver that sees a new value after each change (a fresh list, an apply, a delete).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn get(&self, key: &str) -> Option<T> {
        self.items
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// `f` over the items, under the read lock (no copy).
    pub fn read<R>(&self, f: impl FnOnce(&HashMap<String, T>) -> R) -> R {
        f(&self.items.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Every item with its key.
    pub fn list(&self) -> Vec<(String, T)> {
        self.items
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Replaces everything (a fresh list); marks the store synced.
    pub fn replace(&self, items: HashMap<String, T>) {
        *self.items.write().unwrap_or_else(|p| p.into_inner()) = items;
        self.synced.store(true, Ordering::Release);
        self.record(None);
        self.changed();
    }

    pub fn apply(&self, key: String, item: T) {
        self.record_after(&key, |items| {
            items.insert(key.clone(), item);
        });
    }

    pub fn delete(&self, key: &str) {
        self.record_after(key, |items| {
            items.remove(key);
        });
    }

    /// Writes the items, then records `key` in the journal and tells the readers.
    fn record_after(&self, key: &str, write: impl FnOnce(&mut HashMap<String, T>)) {
        write(&mut self.items.write().unwrap_or_else(|p| p.into_inner()));
        self.record(Some(key));
        self.changed();
    }
}

fn key_of<K: kube::Resource>(o: &K) -> String {
    let meta = o.meta();
    let name = meta.name.clone().unwrap_or_default();
    match &meta.namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name,
    }
}

/// Lists and watches every `K` into `store` (reduced by `convert`) until cancelled;
/// restarts on a new apiserver client.
pub async fn run<K, T>(
    mut client: ClientHandle,
    what: &'static str,
    convert: fn(&K) -> T,
    store: Arc<Store<T>>,
    cancel: CancellationToken,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
    T: Clone,
{
    loop {
        client.mark_seen();
        let api: Api<K> = Api::all(client.current());
        let cfg = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
        let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
        let mut init = HashMap::new();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = client.changed() => break,
                ev = stream.next() => match ev {
                    Some(Ok(Event::Init)) => init.clear(),
                    Some(Ok(Event::InitApply(o))) => {
                        init.insert(key_of(&o), convert(&o));
                    }
                    Some(Ok(Event::InitDone)) => store.replace(std::mem::take(&mut init)),
                    Some(Ok(Event::Apply(o))) => store.apply(key_of(&o), convert(&o)),
                    Some(Ok(Event::Delete(o))) => store.delete(&key_of(&o)),
                    Some(Err(e)) => tracing::warn!(what, error = %e, "watch failed; retrying"),
                    None => break,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_names_the_keys_changed_since_a_position() {
        let s: Store<u32> = Store::with_journal(3);
        s.replace(HashMap::from([("a".to_string(), 1)]));
        let p = s.position();
        assert_eq!(s.changed_since(p), (p, Changed::Keys(BTreeSet::new())));
        s.apply("b".into(), 2);
        s.delete("a");
        s.apply("b".into(), 3);
        let (next, changed) = s.changed_since(p);
        assert_eq!(
            changed,
            Changed::Keys(BTreeSet::from(["a".to_string(), "b".to_string()]))
        );
        assert_eq!(next, s.position());
        // A fresh list since: everything.
        s.replace(HashMap::new());
        assert_eq!(s.changed_since(next).1, Changed::All);
        // Further back than the journal reaches: everything.
        let p = s.position();
        for k in ["x", "y", "z", "w"] {
            s.apply(k.into(), 0);
        }
        assert_eq!(s.changed_since(p).1, Changed::All);
        assert!(matches!(s.changed_since(s.position() - 3).1, Changed::Keys(k) if k.len() == 3));
        // A store without a journal always says everything.
        let plain: Store<u32> = Store::default();
        plain.apply("a".into(), 1);
        assert_eq!(plain.changed_since(0).1, Changed::All);
    }
}
