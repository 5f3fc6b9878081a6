//! Assembles the kubelet from a validated [`Config`]: [`run`] builds the shared pieces and
//! calls one start function per subsystem (servers, runtime, container manager, pods,
//! cluster mode, eviction, node shutdown, sync loop), all tasks owned by one [`JoinSet`] and
//! stopped by one token.

pub mod cluster;
mod container_manager;
pub mod eviction;
pub mod pod_env;
mod pods;
mod servers;

use crate::config::Config;
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::network::util_chains;
use crate::pleg::{self, PlegHealth};
use crate::pod_worker::Deps;
use crate::podspec::Source;
use crate::runtime::CriRuntime;
use crate::runtime::Runtime;
use crate::server;
use crate::status::StatusManager;
use crate::sync_loop::{SourceUpdate, SyncLoop};
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
    /// The configured serving pair does not load.
    #[error(transparent)]
    ServingFiles(#[from] crate::certs::ServingError),
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
    /// Upstream's validation: cgroup v1 always kills single processes.
    #[error(
        "invalid configuration: singleProcessOOMKill must not be explicitly set to false when using cgroup v1"
    )]
    SingleProcessOomKillOnCgroupV1,
    /// Upstream's kubelet exits when its container manager cannot start.
    #[error("Failed to start ContainerManager: {0}")]
    ContainerManager(#[from] crate::cm::CmError),
    #[error("Failed to start ContainerManager: node cgroup setup panicked: {0}")]
    ContainerManagerPanicked(String),
    /// The runtime's RuntimeConfig failed every try (not Unimplemented: that falls back).
    #[error("failed to get the cgroup driver from the CRI runtime: {0}")]
    RuntimeConfig(crate::runtime::RuntimeError),
    /// Upstream's kubelet exits when its image pull records cannot be set up.
    #[error("{0}")]
    PullRecords(crate::images::pull_records::PulledRecordError),
    /// Upstream's kubelet exits when its credential provider plugins cannot be registered.
    #[error("Failed to register CRI auth plugins: {0}")]
    CredentialProviders(#[from] crate::images::credentials::plugins::ConfigError),
    /// Upstream's kubelet exits when the allocated-resources checkpoint does not verify.
    #[error(transparent)]
    Allocations(#[from] crate::allocation::AllocationError),
    /// Upstream's kubelet exits when the node's ID range or a pod's user namespace record is
    /// unusable.
    #[error("create user namespace manager: {0}")]
    Userns(#[from] crate::userns::UsernsError),
}

/// The handles the subsystems share, built once in [`run`].
pub(crate) struct Shared {
    pub runtime: Arc<dyn Runtime>,
    /// The stats provider's last snapshot (/stats/summary, eviction, volume usage).
    pub stats: Arc<crate::stats::Provider>,
    pub metrics: Metrics,
    pub statuses: Arc<StatusManager>,
    pub pleg_health: Arc<PlegHealth>,
    pub events: Arc<dyn EventRecorder>,
    pub probes: Arc<probes::ProbeManager>,
    /// The device manager: Node capacity and admission of device requests.
    pub devices: Arc<crate::devices::DeviceManager>,
    /// The DRA manager: pods' ResourceClaims prepared by their drivers' plugins.
    pub dra: Arc<crate::devices::DraManager>,
    pub pull_records: Option<Arc<crate::images::PullRecords>>,
    /// The pods' allocated resources (admission decides resizes).
    pub allocations: Arc<crate::allocation::Allocations>,
    pub node_ips: Vec<std::net::IpAddr>,
    /// Set while the node shuts down: NotReady, and new pods rejected.
    pub shutdown: Arc<crate::shutdown::ShutdownState>,
    /// The eviction manager's pressure conditions (node status, admission).
    pub pressure: Arc<crate::eviction::PressureState>,
    /// `--image-credential-provider-config`: the plugins the image pulls run.
    pub credential_providers: Option<Arc<crate::images::credentials::plugins::CredentialProviders>>,
}

/// What cluster mode needs from the rest of the kubelet; `sources`: where the apiserver's pods
/// go (the pod pipeline), the admitted static pods, and the sink that writes recorded events.
fn cluster_parts(
    shared: &Shared,
    sources: (
        mpsc::Sender<SourceUpdate>,
        tokio::sync::watch::Receiver<Vec<k8s_openapi::api::core::v1::Pod>>,
        crate::objects::EventSink,
    ),
    storage: Option<Arc<crate::volume::Storage>>,
) -> cluster::Parts {
    let (sources_tx, static_rx, sink) = sources;
    cluster::Parts {
        devices: shared.devices.clone(),
        node_ips: shared.node_ips.clone(),
        runtime: shared.runtime.clone(),
        pleg: shared.pleg_health.clone(),
        statuses: shared.statuses.clone(),
        sources_tx,
        static_rx,
        events: (shared.events.clone(), sink),
        shutdown: shared.shutdown.clone(),
        pressure: shared.pressure.clone(),
        volumes: storage.map(|s| Arc::new(pods::InUse(s)) as Arc<dyn crate::node::VolumesInUse>),
    }
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

/// `--node-ip`, or the address the kernel would send from.
fn node_ips(cfg: &Config) -> Vec<std::net::IpAddr> {
    if cfg.node.node_ips.is_empty() {
        default_node_ip().into_iter().collect()
    } else {
        cfg.node.node_ips.clone()
    }
}

/// Runs the kubelet until `cancel` fires.
/// Gates whose state changes what pods get, said once at start.
fn log_gates(cfg: &Config) {
    // The gate reaches the pod workers (node settings), eviction and admission in their settings.
    if !cfg.cm.pod_limits.pod_level_resources {
        tracing::info!("feature gate PodLevelResources is off: spec.resources of pods is ignored");
    }
}

/// System OOMs from the kernel log become SystemOOM events on the Node, as upstream.
fn start_oom_watch(
    cfg: &Config,
    events: &Arc<dyn EventRecorder>,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) {
    tasks.spawn(crate::oom::run(
        crate::oom::DevKmsg::open,
        events.clone(),
        cfg.node.node_name.clone(),
        cancel.clone(),
    ));
}

pub async fn run(cfg: Config, cancel: CancellationToken) -> Result<(), AppError> {
    log_gates(&cfg);
    let proxy_cfg = (cfg.proxy_config.as_ref())
        .map(|path| crate::proxy_role::load(path, &cfg.node.node_name))
        .transpose()?;
    let startup = start_notifications(&cfg);
    let Some(cluster) = connect_cluster(&cfg, &startup, &cancel).await? else {
        return Ok(());
    };
    let auth = servers::auth(&cfg, cluster.as_ref())?;
    check_standalone(&cfg, proxy_cfg.as_ref(), cluster.is_none())?;
    let credential_providers = pods::credential_providers(&cfg, cluster.as_ref()).await?;
    let metrics = Metrics::new(&cfg.node.node_name);
    let statuses = Arc::new(StatusManager::new());
    let pleg_health = Arc::new(PlegHealth::default());
    let (state, log_runtime) = servers::state(&cfg, &metrics, &statuses, &pleg_health);
    let mut tasks = JoinSet::new();
    servers::start(&cfg, &state, auth, cluster.as_ref(), &mut tasks, &cancel).await?;

    let runtime = runtime_client(&cfg)?;
    log_runtime.set(runtime.clone());
    state.streaming.set_runtime(runtime.clone());
    let endpoint = &cfg.runtime.container_runtime_endpoint;
    let waiting = |e: Option<&dyn std::fmt::Display>| match e {
        None => startup.status(&format!("waiting for the container runtime at {endpoint}")),
        Some(e) => startup.status(&format!(
            "waiting for the container runtime at {endpoint}: {e}"
        )),
    };
    let Some(runtime_version) = wait_for_runtime(runtime.as_ref(), waiting, &cancel).await else {
        return Ok(());
    };
    let stats = start_stats_and_logs(&cfg, &runtime, &state, &mut tasks, &cancel);
    let cm = container_manager::start(&cfg, runtime.as_ref()).await?;
    let (events, event_sink) = event_recorder(&cfg, cluster.is_some());
    let (probes, probe_rx) = probe_manager(&metrics, &events);
    let shared = Shared {
        devices: container_manager::start_devices(&cfg, &mut tasks, &cancel).await,
        dra: container_manager::start_dra(&cfg, cluster.as_ref(), &cancel).await,
        pull_records: start_pull_records(&cfg, runtime.as_ref()).await?,
        allocations: pods::allocations(&cfg).await?,
        node_ips: node_ips(&cfg),
        shutdown: Arc::default(),
        pressure: Arc::default(),
        runtime,
        stats,
        metrics,
        statuses,
        pleg_health,
        events,
        probes,
        credential_providers,
    };
    start_oom_watch(&cfg, &shared.events, &mut tasks, &cancel);
    let pod_side = pods::start(
        &cfg,
        &shared,
        (runtime_version, cm),
        cluster.as_ref(),
        &mut tasks,
        &cancel,
    );
    let pod_side = pod_side.await?;
    let (pods_tx, pods_rx) = mpsc::channel(8);
    let (sources_tx, sources_rx) = mpsc::channel(8);
    let (static_tx, static_rx) = tokio::sync::watch::channel(Vec::new());
    let standalone = cluster.is_none();
    pods::start_static_pods(&cfg, standalone, sources_tx.clone(), &mut tasks, &cancel).await;
    start_network_and_proxy(
        &cfg,
        cluster.as_ref(),
        proxy_cfg,
        &shared.events,
        &mut tasks,
        &cancel,
    )?;
    let started = match (cluster, event_sink) {
        (Some(conn), Some(sink)) => {
            let parts = cluster_parts(&shared, (sources_tx, static_rx, sink), pod_side.storage);
            Some(cluster::start(&cfg, conn, parts, &mut tasks, &cancel))
        }
        _ => None,
    };
    let pipeline_io = (sources_rx, pods_tx, static_tx);
    pods::start_pipeline(
        &cfg,
        &shared,
        started.as_ref(),
        pipeline_io,
        &mut tasks,
        &cancel,
    );
    let terminated_tx = started.map(|s| s.terminated_tx);
    let inputs = (pods_rx, probe_rx);
    let loop_health = start_sync_loop(
        &cfg,
        &shared,
        pod_side.deps,
        terminated_tx,
        inputs,
        &mut tasks,
        &cancel,
    );
    let (notifier, watchdog) = startup.into_running();
    tasks.spawn(crate::systemd::run(
        notifier,
        watchdog,
        loop_health,
        format!("serving; node {}", cfg.node.node_name),
        cancel.clone(),
    ));

    cancel.cancelled().await;
    stop(&state, tasks, &shared.probes).await;
    Ok(())
}

/// After the token fired: pods keep running, the agent's tasks get 10 s to end.
async fn stop(state: &server::AppState, mut tasks: JoinSet<()>, probes: &probes::ProbeManager) {
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
    probes.shutdown().await;
}

/// Pulled-image credential verification (KubeletEnsureSecretPulledImages): the records
/// under <root-dir>/image_manager, with intents left by the last run resolved.
async fn start_pull_records(
    cfg: &Config,
    runtime: &dyn Runtime,
) -> Result<Option<Arc<crate::images::PullRecords>>, AppError> {
    match cfg.images.image_pulls.verify_policy() {
        Some(policy) => Ok(Some(
            crate::images::start_pull_records(&cfg.root_dir, policy, runtime)
                .await
                .map_err(AppError::PullRecords)?,
        )),
        None => Ok(None),
    }
}

/// Cluster mode writes events to the apiserver (through the returned sink, which cluster
/// mode runs); standalone logs them.
fn event_recorder(
    cfg: &Config,
    cluster_mode: bool,
) -> (Arc<dyn EventRecorder>, Option<crate::objects::EventSink>) {
    if cluster_mode {
        let (recorder, sink) = crate::objects::event_channel(&cfg.node.node_name);
        let sink = sink.with_rate_limit(cfg.event_record_qps, cfg.event_burst);
        (Arc::new(recorder), Some(sink))
    } else {
        (Arc::new(crate::events::LogRecorder), None)
    }
}

/// The probe manager (results come back on the returned channel) reporting to `events`.
fn probe_manager(
    metrics: &Metrics,
    events: &Arc<dyn EventRecorder>,
) -> (
    Arc<probes::ProbeManager>,
    mpsc::Receiver<probes::ProbeUpdate>,
) {
    let prober_metrics =
        probes::ProberMetrics::new(&metrics.probes).expect("prober metrics register once");
    let (probe_manager, probe_rx) =
        probes::ProbeManager::new(probes::ManagerConfig::default(), prober_metrics);
    probe_manager.set_events(Arc::new(crate::probing::ProbeEvents(events.clone())));
    (Arc::new(probe_manager), probe_rx)
}

/// The node network controller (cluster mode, `nodeAgentNetwork`) and the in-process
/// kube-proxy role (`--proxy-config`).
fn start_network_and_proxy(
    cfg: &Config,
    cluster: Option<&cluster::Connected>,
    proxy_cfg: Option<proxy::config::ProxyConfig>,
    events: &Arc<dyn EventRecorder>,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) -> Result<(), AppError> {
    if let (true, Some(c)) = (cfg.network.enabled, cluster) {
        crate::network::start(
            c.client.clone(),
            cfg.node.node_name.clone(),
            cfg.network.clone(),
            events.clone(),
            tasks,
            cancel,
        )?;
    }
    if cfg.make_iptables_util_chains {
        tasks.spawn(util_chains::run(
            util_chains::MONITOR_INTERVAL,
            cancel.clone(),
        ));
    }
    if let Some(proxy_cfg) = proxy_cfg {
        tracing::info!("hosting the kube-proxy role in this process");
        let client = cluster.map(|c| c.client.clone());
        tasks.spawn(crate::proxy_role::run(proxy_cfg, client, cancel.clone()));
    }
    Ok(())
}

/// What standalone mode cannot do: the proxy role's standalone limits, the node network.
fn check_standalone(
    cfg: &Config,
    proxy_cfg: Option<&proxy::config::ProxyConfig>,
    standalone: bool,
) -> Result<(), AppError> {
    if let (Some(p), Some(path), true) = (proxy_cfg, &cfg.proxy_config, standalone) {
        crate::proxy_role::check_standalone(path, p)?;
    }
    if cfg.network.enabled && standalone {
        return Err(AppError::NetworkStandalone);
    }
    Ok(())
}

/// `READY=1` to systemd at once (the agent's waits below are said in `STATUS=` lines).
fn start_notifications(cfg: &Config) -> crate::systemd::Startup {
    let watchdog = node_systemd::watchdog_interval_from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "systemd watchdog disabled");
        None
    });
    let status = format!("starting; node {}", cfg.node.node_name);
    crate::systemd::Startup::begin(node_systemd::Notifier::from_env(), watchdog, &status)
}

/// Cluster mode when there is a kubeconfig, or a bootstrap kubeconfig to get one (TLS
/// bootstrap happens before anything else, as upstream). `Some(None)`: standalone; `None`:
/// cancelled while connecting.
async fn connect_cluster(
    cfg: &Config,
    startup: &crate::systemd::Startup,
    cancel: &CancellationToken,
) -> Result<Option<Option<cluster::Connected>>, AppError> {
    match &cfg.kubeconfig {
        Some(k) if k.exists() || cfg.bootstrap_kubeconfig.is_some() => {
            tracing::info!(node = %cfg.node.node_name, kubeconfig = %k.display(), runtime = %cfg.runtime.container_runtime_endpoint, "starting kubelet in cluster mode");
            match &cfg.bootstrap_kubeconfig {
                Some(b) if !k.exists() => startup.status(&format!(
                    "waiting for TLS bootstrap: a client certificate from the apiserver in {}",
                    b.display()
                )),
                _ => startup.status(&format!("connecting to the apiserver in {}", k.display())),
            }
            Ok(cluster::connect(cfg, cancel).await?.map(Some))
        }
        _ => {
            tracing::info!(node = %cfg.node.node_name, runtime = %cfg.runtime.container_runtime_endpoint, "starting kubelet in standalone mode");
            Ok(Some(None))
        }
    }
}

/// The CRI client (lazy connections; image service on its own endpoint when configured).
fn runtime_client(cfg: &Config) -> Result<Arc<dyn Runtime>, AppError> {
    let runtime_ch = cri_proto::connect_lazy(
        &cfg.runtime.container_runtime_endpoint,
        Duration::from_secs(5),
    )?;
    let image_ch = if cfg.runtime.image_service_endpoint == cfg.runtime.container_runtime_endpoint {
        runtime_ch.clone()
    } else {
        cri_proto::connect_lazy(&cfg.runtime.image_service_endpoint, Duration::from_secs(5))?
    };
    Ok(Arc::new(crate::runtime::Instrumented::new(Arc::new(
        CriRuntime::new(runtime_ch, image_ch, cfg.runtime.runtime_request_timeout),
    ))))
}

/// The runtime's name goes into every containerID, its version says what it can mount: waits
/// until it answers with both (None: cancelled).
/// `waiting` is told when the wait starts and each time the runtime does not answer.
async fn wait_for_runtime(
    runtime: &dyn Runtime,
    waiting: impl Fn(Option<&dyn std::fmt::Display>),
    cancel: &CancellationToken,
) -> Option<(String, String)> {
    waiting(None);
    let version = loop {
        match runtime.version().await {
            Ok(v) => break v,
            Err(e) => {
                waiting(Some(&e));
                tracing::warn!(error = %e, "container runtime not ready; retrying in 2s");
                tokio::select! {
                    _ = cancel.cancelled() => return None,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        }
    };
    tracing::info!(name = %version.runtime_name, version = %version.runtime_version, api = %version.runtime_api_version, "container runtime ready");
    Some((version.runtime_name, version.runtime_version))
}

/// The stats provider refreshes in the background (cAdvisor's housekeeping period);
/// /stats/summary and /metrics/{resource,cadvisor} read its last snapshot. Container log
/// rotation (containerLogMaxSize/-MaxFiles) runs beside it, as upstream's log manager.
fn start_stats_and_logs(
    cfg: &Config,
    runtime: &Arc<dyn Runtime>,
    state: &server::AppState,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) -> Arc<crate::stats::Provider> {
    let stats = Arc::new(crate::stats::Provider::new(
        runtime.clone(),
        Arc::new(crate::stats::LinuxNode),
        crate::stats::ProviderConfig {
            volume_stats_agg_period: cfg.stats.volume_stats_agg_period,
            system: cfg.stats.system_cgroups.clone(),
            ..crate::stats::ProviderConfig::new(
                cfg.node.node_name.clone(),
                cfg.root_dir.clone(),
                cfg.pod_logs_dir.clone(),
            )
        },
    ));
    state.stats.set(stats.clone());
    tasks.spawn(stats.clone().run(cancel.clone()));
    tasks.spawn(
        crate::logs::Manager::new(runtime.clone(), cfg.container_log.clone()).run(cancel.clone()),
    );
    stats
}

/// The sync loop, with the managers that act through its control channel (eviction, image
/// and container GC, node shutdown), the PLEG that wakes it and the systemd notifier watching
/// it; `inputs`: the pod sources' and the probe results' channels.
fn start_sync_loop(
    cfg: &Config,
    p: &Shared,
    deps: Arc<Deps>,
    terminated_tx: Option<mpsc::UnboundedSender<crate::status::Terminated>>,
    inputs: (
        mpsc::Receiver<SourceUpdate>,
        mpsc::Receiver<probes::ProbeUpdate>,
    ),
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) -> Arc<crate::sync_loop::SyncLoopHealth> {
    let (pleg_tx, pleg_rx) = mpsc::channel(8);
    tasks.spawn(pleg::run(
        p.runtime.clone(),
        Duration::from_secs(1),
        cfg.evented_pleg,
        pleg_tx,
        p.pleg_health.clone(),
        p.metrics.clone(),
        cancel.clone(),
    ));
    let sources: &[Source] = if terminated_tx.is_some() {
        &[Source::File, Source::Api]
    } else {
        &[Source::File]
    };
    let log_links = deps.log_links.clone();
    let mut sync_loop = SyncLoop::new(deps, sources, cancel.clone());
    if let Some(tx) = terminated_tx {
        sync_loop.on_terminated(tx);
    }
    if cfg.resource_health_status {
        let updates = p.devices.enable_health_status();
        tasks.spawn(container_manager::forward_health_updates(
            updates,
            sync_loop.control(),
            cancel.clone(),
        ));
    }
    let pods = eviction::SyncLoopPods(sync_loop.control());
    tasks.spawn(container_manager::reconcile_dra(
        p.dra.clone(),
        pods,
        cancel.clone(),
    ));
    let loop_health = sync_loop.health();
    let devices = Some(p.devices.clone());
    let dra = p.dra.clone();
    container_manager::start_pod_resources(cfg, sync_loop.control(), devices, dra, tasks, cancel);
    eviction::spawn(
        cfg,
        p.runtime.clone(),
        p.stats.clone(),
        sync_loop.control(),
        p.events.clone(),
        p.pressure.clone(),
        p.pull_records.clone(),
        log_links,
        tasks,
        cancel,
    );
    let shutdown = (p.events.clone(), p.shutdown.clone());
    start_shutdown_manager(cfg, &sync_loop, shutdown, tasks, cancel);
    tasks.spawn(sync_loop.run(inputs.0, pleg_rx, inputs.1));
    loop_health
}

/// Graceful node shutdown (systemd-logind inhibitor), when `shutdownGracePeriod` is set.
fn start_shutdown_manager(
    cfg: &Config,
    sync_loop: &SyncLoop,
    (events, state): (Arc<dyn EventRecorder>, Arc<crate::shutdown::ShutdownState>),
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) {
    if !cfg.shutdown.enabled() {
        tracing::info!(
            "shutdownGracePeriod is 0: node shutdown will be immediate (no graceful node shutdown)"
        );
        return;
    }
    let (settings, node_name, control) = (
        cfg.shutdown.clone(),
        cfg.node.node_name.clone(),
        sync_loop.control(),
    );
    let cancel = cancel.clone();
    tasks.spawn(async move {
        let dir = std::path::PathBuf::from(crate::shutdown::LOGIND_CONF_DIR);
        let logind = match crate::shutdown::DbusLogind::connect(dir).await {
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
            events,
            node_name,
        };
        crate::shutdown::run(settings, parts, cancel).await;
    });
}
