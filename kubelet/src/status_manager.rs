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
}

impl Default for StatusManager {
    fn default() -> Self {
        Self {
            pods: RwLock::new(BTreeMap::new()),
            version: watch::channel(0).0,
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
        self.pods.write().unwrap().remove(uid);
        self.version.send_modify(|v| *v += 1);
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
