//! The DRA manager's families, under upstream's names, help texts, labels and buckets (they
//! carry no `kubelet_` prefix upstream either):
//!
//! - `dra_operations_duration_seconds` (`operation_name`: `PrepareResources` /
//!   `UnprepareResources`, `is_error`: `true` when the pod's operation failed);
//! - `dra_grpc_operations_duration_seconds` (`driver_name`, `method_name`: the full gRPC
//!   method path, `grpc_status_code`: Go's code name, `OK` on success);
//! - `dra_resource_claims_in_use` (`driver_name`, and `<any>` for all prepared claims),
//!   computed at scrape time from the manager's claim cache as upstream's collector does:
//!   only drivers with prepared claims are listed, `<any>` always once a manager exists.
//!
//! Recorded with `metrics::dra().operation(...)` / `.grpc(...)`; the manager hands its
//! count to [`Dra::set_claims_in_use`].

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, HistogramVec};

use super::{DEF_BUCKETS, gauge_vec, histogram_vec};

/// The `driver_name` of the count of all prepared claims (upstream's
/// `DRAResourceClaimsInUseAnyDriver`).
pub const ANY_DRIVER: &str = "<any>";

/// Prepared claims per driver name, with [`ANY_DRIVER`] for the total.
pub type ClaimsInUseFn = dyn Fn() -> BTreeMap<String, usize> + Send + Sync;

/// `dra_resource_claims_in_use`, read from its source at every scrape.
#[derive(Clone)]
pub struct ClaimsInUse {
    gauge: GaugeVec,
    source: Arc<Mutex<Option<Arc<ClaimsInUseFn>>>>,
}

impl ClaimsInUse {
    fn new() -> Self {
        Self {
            gauge: gauge_vec(
                "dra_resource_claims_in_use",
                "The number of ResourceClaims that are currently in use on the node, by driver name (driver_name label value) and across all drivers (special value <any> for driver_name). Note that the sum of all by-driver counts is not the total number of in-use ResourceClaims because the same ResourceClaim might use devices from different drivers. Instead, use the count for the <any> driver_name.",
                &["driver_name"],
            ),
            source: Arc::default(),
        }
    }
}

impl Collector for ClaimsInUse {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let source = self
            .source
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        // Rebuilt at each scrape: drivers without prepared claims drop out, as upstream's
        // const metrics do.
        self.gauge.reset();
        if let Some(f) = source {
            for (driver, n) in f() {
                self.gauge.with_label_values(&[&driver]).set(n as f64);
            }
        }
        self.gauge.collect()
    }
}

/// The DRA families of the process (or of a test).
#[derive(Clone)]
pub struct Dra {
    pub operations: HistogramVec,
    pub grpc: HistogramVec,
    pub claims_in_use: ClaimsInUse,
}

impl Default for Dra {
    fn default() -> Self {
        Self::new()
    }
}

impl Dra {
    /// Fresh families (the process's are [`dra`]; tests make their own).
    pub fn new() -> Self {
        Self {
            operations: histogram_vec(
                "dra_operations_duration_seconds",
                "Latency histogram in seconds for the duration of handling all ResourceClaims referenced by a pod when the pod starts or stops. Identified by the name of the operation (PrepareResources or UnprepareResources) and separated by the success of the operation. The number of failed operations is provided through the histogram's overall count.",
                DEF_BUCKETS.to_vec(),
                &["operation_name", "is_error"],
            ),
            grpc: histogram_vec(
                "dra_grpc_operations_duration_seconds",
                "Duration in seconds of the DRA gRPC operations",
                DEF_BUCKETS.to_vec(),
                &["driver_name", "method_name", "grpc_status_code"],
            ),
            claims_in_use: ClaimsInUse::new(),
        }
    }

    /// One pod's `PrepareResources` / `UnprepareResources` took `elapsed`.
    pub fn operation(&self, name: &str, failed: bool, elapsed: Duration) {
        self.operations
            .with_label_values(&[name, if failed { "true" } else { "false" }])
            .observe(elapsed.as_secs_f64());
    }

    /// One gRPC call to `driver`'s plugin (`method`: the full path) ended with `code`.
    pub fn grpc(&self, driver: &str, method: &str, code: &str, elapsed: Duration) {
        self.grpc
            .with_label_values(&[driver, method, code])
            .observe(elapsed.as_secs_f64());
    }

    /// Where `dra_resource_claims_in_use` is read from (the DRA manager's cache).
    pub fn set_claims_in_use(&self, source: Arc<ClaimsInUseFn>) {
        *self
            .claims_in_use
            .source
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(source);
    }

    fn all(&self) -> Vec<(Box<dyn Collector>, &'static str)> {
        vec![
            (Box::new(self.operations.clone()), "histogram"),
            (Box::new(self.grpc.clone()), "histogram"),
            (Box::new(self.claims_in_use.clone()), "gauge"),
        ]
    }

    pub(super) fn collectors(&self) -> Vec<Box<dyn Collector>> {
        self.all().into_iter().map(|(c, _)| c).collect()
    }

    /// Every family here carries no samples until something is recorded.
    pub(super) fn may_be_empty(&self) -> Vec<(Box<dyn Collector>, &'static str)> {
        self.all()
    }
}

static DRA: LazyLock<Arc<Dra>> = LazyLock::new(|| Arc::new(Dra::new()));

/// The process's DRA families.
pub fn dra() -> Arc<Dra> {
    DRA.clone()
}
