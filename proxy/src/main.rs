//! `kube-proxy`: parse flags and config, then run the proxy role (or clean up and exit).

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use proxy::app::{self, Environment};
use proxy::config::{self, Flags};
use tokio_util::sync::CancellationToken;

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

async fn shutdown_signal(token: CancellationToken) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async {
            match term.as_mut() {
                Some(t) => { t.recv().await; }
                None => std::future::pending::<()>().await,
            }
        } => {}
    }
    tracing::info!("shutting down");
    token.cancel();
}

fn main() -> ExitCode {
    let cmd = Flags::command();
    // A flag error exits 1, as upstream's (cobra) does; --help exits 0.
    let parsed = cmd
        .clone()
        .try_get_matches()
        .and_then(|m| Flags::from_arg_matches(&m).map(|f| (f, m)));
    let (flags, matches) = match parsed {
        Ok(f) => f,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if flags.version.is_some() && flags.version.as_deref() != Some("false") {
        println!("Kubernetes {}", plumbing::version::KUBERNETES_VERSION);
        return ExitCode::SUCCESS;
    }
    if let Some(path) = &flags.more.write_config_to {
        // As upstream: write the default configuration and exit.
        return match std::fs::write(path, config::DEFAULT_CONFIG) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("Error: failed to write {}: {e}", path.display());
                ExitCode::FAILURE
            }
        };
    }
    let file_text = match &flags.config {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("Error: failed to read {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let cfg = match config::resolve(&flags, file_text.as_deref(), &hostname()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // No setting is accepted and silently ignored (see proxy::settings and docs/settings.md).
    let findings = proxy::settings::check(
        &proxy::settings::given_flags(&cmd, &matches),
        file_text.as_deref(),
    );
    if !findings.refusals.is_empty() {
        for r in &findings.refusals {
            eprintln!("Error: {r}");
        }
        return ExitCode::FAILURE;
    }
    // klog text or JSON at --v/logging.verbosity (RUST_LOG, when set, wins).
    let _verbosity = plumbing::logging::init(&cfg.logging);
    for w in &findings.warnings {
        tracing::warn!("{w}");
    }
    if flags.more.init_only == Some(true) {
        // The kernel settings upstream's --init-only applies are applied by this proxy when
        // it starts; there is nothing to do beforehand.
        tracing::info!("--init-only: nothing to initialize ahead of the start; exiting");
        return ExitCode::SUCCESS;
    }
    if !cfg.cleanup {
        // As a Go program does at start: every connection and child pipe is a descriptor.
        plumbing::fd_limit::raise_to_hard_logged();
        // As upstream: lowering the score needs CAP_SYS_RESOURCE; a failure is logged only.
        let file = std::path::Path::new(plumbing::oom_score::SELF_OOM_SCORE_ADJ);
        if let Err(e) = plumbing::oom_score::apply(file, cfg.oom_score_adj) {
            tracing::info!(oom_score_adj = cfg.oom_score_adj, error = %e, "Failed to apply OOMScore");
        }
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: anyhow::Result<()> = rt.block_on(async {
        if cfg.cleanup {
            app::cleanup(&cfg, &Environment::default()).await?;
            return Ok(());
        }
        let token = CancellationToken::new();
        tokio::spawn(shutdown_signal(token.clone()));
        app::run(cfg, Environment::default(), token).await?;
        Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "kube-proxy failed");
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
