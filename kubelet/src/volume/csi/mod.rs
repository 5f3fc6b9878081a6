//! CSI volumes on the node (upstream's `pkg/volume/csi`): the registration handler that CSI
//! drivers reach through the plugin manager ([`drivers`]), the `csi.v1` Node client
//! ([`client`]), and the node's record of its drivers in the cluster: the CSINode object and
//! the Node's `csi.volume.kubernetes.io/nodeid` annotation and topology labels
//! ([`nodeinfo`]); what the CSIDriver object asks ([`driver_spec`]) and what a mount needs
//! from the cluster first ([`prepare`]: attach, secrets, pod info, tokens); staging and
//! publishing at upstream's paths ([`mounter`]); online expansion of mounted volumes
//! ([`expand`]).

pub mod api;
pub mod client;
pub mod driver_spec;
pub mod drivers;
pub mod expand;
pub mod mounter;
pub mod nodeinfo;
pub mod prepare;

#[cfg(any(test, feature = "test-util"))]
pub mod fake;

pub use api::{ApiError, CsiApi};
pub use client::{CsiNode, CsiStatus, GrpcCsiNode};
pub use driver_spec::{DriverSpec, Prepared, SecretRef};
pub use drivers::{CsiDrivers, Driver, RegistrationHandler};
pub use mounter::CsiMounter;
pub use nodeinfo::{KubeNodeInfo, NodeInfoApi, NodeInfoError};

/// Upstream's plugin name of CSI volumes (metrics label, the `kubernetes.io~csi` directory).
pub const CSI_PLUGIN_NAME: &str = "kubernetes.io/csi";

/// Why a CSI volume could not be set up or torn down, or a CSI driver not registered. The
/// texts are upstream's (they reach events and pod statuses); those of upstream's csi package
/// carry its `kubernetes.io/csi: ` prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsiError {
    /// A name used as one path component is empty, `.`, `..` or holds a separator.
    #[error("kubernetes.io/csi: invalid {kind} {value:?}")]
    InvalidName { kind: &'static str, value: String },
    #[error("kubernetes.io/csi: driver name {0} not found in the list of registered CSI drivers")]
    DriverNotRegistered(String),
    /// A Node-service call failed (its gRPC status).
    #[error("{0}")]
    Rpc(#[from] CsiStatus),
    /// An apiserver read of the CSIDriver object or the Node failed.
    #[error("kubernetes.io/csi: {0}")]
    Api(ApiError),
    /// The CSIDriver object holds a value this kubelet does not know.
    #[error("kubernetes.io/csi: {0}")]
    DriverSpec(#[from] driver_spec::DriverSpecError),
    /// The CSIDriver object does not list the lifecycle mode.
    #[error("kubernetes.io/csi: volume mode {mode:?} not supported by driver {driver} (only supports {})", go_quoted(.supported))]
    ModeNotSupported {
        mode: String,
        driver: String,
        supported: Vec<String>,
    },
    #[error(
        "Volume not attached according to node status for volume {volume:?} (UniqueName: {unique:?}) pod {pod:?} (UID: {uid:?}) "
    )]
    NotAttached {
        volume: String,
        unique: String,
        pod: String,
        uid: String,
    },
    /// The VolumeAttachment is missing, going or not attached (`detail` says which).
    #[error("MountVolume.WaitForAttach failed for volume {volume:?} : {detail}")]
    WaitForAttach { volume: String, detail: String },
    #[error(
        "MountVolume.MountDevice failed for volume {volume:?} : fetching NodeStageSecretRef {namespace}/{name} failed: {source}"
    )]
    StageSecret {
        volume: String,
        namespace: String,
        name: String,
        source: Box<CsiError>,
    },
    #[error(
        "kubernetes.io/csi: failed to find the secret {name} in the namespace {namespace} with error: {source}"
    )]
    Secret {
        namespace: String,
        name: String,
        source: ApiError,
    },
    #[error("kubernetes.io/csi: mounter.SetUpAt failed to get CSI persistent source: {0}")]
    PublishSecret(Box<CsiError>),
    #[error(
        "kubernetes.io/csi: mounter.SetUpAt failed to get service accoount token attributes: {0}"
    )]
    Tokens(ApiError),
    /// A file or directory of the volume could not be made.
    #[error("{action} {}: {message}", .path.display())]
    Io {
        action: &'static str,
        path: std::path::PathBuf,
        message: String,
    },
    /// `vol_data.json` could not be encoded.
    #[error("{0}")]
    Encode(String),
    /// A blocking task of the mount failed to finish.
    #[error("{0}")]
    Join(String),
    #[error("MountVolume.MountDevice failed for volume {volume:?} : {source}")]
    MountDevice { volume: String, source: CsiStatus },
    #[error("applyFSGroup failed for vol {handle}: {message}")]
    FsGroup { handle: String, message: String },
    #[error("UnmountVolume.TearDown failed: {0}")]
    TearDown(CsiStatus),
    #[error("UnmountVolume.TearDown failed: {} is still mounted", .0.display())]
    StillMounted(std::path::PathBuf),
    #[error("UnmountDevice failed: {0}")]
    UnmountDevice(CsiStatus),
    /// A version the driver listed does not parse.
    #[error("{0}")]
    Version(#[from] drivers::VersionError),
    #[error("kubernetes.io/csi: CSI driver reporting empty array for supported versions")]
    NoVersions,
    #[error("could not find a highest supported version from versions ([{}]) reported by this driver: {}", .versions.join(" "), .last.as_ref().map_or("<nil>".to_string(), |e| e.to_string()))]
    NoSupportedVersion {
        versions: Vec<String>,
        last: Option<drivers::VersionError>,
    },
    #[error("highest supported version reported by driver is {0}, must be v1.x")]
    NotV1(drivers::Version),
    #[error(
        "kubernetes.io/csi: {caller} for CSI driver {driver:?} failed. Plugin returned an empty list for supported versions"
    )]
    EmptyVersions {
        caller: &'static str,
        driver: String,
    },
    #[error("kubernetes.io/csi: {caller} for CSI driver {driver:?} failed. None of the versions specified {} are supported. err={source}", go_quoted(.versions))]
    UnsupportedVersions {
        caller: &'static str,
        driver: String,
        versions: Vec<String>,
        source: Box<CsiError>,
    },
    #[error("kubernetes.io/csi: {caller} for CSI driver {driver:?} failed. Another driver with the same name is already registered with a higher supported version: {:?}", .existing.to_string())]
    AlreadyRegistered {
        caller: &'static str,
        driver: String,
        existing: drivers::Version,
    },
    #[error("validation failed for CSI Driver {driver} at endpoint {endpoint}: {source}")]
    Validation {
        driver: String,
        endpoint: String,
        source: Box<CsiError>,
    },
    /// The Node or CSINode record of the driver could not be written.
    #[error("{0}")]
    NodeInfo(#[from] NodeInfoError),
}

impl CsiError {
    /// A failed blocking task.
    pub(crate) fn join(e: tokio::task::JoinError) -> Self {
        CsiError::Join(e.to_string())
    }

    /// An I/O failure on `path` while `action` (`creating`, `writing`, ...).
    pub(crate) fn io(
        action: &'static str,
        path: &std::path::Path,
        e: impl std::fmt::Display,
    ) -> Self {
        CsiError::Io {
            action,
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    }
}

impl From<CsiError> for crate::pluginmanager::PluginError {
    fn from(e: CsiError) -> Self {
        crate::pluginmanager::PluginError::new(e)
    }
}

/// Go's `%q` of a string slice: `["a" "b"]`.
pub(crate) fn go_quoted(v: &[String]) -> String {
    let q: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", q.join(" "))
}

/// Prefixes a message as upstream's csi package logs it.
pub(crate) fn log(msg: impl std::fmt::Display) -> String {
    format!("{CSI_PLUGIN_NAME}: {msg}")
}
