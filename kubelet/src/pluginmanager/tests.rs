use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cri_proto::plugins::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::{Registration, RegistrationServer},
};
use tonic::{Request, Response, Status};

use super::fake::FakeHandler;
use super::*;

/// The plugin side of registration, as node-driver-registrar serves it.
#[derive(Clone)]
struct Plugin {
    info: PluginInfo,
    statuses: Arc<Mutex<Vec<RegistrationStatus>>>,
}

#[tonic::async_trait]
impl Registration for Plugin {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }
    async fn notify_registration_status(
        &self,
        r: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.statuses.lock().unwrap().push(r.into_inner());
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

fn info(kind: &str, name: &str) -> PluginInfo {
    PluginInfo {
        r#type: kind.into(),
        name: name.into(),
        endpoint: String::new(),
        supported_versions: vec!["1.0.0".into()],
    }
}

/// Serves `info` on a socket at `path`; returns the statuses the kubelet sent.
fn serve(
    path: &Path,
    info: PluginInfo,
) -> (
    Arc<Mutex<Vec<RegistrationStatus>>>,
    tokio::task::JoinHandle<()>,
) {
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let plugin = Plugin {
        info,
        statuses: statuses.clone(),
    };
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(plugin))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await;
    });
    (statuses, task)
}

fn manager(dir: &Path) -> (Arc<PluginManager>, Arc<FakeHandler>) {
    let handler = Arc::new(FakeHandler::default());
    let mut m = PluginManager::new(dir.to_path_buf());
    m.add_handler("CSIPlugin", handler.clone());
    (Arc::new(m), handler)
}

fn sock(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

#[tokio::test]
async fn a_socket_present_at_start_registers_and_hears_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(dir.path(), "csi.example.com-reg.sock");
    let (statuses, _t) = serve(&path, info("CSIPlugin", "csi.example.com"));
    let (m, handler) = manager(dir.path());
    m.reconcile().await;
    let endpoint = path.display().to_string();
    assert_eq!(
        handler.calls(),
        vec![
            format!("validate csi.example.com {endpoint} 1.0.0"),
            format!("register csi.example.com {endpoint}"),
        ]
    );
    assert_eq!(
        statuses.lock().unwrap().clone(),
        vec![RegistrationStatus {
            plugin_registered: true,
            error: String::new()
        }]
    );
    // Registered once: a second pass does not ask again.
    m.reconcile().await;
    assert_eq!(handler.calls().len(), 2);
    assert_eq!(m.registered().len(), 1);
}

#[tokio::test]
async fn the_plugins_own_endpoint_is_passed_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(dir.path(), "reg.sock");
    let mut i = info("CSIPlugin", "d");
    i.endpoint = "/var/lib/kubelet/plugins/d/csi.sock".into();
    let (_s, _t) = serve(&path, i);
    let (m, handler) = manager(dir.path());
    m.reconcile().await;
    assert_eq!(
        handler.calls()[1],
        "register d /var/lib/kubelet/plugins/d/csi.sock"
    );
}

#[tokio::test]
async fn a_removed_socket_deregisters_and_a_new_one_registers() {
    let dir = tempfile::tempdir().unwrap();
    let (m, handler) = manager(dir.path());
    m.reconcile().await;
    assert!(handler.calls().is_empty());
    // Appears after start.
    let path = sock(dir.path(), "reg.sock");
    let (_s, task) = serve(&path, info("CSIPlugin", "d"));
    m.reconcile().await;
    assert_eq!(m.registered().len(), 1);
    // Goes away.
    task.abort();
    std::fs::remove_file(&path).unwrap();
    m.reconcile().await;
    assert_eq!(handler.calls().last().unwrap(), "deregister d");
    assert!(m.registered().is_empty());
}

#[tokio::test]
async fn a_socket_replaced_at_the_same_path_registers_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(dir.path(), "reg.sock");
    let (_s, task) = serve(&path, info("CSIPlugin", "d"));
    let (m, handler) = manager(dir.path());
    m.reconcile().await;
    task.abort();
    std::fs::remove_file(&path).unwrap();
    let (_s2, _t2) = serve(&path, info("CSIPlugin", "d"));
    m.reconcile().await;
    let calls = handler.calls();
    assert_eq!(
        calls[2..],
        [
            "deregister d".to_string(),
            format!("validate d {} 1.0.0", path.display()),
            format!("register d {}", path.display()),
        ]
    );
}

#[tokio::test]
async fn an_unknown_plugin_type_is_told_upstreams_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(dir.path(), "reg.sock");
    let (statuses, _t) = serve(&path, info("GPUPlugin", "g"));
    let (m, handler) = manager(dir.path());
    m.reconcile().await;
    assert!(handler.calls().is_empty());
    assert!(m.registered().is_empty());
    let s = statuses.lock().unwrap().clone();
    assert_eq!(s.len(), 1);
    assert!(!s[0].plugin_registered);
    assert_eq!(
        s[0].error,
        format!(
            "RegisterPlugin error -- no handler registered for plugin type: GPUPlugin at socket {}",
            path.display()
        )
    );
}

#[tokio::test]
async fn a_validation_failure_reaches_the_plugin_and_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(dir.path(), "reg.sock");
    let (statuses, _t) = serve(&path, info("CSIPlugin", "d"));
    let (m, handler) = manager(dir.path());
    *handler.refuse_validate.lock().unwrap() = Some("bad versions".into());
    m.reconcile().await;
    assert_eq!(
        statuses.lock().unwrap()[0].error,
        "RegisterPlugin error -- plugin validation failed with err: bad versions"
    );
    assert!(m.registered().is_empty());
    *handler.refuse_validate.lock().unwrap() = None;
    m.reconcile().await;
    assert_eq!(m.registered().len(), 1);
    assert!(statuses.lock().unwrap()[1].plugin_registered);
}

#[tokio::test]
async fn a_register_failure_is_told_and_kept_for_deregistration() {
    let dir = tempfile::tempdir().unwrap();
    let path = sock(dir.path(), "reg.sock");
    let (statuses, task) = serve(&path, info("CSIPlugin", "d"));
    let (m, handler) = manager(dir.path());
    *handler.refuse_register.lock().unwrap() = Some("NodeGetInfo failed".into());
    m.reconcile().await;
    assert_eq!(
        statuses.lock().unwrap()[0].error,
        "RegisterPlugin error -- plugin registration failed with err: NodeGetInfo failed"
    );
    task.abort();
    std::fs::remove_file(&path).unwrap();
    m.reconcile().await;
    assert_eq!(handler.calls().last().unwrap(), "deregister d");
}

#[tokio::test]
async fn hidden_files_plain_files_symlinks_and_dead_sockets_are_not_plugins() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let (_s1, _t1) = serve(
        &dir.path().join(".hidden.sock"),
        info("CSIPlugin", "hidden"),
    );
    let real = outside.path().join("real.sock");
    let (_s2, _t2) = serve(&real, info("CSIPlugin", "outside"));
    std::os::unix::fs::symlink(&real, dir.path().join("link.sock")).unwrap();
    std::fs::write(dir.path().join("plain.sock"), b"not a socket").unwrap();
    // A socket nobody listens on: dial fails, nothing registers, the manager keeps going.
    drop(std::os::unix::net::UnixListener::bind(dir.path().join("dead.sock")).unwrap());
    let (m, handler) = manager(dir.path());
    m.reconcile().await;
    assert!(handler.calls().is_empty(), "{:?}", handler.calls());
    assert!(m.registered().is_empty());
}

#[tokio::test]
async fn sockets_in_subdirectories_register() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let path = dir.path().join("sub").join("reg.sock");
    let (_s, _t) = serve(&path, info("CSIPlugin", "d"));
    let (m, _handler) = manager(dir.path());
    m.reconcile().await;
    assert!(m.registered().contains_key(&path));
}

#[tokio::test]
async fn run_makes_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry_dir(dir.path());
    let (m, _h) = manager(&reg);
    let cancel = CancellationToken::new();
    let t = tokio::spawn(m.run(cancel.clone()));
    for _ in 0..50 {
        if reg.is_dir() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    t.await.unwrap();
    assert!(reg.is_dir());
}

/// This manager's samples of `plugin_manager_total_plugins` (by socket path and state).
fn plugin_samples(dir: &Path) -> Vec<(String, String)> {
    use prometheus::core::Collector;
    let prefix = dir.display().to_string();
    let mut out = Vec::new();
    for family in crate::metrics::volumes().plugins.collect() {
        for m in family.get_metric() {
            let label = |n: &str| {
                m.get_label()
                    .iter()
                    .find(|l| l.name() == n)
                    .map(|l| l.value().to_string())
                    .unwrap_or_default()
            };
            let path = label("socket_path");
            if path.starts_with(&prefix) && m.get_gauge().get_value() == 1.0 {
                out.push((path, label("state")));
            }
        }
    }
    out.sort();
    out
}

/// `plugin_manager_total_plugins`: a socket found counts in the desired state, a registered
/// one in the actual state too; a refused plugin only in the desired state; a socket gone
/// leaves no sample.
#[tokio::test]
async fn total_plugins_counts_sockets_found_and_registered() {
    let dir = tempfile::tempdir().unwrap();
    let good = sock(dir.path(), "good.sock");
    let bad = sock(dir.path(), "bad.sock");
    let (_s, task) = serve(&good, info("CSIPlugin", "d"));
    let (_s2, _t2) = serve(&bad, info("GPUPlugin", "g"));
    let (m, _handler) = manager(dir.path());
    m.reconcile().await;
    let (g, b) = (good.display().to_string(), bad.display().to_string());
    let s = |p: &str, st: &str| (p.to_string(), st.to_string());
    assert_eq!(
        plugin_samples(dir.path()),
        vec![
            s(&b, "desired_state_of_world"),
            s(&g, "actual_state_of_world"),
            s(&g, "desired_state_of_world"),
        ]
    );
    task.abort();
    std::fs::remove_file(&good).unwrap();
    m.reconcile().await;
    assert_eq!(
        plugin_samples(dir.path()),
        vec![s(&b, "desired_state_of_world")]
    );
}
