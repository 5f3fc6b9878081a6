//! `kubelet_cgroup_manager_duration_seconds{operation_type}` around the cgroup edge.

use std::sync::Arc;
use std::time::Instant;

use crate::cm::{CgroupError, Cgroups};

/// Times every call of the wrapped [`Cgroups`]: `create`, and `destroy` for removals
/// (upstream's operation names).
pub struct InstrumentedCgroups {
    inner: Arc<dyn Cgroups>,
}

impl InstrumentedCgroups {
    pub fn new(inner: Arc<dyn Cgroups>) -> Self {
        Self { inner }
    }

    fn timed(
        &self,
        op: &str,
        f: impl FnOnce() -> Result<(), CgroupError>,
    ) -> Result<(), CgroupError> {
        let started = Instant::now();
        let out = f();
        super::families()
            .cgroup_manager_duration
            .with_label_values(&[op])
            .observe(started.elapsed().as_secs_f64());
        out
    }
}

impl Cgroups for InstrumentedCgroups {
    fn create(&self, path: &str) -> Result<(), CgroupError> {
        self.timed("create", || self.inner.create(path))
    }

    fn remove(&self, path: &str) -> Result<(), CgroupError> {
        self.timed("destroy", || self.inner.remove(path))
    }
}
