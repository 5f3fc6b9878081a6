//! The plugin manager (upstream's `pkg/kubelet/pluginmanager`): plugins announce themselves by
//! creating a unix socket under `<root-dir>/plugins_registry` that serves the
//! `pluginregistration` API. Every [`RECONCILE_PERIOD`] the manager lists the directory (and
//! its subdirectories; names starting with `.` are ignored), asks each new socket `GetInfo`,
//! hands the plugin to the handler of its type (CSI drivers, and later device and DRA
//! plugins: [`PluginHandler`]) and answers `NotifyRegistrationStatus`, as node-driver-registrar
//! expects. A socket that goes away, or is replaced by a new one at the same path, is
//! deregistered. Sockets already present at start are registered on the first pass, so a
//! restarted agent picks its plugins up again.

mod scan;

#[cfg(any(test, feature = "test-util"))]
pub mod fake;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cri_proto::plugins::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, registration_client::RegistrationClient,
};
use tokio_util::sync::CancellationToken;

pub use scan::SocketId;

/// How often the registry directory is compared with the registered plugins (upstream's
/// reconciler period).
pub const RECONCILE_PERIOD: Duration = Duration::from_secs(1);
/// Dialing a plugin's registration socket (upstream's dialTimeoutDuration).
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The `GetInfo` call (upstream: one second).
const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
/// The `NotifyRegistrationStatus` call (upstream's notifyTimeoutDuration).
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// The registry directory under the kubelet's root directory.
pub fn registry_dir(root_dir: &Path) -> PathBuf {
    root_dir.join("plugins_registry")
}

/// Why a handler refused a plugin: the handler's own error (CSI's, DRA's), whose text goes
/// back to the plugin in `NotifyRegistrationStatus`.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct PluginError(Box<dyn std::error::Error + Send + Sync>);

impl PluginError {
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        PluginError(Box::new(e))
    }

    /// The handler's error, when it is an `E`.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref()
    }
}

/// One consumer of plugins of one type (`CSIPlugin`, `DevicePlugin`, `DRAPlugin`). The
/// manager calls `validate`, then `register`; `deregister` once the socket is gone.
#[async_trait::async_trait]
pub trait PluginHandler: Send + Sync {
    /// Refuses a plugin whose information is wrong (unsupported versions, a duplicate); the
    /// error goes back to the plugin in `NotifyRegistrationStatus`.
    async fn validate(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), PluginError>;
    /// Starts using the plugin; an error is sent back to the plugin.
    async fn register(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), PluginError>;
    /// The plugin's socket went away.
    async fn deregister(&self, name: &str);
}

/// A plugin the manager registered (or handed to a handler whose register failed: upstream
/// keeps those too, so that their removal still reaches the handler).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub plugin_type: String,
    pub name: String,
    pub id: SocketId,
}

/// Errors of one registration attempt (logged; the next pass tries again).
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("RegisterPlugin error -- dial failed at socket {socket}, err: {detail}")]
    Dial { socket: String, detail: String },
    #[error(
        "RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {socket}, err: {detail}"
    )]
    GetInfo { socket: String, detail: String },
    #[error("{0}")]
    Refused(String),
    #[error(
        "RegisterPlugin error -- failed to send registration status at socket {socket}, err: {detail}"
    )]
    Notify { socket: String, detail: String },
}

/// See the module documentation.
pub struct PluginManager {
    dir: PathBuf,
    handlers: HashMap<String, Arc<dyn PluginHandler>>,
    registered: Mutex<BTreeMap<PathBuf, Registered>>,
    /// The sockets last reported found and registered (`plugin_manager_total_plugins`).
    reported: Mutex<(BTreeSet<String>, BTreeSet<String>)>,
}

impl std::fmt::Debug for PluginManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginManager")
            .field("dir", &self.dir)
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl PluginManager {
    /// A manager of the sockets under `dir` (see [`registry_dir`]).
    pub fn new(dir: PathBuf) -> Self {
        PluginManager {
            dir,
            handlers: HashMap::new(),
            registered: Mutex::new(BTreeMap::new()),
            reported: Mutex::default(),
        }
    }

    /// The handler of plugins whose `PluginInfo.type` is `plugin_type`.
    pub fn add_handler(&mut self, plugin_type: &str, handler: Arc<dyn PluginHandler>) {
        self.handlers.insert(plugin_type.to_string(), handler);
    }

    /// The plugins registered now, by socket path.
    pub fn registered(&self) -> BTreeMap<PathBuf, Registered> {
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes the directory (0750 like upstream's) and reconciles every [`RECONCILE_PERIOD`]
    /// until `cancel`.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let dir = self.dir.clone();
        match tokio::task::spawn_blocking(move || scan::ensure_dir(&dir)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(dir = %self.dir.display(), error = %e, "cannot create the plugin registry directory; plugins cannot register");
                return;
            }
            Err(_) => return,
        }
        tracing::info!(dir = %self.dir.display(), "plugin manager watching for plugin sockets");
        let mut tick = tokio::time::interval(RECONCILE_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => self.reconcile().await,
            }
        }
    }

    /// One pass: deregisters what went away or was replaced, registers what is new.
    pub async fn reconcile(&self) {
        let dir = self.dir.clone();
        let Ok(desired) = tokio::task::spawn_blocking(move || scan::sockets(&dir)).await else {
            return;
        };
        let gone: Vec<(PathBuf, Registered)> = self
            .registered()
            .into_iter()
            .filter(|(path, r)| desired.get(path) != Some(&r.id))
            .collect();
        for (path, r) in gone {
            self.registered
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&path);
            tracing::info!(socket = %path.display(), plugin = %r.name, plugin_type = %r.plugin_type, "plugin socket gone: deregistering");
            if let Some(h) = self.handlers.get(&r.plugin_type) {
                h.deregister(&r.name).await;
            }
        }
        let known = self.registered();
        let found: BTreeSet<String> = desired.keys().map(|p| p.display().to_string()).collect();
        for (path, id) in desired {
            if known.contains_key(&path) {
                continue;
            }
            if let Err(e) = self.register(&path, id).await {
                tracing::warn!(socket = %path.display(), error = %e, "plugin registration failed; retrying");
            }
        }
        let registered: BTreeSet<String> = self
            .registered()
            .keys()
            .map(|p| p.display().to_string())
            .collect();
        self.report(found, registered);
    }

    /// `plugin_manager_total_plugins`: this manager's sockets found and registered now; the
    /// samples of sockets gone since the last pass are removed.
    fn report(&self, found: BTreeSet<String>, registered: BTreeSet<String>) {
        use crate::metrics::{ACTUAL_STATE, DESIRED_STATE};
        let mut last = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        for (state, now, before) in [
            (DESIRED_STATE, &found, &last.0),
            (ACTUAL_STATE, &registered, &last.1),
        ] {
            for path in now.union(before) {
                crate::metrics::volumes().set_plugin(path, state, now.contains(path));
            }
        }
        *last = (found, registered);
    }

    async fn register(&self, path: &Path, id: SocketId) -> Result<(), RegisterError> {
        let socket = path.display().to_string();
        let channel = tokio::time::timeout(DIAL_TIMEOUT, cri_proto::connect(&socket, DIAL_TIMEOUT))
            .await
            .map_err(|_| "timed out".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|detail| RegisterError::Dial {
                socket: socket.clone(),
                detail,
            })?;
        let mut client = RegistrationClient::new(channel);
        let info: PluginInfo =
            tokio::time::timeout(GET_INFO_TIMEOUT, client.get_info(InfoRequest {}))
                .await
                .map_err(|_| "deadline exceeded".to_string())
                .and_then(|r| r.map_err(|s| s.message().to_string()))
                .map_err(|detail| RegisterError::GetInfo {
                    socket: socket.clone(),
                    detail,
                })?
                .into_inner();
        let Some(handler) = self.handlers.get(&info.r#type) else {
            let msg = format!(
                "RegisterPlugin error -- no handler registered for plugin type: {} at socket {socket}",
                info.r#type
            );
            notify(&mut client, false, &msg, &socket).await?;
            return Err(RegisterError::Refused(msg));
        };
        let endpoint = if info.endpoint.is_empty() {
            socket.clone()
        } else {
            info.endpoint.clone()
        };
        if let Err(e) = handler
            .validate(&info.name, &endpoint, &info.supported_versions)
            .await
        {
            let msg = format!("RegisterPlugin error -- plugin validation failed with err: {e}");
            notify(&mut client, false, &msg, &socket).await?;
            return Err(RegisterError::Refused(msg));
        }
        // Recorded before the handler's register, so that a removal during it still reaches
        // the handler as a deregistration (upstream's order).
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                path.to_path_buf(),
                Registered {
                    plugin_type: info.r#type.clone(),
                    name: info.name.clone(),
                    id,
                },
            );
        if let Err(e) = handler
            .register(&info.name, &endpoint, &info.supported_versions)
            .await
        {
            let msg = format!("RegisterPlugin error -- plugin registration failed with err: {e}");
            notify(&mut client, false, &msg, &socket).await?;
            return Err(RegisterError::Refused(msg));
        }
        notify(&mut client, true, "", &socket).await?;
        tracing::info!(socket = %socket, plugin = %info.name, plugin_type = %info.r#type, endpoint = %endpoint, "plugin registered");
        Ok(())
    }
}

async fn notify(
    client: &mut RegistrationClient<cri_proto::Channel>,
    registered: bool,
    error: &str,
    socket: &str,
) -> Result<(), RegisterError> {
    let status = RegistrationStatus {
        plugin_registered: registered,
        error: error.to_string(),
    };
    tokio::time::timeout(NOTIFY_TIMEOUT, client.notify_registration_status(status))
        .await
        .map_err(|_| "deadline exceeded".to_string())
        .and_then(|r| r.map(|_| ()).map_err(|s| s.message().to_string()))
        .map_err(|detail| RegisterError::Notify {
            socket: socket.to_string(),
            detail,
        })
}

#[cfg(test)]
mod tests;
