//! What a pod worker reaches the node through: one narrow trait per concern (the runtime is
//! [`Runtime`]; here the pod cgroups, the volumes, the image puller and the pod-environment
//! source), and [`Deps`], the set every worker shares. The node's own implementations of the
//! first three are here; the pod-environment source is the API side's (service links and
//! RuntimeClasses come from informers), so the worker knows nothing of the apiserver. The
//! fakes are in `fake.rs` beside this file.

use super::*;
use crate::cm::{CgroupError, ContainerManager, PodCgroupPart, PodCgroupValues};
use crate::devices::{DeviceManager, DraError, DraManager, RunOptions};
use crate::images::Keyring;
use crate::images::{PullBackoff, PullError};
use crate::volume::VolumeError;
use std::path::PathBuf;

/// What every worker shares.
pub struct Deps {
    /// The pods' allocated resources (in-place resize): containers run with these.
    pub allocations: Arc<crate::allocation::Allocations>,
    pub runtime: Arc<dyn Runtime>,
    /// The pod cgroups, their limits and the QoS tiers above them.
    pub cgroups: Arc<dyn PodCgroups>,
    /// Sets up the pods' volumes.
    pub volumes: Arc<dyn PodVolumes>,
    /// Pulls the containers' images with the pods' credentials.
    pub images: Arc<dyn ImagePuller>,
    /// Service-link variables, RuntimeClass handlers, the ConfigMaps and Secrets the
    /// containers' env reads.
    pub pod_env: Arc<dyn PodEnvironment>,
    /// Bind mounts for subPath volume mounts.
    pub binder: Arc<dyn crate::volume::Binder>,
    pub statuses: Arc<StatusManager>,
    /// Pulling, Pulled, Created, Started, Killing, BackOff, ... events.
    pub events: Arc<dyn EventRecorder>,
    /// Liveness, readiness and startup probes of every container.
    pub probes: Arc<::probes::ProbeManager>,
    /// How exec probes reach the runtime.
    pub exec: Arc<dyn ::probes::ExecRunner>,
    /// `kubelet_pod_start_duration_seconds`, when metrics are kept.
    pub pod_start_duration: Option<prometheus::Histogram>,
    pub node: NodeSettings,
    /// `containerd` in `containerd://<id>`.
    pub runtime_name: String,
    pub resync: Duration,
    /// Admission's refusal of the pod-field values this node agent does not provide
    /// (`pod::admission::fields::refusal`): (reason, message). Ephemeral containers arrive
    /// after admission, so their starts are checked with it.
    pub refusal: Refusal,
    /// The device plugins' allocations and the ResourceClaims (dynamic resource
    /// allocation): claims prepared before the sandbox, the devices' run options and CDI
    /// names in the containers' configs, their health in the pod's status.
    pub devices: Arc<dyn PodDevices>,
    /// The containers' `/var/log/containers` links for log shippers.
    pub log_links: Arc<crate::logs::Links>,
    /// The pods' user namespaces (`hostUsers: false`). None: the node has no range for them
    /// (tests), and such pods are refused before their sandbox.
    pub userns: Option<Arc<crate::userns::UsernsManager>>,
}

/// A check of a pod's field values: the (reason, message) of the first refused one.
pub type Refusal = fn(&Pod) -> Option<(&'static str, &'static str)>;

/// The pod cgroups. Blocking (file work): call on the blocking pool.
pub trait PodCgroups: Send + Sync + 'static {
    /// The cgroup parent of the pod's sandbox, as the runtime expects it.
    fn pod_parent(&self, qos: Qos, uid: &str) -> String;
    /// Creates the pod's cgroup with its limits (or updates them).
    fn ensure_pod(&self, pod: &Pod) -> Result<(), CgroupError>;
    /// Removes the pod's cgroup.
    fn remove_pod(&self, uid: &str) -> Result<(), CgroupError>;
    /// The pod cgroup's CPU and memory values now (None: the pod has no cgroup of its own).
    fn pod_values(&self, pod: &Pod) -> Result<Option<PodCgroupValues>, CgroupError>;
    /// The values `pod` (at its allocation) asks of its cgroup.
    fn wanted_pod_values(&self, pod: &Pod) -> PodCgroupValues;
    /// Writes one of `pod`'s values to its cgroup (an in-place resize orders them).
    fn set_pod_value(&self, pod: &Pod, part: PodCgroupPart) -> Result<(), CgroupError>;
}

impl PodCgroups for ContainerManager {
    fn pod_parent(&self, qos: Qos, uid: &str) -> String {
        self.namer().pod_parent(qos, uid)
    }

    fn ensure_pod(&self, pod: &Pod) -> Result<(), CgroupError> {
        ContainerManager::ensure_pod(self, pod)
    }

    fn remove_pod(&self, uid: &str) -> Result<(), CgroupError> {
        ContainerManager::remove_pod(self, uid)
    }

    fn pod_values(&self, pod: &Pod) -> Result<Option<PodCgroupValues>, CgroupError> {
        ContainerManager::pod_values(self, pod)
    }

    fn wanted_pod_values(&self, pod: &Pod) -> PodCgroupValues {
        ContainerManager::wanted_pod_values(self, pod)
    }

    fn set_pod_value(&self, pod: &Pod, part: PodCgroupPart) -> Result<(), CgroupError> {
        ContainerManager::set_pod_value(self, pod, part)
    }
}

/// The pods' volumes.
#[async_trait::async_trait]
pub trait PodVolumes: Send + Sync + 'static {
    /// The pod's spec changed: what its volumes show (labels, annotations) follows it.
    fn update_pod(&self, pod: &Pod);
    /// Sets up every volume of `pod`; their host paths by volume name.
    async fn mount(&self, pod: &Pod) -> Result<BTreeMap<String, PathBuf>, VolumeError>;
    /// The pod is gone: stop keeping its volumes up to date, and tear down those a driver
    /// serves. An error: one could not be torn down; the pod's directory must stay and the
    /// call be made again.
    async fn forget(&self, uid: &str) -> Result<(), TeardownError>;
}

/// A volume of a removed pod could not be torn down (the driver's message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TeardownError(pub String);

#[async_trait::async_trait]
impl PodVolumes for crate::volume::VolumeManager {
    fn update_pod(&self, pod: &Pod) {
        crate::volume::VolumeManager::update_pod(self, pod)
    }

    async fn mount(&self, pod: &Pod) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
        crate::volume::VolumeManager::mount(self, pod).await
    }

    async fn forget(&self, uid: &str) -> Result<(), TeardownError> {
        crate::volume::VolumeManager::forget(self, uid)
            .await
            .map_err(|e| TeardownError(e.to_string()))
    }
}

/// A pod's registry credentials.
#[derive(Debug, Clone, Default)]
pub struct PodKeyrings {
    /// Pull secrets' keyrings in the pod's order, then the node's.
    pub keyrings: Vec<Keyring>,
    /// Pull secrets that could not be read (the pulls go on without them).
    pub missing: Vec<String>,
    /// Pull secrets whose docker config does not parse (the pulls fail with this).
    pub invalid: Option<String>,
    /// Pull secrets with keys refused for an over-long host (one message each; the pulls
    /// go on with their other keys).
    pub refused: Vec<String>,
    /// The pod, as credential provider plugins see it (its service account).
    pub pod: images::credentials::plugins::PodIdentity,
}

/// Records an event about a container: type, reason, message.
pub type ContainerEvent<'a> = &'a (dyn Fn(EventType, &str, &str) + Send + Sync);

/// Pulls containers' images.
#[async_trait::async_trait]
pub trait ImagePuller: Send + Sync + 'static {
    /// The pod's credentials: its pull secrets, then the node's docker config.
    async fn pod_keyrings(&self, pod: &Pod) -> PodKeyrings;
    /// Makes `c`'s image present as its pull policy says, backing off per image in
    /// `backoff`; `event` records Pulling, Pulled, BackOff, ... about the container. Gives
    /// the image's status when it read one (the caller then need not ask the runtime again).
    async fn ensure_image(
        &self,
        c: &K8sContainer,
        sandbox: &SandboxConfig,
        keyrings: &PodKeyrings,
        event: ContainerEvent<'_>,
        backoff: &mut PullBackoff,
    ) -> Result<Option<ImageInfo>, PullError>;
}

/// The node's image puller: the runtime's image service, as many pulls at once as the
/// pull gate allows, pull secrets read through the object cache.
pub struct NodeImages {
    pub runtime: Arc<dyn Runtime>,
    /// Pulls take a slot of it (`serializeImagePulls`, `maxParallelImagePulls`).
    pub pull_gate: images::PullGate,
    /// Pulled-image credential verification (None: the `KubeletEnsureSecretPulledImages`
    /// gate is off).
    pub records: Option<Arc<images::pull_records::PullRecords>>,
    /// Where pull secrets are read.
    pub objects: Arc<crate::objects::ObjectCache>,
    /// The node's docker config is looked for under it.
    pub root_dir: PathBuf,
    /// `--image-credential-provider-config`: plugins that give credentials per image.
    pub providers: Option<Arc<images::credentials::plugins::CredentialProviders>>,
}

#[async_trait::async_trait]
impl ImagePuller for NodeImages {
    async fn pod_keyrings(&self, pod: &Pod) -> PodKeyrings {
        let images::SecretKeyrings {
            keyrings,
            missing,
            invalid,
            refused,
        } = images::pod_keyrings(pod, &self.objects, &self.root_dir).await;
        PodKeyrings {
            keyrings,
            missing,
            invalid: (!invalid.is_empty()).then(|| invalid.join("; ")),
            refused,
            pod: images::credentials::plugins::PodIdentity::of(pod),
        }
    }

    async fn ensure_image(
        &self,
        c: &K8sContainer,
        sandbox: &SandboxConfig,
        keyrings: &PodKeyrings,
        event: ContainerEvent<'_>,
        backoff: &mut PullBackoff,
    ) -> Result<Option<ImageInfo>, PullError> {
        let puller = images::Puller {
            runtime: self.runtime.as_ref(),
            pull_gate: &self.pull_gate,
            event,
            keyrings: &keyrings.keyrings,
            keyring_error: keyrings.invalid.as_deref(),
            records: self.records.as_ref(),
            plugins: self.providers.as_deref().map(|p| (p, &keyrings.pod)),
        };
        images::ensure_image(&puller, backoff, c, sandbox).await
    }
}

/// Why the pod-environment source cannot give what a pod needs (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodEnvError {
    /// The service-link variables cannot be built yet: the container waits with this
    /// CreateContainerConfigError.
    #[error("{0}")]
    Services(String),
    /// The pod's RuntimeClass names no handler: its sandbox fails with this.
    #[error("{0}")]
    RuntimeClass(String),
    /// A ConfigMap or Secret the container's env reads cannot be read (not found is no
    /// error): the container waits with this CreateContainerConfigError.
    #[error("{0}")]
    Objects(String),
}

/// What a pod's environment takes from the cluster: the service-link variables, the CRI
/// handler of its RuntimeClass and the ConfigMaps and Secrets its env reads. The API side
/// implements it (standalone: no variables, and a pod naming a RuntimeClass fails its
/// sandbox).
#[async_trait::async_trait]
pub trait PodEnvironment: Send + Sync + 'static {
    /// The service-link variables of `pod` (its namespace, `enableServiceLinks`).
    fn service_env(&self, pod: &Pod) -> Result<BTreeMap<String, String>, PodEnvError>;
    /// The handler of RuntimeClass `class` (None or `""`: the runtime's default, `""`).
    fn runtime_handler(&self, class: Option<&str>) -> Result<String, PodEnvError>;
    /// The ConfigMaps and Secrets container `c`'s env reads (`None`: not found).
    async fn env_objects(
        &self,
        pod: &Pod,
        c: &K8sContainer,
    ) -> Result<spec::EnvObjects, PodEnvError>;
}

/// Why a pod's devices cannot be given to it (yet). The texts are upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// A device plugin's PreStartContainer failed.
    #[error("{0}")]
    PreStart(String),
    /// A DRA driver could not prepare or unprepare a claim, or name its CDI devices.
    #[error(transparent)]
    Claims(#[from] DraError),
}

/// The pod's devices: what the device plugins allocated and its ResourceClaims (DRA).
#[async_trait::async_trait]
pub trait PodDevices: Send + Sync + 'static {
    /// Prepares the pod's claims (before its sandbox, as upstream's SyncPod).
    async fn prepare_claims(&self, pod: &Pod) -> Result<(), DeviceError>;
    /// Unprepares the claims only the pod with `uid` used.
    async fn unprepare_claims(&self, uid: &str) -> Result<(), DeviceError>;
    /// Whether claims of the pod with `uid` are prepared.
    fn has_claims(&self, uid: &str) -> bool;
    /// The device plugins that asked for it hear of the container's start
    /// (PreStartContainer).
    async fn pre_start(&self, uid: &str, container: &str) -> Result<(), DeviceError>;
    /// The device plugins' run options for container `c`, and the CDI names of the claims
    /// it uses.
    fn container_devices(
        &self,
        pod: &Pod,
        c: &K8sContainer,
    ) -> Result<(Option<RunOptions>, Vec<String>), DeviceError>;
    /// The devices' health in the pod's status (`allocatedResourcesStatus`).
    fn fill_status(&self, uid: &str, st: &mut PodStatus);
}

/// The node's devices: the device manager and the DRA manager (None: not here, as in
/// tests).
#[derive(Default)]
pub struct NodeDevices {
    pub plugins: Option<Arc<DeviceManager>>,
    pub dra: Option<Arc<DraManager>>,
}

#[async_trait::async_trait]
impl PodDevices for NodeDevices {
    async fn prepare_claims(&self, pod: &Pod) -> Result<(), DeviceError> {
        match &self.dra {
            Some(dra) => Ok(dra.prepare(pod).await?),
            None => Ok(()),
        }
    }

    async fn unprepare_claims(&self, uid: &str) -> Result<(), DeviceError> {
        match &self.dra {
            Some(dra) => Ok(dra.unprepare(uid).await?),
            None => Ok(()),
        }
    }

    fn has_claims(&self, uid: &str) -> bool {
        self.dra.as_ref().is_some_and(|d| d.has_pod(uid))
    }

    async fn pre_start(&self, uid: &str, container: &str) -> Result<(), DeviceError> {
        match &self.plugins {
            Some(d) => d
                .pre_start(uid, container)
                .await
                .map_err(DeviceError::PreStart),
            None => Ok(()),
        }
    }

    fn container_devices(
        &self,
        pod: &Pod,
        c: &K8sContainer,
    ) -> Result<(Option<RunOptions>, Vec<String>), DeviceError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        let opts = self
            .plugins
            .as_ref()
            .and_then(|d| d.run_options(uid, &c.name));
        let cdi = match &self.dra {
            Some(dra) => dra.cdi_devices(pod, c)?,
            None => Vec::new(),
        };
        Ok((opts, cdi))
    }

    fn fill_status(&self, uid: &str, st: &mut PodStatus) {
        if let Some(d) = &self.plugins {
            d.fill_allocated_resources_status(uid, st);
        }
    }
}
