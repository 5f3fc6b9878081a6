//! The probe results cache (upstream `prober/results`): the latest result per container ID
//! and probe kind.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::spec::ProbeKind;

/// Upstream `results.Result`: the state a container's probe is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeStatus {
    /// Not decided yet (the startup probe's initial value).
    Unknown,
    Success,
    Failure,
}

impl ProbeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeStatus::Unknown => "Unknown",
            ProbeStatus::Success => "Success",
            ProbeStatus::Failure => "Failure",
        }
    }
}

impl fmt::Display for ProbeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Shared, cheaply cloneable cache of the latest results.
#[derive(Debug, Clone, Default)]
pub struct ResultsCache {
    inner: Arc<Mutex<HashMap<(String, ProbeKind), ProbeStatus>>>,
}

impl ResultsCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The cached result for a container's probe, if its worker has set one.
    pub fn get(&self, container_id: &str, kind: ProbeKind) -> Option<ProbeStatus> {
        self.lock().get(&(container_id.to_string(), kind)).copied()
    }

    /// Sets a result unless `stopped` has fired; returns whether the value changed (so an
    /// update is due). Checking the token under the lock means a worker that has been stopped
    /// cannot write back a result its manager has already removed.
    pub(crate) fn set_unless_stopped(
        &self,
        container_id: &str,
        kind: ProbeKind,
        status: ProbeStatus,
        stopped: &CancellationToken,
    ) -> bool {
        let mut map = self.lock();
        if stopped.is_cancelled() {
            return false;
        }
        map.insert((container_id.to_string(), kind), status) != Some(status)
    }

    pub(crate) fn remove(&self, container_id: &str, kind: ProbeKind) {
        self.lock().remove(&(container_id.to_string(), kind));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, ProbeKind), ProbeStatus>> {
        // A panic while holding this lock cannot leave the map inconsistent: keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_reports_changes_only() {
        let c = ResultsCache::new();
        let live = CancellationToken::new();
        assert!(c.set_unless_stopped("a", ProbeKind::Readiness, ProbeStatus::Failure, &live));
        assert!(!c.set_unless_stopped("a", ProbeKind::Readiness, ProbeStatus::Failure, &live));
        assert!(c.set_unless_stopped("a", ProbeKind::Readiness, ProbeStatus::Success, &live));
        assert_eq!(c.get("a", ProbeKind::Readiness), Some(ProbeStatus::Success));
        assert_eq!(c.get("a", ProbeKind::Liveness), None);

        let stopped = CancellationToken::new();
        stopped.cancel();
        assert!(!c.set_unless_stopped("a", ProbeKind::Readiness, ProbeStatus::Failure, &stopped));
        assert_eq!(c.get("a", ProbeKind::Readiness), Some(ProbeStatus::Success));
        c.remove("a", ProbeKind::Readiness);
        assert_eq!(c.get("a", ProbeKind::Readiness), None);
    }
}
