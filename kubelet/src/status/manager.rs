//! The one place pod statuses are written. Workers hand it each new status; readers (the
//! :10250 `/pods` handler, and the apiserver writer in cluster mode) read from here.

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use std::collections::BTreeMap;
use std::sync::RwLock;
use tokio::sync::watch;

/// Latest pod (spec + status) per UID.
#[derive(Debug)]
pub struct StatusManager {
    pods: RwLock<BTreeMap<String, Pod>>,
    version: watch::Sender<u64>,
    /// Last status of removed pods, kept for the apiserver writer when enabled.
    removed: RwLock<Option<BTreeMap<String, Pod>>>,
}

impl Default for StatusManager {
    fn default() -> Self {
        Self {
            pods: RwLock::new(BTreeMap::new()),
            version: watch::channel(0).0,
            removed: RwLock::new(None),
        }
    }
}

impl StatusManager {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `status` for `pod`.
    pub fn set(&self, pod: &Pod, status: PodStatus) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut p = pod.clone();
        p.status = Some(status);
        self.pods.write().unwrap().insert(uid, p);
        self.version.send_modify(|v| *v += 1);
    }

    /// Forgets a pod that is gone.
    pub fn remove(&self, uid: &str) {
        let gone = self.pods.write().unwrap().remove(uid);
        if let (Some(p), Some(kept)) = (gone, self.removed.write().unwrap().as_mut()) {
            kept.insert(uid.to_string(), p);
        }
        self.version.send_modify(|v| *v += 1);
    }

    /// From now on, keep the last status of removed pods until [`take_removed`](Self::take_removed)
    /// (cluster mode: the final status is written to the apiserver after the worker is gone).
    pub fn keep_removed(&self) {
        self.removed
            .write()
            .unwrap()
            .get_or_insert_with(BTreeMap::new);
    }

    /// The last status of a removed pod, if kept.
    pub fn take_removed(&self, uid: &str) -> Option<Pod> {
        self.removed
            .write()
            .unwrap()
            .as_mut()
            .and_then(|m| m.remove(uid))
    }

    pub fn get(&self, uid: &str) -> Option<Pod> {
        self.pods.read().unwrap().get(uid).cloned()
    }

    /// Every pod with its latest status, ordered by UID.
    pub fn pods(&self) -> Vec<Pod> {
        self.pods.read().unwrap().values().cloned().collect()
    }

    /// Changes whenever any status changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}

/// The :10250 handlers list pods from here.
impl crate::server::PodLister for StatusManager {
    fn pods(&self) -> Vec<Pod> {
        StatusManager::pods(self)
    }
}
