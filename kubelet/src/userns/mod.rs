//! User namespaces for pods with `hostUsers: false` (upstream's `pkg/kubelet/userns`): the
//! node's ID range for pods (the `kubelet` entries of `/etc/subuid` and `/etc/subgid`, or
//! upstream's default: every ID from 65536 up), cut into ranges of `idsPerPod` IDs; one range
//! per pod, never shared, recorded in the pod's directory (`<pod-dir>/userns`, upstream's JSON)
//! so that a pod keeps its range across agent restarts (the manager is rebuilt from the
//! records at start) and freed when the pod's directory goes. Records are read and written
//! through [`PodRecords`] (blocking file work: call from the blocking pool); the bookkeeping
//! is in memory.

mod records;
mod settings;
mod subids;

#[cfg(any(test, feature = "test-util"))]
pub use records::fake::FakeRecords;
pub use records::{DirRecords, PodRecords, RECORD_FILE};
pub use settings::{Settings, SettingsError};
pub use subids::{DEFAULT_FIRST_ID, DEFAULT_LENGTH, SUBGID_FILE, SUBUID_FILE, kubelet_range};

use crate::runtime::{IdMapping, UserNamespace};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The unit of a pod's range and upstream's default `userNamespaces.idsPerPod`.
pub const UNIT: u32 = 65536;

/// What can go wrong with the node's range, a pod's record or an allocation; the texts are
/// upstream's.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UsernsError {
    #[error("kubelet user namespace length {0} is not a multiple of {UNIT}")]
    LengthNotUnit(u64),
    #[error("kubelet user assigned ID {first} is not a multiple of {per_pod}")]
    FirstNotAligned { first: u32, per_pod: u32 },
    #[error("kubelet user assigned ID {first} must be greater or equal to {per_pod}")]
    FirstTooLow { first: u32, per_pod: u32 },
    #[error("kubelet user assigned IDs length {len} is not a multiple of {per_pod}")]
    LengthNotAligned { len: u32, per_pod: u32 },
    #[error("kubelet user assigned IDs are not enough to support {0} pods")]
    TooFewIds(u32),
    /// `/etc/subuid` or `/etc/subgid` as `getsubids` would reject them.
    #[error("{0}")]
    SubIds(String),
    /// Upstream's API validation of the pod's fields.
    #[error("{0}")]
    Forbidden(String),
    #[error("mismatched subuids and subgids for user \"kubelet\"")]
    Mismatched,
    /// The runtime handler reports no user namespace support (empty: the default handler).
    #[error("{}", no_support(.0))]
    NoRuntimeSupport(String),
    #[error("create user namespace: could not find an empty slot to allocate a user namespace")]
    Exhausted,
    #[error("user namespace: {0}")]
    BadRecord(String),
    #[error("record pod mappings for existing pod {uid:?}: {source}")]
    Rebuild {
        uid: String,
        source: Box<UsernsError>,
    },
    #[error("user namespace record of pod {uid}: {message}")]
    Io { uid: String, message: String },
}

fn no_support(handler: &str) -> String {
    if handler.is_empty() {
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces".into()
    } else {
        format!(
            "can't set `spec.hostUsers: false`, RuntimeClass handler {handler:?} does not support user namespaces"
        )
    }
}

/// Upstream's API validation of a pod with `hostUsers: false`: no node namespaces (the
/// apiserver refuses such pods; static pods meet the same words here).
pub fn validate(pod: &k8s_openapi::api::core::v1::Pod) -> Result<(), UsernsError> {
    let Some(spec) = pod.spec.as_ref().filter(|s| s.host_users == Some(false)) else {
        return Ok(());
    };
    let forbidden = [
        ("hostNetwork", spec.host_network),
        ("HostPID", spec.host_pid),
        ("HostIPC", spec.host_ipc),
    ];
    let errs: Vec<String> = forbidden
        .iter()
        .filter(|(_, on)| *on == Some(true))
        .map(|(f, _)| {
            format!("spec.securityContext.{f}: Forbidden: when `pod.Spec.HostUsers` is false")
        })
        .collect();
    match errs.len() {
        0 => Ok(()),
        1 => Err(UsernsError::Forbidden(errs[0].clone())),
        _ => Err(UsernsError::Forbidden(format!("[{}]", errs.join(", ")))),
    }
}

/// Whether the pod asks for a user namespace of its own.
pub fn wants_userns(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_users) == Some(false)
}

/// The pods' ID ranges.
pub struct UsernsManager {
    records: Arc<dyn PodRecords>,
    per_pod: u32,
    /// The first slot: the node range's first ID / `per_pod`.
    offset: u32,
    slots: u32,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// One bit per slot of the node's range.
    used: Vec<u64>,
    /// Pod UID → its slot.
    by_pod: HashMap<String, u32>,
}

impl State {
    fn has(&self, slot: u32) -> bool {
        self.used[(slot / 64) as usize] & (1 << (slot % 64)) != 0
    }
    fn set(&mut self, slot: u32, on: bool) {
        let (w, b) = ((slot / 64) as usize, 1u64 << (slot % 64));
        if on {
            self.used[w] |= b
        } else {
            self.used[w] &= !b
        }
    }
    fn first_free(&self, slots: u32) -> Option<u32> {
        let (w, word) = self
            .used
            .iter()
            .enumerate()
            .find(|(_, w)| **w != u64::MAX)?;
        let slot = w as u32 * 64 + word.trailing_ones();
        (slot < slots).then_some(slot)
    }
}

impl UsernsManager {
    /// Checks the node's range `(first ID, length)` against `per_pod` and `max_pods` (upstream's
    /// checks and messages), then rebuilds the allocations from the pods' records. Blocking.
    pub fn new(
        records: Arc<dyn PodRecords>,
        per_pod: u64,
        (first, len): (u32, u32),
        max_pods: u32,
    ) -> Result<Self, UsernsError> {
        if per_pod == 0 || !per_pod.is_multiple_of(u64::from(UNIT)) || per_pod > u64::from(u32::MAX)
        {
            return Err(UsernsError::LengthNotUnit(per_pod));
        }
        let per_pod = per_pod as u32;
        if !first.is_multiple_of(per_pod) {
            return Err(UsernsError::FirstNotAligned { first, per_pod });
        }
        if first < per_pod {
            // Mapping ID 0 into a pod would give it the node's root.
            return Err(UsernsError::FirstTooLow { first, per_pod });
        }
        if len % per_pod != 0 {
            return Err(UsernsError::LengthNotAligned { len, per_pod });
        }
        let slots = len / per_pod;
        if slots < max_pods {
            return Err(UsernsError::TooFewIds(max_pods));
        }
        let m = Self {
            records,
            per_pod,
            offset: first / per_pod,
            slots,
            state: Mutex::new(State {
                used: vec![0; slots.div_ceil(64) as usize],
                by_pod: HashMap::new(),
            }),
        };
        for uid in m.records.pods().map_err(|e| io(".", e))? {
            m.load(&uid).map_err(|e| UsernsError::Rebuild {
                uid: uid.clone(),
                source: Box::new(e),
            })?;
        }
        Ok(m)
    }

    /// The pod's user namespace: the one its record names, else a new range (recorded before
    /// it is returned). Refused with upstream's message when the runtime handler does not
    /// support user namespaces. Blocking.
    pub fn get_or_create(
        &self,
        uid: &str,
        handler: &str,
        supported: bool,
    ) -> Result<UserNamespace, UsernsError> {
        if !supported {
            return Err(UsernsError::NoRuntimeSupport(handler.into()));
        }
        if let Some(ns) = self.load(uid)? {
            return Ok(ns);
        }
        let slot = {
            let mut st = self.state.lock().expect("userns state");
            if let Some(&slot) = st.by_pod.get(uid) {
                slot
            } else {
                let slot = st.first_free(self.slots).ok_or(UsernsError::Exhausted)?;
                st.set(slot, true);
                st.by_pod.insert(uid.into(), slot);
                slot
            }
        };
        let ns = self.namespace(slot);
        let json = serde_json::to_vec(&ns).expect("mappings serialize");
        if let Err(e) = self.records.write(uid, &json) {
            self.forget(uid);
            return Err(io(uid, e));
        }
        tracing::debug!(%uid, first_id = ns.uids[0].host_id, "new pod user namespace allocation");
        Ok(ns)
    }

    /// The pod's user namespace if it has one (memory only: cheap).
    pub fn mapping(&self, uid: &str) -> Option<UserNamespace> {
        let st = self.state.lock().expect("userns state");
        st.by_pod.get(uid).map(|&slot| self.namespace(slot))
    }

    /// Frees the pod's range: its directory is gone (or going). Removes the record, if any.
    pub fn release(&self, uid: &str) {
        if self.forget(uid) {
            if let Err(e) = self.records.remove(uid) {
                tracing::debug!(%uid, error = %e, "cannot remove the pod's user namespace record");
            }
            tracing::debug!(%uid, "released the pod's user namespace allocation");
        }
    }

    /// Pods holding a range now.
    pub fn allocated(&self) -> usize {
        self.state.lock().expect("userns state").by_pod.len()
    }

    fn forget(&self, uid: &str) -> bool {
        let mut st = self.state.lock().expect("userns state");
        match st.by_pod.remove(uid) {
            Some(slot) => {
                st.set(slot, false);
                true
            }
            None => false,
        }
    }

    fn namespace(&self, slot: u32) -> UserNamespace {
        let m = IdMapping {
            host_id: (slot + self.offset) * self.per_pod,
            container_id: 0,
            length: self.per_pod,
        };
        UserNamespace {
            uids: vec![m],
            gids: vec![m],
        }
    }

    /// Reads the pod's record and takes its range (None: no record).
    fn load(&self, uid: &str) -> Result<Option<UserNamespace>, UsernsError> {
        let Some(bytes) = self.records.read(uid).map_err(|e| io(uid, e))? else {
            return Ok(None);
        };
        let ns = parse_record(&bytes)?;
        let m = ns.uids[0];
        if m.length != self.per_pod {
            return Err(bad(format!("wrong user namespace length {}", m.length)));
        }
        if m.host_id % self.per_pod != 0 {
            return Err(bad(format!(
                "wrong user namespace offset specified {}",
                m.host_id
            )));
        }
        let slot = (m.host_id / self.per_pod)
            .checked_sub(self.offset)
            .filter(|s| *s < self.slots)
            .ok_or_else(|| bad(format!("id {} is out of range", m.host_id)))?;
        let mut st = self.state.lock().expect("userns state");
        match st.by_pod.get(uid) {
            Some(&s) if s == slot => {}
            Some(_) => {
                return Err(bad(format!(
                    "different user namespace range already used by pod {uid:?}"
                )));
            }
            None if st.has(slot) => {
                return Err(bad(format!("range picked for pod {uid:?} already taken")));
            }
            None => {
                st.set(slot, true);
                st.by_pod.insert(uid.into(), slot);
            }
        }
        Ok(Some(ns))
    }
}

fn bad(what: String) -> UsernsError {
    UsernsError::BadRecord(what)
}

fn io(uid: &str, e: std::io::Error) -> UsernsError {
    UsernsError::Io {
        uid: uid.into(),
        message: e.to_string(),
    }
}

/// A record as upstream writes it: one UID and one identical GID mapping, root mapped.
fn parse_record(bytes: &[u8]) -> Result<UserNamespace, UsernsError> {
    let ns: UserNamespace = serde_json::from_slice(bytes)
        .map_err(|e| bad(format!("invalid user namespace mappings file: {e}")))?;
    if ns.uids.len() != 1 {
        return Err(bad(
            "invalid user namespace configuration: no more than one mapping allowed.".into(),
        ));
    }
    if ns.uids != ns.gids {
        return Err(bad(
            "invalid user namespace configuration: GID and UID mapping should be identical".into(),
        ));
    }
    if ns.uids[0].container_id != 0 {
        return Err(bad(
            "invalid user namespace configuration: UID 0 must be mapped".into(),
        ));
    }
    Ok(ns)
}

#[cfg(test)]
mod tests;
