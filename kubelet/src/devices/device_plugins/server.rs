//! The device manager's sockets: the `Registration` service on `kubelet.sock` and a client per
//! registered plugin (its `ListAndWatch` stream feeds the devices, `Allocate` is called at
//! admission).

use super::{AllocateError, DeviceManager, Endpoint};
use cri_proto::deviceplugin::{KUBELET_SOCKET, VERSION, v1beta1 as api};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long dialing a plugin's socket may take (upstream's 10 s dial timeout).
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the registration socket could not be served.
/// A registering plugin's socket could not be dialled (upstream's `errFailedToDialDevicePlugin`
/// prefix, then which plugin and where).
#[derive(Debug, thiserror::Error)]
#[error("failed to dial device plugin {resource:?} at {socket}: {cause}")]
pub struct DialError {
    resource: String,
    socket: String,
    cause: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("device plugin directory {dir}: {source}")]
    Dir { dir: String, source: std::io::Error },
    #[error("listening on {path}: {source}")]
    Listen {
        path: String,
        source: std::io::Error,
    },
}

/// Go's text for a gRPC error status (`rpc error: code = Unknown desc = ...`).
pub(super) fn go_rpc_error(s: &tonic::Status) -> String {
    format!("rpc error: code = {:?} desc = {}", s.code(), s.message())
}

pub(super) async fn allocate(
    mut client: api::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
    ids: Vec<String>,
) -> Result<api::ContainerAllocateResponse, AllocateError> {
    let req = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest { devices_ids: ids }],
    };
    let resp = tokio::time::timeout(super::PLUGIN_CALL_TIMEOUT, client.allocate(req))
        .await
        .map_err(|_| {
            AllocateError::Plugin(
                "rpc error: code = DeadlineExceeded desc = context deadline exceeded".into(),
            )
        })?
        .map_err(|s| AllocateError::Plugin(go_rpc_error(&s)))?
        .into_inner();
    // One container was asked for: upstream takes the first answer.
    resp.container_responses
        .into_iter()
        .next()
        .ok_or_else(|| AllocateError::Plugin("failed to allocate devices: no response".into()))
}

/// `GetPreferredAllocation` for one container: the IDs the plugin prefers (none when it
/// answered no container). A failure is upstream's admission error text.
pub(super) async fn preferred(
    mut client: api::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
    available: Vec<String>,
    size: usize,
) -> Result<Vec<String>, AllocateError> {
    let req = api::PreferredAllocationRequest {
        container_requests: vec![api::ContainerPreferredAllocationRequest {
            available_device_i_ds: available,
            must_include_device_i_ds: Vec::new(),
            allocation_size: i32::try_from(size).unwrap_or(i32::MAX),
        }],
    };
    let failed = |e: String| {
        AllocateError::Plugin(format!(
            "device plugin GetPreferredAllocation rpc failed with err: {e}"
        ))
    };
    let resp = tokio::time::timeout(
        super::PLUGIN_CALL_TIMEOUT,
        client.get_preferred_allocation(req),
    )
    .await
    .map_err(|_| failed(DEADLINE.into()))?
    .map_err(|s| failed(go_rpc_error(&s)))?
    .into_inner();
    // Upstream uses the answer only when it holds exactly one container's.
    Ok(match <[_; 1]>::try_from(resp.container_responses) {
        Ok([one]) => one.device_i_ds,
        Err(_) => Vec::new(),
    })
}

/// `PreStartContainer` with the container's devices (upstream's 30 s limit).
pub(super) async fn pre_start(
    mut client: api::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
    ids: Vec<String>,
) -> Result<(), String> {
    let req = api::PreStartContainerRequest { devices_ids: ids };
    tokio::time::timeout(super::PLUGIN_CALL_TIMEOUT, client.pre_start_container(req))
        .await
        .map_err(|_| DEADLINE.to_string())?
        .map_err(|s| go_rpc_error(&s))?;
    Ok(())
}

/// Go's text for a call that ran out of time.
const DEADLINE: &str = "rpc error: code = DeadlineExceeded desc = context deadline exceeded";

/// Removes the sockets in `dir` (stale plugins and an old `kubelet.sock`): plugins watch for
/// this and register again with the new kubelet. Other files (the checkpoint) stay.
fn clean_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_socket() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

/// A plugin's endpoint name must be a plain file name inside the plugin directory.
fn valid_endpoint(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0')
        && name != KUBELET_SOCKET
}

struct Registrar {
    manager: Arc<DeviceManager>,
    cancel: CancellationToken,
}

#[tonic::async_trait]
impl api::registration_server::Registration for Registrar {
    async fn register(
        &self,
        req: tonic::Request<api::RegisterRequest>,
    ) -> Result<tonic::Response<api::Empty>, tonic::Status> {
        let r = req.into_inner();
        tracing::info!(resource = %r.resource_name, endpoint = %r.endpoint, "got registration request from device plugin");
        if r.version != VERSION {
            return Err(tonic::Status::unknown(format!(
                "requested API version {:?} is not supported by kubelet. Supported versions are [\"{VERSION}\"]",
                r.version
            )));
        }
        if !super::is_extended_resource_name(&r.resource_name) {
            return Err(tonic::Status::unknown(format!(
                "the ResourceName {:?} is invalid",
                r.resource_name
            )));
        }
        if !valid_endpoint(&r.endpoint) {
            return Err(tonic::Status::unknown(format!(
                "the endpoint {:?} is not a socket name inside the device plugin directory",
                r.endpoint
            )));
        }
        let path = self.manager.dir.join(&r.endpoint);
        let socket = path.display().to_string();
        let channel = cri_proto::connect(&socket, DIAL_TIMEOUT)
            .await
            .map_err(|e| {
                let err = DialError {
                    resource: r.resource_name.clone(),
                    socket,
                    cause: e.cause().to_string(),
                };
                tracing::error!(error = %err, "unable to connect to the device plugin");
                tonic::Status::unknown(err.to_string())
            })?;
        let client = api::device_plugin_client::DevicePluginClient::new(channel)
            .max_decoding_message_size(cri_proto::MAX_MSG_SIZE);
        let options = r.options.unwrap_or_default();
        let generation = self
            .manager
            .connect(&r.resource_name, client.clone(), options);
        crate::metrics::devices().registered(&r.resource_name);
        let manager = self.manager.clone();
        let cancel = self.cancel.clone();
        let resource = r.resource_name.clone();
        tokio::spawn(async move {
            manager.watch(resource, client, generation, cancel).await;
        });
        Ok(tonic::Response::new(api::Empty {}))
    }
}

impl DeviceManager {
    /// Records a (re-)registered plugin for `resource`; returns its generation.
    fn connect(
        &self,
        resource: &str,
        client: api::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
        options: api::DevicePluginOptions,
    ) -> u64 {
        let mut st = self.lock();
        st.generation += 1;
        let generation = st.generation;
        st.removed.remove(resource);
        let r = st.resources.entry(resource.to_string()).or_default();
        r.endpoint = Some(Endpoint {
            client,
            options,
            generation,
        });
        r.stopped_at = None;
        generation
    }

    /// Follows the plugin's `ListAndWatch` until it ends, then marks its devices unhealthy
    /// and starts the grace period (upstream's `PluginDisconnected`).
    async fn watch(
        self: Arc<Self>,
        resource: String,
        mut client: api::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
        generation: u64,
        cancel: CancellationToken,
    ) {
        let stream = tokio::select! {
            _ = cancel.cancelled() => return,
            s = tokio::time::timeout(super::PLUGIN_CALL_TIMEOUT, client.list_and_watch(api::Empty {})) => s,
        };
        match stream {
            Ok(Ok(stream)) => {
                let mut stream = stream.into_inner();
                loop {
                    let msg = tokio::select! {
                        _ = cancel.cancelled() => return,
                        m = stream.message() => m,
                    };
                    match msg {
                        Ok(Some(list)) => {
                            let devices = list.devices.clone();
                            if !self.update_devices(&resource, generation, list.devices) {
                                return;
                            }
                            self.note_reported_health(&resource, &devices);
                            self.save().await;
                        }
                        Ok(None) => break,
                        Err(s) => {
                            tracing::warn!(resource = %resource, error = %go_rpc_error(&s), "ListAndWatch ended unexpectedly for device plugin");
                            break;
                        }
                    }
                }
            }
            Ok(Err(s)) => {
                tracing::warn!(resource = %resource, error = %go_rpc_error(&s), "ListAndWatch failed for device plugin")
            }
            Err(_) => {
                tracing::warn!(resource = %resource, "ListAndWatch timed out for device plugin")
            }
        }
        self.disconnected(&resource, generation);
    }

    /// Replaces the resource's devices; false when a newer registration took over.
    fn update_devices(&self, resource: &str, generation: u64, devices: Vec<api::Device>) -> bool {
        let mut st = self.lock();
        let Some(r) = st.resources.get_mut(resource) else {
            return false;
        };
        if r.endpoint.as_ref().map(|e| e.generation) != Some(generation) {
            return false;
        }
        r.devices = devices.into_iter().map(|d| (d.id.clone(), d)).collect();
        tracing::debug!(
            resource,
            count = r.devices.len(),
            "device plugin updated its devices"
        );
        true
    }

    fn disconnected(&self, resource: &str, generation: u64) {
        let mut st = self.lock();
        let Some(r) = st.resources.get_mut(resource) else {
            return;
        };
        if r.endpoint.as_ref().map(|e| e.generation) != Some(generation) {
            return;
        }
        tracing::info!(
            resource,
            "device plugin disconnected; its devices are unhealthy until it registers again"
        );
        r.endpoint = None;
        r.stopped_at = Some(Instant::now());
        for d in r.devices.values_mut() {
            d.health = cri_proto::deviceplugin::UNHEALTHY.into();
        }
    }

    /// Serves `Registration` on `<dir>/kubelet.sock` until `cancel`, after removing stale
    /// sockets from the directory.
    pub async fn serve(self: Arc<Self>, cancel: CancellationToken) -> Result<(), ServeError> {
        let dir = self.dir.clone();
        let d = dir.clone();
        tokio::task::spawn_blocking(move || clean_dir(&d))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())))
            .map_err(|source| ServeError::Dir {
                dir: dir.display().to_string(),
                source,
            })?;
        let path = dir.join(KUBELET_SOCKET);
        let listener =
            tokio::net::UnixListener::bind(&path).map_err(|source| ServeError::Listen {
                path: path.display().to_string(),
                source,
            })?;
        tracing::info!(socket = %path.display(), "serving device plugin registration");
        let registrar = Registrar {
            manager: self.clone(),
            cancel: cancel.clone(),
        };
        let incoming = cri_proto::uds::incoming(listener);
        let res = tonic::transport::Server::builder()
            .add_service(api::registration_server::RegistrationServer::new(registrar))
            .serve_with_incoming_shutdown(incoming, cancel.cancelled())
            .await;
        if let Err(e) = res {
            tracing::warn!(error = %e, "device plugin registration server stopped");
        }
        Ok(())
    }
}
