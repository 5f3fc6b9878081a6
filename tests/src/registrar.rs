//! The kubelet's plugin registration API (`pluginregistration.v1`) as a plugin's registrar
//! serves it (node-driver-registrar for CSI drivers, upstream's kubeletplugin helper for DRA
//! drivers): `GetInfo` answers the plugin's type, name, endpoint and versions,
//! `NotifyRegistrationStatus` keeps the kubelet's answer. Both calls are reported to the
//! owning test plugin's call log.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cri_proto::plugins::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::{Registration, RegistrationServer},
};
use tonic::{Request, Response, Status};

/// Where the owning plugin records a call (`GetInfo`,
/// `NotifyRegistrationStatus registered=<bool> <error>`).
pub type CallLog = Arc<dyn Fn(String) + Send + Sync>;

/// One plugin's registration service.
#[derive(Clone)]
pub struct Registrar {
    info: PluginInfo,
    log: CallLog,
    statuses: Arc<Mutex<Vec<RegistrationStatus>>>,
}

impl Registrar {
    /// The registrar of a plugin of `kind` (`CSIPlugin`, `DRAPlugin`) named `name`, serving at
    /// `endpoint`, speaking `versions`.
    pub fn new(kind: &str, name: &str, endpoint: &Path, versions: &[&str], log: CallLog) -> Self {
        Registrar {
            info: PluginInfo {
                r#type: kind.into(),
                name: name.into(),
                endpoint: endpoint.display().to_string(),
                supported_versions: versions.iter().map(|v| v.to_string()).collect(),
            },
            log,
            statuses: Default::default(),
        }
    }

    /// What the kubelet answered so far.
    pub fn statuses(&self) -> Vec<RegistrationStatus> {
        self.statuses.lock().unwrap().clone()
    }

    /// Serves on `socket` from the current tokio runtime (bind now, answer in a task).
    pub fn serve(&self, socket: &Path) {
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        let svc = RegistrationServer::new(self.clone());
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
                .await;
        });
    }
}

/// The sockets of a plugin for a kubelet whose root directory is `root_dir`:
/// `<root-dir>/plugins/<name>/<socket>` and `<root-dir>/plugins_registry/<name>-reg.sock`,
/// with their directories made and stale sockets removed.
pub fn plugin_sockets(root_dir: &Path, name: &str, socket: &str) -> (PathBuf, PathBuf) {
    let plugin_dir = root_dir.join("plugins").join(name);
    let registry = root_dir.join("plugins_registry");
    std::fs::create_dir_all(&plugin_dir).unwrap();
    std::fs::create_dir_all(&registry).unwrap();
    let plugin = plugin_dir.join(socket);
    let registration = registry.join(format!("{name}-reg.sock"));
    let _ = std::fs::remove_file(&plugin);
    let _ = std::fs::remove_file(&registration);
    (plugin, registration)
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        (self.log)("GetInfo".into());
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        r: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let r = r.into_inner();
        (self.log)(format!(
            "NotifyRegistrationStatus registered={} {}",
            r.plugin_registered, r.error
        ));
        self.statuses.lock().unwrap().push(r);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
