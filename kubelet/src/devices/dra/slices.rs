//! The kubelet's cleanup of DRA drivers' ResourceSlices for this node (upstream's
//! `DRAPluginManager.wipeResourceSlices`, `resource.k8s.io/v1`):
//!
//! - at start, every slice of the node is deleted in the background (no driver is
//!   registered yet, and pods must not be scheduled here for a driver that may never come
//!   back);
//! - when the last plugin of a driver goes away, its slices on this node are deleted after
//!   [`WIPING_DELAY`] unless a plugin of the driver registers again first (a DaemonSet
//!   update replacing the driver's pod); a wipe already queued keeps its first deadline.
//!
//! Each wipe is one `deletecollection` with the field selector `spec.nodeName=<node>`
//! (plus `spec.driver=<driver>`), tried after the Node object exists, with upstream's
//! backoff (1 s doubling, 20 % jitter, until a step would pass 5 minutes: nine attempts
//! over about 4.3 minutes); an apiserver that answers NotFound has nothing to delete.
//!
//! Not upstream: a driver is usable while a plugin of it is registered. Upstream also
//! counts a registered plugin whose gRPC connection dropped as unusable (its socket still
//! there); this agent only notices a driver gone when its registration socket goes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio_util::sync::CancellationToken;

use crate::objects::{ClientHandle, timed};

/// How long a driver may be gone before its slices are deleted (upstream's
/// `defaultWipingDelay`).
pub const WIPING_DELAY: Duration = Duration::from_secs(30);

/// A failed step of a wipe.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    /// The Node object is not there (yet): tried again.
    #[error("node {0:?} not found")]
    NodeNotFound(String),
    /// 401: the kubelet is still sorting out its credentials; tried again.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// 404 on the collection: nothing to delete.
    #[error("not found: {0}")]
    NotFound(String),
    #[error("{0}")]
    Other(String),
}

/// The apiserver calls a wipe needs.
#[async_trait::async_trait]
pub trait SliceApi: Send + Sync {
    /// Whether the Node object `name` exists.
    async fn node_exists(&self, name: &str) -> Result<(), SliceError>;
    /// `deletecollection` of ResourceSlices matching `field_selector`.
    async fn delete_slices(&self, field_selector: &str) -> Result<(), SliceError>;
}

/// [`SliceApi`] over the apiserver.
#[derive(Clone)]
pub struct KubeSliceApi {
    pub client: ClientHandle,
}

fn classify(e: kube::Error) -> SliceError {
    let code = match &e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    };
    match code {
        Some(401) => SliceError::Unauthorized(e.to_string()),
        Some(404) => SliceError::NotFound(e.to_string()),
        _ => SliceError::Other(e.to_string()),
    }
}

#[async_trait::async_trait]
impl SliceApi for KubeSliceApi {
    async fn node_exists(&self, name: &str) -> Result<(), SliceError> {
        let api: kube::Api<Node> = kube::Api::all(self.client.current());
        match timed(api.get_opt(name)).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(SliceError::NodeNotFound(name.to_string())),
            Err(e) => Err(classify(e)),
        }
    }

    async fn delete_slices(&self, field_selector: &str) -> Result<(), SliceError> {
        let api: kube::Api<ResourceSlice> = kube::Api::all(self.client.current());
        let lp = kube::api::ListParams::default().fields(field_selector);
        timed(api.delete_collection(&kube::api::DeleteParams::default(), &lp))
            .await
            .map(|_| ())
            .map_err(classify)
    }
}

/// The field selector of a wipe, as Go's `fields.Set.String()` writes it (terms sorted).
pub fn field_selector(node: &str, driver: Option<&str>) -> String {
    match driver {
        Some(d) => format!("spec.driver={d},spec.nodeName={node}"),
        None => format!("spec.nodeName={node}"),
    }
}

/// The steps of upstream's `wait.Backoff{Duration: 1s, Factor: 2, Cap: 5m, Steps: 100}`
/// before jitter; it ends with the step after which the next would pass the cap (one
/// attempt before each).
pub fn backoff() -> Vec<Duration> {
    let cap = Duration::from_secs(300);
    let mut out = Vec::new();
    let mut d = Duration::from_secs(1);
    loop {
        out.push(d);
        d *= 2;
        if d > cap {
            return out;
        }
    }
}

/// Upstream's `wait.Jitter(d, 0.2)`.
fn jitter(d: Duration) -> Duration {
    d + d.mul_f64(0.2 * fastrand::f64())
}

/// The node's slice cleanup (see the module documentation).
pub struct SliceCleanup {
    api: Arc<dyn SliceApi>,
    node: String,
    delay: Duration,
    /// Drivers whose wipe is queued (or running), with the token that stops the wait.
    pending: Mutex<BTreeMap<String, (u64, CancellationToken)>>,
    next_id: std::sync::atomic::AtomicU64,
    cancel: CancellationToken,
}

impl std::fmt::Debug for SliceCleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceCleanup")
            .field("node", &self.node)
            .field("delay", &self.delay)
            .finish()
    }
}

impl SliceCleanup {
    /// Cleanup of `node`'s slices through `api`, waiting `delay` after a driver goes; every
    /// background wipe stops with `cancel`.
    pub fn new(
        api: Arc<dyn SliceApi>,
        node: &str,
        delay: Duration,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            api,
            node: node.to_string(),
            delay,
            pending: Mutex::default(),
            next_id: Default::default(),
            cancel,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (u64, CancellationToken)>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Deletes the node's slices (of `driver`, or all), retrying as upstream; false when
    /// every attempt failed or the cleanup was cancelled.
    pub async fn wipe(&self, driver: Option<&str>) -> bool {
        let selector = field_selector(&self.node, driver);
        // Upstream tries before each of its waits and stops when the step that would pass
        // the cap is handed out, so the last wait is never followed by a try.
        let waits = backoff();
        for (attempt, w) in waits.iter().enumerate() {
            match self.try_wipe(&selector).await {
                Ok(()) => {
                    tracing::debug!(field_selector = %selector, "Deleted ResourceSlices");
                    return true;
                }
                Err(SliceError::NotFound(_)) => {
                    tracing::debug!(field_selector = %selector, "ResourceSlices not found, nothing to delete.");
                    return true;
                }
                Err(SliceError::NodeNotFound(_)) => {}
                Err(e @ SliceError::Unauthorized(_)) => {
                    tracing::debug!(field_selector = %selector, error = %e, "Deleting ResourceSlice failed, retrying");
                }
                Err(e) => {
                    tracing::info!(field_selector = %selector, error = %e, "Deleting ResourceSlice failed, retrying");
                }
            }
            if attempt + 1 == waits.len() {
                break;
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return false,
                _ = tokio::time::sleep(jitter(*w)) => {}
            }
        }
        tracing::warn!(field_selector = %selector, "ResourceSlices of the node were not deleted: giving up");
        false
    }

    async fn try_wipe(&self, selector: &str) -> Result<(), SliceError> {
        match self.api.node_exists(&self.node).await {
            Ok(()) => {}
            Err(e @ SliceError::NodeNotFound(_)) => return Err(e),
            Err(e) => {
                tracing::info!(error = %e, "Unexpected error checking for node");
                return Err(SliceError::NodeNotFound(self.node.clone()));
            }
        }
        self.api.delete_slices(selector).await
    }

    /// The wipe at start: every slice of the node, in the background.
    pub fn start(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = me.cancel.cancelled() => {}
                _ = me.wipe(None) => {}
            }
        });
    }

    /// The last plugin of `driver` went away: its slices go after the delay, unless
    /// [`driver_back`](Self::driver_back) comes first. Already queued: nothing changes.
    pub fn driver_gone(self: &Arc<Self>, driver: &str) {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token = self.cancel.child_token();
        {
            let mut pending = self.lock();
            if pending.contains_key(driver) {
                return;
            }
            pending.insert(driver.to_string(), (id, token.clone()));
        }
        tracing::info!(driver, delay = ?self.delay, "DRA driver gone: its ResourceSlices are deleted unless it comes back");
        let (me, driver) = (self.clone(), driver.to_string());
        tokio::spawn(async move {
            tokio::select! {
                _ = token.cancelled() => return,
                _ = tokio::time::sleep(me.delay) => {}
            }
            tokio::select! {
                _ = me.cancel.cancelled() => {}
                _ = me.wipe(Some(&driver)) => {}
            }
            let mut pending = me.lock();
            if pending.get(&driver).is_some_and(|(i, _)| *i == id) {
                pending.remove(&driver);
            }
        });
    }

    /// A plugin of `driver` registered: a queued wipe of its slices is called off.
    pub fn driver_back(&self, driver: &str) {
        if let Some((_, token)) = self.lock().remove(driver) {
            tracing::info!(driver, "DRA driver back: its ResourceSlices are kept");
            token.cancel();
        }
    }

    /// Whether a wipe of `driver`'s slices is queued or running.
    pub fn is_pending(&self, driver: &str) -> bool {
        self.lock().contains_key(driver)
    }
}

#[cfg(test)]
mod tests;
