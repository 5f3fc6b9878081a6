//! An in-memory runtime that records every call and lets tests inject errors and container
//! exits. State transitions follow containerd's: created → running → exited.

use super::*;
use std::collections::HashMap;
use std::sync::Mutex;

mod features;
mod requests;
pub use requests::{StreamRequest, UpdateCheck};

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    clock: i64,
    sandboxes: BTreeMap<String, (Sandbox, SandboxConfig)>,
    containers: BTreeMap<String, ContainerStatus>,
    container_sandbox: HashMap<String, String>,
    images: BTreeMap<String, String>,
    image_users: BTreeMap<String, ImageUser>,
    created: BTreeMap<String, ContainerConfig>,
    calls: Vec<String>,
    fail_next: HashMap<&'static str, Vec<RuntimeError>>,
    panic_next: HashMap<&'static str, usize>,
    exec_results: Vec<ExecResult>,
    stop_timeouts: Vec<Duration>,
    /// Image → the (username, password) its registry accepts.
    registry_auth: BTreeMap<String, (String, String)>,
    /// Every PullImage: the image and the username it carried.
    pulls: Vec<(String, Option<String>)>,
    /// Container ID → (cumulative CPU ns, working set bytes) its stats report.
    usage: HashMap<String, (u64, u64)>,
    /// Sandbox ID → (rx bytes, tx bytes) of its eth0.
    network: HashMap<String, (u64, u64)>,
    /// Used bytes of the image filesystem.
    image_fs_used: u64,
    /// The streaming server Exec/Attach/PortForward URLs point at (`http://host:port`).
    stream_base: String,
    /// Every Exec/Attach/PortForward: what it asked for.
    stream_requests: Vec<StreamRequest>,
    /// What Status answers (None: RuntimeReady and NetworkReady true).
    conditions: Option<Vec<crate::runtime::RuntimeCondition>>,
    /// How long each PullImage takes, and how many ran at once at most.
    pull_delay: Duration,
    pulls_now: usize,
    pulls_most: usize,
    /// What RuntimeConfig answers (`None`: Unimplemented).
    cgroup_driver: Option<crate::runtime::RuntimeCgroupDriver>,
    /// What Status reports per runtime handler (absent: no features, as containerd 1.6).
    handler_features: HashMap<String, crate::runtime::HandlerFeatures>,
    /// ListPodSandboxStats fails as containerd 1.6's does without a filter.
    stats_list_fails_on_not_ready: bool,
    /// Every UpdateContainerResources: the container and what it asked for.
    resource_updates: Vec<(String, LinuxResources)>,
    /// Asked before an UpdateContainerResources applies (the kernel's parent limits).
    update_check: Option<UpdateCheck>,
    /// The open GetContainerEvents streams (`None`: the call is not offered, as containerd 1.6).
    events: Option<Vec<tokio::sync::mpsc::Sender<crate::runtime::RuntimeEvent>>>,
}

/// A recording fake of [`Runtime`].
#[derive(Debug, Default)]
pub struct FakeRuntime {
    state: Mutex<State>,
}

impl FakeRuntime {
    pub fn new() -> Self {
        Self::default()
    }

    /// Each PullImage takes this long from now on (tokio time).
    pub fn set_pull_delay(&self, d: Duration) {
        self.state.lock().unwrap().pull_delay = d;
    }

    /// The most PullImage calls that ran at once.
    pub fn most_pulls_at_once(&self) -> usize {
        self.state.lock().unwrap().pulls_most
    }

    /// What RuntimeConfig answers from now on (default: the call is Unimplemented).
    pub fn set_cgroup_driver(&self, driver: crate::runtime::RuntimeCgroupDriver) {
        self.state.lock().unwrap().cgroup_driver = Some(driver);
    }

    /// Offers GetContainerEvents from now on (`false`: ends the open streams and refuses new).
    pub fn offer_events(&self, on: bool) {
        self.state.lock().unwrap().events = on.then(Vec::new);
    }

    /// Sends `ev` on every open GetContainerEvents stream; how many took it.
    pub fn emit_event(&self, ev: crate::runtime::RuntimeEvent) -> usize {
        let mut s = self.state.lock().unwrap();
        let Some(open) = s.events.as_mut() else {
            return 0;
        };
        open.retain(|tx| tx.try_send(ev.clone()).is_ok());
        open.len()
    }

    /// What Status answers from now on.
    pub fn set_conditions(&self, conditions: Vec<crate::runtime::RuntimeCondition>) {
        self.state.lock().unwrap().conditions = Some(conditions);
    }

    /// Makes `image` present in the store.
    pub fn add_image(&self, image: &str) {
        let mut s = self.state.lock().unwrap();
        let digest = format!("sha256:{:064x}", s.images.len() + 1);
        s.images.insert(image.to_string(), digest);
    }

    /// Pulls of `image` fail (as a registry answering 401) unless they carry these credentials.
    pub fn require_auth(&self, image: &str, username: &str, password: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.registry_auth
            .insert(image.into(), (username.into(), password.into()));
    }

    /// Every PullImage so far: the image and the username of the credentials it carried.
    pub fn pulls(&self) -> Vec<(String, Option<String>)> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pulls
            .clone()
    }

    /// Every UpdateContainerResources so far: (container ID, resources).
    pub fn resource_updates(&self) -> Vec<(String, LinuxResources)> {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.resource_updates.clone()
    }

    /// The next call of `op` (e.g. "StartContainer") fails with `err`.
    /// The config container `id` was created with.
    pub fn created_config(&self, id: &str) -> Option<ContainerConfig> {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.created.get(id).cloned()
    }

    /// Makes the stats calls report `cpu_ns` cumulative CPU time and `working_set` bytes for
    /// container `id` (and the sums for its sandbox).
    pub fn set_usage(&self, id: &str, cpu_ns: u64, working_set: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.usage.insert(id.into(), (cpu_ns, working_set));
    }

    /// From now on ListPodSandboxStats fails as containerd 1.6 answers a request without a
    /// filter while a sandbox is not ready (a pod's old, stopped sandbox): the whole list
    /// fails with containerd's message naming that sandbox.
    pub fn fail_stats_list_on_not_ready(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.stats_list_fails_on_not_ready = true;
    }

    /// Makes the sandbox stats report `rx`/`tx` bytes on `eth0` for sandbox `id`.
    pub fn set_network(&self, id: &str, rx: u64, tx: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.network.insert(id.into(), (rx, tx));
    }

    /// Sets the log path ContainerStatus reports for container `id`.
    pub fn set_log_path(&self, id: &str, path: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = s.containers.get_mut(id) {
            c.log_path = path.into();
        }
    }

    /// Makes ImageFsInfo report `used` bytes on the image filesystem.
    pub fn set_image_fs_used(&self, used: u64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.image_fs_used = used;
    }

    /// Makes ImageStatus report `user` as the default user of `image`.
    pub fn set_image_user(&self, image: &str, user: ImageUser) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.image_users.insert(image.into(), user);
    }

    /// Every later UpdateContainerResources is first checked with `check` (as the kernel
    /// checks a container's limits against its pod cgroup's).
    pub fn check_updates(&self, check: UpdateCheck) {
        self.state.lock().unwrap().update_check = Some(check);
    }

    pub fn fail_next(&self, op: &'static str, err: RuntimeError) {
        self.state
            .lock()
            .unwrap()
            .fail_next
            .entry(op)
            .or_default()
            .push(err);
    }

    /// The next `n` calls of `op` panic (a bug stand-in: workers must survive it).
    pub fn panic_next(&self, op: &'static str, n: usize) {
        self.state.lock().unwrap().panic_next.insert(op, n);
    }

    /// Exec/Attach/PortForward answer `<base>/<op>/<n>` (e.g. a test server's
    /// `http://127.0.0.1:PORT`).
    pub fn set_stream_base(&self, base: &str) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stream_base = base.into();
    }

    /// Every Exec/Attach/PortForward so far.
    pub fn stream_requests(&self) -> Vec<StreamRequest> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stream_requests
            .clone()
    }

    /// The next ExecSync returns this result.
    pub fn push_exec_result(&self, r: ExecResult) {
        self.state.lock().unwrap().exec_results.push(r);
    }

    /// Simulates the container's process exiting with `code`.
    pub fn exit_container(&self, id: &str, code: i32) {
        let mut s = self.state.lock().unwrap();
        s.clock += 1_000_000_000;
        let now = s.clock;
        if let Some(c) = s.containers.get_mut(id) {
            c.state = ContainerState::Exited;
            c.exit_code = code;
            c.finished_at = now;
            c.reason = if code == 0 {
                "Completed".into()
            } else {
                "Error".into()
            };
        }
    }

    /// Names of the calls made so far, in order (`"RunPodSandbox"`, `"StartContainer"`, ...).
    pub fn calls(&self) -> Vec<String> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn clear_calls(&self) {
        self.state.lock().unwrap().calls.clear();
    }

    /// How many times `op` was called.
    pub fn count(&self, op: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|c| *c == op)
            .count()
    }

    /// IDs of running containers named `name`.
    pub fn running(&self, name: &str) -> Vec<String> {
        let s = self.state.lock().unwrap();
        s.containers
            .values()
            .filter(|c| c.name == name && c.state == ContainerState::Running)
            .map(|c| c.id.clone())
            .collect()
    }

    /// The grace periods StopContainer was called with, in order.
    pub fn stop_timeouts(&self) -> Vec<Duration> {
        self.state.lock().unwrap().stop_timeouts.clone()
    }

    /// Number of sandboxes still known to the runtime.
    pub fn sandbox_count(&self) -> usize {
        self.state.lock().unwrap().sandboxes.len()
    }

    /// The config the sandbox was created with.
    pub fn sandbox_config(&self, id: &str) -> Option<SandboxConfig> {
        self.state
            .lock()
            .unwrap()
            .sandboxes
            .get(id)
            .map(|(_, c)| c.clone())
    }

    fn enter(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, State>> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(op.to_string());
        if let Some(n) = s.panic_next.get_mut(op)
            && *n > 0
        {
            *n -= 1;
            drop(s);
            panic!("injected panic in {op}");
        }
        s.clock += 1_000_000;
        if let Some(errs) = s.fail_next.get_mut(op)
            && !errs.is_empty()
        {
            return Err(errs.remove(0));
        }
        Ok(s)
    }
}

fn not_found(op: &'static str, id: &str) -> RuntimeError {
    RuntimeError::NotFound {
        op,
        message: id.to_string(),
    }
}

/// The size every fake image reports.
pub const FAKE_IMAGE_SIZE: u64 = 4096;

#[async_trait::async_trait]
impl Runtime for FakeRuntime {
    async fn cgroup_driver(&self) -> Result<crate::runtime::RuntimeCgroupDriver> {
        let s = self.enter("RuntimeConfig")?;
        Ok(s.cgroup_driver
            .unwrap_or(crate::runtime::RuntimeCgroupDriver::Unimplemented))
    }

    async fn handler_features(&self, handler: &str) -> Result<crate::runtime::HandlerFeatures> {
        self.features_of(handler)
    }

    async fn status(&self) -> Result<Vec<crate::runtime::RuntimeCondition>> {
        let s = self.enter("Status")?;
        let set = s.conditions.clone();
        drop(s);
        match set {
            Some(c) => Ok(c),
            None => Ok(["RuntimeReady", "NetworkReady"]
                .into_iter()
                .map(|t| crate::runtime::RuntimeCondition {
                    type_: t.into(),
                    status: true,
                    reason: String::new(),
                    message: String::new(),
                })
                .collect()),
        }
    }

    async fn version(&self) -> Result<VersionInfo> {
        let _guard = self.enter("Version")?;
        Ok(VersionInfo {
            runtime_name: "fake".into(),
            runtime_version: "0.0.1".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn list_sandboxes(&self) -> Result<Vec<Sandbox>> {
        let s = self.enter("ListPodSandbox")?;
        Ok(s.sandboxes.values().map(|(sb, _)| sb.clone()).collect())
    }

    async fn sandbox_status(&self, id: &str) -> Result<SandboxStatus> {
        let s = self.enter("PodSandboxStatus")?;
        let (sb, cfg) = s
            .sandboxes
            .get(id)
            .ok_or_else(|| not_found("PodSandboxStatus", id))?;
        Ok(SandboxStatus {
            id: sb.id.clone(),
            state: sb.state,
            ips: if cfg.host_network {
                vec![]
            } else {
                vec![format!("10.88.0.{}", 2 + sb.id.len())]
            },
            created_at: sb.created_at,
        })
    }

    async fn run_sandbox(&self, config: &SandboxConfig) -> Result<String> {
        let mut s = self.enter("RunPodSandbox")?;
        s.next_id += 1;
        let id = format!("sb{}", s.next_id);
        let sb = Sandbox {
            id: id.clone(),
            pod_name: config.name.clone(),
            pod_namespace: config.namespace.clone(),
            pod_uid: config.uid.clone(),
            attempt: config.attempt,
            state: SandboxState::Ready,
            created_at: s.clock,
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
        };
        s.sandboxes.insert(id.clone(), (sb, config.clone()));
        Ok(id)
    }

    async fn stop_sandbox(&self, id: &str) -> Result<()> {
        let mut s = self.enter("StopPodSandbox")?;
        let now = s.clock;
        let ids: Vec<String> = s
            .container_sandbox
            .iter()
            .filter(|(_, sb)| *sb == id)
            .map(|(c, _)| c.clone())
            .collect();
        for cid in ids {
            if let Some(c) = s.containers.get_mut(&cid)
                && c.state == ContainerState::Running
            {
                c.state = ContainerState::Exited;
                c.exit_code = 137;
                c.finished_at = now;
            }
        }
        if let Some((sb, _)) = s.sandboxes.get_mut(id) {
            sb.state = SandboxState::NotReady;
        }
        Ok(())
    }

    async fn remove_sandbox(&self, id: &str) -> Result<()> {
        let mut s = self.enter("RemovePodSandbox")?;
        s.sandboxes.remove(id);
        let ids: Vec<String> = s
            .container_sandbox
            .iter()
            .filter(|(_, sb)| *sb == id)
            .map(|(c, _)| c.clone())
            .collect();
        for cid in ids {
            s.containers.remove(&cid);
            s.container_sandbox.remove(&cid);
        }
        Ok(())
    }

    async fn list_containers(&self) -> Result<Vec<Container>> {
        let s = self.enter("ListContainers")?;
        Ok(s.containers
            .values()
            .map(|c| Container {
                id: c.id.clone(),
                sandbox_id: s.container_sandbox[&c.id].clone(),
                name: c.name.clone(),
                attempt: c.attempt,
                image: c.image.clone(),
                image_ref: c.image_ref.clone(),
                state: c.state,
                created_at: c.created_at,
                labels: c.labels.clone(),
                annotations: c.annotations.clone(),
            })
            .collect())
    }

    async fn container_status(&self, id: &str) -> Result<ContainerStatus> {
        let s = self.enter("ContainerStatus")?;
        s.containers
            .get(id)
            .cloned()
            .ok_or_else(|| not_found("ContainerStatus", id))
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox: &SandboxConfig,
    ) -> Result<String> {
        let mut s = self.enter("CreateContainer")?;
        if !s.sandboxes.contains_key(sandbox_id) {
            return Err(not_found("CreateContainer", sandbox_id));
        }
        s.next_id += 1;
        let id = format!("c{}", s.next_id);
        let image_ref = s.images.get(&config.image).cloned().unwrap_or_default();
        let status = ContainerStatus {
            id: id.clone(),
            name: config.name.clone(),
            attempt: config.attempt,
            state: ContainerState::Created,
            created_at: s.clock,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            image: config.image.clone(),
            image_ref,
            reason: String::new(),
            message: String::new(),
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            log_path: if sandbox.log_directory.is_empty() || config.log_path.is_empty() {
                String::new()
            } else {
                format!("{}/{}", sandbox.log_directory, config.log_path)
            },
        };
        s.containers.insert(id.clone(), status);
        s.created.insert(id.clone(), config.clone());
        s.container_sandbox
            .insert(id.clone(), sandbox_id.to_string());
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        let mut s = self.enter("StartContainer")?;
        let now = s.clock;
        let c = s
            .containers
            .get_mut(id)
            .ok_or_else(|| not_found("StartContainer", id))?;
        c.state = ContainerState::Running;
        c.started_at = now;
        Ok(())
    }

    async fn stop_container(&self, id: &str, timeout: Duration) -> Result<()> {
        let mut s = self.enter("StopContainer")?;
        s.stop_timeouts.push(timeout);
        let now = s.clock;
        if let Some(c) = s.containers.get_mut(id)
            && c.state == ContainerState::Running
        {
            c.state = ContainerState::Exited;
            c.exit_code = 143;
            c.finished_at = now;
            c.reason = "Error".into();
        }
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        let mut s = self.enter("RemoveContainer")?;
        s.containers.remove(id);
        s.container_sandbox.remove(id);
        Ok(())
    }

    async fn exec_sync(&self, id: &str, _cmd: &[String], _timeout: Duration) -> Result<ExecResult> {
        let mut s = self.enter("ExecSync")?;
        if !s.containers.contains_key(id) {
            return Err(not_found("ExecSync", id));
        }
        Ok(if s.exec_results.is_empty() {
            ExecResult {
                exit_code: 0,
                stdout: vec![],
                stderr: vec![],
            }
        } else {
            s.exec_results.remove(0)
        })
    }

    async fn exec(&self, id: &str, cmd: &[String], flags: StreamFlags) -> Result<String> {
        let mut s = self.enter("Exec")?;
        if !s.containers.contains_key(id) {
            return Err(not_found("Exec", id));
        }
        s.stream_requests.push(StreamRequest::Exec {
            id: id.into(),
            cmd: cmd.to_vec(),
            flags,
        });
        Ok(format!(
            "{}/exec/{}",
            s.stream_base,
            s.stream_requests.len()
        ))
    }

    async fn attach(&self, id: &str, flags: StreamFlags) -> Result<String> {
        let mut s = self.enter("Attach")?;
        if !s.containers.contains_key(id) {
            return Err(not_found("Attach", id));
        }
        s.stream_requests.push(StreamRequest::Attach {
            id: id.into(),
            flags,
        });
        Ok(format!(
            "{}/attach/{}",
            s.stream_base,
            s.stream_requests.len()
        ))
    }

    async fn port_forward(&self, sandbox_id: &str, ports: &[i32]) -> Result<String> {
        let mut s = self.enter("PortForward")?;
        if !s.sandboxes.contains_key(sandbox_id) {
            return Err(not_found("PortForward", sandbox_id));
        }
        s.stream_requests.push(StreamRequest::PortForward {
            sandbox_id: sandbox_id.into(),
            ports: ports.to_vec(),
        });
        Ok(format!(
            "{}/portforward/{}",
            s.stream_base,
            s.stream_requests.len()
        ))
    }

    async fn list_images(&self) -> Result<Vec<crate::runtime::ImageSummary>> {
        let s = self.enter("ListImages")?;
        let mut by_id: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, id) in &s.images {
            by_id.entry(id.clone()).or_default().push(name.clone());
        }
        Ok(by_id
            .into_iter()
            .map(|(id, repo_tags)| crate::runtime::ImageSummary {
                id,
                repo_tags,
                repo_digests: Vec::new(),
                size: FAKE_IMAGE_SIZE,
                pinned: false,
            })
            .collect())
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        let mut s = self.enter("RemoveImage")?;
        s.images.retain(|name, id| name != image && id != image);
        Ok(())
    }

    async fn image_status(&self, image: &str) -> Result<Option<ImageInfo>> {
        let s = self.enter("ImageStatus")?;
        Ok(s.images.get(image).map(|id| ImageInfo {
            id: id.clone(),
            size: FAKE_IMAGE_SIZE,
            user: s.image_users.get(image).cloned().unwrap_or_default(),
        }))
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<&ImageAuth>,
        _sandbox: &SandboxConfig,
    ) -> Result<String> {
        let delay = {
            let mut s = self.enter("PullImage")?;
            s.pulls_now += 1;
            s.pulls_most = s.pulls_most.max(s.pulls_now);
            s.pull_delay
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut s = self.state.lock().unwrap();
        s.pulls_now -= 1;
        s.pulls
            .push((image.to_string(), auth.map(|a| a.username.clone())));
        if let Some((user, password)) = s.registry_auth.get(image)
            && auth.is_none_or(|a| a.username != *user || a.password != *password)
        {
            return Err(RuntimeError::Call {
                op: "PullImage",
                message: format!(
                    "failed to pull and unpack image {image:?}: failed to resolve reference: unexpected status: 401 Unauthorized"
                ),
            });
        }
        // A pull of an image already there keeps its ID, as a registry's unchanged image does.
        let next = format!("sha256:{:064x}", s.images.len() + 100);
        let digest = s.images.get(image).cloned().unwrap_or(next);
        s.images.insert(image.to_string(), digest.clone());
        Ok(digest)
    }

    async fn list_container_stats(&self) -> Result<Vec<ContainerStats>> {
        let s = self.enter("ListContainerStats")?;
        Ok(s.containers.values().map(|c| fake_stats(&s, c)).collect())
    }

    /// As containerd with the (empty) filter upstream sends: ready sandboxes only. With
    /// [`FakeRuntime::fail_stats_list_on_not_ready`], as containerd 1.6 answers a request
    /// without a filter: one sandbox that is not ready fails the whole list.
    async fn list_sandbox_stats(&self) -> Result<Vec<SandboxStats>> {
        let s = self.enter("ListPodSandboxStats")?;
        let mut out = Vec::new();
        for (sb, _) in s.sandboxes.values() {
            if sb.state == SandboxState::Ready {
                out.push(sandbox_stats_of(&s, sb));
            } else if s.stats_list_fails_on_not_ready {
                return Err(RuntimeError::Call {
                    op: "ListPodSandboxStats",
                    message: format!(
                        "Unknown: failed to decode sandbox container metrics for sandbox {:?}: {}",
                        sb.id,
                        not_ready_message(&sb.id)
                    ),
                });
            }
        }
        Ok(out)
    }

    /// As containerd: a sandbox that is not ready has no stats.
    async fn sandbox_stats(&self, id: &str) -> Result<SandboxStats> {
        let s = self.enter("PodSandboxStats")?;
        let (sb, _) = s
            .sandboxes
            .get(id)
            .ok_or_else(|| not_found("PodSandboxStats", id))?;
        if sb.state != SandboxState::Ready {
            return Err(RuntimeError::Call {
                op: "PodSandboxStats",
                message: format!(
                    "Unknown: failed to decode pod sandbox metrics {id}: {}",
                    not_ready_message(id)
                ),
            });
        }
        Ok(sandbox_stats_of(&s, sb))
    }

    async fn image_fs_info(&self) -> Result<ImageFsInfo> {
        let s = self.enter("ImageFsInfo")?;
        Ok(ImageFsInfo {
            image_filesystems: vec![FsUsage {
                timestamp: s.clock,
                mountpoint: "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs".into(),
                used_bytes: Some(s.image_fs_used),
                inodes_used: Some(s.images.len() as u64),
            }],
            container_filesystems: Vec::new(),
        })
    }

    /// As containerd: a running container's resources change (its creation config shows the
    /// new ones); any other container is an error.
    async fn update_container_resources(&self, id: &str, r: &LinuxResources) -> Result<()> {
        let mut s = self.enter("UpdateContainerResources")?;
        let running = s
            .containers
            .get(id)
            .map(|c| c.state == ContainerState::Running)
            .ok_or_else(|| not_found("UpdateContainerResources", id))?;
        if !running {
            return Err(RuntimeError::Call {
                op: "UpdateContainerResources",
                message: format!("container {id} is not running"),
            });
        }
        if let Some(check) = s.update_check.clone()
            && let Err(message) = (check.0)(id, r)
        {
            return Err(RuntimeError::Call {
                op: "UpdateContainerResources",
                message,
            });
        }
        if let Some(cfg) = s.created.get_mut(id) {
            cfg.resources = r.clone();
        }
        s.resource_updates.push((id.to_string(), r.clone()));
        Ok(())
    }

    /// As containerd 1.6: the call does not exist (the CRI client treats that as done).
    async fn update_sandbox_resources(
        &self,
        _sandbox_id: &str,
        _overhead: &LinuxResources,
        _resources: &LinuxResources,
    ) -> Result<()> {
        let _s = self.enter("UpdatePodSandboxResources")?;
        Ok(())
    }

    async fn container_events(
        &self,
    ) -> Result<tokio::sync::mpsc::Receiver<crate::runtime::RuntimeEvent>> {
        let mut s = self.enter("GetContainerEvents")?;
        let Some(open) = s.events.as_mut() else {
            return Err(RuntimeError::Call {
                op: "GetContainerEvents",
                message: "Unimplemented: unknown method GetContainerEvents".into(),
            });
        };
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        open.push(tx);
        Ok(rx)
    }

    /// As containerd: a new, empty file at the container's log path (when its directory
    /// exists); the old file, if still there, is left alone.
    async fn reopen_container_log(&self, id: &str) -> Result<()> {
        let path = {
            let s = self.enter("ReopenContainerLog")?;
            s.containers
                .get(id)
                .map(|c| c.log_path.clone())
                .ok_or_else(|| not_found("ReopenContainerLog", id))?
        };
        if !path.is_empty() {
            tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .await
                .map_err(|e| RuntimeError::Call {
                    op: "ReopenContainerLog",
                    message: e.to_string(),
                })?;
        }
        Ok(())
    }
}

/// containerd 1.6's reason a sandbox that is not ready has no stats.
fn not_ready_message(id: &str) -> String {
    format!("failed to get pod sandbox stats since sandbox container {id:?} is not in ready state")
}

/// What the fake reports for one sandbox and its containers.
fn sandbox_stats_of(s: &State, sb: &Sandbox) -> SandboxStats {
    let now = s.clock;
    let containers: Vec<ContainerStats> = s
        .containers
        .values()
        .filter(|c| s.container_sandbox.get(&c.id) == Some(&sb.id))
        .map(|c| fake_stats(s, c))
        .collect();
    let sum = |f: fn(&ContainerStats) -> Option<u64>| containers.iter().filter_map(f).sum::<u64>();
    let network = s.network.get(&sb.id).map(|(rx, tx)| {
        let eth0 = InterfaceUsage {
            name: "eth0".into(),
            rx_bytes: Some(*rx),
            rx_errors: Some(0),
            tx_bytes: Some(*tx),
            tx_errors: Some(0),
        };
        NetworkUsage {
            timestamp: now,
            default_interface: Some(eth0.clone()),
            interfaces: vec![eth0],
        }
    });
    SandboxStats {
        id: sb.id.clone(),
        name: sb.pod_name.clone(),
        namespace: sb.pod_namespace.clone(),
        uid: sb.pod_uid.clone(),
        cpu: Some(CpuUsage {
            timestamp: now,
            usage_core_nano_seconds: Some(sum(|c| {
                c.cpu.as_ref().and_then(|c| c.usage_core_nano_seconds)
            })),
            usage_nano_cores: None,
        }),
        memory: Some(MemoryUsage {
            timestamp: now,
            working_set_bytes: Some(sum(|c| c.memory.as_ref().and_then(|m| m.working_set_bytes))),
            ..MemoryUsage::default()
        }),
        network,
        process_count: Some(containers.len() as u64),
        containers,
    }
}

/// What the fake reports for one container.
fn fake_stats(s: &State, c: &ContainerStatus) -> ContainerStats {
    let (cpu, mem) = s.usage.get(&c.id).copied().unwrap_or_default();
    ContainerStats {
        id: c.id.clone(),
        name: c.name.clone(),
        labels: c.labels.clone(),
        cpu: Some(CpuUsage {
            timestamp: s.clock,
            usage_core_nano_seconds: Some(cpu),
            usage_nano_cores: None,
        }),
        memory: Some(MemoryUsage {
            timestamp: s.clock,
            working_set_bytes: Some(mem),
            usage_bytes: Some(mem),
            ..MemoryUsage::default()
        }),
        writable_layer: Some(FsUsage {
            timestamp: s.clock,
            mountpoint: "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs".into(),
            used_bytes: Some(4096),
            inodes_used: Some(2),
        }),
    }
}
