//! A CSI node plugin for tests, with its own node-driver-registrar: it serves the `csi.v1`
//! Identity and Node services on `<root-dir>/plugins/<name>/csi.sock` and the kubelet's
//! plugin registration API on `<root-dir>/plugins_registry/<name>-reg.sock`, as a driver
//! deployed with node-driver-registrar does. Volumes are directories under its data dir,
//! really bind-mounted at the staging and target paths (root only). Every call is recorded;
//! `NodeStageVolume` can be told to fail.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cri_proto::plugins::csi::{
    self,
    identity_server::{Identity, IdentityServer},
    node_server::{Node, NodeServer},
};
use cri_proto::plugins::registration::RegistrationStatus;
use tonic::{Request, Response, Status};

use crate::registrar::{Registrar, plugin_sockets};

/// The CSIDriver object of a driver (`storage.k8s.io/v1`), with `spec` as given. Without an
/// object upstream's kubelet waits for an attach, which no controller does in the test
/// control plane: drivers whose volumes are mounted without one say `attachRequired: false`.
pub fn csi_driver_object(name: &str, spec: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": name}, "spec": spec})
}

/// How the driver behaves.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    pub name: String,
    pub node_id: String,
    pub max_volumes: i64,
    /// Reports STAGE_UNSTAGE_VOLUME.
    pub stage: bool,
    /// `NodeStageVolume` fails with INTERNAL and this message.
    pub fail_stage: Option<String>,
    /// Reports EXPAND_VOLUME (`NodeExpandVolume` is recorded and answers the size asked).
    pub expand: bool,
    pub topology: BTreeMap<String, String>,
}

impl DriverOptions {
    pub fn new(name: &str) -> Self {
        DriverOptions {
            name: name.into(),
            node_id: format!("{name}-node"),
            max_volumes: 8,
            stage: true,
            fail_stage: None,
            expand: true,
            topology: BTreeMap::new(),
        }
    }
}

#[derive(Clone)]
struct State {
    opts: DriverOptions,
    data: PathBuf,
    calls: Arc<Mutex<Vec<String>>>,
    stages: Arc<Mutex<Vec<csi::NodeStageVolumeRequest>>>,
    publishes: Arc<Mutex<Vec<csi::NodePublishVolumeRequest>>>,
}

impl State {
    fn record(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }
}

/// The running driver; stops (and removes its sockets) on drop.
pub struct TestCsiDriver {
    state: State,
    registrar: Registrar,
    pub csi_socket: PathBuf,
    pub registration_socket: PathBuf,
    runtime: Option<tokio::runtime::Runtime>,
}

impl TestCsiDriver {
    /// Starts the driver for a kubelet whose root directory is `root_dir`; its volumes live
    /// under `data_dir/<volume id>`.
    pub fn start(root_dir: &Path, data_dir: &Path, opts: DriverOptions) -> TestCsiDriver {
        let (csi_socket, registration_socket) = plugin_sockets(root_dir, &opts.name, "csi.sock");
        std::fs::create_dir_all(data_dir).unwrap();
        let state = State {
            opts,
            data: data_dir.to_path_buf(),
            calls: Default::default(),
            stages: Default::default(),
            publishes: Default::default(),
        };
        let calls = state.calls.clone();
        let registrar = Registrar::new(
            "CSIPlugin",
            &state.opts.name,
            &csi_socket,
            &["1.0.0"],
            Arc::new(move |c| calls.lock().unwrap().push(c)),
        );
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (csi_sock, reg_sock, st, reg) = (
            csi_socket.clone(),
            registration_socket.clone(),
            state.clone(),
            registrar.clone(),
        );
        runtime.block_on(async move {
            let csi = tokio::net::UnixListener::bind(&csi_sock).unwrap();
            tokio::spawn(async move {
                let _ = tonic::transport::Server::builder()
                    .add_service(IdentityServer::new(st.clone()))
                    .add_service(NodeServer::new(st))
                    .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(csi))
                    .await;
            });
            // The registrar's socket last, as node-driver-registrar does once the driver answers.
            reg.serve(&reg_sock);
        });
        TestCsiDriver {
            state,
            registrar,
            csi_socket,
            registration_socket,
            runtime: Some(runtime),
        }
    }

    /// Every call so far, one line each (`NodePublishVolume <id> <target> ro=false`, ...).
    pub fn calls(&self) -> Vec<String> {
        self.state.calls.lock().unwrap().clone()
    }

    /// Each `NodeStageVolume` request as it came (secrets, publish context, capability).
    pub fn stage_requests(&self) -> Vec<csi::NodeStageVolumeRequest> {
        self.state.stages.lock().unwrap().clone()
    }

    /// Each `NodePublishVolume` request as it came (volume context, secrets, ...).
    pub fn publish_requests(&self) -> Vec<csi::NodePublishVolumeRequest> {
        self.state.publishes.lock().unwrap().clone()
    }

    /// The mount flags of each `NodeStageVolume` and `NodePublishVolume` in the order they
    /// came, each as `("NodeStageVolume" | "NodePublishVolume", flags)` (the PV's mount
    /// options and, on SELinux hosts, the `context="…"` label).
    pub fn mount_flags(&self) -> Vec<(&'static str, Vec<String>)> {
        let flags = |c: &Option<csi::VolumeCapability>| match c
            .as_ref()
            .and_then(|c| c.access_type.clone())
        {
            Some(csi::volume_capability::AccessType::Mount(m)) => m.mount_flags,
            _ => Vec::new(),
        };
        let stages = self
            .stage_requests()
            .into_iter()
            .map(|r| ("NodeStageVolume", flags(&r.volume_capability)));
        let publishes = self
            .publish_requests()
            .into_iter()
            .map(|r| ("NodePublishVolume", flags(&r.volume_capability)));
        stages.chain(publishes).collect()
    }

    /// What the kubelet answered to registration.
    pub fn statuses(&self) -> Vec<RegistrationStatus> {
        self.registrar.statuses()
    }

    /// Removes the registration socket (node-driver-registrar going away).
    pub fn remove_registration(&self) {
        let _ = std::fs::remove_file(&self.registration_socket);
    }
}

impl Drop for TestCsiDriver {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
        let _ = std::fs::remove_file(&self.registration_socket);
        let _ = std::fs::remove_file(&self.csi_socket);
    }
}

fn bind(src: &Path, dst: &Path, read_only: bool) -> Result<(), Status> {
    use nix::mount::{MsFlags, mount};
    std::fs::create_dir_all(dst)
        .map_err(|e| Status::internal(format!("mkdir {}: {e}", dst.display())))?;
    if is_mounted(dst) {
        return Ok(());
    }
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(|e| {
        Status::internal(format!("bind {} -> {}: {e}", src.display(), dst.display()))
    })?;
    if read_only {
        mount(
            None::<&str>,
            dst,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(|e| Status::internal(format!("remount ro {}: {e}", dst.display())))?;
    }
    Ok(())
}

fn unbind(dst: &Path) -> Result<(), Status> {
    if is_mounted(dst) {
        nix::mount::umount2(dst, nix::mount::MntFlags::empty())
            .map_err(|e| Status::internal(format!("umount {}: {e}", dst.display())))?;
    }
    let _ = std::fs::remove_dir(dst);
    Ok(())
}

fn is_mounted(p: &Path) -> bool {
    let want = p.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// Bytes used below `p` (allocated blocks, as du counts them).
fn used_bytes(p: &Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0i64;
    let mut stack = vec![p.to_path_buf()];
    let mut budget = 100_000;
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            budget -= 1;
            if budget == 0 {
                return total;
            }
            let Ok(m) = e.metadata() else { continue };
            total += (m.blocks() * 512) as i64;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

fn safe_id(id: &str) -> Result<&str, Status> {
    if id.is_empty() || id.contains('/') || id == "." || id == ".." {
        return Err(Status::invalid_argument(format!("bad volume id {id:?}")));
    }
    Ok(id)
}

#[tonic::async_trait]
impl Identity for State {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.opts.name.clone(),
            vendor_version: "0.1.0".into(),
            manifest: Default::default(),
        }))
    }
    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for State {
    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        self.record("NodeGetInfo".into());
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.opts.node_id.clone(),
            max_volumes_per_node: self.opts.max_volumes,
            accessible_topology: (!self.opts.topology.is_empty()).then(|| csi::Topology {
                segments: self.opts.topology.clone().into_iter().collect(),
            }),
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{Type, rpc};
        let cap = |t: rpc::Type| csi::NodeServiceCapability {
            r#type: Some(Type::Rpc(csi::node_service_capability::Rpc {
                r#type: t as i32,
            })),
        };
        let mut caps = vec![cap(rpc::Type::GetVolumeStats)];
        if self.opts.stage {
            caps.push(cap(rpc::Type::StageUnstageVolume));
        }
        if self.opts.expand {
            caps.push(cap(rpc::Type::ExpandVolume));
        }
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: caps,
        }))
    }

    async fn node_stage_volume(
        &self,
        r: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let r = r.into_inner();
        self.stages.lock().unwrap().push(r.clone());
        self.record(format!(
            "NodeStageVolume {} {}",
            r.volume_id, r.staging_target_path
        ));
        if let Some(m) = &self.opts.fail_stage {
            return Err(Status::internal(m.clone()));
        }
        let src = self.data.join(safe_id(&r.volume_id)?);
        let dst = PathBuf::from(r.staging_target_path);
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&src).map_err(|e| Status::internal(e.to_string()))?;
            bind(&src, &dst, false)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        r: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let r = r.into_inner();
        self.record(format!(
            "NodeUnstageVolume {} {}",
            r.volume_id, r.staging_target_path
        ));
        let dst = PathBuf::from(r.staging_target_path);
        tokio::task::spawn_blocking(move || unbind(&dst))
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        r: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        self.publishes.lock().unwrap().push(r.clone());
        let ephemeral = r
            .volume_context
            .get("csi.storage.k8s.io/ephemeral")
            .cloned()
            .unwrap_or_default();
        self.record(format!(
            "NodePublishVolume {} {} ro={} staged={} ephemeral={ephemeral}",
            r.volume_id,
            r.target_path,
            r.readonly,
            !r.staging_target_path.is_empty()
        ));
        let src = if r.staging_target_path.is_empty() {
            self.data.join(safe_id(&r.volume_id)?)
        } else {
            PathBuf::from(&r.staging_target_path)
        };
        let (dst, ro) = (PathBuf::from(r.target_path), r.readonly);
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&src).map_err(|e| Status::internal(e.to_string()))?;
            bind(&src, &dst, ro)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        self.record(format!(
            "NodeUnpublishVolume {} {}",
            r.volume_id, r.target_path
        ));
        let dst = PathBuf::from(r.target_path);
        tokio::task::spawn_blocking(move || unbind(&dst))
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_expand_volume(
        &self,
        r: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let r = r.into_inner();
        let bytes = r.capacity_range.map_or(0, |c| c.required_bytes);
        self.record(format!(
            "NodeExpandVolume {} {} {bytes}",
            r.volume_id, r.volume_path
        ));
        if !self.opts.expand {
            return Err(Status::unimplemented("NodeExpandVolume"));
        }
        Ok(Response::new(csi::NodeExpandVolumeResponse {
            capacity_bytes: bytes,
        }))
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let r = r.into_inner();
        self.record(format!(
            "NodeGetVolumeStats {} {}",
            r.volume_id, r.volume_path
        ));
        let p = PathBuf::from(r.volume_path);
        let (vfs, used) =
            tokio::task::spawn_blocking(move || (nix::sys::statvfs::statvfs(&p), used_bytes(&p)))
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
        let vfs = vfs.map_err(|e| Status::not_found(e.to_string()))?;
        let frag = vfs.fragment_size() as i64;
        use csi::volume_usage::Unit;
        Ok(Response::new(csi::NodeGetVolumeStatsResponse {
            usage: vec![
                csi::VolumeUsage {
                    total: vfs.blocks() as i64 * frag,
                    available: vfs.blocks_available() as i64 * frag,
                    used,
                    unit: Unit::Bytes as i32,
                },
                csi::VolumeUsage {
                    total: vfs.files() as i64,
                    available: vfs.files_free() as i64,
                    used: (vfs.files() - vfs.files_free()) as i64,
                    unit: Unit::Inodes as i32,
                },
            ],
            volume_condition: None,
        }))
    }
}
