//! Fakes of the worker's dependencies ([`super::deps`]) for tests, and [`Deps::for_test`]:
//! the node's own pieces over fake edges (runtime, cgroups, mounts, apiserver).

use super::deps::*;
use super::*;
use crate::cm::{CgroupError, ContainerManager};
use crate::images::{PullBackoff, PullError};
use crate::volume::VolumeError;
use std::path::PathBuf;
use std::sync::Mutex;

impl Deps {
    /// Dependencies of fakes around `runtime` for tests: recording events and cgroups, no
    /// probe jitter, no real mounts, no apiserver (no service variables, no RuntimeClass),
    /// directories under `dir`. Override fields with `Deps { field, ..Deps::for_test(rt, dir) }`.
    pub fn for_test(runtime: Arc<dyn Runtime>, dir: &std::path::Path) -> Deps {
        Self::for_test_with_api(runtime, dir, None, true)
    }

    /// [`Deps::for_test`] with ConfigMaps and Secrets (pull secrets too) read from `api`,
    /// and pulled-image credential verification on or off (`records`).
    pub fn for_test_with_api(
        runtime: Arc<dyn Runtime>,
        dir: &std::path::Path,
        api: Option<Arc<dyn crate::objects::ApiObjects>>,
        records: bool,
    ) -> Deps {
        let binder: Arc<dyn crate::volume::subpath::Binder> =
            Arc::new(crate::volume::subpath::fake::FakeBinder::default());
        let node = NodeSettings {
            node_name: "n1".into(),
            host_ips: vec!["192.0.2.1".into()],
            pod_logs_dir: dir.join("logs"),
            root_dir: dir.join("root"),
            memory_capacity: 1 << 30,
            ..Default::default()
        };
        let objects = Arc::new(crate::objects::ObjectCache::new(api));
        // The default settings: verification on, NeverVerifyPreloadedImages.
        let records = records.then(|| {
            Arc::new(
                images::pull_records::PullRecords::open(
                    &node.root_dir,
                    images::pull_records::VerifyPolicy::default(),
                )
                .expect("pull records under the test directory"),
            )
        });
        Deps {
            allocations: Arc::new(crate::allocation::Allocations::in_memory()),
            events: Arc::new(crate::events::FakeRecorder::default()),
            probes: test_probes().0,
            exec: Arc::new(crate::probing::CriExec(runtime.clone())),
            pod_start_duration: None,
            runtime: runtime.clone(),
            cgroups: ContainerManager::for_test(Arc::new(crate::cm::FakeCgroups::default())),
            images: Arc::new(NodeImages {
                runtime,
                pull_gate: crate::images::PullGate::serial(),
                records,
                objects: objects.clone(),
                root_dir: node.root_dir.clone(),
                providers: None,
            }),
            volumes: Arc::new(crate::volume::VolumeManager::new(
                node.clone(),
                objects.clone(),
                Arc::new(crate::objects::token::TokenManager::new(None)),
                binder.clone(),
            )),
            pod_env: Arc::new(FakePodEnvironment {
                objects,
                ..Default::default()
            }),
            binder,
            node,
            runtime_name: "containerd".into(),
            statuses: Arc::new(StatusManager::new()),
            resync: Duration::from_secs(60),
            // The fakes refuse nothing; a test that needs admission's refusals sets them.
            refusal: |_| None,
            devices: Arc::new(NodeDevices::default()),
            userns: None,
            log_links: Arc::new(crate::logs::Links::with(
                dir.join("containers"),
                Arc::new(crate::logs::links::FakeLinkDir::default()),
            )),
        }
    }
}

/// A probe manager for tests, without start-up jitter.
pub fn test_probes() -> (
    Arc<::probes::ProbeManager>,
    mpsc::Receiver<::probes::ProbeUpdate>,
) {
    let metrics =
        ::probes::ProberMetrics::new(&prometheus::Registry::new()).expect("fresh registry");
    let (m, rx) = ::probes::ProbeManager::new(
        ::probes::ManagerConfig {
            jitter: false,
            ..Default::default()
        },
        metrics,
    );
    (Arc::new(m), rx)
}

/// Pod cgroups that record what was asked: `ensure <uid>`, `remove <uid>`,
/// `set <part> <uid>`; they hold no values (a resize updates containers only).
#[derive(Debug, Default)]
pub struct FakePodCgroups {
    calls: Mutex<Vec<String>>,
}

impl FakePodCgroups {
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl PodCgroups for FakePodCgroups {
    fn pod_parent(&self, qos: Qos, uid: &str) -> String {
        format!("/kubepods/{}/pod{uid}", qos.as_str().to_lowercase())
    }

    fn ensure_pod(&self, pod: &Pod) -> Result<(), CgroupError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        self.calls.lock().unwrap().push(format!("ensure {uid}"));
        Ok(())
    }

    fn remove_pod(&self, uid: &str) -> Result<(), CgroupError> {
        self.calls.lock().unwrap().push(format!("remove {uid}"));
        Ok(())
    }

    fn pod_values(&self, _pod: &Pod) -> Result<Option<crate::cm::PodCgroupValues>, CgroupError> {
        Ok(None)
    }

    fn wanted_pod_values(&self, _pod: &Pod) -> crate::cm::PodCgroupValues {
        crate::cm::PodCgroupValues::default()
    }

    fn set_pod_value(&self, pod: &Pod, part: crate::cm::PodCgroupPart) -> Result<(), CgroupError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        self.calls
            .lock()
            .unwrap()
            .push(format!("set {part:?} {uid}"));
        Ok(())
    }
}

/// Volumes that mount nothing (every pod gets `mounts`, or `error`) and record the calls:
/// `update <uid>`, `mount <uid>`, `forget <uid>`.
#[derive(Debug, Default)]
pub struct FakePodVolumes {
    pub mounts: BTreeMap<String, PathBuf>,
    pub error: Option<VolumeError>,
    /// How many `forget` calls fail next (a driver that cannot unpublish).
    pub forget_failures: Mutex<u32>,
    calls: Mutex<Vec<String>>,
}

impl FakePodVolumes {
    /// Volumes whose setup fails with `error`.
    pub fn failing(error: VolumeError) -> Self {
        FakePodVolumes {
            error: Some(error),
            ..Default::default()
        }
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn record(&self, what: &str, uid: &str) {
        self.calls.lock().unwrap().push(format!("{what} {uid}"));
    }
}

#[async_trait::async_trait]
impl PodVolumes for FakePodVolumes {
    fn update_pod(&self, pod: &Pod) {
        self.record("update", pod.metadata.uid.as_deref().unwrap_or_default());
    }

    async fn mount(&self, pod: &Pod) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
        self.record("mount", pod.metadata.uid.as_deref().unwrap_or_default());
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(self.mounts.clone()),
        }
    }

    async fn forget(&self, uid: &str) -> Result<(), TeardownError> {
        self.record("forget", uid);
        let mut left = self.forget_failures.lock().unwrap();
        if *left > 0 {
            *left -= 1;
            return Err(TeardownError(
                "UnmountVolume.TearDown failed: rpc error: code = Internal desc = busy".into(),
            ));
        }
        Ok(())
    }
}

/// An image puller for which every image is present, except those in `missing`, which fail
/// with their error; records the images asked for.
#[derive(Debug, Default)]
pub struct FakeImagePuller {
    pub missing: BTreeMap<String, PullError>,
    asked: Mutex<Vec<String>>,
}

impl FakeImagePuller {
    /// A puller for which `image` cannot be had, with `error`.
    pub fn without(image: &str, error: PullError) -> Self {
        FakeImagePuller {
            missing: [(image.to_string(), error)].into(),
            ..Default::default()
        }
    }

    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl ImagePuller for FakeImagePuller {
    async fn pod_keyrings(&self, _pod: &Pod) -> PodKeyrings {
        PodKeyrings::default()
    }

    async fn ensure_image(
        &self,
        c: &K8sContainer,
        _sandbox: &SandboxConfig,
        _keyrings: &PodKeyrings,
        _event: ContainerEvent<'_>,
        _backoff: &mut PullBackoff,
    ) -> Result<Option<ImageInfo>, PullError> {
        let image = c.image.clone().unwrap_or_default();
        self.asked.lock().unwrap().push(image.clone());
        match self.missing.get(&image) {
            Some(e) => Err(e.clone()),
            None => Ok(None),
        }
    }
}

/// A pod-environment source with fixed answers: `services` for every pod (None: not synced
/// yet), `handlers` by RuntimeClass name (an unknown class fails). The default is a node
/// without an apiserver: no variables and no RuntimeClass.
#[derive(Debug, Clone)]
pub struct FakePodEnvironment {
    pub services: Option<BTreeMap<String, String>>,
    pub handlers: BTreeMap<String, String>,
    /// Where the env's ConfigMaps and Secrets are read (by default, no apiserver: reading
    /// one fails).
    pub objects: Arc<crate::objects::ObjectCache>,
}

impl Default for FakePodEnvironment {
    fn default() -> Self {
        FakePodEnvironment {
            services: Some(BTreeMap::new()),
            handlers: BTreeMap::new(),
            objects: Arc::new(crate::objects::ObjectCache::new(None)),
        }
    }
}

#[async_trait::async_trait]
impl PodEnvironment for FakePodEnvironment {
    fn service_env(&self, _pod: &Pod) -> Result<BTreeMap<String, String>, PodEnvError> {
        self.services
            .clone()
            .ok_or_else(|| PodEnvError::Services("services have not synced yet".into()))
    }

    fn runtime_handler(&self, class: Option<&str>) -> Result<String, PodEnvError> {
        match class.filter(|c| !c.is_empty()) {
            None => Ok(String::new()),
            Some(c) => self
                .handlers
                .get(c)
                .cloned()
                .ok_or_else(|| PodEnvError::RuntimeClass(format!("no RuntimeClass {c:?}"))),
        }
    }

    async fn env_objects(
        &self,
        pod: &Pod,
        c: &K8sContainer,
    ) -> Result<spec::EnvObjects, PodEnvError> {
        self.objects
            .container_objects(pod, c)
            .await
            .map_err(|e| PodEnvError::Objects(e.to_string()))
    }
}
