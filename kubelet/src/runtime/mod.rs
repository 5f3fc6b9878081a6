//! The container runtime as the kubelet sees it: a narrow trait over the CRI with plain domain
//! types. [`cri::CriRuntime`] talks gRPC to containerd or CRI-O; [`fake::FakeRuntime`] records
//! calls for unit tests.

pub mod cri;
mod cri_config;
mod cri_stats;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod gc;
mod grpc_codes;
pub use grpc_codes::go_code;
pub mod instrumented;
pub mod raw;
pub mod settings;
pub mod stats;
pub use gc::{CONTAINER_GC_PERIOD, ContainerGc, ContainerGcPolicy, LinkError, LogLinks, PodsKnown};

pub use stats::{
    ContainerStats, CpuUsage, FsUsage, ImageFsInfo, InterfaceUsage, MemoryUsage, NetworkUsage,
    SandboxStats,
};

pub use cri::CriRuntime;
pub use gc::PERIOD_ENV as CONTAINER_GC_PERIOD_ENV;
pub use instrumented::Instrumented;
pub use settings::Settings;
use std::collections::BTreeMap;
use std::time::Duration;

/// Labels every CRI object of ours carries, so other tools (and we, after a restart) can map it
/// back to its pod.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Annotations upstream's kubelet puts on containers.
pub const ANN_CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const ANN_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const ANN_TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const ANN_TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
pub const ANN_POD_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
pub const ANN_CONTAINER_PORTS: &str = "io.kubernetes.container.ports";

/// A failed runtime call.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RuntimeError {
    #[error("runtime unavailable: {0}")]
    Unavailable(String),
    #[error("{op}: not found: {message}")]
    NotFound { op: &'static str, message: String },
    #[error("{op} failed: {message}")]
    Call { op: &'static str, message: String },
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Sandbox state as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    Ready,
    NotReady,
}

/// Container state as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// A pod sandbox as listed by the runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct Sandbox {
    pub id: String,
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    pub attempt: u32,
    pub state: SandboxState,
    /// Nanoseconds since the epoch.
    pub created_at: i64,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// A container as listed by the runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct Container {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    pub attempt: u32,
    pub image: String,
    pub image_ref: String,
    pub state: ContainerState,
    pub created_at: i64,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Detailed status of one container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerStatus {
    pub id: String,
    pub name: String,
    pub attempt: u32,
    pub state: ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub image: String,
    pub image_ref: String,
    pub reason: String,
    pub message: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The container's CRI log file (absolute; empty when the runtime keeps none).
    pub log_path: String,
}

/// Detailed status of one sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxStatus {
    pub id: String,
    pub state: SandboxState,
    pub ips: Vec<String>,
    pub created_at: i64,
}

pub use crate::node_settings::DnsConfig;

/// A host port mapping.
#[derive(Debug, Clone, PartialEq)]
pub struct PortMapping {
    pub protocol: Protocol,
    pub container_port: i32,
    pub host_port: i32,
    pub host_ip: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

/// Everything RunPodSandbox needs.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxConfig {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub attempt: u32,
    pub hostname: String,
    pub log_directory: String,
    pub dns: Option<DnsConfig>,
    pub port_mappings: Vec<PortMapping>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub cgroup_parent: String,
    pub host_network: bool,
    pub host_pid: bool,
    /// `shareProcessNamespace`: one PID namespace for the whole pod (CRI `NamespaceMode::POD`).
    pub share_process_namespace: bool,
    pub host_ipc: bool,
    pub sysctls: BTreeMap<String, String>,
    /// The sandbox's own security settings (`LinuxSandboxSecurityContext`).
    pub security: SandboxSecurity,
    /// The pod's resources without its overhead (`LinuxPodSandboxConfig.resources`), for
    /// runtimes that size the sandbox.
    pub resources: Option<LinuxResources>,
    /// The pod's `spec.overhead` (`LinuxPodSandboxConfig.overhead`).
    pub overhead: Option<LinuxResources>,
    /// The CRI runtime handler (from the pod's RuntimeClass; empty: the runtime's default).
    pub runtime_handler: String,
    /// The pod's own user namespace (`hostUsers: false`): its ID mappings, sent as
    /// `userns_options` mode POD in the sandbox's and every container's namespace options and
    /// as the idmapped mounts of the containers' bind mounts. None: the node's (mode NODE).
    pub userns: Option<UserNamespace>,
}

/// One range of a user namespace's ID mapping (CRI `IDMapping`; the JSON of upstream's
/// per-pod `userns` record file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdMapping {
    pub host_id: u32,
    pub container_id: u32,
    pub length: u32,
}

/// A pod's user namespace: its UID and GID mappings (CRI `UserNamespace` mode POD).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UserNamespace {
    #[serde(rename = "uidMappings")]
    pub uids: Vec<IdMapping>,
    #[serde(rename = "gidMappings")]
    pub gids: Vec<IdMapping>,
}

/// Linux resources of a container, already converted to cgroup units.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinuxResources {
    pub cpu_period: i64,
    pub cpu_quota: i64,
    pub cpu_shares: i64,
    pub memory_limit_in_bytes: i64,
    pub oom_score_adj: i64,
    /// `(page size as "2MB", limit in bytes)` for every huge page size of the node.
    pub hugepage_limits: Vec<(String, u64)>,
    /// cgroup v2 files set directly (`memory.swap.max`).
    pub unified: std::collections::BTreeMap<String, String>,
    /// Memory + swap (cgroup v1); 0 leaves it to the runtime.
    pub memory_swap_limit_in_bytes: i64,
}

/// How mounts propagate between the host and a container's bind mount (CRI
/// `MountPropagation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Propagation {
    /// rprivate: no propagation (`None`, or unset).
    #[default]
    Private,
    /// rslave: host mounts below the source appear in the container (`HostToContainer`).
    HostToContainer,
    /// rshared: both directions (`Bidirectional`, privileged containers only).
    Bidirectional,
}

/// A bind mount into a container.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mount {
    pub container_path: String,
    pub host_path: String,
    pub readonly: bool,
    /// Ask the runtime to relabel the source for SELinux (only on SELinux hosts).
    pub selinux_relabel: bool,
    pub propagation: Propagation,
    /// Read-only all the way down, submounts included (needs `readonly`, private propagation).
    pub recursive_read_only: bool,
    /// An image volume: the runtime mounts this image (already pulled) instead of
    /// `host_path` (CRI `Mount.image`), or its `image_sub_path` directory.
    pub image: Option<String>,
    pub image_sub_path: String,
}

/// What a runtime handler reports it supports (CRI `RuntimeHandlerFeatures`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandlerFeatures {
    pub recursive_read_only_mounts: bool,
    pub user_namespaces: bool,
}

/// The runtime's handlers and its own features (CRI Status), as the Node's status shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeFeatures {
    /// Every handler the runtime lists, in its order (empty: it lists none, as containerd 1.6).
    pub handlers: Vec<(String, HandlerFeatures)>,
    /// `features.supplemental_groups_policy`; None: the runtime sends no features.
    pub supplemental_groups_policy: Option<bool>,
}

/// A host device node exposed in a container (CRI `Device`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMapping {
    pub container_path: String,
    pub host_path: String,
    /// cgroup permissions: any of `r`, `w`, `m`.
    pub permissions: String,
}

/// Everything CreateContainer needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerConfig {
    pub name: String,
    pub attempt: u32,
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub working_dir: String,
    pub envs: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    /// Host device nodes to expose (from device plugins).
    pub devices: Vec<DeviceMapping>,
    /// Fully qualified CDI device names (CRI `CDIDevices`).
    pub cdi_devices: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Relative to the sandbox's log directory.
    pub log_path: String,
    pub stdin: bool,
    /// Close stdin after the first attach ends (`stdinOnce`).
    pub stdin_once: bool,
    pub tty: bool,
    pub resources: LinuxResources,
    /// The container's security settings (`LinuxContainerSecurityContext`; the namespace
    /// options come from the sandbox, apart from an ephemeral container's PID target).
    pub security: ContainerSecurity,
}

/// A seccomp or AppArmor profile as the CRI names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecurityProfile {
    RuntimeDefault,
    Unconfined,
    /// A profile on the node: a file path (seccomp) or a loaded profile's name (AppArmor).
    Localhost(String),
}

/// How supplemental groups combine with the image's `/etc/group` (CRI
/// `SupplementalGroupsPolicy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SupplementalGroupsPolicy {
    #[default]
    Merge,
    Strict,
}

/// An SELinux label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeLinuxOptions {
    pub user: String,
    pub role: String,
    pub type_: String,
    pub level: String,
}

/// Security settings of one container, already merged from the pod and container levels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSecurity {
    pub privileged: bool,
    pub readonly_rootfs: bool,
    pub run_as_user: Option<i64>,
    /// The image's non-numeric user, when neither the spec nor the image gives a UID.
    pub run_as_username: String,
    pub run_as_group: Option<i64>,
    pub supplemental_groups: Vec<i64>,
    pub supplemental_groups_policy: SupplementalGroupsPolicy,
    /// Capabilities exactly as written in the spec (the runtime adds `CAP_`).
    pub capabilities_add: Vec<String>,
    pub capabilities_drop: Vec<String>,
    pub no_new_privs: bool,
    pub masked_paths: Vec<String>,
    pub readonly_paths: Vec<String>,
    pub seccomp: Option<SecurityProfile>,
    pub apparmor: Option<SecurityProfile>,
    /// The deprecated string form of `apparmor` (`runtime/default`, `unconfined`,
    /// `localhost/<name>`), still sent for older runtimes.
    pub apparmor_profile: String,
    pub selinux: Option<SeLinuxOptions>,
    /// The ID of the running container whose PID namespace this one joins (an ephemeral
    /// container's `targetContainerName`): CRI `NamespaceMode::TARGET` with `target_id`,
    /// when the pod does not already share one PID namespace.
    pub pid_target: Option<String>,
}

/// Security settings of the sandbox (its pause process).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxSecurity {
    /// True when any container of the pod is privileged.
    pub privileged: bool,
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub supplemental_groups: Vec<i64>,
    pub supplemental_groups_policy: SupplementalGroupsPolicy,
    pub seccomp: Option<SecurityProfile>,
    pub selinux: Option<SeLinuxOptions>,
}

/// The user an image runs as by default, from ImageStatus.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageUser {
    pub uid: Option<i64>,
    pub username: String,
}

/// Registry credentials for one pull (CRI `AuthConfig`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ImageAuth {
    pub username: String,
    pub password: String,
    /// The registry location the docker config gave them for (for logs; not sent to the
    /// runtime, as upstream).
    pub location: String,
}

impl std::fmt::Debug for ImageAuth {
    // Never log a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageAuth")
            .field("username", &self.username)
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

/// What ExecSync returned.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecResult {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// The streams an Exec or Attach session carries (CRI `ExecRequest`/`AttachRequest` flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamFlags {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// One condition of the runtime's Status (`RuntimeReady`, `NetworkReady`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeCondition {
    pub type_: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl std::fmt::Display for RuntimeCondition {
    /// Upstream's kubecontainer.RuntimeCondition String(), which the node's Ready message shows.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}={} reason:{} message:{}",
            self.type_, self.status, self.reason, self.message
        )
    }
}

/// Runtime name and version, for logs and the Node's nodeInfo.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionInfo {
    pub runtime_name: String,
    pub runtime_version: String,
    pub runtime_api_version: String,
}

/// The CRI as the kubelet uses it. Every call is one RPC; no call retries on its own.
/// An image in the runtime's store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// The image ID (`sha256:...`).
    pub id: String,
    /// Size in bytes as the runtime reports it.
    pub size: u64,
    /// The image's default user.
    pub user: ImageUser,
}

/// One image of ListImages, for the Node's status.images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSummary {
    pub id: String,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    pub size: u64,
    /// CRI `pinned`: never garbage collected (the sandbox image).
    pub pinned: bool,
}

/// The user `image` runs as, as upstream's getImageUser reads it: the image's UID, else its
/// user name, else root (UID 0) when the image names none or is not in the store.
pub async fn image_user(rt: &dyn Runtime, image: &str) -> Result<ImageUser> {
    Ok(image_user_of(rt.image_status(image).await?))
}

/// [`image_user`] from an image status already read (None: not in the store).
pub fn image_user_of(info: Option<ImageInfo>) -> ImageUser {
    match info {
        Some(ImageInfo { user, .. }) if user.uid.is_some() || !user.username.is_empty() => user,
        _ => ImageUser {
            uid: Some(0),
            username: String::new(),
        },
    }
}

/// One container lifecycle event of CRI `GetContainerEvents`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeEvent {
    pub container_id: String,
    pub kind: RuntimeEventKind,
    /// The owning pod's UID (from the sandbox status the event carries; empty when it has
    /// none).
    pub pod_uid: String,
    /// Nanoseconds since the epoch.
    pub created_at: i64,
}

/// CRI `ContainerEventType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeEventKind {
    Created,
    Started,
    Stopped,
    Deleted,
}

/// The cgroup driver the runtime reports through CRI `RuntimeConfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeCgroupDriver {
    Systemd,
    Cgroupfs,
    /// The answer had no `linux` part.
    NotReported,
    /// The runtime lacks the call (gRPC Unimplemented, e.g. containerd 1.6).
    Unimplemented,
}

#[async_trait::async_trait]
pub trait Runtime: Send + Sync + 'static {
    async fn version(&self) -> Result<VersionInfo>;
    /// CRI `RuntimeConfig`'s cgroup driver. A value outside the CRI enum is an error.
    /// Fakes lack the call unless they say otherwise.
    async fn cgroup_driver(&self) -> Result<RuntimeCgroupDriver> {
        Ok(RuntimeCgroupDriver::Unimplemented)
    }
    /// The runtime's conditions (CRI Status). Fakes are ready unless they say otherwise.
    async fn status(&self) -> Result<Vec<RuntimeCondition>> {
        Ok(["RuntimeReady", "NetworkReady"]
            .into_iter()
            .map(|t| RuntimeCondition {
                type_: t.into(),
                status: true,
                reason: String::new(),
                message: String::new(),
            })
            .collect())
    }

    /// The features the runtime reports for `handler` (CRI Status `runtime_handlers`; the
    /// empty name is the default handler). A runtime that reports none (containerd 1.6) has
    /// none.
    /// Every handler's features and the runtime's own (CRI Status), for the Node's status.
    /// Fakes list none unless they say otherwise.
    async fn runtime_features(&self) -> Result<RuntimeFeatures> {
        Ok(RuntimeFeatures::default())
    }
    async fn handler_features(&self, handler: &str) -> Result<HandlerFeatures> {
        let _ = handler;
        Ok(HandlerFeatures::default())
    }

    async fn list_sandboxes(&self) -> Result<Vec<Sandbox>>;
    /// One pod's sandboxes. The CRI client asks the runtime to filter on the pod UID label,
    /// so a pod worker's pass costs the same however many pods the node runs.
    async fn list_pod_sandboxes(&self, uid: &str) -> Result<Vec<Sandbox>> {
        let all = self.list_sandboxes().await?;
        Ok(all.into_iter().filter(|s| s.pod_uid == uid).collect())
    }
    async fn sandbox_status(&self, id: &str) -> Result<SandboxStatus>;
    async fn run_sandbox(&self, config: &SandboxConfig) -> Result<String>;
    async fn stop_sandbox(&self, id: &str) -> Result<()>;
    async fn remove_sandbox(&self, id: &str) -> Result<()>;

    async fn list_containers(&self) -> Result<Vec<Container>>;
    /// One pod's containers (filtered by the runtime on the pod UID label, as
    /// [`Runtime::list_pod_sandboxes`]).
    async fn list_pod_containers(&self, uid: &str) -> Result<Vec<Container>> {
        let all = self.list_containers().await?;
        Ok(all
            .into_iter()
            .filter(|c| c.labels.get(LABEL_POD_UID).map(String::as_str) == Some(uid))
            .collect())
    }
    async fn container_status(&self, id: &str) -> Result<ContainerStatus>;
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox: &SandboxConfig,
    ) -> Result<String>;
    async fn start_container(&self, id: &str) -> Result<()>;
    /// Stops with SIGTERM (or the image's stop signal), then SIGKILL after `timeout`.
    async fn stop_container(&self, id: &str, timeout: Duration) -> Result<()>;
    async fn remove_container(&self, id: &str) -> Result<()>;
    async fn exec_sync(&self, id: &str, cmd: &[String], timeout: Duration) -> Result<ExecResult>;
    /// Prepares an Exec session on the runtime's streaming server; the URL to upgrade to.
    async fn exec(&self, id: &str, cmd: &[String], flags: StreamFlags) -> Result<String>;
    /// Prepares an Attach session to the container's main process; the URL to upgrade to.
    async fn attach(&self, id: &str, flags: StreamFlags) -> Result<String>;
    /// Prepares a PortForward session into the sandbox's network namespace (`ports` may be
    /// empty: SPDY clients name ports per stream); the URL to upgrade to.
    async fn port_forward(&self, sandbox_id: &str, ports: &[i32]) -> Result<String>;

    /// The image when present in the runtime's store.
    async fn image_status(&self, image: &str) -> Result<Option<ImageInfo>>;
    /// Every image in the runtime's store (CRI ListImages).
    async fn list_images(&self) -> Result<Vec<ImageSummary>>;
    /// Removes an image by ID or reference (CRI RemoveImage; absent is no error).
    async fn remove_image(&self, image: &str) -> Result<()>;
    /// Pulls `image`, with `auth` when the registry needs credentials.
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<&ImageAuth>,
        sandbox: &SandboxConfig,
    ) -> Result<String>;

    /// Usage of every container the runtime knows (one `ListContainerStats`, with an empty
    /// filter as upstream sends).
    async fn list_container_stats(&self) -> Result<Vec<ContainerStats>>;
    /// Usage of every ready sandbox with its containers (one `ListPodSandboxStats`). The
    /// request carries an empty filter, as upstream's: containerd 1.6 then skips sandboxes
    /// that are not ready, where without one a single stopped sandbox fails the whole answer.
    async fn list_sandbox_stats(&self) -> Result<Vec<SandboxStats>>;
    /// One sandbox's usage (`PodSandboxStats`): what the stats provider asks for each ready
    /// sandbox when the list fails.
    async fn sandbox_stats(&self, id: &str) -> Result<SandboxStats>;
    /// The runtime's image and container filesystems (`ImageFsInfo`).
    async fn image_fs_info(&self) -> Result<ImageFsInfo>;

    /// Asks the runtime to reopen the container's log file (after it was renamed by log
    /// rotation, the runtime creates a new one at the same path).
    async fn reopen_container_log(&self, id: &str) -> Result<()>;

    /// Changes a running container's resources in place (CRI UpdateContainerResources).
    async fn update_container_resources(&self, id: &str, resources: &LinuxResources) -> Result<()>;
    /// Tells the runtime the pod's new resources (CRI UpdatePodSandboxResources). A runtime
    /// without the call (containerd 1.6 answers Unimplemented) is no error, as upstream.
    async fn update_sandbox_resources(
        &self,
        sandbox_id: &str,
        overhead: &LinuxResources,
        resources: &LinuxResources,
    ) -> Result<()>;

    /// Opens the runtime's container event stream (CRI `GetContainerEvents`); the receiver
    /// ends when the stream does. An error: the runtime does not offer it (containerd 1.6) or
    /// could not open it.
    async fn container_events(&self) -> Result<tokio::sync::mpsc::Receiver<RuntimeEvent>> {
        Err(RuntimeError::Call {
            op: "GetContainerEvents",
            message: "not implemented by this runtime".into(),
        })
    }
}
