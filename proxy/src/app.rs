//! Assembles the proxy role from a validated [`ProxyConfig`]: backend detection, proxier,
//! sync loop, health/metrics servers and the Service source (the apiserver watch, or
//! `--static-services-dir`). Used by the `kube-proxy` binary; [`run_with_client`] lets another
//! process (the kubelet) host the proxy role with its own apiserver client.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use prometheus::Registry;
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::{ProxyConfig, ProxyMode};
use crate::ctnetlink::NodeConntrack;
use crate::health::{self, ProxierHealth, ServiceHealthServer};
use crate::iptables::{
    self, ExecRunner, Gated, IptablesBackend, IptablesRunner, TableName, XtablesGate, cleanup,
};
use crate::ipvs::{self, ExecIpset, IpvsBackend, IpvsKernel, NetlinkIpvs};
use crate::metrics::Metrics;
use crate::model::{IpFamily, ServiceState};
use crate::nftables::{self, ExecNft, NftBackend};
use crate::nodeport::NodePortAddresses;
use crate::proxier::{Backend, Proxier};
use crate::render_config::RenderConfig;
use crate::sync_loop::{self, SyncConfig};
use crate::sysctl::{self, NodeSysctl, Sysctl};
use crate::tracker::{ProxyHandle, ProxyHandles};
use crate::{apiserver, source};

#[derive(Debug, Error)]
pub enum Error {
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error(transparent)]
    Health(#[from] health::Error),
    #[error("iptables: {0}")]
    Iptables(#[from] iptables::Error),
    #[error(transparent)]
    Client(#[from] apiserver::Error),
    #[error("nftables mode cannot run here: {0}")]
    NftUnsupported(#[from] nftables::Unsupported),
    #[error(transparent)]
    IpvsUnsupported(#[from] ipvs::Unsupported),
    #[error("cleanup failed: {0}")]
    Cleanup(String),
    #[error(
        "no Service source: give --kubeconfig (or clientConnection.kubeconfig, or --master) to watch the apiserver, or --static-services-dir to read Services and EndpointSlices from files (in a pod, KUBERNETES_SERVICE_HOST/PORT select the in-cluster configuration)"
    )]
    NoSource,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How often `--static-services-dir` is re-read.
pub const STATIC_DIR_INTERVAL: Duration = Duration::from_secs(2);

/// Where commands run: empty in production; `ip netns exec NS` in tests.
#[derive(Clone, Debug, Default)]
pub struct Environment {
    pub command_prefix: Vec<String>,
}

async fn runner_for(cfg: &ProxyConfig, env: &Environment) -> (ExecRunner, bool) {
    let family = cfg.primary_family();
    let decision = {
        // Saves only (no lock file needed), but not beside another role's restore.
        let _turn = XtablesGate::process().enter(false).await;
        iptables::detect_variant(family, env.command_prefix.clone()).await
    };
    info!(backend = ?decision.variant, reason = decision.reason, "iptables backend");
    let runner = ExecRunner::new(family)
        .with_variant(decision.variant)
        .with_prefix(env.command_prefix.clone());
    match Gated::new(runner.clone(), XtablesGate::process())
        .version()
        .await
    {
        Ok(v) => {
            let random_fully = v.has_random_fully();
            (runner.with_version(&v), random_fully)
        }
        Err(e) => {
            warn!(error = %e, "cannot read iptables version; assuming a recent one");
            (runner, true)
        }
    }
}

/// `--cleanup`: removes the rules of every mode (iptables chains and nftables tables, both
/// IP families) and exits. Fails only when no mode could be cleaned.
pub async fn cleanup(cfg: &ProxyConfig, env: &Environment) -> Result<()> {
    // The IPVS mode's sets can go only once no rule matches on them: chains first.
    let ipt = cleanup_iptables(cfg, env).await;
    let nft = cleanup_nftables(env).await;
    cleanup_ipvs(env).await;
    match (ipt, nft) {
        (Err(a), Err(b)) => Err(Error::Cleanup(format!("iptables: {a}; nftables: {b}"))),
        (a, b) => {
            info!(
                iptables_tables = a.unwrap_or(0),
                nftables_families = b.unwrap_or(0),
                "cleanup done"
            );
            Ok(())
        }
    }
}

/// Removes the iptables mode's chains (both families); logs and returns the error when
/// there is no working iptables.
async fn cleanup_iptables(cfg: &ProxyConfig, env: &Environment) -> Result<usize, String> {
    let (runner, _) = runner_for(cfg, env).await;
    let other = gated(runner.for_family(runner.family().other()));
    let runner = gated(runner);
    let r = async {
        let n = cleanup::cleanup(&runner).await?;
        let m = if family_present(&other).await {
            cleanup::cleanup(&other).await?
        } else {
            0
        };
        Ok::<_, iptables::Error>(n + m)
    }
    .await;
    r.map_err(|e| {
        warn!(error = %e, "iptables rules not cleaned up");
        e.to_string()
    })
}

/// Removes the nftables mode's tables (both families); logs and returns the error when
/// there is no working nft.
async fn cleanup_nftables(env: &Environment) -> Result<usize, String> {
    let runner = ExecNft::new().with_prefix(env.command_prefix.clone());
    nftables::cleanup::cleanup(&runner).await.map_err(|e| {
        warn!(error = %e, "nftables rules not cleaned up");
        e.to_string()
    })
}

/// Removes the IPVS mode's virtual servers, `kube-ipvs0` and ipsets (after the iptables
/// chains that match on the sets). Netlink reaches only this process's namespace, so
/// nothing is done through a command prefix.
async fn cleanup_ipvs(env: &Environment) {
    if !env.command_prefix.is_empty() {
        debug!("IPVS leftovers not checked: commands run in another namespace");
        return;
    }
    let ipset = ExecIpset::new();
    ipvs::cleanup(&NetlinkIpvs::new(), &ipset).await;
}

/// Whether the nat table holds the iptables mode's per-service chains.
async fn iptables_mode_leftovers(cfg: &ProxyConfig, env: &Environment) -> bool {
    let (runner, _) = runner_for(cfg, env).await;
    match gated(runner).save(TableName::Nat).await {
        Ok(dump) => dump.lines().any(|l| {
            ["KUBE-SVC-", "KUBE-SEP-", "KUBE-NODEPORTS", "KUBE-EXT-"]
                .iter()
                .any(|p| l.starts_with(&format!(":{p}")))
        }),
        Err(_) => false,
    }
}

/// Where Services and EndpointSlices come from.
#[derive(Clone)]
pub enum Source {
    /// List+watch the apiserver with this client.
    Apiserver(kube::Client),
    /// `--static-services-dir`.
    StaticDir(PathBuf),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Apiserver(_) => f.write_str("Apiserver"),
            Source::StaticDir(d) => f.debug_tuple("StaticDir").field(d).finish(),
        }
    }
}

/// Whether this process runs in a pod (`KUBERNETES_SERVICE_HOST` and `_PORT` set), where
/// the in-cluster configuration applies.
pub fn in_cluster_env() -> bool {
    ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"]
        .iter()
        .all(|v| std::env::var(v).is_ok_and(|s| !s.is_empty()))
}

/// The apiserver client settings, when the configuration asks for the apiserver
/// (`--kubeconfig` / `clientConnection.kubeconfig`, or `--master`), or, with neither and no
/// `--static-services-dir`, when running in a pod (`in_cluster`: upstream's fallback to the
/// in-cluster configuration, as kubeadm's kube-proxy DaemonSet relies on).
pub fn client_options(cfg: &ProxyConfig, in_cluster: bool) -> Option<apiserver::ClientOptions> {
    let master = cfg.master.clone().filter(|m| !m.trim().is_empty());
    if cfg.kubeconfig.is_none()
        && master.is_none()
        && (cfg.static_services_dir.is_some() || !in_cluster)
    {
        return None;
    }
    Some(apiserver::ClientOptions {
        kubeconfig: cfg.kubeconfig.clone(),
        master,
        qps: cfg.qps,
        burst: cfg.burst,
    })
}

/// Runs the proxy until `shutdown`, with the apiserver as the source when a kubeconfig (or
/// `--master`) is configured, else `--static-services-dir`; [`Error::NoSource`] for neither.
pub async fn run(cfg: ProxyConfig, env: Environment, shutdown: CancellationToken) -> Result<()> {
    let source = match (
        client_options(&cfg, in_cluster_env()),
        cfg.static_services_dir.clone(),
    ) {
        (Some(opts), dir) => {
            if let Some(dir) = dir {
                info!(
                    static_services_dir = %dir.display(),
                    "both an apiserver and --static-services-dir are configured; using the apiserver"
                );
            }
            let server = match (&opts.master, &opts.kubeconfig) {
                (Some(m), _) => Some(m.clone()),
                (None, Some(k)) => apiserver::kubeconfig_server(k),
                (None, None) => Some("in-cluster".into()),
            };
            info!(
                kubeconfig = ?opts.kubeconfig,
                server = server.as_deref().unwrap_or("?"),
                qps = opts.qps,
                burst = opts.burst,
                "Service source: apiserver"
            );
            Source::Apiserver(apiserver::build_client(&opts).await?)
        }
        (None, Some(dir)) => Source::StaticDir(dir),
        (None, None) => return Err(Error::NoSource),
    };
    run_source(cfg, env, source, shutdown).await
}

/// Runs the proxy role with an apiserver client owned by the caller (e.g. the kubelet hosting
/// the proxy in its own process); `cfg.kubeconfig`, `master` and `static_services_dir` are
/// ignored.
pub async fn run_with_client(
    cfg: ProxyConfig,
    env: Environment,
    client: kube::Client,
    shutdown: CancellationToken,
) -> Result<()> {
    run_source(cfg, env, Source::Apiserver(client), shutdown).await
}

/// Every iptables command of this process takes its turn at one gate, which also holds the
/// node's xtables lock where the binary does not take it itself.
fn gated(runner: ExecRunner) -> GatedRunner {
    Gated::new(runner, XtablesGate::process())
}

type GatedRunner = Gated<ExecRunner>;

/// Upstream's `Present()` check: the family's iptables answers for the nat table.
async fn family_present(runner: &GatedRunner) -> bool {
    matches!(
        runner.chain_exists(TableName::Nat, "POSTROUTING").await,
        Ok(true)
    )
}

/// Removes what the modes other than `cfg.mode` left behind (a node switched from one mode
/// to another keeps no stale rules); a mode whose tool is missing has nothing to remove.
pub async fn remove_other_modes(cfg: &ProxyConfig, env: &Environment) {
    // kube-ipvs0 is what a run in IPVS mode leaves; its chains match on its sets, so the
    // chains go first (the next sync writes this mode's afresh).
    if cfg.mode != ProxyMode::Ipvs
        && env.command_prefix.is_empty()
        && ipvs::leftovers_present(&NetlinkIpvs::new()).await
    {
        info!("removing the IPVS mode's leftovers (kube-ipvs0, virtual servers, ipsets)");
        if let Ok(n) = cleanup_iptables(cfg, env).await {
            debug!(tables = n, "kube-proxy chains removed");
        }
        cleanup_ipvs(env).await;
    }
    match cfg.mode {
        ProxyMode::Ipvs => {
            if let Ok(n) = cleanup_nftables(env).await {
                debug!(families = n, "nftables mode's tables removed (if any)");
            }
            if iptables_mode_leftovers(cfg, env).await
                && let Ok(n) = cleanup_iptables(cfg, env).await
            {
                info!(tables = n, "iptables mode's chains removed");
            }
        }
        ProxyMode::Iptables => {
            if let Ok(n) = cleanup_nftables(env).await {
                debug!(families = n, "nftables mode's tables removed (if any)");
            }
        }
        ProxyMode::Nftables => {
            if let Ok(n) = cleanup_iptables(cfg, env).await {
                debug!(tables = n, "iptables mode's chains removed (if any)");
            }
        }
    }
}

/// What every mode's proxiers share: metrics, health, the sync timing.
struct Shared {
    registry: Registry,
    metrics: Metrics,
    health: ProxierHealth,
    /// The connection budget of the healthz, metrics and health-check servers.
    http: health::HttpLimits,
    sync: SyncConfig,
}

/// The render settings of one family, from the configuration.
fn render_config(cfg: &ProxyConfig, family: IpFamily, random_fully: bool) -> RenderConfig {
    let mut render = RenderConfig::new(family, cfg.node_name.clone());
    render.masquerade_all = cfg.masquerade_all;
    render.masquerade_bit = cfg.masquerade_bit;
    render.local_detect = cfg.local_detect.clone();
    if render.local_detect == crate::render_config::LocalDetect::ClusterCidr {
        render.cluster_cidr = cfg.cluster_cidr(family);
    }
    render.node_port_addresses = cfg.node_port_addresses.clone();
    render.localhost_node_ports = cfg.localhost_node_ports;
    render.random_fully = random_fully;
    if !cfg.bind_address.is_unspecified() && family.matches(&cfg.bind_address) {
        render.node_ips = vec![cfg.bind_address];
    }
    if render.local_detect == crate::render_config::LocalDetect::ClusterCidr
        && render.cluster_cidr.is_none()
    {
        info!(
            ip_family = family.label(),
            "no cluster CIDR: traffic is not classified as pod-local"
        );
    }
    render
}

fn family_handle(cfg: &ProxyConfig, family: IpFamily, shared: &Shared) -> ProxyHandle {
    shared.metrics.init_family(family.label());
    ProxyHandle::with_health(
        ServiceState::new(family, cfg.node_name.clone()),
        shared.health.clone(),
    )
}

fn service_health(family: IpFamily, shared: &Shared) -> ServiceHealthServer {
    let any_ip = match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    ServiceHealthServer::new(vec![any_ip], shared.health.clone())
        .with_http_limits(shared.http.clone())
}

fn log_stack(primary: IpFamily, dual: bool) {
    if dual {
        info!(
            primary_ip_family = primary.label(),
            "kube-proxy running in dual-stack mode"
        );
    } else {
        info!(
            ip_family = primary.label(),
            "kube-proxy running in single-stack mode"
        );
    }
}

/// The iptables mode's kernel settings (upstream's PrivilegedInit and NewProxier checks):
/// route_localnet=1 when IPv4 is programmed, localhostNodePorts is on and nodePortAddresses
/// takes 127.0.0.1; a word about bridge-nf-call-iptables. Returns whether
/// nf_conntrack_tcp_be_liberal is on (then no INVALID drop rule).
async fn iptables_sysctls<S: Sysctl>(cfg: &ProxyConfig, families: &[IpFamily], sysctl: &S) -> bool {
    if route_localnet_needed(cfg, families) {
        sysctl::ensure_route_localnet(sysctl).await;
    }
    sysctl::check_bridge_nf_call_iptables(sysctl).await;
    sysctl::tcp_be_liberal(sysctl).await
}

/// Upstream's condition for route_localnet=1.
fn route_localnet_needed(cfg: &ProxyConfig, families: &[IpFamily]) -> bool {
    let node_ips: Vec<IpAddr> =
        if !cfg.bind_address.is_unspecified() && IpFamily::V4.matches(&cfg.bind_address) {
            vec![cfg.bind_address]
        } else {
            Vec::new()
        };
    cfg.mode == ProxyMode::Iptables
        && cfg.localhost_node_ports
        && families.contains(&IpFamily::V4)
        && NodePortAddresses::new(IpFamily::V4, &cfg.node_port_addresses, &node_ips)
            .contains_ipv4_loopback()
}

/// One mode's backends, one per IP family the host programs, and what the mode's checks
/// decided for the render settings.
struct Backends<B> {
    per_family: Vec<(IpFamily, B)>,
    /// MASQUERADE takes `--random-fully`.
    random_fully: bool,
    /// nf_conntrack_tcp_be_liberal is on (no INVALID drop rule).
    tcp_liberal: bool,
}

/// The one builder, for every mode: a proxier per family over the mode's backend, with the
/// pieces it takes in every mode (render settings, change-tracking handle, conntrack
/// cleanup, healthCheckNodePort servers, the shared metrics and sync timing).
fn proxiers<B: Backend>(
    cfg: &ProxyConfig,
    env: &Environment,
    shared: &Shared,
    backends: Backends<B>,
) -> Vec<Proxier<B, NodeConntrack>> {
    let Backends {
        per_family,
        random_fully,
        tcp_liberal,
    } = backends;
    per_family
        .into_iter()
        .map(|(family, backend)| {
            let mut render = render_config(cfg, family, random_fully);
            render.conntrack_tcp_liberal = tcp_liberal;
            let handle = family_handle(cfg, family, shared);
            Proxier::with_backend(backend, render, handle, shared.sync, shared.metrics.clone())
                .with_conntrack(NodeConntrack::for_prefix(&env.command_prefix))
                .with_service_health(service_health(family, shared))
        })
        .collect()
}

/// The iptables modes' families (iptables and ipvs): the primary family's runner, and the
/// other family's when its iptables answers (upstream's dual-stack decision; the same
/// backend for both, never nft and legacy mixed). Also whether MASQUERADE takes
/// `--random-fully`.
async fn iptables_families(cfg: &ProxyConfig, env: &Environment) -> (Vec<GatedRunner>, bool) {
    let primary = cfg.primary_family();
    let (runner, random_fully) = runner_for(cfg, env).await;
    let second = gated(runner.for_family(primary.other()));
    let mut runners = vec![gated(runner)];
    let dual = family_present(&second).await;
    if dual {
        runners.push(second);
    }
    log_stack(primary, dual);
    (runners, random_fully)
}

/// The iptables mode: a backend per IP family the host supports (dual-stack when
/// ip6tables works beside iptables, as upstream decides). The nftables mode's leftovers
/// are removed first.
async fn iptables_backends<S: Sysctl>(
    cfg: &ProxyConfig,
    env: &Environment,
    sysctl: &S,
) -> Backends<IptablesBackend<GatedRunner>> {
    remove_other_modes(cfg, env).await;
    let (runners, random_fully) = iptables_families(cfg, env).await;
    let families: Vec<IpFamily> = runners.iter().map(|r| r.family()).collect();
    let tcp_liberal = iptables_sysctls(cfg, &families, sysctl).await;
    Backends {
        per_family: runners
            .into_iter()
            .map(|runner| (runner.family(), IptablesBackend::new(runner)))
            .collect(),
        random_fully,
        tcp_liberal,
    }
}

/// The nftables mode: the kernel must take the primary family's table and `numgen` (else a
/// clear error); the other family is programmed when the kernel takes it too. The iptables
/// mode's leftovers are removed first (when there is an iptables to do it).
async fn nftables_backends(
    cfg: &ProxyConfig,
    env: &Environment,
) -> Result<Backends<NftBackend<ExecNft>>> {
    let primary = cfg.primary_family();
    let runner = ExecNft::new().with_prefix(env.command_prefix.clone());
    nftables::check_support(&runner, primary).await?;
    let dual = nftables::check_support(&runner, primary.other())
        .await
        .inspect_err(|e| info!(reason = %e, "no second IP family"))
        .is_ok();
    remove_other_modes(cfg, env).await;
    if cfg.localhost_node_ports_ignored {
        warn!(
            "localhostNodePorts is ignored in nftables mode: node ports do not answer on 127.0.0.1 (as upstream)"
        );
    }
    log_stack(primary, dual);
    let families = if dual {
        vec![primary, primary.other()]
    } else {
        vec![primary]
    };
    Ok(Backends {
        per_family: families
            .into_iter()
            .map(|family| (family, NftBackend::new(runner.clone())))
            .collect(),
        random_fully: true,
        tcp_liberal: false,
    })
}

/// The IPVS mode (upstream's order): the kernel must have IPVS, the scheduler, dummy
/// interfaces and ipset (else a clear error; upstream no longer falls back to iptables);
/// upstream's deprecation line; the other modes' leftovers removed; the `net/ipv4/vs/*`
/// sysctls and IPVS timeouts set; a backend per family iptables answers for.
async fn ipvs_backends<S: Sysctl>(
    cfg: &ProxyConfig,
    env: &Environment,
    sysctl: &S,
) -> Result<Backends<IpvsBackend<NetlinkIpvs, ExecIpset, GatedRunner>>> {
    if !env.command_prefix.is_empty() {
        return Err(ipvs::Unsupported(
            "IPVS is programmed over netlink in this process's network namespace: run kube-proxy inside the node's namespace rather than through a command prefix".into(),
        )
        .into());
    }
    let kernel = NetlinkIpvs::new();
    let ipset = ExecIpset::new();
    ipvs::check_support(&kernel, &ipset, &cfg.ipvs.scheduler).await?;
    info!("Using ipvs Proxier");
    error!("{}", ipvs::DEPRECATION);
    remove_other_modes(cfg, env).await;
    let release = tokio::task::spawn_blocking(|| {
        std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default()
    })
    .await
    .unwrap_or_default();
    sysctl::set_ipvs_sysctls(
        sysctl,
        cfg.ipvs.strict_arp,
        sysctl::parse_kernel_version(&release),
    )
    .await;
    sysctl::check_bridge_nf_call_iptables(sysctl).await;
    let tcp_liberal = sysctl::tcp_be_liberal(sysctl).await;
    let t = &cfg.ipvs;
    if t.tcp_timeout > 0 || t.tcp_fin_timeout > 0 || t.udp_timeout > 0 {
        let op = ipvs::kernel::Op::SetTimeouts {
            tcp: t.tcp_timeout,
            tcp_fin: t.tcp_fin_timeout,
            udp: t.udp_timeout,
        };
        if let Some(Err(e)) = kernel.batch(vec![op]).await.pop() {
            error!(error = %e, "Failed to configure IPVS timeouts");
        }
    }
    if cfg.localhost_node_ports_ignored {
        warn!(
            "localhostNodePorts is ignored in ipvs mode: node ports do not answer on 127.0.0.1 (as upstream)"
        );
    }
    let (runners, random_fully) = iptables_families(cfg, env).await;
    Ok(Backends {
        per_family: runners
            .into_iter()
            .map(|runner| {
                let family = runner.family();
                let backend =
                    IpvsBackend::new(kernel.clone(), ipset.clone(), runner, cfg.ipvs.clone());
                (family, backend)
            })
            .collect(),
        random_fully,
        tcp_liberal,
    })
}

/// Runs the proxy until `shutdown` with the given source, in the configured mode: one
/// proxier per IP family, fed by one source, sharing `/healthz` and the metrics.
pub async fn run_source(
    cfg: ProxyConfig,
    env: Environment,
    source: Source,
    shutdown: CancellationToken,
) -> Result<()> {
    let sysctl = NodeSysctl::for_prefix(&env.command_prefix);
    let cpus = tokio::task::spawn_blocking(sysctl::num_cpu)
        .await
        .unwrap_or(1);
    sysctl::set_conntrack_sysctls(&sysctl, &cfg.conntrack, cpus).await;
    let registry = Registry::new();
    let metrics = Metrics::new(&registry)?;
    plumbing::metrics::register_common(&registry)?;
    let shared = Shared {
        registry,
        metrics,
        health: ProxierHealth::new(cfg.health_timeout()),
        http: health::HttpLimits::default(),
        sync: SyncConfig {
            min_sync_period: cfg.min_sync_period,
            sync_period: cfg.sync_period,
            ..SyncConfig::default()
        },
    };
    match cfg.mode {
        ProxyMode::Iptables => {
            let backends = iptables_backends(&cfg, &env, &sysctl).await;
            serve_and_sync(cfg, env, source, shared, backends, shutdown).await
        }
        ProxyMode::Nftables => {
            let backends = nftables_backends(&cfg, &env).await?;
            serve_and_sync(cfg, env, source, shared, backends, shutdown).await
        }
        ProxyMode::Ipvs => {
            let backends = ipvs_backends(&cfg, &env, &sysctl).await?;
            serve_and_sync(cfg, env, source, shared, backends, shutdown).await
        }
    }
}

/// Builds the mode's proxiers, starts the health and metrics servers and the source, then
/// runs each proxier's sync loop until `shutdown`.
async fn serve_and_sync<B: Backend>(
    cfg: ProxyConfig,
    env: Environment,
    source: Source,
    shared: Shared,
    backends: Backends<B>,
    shutdown: CancellationToken,
) -> Result<()> {
    let proxiers = proxiers(&cfg, &env, &shared, backends);
    let handles = ProxyHandles::new(proxiers.iter().map(|p| p.handle().clone()).collect());
    if let Some(addr) = cfg.healthz_bind_address {
        let router = health::healthz_router(shared.health.clone(), &shared.registry)?;
        health::serve(addr, router, "healthz", &shared.http, shutdown.clone()).await?;
    }
    if let Some(addr) = cfg.metrics_bind_address {
        health::serve(
            addr,
            health::metrics_router(shared.registry.clone(), cfg.mode.as_str()),
            "metrics",
            &shared.http,
            shutdown.clone(),
        )
        .await?;
    }

    let source_task = match source {
        Source::Apiserver(client) => tokio::spawn(apiserver::run(
            client,
            handles,
            cfg.node_name.clone(),
            shutdown.clone(),
        )),
        Source::StaticDir(dir) => {
            info!(dir = %dir.display(), "Service source: static directory");
            tokio::spawn(source::run_static_dir(
                dir,
                handles,
                STATIC_DIR_INTERVAL,
                shutdown.clone(),
            ))
        }
    };

    info!(node = %cfg.node_name, mode = cfg.mode.as_str(), "kube-proxy running");
    futures::future::join_all(
        proxiers
            .into_iter()
            .map(|p| sync_loop::run(p, shared.sync, shutdown.clone())),
    )
    .await;
    let _ = source_task.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Flags, resolve};
    use clap::Parser;

    fn cfg(args: &[&str]) -> ProxyConfig {
        let mut all = vec!["kube-proxy"];
        all.extend_from_slice(args);
        resolve(&Flags::try_parse_from(all).unwrap(), None, "node-a").unwrap()
    }

    #[test]
    fn client_options_from_flags_and_file() {
        assert_eq!(client_options(&cfg(&[]), false), None);
        assert_eq!(
            client_options(&cfg(&["--static-services-dir=/x"]), false),
            None
        );
        // In a pod with nothing configured: the in-cluster configuration.
        let o = client_options(&cfg(&[]), true).unwrap();
        assert_eq!((o.kubeconfig, o.master), (None, None));
        assert_eq!(
            client_options(&cfg(&["--static-services-dir=/x"]), true),
            None,
            "an explicit static dir wins over the in-cluster fallback"
        );
        let o = client_options(&cfg(&["--kubeconfig=/k", "--kube-api-qps=20"]), false).unwrap();
        assert_eq!(o.kubeconfig, Some(PathBuf::from("/k")));
        assert_eq!((o.qps, o.burst), (20.0, 10));
        let o = client_options(&cfg(&["--master=https://10.0.0.1:6443"]), false).unwrap();
        assert_eq!(o.kubeconfig, None);
        assert_eq!(o.master.as_deref(), Some("https://10.0.0.1:6443"));
        let file = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection:\n  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n  qps: 7\n  burst: 3\n";
        let c = resolve(&Flags::default(), Some(file), "n").unwrap();
        let o = client_options(&c, false).unwrap();
        assert_eq!(
            o.kubeconfig,
            Some(PathBuf::from("/var/lib/kube-proxy/kubeconfig.conf"))
        );
        assert_eq!((o.qps, o.burst), (7.0, 3));
    }

    #[test]
    fn route_localnet_only_where_upstream_sets_it() {
        let v4 = [IpFamily::V4];
        let both = [IpFamily::V6, IpFamily::V4];
        assert!(route_localnet_needed(&cfg(&[]), &v4));
        assert!(route_localnet_needed(&cfg(&[]), &both));
        assert!(
            !route_localnet_needed(&cfg(&[]), &[IpFamily::V6]),
            "IPv4 only"
        );
        assert!(!route_localnet_needed(
            &cfg(&["--iptables-localhost-nodeports=false"]),
            &v4
        ));
        assert!(
            !route_localnet_needed(&cfg(&["--nodeport-addresses=10.0.0.0/8"]), &v4),
            "nodePortAddresses without 127.0.0.1"
        );
        assert!(route_localnet_needed(
            &cfg(&["--nodeport-addresses=127.0.0.0/8"]),
            &v4
        ));
        assert!(!route_localnet_needed(
            &cfg(&["--proxy-mode=nftables"]),
            &v4
        ));
    }

    #[tokio::test]
    async fn no_source_is_a_clear_error() {
        let e = run(cfg(&[]), Environment::default(), CancellationToken::new())
            .await
            .unwrap_err();
        assert!(matches!(e, Error::NoSource));
        assert!(e.to_string().contains("--kubeconfig"), "{e}");
        assert!(e.to_string().contains("--static-services-dir"), "{e}");

        // A kubeconfig that cannot be read fails before anything touches the kernel.
        let e = run(
            cfg(&[
                "--kubeconfig=/nonexistent/kube-proxy.conf",
                "--static-services-dir=/x",
            ]),
            Environment::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, Error::Client(_)), "{e}");
        assert!(
            e.to_string().contains("/nonexistent/kube-proxy.conf"),
            "{e}"
        );
    }
}
