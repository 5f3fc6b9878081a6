//! `kubelet`: parse flags, load config, run until SIGTERM/SIGINT.

use clap::{CommandFactory, FromArgMatches};
use kubelet::{app, config, settings, settings::Flags};
use tokio_util::sync::CancellationToken;

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Logs to stderr in `logging.format` (klog text or JSON) at `--v`/`logging.verbosity`
/// (RUST_LOG, when set, wins at start); the returned control changes the level at run time
/// (`/debug/flags/v`).
fn init_logging(opts: &plumbing::logging::Options) -> kubelet::server::zpages::VerbositySetter {
    plumbing::logging::init(opts)
}

/// The command line as `/flagz` shows it: every long flag with its given value, else its
/// default (empty when it has none).
fn command_line(
    cmd: &clap::Command,
    matches: &clap::ArgMatches,
) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else {
            continue;
        };
        if matches!(long, "help" | "version") {
            continue;
        }
        let value = match matches.get_raw(arg.get_id().as_str()) {
            Some(vals) => vals
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(","),
            None => arg
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(","),
        };
        out.insert(long.to_string(), value);
    }
    out
}

fn main() -> std::process::ExitCode {
    let cmd = Flags::command();
    let parsed = cmd
        .clone()
        .try_get_matches()
        .and_then(|m| Flags::from_arg_matches(&m).map(|f| (f, m)));
    let (flags, matches) = match parsed {
        Ok(f) => f,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                std::process::ExitCode::from(1)
            } else {
                std::process::ExitCode::SUCCESS
            };
        }
    };
    if let Some(v) = &flags.version {
        if v == "raw" {
            println!(
                "gitVersion: {}\nplatform: linux/{}",
                kubelet::KUBERNETES_VERSION,
                std::env::consts::ARCH
            );
        } else {
            println!("Kubernetes {}", kubelet::KUBERNETES_VERSION);
        }
        return std::process::ExitCode::SUCCESS;
    }
    let start = std::time::SystemTime::now();
    // No setting is accepted and silently ignored: see kubelet::settings and docs/settings.md.
    let given = plumbing::settings::given_flags(&cmd, &matches);
    let (cfg, warnings) = match config::load_checked(&flags, &given, &hostname()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kubelet: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    // The configuration (file, drop-ins, flags) chooses the log format, so it is read first.
    let verbosity = init_logging(&cfg.logging);
    kubelet::server::zpages::record_process(kubelet::server::zpages::Process {
        start,
        flags: command_line(&cmd, &matches),
        verbosity: Some(verbosity),
    });
    for w in &warnings {
        tracing::warn!("{w}");
    }
    if let Some(path) = &cfg.proxy_config
        && let Ok(text) = std::fs::read_to_string(path)
    {
        let f = proxy::settings::check(&[], Some(&text));
        if !f.refusals.is_empty() {
            eprintln!(
                "kubelet: --proxy-config {}: refusing to start: {}",
                path.display(),
                f.refusals.join("; ")
            );
            return std::process::ExitCode::from(1);
        }
        for w in &f.warnings {
            tracing::warn!(proxy_config = %path.display(), "{w}");
        }
    }
    if let Err(e) = settings::preflight(cfg.protect_kernel_defaults, cfg.fail_swap_on) {
        eprintln!("kubelet: {e}");
        return std::process::ExitCode::from(1);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kubelet: starting the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let result = rt.block_on(async {
        let cancel = CancellationToken::new();
        let signal_cancel = cancel.clone();
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("signal handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            signal_cancel.cancel();
        });
        app::run(cfg, cancel).await
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "kubelet failed");
            eprintln!("kubelet: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
