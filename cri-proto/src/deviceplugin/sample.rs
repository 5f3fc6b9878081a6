//! A device plugin for tests that behaves as upstream's sample device plugin: it serves the
//! `DevicePlugin` service on a socket in the plugin directory, registers with the kubelet,
//! streams its devices, and answers `Allocate` with an env var, a mount of a per-device host
//! file and a CDI name per device. Devices can be marked unhealthy, `Allocate` can be made to
//! fail, and the plugin can stop (as if it crashed). Its options can ask for
//! `GetPreferredAllocation` (answered from a preference order the test sets) and
//! `PreStartContainer` (recorded, and made to fail on demand).

use super::{HEALTHY, KUBELET_SOCKET, UNHEALTHY, VERSION, v1beta1 as api};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_stream::StreamExt as _;

/// The env var `Allocate` sets: the allocated device IDs, comma-separated.
pub const ENV_NAME: &str = "EXAMPLE_DEVICES";
/// Where each device's host file is mounted in the container (`<dir>/<device ID>`).
pub const MOUNT_DIR: &str = "/run/example-devices";
/// The CDI vendor/class of the devices' names (`example.com/device=<ID>`).
pub const CDI_KIND: &str = "example.com/device";

/// One GetPreferredAllocation request: (available, must include, size).
pub type PreferredCall = (Vec<String>, Vec<String>, i32);

struct Inner {
    /// None once stopped: the ListAndWatch streams end.
    devices: watch::Sender<Option<BTreeMap<String, bool>>>,
    /// Device ID lists of every Allocate call.
    calls: Mutex<Vec<Vec<String>>>,
    fail_allocate: Mutex<Option<String>>,
    host_dir: PathBuf,
    options: Mutex<api::DevicePluginOptions>,
    /// Device IDs in the order GetPreferredAllocation prefers them.
    preference: Mutex<Vec<String>>,
    /// (available, must include, size) of every GetPreferredAllocation call.
    preferred_calls: Mutex<Vec<PreferredCall>>,
    /// Device ID lists of every PreStartContainer call.
    pre_start_calls: Mutex<Vec<Vec<String>>>,
    fail_pre_start: Mutex<Option<String>>,
}

/// A running sample plugin.
pub struct SamplePlugin {
    inner: Arc<Inner>,
    plugin_dir: PathBuf,
    socket_name: String,
    resource: String,
    /// The servers started (one more each time the socket had to be served again).
    servers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// Serves the plugin on a fresh socket at `path`.
fn serve(inner: &Arc<Inner>, path: &Path) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    let svc = api::device_plugin_server::DevicePluginServer::new(Service(inner.clone()));
    Ok(tokio::spawn(async move {
        let incoming = crate::uds::incoming(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(incoming)
            .await;
    }))
}

#[derive(Clone)]
struct Service(Arc<Inner>);

type DeviceStream = Pin<
    Box<dyn tokio_stream::Stream<Item = Result<api::ListAndWatchResponse, tonic::Status>> + Send>,
>;

fn list(devs: &BTreeMap<String, bool>) -> api::ListAndWatchResponse {
    api::ListAndWatchResponse {
        devices: devs
            .iter()
            .map(|(id, ok)| api::Device {
                id: id.clone(),
                health: if *ok { HEALTHY } else { UNHEALTHY }.into(),
                topology: None,
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: tonic::Request<api::Empty>,
    ) -> Result<tonic::Response<api::DevicePluginOptions>, tonic::Status> {
        Ok(tonic::Response::new(*self.0.options.lock().unwrap()))
    }

    async fn get_preferred_allocation(
        &self,
        req: tonic::Request<api::PreferredAllocationRequest>,
    ) -> Result<tonic::Response<api::PreferredAllocationResponse>, tonic::Status> {
        let mut out = api::PreferredAllocationResponse::default();
        for c in req.into_inner().container_requests {
            self.0.preferred_calls.lock().unwrap().push((
                c.available_device_i_ds.clone(),
                c.must_include_device_i_ds.clone(),
                c.allocation_size,
            ));
            let size = usize::try_from(c.allocation_size).unwrap_or(0);
            let mut ids = c.must_include_device_i_ds.clone();
            for id in self.0.preference.lock().unwrap().iter() {
                if ids.len() >= size {
                    break;
                }
                if c.available_device_i_ds.contains(id) && !ids.contains(id) {
                    ids.push(id.clone());
                }
            }
            out.container_responses
                .push(api::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(tonic::Response::new(out))
    }

    async fn pre_start_container(
        &self,
        req: tonic::Request<api::PreStartContainerRequest>,
    ) -> Result<tonic::Response<api::PreStartContainerResponse>, tonic::Status> {
        let mut ids = req.into_inner().devices_ids;
        ids.sort();
        self.0.pre_start_calls.lock().unwrap().push(ids);
        if let Some(msg) = self.0.fail_pre_start.lock().unwrap().clone() {
            return Err(tonic::Status::unknown(msg));
        }
        Ok(tonic::Response::new(api::PreStartContainerResponse {}))
    }

    async fn list_and_watch(
        &self,
        _: tonic::Request<api::Empty>,
    ) -> Result<tonic::Response<DeviceStream>, tonic::Status> {
        let stream = tokio_stream::wrappers::WatchStream::new(self.0.devices.subscribe())
            .take_while(Option::is_some)
            .map(|devs| Ok(list(&devs.unwrap_or_default())));
        Ok(tonic::Response::new(Box::pin(stream)))
    }

    async fn allocate(
        &self,
        req: tonic::Request<api::AllocateRequest>,
    ) -> Result<tonic::Response<api::AllocateResponse>, tonic::Status> {
        if let Some(msg) = self.0.fail_allocate.lock().unwrap().clone() {
            return Err(tonic::Status::unknown(msg));
        }
        let mut out = api::AllocateResponse::default();
        for c in req.into_inner().container_requests {
            self.0.calls.lock().unwrap().push(c.devices_ids.clone());
            let mut resp = api::ContainerAllocateResponse::default();
            resp.envs.insert(ENV_NAME.into(), c.devices_ids.join(","));
            for id in &c.devices_ids {
                let host = self.0.host_dir.join(id);
                let text = format!("device {id}\n");
                let h = host.clone();
                tokio::task::spawn_blocking(move || std::fs::write(h, text))
                    .await
                    .map_err(|e| tonic::Status::internal(e.to_string()))?
                    .map_err(|e| tonic::Status::internal(e.to_string()))?;
                resp.mounts.push(api::Mount {
                    container_path: format!("{MOUNT_DIR}/{id}"),
                    host_path: host.display().to_string(),
                    read_only: true,
                });
                resp.cdi_devices.push(api::CdiDevice {
                    name: format!("{CDI_KIND}={id}"),
                });
            }
            out.container_responses.push(resp);
        }
        Ok(tonic::Response::new(out))
    }
}

/// Why the plugin could not start or register.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error("sample device plugin: {0}")]
    Io(#[from] std::io::Error),
    #[error("sample device plugin: {0}")]
    Connect(#[from] crate::Error),
    #[error("sample device plugin: registration failed: {0}")]
    Register(tonic::Status),
}

impl SamplePlugin {
    /// Serves the plugin on `<plugin_dir>/<socket_name>` with `ids` (all healthy) of
    /// `resource`, writing the devices' host files under `host_dir`. Call [`register`].
    ///
    /// [`register`]: Self::register
    pub async fn start(
        plugin_dir: &Path,
        socket_name: &str,
        resource: &str,
        ids: &[&str],
        host_dir: &Path,
    ) -> Result<Self, SampleError> {
        let devices = Some(ids.iter().map(|i| (i.to_string(), true)).collect());
        let inner = Arc::new(Inner {
            devices: watch::Sender::new(devices),
            calls: Mutex::new(Vec::new()),
            fail_allocate: Mutex::new(None),
            host_dir: host_dir.to_path_buf(),
            options: Mutex::new(api::DevicePluginOptions::default()),
            preference: Mutex::new(Vec::new()),
            preferred_calls: Mutex::new(Vec::new()),
            pre_start_calls: Mutex::new(Vec::new()),
            fail_pre_start: Mutex::new(None),
        });
        let server = serve(&inner, &plugin_dir.join(socket_name))?;
        Ok(Self {
            inner,
            plugin_dir: plugin_dir.to_path_buf(),
            socket_name: socket_name.into(),
            resource: resource.into(),
            servers: Mutex::new(vec![server]),
        })
    }

    /// Registers with the kubelet's `kubelet.sock` in the plugin directory. A kubelet that
    /// (re)started removed the plugin's socket: it is served again first, as plugins do.
    pub async fn register(&self) -> Result<(), SampleError> {
        let path = self.plugin_dir.join(&self.socket_name);
        if !path.exists() {
            let server = serve(&self.inner, &path)?;
            self.servers.lock().unwrap().push(server);
        }
        let sock = self.plugin_dir.join(KUBELET_SOCKET);
        let ch = crate::connect(&sock.display().to_string(), Duration::from_secs(5)).await?;
        let mut client = api::registration_client::RegistrationClient::new(ch);
        let options = *self.inner.options.lock().unwrap();
        client
            .register(api::RegisterRequest {
                version: VERSION.into(),
                endpoint: self.socket_name.clone(),
                resource_name: self.resource.clone(),
                options: Some(options),
            })
            .await
            .map_err(SampleError::Register)?;
        Ok(())
    }

    /// Marks a device healthy or not; the kubelet hears it through ListAndWatch.
    pub fn set_health(&self, id: &str, healthy: bool) {
        self.inner.devices.send_modify(|d| {
            if let Some(d) = d {
                d.insert(id.to_string(), healthy);
            }
        });
    }

    /// The options sent at the next registration (and answered by GetDevicePluginOptions):
    /// whether the kubelet must call PreStartContainer and may call GetPreferredAllocation.
    pub fn set_options(&self, pre_start_required: bool, get_preferred_allocation: bool) {
        *self.inner.options.lock().unwrap() = api::DevicePluginOptions {
            pre_start_required,
            get_preferred_allocation_available: get_preferred_allocation,
        };
    }

    /// The order GetPreferredAllocation picks available devices in (after the must-include
    /// ones).
    pub fn prefer(&self, ids: &[&str]) {
        *self.inner.preference.lock().unwrap() = ids.iter().map(|s| s.to_string()).collect();
    }

    /// (available, must include, size) of every GetPreferredAllocation call so far.
    pub fn preferred_calls(&self) -> Vec<PreferredCall> {
        self.inner.preferred_calls.lock().unwrap().clone()
    }

    /// The device IDs (sorted) of every PreStartContainer call so far.
    pub fn pre_start_calls(&self) -> Vec<Vec<String>> {
        self.inner.pre_start_calls.lock().unwrap().clone()
    }

    /// Makes every later PreStartContainer fail with `message` (None: succeed again).
    pub fn fail_pre_start(&self, message: Option<&str>) {
        *self.inner.fail_pre_start.lock().unwrap() = message.map(str::to_string);
    }

    /// Makes every later Allocate fail with `message` (None: succeed again).
    pub fn fail_allocate(&self, message: Option<&str>) {
        *self.inner.fail_allocate.lock().unwrap() = message.map(str::to_string);
    }

    /// The device IDs of every Allocate call so far.
    pub fn allocate_calls(&self) -> Vec<Vec<String>> {
        self.inner.calls.lock().unwrap().clone()
    }

    /// Stops serving at once (connections drop, the socket file is removed), as a crashed
    /// plugin.
    pub fn stop(&self) {
        self.inner.devices.send_replace(None);
        for s in self.servers.lock().unwrap().iter() {
            s.abort();
        }
        let _ = std::fs::remove_file(self.plugin_dir.join(&self.socket_name));
    }
}

impl Drop for SamplePlugin {
    fn drop(&mut self) {
        self.stop();
    }
}
