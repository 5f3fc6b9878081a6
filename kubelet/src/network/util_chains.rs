//! The kubelet's own iptables chains (`makeIPTablesUtilChains`, default true), as upstream's
//! `kubelet_network_linux.go`, in both IP families where iptables works:
//! - `KUBE-IPTABLES-HINT` in mangle: its presence in iptables-legacy or iptables-nft is how
//!   the `iptables-wrapper` of the kube-proxy, flannel and Calico images picks the variant
//!   the node uses (without it the wrapper counts rules, and a wrong pick splits the ruleset);
//! - IPv4 only: `KUBE-FIREWALL` in filter, jumped to first from INPUT and OUTPUT, dropping
//!   non-loopback packets to 127.0.0.0/8 that are not part of a known connection (the
//!   `route_localnet` mitigation upstream keeps in the kubelet; kube-proxy writes the same
//!   rule);
//! - `KUBE-KUBELET-CANARY` in mangle, nat and filter: checked every minute; when it is gone
//!   (someone flushed the tables) the rules above are written again and the canaries too.
//!
//! The edge is proxy's [`IptablesRunner`] (plain `iptables`/`ip6tables`, whichever variant
//! the host's alternatives pick, as upstream's kubelet); the fake is proxy's `FakeRunner`.
//! The chains go into the network namespace the kubelet runs in.

use std::time::Duration;

use plumbing::cidr::IpFamily;
use plumbing::iptables::{IptablesRunner, Position, TableName};
use tokio_util::sync::CancellationToken;

/// Whose presence tells other components which iptables variant this node uses.
pub const HINT_CHAIN: &str = "KUBE-IPTABLES-HINT";
/// Gone from mangle means the tables were flushed: the rules are synced again.
pub const CANARY_CHAIN: &str = "KUBE-KUBELET-CANARY";
/// The martian-packet protection chain (IPv4).
pub const FIREWALL_CHAIN: &str = "KUBE-FIREWALL";
/// The tables the canary lives in; the first is the one polled.
pub const CANARY_TABLES: [TableName; 3] = [TableName::Mangle, TableName::Nat, TableName::Filter];
/// How often the canary is checked (upstream: one minute).
pub const MONITOR_INTERVAL: Duration = Duration::from_secs(60);
/// After the mangle canary is gone: how often, and how long, to wait for the others to go.
const FLUSH_POLL: Duration = Duration::from_millis(100);
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

fn protocol(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

/// The localnet rule's arguments (as upstream writes them, so `-C` matches its copy).
pub fn localnet_rule() -> Vec<String> {
    [
        "-m",
        "comment",
        "--comment",
        "block incoming localnet connections",
        "--dst",
        "127.0.0.0/8",
        "!",
        "--src",
        "127.0.0.0/8",
        "-m",
        "conntrack",
        "!",
        "--ctstate",
        "RELATED,ESTABLISHED,DNAT",
        "-j",
        "DROP",
    ]
    .map(String::from)
    .to_vec()
}

/// Whether iptables of this family works here (upstream's `Present`: nat POSTROUTING can
/// be listed).
pub async fn present<R: IptablesRunner>(r: &R) -> bool {
    matches!(
        r.chain_exists(TableName::Nat, "POSTROUTING").await,
        Ok(true)
    )
}

/// Upstream's `syncIPTablesRules`: the hint chain, and for IPv4 the KUBE-FIREWALL chain, its
/// jumps and the localnet rule. Logs the first failure and returns false.
pub async fn sync_rules<R: IptablesRunner>(r: &R) -> bool {
    if let Err(e) = r.ensure_chain(TableName::Mangle, HINT_CHAIN).await {
        tracing::error!(error = %e, "Failed to ensure that iptables hint chain exists");
        return false;
    }
    if r.family() == IpFamily::V6 {
        return true;
    }
    if let Err(e) = r.ensure_chain(TableName::Filter, FIREWALL_CHAIN).await {
        tracing::error!(error = %e, "Failed to ensure that filter table KUBE-FIREWALL chain exists");
        return false;
    }
    let jump = vec!["-j".to_string(), FIREWALL_CHAIN.to_string()];
    for (from, what) in [
        (
            "OUTPUT",
            "Failed to ensure that OUTPUT chain jumps to KUBE-FIREWALL",
        ),
        (
            "INPUT",
            "Failed to ensure that INPUT chain jumps to KUBE-FIREWALL",
        ),
    ] {
        if let Err(e) = r
            .ensure_rule(Position::Prepend, TableName::Filter, from, &jump)
            .await
        {
            tracing::error!(error = %e, "{what}");
            return false;
        }
    }
    if let Err(e) = r
        .ensure_rule(
            Position::Append,
            TableName::Filter,
            FIREWALL_CHAIN,
            &localnet_rule(),
        )
        .await
    {
        tracing::error!(
            error = %e,
            "Failed to ensure rule to drop invalid localhost packets in filter table KUBE-FIREWALL chain"
        );
        return false;
    }
    true
}

/// Upstream's `initNetworkUtil` for the runners given (one per family): the families where
/// iptables works get their rules, then a canary monitor each (spawned into `tasks`).
pub async fn start<R: IptablesRunner + Clone>(
    runners: Vec<R>,
    interval: Duration,
    tasks: &mut tokio::task::JoinSet<()>,
    cancel: &CancellationToken,
) {
    let mut usable = Vec::new();
    for r in runners {
        if present(&r).await {
            usable.push(r);
        }
    }
    if usable.is_empty() {
        // Not an error: the kubelet needs none of this itself, and nft-only hosts have no
        // iptables users that would.
        tracing::info!(
            "No iptables support on this system; not creating the KUBE-IPTABLES-HINT chain"
        );
        return;
    }
    for r in usable {
        let proto = protocol(r.family());
        if sync_rules(&r).await {
            tracing::info!(protocol = proto, "Initialized iptables rules.");
            tasks.spawn(monitor(r, interval, cancel.clone()));
        } else {
            tracing::info!(
                protocol = proto,
                "Failed to initialize iptables rules; some functionality may be missing."
            );
        }
    }
}

/// [`start`] with the host's binaries for both families, until cancelled (the app's task).
pub async fn run(interval: Duration, cancel: CancellationToken) {
    use plumbing::iptables::ExecRunner;
    let mut tasks = tokio::task::JoinSet::new();
    let runners = vec![ExecRunner::new(IpFamily::V4), ExecRunner::new(IpFamily::V6)];
    start(runners, interval, &mut tasks, &cancel).await;
    while tasks.join_next().await.is_some() {}
}

/// Upstream's `Monitor` for the kubelet canary: create the canaries (retrying every
/// `interval`), poll the mangle one every `interval`; once it is gone, wait up to 5 s for
/// the others to go too, then sync the rules again and start over. Canaries stay on cancel
/// (the kubelet never removes them, as upstream).
pub async fn monitor<R: IptablesRunner>(r: R, interval: Duration, cancel: CancellationToken) {
    let sleep = |d: Duration| {
        let cancel = cancel.clone();
        async move {
            tokio::select! {
                _ = cancel.cancelled() => false,
                _ = tokio::time::sleep(d) => true,
            }
        }
    };
    loop {
        // Set up the canaries, retrying until all three exist.
        loop {
            let mut ok = true;
            for t in CANARY_TABLES {
                if let Err(e) = r.ensure_chain(t, CANARY_CHAIN).await {
                    tracing::error!(error = %e, table = t.as_str(), chain = CANARY_CHAIN, "Could not set up iptables canary");
                    ok = false;
                    break;
                }
            }
            if ok {
                break;
            }
            if !sleep(interval).await {
                return;
            }
        }
        // Poll until the canary is gone.
        loop {
            if !sleep(interval).await {
                return;
            }
            match r.chain_exists(CANARY_TABLES[0], CANARY_CHAIN).await {
                Ok(true) => continue,
                Err(e) => {
                    tracing::error!(error = %e, table = CANARY_TABLES[0].as_str(), chain = CANARY_CHAIN, "Could not check for iptables canary");
                    continue;
                }
                Ok(false) => {}
            }
            tracing::debug!(
                table = CANARY_TABLES[0].as_str(),
                chain = CANARY_CHAIN,
                "IPTables canary deleted"
            );
            if !others_gone(&r).await {
                tracing::info!("Inconsistent iptables state detected");
            }
            break;
        }
        tracing::debug!("Reloading after iptables flush");
        sync_rules(&r).await;
    }
}

/// Waits (up to [`FLUSH_TIMEOUT`]) until the canaries of the other tables are gone too.
async fn others_gone<R: IptablesRunner>(r: &R) -> bool {
    let deadline = tokio::time::Instant::now() + FLUSH_TIMEOUT;
    loop {
        let mut gone = true;
        for t in &CANARY_TABLES[1..] {
            if !matches!(r.chain_exists(*t, CANARY_CHAIN).await, Ok(false)) {
                gone = false;
                break;
            }
        }
        if gone {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(FLUSH_POLL).await;
    }
}

#[cfg(test)]
mod tests;
