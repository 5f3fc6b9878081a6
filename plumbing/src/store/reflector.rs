//! The loop that fills a [`Store`]: one `kube::runtime::watcher` per kind, its events
//! decoded one by one (a malformed object is logged and skipped without failing the list),
//! a (re-)list buffered and diffed, each change handed to a [`Sink`].

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Change, Store};

/// Where a watch gets its apiserver client: a fixed one, or one that is replaced (after a
/// certificate rotation), upon which the watch starts over on the new client.
pub trait ClientSource: Send {
    /// The client to start the next watch with.
    fn client(&mut self) -> kube::Client;
    /// Resolves once the client from [`ClientSource::client`] was replaced.
    fn replaced(&mut self) -> impl Future<Output = ()> + Send;
}

impl ClientSource for kube::Client {
    fn client(&mut self) -> kube::Client {
        self.clone()
    }
    fn replaced(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// What one kind's objects become in the store, and who hears of each change.
pub trait Sink<K>: Send {
    /// What the store keeps of an object.
    type Item: Clone + PartialEq + Send + Sync + 'static;
    /// For logs: "Service", "pods".
    fn kind(&self) -> &'static str;
    /// Lists and watch failures are logged at debug level only (one watch per object, many
    /// of them).
    fn quiet(&self) -> bool {
        false
    }
    /// Why an object is malformed.
    type Error: std::fmt::Display;
    /// One object as the store keeps it. `Ok(None)`: the store does not keep it (a kept
    /// version is deleted); `Err`: malformed, logged and skipped (a kept version stays).
    fn decode(&self, obj: K) -> Result<Option<Self::Item>, Self::Error>;
    fn upsert(&mut self, _item: &Self::Item) {}
    fn delete(&mut self, _item: &Self::Item) {}
    /// The first complete list is in the store, and its changes were delivered.
    fn synced(&mut self) {}
}

/// `namespace/name`, or `name` for a cluster-scoped object: the key of the store.
pub fn key_of<K: kube::Resource>(obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match &meta.namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// Feeds watcher events of `K` into a store and a sink.
pub struct Reflector<K, S: Sink<K>> {
    store: Arc<Store<S::Item>>,
    sink: S,
    /// The (re-)list being received.
    listing: HashMap<String, S::Item>,
    /// Listed objects that could not be decoded: their kept version stays.
    kept: HashSet<String>,
    _kind: PhantomData<fn(K)>,
}

impl<K, S: Sink<K> + Debug> Debug for Reflector<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reflector")
            .field("sink", &self.sink)
            .field("items", &self.store.len())
            .finish()
    }
}

impl<K, S> Reflector<K, S>
where
    K: kube::Resource,
    S: Sink<K>,
{
    pub fn new(store: Arc<Store<S::Item>>, sink: S) -> Self {
        Reflector {
            store,
            sink,
            listing: HashMap::new(),
            kept: HashSet::new(),
            _kind: PhantomData,
        }
    }

    pub fn store(&self) -> &Arc<Store<S::Item>> {
        &self.store
    }

    pub fn sink(&self) -> &S {
        &self.sink
    }

    pub fn sink_mut(&mut self) -> &mut S {
        &mut self.sink
    }

    fn deliver(&mut self, change: Change<S::Item>) {
        match change {
            Change::Upsert(o) => self.sink.upsert(&o),
            Change::Delete(o) => self.sink.delete(&o),
        }
    }

    fn malformed(&self, key: &str, error: &S::Error) {
        warn!(
            kind = self.sink.kind(),
            key, %error, "skipping malformed object"
        );
    }

    /// One watcher event. Pure with respect to I/O (logs only): tests drive it with
    /// hand-made events.
    pub fn handle(&mut self, ev: Event<K>) {
        let kind = self.sink.kind();
        match ev {
            Event::Init => {
                debug!(kind, "list started");
                self.listing.clear();
                self.kept.clear();
            }
            Event::InitApply(obj) => {
                let key = key_of(&obj);
                match self.sink.decode(obj) {
                    Ok(Some(o)) => {
                        self.listing.insert(key, o);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.malformed(&key, &e);
                        self.kept.insert(key);
                    }
                }
            }
            Event::InitDone => {
                let first = !self.store.has_synced();
                let listed = std::mem::take(&mut self.listing);
                let kept = std::mem::take(&mut self.kept);
                let changes = self.store.replace_keeping(listed, &kept);
                let deleted = changes
                    .iter()
                    .filter(|c| matches!(c, Change::Delete(_)))
                    .count();
                let (objects, changed) = (self.store.len(), changes.len() - deleted);
                if self.sink.quiet() {
                    debug!(kind, objects, changed, deleted, "listed");
                } else {
                    info!(kind, objects, changed, deleted, "listed");
                }
                for c in changes {
                    self.deliver(c);
                }
                if first {
                    self.sink.synced();
                }
            }
            Event::Apply(obj) => {
                let key = key_of(&obj);
                match self.sink.decode(obj) {
                    Ok(item) => {
                        if let Some(c) = self.store.put(key, item) {
                            self.deliver(c);
                        }
                    }
                    Err(e) => self.malformed(&key, &e),
                }
            }
            Event::Delete(obj) => {
                if let Some(c) = self.store.delete(&key_of(&obj)) {
                    self.deliver(c);
                }
            }
        }
    }
}

impl<K, S> Reflector<K, S>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    S: Sink<K>,
{
    /// List+watches `K` (through `api`, with `config`) until `cancel`. Errors are logged;
    /// the watcher retries them with its default backoff (and re-lists after 410 Gone). A
    /// replaced client starts a new watch at once; should the stream ever end, a new one
    /// starts after a pause. Each new watch's first list is diffed against the store.
    pub async fn run<C: ClientSource>(
        mut self,
        mut client: C,
        api: impl Fn(kube::Client) -> Api<K> + Send,
        config: watcher::Config,
        cancel: CancellationToken,
    ) {
        let kind = self.sink.kind();
        loop {
            let mut stream = watcher::watcher(api(client.client()), config.clone())
                .default_backoff()
                .boxed();
            let ended = loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = client.replaced() => break false,
                    ev = stream.next() => match ev {
                        Some(Ok(ev)) => self.handle(ev),
                        Some(Err(e)) if self.sink.quiet() => debug!(kind, error = %e, "watch failed; retrying with backoff"),
                        Some(Err(e)) => warn!(kind, error = %e, "watch failed; retrying with backoff"),
                        None => break true,
                    }
                }
            };
            if !ended {
                if self.sink.quiet() {
                    debug!(kind, "apiserver client changed; restarting the watch");
                } else {
                    info!(kind, "apiserver client changed; restarting the watch");
                }
                continue;
            }
            warn!(kind, "watch stream ended; restarting");
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(RESTART_PAUSE) => {}
            }
        }
    }
}

/// The pause before a watch whose stream ended starts again.
const RESTART_PAUSE: Duration = Duration::from_secs(1);
