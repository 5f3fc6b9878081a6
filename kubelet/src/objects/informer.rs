//! The kubelet's informers (Services, RuntimeClasses, Nodes): `plumbing::store`, the node
//! agent's one list+watch store, on the kubelet's apiserver client. Each object is reduced to
//! the few fields the kubelet reads, keyed by `namespace/name` (or `name` when
//! cluster-scoped).

use std::sync::Arc;

use kube::Api;
use kube::runtime::watcher;
use plumbing::store::{Reflector, Sink};
use tokio_util::sync::CancellationToken;

pub use plumbing::store::{Changed, Store};

use super::client::{ClientHandle, WATCH_TIMEOUT_SECS};

/// Keeps every object, reduced by `convert`.
struct Reduce<K, T> {
    what: &'static str,
    convert: fn(&K) -> T,
}

impl<K, T> Sink<K> for Reduce<K, T>
where
    T: Clone + PartialEq + Send + Sync + 'static,
{
    type Item = T;
    type Error = std::convert::Infallible;
    fn kind(&self) -> &'static str {
        self.what
    }
    fn decode(&self, obj: K) -> Result<Option<T>, std::convert::Infallible> {
        Ok(Some((self.convert)(&obj)))
    }
}

/// Lists and watches every `K` into `store` (reduced by `convert`) until cancelled;
/// restarts on a new apiserver client.
pub async fn run<K, T>(
    client: ClientHandle,
    what: &'static str,
    convert: fn(&K) -> T,
    store: Arc<Store<T>>,
    cancel: CancellationToken,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
    T: Clone + PartialEq + Send + Sync + 'static,
{
    let config = watcher::Config::default().timeout(WATCH_TIMEOUT_SECS);
    Reflector::new(store, Reduce { what, convert })
        .run(client, Api::all, config, cancel)
        .await;
}
