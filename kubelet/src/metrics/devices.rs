//! Device metrics: the device manager's `kubelet_device_plugin_registration_total` and
//! `kubelet_device_plugin_alloc_duration_seconds` (by `resource_name`), and the pod resources
//! endpoint's `kubelet_pod_resources_endpoint_*` counters (by `server_api_version`), under
//! upstream's names, help texts and labels.
//!
//! Recorded with `metrics::devices().registered(resource)`,
//! `metrics::devices().observe_allocate(resource, elapsed)` and
//! `metrics::devices().pod_resources(call, version, ok)`.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{CounterVec, HistogramVec};

use super::{DEF_BUCKETS, counter_vec, histogram_vec};

/// A call of the pod resources API, for its per-call counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodResourcesCall {
    List,
    Get,
    GetAllocatable,
}

/// The device families of the process.
pub struct Devices {
    pub registrations: CounterVec,
    pub alloc_duration: HistogramVec,
    pub requests_total: CounterVec,
    pub requests_list: CounterVec,
    pub requests_get: CounterVec,
    pub requests_get_allocatable: CounterVec,
    pub errors_list: CounterVec,
    pub errors_get: CounterVec,
    pub errors_get_allocatable: CounterVec,
}

const VERSION_LABEL: &[&str] = &["server_api_version"];

static DEVICES: LazyLock<Devices> = LazyLock::new(|| Devices {
    registrations: counter_vec(
        "kubelet_device_plugin_registration_total",
        "Cumulative number of device plugin registrations. Broken down by resource name.",
        &["resource_name"],
    ),
    alloc_duration: histogram_vec(
        "kubelet_device_plugin_alloc_duration_seconds",
        "Duration in seconds to serve a device plugin Allocation request. Broken down by resource name.",
        DEF_BUCKETS.to_vec(),
        &["resource_name"],
    ),
    requests_total: counter_vec(
        "kubelet_pod_resources_endpoint_requests_total",
        "Cumulative number of requests to the PodResource endpoint. Broken down by server api version.",
        VERSION_LABEL,
    ),
    requests_list: counter_vec(
        "kubelet_pod_resources_endpoint_requests_list",
        "Number of requests to the PodResource List endpoint. Broken down by server api version.",
        VERSION_LABEL,
    ),
    requests_get: counter_vec(
        "kubelet_pod_resources_endpoint_requests_get",
        "Number of requests to the PodResource Get endpoint. Broken down by server api version.",
        VERSION_LABEL,
    ),
    requests_get_allocatable: counter_vec(
        "kubelet_pod_resources_endpoint_requests_get_allocatable",
        "Number of requests to the PodResource GetAllocatableResources endpoint. Broken down by server api version.",
        VERSION_LABEL,
    ),
    errors_list: counter_vec(
        "kubelet_pod_resources_endpoint_errors_list",
        "Number of requests to the PodResource List endpoint which returned error. Broken down by server api version.",
        VERSION_LABEL,
    ),
    errors_get: counter_vec(
        "kubelet_pod_resources_endpoint_errors_get",
        "Number of requests to the PodResource Get endpoint which returned error. Broken down by server api version.",
        VERSION_LABEL,
    ),
    errors_get_allocatable: counter_vec(
        "kubelet_pod_resources_endpoint_errors_get_allocatable",
        "Number of requests to the PodResource GetAllocatableResources endpoint which returned error. Broken down by server api version.",
        VERSION_LABEL,
    ),
});

/// The process's device families.
pub fn devices() -> &'static Devices {
    &DEVICES
}

impl Devices {
    /// A device plugin registered for `resource`.
    pub fn registered(&self, resource: &str) {
        self.registrations.with_label_values(&[resource]).inc();
    }

    /// One `Allocate` call to the plugin of `resource` took `elapsed`.
    pub fn observe_allocate(&self, resource: &str, elapsed: Duration) {
        self.alloc_duration
            .with_label_values(&[resource])
            .observe(elapsed.as_secs_f64());
    }

    /// One pod resources request (counted in the total and its call's counter) and, when it
    /// failed, its call's error counter, as upstream counts them.
    pub fn pod_resources(&self, call: PodResourcesCall, version: &str, ok: bool) {
        let v = &[version];
        self.requests_total.with_label_values(v).inc();
        let (requests, errors) = match call {
            PodResourcesCall::List => (&self.requests_list, &self.errors_list),
            PodResourcesCall::Get => (&self.requests_get, &self.errors_get),
            PodResourcesCall::GetAllocatable => {
                (&self.requests_get_allocatable, &self.errors_get_allocatable)
            }
        };
        requests.with_label_values(v).inc();
        if !ok {
            errors.with_label_values(v).inc();
        }
    }

    fn all(&self) -> Vec<(Box<dyn Collector>, &'static str)> {
        let c = |v: &CounterVec| (Box::new(v.clone()) as Box<dyn Collector>, "counter");
        vec![
            c(&self.registrations),
            (Box::new(self.alloc_duration.clone()), "histogram"),
            c(&self.requests_total),
            c(&self.requests_list),
            c(&self.requests_get),
            c(&self.requests_get_allocatable),
            c(&self.errors_list),
            c(&self.errors_get),
            c(&self.errors_get_allocatable),
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
