//! `node-agent-cni`: the CNI plugin executable. The runtime runs it with `CNI_*` variables and
//! the network config on stdin; it prints the result (or error) JSON on stdout.

use std::io::{Read, Write};

use cni::dataplane::netlink::Netlink;

fn main() {
    // Logs go to stderr, which runtimes keep apart from the JSON on stdout. The filter is
    // parsed only when asked for: every pod start pays for this process's start-up.
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr);
    match std::env::var("NODE_AGENT_CNI_LOG") {
        Ok(filter) => builder
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .init(),
        Err(_) => builder.with_max_level(tracing::Level::WARN).init(),
    }
    let mut stdin = Vec::new();
    let is_version = std::env::var("CNI_COMMAND").is_ok_and(|c| c == "VERSION");
    if !is_version && let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        let err = cni::Error::Io(format!("reading stdin: {e}"));
        println!("{}", err.to_json(cni::config::CURRENT_VERSION));
        std::process::exit(1);
    }
    let dataplane = Netlink {
        enable_forwarding: true,
    };
    let out = cni::plugin::run(|k| std::env::var(k).ok(), &stdin, &dataplane);
    let mut stdout = std::io::stdout().lock();
    if !out.stdout.is_empty() {
        let _ = writeln!(stdout, "{}", out.stdout);
    }
    let _ = stdout.flush();
    std::process::exit(out.exit_code);
}
