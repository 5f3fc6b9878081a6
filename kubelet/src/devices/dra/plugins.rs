//! The DRA drivers' kubelet plugins registered on this node (upstream's `DRAPluginManager`):
//! a plugin registers through the plugin manager's socket directory under its driver's name,
//! listing the gRPC services it serves (`v1.DRAPlugin`, `v1beta1.DRAPlugin`); the first one
//! in its list that the kubelet speaks is used. Calls go over the plugin's endpoint with
//! upstream's 45 s timeout. [`DraPlugin`] is the narrow edge; the fake is in `fake.rs`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cri_proto::dra::{self, v1 as pb};

/// How long one NodePrepareResources / NodeUnprepareResources call may take (upstream's
/// `defaultClientCallTimeout`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(45);
/// Dialing the plugin's socket.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// One driver's kubelet plugin. Errors are Go's gRPC error text.
#[async_trait::async_trait]
pub trait DraPlugin: Send + Sync {
    async fn prepare(
        &self,
        req: pb::NodePrepareResourcesRequest,
    ) -> Result<pb::NodePrepareResourcesResponse, String>;
    async fn unprepare(
        &self,
        req: pb::NodeUnprepareResourcesRequest,
    ) -> Result<pb::NodeUnprepareResourcesResponse, String>;
}

pub use crate::runtime::go_code;

/// Go's text for a gRPC error status.
pub fn go_status(s: &tonic::Status) -> String {
    format!(
        "rpc error: code = {} desc = {}",
        go_code(s.code()),
        s.message()
    )
}

/// The first of `services` (the plugin's order) the kubelet speaks; upstream's messages.
pub fn choose_service(services: &[String]) -> Result<&'static str, String> {
    if services.is_empty() {
        return Err("empty list of supported gRPC services (aka supported versions)".into());
    }
    for s in services {
        if let Some(known) = dra::SERVICES.iter().find(|k| **k == s.as_str()) {
            return Ok(known);
        }
    }
    let quoted = |v: &mut dyn Iterator<Item = &str>| {
        let q: Vec<String> = v.map(|s| format!("{s:?}")).collect();
        format!("[{}]", q.join(" "))
    };
    Err(format!(
        "none of services supported by the plugin ({}) are supported by the kubelet ({})",
        quoted(&mut services.iter().map(String::as_str)),
        quoted(&mut dra::SERVICES.iter().copied())
    ))
}

/// A plugin reached over gRPC at its endpoint (a unix socket), speaking `service`. Every
/// call is counted in `dra_grpc_operations_duration_seconds` (upstream's client
/// interceptor).
pub struct GrpcPlugin {
    channel: cri_proto::Channel,
    v1: bool,
    driver: String,
    metrics: Arc<crate::metrics::Dra>,
}

impl GrpcPlugin {
    /// Dials lazily: the first call connects (and every call after a disconnect).
    pub fn new(
        driver: &str,
        endpoint: &str,
        service: &str,
        metrics: Arc<crate::metrics::Dra>,
    ) -> Result<Self, String> {
        let channel = cri_proto::connect_lazy(endpoint, DIAL_TIMEOUT).map_err(|e| e.to_string())?;
        Ok(GrpcPlugin {
            channel,
            v1: service == dra::V1_SERVICE,
            driver: driver.to_string(),
            metrics,
        })
    }

    /// The full gRPC path of `method` in the service this plugin speaks.
    fn path(&self, method: &str) -> String {
        let version = if self.v1 { "v1" } else { "v1beta1" };
        format!("/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/{method}")
    }

    /// Runs one call with the call timeout and records it.
    async fn timed<T>(
        &self,
        method: &str,
        f: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, String> {
        let started = std::time::Instant::now();
        let (code, r) = match tokio::time::timeout(CALL_TIMEOUT, f).await {
            Ok(Ok(r)) => (tonic::Code::Ok, Ok(r.into_inner())),
            Ok(Err(s)) => (s.code(), Err(go_status(&s))),
            Err(_) => (
                tonic::Code::DeadlineExceeded,
                Err("rpc error: code = DeadlineExceeded desc = context deadline exceeded".into()),
            ),
        };
        self.metrics.grpc(
            &self.driver,
            &self.path(method),
            go_code(code),
            started.elapsed(),
        );
        r
    }
}

// v1beta1 carries the same messages as v1: converted field by field.
fn beta_claims(claims: Vec<pb::Claim>) -> Vec<dra::v1beta1::Claim> {
    claims
        .into_iter()
        .map(|c| dra::v1beta1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

#[async_trait::async_trait]
impl DraPlugin for GrpcPlugin {
    async fn prepare(
        &self,
        req: pb::NodePrepareResourcesRequest,
    ) -> Result<pb::NodePrepareResourcesResponse, String> {
        if self.v1 {
            let mut c = pb::dra_plugin_client::DraPluginClient::new(self.channel.clone());
            return self
                .timed("NodePrepareResources", c.node_prepare_resources(req))
                .await;
        }
        let mut c = dra::v1beta1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
        let req = dra::v1beta1::NodePrepareResourcesRequest {
            claims: beta_claims(req.claims),
        };
        let resp = self
            .timed("NodePrepareResources", c.node_prepare_resources(req))
            .await?;
        Ok(pb::NodePrepareResourcesResponse {
            claims: resp
                .claims
                .into_iter()
                .map(|(uid, r)| {
                    let devices = r
                        .devices
                        .into_iter()
                        .map(|d| pb::Device {
                            request_names: d.request_names,
                            pool_name: d.pool_name,
                            device_name: d.device_name,
                            cdi_device_ids: d.cdi_device_ids,
                            share_id: d.share_id,
                        })
                        .collect();
                    let error = r.error;
                    (uid, pb::NodePrepareResourceResponse { devices, error })
                })
                .collect(),
        })
    }

    async fn unprepare(
        &self,
        req: pb::NodeUnprepareResourcesRequest,
    ) -> Result<pb::NodeUnprepareResourcesResponse, String> {
        if self.v1 {
            let mut c = pb::dra_plugin_client::DraPluginClient::new(self.channel.clone());
            return self
                .timed("NodeUnprepareResources", c.node_unprepare_resources(req))
                .await;
        }
        let mut c = dra::v1beta1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
        let req = dra::v1beta1::NodeUnprepareResourcesRequest {
            claims: beta_claims(req.claims),
        };
        let resp = self
            .timed("NodeUnprepareResources", c.node_unprepare_resources(req))
            .await?;
        Ok(pb::NodeUnprepareResourcesResponse {
            claims: resp
                .claims
                .into_iter()
                .map(|(uid, r)| (uid, pb::NodeUnprepareResourceResponse { error: r.error }))
                .collect(),
        })
    }
}

struct Entry {
    endpoint: String,
    plugin: Arc<dyn DraPlugin>,
}

/// The registered plugins by driver name, in registration order (the latest is used).
#[derive(Default)]
pub struct Plugins {
    by_driver: Mutex<BTreeMap<String, Vec<Entry>>>,
}

impl std::fmt::Debug for Plugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.lock().keys().cloned().collect();
        f.debug_struct("Plugins").field("drivers", &names).finish()
    }
}

impl Plugins {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<Entry>>> {
        self.by_driver.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The plugin manager's validation: the services, upstream's message.
    pub fn validate(
        driver: &str,
        endpoint: &str,
        services: &[String],
    ) -> Result<&'static str, String> {
        choose_service(services).map_err(|e| {
            format!("invalid supported gRPC versions of DRA driver plugin {driver} at endpoint {endpoint}: {e}")
        })
    }

    /// Adds `plugin` for `driver` at `endpoint`; one endpoint cannot be registered twice.
    pub fn add(
        &self,
        driver: &str,
        endpoint: &str,
        plugin: Arc<dyn DraPlugin>,
    ) -> Result<(), String> {
        let mut m = self.lock();
        let list = m.entry(driver.to_string()).or_default();
        if list.iter().any(|e| e.endpoint == endpoint) {
            return Err(format!(
                "endpoint {endpoint} already registered for DRA driver plugin {driver}"
            ));
        }
        list.push(Entry {
            endpoint: endpoint.to_string(),
            plugin,
        });
        Ok(())
    }

    /// Removes the plugin of `driver` at `endpoint` (None: every plugin of the driver).
    pub fn remove(&self, driver: &str, endpoint: Option<&str>) {
        let mut m = self.lock();
        if let Some(list) = m.get_mut(driver) {
            list.retain(|e| endpoint.is_some_and(|ep| ep != e.endpoint));
            if list.is_empty() {
                m.remove(driver);
            }
        }
    }

    /// The plugin to call for `driver`; upstream's messages.
    pub fn get(&self, driver: &str) -> Result<Arc<dyn DraPlugin>, String> {
        if driver.is_empty() {
            return Err("DRA driver name is empty".into());
        }
        self.lock()
            .get(driver)
            .and_then(|l| l.last())
            .map(|e| e.plugin.clone())
            .ok_or_else(|| format!("DRA driver {driver} is not registered"))
    }

    /// The drivers with a registered plugin.
    pub fn drivers(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }
}
