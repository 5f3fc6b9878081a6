//! The conntrack edge: removing stale UDP flows after a sync.
//!
//! UDP has no connection teardown, so a conntrack entry that DNATs a client's flow to an
//! endpoint outlives the endpoint. After each successful sync the proxier reconciles, like
//! upstream's `CleanStaleEntries`: for every UDP service port with serving endpoints, flows whose
//! original destination is one of its IPs (cluster, external, load balancer) and port, or its
//! node port, and whose reply source is not a serving endpoint, are deleted. This covers both
//! "endpoint removed" (reply source is the old endpoint) and "service got its first endpoint"
//! (reply source is the service IP itself: the flow was never DNATed).
//!
//! `Conntrack` is the narrow trait; the `ctnetlink` module talks ctnetlink (what the proxy
//! uses in its own namespace), `ExecConntrack` runs the `conntrack` tool (the fallback, and
//! the only way through a command prefix such as `ip netns exec NS`),
//! `fake::FakeConntrack` records calls.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use plumbing::process::{self, RunError};
use thiserror::Error;
use tracing::{debug, warn};

use crate::model::{EndpointInfo, IpFamily, Protocol, ServicePortInfo, ServicePortName};

#[derive(Debug, Error)]
pub enum Error {
    #[error("failed to run {cmd}: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{cmd} exited with {status}: {stderr}")]
    Failed {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("{cmd} did not finish within {after:?}; it was killed")]
    Timeout { cmd: String, after: Duration },
    #[error("injected failure: {0}")]
    Injected(String),
    #[error("{0}")]
    Netlink(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How long one conntrack command may run before it is killed (a listing of a full table of
/// ~1M flows takes seconds).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The part of a UDP conntrack entry the cleanup looks at.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FlowEntry {
    pub orig_dst: IpAddr,
    pub orig_dst_port: u16,
    pub reply_src: IpAddr,
}

/// Which UDP flows to delete (all given fields must match).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Filter {
    /// None: any destination (node port flows).
    pub orig_dst: Option<IpAddr>,
    pub orig_dst_port: u16,
    pub reply_src: IpAddr,
}

impl Filter {
    /// `conntrack -D` arguments after `-f FAMILY -p udp`.
    pub fn args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(d) = self.orig_dst {
            a.extend(["--orig-dst".to_string(), d.to_string()]);
        }
        a.extend([
            "--orig-port-dst".to_string(),
            self.orig_dst_port.to_string(),
            "--reply-src".to_string(),
            self.reply_src.to_string(),
        ]);
        a
    }
}

/// The conntrack operations the proxier needs.
pub trait Conntrack: Send + Sync + 'static {
    /// UDP entries of `family`.
    fn list_udp(&self, family: IpFamily) -> impl Future<Output = Result<Vec<FlowEntry>>> + Send;

    /// Deletes the UDP entries matching `filter`; returns how many went.
    fn delete_udp(
        &self,
        family: IpFamily,
        filter: &Filter,
    ) -> impl Future<Output = Result<usize>> + Send;

    /// Deletes the UDP entries matching any of `filters`; one `delete_udp` per filter unless
    /// the implementation does better (ctnetlink: one dump, then the matching flows).
    fn delete_udp_many(
        &self,
        family: IpFamily,
        filters: &[Filter],
    ) -> impl Future<Output = Result<usize>> + Send {
        async move {
            let mut deleted = 0;
            for f in filters {
                match self.delete_udp(family, f).await {
                    Ok(n) => deleted += n,
                    Err(e) => warn!(error = %e, filter = ?f, "failed to delete conntrack entries"),
                }
            }
            Ok(deleted)
        }
    }
}

/// Used when conntrack cleanup is off (tests of the rules alone).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoConntrack;

impl Conntrack for NoConntrack {
    async fn list_udp(&self, _family: IpFamily) -> Result<Vec<FlowEntry>> {
        Ok(Vec::new())
    }

    async fn delete_udp(&self, _family: IpFamily, _filter: &Filter) -> Result<usize> {
        Ok(0)
    }
}

/// A UDP service port and the endpoint IPs that may answer for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdpTarget {
    /// Cluster IP, load balancer IPs, external IPs.
    pub ips: Vec<IpAddr>,
    pub port: u16,
    /// 0: none.
    pub node_port: u16,
    pub serving: BTreeSet<IpAddr>,
}

/// UDP service ports with at least one serving endpoint (a service without endpoints needs
/// no cleanup: it rejects). Traffic policies and terminating state are deliberately ignored,
/// as upstream does, so UDP behaves like TCP across such changes.
pub fn udp_targets(
    ports: &BTreeMap<ServicePortName, ServicePortInfo>,
    endpoints: &BTreeMap<ServicePortName, Vec<EndpointInfo>>,
) -> Vec<UdpTarget> {
    let mut out = Vec::new();
    for (name, info) in ports {
        if name.protocol != Protocol::Udp {
            continue;
        }
        let serving: BTreeSet<IpAddr> = endpoints
            .get(name)
            .into_iter()
            .flatten()
            .filter(|e| e.serving)
            .map(|e| e.ip)
            .collect();
        if serving.is_empty() {
            continue;
        }
        let mut ips = vec![info.cluster_ip];
        ips.extend(&info.load_balancer_vips);
        ips.extend(&info.external_ips);
        out.push(UdpTarget {
            ips,
            port: info.port,
            node_port: info.node_port,
            serving,
        });
    }
    out
}

/// The deletions needed for `entries` given `targets` (upstream's CleanStaleEntries).
pub fn stale_filters(targets: &[UdpTarget], entries: &[FlowEntry]) -> Vec<Filter> {
    let mut by_ip_port: BTreeMap<(IpAddr, u16), &BTreeSet<IpAddr>> = BTreeMap::new();
    let mut by_node_port: BTreeMap<u16, &BTreeSet<IpAddr>> = BTreeMap::new();
    for t in targets {
        for ip in &t.ips {
            by_ip_port.insert((*ip, t.port), &t.serving);
        }
        if t.node_port != 0 {
            by_node_port.insert(t.node_port, &t.serving);
        }
    }
    let mut out = BTreeSet::new();
    for e in entries {
        if let Some(serving) = by_ip_port.get(&(e.orig_dst, e.orig_dst_port))
            && !serving.contains(&e.reply_src)
        {
            out.insert(Filter {
                orig_dst: Some(e.orig_dst),
                orig_dst_port: e.orig_dst_port,
                reply_src: e.reply_src,
            });
        }
        if let Some(serving) = by_node_port.get(&e.orig_dst_port)
            && !serving.contains(&e.reply_src)
        {
            out.insert(Filter {
                orig_dst: None,
                orig_dst_port: e.orig_dst_port,
                reply_src: e.reply_src,
            });
        }
    }
    out.into_iter().collect()
}

/// Lists, computes and deletes; returns the number of entries deleted. Errors are logged,
/// not returned: cleanup is best effort and retried at the next sync.
pub async fn clean_stale_entries<C: Conntrack>(
    ct: &C,
    family: IpFamily,
    targets: &[UdpTarget],
) -> usize {
    if targets.is_empty() {
        return 0;
    }
    let entries = match ct.list_udp(family).await {
        Ok(e) => e,
        Err(e) => {
            warn!(error = %e, "failed to list conntrack entries");
            return 0;
        }
    };
    let filters = stale_filters(targets, &entries);
    if filters.is_empty() {
        return 0;
    }
    let deleted = match ct.delete_udp_many(family, &filters).await {
        Ok(n) => n,
        Err(e) => {
            warn!(error = %e, "failed to delete conntrack entries");
            0
        }
    };
    if deleted > 0 {
        debug!(deleted, "deleted stale UDP conntrack entries");
    }
    deleted
}

/// Parses `conntrack -L` lines: the first `src=/dst=/sport=/dport=` group is the original
/// direction, the second the reply.
pub fn parse_list(output: &str) -> Vec<FlowEntry> {
    let mut out = Vec::new();
    for line in output.lines() {
        let mut dst = Vec::new();
        let mut src = Vec::new();
        let mut dport = Vec::new();
        for tok in line.split_whitespace() {
            if let Some(v) = tok.strip_prefix("src=") {
                src.push(v);
            } else if let Some(v) = tok.strip_prefix("dst=") {
                dst.push(v);
            } else if let Some(v) = tok.strip_prefix("dport=") {
                dport.push(v);
            }
        }
        let (Some(d), Some(p), Some(r)) = (dst.first(), dport.first(), src.get(1)) else {
            continue;
        };
        let (Ok(orig_dst), Ok(orig_dst_port), Ok(reply_src)) =
            (d.parse(), p.parse(), r.parse::<IpAddr>())
        else {
            continue;
        };
        out.push(FlowEntry {
            orig_dst,
            orig_dst_port,
            reply_src,
        });
    }
    out
}

/// Real implementation: the `conntrack` binary from conntrack-tools.
#[derive(Clone, Debug)]
pub struct ExecConntrack {
    prefix: Vec<String>,
    binary: String,
    timeout: Duration,
}

impl Default for ExecConntrack {
    fn default() -> Self {
        ExecConntrack {
            prefix: Vec::new(),
            binary: "conntrack".into(),
            timeout: COMMAND_TIMEOUT,
        }
    }
}

fn family_arg(f: IpFamily) -> &'static str {
    match f {
        IpFamily::V4 => "ipv4",
        IpFamily::V6 => "ipv6",
    }
}

impl ExecConntrack {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs every command through `prefix` (e.g. `ip netns exec NS`).
    pub fn with_prefix(mut self, prefix: Vec<String>) -> Self {
        self.prefix = prefix;
        self
    }

    /// Kills a command still running after `after` (default [`COMMAND_TIMEOUT`]).
    pub fn with_timeout(mut self, after: Duration) -> Self {
        self.timeout = after;
        self
    }

    async fn run(&self, args: &[String]) -> Result<process::Output> {
        let cmd = process::Command::prefixed(&self.prefix, &self.binary, args, self.timeout);
        let cmd_line = cmd.argv().join(" ");
        cmd.run().await.map_err(|e| match e {
            RunError::Timeout { after } => Error::Timeout {
                cmd: cmd_line,
                after,
            },
            e => Error::Spawn {
                cmd: cmd_line,
                source: e.into_io(),
            },
        })
    }
}

impl Conntrack for ExecConntrack {
    async fn list_udp(&self, family: IpFamily) -> Result<Vec<FlowEntry>> {
        let args: Vec<String> = ["-L", "-f", family_arg(family), "-p", "udp"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let out = self.run(&args).await?;
        if !out.status.success() {
            return Err(Error::Failed {
                cmd: format!("conntrack {}", args.join(" ")),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(parse_list(&String::from_utf8_lossy(&out.stdout)))
    }

    async fn delete_udp(&self, family: IpFamily, filter: &Filter) -> Result<usize> {
        let mut args: Vec<String> = ["-D", "-f", family_arg(family), "-p", "udp"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(filter.args());
        let out = self.run(&args).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        // "N flow entries have been deleted." (exit status 1 when N is 0).
        let n = stderr
            .lines()
            .find(|l| l.contains("flow entries have been deleted"))
            .and_then(|l| l.split_whitespace().find_map(|w| w.parse::<usize>().ok()));
        match (out.status.success(), n) {
            (_, Some(n)) => Ok(n),
            (true, None) => Ok(0),
            (false, None) => Err(Error::Failed {
                cmd: format!("conntrack {}", args.join(" ")),
                status: out.status.to_string(),
                stderr: stderr.trim().to_string(),
            }),
        }
    }
}

#[cfg(any(test, feature = "test-util"))]
pub mod fake;

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_conntrack_list_output() {
        let out = "udp      17 28 src=10.100.0.2 dst=10.96.0.20 sport=40000 dport=53 [UNREPLIED] src=10.244.1.2 dst=10.100.0.2 sport=5353 dport=40000 mark=0 use=1\n\
                   ipv4     2 udp      17 110 src=10.0.0.1 dst=10.96.0.21 sport=1 dport=9 src=10.96.0.21 dst=10.0.0.1 sport=9 dport=1 [ASSURED] mark=0 use=1\n\
                   garbage\n";
        assert_eq!(
            parse_list(out),
            vec![
                FlowEntry {
                    orig_dst: ip("10.96.0.20"),
                    orig_dst_port: 53,
                    reply_src: ip("10.244.1.2")
                },
                FlowEntry {
                    orig_dst: ip("10.96.0.21"),
                    orig_dst_port: 9,
                    reply_src: ip("10.96.0.21")
                },
            ]
        );
    }

    #[test]
    fn stale_flows_are_those_not_answered_by_a_serving_endpoint() {
        let t = UdpTarget {
            ips: vec![ip("10.96.0.10"), ip("192.0.2.1")],
            port: 53,
            node_port: 30053,
            serving: [ip("10.244.0.5")].into(),
        };
        let e = |d: &str, p: u16, r: &str| FlowEntry {
            orig_dst: ip(d),
            orig_dst_port: p,
            reply_src: ip(r),
        };
        let entries = vec![
            e("10.96.0.10", 53, "10.244.0.5"),    // good
            e("10.96.0.10", 53, "10.244.0.9"),    // removed endpoint
            e("10.96.0.10", 53, "10.96.0.10"),    // before the first endpoint
            e("192.0.2.1", 53, "10.244.0.9"),     // external IP, removed endpoint
            e("10.96.0.10", 54, "10.244.0.9"),    // other port: not ours
            e("172.16.0.1", 30053, "10.244.0.9"), // node port, removed endpoint
        ];
        let f = stale_filters(&[t], &entries);
        let expect = |d: Option<&str>, p: u16, r: &str| Filter {
            orig_dst: d.map(ip),
            orig_dst_port: p,
            reply_src: ip(r),
        };
        assert_eq!(
            f,
            vec![
                expect(None, 30053, "10.244.0.9"),
                expect(Some("10.96.0.10"), 53, "10.96.0.10"),
                expect(Some("10.96.0.10"), 53, "10.244.0.9"),
                expect(Some("192.0.2.1"), 53, "10.244.0.9"),
            ]
        );
        assert_eq!(
            f[2].args(),
            vec![
                "--orig-dst",
                "10.96.0.10",
                "--orig-port-dst",
                "53",
                "--reply-src",
                "10.244.0.9"
            ]
        );
    }
}

#[cfg(test)]
mod exec_tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[tokio::test]
    async fn a_hung_conntrack_is_killed_after_its_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let hang = dir.path().join("hang");
        std::fs::write(&hang, "#!/bin/sh\nexec sleep 60\n").unwrap();
        std::fs::set_permissions(&hang, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ct = ExecConntrack::new()
            .with_prefix(vec![hang.display().to_string()])
            .with_timeout(Duration::from_millis(200));
        let started = std::time::Instant::now();
        let e = ct.list_udp(IpFamily::V4).await.unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
