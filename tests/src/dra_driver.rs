//! A DRA driver's kubelet plugin for tests: it serves `v1.DRAPlugin` on
//! `<root-dir>/plugins/<driver>/dra.sock` and the kubelet's plugin registration API on
//! `<root-dir>/plugins_registry/<driver>-reg.sock` (type `DRAPlugin`, supported versions
//! `v1.DRAPlugin` and `v1beta1.DRAPlugin`), as a driver built on upstream's kubeletplugin
//! helper does. Each claim is prepared with one device whose CDI ID is
//! `<cdi kind>=<claim name>`; every call is recorded with the claim's UID, and
//! `NodePrepareResources` can be told to fail.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use cri_proto::dra::v1::{
    self as pb,
    dra_plugin_server::{DraPlugin, DraPluginServer},
};
use cri_proto::plugins::registration::RegistrationStatus;
use tonic::{Request, Response, Status};

use crate::registrar::{Registrar, plugin_sockets};

/// One recorded call: `NodePrepareResources <ns>/<name> <uid>`, when it came and when it
/// was answered.
#[derive(Debug, Clone)]
pub struct Call {
    pub what: String,
    pub at: SystemTime,
    pub answered: SystemTime,
}

#[derive(Clone)]
struct State {
    cdi_kind: String,
    calls: Arc<Mutex<Vec<Call>>>,
    fail_prepare: Arc<Mutex<Option<String>>>,
    prepare_delay: Arc<Mutex<Duration>>,
}

impl State {
    fn record(&self, what: String) {
        self.record_since(what, SystemTime::now());
    }

    fn record_since(&self, what: String, at: SystemTime) {
        record(&self.calls, what, at);
    }
}

fn record(calls: &Mutex<Vec<Call>>, what: String, at: SystemTime) {
    calls.lock().unwrap().push(Call {
        what,
        at,
        answered: SystemTime::now(),
    });
}

/// The running plugin; stops (and removes its sockets) on drop.
pub struct TestDraDriver {
    state: State,
    registrar: Registrar,
    pub dra_socket: PathBuf,
    pub registration_socket: PathBuf,
    runtime: Option<tokio::runtime::Runtime>,
}

impl TestDraDriver {
    /// Starts the plugin of driver `driver` for a kubelet whose root directory is `root_dir`;
    /// its CDI IDs are `<cdi_kind>=<claim name>` (`cdi_kind` as `vendor.com/class`).
    pub fn start(root_dir: &Path, driver: &str, cdi_kind: &str) -> TestDraDriver {
        let (dra_socket, registration_socket) = plugin_sockets(root_dir, driver, "dra.sock");
        let state = State {
            cdi_kind: cdi_kind.into(),
            calls: Default::default(),
            fail_prepare: Default::default(),
            prepare_delay: Default::default(),
        };
        let calls = state.calls.clone();
        let registrar = Registrar::new(
            "DRAPlugin",
            driver,
            &dra_socket,
            &["v1.DRAPlugin", "v1beta1.DRAPlugin"],
            Arc::new(move |c| record(&calls, c, SystemTime::now())),
        );
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (dra_sock, reg_sock, st, reg) = (
            dra_socket.clone(),
            registration_socket.clone(),
            state.clone(),
            registrar.clone(),
        );
        runtime.block_on(async move {
            let dra = tokio::net::UnixListener::bind(&dra_sock).unwrap();
            tokio::spawn(async move {
                let _ = tonic::transport::Server::builder()
                    .add_service(DraPluginServer::new(st))
                    .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(dra))
                    .await;
            });
            // The registration socket last, once the plugin answers.
            reg.serve(&reg_sock);
        });
        TestDraDriver {
            state,
            registrar,
            dra_socket,
            registration_socket,
            runtime: Some(runtime),
        }
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state.calls.lock().unwrap().clone()
    }

    /// The first call whose text is `what`.
    pub fn call(&self, what: &str) -> Option<Call> {
        self.calls().into_iter().find(|c| c.what == what)
    }

    /// What the kubelet answered to registration.
    pub fn statuses(&self) -> Vec<RegistrationStatus> {
        self.registrar.statuses()
    }

    /// `NodePrepareResources` takes this long to answer.
    pub fn set_prepare_delay(&self, d: Duration) {
        *self.state.prepare_delay.lock().unwrap() = d;
    }

    /// `NodePrepareResources` fails every claim with this message (None: prepares again).
    pub fn fail_prepare(&self, message: Option<&str>) {
        *self.state.fail_prepare.lock().unwrap() = message.map(str::to_string);
    }
}

impl Drop for TestDraDriver {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
        let _ = std::fs::remove_file(&self.registration_socket);
        let _ = std::fs::remove_file(&self.dra_socket);
    }
}

#[tonic::async_trait]
impl DraPlugin for State {
    async fn node_prepare_resources(
        &self,
        r: Request<pb::NodePrepareResourcesRequest>,
    ) -> Result<Response<pb::NodePrepareResourcesResponse>, Status> {
        let at = SystemTime::now();
        let fail = self.fail_prepare.lock().unwrap().clone();
        let delay = *self.prepare_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        let mut out = pb::NodePrepareResourcesResponse::default();
        for c in r.into_inner().claims {
            self.record_since(
                format!("NodePrepareResources {}/{} {}", c.namespace, c.name, c.uid),
                at,
            );
            let result = match &fail {
                Some(e) => pb::NodePrepareResourceResponse {
                    error: e.clone(),
                    ..Default::default()
                },
                None => pb::NodePrepareResourceResponse {
                    devices: vec![pb::Device {
                        request_names: vec![],
                        pool_name: "node".into(),
                        device_name: format!("dev-{}", c.name),
                        cdi_device_ids: vec![format!("{}={}", self.cdi_kind, c.name)],
                        share_id: None,
                    }],
                    error: String::new(),
                },
            };
            out.claims.insert(c.uid, result);
        }
        Ok(Response::new(out))
    }

    async fn node_unprepare_resources(
        &self,
        r: Request<pb::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<pb::NodeUnprepareResourcesResponse>, Status> {
        let mut out = pb::NodeUnprepareResourcesResponse::default();
        for c in r.into_inner().claims {
            self.record(format!(
                "NodeUnprepareResources {}/{} {}",
                c.namespace, c.name, c.uid
            ));
            out.claims
                .insert(c.uid, pb::NodeUnprepareResourceResponse::default());
        }
        Ok(Response::new(out))
    }
}
