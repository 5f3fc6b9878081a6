//! Starts the kubelet's servers: :10248 (healthz), the read-only port, and the :10250 API with
//! its TLS (files, self-signed, or a bootstrapped serving certificate) and authentication.

use super::{AppError, cluster::Connected};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::pleg::PlegHealth;
use crate::server::{self, AppState};
use crate::status::StatusManager;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// :10250 authentication/authorization (upstream's BuildAuth: webhook modes need a client).
pub(super) fn auth(
    cfg: &Config,
    cluster: Option<&Connected>,
) -> Result<Arc<server::Auth>, AppError> {
    let review = cluster.map(|c| {
        Arc::new(crate::server::ApiReview::new(c.client.clone()))
            as Arc<dyn crate::server::AuthReview>
    });
    Ok(Arc::new(
        server::Auth::new(cfg.server.auth.clone(), &cfg.node.node_name, review)
            .map_err(server::ServerError::from)?,
    ))
}

/// What the handlers read, and the container lookup the runtime is set into once connected.
pub(super) fn state(
    cfg: &Config,
    metrics: &Metrics,
    statuses: &Arc<StatusManager>,
    pleg: &Arc<PlegHealth>,
) -> (AppState, Arc<server::logs::RuntimeLookup>) {
    let configz = Arc::new(serde_json::to_value(cfg).unwrap_or_default());
    let log_runtime = Arc::new(server::logs::RuntimeLookup::default());
    let state = AppState {
        statuses: statuses.clone(),
        pleg: pleg.clone(),
        metrics: metrics.clone(),
        configz,
        logs: Arc::new(server::logs::Logs {
            pod_logs_dir: cfg.pod_logs_dir.clone(),
            node_log_dir: cfg
                .server
                .enable_system_log_handler
                .then(|| "/var/log".into()),
            containers: log_runtime.clone(),
        }),
        stats: crate::stats::Handle::default(),
        runtime: log_runtime.clone(),
        streaming: Arc::new(server::streaming::Streaming::new(
            cfg.server.streaming_connection_idle_timeout,
        )),
        debug: Arc::new(debug(cfg)),
    };
    for c in server::streaming::collectors() {
        if let Err(e) = metrics.registry.register(c) {
            tracing::warn!(error = %e, "streaming metrics are not exposed");
        }
    }
    (state, log_runtime)
}

/// The debugging endpoints' state: the process facts `main` recorded (start time, command
/// line, verbosity control) and the settings that switch them.
fn debug(cfg: &Config) -> server::zpages::Debug {
    let process = server::zpages::recorded_process();
    let mut d = server::zpages::Debug {
        flags_handler: cfg.server.debug.enable_debug_flags_handler,
        profiling_handler: cfg.server.debug.enable_profiling_handler,
        statusz: cfg.server.debug.statusz,
        flagz: cfg.server.debug.flagz,
        log_query: cfg.server.debug.enable_system_log_query.then(|| {
            Arc::new(server::journal::Journalctl::default()) as Arc<dyn server::journal::Journal>
        }),
        ..Default::default()
    };
    if let Some(p) = process {
        d.start = p.start;
        d.flags = p.flags;
        d.verbosity = p.verbosity;
    }
    d
}

/// Binds and spawns the servers, first thing, so kubeadm's health check and operators can
/// reach the agent at once.
pub(super) async fn start(
    cfg: &Config,
    state: &AppState,
    auth: Arc<server::Auth>,
    cluster: Option<&Connected>,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) -> Result<(), AppError> {
    // Upstream lowers its own OOM score first thing; without CAP_SYS_RESOURCE it cannot, and
    // says so and goes on.
    let oom_file = std::path::Path::new(plumbing::oom_score::SELF_OOM_SCORE_ADJ);
    match plumbing::oom_score::apply(oom_file, cfg.oom_score_adj) {
        Ok(()) => tracing::info!(
            oom_score_adj = cfg.oom_score_adj,
            "OOM score adjustment set"
        ),
        Err(e) => tracing::warn!(
            oom_score_adj = cfg.oom_score_adj,
            error = %e,
            "Failed to ApplyOOMScoreAdj (lowering it needs CAP_SYS_RESOURCE); going on with the current score"
        ),
    }
    // Before any listener: each connection is a descriptor (upstream's rlimit.SetNumFiles).
    plumbing::fd_limit::apply_logged(cfg.server.max_open_files);
    if cfg.server.healthz_port != 0 {
        let l = server::bind(SocketAddr::new(
            cfg.server.healthz_bind_address,
            cfg.server.healthz_port,
        ))
        .await?;
        tracing::info!(addr = %l.local_addr().map(|a| a.to_string()).unwrap_or_default(), "healthz server listening");
        tasks.spawn(server::serve_http(
            l,
            server::healthz_router(state.clone()),
            server::listener::ServerType::Healthz,
            cfg.server
                .connections
                .limits(server::listener::ServerType::Healthz),
            cancel.clone(),
        ));
    }
    if cfg.server.read_only_port != 0 {
        let l = server::bind(SocketAddr::new(
            cfg.server.address,
            cfg.server.read_only_port,
        ))
        .await?;
        tracing::warn!(addr = %l.local_addr().map(|a| a.to_string()).unwrap_or_default(), "read-only port listening (plain HTTP, no authentication): pods, stats and metrics are readable by anyone who reaches it");
        tasks.spawn(server::serve_http(
            l,
            server::read_only_router(state.clone()),
            server::listener::ServerType::ReadOnly,
            cfg.server
                .connections
                .limits(server::listener::ServerType::ReadOnly),
            cancel.clone(),
        ));
    }
    if !cfg.server.enable_server {
        tracing::info!("enableServer is false: the kubelet API (:10250) is not served");
        return Ok(());
    }
    let tls = serving_tls(cfg, cluster, tasks, cancel)?;
    let l = server::bind(SocketAddr::new(cfg.server.address, cfg.server.port)).await?;
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
        server::api_router(state.clone(), cfg.server.enable_debugging_handlers),
        cfg.server
            .connections
            .limits(server::listener::ServerType::ReadWrite),
        cancel.clone(),
    ));
    Ok(())
}

/// :10250's TLS: with `serverTLSBootstrap` a certificate the serving manager (spawned here)
/// requests from the apiserver; else the configured files or a self-signed pair.
fn serving_tls(
    cfg: &Config,
    cluster: Option<&Connected>,
    tasks: &mut JoinSet<()>,
    cancel: &CancellationToken,
) -> Result<rustls::ServerConfig, AppError> {
    let policy = server::tls_policy(
        cfg.server.tls_min_version.as_deref(),
        &cfg.server.tls_cipher_suites,
    )
    .map_err(server::ServerError::TlsPolicy)?;
    Ok(match (cfg.server.server_tls_bootstrap, cluster) {
        (true, Some(conn)) => {
            if cfg.server.tls_cert_file.is_some() {
                tracing::warn!(
                    "serverTLSBootstrap is true: tlsCertFile/tlsPrivateKeyFile are not served; the certificate comes from a kubernetes.io/kubelet-serving CSR"
                );
            }
            let resolver = Arc::new(crate::certs::ServingCertResolver::new());
            let manager = crate::certs::ServingManager {
                settings: crate::certs::ServingSettings {
                    node_name: cfg.node.node_name.clone(),
                    hostnames: vec![cfg.node.node_name.clone()],
                    ips: super::node_ips(cfg),
                    cert_dir: cfg.cert_dir.clone(),
                },
                client: conn.client.clone(),
                resolver: resolver.clone(),
            };
            tasks.spawn(manager.run(cancel.clone()));
            server::serving_tls_resolver(
                &policy,
                resolver,
                cfg.server.auth.client_ca_file.is_some(),
            )?
        }
        (true, None) => return Err(AppError::ServerTlsBootstrapStandalone),
        (false, _) if cfg.server.reload_tls_cert_files => {
            match (
                cfg.server.tls_cert_file.clone(),
                cfg.server.tls_private_key_file.clone(),
            ) {
                (Some(cert), Some(key)) => {
                    let (resolver, reloader) =
                        crate::certs::serving_files::FileCertReloader::load(cert, key)?;
                    tasks.spawn(reloader.run(crate::certs::serving_files::POLL, cancel.clone()));
                    server::serving_tls_resolver(
                        &policy,
                        resolver,
                        cfg.server.auth.client_ca_file.is_some(),
                    )?
                }
                _ => self_signed_or_static(cfg, &policy)?,
            }
        }
        (false, _) => self_signed_or_static(cfg, &policy)?,
    })
}

/// The configured pair read once, or the self-signed pair in the cert dir.
fn self_signed_or_static(
    cfg: &Config,
    policy: &server::TlsPolicy,
) -> Result<rustls::ServerConfig, AppError> {
    Ok(server::serving_tls(
        policy,
        cfg.server.tls_cert_file.as_deref(),
        cfg.server.tls_private_key_file.as_deref(),
        &cfg.cert_dir,
        &cfg.node.node_name,
        &cfg.node.node_ips,
        cfg.server.auth.client_ca_file.is_some(),
    )?)
}
