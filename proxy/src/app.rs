//! Assembles the proxy role from a validated [`ProxyConfig`]: backend detection, proxier,
//! sync loop, health/metrics servers and the Service source. Used by the `kube-proxy` binary
//! and meant to be hosted by the kubelet binary later.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use prometheus::Registry;
use thiserror::Error;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{ProxyConfig, ProxyMode};
use crate::conntrack::ExecConntrack;
use crate::health::{self, ServiceHealthServer};
use crate::iptables::{self, ExecRunner, IptablesRunner};
use crate::model::{IpFamily, ServiceState};
use crate::proxier::{self, Proxier, ProxyHandle, SyncConfig};
use crate::render::RenderConfig;
use crate::{cleanup, source};

#[derive(Debug, Error)]
pub enum Error {
    #[error(transparent)]
    Proxier(#[from] proxier::Error),
    #[error(transparent)]
    Health(#[from] health::Error),
    #[error("iptables: {0}")]
    Iptables(#[from] iptables::Error),
    #[error(
        "no Service source: the apiserver watch (--kubeconfig) is not implemented yet; use --static-services-dir"
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
    let decision = iptables::detect_backend(family, env.command_prefix.clone()).await;
    info!(backend = ?decision.backend, reason = decision.reason, "iptables backend");
    let runner = ExecRunner::new(family)
        .with_backend(decision.backend)
        .with_prefix(env.command_prefix.clone());
    match runner.version().await {
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

/// `--cleanup`: removes kube-proxy's chains and exits.
pub async fn cleanup(cfg: &ProxyConfig, env: &Environment) -> Result<()> {
    let (runner, _) = runner_for(cfg, env).await;
    let n = cleanup::cleanup(&runner).await?;
    info!(tables = n, "cleanup done");
    Ok(())
}

/// Runs the proxy until `shutdown`.
pub async fn run(cfg: ProxyConfig, env: Environment, shutdown: CancellationToken) -> Result<()> {
    let ProxyMode::Iptables = cfg.mode;
    // The apiserver watch (--kubeconfig) is not implemented yet.
    let Some(dir) = cfg.static_services_dir.clone() else {
        return Err(Error::NoSource);
    };
    let c = &cfg.conntrack;
    info!(
        max_per_core = c.max_per_core,
        min = c.min,
        tcp_established_timeout = ?c.tcp_established_timeout,
        tcp_close_wait_timeout = ?c.tcp_close_wait_timeout,
        "conntrack settings accepted but not applied: this kube-proxy does not set conntrack sysctls"
    );
    let family = cfg.primary_family();
    let (runner, random_fully) = runner_for(&cfg, &env).await;

    let mut render = RenderConfig::new(family, cfg.node_name.clone());
    render.masquerade_all = cfg.masquerade_all;
    render.masquerade_bit = cfg.masquerade_bit;
    render.cluster_cidr = cfg.cluster_cidr(family);
    render.node_port_addresses = cfg.node_port_addresses.clone();
    render.localhost_node_ports = cfg.localhost_node_ports;
    render.random_fully = random_fully;
    if !cfg.bind_address.is_unspecified() {
        render.node_ips = vec![cfg.bind_address];
    }
    if render.cluster_cidr.is_none() {
        info!("no cluster CIDR: traffic is not classified as pod-local");
    }

    let registry = Registry::new();
    let handle = ProxyHandle::new(ServiceState::new(family, cfg.node_name.clone()));
    handle.health().set_timeout(cfg.health_timeout());
    let any_ip = match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let service_health = ServiceHealthServer::new(vec![any_ip], handle.health().clone());
    let sync = SyncConfig {
        min_sync_period: cfg.min_sync_period,
        sync_period: cfg.sync_period,
        ..SyncConfig::default()
    };
    let proxier = Proxier::new(runner, render, handle.clone(), sync, &registry)?
        .with_conntrack(ExecConntrack::new().with_prefix(env.command_prefix.clone()))
        .with_service_health(service_health);

    if let Some(addr) = cfg.healthz_bind_address {
        let router = health::healthz_router(handle.health().clone(), &registry)?;
        health::serve(addr, router, shutdown.clone()).await?;
    }
    if let Some(addr) = cfg.metrics_bind_address {
        health::serve(
            addr,
            health::metrics_router(registry.clone(), "iptables"),
            shutdown.clone(),
        )
        .await?;
    }

    let source_task = tokio::spawn(source::run_static_dir(
        dir,
        handle.clone(),
        STATIC_DIR_INTERVAL,
        shutdown.clone(),
    ));

    info!(node = %cfg.node_name, "kube-proxy running (iptables mode)");
    proxier::run(proxier, sync, shutdown.clone()).await;
    let _ = source_task.await;
    Ok(())
}
