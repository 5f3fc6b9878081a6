//! One list+watch store for every kind the node agent follows (upstream's informer: a
//! reflector filling an indexer). [`Store`] keeps each object, reduced to what its reader
//! needs, by `namespace/name` (`name` when cluster-scoped); [`Reflector`] feeds it from a
//! `kube::runtime::watcher` and hands each change to a [`Sink`].
//!
//! A (re-)list is buffered until complete and then diffed against the store: objects that
//! vanished while the watch was down are deleted, unchanged ones are not delivered again,
//! and the store is marked synced once. A change that leaves an item as it was is not handed
//! to sinks. Readers either follow the store ([`Store::subscribe`], and
//! [`Store::changed_since`] for a store with a journal), which tells them of every write,
//! or are handed each change ([`Sink`]).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};

mod reflector;
pub use reflector::{ClientSource, Reflector, Sink, key_of};

/// One change, as a [`Sink`] receives it: a delete carries the version the store held.
#[derive(Clone, Debug, PartialEq)]
pub enum Change<T> {
    Upsert(T),
    Delete(T),
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

/// The cache: filled by a [`Reflector`] (or a test), read by anyone.
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

    /// True once the first list arrived (upstream's HasSynced).
    pub fn has_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// A receiver that sees a new value after each write (a fresh list, an apply, a delete),
    /// also one that left the items as they were: a re-list after an outage tells readers
    /// that the apiserver answers again (the kubelet's status writer retries on it).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// `f` over the items, under the read lock (no copy).
    pub fn read<R>(&self, f: impl FnOnce(&HashMap<String, T>) -> R) -> R {
        f(&self.items.read().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn len(&self) -> usize {
        self.read(HashMap::len)
    }

    pub fn is_empty(&self) -> bool {
        self.read(HashMap::is_empty)
    }

    /// Records a change in the journal (`None`: a fresh list) and tells the readers.
    fn changed(&self, key: Option<&str>) {
        if let Some(j) = &self.journal {
            let mut j = j.lock().unwrap_or_else(|p| p.into_inner());
            if j.entries.len() >= j.cap {
                j.entries.pop_front();
                j.start += 1;
            }
            j.entries.push_back(key.map(str::to_string));
        }
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// The order a (re-)list's changes are delivered in: by namespace, then name (cluster-scoped
/// objects have no namespace).
fn list_order(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

impl<T: Clone + PartialEq> Store<T> {
    pub fn get(&self, key: &str) -> Option<T> {
        self.read(|items| items.get(key).cloned())
    }

    /// Every item with its key.
    pub fn list(&self) -> Vec<(String, T)> {
        self.read(|items| items.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    /// Every item.
    pub fn values(&self) -> Vec<T> {
        self.read(|items| items.values().cloned().collect())
    }

    /// Replaces everything (a fresh list) and marks the store synced. Returns what changed:
    /// deletes of what is gone, then upserts of what is new or different.
    pub fn replace(&self, items: HashMap<String, T>) -> Vec<Change<T>> {
        self.replace_keeping(items, &HashSet::new())
    }

    /// [`Store::replace`], keeping the current item of each key in `kept` (listed, but not
    /// readable this time).
    pub fn replace_keeping(
        &self,
        mut listed: HashMap<String, T>,
        kept: &HashSet<String>,
    ) -> Vec<Change<T>> {
        let mut items = self.items.write().unwrap_or_else(|p| p.into_inner());
        let mut upserts: Vec<(String, T)> = listed
            .iter()
            .filter(|(k, v)| items.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut deletes: Vec<(String, T)> = Vec::new();
        for (key, old) in std::mem::take(&mut *items) {
            if listed.contains_key(&key) {
                continue;
            }
            if kept.contains(&key) {
                listed.insert(key, old);
            } else {
                deletes.push((key, old));
            }
        }
        *items = listed;
        drop(items);
        deletes.sort_by(|a, b| list_order(&a.0).cmp(&list_order(&b.0)));
        upserts.sort_by(|a, b| list_order(&a.0).cmp(&list_order(&b.0)));
        let changes: Vec<Change<T>> = deletes
            .into_iter()
            .map(|(_, o)| Change::Delete(o))
            .chain(upserts.into_iter().map(|(_, o)| Change::Upsert(o)))
            .collect();
        self.synced.store(true, Ordering::Release);
        self.changed(None);
        changes
    }

    /// Adds or replaces one item; `None` when it was already there as it is.
    pub fn apply(&self, key: String, item: T) -> Option<Change<T>> {
        let mut items = self.items.write().unwrap_or_else(|p| p.into_inner());
        let change = (items.get(&key) != Some(&item)).then(|| {
            items.insert(key.clone(), item.clone());
            Change::Upsert(item)
        });
        drop(items);
        self.changed(Some(&key));
        change
    }

    /// Removes one item; the change carries the version that was there.
    pub fn delete(&self, key: &str) -> Option<Change<T>> {
        let old = self
            .items
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        self.changed(Some(key));
        old.map(Change::Delete)
    }

    /// [`Store::apply`] for `Some`, [`Store::delete`] for `None` (an object the store does
    /// not keep, such as another node's pod).
    pub fn put(&self, key: String, item: Option<T>) -> Option<Change<T>> {
        match item {
            Some(item) => self.apply(key, item),
            None => self.delete(&key),
        }
    }
}

#[cfg(test)]
mod tests;
