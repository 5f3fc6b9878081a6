//! A list+watch cache of every object of one kind (upstream's shared informer + lister, as
//! the kubelet keeps them for Services and RuntimeClasses): each object is reduced to the
//! few fields the kubelet reads, keyed by `namespace/name` (or `name` when cluster-scoped).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

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
}

impl<T> Default for Store<T> {
    fn default() -> Self {
        Store {
            items: RwLock::new(HashMap::new()),
            synced: AtomicBool::new(false),
            changes: tokio::sync::watch::channel(0).0,
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
        self.changed();
    }

    pub fn apply(&self, key: String, item: T) {
        self.items
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, item);
        self.changed();
    }

    pub fn delete(&self, key: &str) {
        self.items
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
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
