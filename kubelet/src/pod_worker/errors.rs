//! Why a container or a pod's sandbox did not start: upstream's waiting reasons and events.

use super::*;

/// Why a container did not start: upstream's waiting reasons, each with its retry delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// ErrImagePull, ImagePullBackOff, ErrImageNeverPull, ImageInspectError.
    Image(images::PullError),
    CreateContainerConfig {
        message: String,
        retry_after: Duration,
    },
    CreateContainer(String),
    RunContainer(String),
    /// A volume could not be set up: the containers wait in `ContainerCreating` and the pod
    /// gets a `FailedMount` event.
    Volumes(crate::volume::VolumeError),
    /// The postStart hook failed (upstream's message); the container was killed.
    PostStartHook(String),
}

/// A pull dropped because the pod is stopping: no back-off is recorded, the pass ends.
pub(super) fn pull_cancelled() -> images::PullError {
    images::PullError {
        reason: images::PullReason::ErrImagePull,
        message: "image pull cancelled: the pod is stopping".into(),
        retry_after: Duration::ZERO,
    }
}

/// How soon a pod whose volumes failed tries again.
pub(super) const VOLUME_RETRY: Duration = Duration::from_secs(2);

impl StartError {
    pub fn reason(&self) -> &'static str {
        match self {
            StartError::Image(e) => e.reason.as_str(),
            StartError::CreateContainerConfig { .. } => "CreateContainerConfigError",
            StartError::CreateContainer(_) => "CreateContainerError",
            StartError::RunContainer(_) => "RunContainerError",
            StartError::Volumes(_) => "ContainerCreating",
            StartError::PostStartHook(_) => "PostStartHookError",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            StartError::Image(e) => &e.message,
            StartError::CreateContainerConfig { message, .. } => message,
            StartError::CreateContainer(m)
            | StartError::RunContainer(m)
            | StartError::PostStartHook(m) => m,
            // Upstream leaves the message empty while volumes are pending.
            StartError::Volumes(_) => "",
        }
    }

    /// When to try again.
    pub fn retry_after(&self) -> Duration {
        match self {
            StartError::Image(e) => e.retry_after,
            StartError::CreateContainerConfig { retry_after, .. } => *retry_after,
            StartError::Volumes(_) => VOLUME_RETRY,
            _ => Duration::from_secs(10),
        }
    }

    /// The detail of the `Failed` event: image errors give their reason ("Error:
    /// ErrImagePull"), the others the runtime's message, as upstream.
    pub fn event_detail(&self) -> &str {
        match self {
            StartError::Image(_) => self.reason(),
            _ => self.message(),
        }
    }

    pub fn waiting(&self) -> Waiting {
        Waiting {
            reason: self.reason().into(),
            message: self.message().into(),
        }
    }
}

/// Why a pod's sandbox could not be made (the `FailedCreatePodSandBox` event says
/// "Failed to create pod sandbox: " and this).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The pod's RuntimeClass names no handler.
    #[error(transparent)]
    RuntimeClass(#[from] PodEnvError),
    #[error("creating {path}: {source}")]
    LogDirectory {
        path: String,
        source: std::io::Error,
    },
    /// `setHostnameAsFQDN` asks for an FQDN longer than the kernel's nodename.
    #[error("{0}")]
    Hostname(String),
    /// RunPodSandbox failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// `hostUsers: false`: the pod's user namespace cannot be had (validation, the runtime
    /// handler's support, the node's range), so no sandbox is created.
    #[error("{0}")]
    UserNamespace(String),
}
