//! `kubelet_cgroup_manager_duration_seconds{operation_type}` around the cgroup edge.

use std::sync::Arc;
use std::time::Instant;

use std::collections::BTreeMap;

use crate::cm::{CgroupError, CgroupLimits, CgroupVersion, Cgroups};

/// Times every change through the wrapped [`Cgroups`]: `create`, `update` for limits and
/// `destroy` for removals (upstream's operation names).
pub struct InstrumentedCgroups {
    inner: Arc<dyn Cgroups>,
}

impl InstrumentedCgroups {
    pub fn new(inner: Arc<dyn Cgroups>) -> Self {
        Self { inner }
    }

    fn timed<T>(
        &self,
        op: &str,
        f: impl FnOnce() -> Result<T, CgroupError>,
    ) -> Result<T, CgroupError> {
        let started = Instant::now();
        let out = f();
        crate::metrics::families()
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

    fn set(&self, path: &str, limits: &CgroupLimits) -> Result<(), CgroupError> {
        self.timed("update", || self.inner.set(path, limits))
    }

    fn read(&self, path: &str) -> Result<BTreeMap<String, String>, CgroupError> {
        self.inner.read(path)
    }

    fn version(&self) -> CgroupVersion {
        self.inner.version()
    }

    fn exists(&self, path: &str) -> bool {
        self.inner.exists(path)
    }
}
