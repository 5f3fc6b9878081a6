//! The IPVS mode's ipsets (upstream's names, types and comments), the `ipset restore` text
//! that brings them from one content to the next, and the OS edge ([`Ipset`]: the `ipset`
//! binary, one `ipset restore` per sync, with a timeout). The fake is
//! `fake::FakeIpset`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use plumbing::process::{self, RunError};
use thiserror::Error;

use crate::model::IpFamily;

#[derive(Debug, Error)]
pub enum Error {
    #[error("running {cmd}: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{cmd} failed ({status}): {stderr}")]
    Failed {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("{cmd} timed out after {after:?}")]
    Timeout { cmd: String, after: Duration },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The kinds of set kube-proxy uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetType {
    HashIpPort,
    HashIpPortIp,
    HashIpPortNet,
    BitmapPort,
}

impl SetType {
    pub fn as_str(self) -> &'static str {
        match self {
            SetType::HashIpPort => "hash:ip,port",
            SetType::HashIpPortIp => "hash:ip,port,ip",
            SetType::HashIpPortNet => "hash:ip,port,net",
            SetType::BitmapPort => "bitmap:port",
        }
    }
}

/// One of upstream's sets: its IPv4 name (IPv6 sets are `KUBE-6-…`), type and comment.
#[derive(Clone, Copy, Debug)]
pub struct SetDef {
    pub name: &'static str,
    pub kind: SetType,
    pub comment: &'static str,
}

const fn def(name: &'static str, kind: SetType, comment: &'static str) -> SetDef {
    SetDef {
        name,
        kind,
        comment,
    }
}

pub const LOOP_BACK: &str = "KUBE-LOOP-BACK";
pub const CLUSTER_IP: &str = "KUBE-CLUSTER-IP";
pub const EXTERNAL_IP: &str = "KUBE-EXTERNAL-IP";
pub const EXTERNAL_IP_LOCAL: &str = "KUBE-EXTERNAL-IP-LOCAL";
pub const LOAD_BALANCER: &str = "KUBE-LOAD-BALANCER";
pub const LOAD_BALANCER_LOCAL: &str = "KUBE-LOAD-BALANCER-LOCAL";
pub const LOAD_BALANCER_FW: &str = "KUBE-LOAD-BALANCER-FW";
pub const LOAD_BALANCER_SOURCE_IP: &str = "KUBE-LOAD-BALANCER-SOURCE-IP";
pub const LOAD_BALANCER_SOURCE_CIDR: &str = "KUBE-LOAD-BALANCER-SOURCE-CIDR";
pub const NODE_PORT_TCP: &str = "KUBE-NODE-PORT-TCP";
pub const NODE_PORT_LOCAL_TCP: &str = "KUBE-NODE-PORT-LOCAL-TCP";
pub const NODE_PORT_UDP: &str = "KUBE-NODE-PORT-UDP";
pub const NODE_PORT_LOCAL_UDP: &str = "KUBE-NODE-PORT-LOCAL-UDP";
pub const NODE_PORT_SCTP: &str = "KUBE-NODE-PORT-SCTP-HASH";
pub const NODE_PORT_LOCAL_SCTP: &str = "KUBE-NODE-PORT-LOCAL-SCTP-HASH";
pub const HEALTH_CHECK_NODE_PORT: &str = "KUBE-HEALTH-CHECK-NODE-PORT";

/// Every set, in upstream's order (pkg/proxy/ipvs/ipset.go).
pub const SETS: &[SetDef] = &[
    def(
        LOOP_BACK,
        SetType::HashIpPortIp,
        "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
    ),
    def(
        CLUSTER_IP,
        SetType::HashIpPort,
        "Kubernetes service cluster ip + port for masquerade purpose",
    ),
    def(
        EXTERNAL_IP,
        SetType::HashIpPort,
        "Kubernetes service external ip + port for masquerade and filter purpose",
    ),
    def(
        EXTERNAL_IP_LOCAL,
        SetType::HashIpPort,
        "Kubernetes service external ip + port with externalTrafficPolicy=local",
    ),
    def(
        LOAD_BALANCER,
        SetType::HashIpPort,
        "Kubernetes service lb portal",
    ),
    def(
        LOAD_BALANCER_LOCAL,
        SetType::HashIpPort,
        "Kubernetes service load balancer ip + port with externalTrafficPolicy=local",
    ),
    def(
        LOAD_BALANCER_FW,
        SetType::HashIpPort,
        "Kubernetes service load balancer ip + port for load balancer with sourceRange",
    ),
    def(
        LOAD_BALANCER_SOURCE_IP,
        SetType::HashIpPortIp,
        "Kubernetes service load balancer ip + port + source IP for packet filter purpose",
    ),
    def(
        LOAD_BALANCER_SOURCE_CIDR,
        SetType::HashIpPortNet,
        "Kubernetes service load balancer ip + port + source cidr for packet filter purpose",
    ),
    def(
        NODE_PORT_TCP,
        SetType::BitmapPort,
        "Kubernetes nodeport TCP port for masquerade purpose",
    ),
    def(
        NODE_PORT_LOCAL_TCP,
        SetType::BitmapPort,
        "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
    ),
    def(
        NODE_PORT_UDP,
        SetType::BitmapPort,
        "Kubernetes nodeport UDP port for masquerade purpose",
    ),
    def(
        NODE_PORT_LOCAL_UDP,
        SetType::BitmapPort,
        "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
    ),
    def(
        NODE_PORT_SCTP,
        SetType::HashIpPort,
        "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'",
    ),
    def(
        NODE_PORT_LOCAL_SCTP,
        SetType::HashIpPort,
        "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'",
    ),
    def(
        HEALTH_CHECK_NODE_PORT,
        SetType::BitmapPort,
        "Kubernetes health check node port",
    ),
];

/// The set's name in `family`: IPv6 sets are `KUBE-6-…`, cut to ipset's 31 characters.
pub fn set_name(base: &str, family: IpFamily) -> String {
    match family {
        IpFamily::V4 => base.to_string(),
        IpFamily::V6 => {
            let mut n = base.replacen("KUBE-", "KUBE-6-", 1);
            n.truncate(31);
            n
        }
    }
}

fn create_line(out: &mut String, name: &str, d: &SetDef, family: IpFamily) {
    let _ = match d.kind {
        // Port bitmaps hold node ports of both families: upstream creates them as IPv4.
        SetType::BitmapPort => writeln!(
            out,
            "create {name} bitmap:port range 0-65535 comment -exist"
        ),
        k => writeln!(
            out,
            "create {name} {} family {} hashsize 1024 maxelem 65536 comment -exist",
            k.as_str(),
            match family {
                IpFamily::V4 => "inet",
                IpFamily::V6 => "inet6",
            }
        ),
    };
}

/// Contents of every set (by base name), as `ipset` entry strings.
pub type SetContents = BTreeMap<&'static str, BTreeSet<String>>;

/// The restore text that writes `want` afresh: each set filled under a temporary name and
/// swapped in, so that no set is ever seen empty or half-filled.
pub fn replace_text(family: IpFamily, want: &SetContents) -> String {
    let mut out = String::new();
    for (i, d) in SETS.iter().enumerate() {
        let name = set_name(d.name, family);
        let tmp = match family {
            IpFamily::V4 => format!("KUBE-TMP-{i}"),
            IpFamily::V6 => format!("KUBE-6-TMP-{i}"),
        };
        create_line(&mut out, &name, d, family);
        create_line(&mut out, &tmp, d, family);
        let _ = writeln!(out, "flush {tmp}");
        for e in want.get(d.name).into_iter().flatten() {
            let _ = writeln!(out, "add {tmp} {e} -exist");
        }
        let _ = writeln!(out, "swap {tmp} {name}");
        let _ = writeln!(out, "destroy {tmp}");
    }
    out
}

/// The restore text from `have` to `want`: deletions, then additions (empty when equal).
pub fn diff_text(family: IpFamily, have: &SetContents, want: &SetContents) -> String {
    let empty = BTreeSet::new();
    let mut out = String::new();
    for d in SETS {
        let name = set_name(d.name, family);
        let (h, w) = (
            have.get(d.name).unwrap_or(&empty),
            want.get(d.name).unwrap_or(&empty),
        );
        for e in h.difference(w) {
            let _ = writeln!(out, "del {name} {e} -exist");
        }
        for e in w.difference(h) {
            let _ = writeln!(out, "add {name} {e} -exist");
        }
    }
    out
}

/// The restore text that destroys every set of `family` named in `present` (`--cleanup`).
pub fn destroy_text(family: IpFamily, present: &[String]) -> String {
    let mut out = String::new();
    for d in SETS {
        let name = set_name(d.name, family);
        if present.contains(&name) {
            let _ = writeln!(out, "destroy {name}");
        }
    }
    out
}

/// The ipset tool.
pub trait Ipset: Send + Sync + 'static {
    /// `ipset restore` of `text` (one process; stops at the first failing line).
    fn restore(&self, text: &str) -> impl Future<Output = Result<()>> + Send;
    /// `ipset list -n`: every set's name.
    fn list_names(&self) -> impl Future<Output = Result<Vec<String>>> + Send;
    /// `ipset version`'s output.
    fn version(&self) -> impl Future<Output = Result<String>> + Send;
}

/// The `ipset` binary, through a command prefix (empty in production).
#[derive(Clone, Debug, Default)]
pub struct ExecIpset {
    prefix: Vec<String>,
}

/// Timeout of one `ipset` command: 30 s, plus 30 s per MiB of restore text.
pub fn ipset_timeout(bytes: usize) -> Duration {
    Duration::from_secs(30 + 30 * (bytes as u64 >> 20))
}

impl ExecIpset {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_prefix(mut self, prefix: Vec<String>) -> Self {
        self.prefix = prefix;
        self
    }

    async fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let mut argv: Vec<String> = self.prefix.clone();
        argv.push("ipset".into());
        argv.extend(args.iter().map(|s| s.to_string()));
        let cmd = argv.join(" ");
        let after = ipset_timeout(stdin.map_or(0, str::len));
        let mut c = process::Command::new(argv, after);
        if let Some(text) = stdin {
            c = c.stdin(text.as_bytes());
        }
        let out = match c.run().await {
            Err(RunError::Timeout { after }) => return Err(Error::Timeout { cmd, after }),
            Err(e) => {
                return Err(Error::Spawn {
                    cmd,
                    source: e.into_io(),
                });
            }
            Ok(o) => o,
        };
        if !out.status.success() {
            return Err(Error::Failed {
                cmd,
                status: out.status.to_string(),
                stderr: out.stderr_lossy().trim().to_string(),
            });
        }
        Ok(out.stdout_lossy())
    }
}

impl Ipset for ExecIpset {
    async fn restore(&self, text: &str) -> Result<()> {
        self.run(&["restore"], Some(text)).await.map(|_| ())
    }

    async fn list_names(&self) -> Result<Vec<String>> {
        let out = self.run(&["list", "-n"], None).await?;
        Ok(out.lines().map(|l| l.trim().to_string()).collect())
    }

    async fn version(&self) -> Result<String> {
        self.run(&["version"], None).await
    }
}

/// Upstream's minimum (`MinIPSetCheckVersion`): IPv6 sets came with ipset 6.
pub const MIN_IPSET_VERSION: (u32, u32) = (6, 0);

/// The `X.Y` of `ipset version` output (`ipset v7.17, protocol version: 7`).
pub fn parse_version(out: &str) -> Option<(u32, u32)> {
    let v = out.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let v = v.trim_end_matches(',');
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_default();
    Some((major, minor))
}
