//! The resources each admitted pod's containers are allocated (upstream's allocation manager
//! for in-place pod resize, `InPlacePodVerticalScaling`, GA). Admission records the resources
//! a pod was admitted with and each resize it accepts; workers run containers with the
//! allocated resources, not the spec's, until a resize is accepted. The allocations survive an
//! agent restart in `<root-dir>/allocated_pods_state` (upstream's checkpoint, same format), so
//! a restarted agent neither re-admits a pending resize by accident nor loses an accepted one.
//!
//! Also holds the resizes the node could not take (`PodResizePending`, reason `Infeasible` or
//! `Deferred`), which the pod's status shows.

pub mod checkpoint;
pub mod message;

pub use checkpoint::CheckpointError;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The checkpoint's file name in the root directory (upstream's `allocatedPodsStateFile`).
pub const CHECKPOINT_FILE: &str = "allocated_pods_state";
/// Upstream's `PodReasonInfeasible` and `PodReasonDeferred`.
pub const REASON_INFEASIBLE: &str = "Infeasible";
pub const REASON_DEFERRED: &str = "Deferred";

/// Container name → allocated resources.
pub type PodAllocation = BTreeMap<String, ResourceRequirements>;

/// A resize the node did not accept (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// `Infeasible` or `Deferred`.
    pub reason: String,
    pub message: String,
    /// The pod's `metadata.generation` the decision was about.
    pub generation: Option<i64>,
}

/// Why the checkpoint could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum AllocationError {
    #[error(
        "could not restore state from checkpoint: {source}, please drain this node and delete pod resource information checkpoint file {path:?} before restarting Kubelet"
    )]
    Restore {
        path: PathBuf,
        source: CheckpointError,
    },
    #[error("reading {path:?}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {path:?}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Debug, Default)]
struct State {
    pods: BTreeMap<String, PodAllocation>,
    pending: HashMap<String, Pending>,
    /// The checkpoint no longer matches `pods`.
    dirty: bool,
}

/// Allocations of every pod, shared by admission (writes) and the pod workers (reads).
#[derive(Debug, Default)]
pub struct Allocations {
    state: Mutex<State>,
    /// The checkpoint file; None keeps the allocations in memory only.
    path: Option<PathBuf>,
    /// Per pod UID, woken when its allocation or pending resize changes (a deferred resize
    /// accepted later): the pod's worker waits on it.
    watchers: Mutex<HashMap<String, Arc<Notify>>>,
}

/// Which containers resize in place: app containers and sidecars (upstream's
/// `IsResizableContainer` without the alpha gate for init containers).
pub fn resizable(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    let sidecars = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.map(|s| s.containers.iter())
        .into_iter()
        .flatten()
        .chain(sidecars)
}

/// The allocation `pod`'s spec asks for.
pub fn from_spec(pod: &Pod) -> PodAllocation {
    resizable(pod)
        .map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default()))
        .collect()
}

/// Two requirements ask for the same amounts (quantities compared by value, as upstream's
/// semantic equality; empty lists equal absent ones).
pub fn same_requirements(a: &ResourceRequirements, b: &ResourceRequirements) -> bool {
    use plumbing::quantity;
    type List = Option<BTreeMap<String, Quantity>>;
    let same = |x: &List, y: &List| {
        let (x, y) = (x.clone().unwrap_or_default(), y.clone().unwrap_or_default());
        x.len() == y.len()
            && x.iter().all(|(k, q)| {
                y.get(k)
                    .is_some_and(|r| match (quantity::milli(q), quantity::milli(r)) {
                        (Ok(a), Ok(b)) => a == b,
                        _ => q.0 == r.0,
                    })
            })
    };
    same(&a.requests, &b.requests) && same(&a.limits, &b.limits)
}

impl Allocations {
    /// Allocations kept in memory only (tests, and nodes whose checkpoint is off).
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Reads `<root_dir>/allocated_pods_state` (none yet: no allocations). Blocking. A
    /// checkpoint that does not verify is an error, as upstream refuses to start with one.
    pub fn open(root_dir: &Path) -> Result<Self, AllocationError> {
        let path = root_dir.join(CHECKPOINT_FILE);
        let pods = match std::fs::read_to_string(&path) {
            Ok(text) => checkpoint::decode(&text).map_err(|source| AllocationError::Restore {
                path: path.clone(),
                source,
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => return Err(AllocationError::Read { path, source }),
        };
        Ok(Self {
            state: Mutex::new(State {
                pods,
                ..Default::default()
            }),
            path: Some(path),
            watchers: Mutex::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The allocation of pod `uid`, if it was admitted.
    pub fn get(&self, uid: &str) -> Option<PodAllocation> {
        self.state().pods.get(uid).cloned()
    }

    /// `pod` with its containers' resources replaced by their allocation (upstream's
    /// UpdatePodFromAllocation); the pod unchanged when it has none.
    pub fn allocated_pod(&self, pod: &Pod) -> Pod {
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        match self.state().pods.get(uid) {
            Some(a) => apply(pod, a),
            None => pod.clone(),
        }
    }

    /// Records `alloc` as pod `uid`'s allocation; wakes the workers when it changed.
    pub fn set(&self, uid: &str, alloc: PodAllocation) {
        let mut st = self.state();
        if st.pods.get(uid) != Some(&alloc) {
            st.pods.insert(uid.to_string(), alloc);
            st.dirty = true;
            drop(st);
            self.notify(uid);
        }
    }

    /// Forgets the pods not in `live` (upstream's RemoveOrphanedPods; written with the next
    /// change).
    pub fn retain(&self, live: &HashSet<&str>) {
        let mut st = self.state();
        st.pods.retain(|uid, _| live.contains(uid.as_str()));
        st.pending.retain(|uid, _| live.contains(uid.as_str()));
        drop(st);
        let mut w = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        w.retain(|uid, _| live.contains(uid.as_str()));
    }

    /// The resize of pod `uid` the node did not take, if any.
    pub fn pending(&self, uid: &str) -> Option<Pending> {
        self.state().pending.get(uid).cloned()
    }

    /// Records (Some) or clears (None) the pending resize of pod `uid`. True when it changed.
    pub fn set_pending(&self, uid: &str, p: Option<Pending>) -> bool {
        let mut st = self.state();
        let changed = st.pending.get(uid) != p.as_ref();
        match p {
            Some(p) => st.pending.insert(uid.to_string(), p),
            None => st.pending.remove(uid),
        };
        drop(st);
        if changed {
            self.notify(uid);
        }
        changed
    }

    /// What wakes pod `uid`'s worker when its allocation or pending resize changes (a change
    /// before it waits is kept for it).
    pub fn subscribe(&self, uid: &str) -> Arc<Notify> {
        let mut w = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        w.entry(uid.to_string()).or_default().clone()
    }

    /// Wakes pod `uid`'s worker, if it has one.
    fn notify(&self, uid: &str) {
        let w = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = w.get(uid) {
            n.notify_one();
        }
    }

    /// Whether the checkpoint lags behind the allocations.
    pub fn dirty(&self) -> bool {
        self.path.is_some() && self.state().dirty
    }

    /// Writes the checkpoint when it changed (atomically, mode 0644). Blocking: call on the
    /// blocking pool.
    pub fn flush(&self) -> Result<(), AllocationError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let text = {
            let mut st = self.state();
            if !st.dirty {
                return Ok(());
            }
            st.dirty = false;
            checkpoint::encode(&st.pods)
        };
        crate::atomic_file::write_public_atomic(path, text.as_bytes()).map_err(|source| {
            self.state().dirty = true;
            AllocationError::Write {
                path: path.clone(),
                source,
            }
        })
    }
}

/// `pod` with the resources of the containers `alloc` names replaced.
pub fn apply(pod: &Pod, alloc: &PodAllocation) -> Pod {
    let mut out = pod.clone();
    if let Some(spec) = out.spec.as_mut() {
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            if let Some(r) = alloc.get(&c.name) {
                c.resources = Some(r.clone()).filter(|r| *r != ResourceRequirements::default());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
