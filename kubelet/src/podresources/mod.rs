//! The pod resources API v1 (upstream's `pkg/kubelet/apis/podresources`): the
//! `v1.PodResourcesLister` gRPC service on `<root-dir>/pod-resources/kubelet.sock`, which
//! monitoring agents (GPU exporters, SR-IOV operators) read to learn which node resources
//! each container holds.
//!
//! - `List`: every active pod (admitted, not ended: the sync loop's workers), its sidecars
//!   (restartable init containers) and containers, each with the devices the device manager
//!   allocated to it (one entry per device, with its NUMA node when the plugin reported one).
//! - `Get`: the same for one pod by namespace and name (upstream's `KubeletPodResourcesGet`,
//!   on by default since 1.34); an unknown pod is upstream's `pod <name> in namespace <ns> not
//!   found`.
//! - `GetAllocatableResources`: every device the plugins registered (healthy or not, as
//!   upstream: this is capacity, not what is free).
//!
//! CPU ids and memory are always empty, and say so on purpose: this agent has no CPU or
//! memory manager, which is what upstream answers with their `none`/`None` policies (no
//! container holds exclusive CPUs or pinned memory, and nothing is allocatable to pin).
//!
//! `dynamic_resources` (upstream's `KubeletPodResourcesDynamicResources`, on by default
//! since 1.34): each DRA claim the container references (`resources.claims`) with its
//! prepared devices (driver, pool, device, share and CDI IDs), from the DRA manager's cache
//! (`dynamic.rs`). The deprecated `v1alpha1.PodResourcesLister` (`List`, containers and
//! devices only) is served on the same socket, as upstream still does (`v1alpha1.rs`).
//!
//! Requests are rate limited as upstream (100 per second, bursts of 10; beyond it
//! `ResourceExhausted: rejected by rate limit`) and counted in
//! `kubelet_pod_resources_endpoint_*`.

mod dynamic;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
mod socket;
#[cfg(test)]
mod tests;
mod v1alpha1;

pub use socket::{ServeError, serve};
pub use v1alpha1::V1Alpha1;

use crate::devices::{DeviceManager, DraManager};
use crate::metrics::PodResourcesCall;
use cri_proto::podresources::{API_VERSION, v1 as api};
use k8s_openapi::api::core::v1::{Container, Pod};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Upstream's rate: requests per second, and the burst allowed above it.
pub const DEFAULT_QPS: f64 = 100.0;
pub const DEFAULT_BURST: f64 = 10.0;

/// The pods the API reports: the active ones (admitted and not ended), from every source.
#[async_trait::async_trait]
pub trait ActivePods: Send + Sync {
    async fn active_pods(&self) -> Vec<Pod>;
}

/// A token bucket (upstream's `rate.Limiter` with `Allow`).
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(qps: f64, burst: f64) -> Self {
        Self {
            qps,
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    fn allow(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The `PodResourcesLister` service.
pub struct PodResources {
    pods: Arc<dyn ActivePods>,
    devices: Option<Arc<DeviceManager>>,
    dra: Option<Arc<DraManager>>,
    limiter: Mutex<Bucket>,
}

impl PodResources {
    /// The service over `pods` and the device manager (None: no devices are reported).
    pub fn new(pods: Arc<dyn ActivePods>, devices: Option<Arc<DeviceManager>>) -> Self {
        Self::with_rate(pods, devices, DEFAULT_QPS, DEFAULT_BURST)
    }

    /// As [`new`](Self::new) with another rate limit (tests).
    pub fn with_rate(
        pods: Arc<dyn ActivePods>,
        devices: Option<Arc<DeviceManager>>,
        qps: f64,
        burst: f64,
    ) -> Self {
        Self {
            pods,
            devices,
            dra: None,
            limiter: Mutex::new(Bucket::new(qps, burst)),
        }
    }

    /// Reports the DRA claims the DRA manager prepared (`dynamic_resources`).
    pub fn with_dra(mut self, dra: Arc<DraManager>) -> Self {
        self.dra = Some(dra);
        self
    }

    fn admit(&self) -> Result<(), tonic::Status> {
        let allowed = self
            .limiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .allow(Instant::now());
        if allowed {
            Ok(())
        } else {
            Err(tonic::Status::resource_exhausted("rejected by rate limit"))
        }
    }

    /// One container's resources.
    fn container(&self, pod: &Pod, c: &Container) -> api::ContainerResources {
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        api::ContainerResources {
            name: c.name.clone(),
            devices: self
                .devices
                .as_ref()
                .map(|d| device_list(d.container_devices(uid, &c.name)))
                .unwrap_or_default(),
            // No CPU or memory manager: upstream's `none` policies hold nothing (module doc).
            cpu_ids: Vec::new(),
            memory: Vec::new(),
            dynamic_resources: self
                .dra
                .as_ref()
                .map(|d| dynamic::resources(d, pod, c))
                .unwrap_or_default(),
        }
    }

    /// A pod's resources: its restartable init containers, then its containers (upstream's
    /// order; plain init containers have ended by the time anyone asks).
    pub fn pod(&self, pod: &Pod) -> api::PodResources {
        let spec = pod.spec.as_ref();
        let sidecars = spec
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
        api::PodResources {
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            containers: sidecars
                .chain(containers)
                .map(|c| self.container(pod, c))
                .collect(),
        }
    }

    /// Every registered device, one entry per device and NUMA node.
    pub fn allocatable(&self) -> api::AllocatableResourcesResponse {
        let devices = self
            .devices
            .as_ref()
            .map(|d| {
                d.all_devices()
                    .into_iter()
                    .flat_map(|(resource, list)| {
                        list.into_iter().map(move |(id, _healthy, numa)| {
                            crate::devices::DeviceEntry {
                                resource: resource.clone(),
                                id,
                                numa,
                            }
                        })
                    })
                    .collect()
            })
            .map(device_list)
            .unwrap_or_default();
        api::AllocatableResourcesResponse {
            devices,
            cpu_ids: Vec::new(),
            memory: Vec::new(),
        }
    }
}

/// Upstream's `containerDevicesFromResourceDeviceInstances`: one entry per device, or per
/// device and NUMA node when it has topology.
fn device_list(entries: Vec<crate::devices::DeviceEntry>) -> Vec<api::ContainerDevices> {
    let mut out = Vec::new();
    for e in entries {
        if e.numa.is_empty() {
            out.push(api::ContainerDevices {
                resource_name: e.resource,
                device_ids: vec![e.id],
                topology: None,
            });
            continue;
        }
        for n in e.numa {
            out.push(api::ContainerDevices {
                resource_name: e.resource.clone(),
                device_ids: vec![e.id.clone()],
                topology: Some(api::TopologyInfo {
                    nodes: vec![api::NumaNode { id: n }],
                }),
            });
        }
    }
    out
}

fn counted<T>(call: PodResourcesCall, r: Result<T, tonic::Status>) -> Result<T, tonic::Status> {
    crate::metrics::devices().pod_resources(call, API_VERSION, r.is_ok());
    r
}

#[tonic::async_trait]
impl api::pod_resources_lister_server::PodResourcesLister for PodResources {
    async fn list(
        &self,
        _: tonic::Request<api::ListPodResourcesRequest>,
    ) -> Result<tonic::Response<api::ListPodResourcesResponse>, tonic::Status> {
        self.admit()?;
        let pods = self.pods.active_pods().await;
        let resp = api::ListPodResourcesResponse {
            pod_resources: pods.iter().map(|p| self.pod(p)).collect(),
        };
        counted(PodResourcesCall::List, Ok(tonic::Response::new(resp)))
    }

    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<api::AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<api::AllocatableResourcesResponse>, tonic::Status> {
        self.admit()?;
        counted(
            PodResourcesCall::GetAllocatable,
            Ok(tonic::Response::new(self.allocatable())),
        )
    }

    async fn get(
        &self,
        req: tonic::Request<api::GetPodResourcesRequest>,
    ) -> Result<tonic::Response<api::GetPodResourcesResponse>, tonic::Status> {
        self.admit()?;
        let req = req.into_inner();
        let pods = self.pods.active_pods().await;
        let found = pods.iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(req.pod_namespace.as_str())
                && p.metadata.name.as_deref() == Some(req.pod_name.as_str())
        });
        let r = match found {
            Some(p) => Ok(tonic::Response::new(api::GetPodResourcesResponse {
                pod_resources: Some(self.pod(p)),
            })),
            None => Err(tonic::Status::unknown(format!(
                "pod {} in namespace {} not found",
                req.pod_name, req.pod_namespace
            ))),
        };
        counted(PodResourcesCall::Get, r)
    }
}
