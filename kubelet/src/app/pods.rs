//! Starts what the pod workers stand on (node settings, volumes, informers, the workers'
//! environment), the static pod source and the pod pipeline (the one admission).

use super::Shared;
use super::cluster::Connected;
use crate::cm::ContainerManager;
use crate::config::Config;
use crate::images::credentials::plugins::CredentialProviders;
use crate::node_settings::NodeSettings;
use crate::pod::{Admission, SysctlAllowlist};
use crate::pod_worker::Deps;
use crate::podspec::Source;
use crate::spec;
use crate::sync_loop::SourceUpdate;
use k8s_openapi::api::core::v1::Pod;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The node facts container specs are built from. The Node's allocatable is computed as for
/// its status (host facts are blocking reads): a downward API `limits.*` of a container
/// without that limit reads it, as upstream's.
async fn node_settings(
    cfg: &Config,
    cm: &ContainerManager,
    node_ips: &[IpAddr],
    (runtime_name, runtime_version): (&str, &str),
) -> NodeSettings {
    let host_dns = cfg
        .resolv_conf
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|t| spec::parse_resolv_conf(&t))
        .unwrap_or_default();
    let facts = crate::host::LinuxHost {
        root_dir: cfg.root_dir.clone(),
    };
    let host_info = tokio::task::spawn_blocking(move || {
        use crate::host::HostFacts;
        facts.host_info()
    })
    .await
    .unwrap_or_default();
    let (_, allocatable) =
        crate::cm::resource_lists(&host_info, cfg.node.max_pods, &cfg.cm.resources);
    // As upstream at start: volumes' propagation mounts need the root dir on a shared mount.
    crate::volume::make_root_dir_rshared(
        |dir| {
            use crate::volume::Binder;
            crate::volume::KernelBinder.make_rshared(dir)
        },
        cfg.root_dir.clone(),
    )
    .await;
    NodeSettings {
        node_name: cfg.node.node_name.clone(),
        host_ips: node_ips.iter().map(|i| i.to_string()).collect(),
        cluster_dns: cfg.cluster_dns.iter().map(|i| i.to_string()).collect(),
        cluster_domain: cfg.cluster_domain.clone(),
        host_dns,
        pod_logs_dir: cfg.pod_logs_dir.clone(),
        root_dir: cfg.root_dir.clone(),
        memory_capacity: crate::host::memory_capacity(),
        seccomp_default: cfg.seccomp_default,
        pod_limits: cfg.cm.pod_limits.clone(),
        hugepage_sizes: crate::host::hugepage_sizes(),
        selinux_enabled: crate::host::selinux_enabled(),
        cgroup_v2: cm.version() == crate::cm::CgroupVersion::V2,
        swap_capacity: crate::host::swap_capacity(),
        restart_backoff_max: crate::node_settings::RestartBackoffMax(cfg.crash_loop_max),
        image_volumes: crate::volume::runtime_mounts_images(runtime_name, runtime_version),
        runtime_version: format!("{runtime_name} {runtime_version}"),
        allocatable,
    }
}

/// What [`start`] built: the pod workers' dependencies and (cluster mode) the storage they
/// mount claims and CSI volumes through.
pub(super) struct PodSide {
    pub deps: Arc<Deps>,
    pub storage: Option<Arc<crate::volume::Storage>>,
}

/// The node settings, the plugin manager and storage, and the pod workers' dependencies.
pub(super) async fn start(
    cfg: &Config,
    shared: &Shared,
    ((runtime_name, runtime_version), cm): ((String, String), Arc<ContainerManager>),
    cluster: Option<&Connected>,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) -> Result<PodSide, super::AppError> {
    let runtime = (runtime_name.as_str(), runtime_version.as_str());
    let node = node_settings(cfg, &cm, &shared.node_ips, runtime).await;
    // A few small files under /sys and /etc/selinux: read off the async workers.
    let selinux_host = tokio::task::spawn_blocking(crate::volume::SeLinuxHost::detect)
        .await
        .unwrap_or_default();
    let selinux = crate::volume::SeLinuxVolumes::new(selinux_host, cfg.selinux_mount);
    let storage = storage(&node, shared, selinux, cluster, tasks, cancel);
    let worker = (runtime_name, cm, node);
    let mut deps = worker_env(cfg, shared, worker, cluster, storage.clone(), tasks, cancel);
    Arc::get_mut(&mut deps).expect("not shared yet").userns = Some(userns(cfg).await?);
    Ok(PodSide { deps, storage })
}

/// The pods' user namespaces: the node's range (`/etc/subuid`, `/etc/subgid`), checked, and
/// the ranges recorded in the pod directories taken again (blocking reads, at start).
async fn userns(cfg: &Config) -> Result<Arc<crate::userns::UsernsManager>, super::AppError> {
    use crate::userns::{self, DirRecords, UsernsManager};
    let (per_pod, max_pods) = (cfg.user_namespaces.ids_per_pod, cfg.node.max_pods);
    let pods_dir = cfg.root_dir.join("pods");
    let made = tokio::task::spawn_blocking(move || {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let range = userns::kubelet_range(
            read(userns::SUBUID_FILE).as_deref(),
            read(userns::SUBGID_FILE).as_deref(),
        )?;
        tracing::info!(
            first_id = range.0,
            length = range.1,
            ids_per_pod = per_pod,
            "user namespace range for pods"
        );
        UsernsManager::new(Arc::new(DirRecords { pods_dir }), per_pod, range, max_pods)
    })
    .await
    .expect("user namespace setup does not panic")?;
    Ok(Arc::new(made))
}

/// `--image-credential-provider-config`: the plugins, read and checked at start (a bad
/// configuration or a missing plugin stops the start, as upstream).
pub(super) async fn credential_providers(
    cfg: &Config,
    cluster: Option<&Connected>,
) -> Result<Option<Arc<CredentialProviders>>, super::AppError> {
    use crate::images::credentials::plugins::{ApiServiceAccounts, ProcessExec, ServiceAccounts};
    let Some(config) = &cfg.images.image_credential_provider_config else {
        return Ok(None);
    };
    let bin_dir = cfg
        .images
        .image_credential_provider_bin_dir
        .clone()
        .unwrap_or_default();
    let accounts = cluster.map(|c| {
        Arc::new(ApiServiceAccounts(Arc::new(
            crate::objects::ClusterObjects::new(c.client.clone()),
        ))) as Arc<dyn ServiceAccounts>
    });
    let providers =
        CredentialProviders::load(config, &bin_dir, Arc::new(ProcessExec), accounts).await?;
    tracing::info!(providers = ?providers.names(), config = %config.display(), "registered credential provider plugins");
    Ok(Some(Arc::new(providers)))
}

/// The pods' allocated resources, read back from `<root-dir>/allocated_pods_state` (off the
/// async workers).
pub(super) async fn allocations(
    cfg: &Config,
) -> Result<Arc<crate::allocation::Allocations>, super::AppError> {
    use crate::allocation::{AllocationError, Allocations, CHECKPOINT_FILE};
    let root = cfg.root_dir.clone();
    let opened = tokio::task::spawn_blocking(move || Allocations::open(&root))
        .await
        .unwrap_or_else(|e| {
            Err(AllocationError::Read {
                path: cfg.root_dir.join(CHECKPOINT_FILE),
                source: std::io::Error::other(e.to_string()),
            })
        })?;
    Ok(Arc::new(opened))
}

fn worker_env(
    cfg: &Config,
    parts: &Shared,
    (runtime_name, cm, node): (String, Arc<ContainerManager>, NodeSettings),
    cluster: Option<&Connected>,
    storage: Option<Arc<crate::volume::Storage>>,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) -> Arc<Deps> {
    // ConfigMaps, Secrets and tokens come from the apiserver; standalone pods cannot use them.
    let api_objects = cluster.map(|c| {
        Arc::new(crate::objects::ClusterObjects::new(c.client.clone()))
            as Arc<dyn crate::objects::ApiObjects>
    });
    let binder: Arc<dyn crate::volume::Binder> = Arc::new(crate::volume::KernelBinder);
    let mut volumes = crate::volume::VolumeManager::new(
        node.clone(),
        Arc::new(crate::objects::ObjectCache::new(api_objects.clone())),
        Arc::new(crate::objects::TokenManager::new(api_objects)),
        binder.clone(),
    )
    .with_resync(cfg.sync_frequency);
    if let Some(s) = storage {
        volumes = volumes.with_storage(s);
    }
    let volumes = Arc::new(volumes);
    tasks.spawn(volumes.clone().run(cancel.clone()));
    // Services (service-link variables) and RuntimeClasses come from informers in cluster
    // mode; standalone pods get no service variables and cannot name a RuntimeClass.
    let (services, runtime_classes) = match cluster {
        Some(c) => {
            use crate::objects::{informer, runtime_class, services};
            let svc = Arc::new(services::ServiceStore::default());
            let rc = Arc::new(runtime_class::RuntimeClassStore::default());
            tasks.spawn(informer::run(
                c.client.clone(),
                "services",
                services::ServiceInfo::from_service,
                svc.clone(),
                cancel.clone(),
            ));
            tasks.spawn(informer::run(
                c.client.clone(),
                "runtimeclasses",
                runtime_class::handler_of,
                rc.clone(),
                cancel.clone(),
            ));
            (Some(svc), Some(rc))
        }
        None => (None, None),
    };
    let objects = volumes.objects().clone();
    Arc::new(Deps {
        allocations: parts.allocations.clone(),
        events: parts.events.clone(),
        probes: parts.probes.clone(),
        exec: Arc::new(crate::probing::CriExec(parts.runtime.clone())),
        pod_start_duration: Some(parts.metrics.pod_start_duration.clone()),
        runtime: parts.runtime.clone(),
        cgroups: cm,
        images: Arc::new(crate::pod_worker::NodeImages {
            runtime: parts.runtime.clone(),
            pull_gate: crate::images::PullGate::new(&cfg.images.pull_gate)
                .with_registry_limit(cfg.images.registry_pull_qps, cfg.images.registry_burst),
            records: parts.pull_records.clone(),
            objects: volumes.objects().clone(),
            root_dir: node.root_dir.clone(),
            providers: parts.credential_providers.clone(),
        }),
        node,
        runtime_name,
        statuses: parts.statuses.clone(),
        resync: cfg.sync_frequency,
        binder,
        volumes,
        pod_env: Arc::new(super::pod_env::ApiPodEnvironment {
            services,
            runtime_classes,
            objects: Some(objects),
        }),
        refusal: crate::pod::field_refusal,
        devices: Arc::new(crate::pod_worker::NodeDevices {
            plugins: Some(parts.devices.clone()),
            dra: Some(parts.dra.clone()),
        }),
        log_links: Arc::new(crate::logs::Links::new(crate::logs::links::dir_from_env())),
        userns: None,
    })
}

/// The node status's view of the volumes in use.
pub(super) struct InUse(pub Arc<crate::volume::Storage>);

impl crate::node::VolumesInUse for InUse {
    fn volumes_in_use(&self) -> Vec<String> {
        self.0.volumes_in_use()
    }
}

impl crate::stats::MeasuredVolumes for InUse {
    fn pod_volumes(&self, pod_uid: &str) -> Vec<crate::stats::VolumeStats> {
        use crate::stats::{FsStats, PvcReference, StatTime, VolumeStats};
        let u = |v: i64| u64::try_from(v).ok();
        self.0
            .pod_volume_stats(pod_uid)
            .into_iter()
            .map(|m| (m.volume, m.claim, m.at_ns, m.stats))
            .map(|(name, claim, at_ns, s)| VolumeStats {
                fs: FsStats {
                    time: StatTime(at_ns),
                    available_bytes: u(s.available_bytes),
                    capacity_bytes: u(s.capacity_bytes),
                    used_bytes: u(s.used_bytes),
                    inodes_free: u(s.inodes_free),
                    inodes: u(s.inodes),
                    inodes_used: u(s.inodes_used),
                },
                name,
                pvc_ref: claim.map(|(namespace, name)| PvcReference { name, namespace }),
            })
            .collect()
    }
}

/// DRA drivers' kubelet plugins (type `DRAPlugin`) to the DRA manager.
struct DraHandler(Arc<crate::devices::DraManager>);

#[async_trait::async_trait]
impl crate::pluginmanager::PluginHandler for DraHandler {
    async fn validate(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), crate::pluginmanager::PluginError> {
        self.0
            .validate_plugin(name, endpoint, versions)
            .map_err(crate::pluginmanager::PluginError::new)
    }
    async fn register(
        &self,
        name: &str,
        endpoint: &str,
        versions: &[String],
    ) -> Result<(), crate::pluginmanager::PluginError> {
        self.0
            .register_plugin(name, endpoint, versions)
            .map_err(crate::pluginmanager::PluginError::new)
    }
    async fn deregister(&self, name: &str) {
        self.0.deregister_plugin(name)
    }
}

/// The plugin manager (CSI and DRA drivers register through `<root-dir>/plugins_registry`) and, in
/// cluster mode, the claim-backed and CSI volumes it serves, whose usage `stats` reports.
fn storage(
    node: &NodeSettings,
    shared: &Shared,
    selinux: crate::volume::SeLinuxVolumes,
    cluster: Option<&Connected>,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) -> Option<Arc<crate::volume::Storage>> {
    use crate::volume::csi;
    let (stats, dra) = (&shared.stats, &shared.dra);
    let drivers = Arc::new(csi::CsiDrivers::default());
    let node_info = cluster.map(|c| {
        Arc::new(csi::KubeNodeInfo::new(
            c.client.clone(),
            node.node_name.clone(),
        )) as Arc<dyn csi::NodeInfoApi>
    });
    let handler = csi::RegistrationHandler::new(
        drivers.clone(),
        Arc::new(|endpoint: &str| {
            Arc::new(csi::GrpcCsiNode::new(endpoint)) as Arc<dyn csi::CsiNode>
        }),
        node_info,
    );
    let mut plugins = crate::pluginmanager::PluginManager::new(crate::pluginmanager::registry_dir(
        &node.root_dir,
    ));
    plugins.add_handler(
        cri_proto::plugins::registration::CSI_PLUGIN,
        Arc::new(handler),
    );
    plugins.add_handler(
        cri_proto::plugins::registration::DRA_PLUGIN,
        Arc::new(DraHandler(dra.clone())),
    );
    tasks.spawn(Arc::new(plugins).run(cancel.clone()));
    let c = cluster?;
    let storage = Arc::new(
        crate::volume::Storage::new(
            Arc::new(crate::volume::KubeStorageApi {
                client: c.client.clone(),
            }),
            csi::CsiMounter {
                root_dir: node.root_dir.clone(),
                node_name: node.node_name.clone(),
                drivers,
                mounted: csi::mounter::is_mounted,
            },
        )
        .with_events(shared.events.clone())
        .with_selinux(selinux),
    );
    let s = storage.clone();
    tasks.spawn(async move {
        let _ = tokio::task::spawn_blocking(move || s.reconstruct()).await;
    });
    let period = stats.volume_stats_agg_period();
    tasks.spawn(storage.clone().run_stats(period, cancel.clone()));
    stats.set_measured_volumes(Arc::new(InUse(storage.clone())));
    Some(storage)
}

/// The static pod source: manifests under `staticPodPath` read into complete sets for the pod
/// pipeline (`sources_tx`); without a `staticPodPath` one empty set, so that the source counts
/// as reported.
pub(super) async fn start_static_pods(
    cfg: &Config,
    standalone: bool,
    sources_tx: mpsc::Sender<SourceUpdate>,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) {
    let Some(dir) = &cfg.static_pod_path else {
        if standalone {
            tracing::warn!("no staticPodPath and no apiserver: this node runs no pods");
        }
        let _ = sources_tx
            .send(SourceUpdate {
                source: Source::File,
                pods: Vec::new(),
            })
            .await;
        return;
    };
    tasks.spawn(crate::pod::run_static_pods(
        dir.clone(),
        cfg.node.node_name.clone(),
        Duration::from_secs(1),
        cfg.file_check_frequency,
        sources_tx,
        cancel.clone(),
    ));
}

/// The pod pipeline: every source's set (`sources_rx`) merged, admitted once with the
/// handlers built here (`shared`: the node shutdown and pressure states, the device manager,
/// the allocations), then to the sync loop (`pods_tx`) and the admitted static pods to the
/// mirror pods (`static_tx`). `cluster`: the Node object and where deleted rejected pods go.
pub(super) fn start_pipeline(
    cfg: &Config,
    shared: &Shared,
    cluster: Option<&super::cluster::Started>,
    (sources_rx, pods_tx, static_tx): (
        mpsc::Receiver<SourceUpdate>,
        mpsc::Sender<SourceUpdate>,
        watch::Sender<Vec<Pod>>,
    ),
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) {
    let mut admission = Admission::new(
        SysctlAllowlist::new(&cfg.allowed_unsafe_sysctls).unwrap_or_default(),
        Some(shared.shutdown.clone()),
        Some(shared.pressure.clone()),
    );
    admission.pod_level_resources = cfg.cm.pod_limits.pod_level_resources;
    admission.devices = Some(shared.devices.clone());
    admission.allocations = Some(shared.allocations.clone());
    admission.events = Some(shared.events.clone());
    let sources: &[Source] = match cluster {
        Some(_) => &[Source::File, Source::Api],
        None => &[Source::File],
    };
    let out = crate::pod::PipelineOutputs {
        statuses: shared.statuses.clone(),
        events: shared.events.clone(),
        static_tx,
        pods_tx,
        terminated_tx: cluster.map(|c| c.terminated_tx.clone()),
    };
    let pipeline = crate::pod::Pipeline::new(
        admission,
        (cfg.node.max_pods, cfg.node.node_name.clone()),
        sources,
        cluster.map(|c| c.node_rx.clone()),
        out,
    );
    tasks.spawn(pipeline.run(sources_rx, cancel.clone()));
}
