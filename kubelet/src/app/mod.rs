//! Assembles the kubelet from a validated [`Config`]: runtime connection, servers, pod sources,
//! PLEG and the sync loop, all owned by one [`JoinSet`] and stopped by one token.

pub mod cluster;
pub mod eviction;

use crate::cm::settings::SwapBehavior;
use crate::cm::{CgroupNamer, CgroupVersion, Cgroups, CmConfig, ContainerManager, FsCgroups};
use crate::config::Config;
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::pleg::{self, PlegHealth};
use crate::pod_worker::Env;
use crate::podspec::Source;
use crate::runtime::Runtime;
use crate::runtime::cri::CriRuntime;
use crate::server::{self, AppState};
use crate::spec::{self, NodeSettings};
use crate::status::manager::StatusManager;
use crate::sync_loop::{SourceUpdate, SyncLoop};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Why the kubelet could not start.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("container runtime endpoint: {0}")]
    Runtime(#[from] cri_proto::Error),
    #[error(transparent)]
    Server(#[from] server::ServerError),
    #[error("cluster mode: {0}")]
    Cluster(#[from] crate::app::cluster::ClusterError),
    #[error(transparent)]
    ProxyRole(#[from] crate::proxy_role::ProxyRoleError),
    #[error(
        "serverTLSBootstrap: true needs cluster mode (--kubeconfig): the serving certificate is requested from the apiserver"
    )]
    ServerTlsBootstrapStandalone,
    #[error(
        "nodeAgentNetwork (--node-agent-cni) needs cluster mode (--kubeconfig): the pod CIDRs come from the Node objects"
    )]
    NetworkStandalone,
    #[error("node network: {0}")]
    Network(#[from] crate::network::NetworkError),
    #[error(
        "memorySwap.swapBehavior: LimitedSwap needs cgroup v2; this node uses cgroup v1 (use NoSwap or a cgroup v2 host)"
    )]
    LimitedSwapOnCgroupV1,
    /// Upstream's kubelet exits when its container manager cannot start.
    #[error("Failed to start ContainerManager: {0}")]
    ContainerManager(#[from] crate::cm::CmError),
    #[error("Failed to start ContainerManager: node cgroup setup panicked: {0}")]
    ContainerManagerPanicked(String),
    /// Upstream's kubelet exits when its image pull records cannot be set up.
    #[error("{0}")]
    PullRecords(String),
}

/// The node's first non-loopback IPv4 address as the kernel would pick for an outgoing route,
/// used when `--node-ip` is not given.
fn default_node_ip() -> Option<std::net::IpAddr> {
    // A UDP "connect" picks a source address without sending anything.
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    sock.connect("192.0.2.1:9").ok()?;
    sock.local_addr()
        .ok()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_loopback())
}

/// The container manager over the node's cgroup filesystem: `kubepods` and its QoS tiers
/// with their limits (node allocatable when enforced). A controller the node lacks is one
/// warning and its limits are skipped; a cgroup that cannot be created or limited stops the
/// start, as upstream's "Failed to start ContainerManager"; LimitedSwap on cgroup v1 is
/// refused.
async fn start_container_manager(cfg: &Config) -> Result<Arc<ContainerManager>, AppError> {
    let fs = FsCgroups::discover();
    let version = fs.version();
    if version == CgroupVersion::V1 && cfg.pod_limits.swap_behavior == SwapBehavior::LimitedSwap {
        return Err(AppError::LimitedSwapOnCgroupV1);
    }
    let missing = fs.missing(&crate::cm::LIMITED_CONTROLLERS);
    if !missing.is_empty() {
        tracing::warn!(
            ?version,
            "cgroup controllers {missing:?} are not available on this node: their limits are not written"
        );
    }
    let fs: Arc<dyn Cgroups> = Arc::new(fs);
    let inner: Arc<dyn Cgroups> = match cfg.cgroup_driver {
        crate::cm::settings::CgroupDriver::Cgroupfs => fs,
        crate::cm::settings::CgroupDriver::Systemd => {
            use crate::cm::systemd::{DbusUnits, NoSystemd, SystemdUnits};
            let units: Arc<dyn SystemdUnits> = if std::path::Path::new("/run/systemd/system")
                .exists()
            {
                match DbusUnits::connect().await {
                    Ok(u) => Arc::new(u),
                    Err(e) => {
                        tracing::error!(error = %e, "cgroupDriver systemd: cannot reach systemd over D-Bus");
                        Arc::new(NoSystemd)
                    }
                }
            } else {
                // Every call fails with SystemdError::NotRunning: the node setup below
                // reports it and the start stops, as upstream's.
                Arc::new(NoSystemd)
            };
            Arc::new(crate::cm::systemd::SystemdCgroups::new(units, fs))
        }
    };
    let cgroups: Arc<dyn Cgroups> = Arc::new(crate::cm::metrics::InstrumentedCgroups::new(inner));
    let hugepages = crate::host::hugepages();
    let cm = Arc::new(ContainerManager::new(
        cgroups,
        CmConfig {
            namer: CgroupNamer {
                driver: cfg.cgroup_driver,
                root: cfg.cgroup_root.clone(),
                per_qos: cfg.cgroups_per_qos,
            },
            pod_limits: cfg.pod_limits.clone(),
            resources: cfg.resources.clone(),
            hugepage_sizes: hugepages.keys().copied().collect(),
        },
    ));
    let capacity = crate::cm::limits::NodeCapacity {
        cpu_millis: std::thread::available_parallelism()
            .map(|n| n.get() as i64 * 1000)
            .unwrap_or(1000),
        memory_bytes: crate::host::memory_capacity(),
        pids: crate::host::pid_capacity(),
        hugepages,
    };
    let setup = cm.clone();
    match tokio::task::spawn_blocking(move || setup.setup_node(&capacity)).await {
        Ok(Ok(())) => Ok(cm),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(AppError::ContainerManagerPanicked(e.to_string())),
    }
}

/// Runs the kubelet until `cancel` fires.
pub async fn run(cfg: Config, cancel: CancellationToken) -> Result<(), AppError> {
    // QoS classes (pod status, eviction, admission) follow the configured gate.
    crate::podspec::resources::set_enabled(cfg.pod_limits.pod_level_resources);
    if !cfg.pod_limits.pod_level_resources {
        tracing::info!("feature gate PodLevelResources is off: spec.resources of pods is ignored");
    }
    let proxy_cfg = match &cfg.proxy_config {
        Some(path) => Some(crate::proxy_role::load(path, &cfg.node_name)?),
        None => None,
    };
    // Cluster mode when there is a kubeconfig, or a bootstrap kubeconfig to get one (TLS bootstrap
    // happens before anything else, as upstream).
    let cluster = match &cfg.kubeconfig {
        Some(k) if k.exists() || cfg.bootstrap_kubeconfig.is_some() => {
            tracing::info!(node = %cfg.node_name, kubeconfig = %k.display(), runtime = %cfg.container_runtime_endpoint, "starting kubelet in cluster mode");
            match crate::app::cluster::connect(&cfg, &cancel).await? {
                Some(c) => Some(c),
                None => return Ok(()),
            }
        }
        _ => {
            tracing::info!(node = %cfg.node_name, runtime = %cfg.container_runtime_endpoint, "starting kubelet in standalone mode");
            None
        }
    };
    // :10250 authentication/authorization (upstream's BuildAuth: webhook modes need a client).
    let review = cluster.as_ref().map(|c| {
        Arc::new(crate::server::auth_review::ApiReview::new(c.client.clone()))
            as Arc<dyn crate::server::auth_review::AuthReview>
    });
    let auth = Arc::new(
        server::Auth::new(cfg.auth.clone(), &cfg.node_name, review)
            .map_err(server::ServerError::from)?,
    );
    if let (Some(p), Some(path), None) = (&proxy_cfg, &cfg.proxy_config, &cluster) {
        crate::proxy_role::check_standalone(path, p)?;
    }
    if cfg.network.enabled && cluster.is_none() {
        return Err(AppError::NetworkStandalone);
    }
    let metrics = Metrics::new(&cfg.node_name);
    let statuses = Arc::new(StatusManager::new());
    let pleg_health = Arc::new(PlegHealth::default());
    let configz = Arc::new(serde_json::to_value(&cfg).unwrap_or_default());
    let log_runtime = Arc::new(server::logs::RuntimeLookup::default());
    let state = AppState {
        statuses: statuses.clone(),
        pleg: pleg_health.clone(),
        metrics: metrics.clone(),
        configz,
        logs: Arc::new(server::logs::Logs {
            pod_logs_dir: cfg.pod_logs_dir.clone(),
            node_log_dir: cfg.enable_system_log_handler.then(|| "/var/log".into()),
            containers: log_runtime.clone(),
        }),
        stats: crate::stats::Handle::default(),
        runtime: log_runtime.clone(),
        streaming: Arc::new(server::streaming::Streaming::new(
            cfg.streaming_connection_idle_timeout,
        )),
    };
    for c in server::streaming::collectors() {
        if let Err(e) = metrics.registry.register(c) {
            tracing::warn!(error = %e, "streaming metrics are not exposed");
        }
    }
    let mut tasks = JoinSet::new();
    // Before any listener: each connection is a descriptor (upstream's rlimit.SetNumFiles).
    server::fd_limit::apply_logged(cfg.max_open_files);

    // Servers first, so kubeadm's health check and operators can reach the agent at once.
    if cfg.healthz_port != 0 {
        let l = server::bind(SocketAddr::new(cfg.healthz_bind_address, cfg.healthz_port)).await?;
        tracing::info!(addr = %l.local_addr().map(|a| a.to_string()).unwrap_or_default(), "healthz server listening");
        tasks.spawn(server::serve_http(
            l,
            server::healthz_router(state.clone()),
            server::listener::ServerType::Healthz,
            cfg.server.limits(server::listener::ServerType::Healthz),
            cancel.clone(),
        ));
    }
    if cfg.read_only_port != 0 {
        let l = server::bind(SocketAddr::new(cfg.address, cfg.read_only_port)).await?;
        tracing::warn!(addr = %l.local_addr().map(|a| a.to_string()).unwrap_or_default(), "read-only port listening (plain HTTP, no authentication): pods, stats and metrics are readable by anyone who reaches it");
        tasks.spawn(server::serve_http(
            l,
            server::read_only_router(state.clone()),
            server::listener::ServerType::ReadOnly,
            cfg.server.limits(server::listener::ServerType::ReadOnly),
            cancel.clone(),
        ));
    }
    if cfg.enable_server {
        let policy = server::tls_policy(cfg.tls_min_version.as_deref(), &cfg.tls_cipher_suites)
            .map_err(server::ServerError::TlsPolicy)?;
        let tls = match (cfg.server_tls_bootstrap, &cluster) {
            (true, Some(conn)) => {
                if cfg.tls_cert_file.is_some() {
                    tracing::warn!(
                        "serverTLSBootstrap is true: tlsCertFile/tlsPrivateKeyFile are not served; the certificate comes from a kubernetes.io/kubelet-serving CSR"
                    );
                }
                let resolver = Arc::new(crate::certs::ServingCertResolver::new());
                let ips = if cfg.node_ips.is_empty() {
                    default_node_ip().into_iter().collect()
                } else {
                    cfg.node_ips.clone()
                };
                let manager = crate::certs::ServingManager {
                    settings: crate::certs::ServingSettings {
                        node_name: cfg.node_name.clone(),
                        hostnames: vec![cfg.node_name.clone()],
                        ips,
                        cert_dir: cfg.cert_dir.clone(),
                    },
                    client: conn.client.clone(),
                    resolver: resolver.clone(),
                };
                tasks.spawn(manager.run(cancel.clone()));
                server::serving_tls_resolver(&policy, resolver, cfg.auth.client_ca_file.is_some())?
            }
            (true, None) => return Err(AppError::ServerTlsBootstrapStandalone),
            (false, _) => server::serving_tls(
                &policy,
                cfg.tls_cert_file.as_deref(),
                cfg.tls_private_key_file.as_deref(),
                &cfg.cert_dir,
                &cfg.node_name,
                &cfg.node_ips,
                cfg.auth.client_ca_file.is_some(),
            )?,
        };
        let l = server::bind(SocketAddr::new(cfg.address, cfg.port)).await?;
        tracing::info!(addr = %l.local_addr().map(|a| a.to_string()).unwrap_or_default(), "kubelet API server listening (HTTPS)");
        if auth.settings().anonymous && auth.settings().mode == server::AuthzMode::AlwaysAllow {
            tracing::warn!(
                "{}: anyone who reaches this port can use it",
                auth.describe()
            );
        } else {
            tracing::info!("{}", auth.describe());
        }
        // Upstream notices a changed client CA file through fsnotify plus a 1 min resync; a
        // 5 s poll of one small file is as prompt in practice.
        tasks.spawn(
            auth.clone()
                .watch_client_ca(Duration::from_secs(5), cancel.clone()),
        );
        tasks.spawn(server::serve_https(
            l,
            tls,
            auth.clone(),
            server::api_router(state.clone(), cfg.enable_debugging_handlers),
            cfg.server.limits(server::listener::ServerType::ReadWrite),
            cancel.clone(),
        ));
    } else {
        tracing::info!("enableServer is false: the kubelet API (:10250) is not served");
    }

    let runtime_ch =
        cri_proto::connect_lazy(&cfg.container_runtime_endpoint, Duration::from_secs(5))?;
    let image_ch = if cfg.image_service_endpoint == cfg.container_runtime_endpoint {
        runtime_ch.clone()
    } else {
        cri_proto::connect_lazy(&cfg.image_service_endpoint, Duration::from_secs(5))?
    };
    let runtime: Arc<dyn Runtime> =
        Arc::new(crate::runtime::instrumented::Instrumented::new(Arc::new(
            CriRuntime::new(runtime_ch, image_ch, cfg.runtime_request_timeout),
        )));
    log_runtime.set(runtime.clone());
    state.streaming.set_runtime(runtime.clone());
    // The runtime's name goes into every containerID; wait until it answers.
    let version = loop {
        match runtime.version().await {
            Ok(v) => break v,
            Err(e) => {
                tracing::warn!(error = %e, "container runtime not ready; retrying in 2s");
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        }
    };
    tracing::info!(name = %version.runtime_name, version = %version.runtime_version, api = %version.runtime_api_version, "container runtime ready");
    // The stats provider refreshes in the background (cAdvisor's housekeeping period);
    // /stats/summary and /metrics/{resource,cadvisor} read its last snapshot.
    let stats = Arc::new(crate::stats::Provider::new(
        runtime.clone(),
        Arc::new(crate::stats::node::LinuxNode),
        crate::stats::ProviderConfig::new(
            cfg.node_name.clone(),
            cfg.root_dir.clone(),
            cfg.pod_logs_dir.clone(),
        ),
    ));
    state.stats.set(stats.clone());
    tasks.spawn(stats.clone().run(cancel.clone()));
    // Container log rotation (containerLogMaxSize/-MaxFiles), as upstream's log manager.
    tasks.spawn(
        crate::logs::Manager::new(runtime.clone(), cfg.container_log.clone()).run(cancel.clone()),
    );

    let cm = start_container_manager(&cfg).await?;
    // Pulled-image credential verification (KubeletEnsureSecretPulledImages): the records
    // under <root-dir>/image_manager, with intents left by the last run resolved.
    let pull_records = match cfg.image_pulls.verify_policy() {
        Some(policy) => Some(
            crate::images::pull_records::start(&cfg.root_dir, policy, runtime.as_ref())
                .await
                .map_err(AppError::PullRecords)?,
        ),
        None => None,
    };
    let host_dns = cfg
        .resolv_conf
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|t| spec::parse_resolv_conf(&t))
        .unwrap_or_default();
    let node_ips = if cfg.node_ips.is_empty() {
        default_node_ip().into_iter().collect()
    } else {
        cfg.node_ips.clone()
    };
    let prober_metrics =
        probes::ProberMetrics::new(&metrics.probes).expect("prober metrics register once");
    let (probe_manager, probe_rx) =
        probes::ProbeManager::new(probes::ManagerConfig::default(), prober_metrics);
    let probe_manager = Arc::new(probe_manager);
    // Cluster mode writes events to the apiserver; standalone logs them.
    let (events, event_sink): (Arc<dyn EventRecorder>, _) = if cluster.is_some() {
        let (recorder, sink) = crate::objects::events::channel(&cfg.node_name);
        (Arc::new(recorder), Some(sink))
    } else {
        (Arc::new(crate::events::LogRecorder), None)
    };
    probe_manager.set_events(Arc::new(crate::probing::ProbeEvents(events.clone())));
    // System OOMs from the kernel log become SystemOOM events on the Node, as upstream.
    tasks.spawn(crate::oom::run(
        crate::oom::DevKmsg::open,
        events.clone(),
        cfg.node_name.clone(),
        cancel.clone(),
    ));
    let shutdown_events = events.clone();
    let shutdown_state = Arc::new(crate::shutdown::ShutdownState::default());
    let pressure = Arc::new(crate::eviction::PressureState::default());
    // The Node's allocatable, computed as for its status (host facts are blocking reads):
    // a downward API `limits.*` of a container without that limit reads it, as upstream's.
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
        crate::cm::allocatable::resource_lists(&host_info, cfg.max_pods, &cfg.resources);
    let node = NodeSettings {
        node_name: cfg.node_name.clone(),
        host_ips: node_ips.iter().map(|i| i.to_string()).collect(),
        cluster_dns: cfg.cluster_dns.iter().map(|i| i.to_string()).collect(),
        cluster_domain: cfg.cluster_domain.clone(),
        host_dns,
        pod_logs_dir: cfg.pod_logs_dir.clone(),
        root_dir: cfg.root_dir.clone(),
        memory_capacity: crate::host::memory_capacity(),
        seccomp_default: cfg.seccomp_default,
        pod_limits: cfg.pod_limits.clone(),
        hugepage_sizes: crate::host::hugepage_sizes(),
        cgroup_v2: cm.version() == crate::cm::CgroupVersion::V2,
        swap_capacity: crate::host::swap_capacity(),
        allocatable,
    };
    // ConfigMaps, Secrets and tokens come from the apiserver; standalone pods cannot use them.
    let api_objects = cluster.as_ref().map(|c| {
        Arc::new(crate::objects::apiserver::ClusterObjects::new(
            c.client.clone(),
        )) as Arc<dyn crate::objects::ApiObjects>
    });
    let binder: Arc<dyn crate::volume::subpath::Binder> =
        Arc::new(crate::volume::subpath::KernelBinder);
    let volumes = Arc::new(crate::volume::VolumeManager::new(
        node.clone(),
        Arc::new(crate::objects::ObjectCache::new(api_objects.clone())),
        Arc::new(crate::objects::token::TokenManager::new(api_objects)),
        binder.clone(),
    ));
    tasks.spawn(volumes.clone().run(cancel.clone()));
    // Services (service-link variables) and RuntimeClasses come from informers in cluster
    // mode; standalone pods get no service variables and cannot name a RuntimeClass.
    let (services, runtime_classes) = match &cluster {
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
    let env = Arc::new(Env {
        events: events.clone(),
        probes: probe_manager.clone(),
        exec: Arc::new(crate::probing::CriExec(runtime.clone())),
        pod_start_duration: Some(metrics.pod_start_duration.clone()),
        runtime: runtime.clone(),
        cm,
        node,
        runtime_name: version.runtime_name.clone(),
        statuses: statuses.clone(),
        pull_lock: tokio::sync::Mutex::new(()),
        resync: cfg.sync_frequency,
        binder,
        volumes,
        services,
        runtime_classes,
        pull_records: pull_records.clone(),
    });

    let (pods_tx, pods_rx) = mpsc::channel(8);
    // The current static pods, for mirror pods in cluster mode.
    let (static_tx, static_rx) = tokio::sync::watch::channel(Vec::new());
    let api_pods_tx = pods_tx.clone();
    match &cfg.static_pod_path {
        Some(dir) => {
            let (file_tx, mut file_rx) = mpsc::channel(4);
            tasks.spawn(crate::pod::static_pods::run(
                dir.clone(),
                cfg.node_name.clone(),
                Duration::from_secs(1),
                cfg.file_check_frequency,
                file_tx,
                cancel.clone(),
            ));
            let sysctls =
                crate::pod::admission::sysctl::Allowlist::new(&cfg.allowed_unsafe_sysctls)
                    .unwrap_or_default();
            let statuses = statuses.clone();
            tasks.spawn(async move {
                let mut rejected = std::collections::HashSet::new();
                while let Some(pods) = file_rx.recv().await {
                    // Static pods with forbidden sysctls fail as upstream's admission fails them.
                    let (pods, refused) = crate::pod::admission::sysctl::partition(&sysctls, pods);
                    let now: std::collections::HashSet<String> = refused
                        .iter()
                        .filter_map(|(p, _, _)| p.metadata.uid.clone())
                        .collect();
                    for (p, reason, message) in refused {
                        if !rejected.contains(p.metadata.uid.as_deref().unwrap_or("")) {
                            tracing::warn!(pod = %crate::podspec::full_name(&p), %reason, %message, "static pod rejected at admission");
                        }
                        let r = crate::pod::admission::Rejection { reason, message };
                        statuses.set(&p, crate::pod::admission::rejected_status(&r));
                    }
                    for gone in rejected.difference(&now) {
                        statuses.remove(gone);
                    }
                    rejected = now;
                    static_tx.send_replace(pods.clone());
                    if pods_tx
                        .send(SourceUpdate {
                            source: Source::File,
                            pods,
                        })
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
        None => {
            if cluster.is_none() {
                tracing::warn!("no staticPodPath and no apiserver: this node runs no pods");
            }
            let _ = pods_tx
                .send(SourceUpdate {
                    source: Source::File,
                    pods: Vec::new(),
                })
                .await;
        }
    }
    if let (true, Some(c)) = (cfg.network.enabled, &cluster) {
        crate::network::start(
            c.client.clone(),
            cfg.node_name.clone(),
            cfg.network.clone(),
            events.clone(),
            &mut tasks,
            &cancel,
        )?;
    }
    if let Some(proxy_cfg) = proxy_cfg {
        tracing::info!("hosting the kube-proxy role in this process");
        let client = cluster.as_ref().map(|c| c.client.clone());
        tasks.spawn(crate::proxy_role::run(proxy_cfg, client, cancel.clone()));
    }
    let mut terminated_tx = None;
    if let (Some(conn), Some(sink)) = (cluster, event_sink) {
        let started = crate::app::cluster::start(
            &cfg,
            conn,
            crate::app::cluster::Parts {
                node_ips: node_ips.clone(),
                runtime: runtime.clone(),
                pleg: pleg_health.clone(),
                statuses: statuses.clone(),
                pods_tx: api_pods_tx,
                static_rx,
                events: (events, sink),
                shutdown: shutdown_state.clone(),
                pressure: pressure.clone(),
            },
            &mut tasks,
            &cancel,
        );
        terminated_tx = Some(started.terminated_tx);
    }
    let (pleg_tx, pleg_rx) = mpsc::channel(8);
    tasks.spawn(pleg::run(
        runtime.clone(),
        Duration::from_secs(1),
        pleg_tx,
        pleg_health,
        metrics,
        cancel.clone(),
    ));
    let sources: &[Source] = if terminated_tx.is_some() {
        &[Source::File, Source::Api]
    } else {
        &[Source::File]
    };
    let mut sync_loop = SyncLoop::new(env, sources, cancel.clone());
    if let Some(tx) = terminated_tx {
        sync_loop.on_terminated(tx);
    }
    let loop_health = sync_loop.health();
    // Eviction manager, image GC and container GC.
    eviction::spawn(
        &cfg,
        runtime.clone(),
        stats.clone(),
        sync_loop.control(),
        shutdown_events.clone(),
        pressure.clone(),
        pull_records,
        &mut tasks,
        &cancel,
    );
    if cfg.shutdown.enabled() {
        let parts_events = shutdown_events.clone();
        let (settings, node_name, control) = (
            cfg.shutdown.clone(),
            cfg.node_name.clone(),
            sync_loop.control(),
        );
        let state = shutdown_state.clone();
        let cancel = cancel.clone();
        tasks.spawn(async move {
            let dir = std::path::PathBuf::from(crate::shutdown::logind::LOGIND_CONF_DIR);
            let logind = match crate::shutdown::logind::DbusLogind::connect(dir).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "Failed to start node shutdown manager: no systemd-logind to talk to; pods will not be stopped gracefully when the node shuts down");
                    return;
                }
            };
            let parts = crate::shutdown::Parts {
                logind: Arc::new(logind),
                pods: Arc::new(control),
                state,
                events: parts_events,
                node_name,
            };
            crate::shutdown::run(settings, parts, cancel).await;
        });
    } else {
        tracing::info!(
            "shutdownGracePeriod is 0: node shutdown will be immediate (no graceful node shutdown)"
        );
    }
    tasks.spawn(sync_loop.run(pods_rx, pleg_rx, probe_rx));
    let watchdog = node_systemd::watchdog_interval_from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "systemd watchdog disabled");
        None
    });
    tasks.spawn(crate::systemd::run(
        node_systemd::Notifier::from_env(),
        watchdog,
        loop_health,
        format!("serving; node {}", cfg.node_name),
        cancel.clone(),
    ));

    cancel.cancelled().await;
    tracing::info!("shutting down: pods keep running");
    // Open exec/attach/port-forward connections end with the agent.
    state.streaming.shutdown(Duration::from_secs(2)).await;
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        tracing::warn!("tasks did not stop within 10s; exiting anyway");
    }
    probe_manager.shutdown().await;
    Ok(())
}
