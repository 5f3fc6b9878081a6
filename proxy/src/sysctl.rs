//! The sysctl edge and the kernel settings kube-proxy makes at start (upstream's
//! pkg/proxy/conntrack/sysctls.go and the iptables proxier's route_localnet / br_netfilter
//! checks).
//!
//! `Sysctl` reads and writes one integer key. A key is a path under `/proc/sys` written with
//! slashes (`net/netfilter/nf_conntrack_max`); an absolute path (the conntrack module's
//! `hashsize` parameter under `/sys`) is used as it is. [`ProcSysctl`] does the file I/O of the
//! process's own network namespace on the blocking pool; [`ExecSysctl`] runs `cat`/`sh` through
//! a command prefix (`ip netns exec NS`) so a proxy whose tools run in a namespace also sets
//! that namespace's keys, never the caller's. `fake::FakeSysctl` records writes.
//!
//! A key that cannot be written here (a non-initial network namespace makes
//! `nf_conntrack_max` read-only; a missing module has no key) is one warning naming it: the
//! proxy runs on, where upstream would exit.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use plumbing::process::{self, RunError};
use thiserror::Error;
use tracing::{debug, info, warn};

use crate::config::ConntrackConfig;

#[derive(Debug, Error)]
pub enum Error {
    #[error("sysctl {key} does not exist here")]
    Missing { key: String },
    #[error("sysctl {key} is read-only here")]
    ReadOnly { key: String },
    #[error("sysctl {key}: {source}")]
    Io {
        key: String,
        #[source]
        source: std::io::Error,
    },
    #[error("sysctl {key}: {detail}")]
    Failed { key: String, detail: String },
    #[error("sysctl {key} holds {value:?}, not an integer")]
    Parse { key: String, value: String },
    #[error("sysctl {key} did not answer within {after:?}")]
    Timeout { key: String, after: Duration },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How long one read or write may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// The conntrack module's hash table size (global, writable only from the initial netns).
pub const HASHSIZE: &str = "/sys/module/nf_conntrack/parameters/hashsize";
pub const CONNTRACK_MAX: &str = "net/netfilter/nf_conntrack_max";
pub const TCP_ESTABLISHED: &str = "net/netfilter/nf_conntrack_tcp_timeout_established";
pub const TCP_CLOSE_WAIT: &str = "net/netfilter/nf_conntrack_tcp_timeout_close_wait";
pub const TCP_BE_LIBERAL: &str = "net/netfilter/nf_conntrack_tcp_be_liberal";
pub const UDP_TIMEOUT: &str = "net/netfilter/nf_conntrack_udp_timeout";
pub const UDP_TIMEOUT_STREAM: &str = "net/netfilter/nf_conntrack_udp_timeout_stream";
pub const ROUTE_LOCALNET: &str = "net/ipv4/conf/all/route_localnet";
pub const BRIDGE_NF_CALL_IPTABLES: &str = "net/bridge/bridge-nf-call-iptables";

/// Upstream caps the scaled nf_conntrack_max at 1M entries.
pub const CONNTRACK_MAX_LIMIT: i64 = 1_048_576;

/// Reads and writes one integer kernel setting.
pub trait Sysctl: Send + Sync + 'static {
    fn get(&self, key: &str) -> impl Future<Output = Result<i64>> + Send;
    fn set(&self, key: &str, value: i64) -> impl Future<Output = Result<()>> + Send;
}

fn parse(key: &str, text: &str) -> Result<i64> {
    text.trim().parse().map_err(|_| Error::Parse {
        key: key.to_string(),
        value: text.trim().to_string(),
    })
}

fn io_error(key: &str, e: std::io::Error) -> Error {
    const EROFS: i32 = 30;
    let key = key.to_string();
    match e.kind() {
        std::io::ErrorKind::NotFound => Error::Missing { key },
        std::io::ErrorKind::PermissionDenied => Error::ReadOnly { key },
        _ if e.raw_os_error() == Some(EROFS) => Error::ReadOnly { key },
        _ => Error::Io { key, source: e },
    }
}

/// The real sysctls of this process's network namespace (`/proc/sys`).
#[derive(Clone, Debug)]
pub struct ProcSysctl {
    root: PathBuf,
    timeout: Duration,
}

impl Default for ProcSysctl {
    fn default() -> Self {
        ProcSysctl {
            root: PathBuf::from("/proc/sys"),
            timeout: TIMEOUT,
        }
    }
}

impl ProcSysctl {
    pub fn new() -> Self {
        Self::default()
    }

    /// Resolves relative keys under `root` instead of `/proc/sys` (tests).
    pub fn with_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = root.into();
        self
    }

    fn path(&self, key: &str) -> PathBuf {
        if key.starts_with('/') {
            PathBuf::from(key)
        } else {
            self.root.join(key)
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        key: &str,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, tokio::task::spawn_blocking(f)).await {
            Ok(Ok(r)) => r,
            Ok(Err(join)) => Err(Error::Failed {
                key: key.to_string(),
                detail: join.to_string(),
            }),
            Err(_) => Err(Error::Timeout {
                key: key.to_string(),
                after: self.timeout,
            }),
        }
    }
}

impl Sysctl for ProcSysctl {
    async fn get(&self, key: &str) -> Result<i64> {
        let path = self.path(key);
        let k = key.to_string();
        self.blocking(key, move || {
            let text = std::fs::read_to_string(&path).map_err(|e| io_error(&k, e))?;
            parse(&k, &text)
        })
        .await
    }

    async fn set(&self, key: &str, value: i64) -> Result<()> {
        let path = self.path(key);
        let k = key.to_string();
        self.blocking(key, move || {
            std::fs::write(&path, value.to_string()).map_err(|e| io_error(&k, e))
        })
        .await
    }
}

/// Sysctls of another namespace: `cat` and `sh` run through `prefix` (`ip netns exec NS`).
#[derive(Clone, Debug)]
pub struct ExecSysctl {
    prefix: Vec<String>,
    timeout: Duration,
}

impl ExecSysctl {
    pub fn new(prefix: Vec<String>) -> Self {
        ExecSysctl {
            prefix,
            timeout: TIMEOUT,
        }
    }

    async fn run(&self, key: &str, args: &[String]) -> Result<String> {
        let mut all = self.prefix.clone();
        all.extend(args.iter().cloned());
        let out = process::Command::new(all.clone(), self.timeout)
            .run()
            .await
            .map_err(|e| match e {
                RunError::Timeout { after } => Error::Timeout {
                    key: key.to_string(),
                    after,
                },
                e => Error::Io {
                    key: key.to_string(),
                    source: e.into_io(),
                },
            })?;
        if out.status.success() {
            return Ok(out.stdout_lossy());
        }
        let stderr = out.stderr_lossy().trim().to_string();
        let key = key.to_string();
        Err(if stderr.contains("No such file") {
            Error::Missing { key }
        } else if stderr.contains("Permission denied") || stderr.contains("Read-only") {
            Error::ReadOnly { key }
        } else {
            Error::Failed {
                key,
                detail: format!("{}: {stderr}", all.join(" ")),
            }
        })
    }

    fn path(key: &str) -> String {
        if key.starts_with('/') {
            key.to_string()
        } else {
            format!("/proc/sys/{key}")
        }
    }
}

impl Sysctl for ExecSysctl {
    async fn get(&self, key: &str) -> Result<i64> {
        let out = self.run(key, &["cat".to_string(), Self::path(key)]).await?;
        parse(key, &out)
    }

    async fn set(&self, key: &str, value: i64) -> Result<()> {
        let args = [
            "sh".to_string(),
            "-c".to_string(),
            "printf '%s' \"$1\" > \"$2\"".to_string(),
            "sh".to_string(),
            value.to_string(),
            Self::path(key),
        ];
        self.run(key, &args).await.map(|_| ())
    }
}

/// The sysctls of the namespace the proxy programs: its own (`prefix` empty) or the one the
/// prefix enters.
#[derive(Clone, Debug)]
pub enum NodeSysctl {
    Proc(ProcSysctl),
    Exec(ExecSysctl),
}

impl NodeSysctl {
    pub fn for_prefix(prefix: &[String]) -> Self {
        if prefix.is_empty() {
            NodeSysctl::Proc(ProcSysctl::new())
        } else {
            NodeSysctl::Exec(ExecSysctl::new(prefix.to_vec()))
        }
    }
}

impl Sysctl for NodeSysctl {
    async fn get(&self, key: &str) -> Result<i64> {
        match self {
            NodeSysctl::Proc(s) => s.get(key).await,
            NodeSysctl::Exec(s) => s.get(key).await,
        }
    }

    async fn set(&self, key: &str, value: i64) -> Result<()> {
        match self {
            NodeSysctl::Proc(s) => s.set(key, value).await,
            NodeSysctl::Exec(s) => s.set(key, value).await,
        }
    }
}

/// Upstream's getConntrackMax: `maxPerCore` × CPUs (capped at 1M), floored at `min`; 0 when
/// `maxPerCore` is 0 (leave the key alone).
pub fn conntrack_max(cfg: &ConntrackConfig, num_cpu: usize) -> i64 {
    if cfg.max_per_core <= 0 {
        return 0;
    }
    let scaled = i64::from(cfg.max_per_core) * num_cpu as i64;
    if scaled > CONNTRACK_MAX_LIMIT {
        debug!(
            scaled,
            limit = CONNTRACK_MAX_LIMIT,
            "GetConntrackMax: capping scaled conntrack-max-per-core"
        );
        return CONNTRACK_MAX_LIMIT;
    }
    if scaled > i64::from(cfg.min) {
        debug!("GetConntrackMax: using scaled conntrack-max-per-core");
        scaled
    } else {
        debug!("GetConntrackMax: using conntrack-min");
        i64::from(cfg.min)
    }
}

/// The number of CPUs the machine has (upstream reads the topology from /sys, not the
/// process's affinity or quota): `/sys/devices/system/cpu/online`, else the parallelism.
pub fn num_cpu() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_cpu_list(&s))
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Counts the CPUs of a kernel CPU list such as `0-3,8,10-11`.
pub fn parse_cpu_list(s: &str) -> Option<usize> {
    let mut n = 0;
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                n += b.checked_sub(a)? + 1;
            }
            None => {
                part.parse::<usize>().ok()?;
                n += 1;
            }
        }
    }
    Some(n)
}

/// What a settings pass could not do, one line per key (also logged as warnings).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Warnings(pub Vec<String>);

impl Warnings {
    fn push(&mut self, e: &Error, what: &str) {
        let msg = match e {
            Error::ReadOnly { key } => format!(
                "cannot set {key}: it is read-only here (not the initial network namespace?); {what}"
            ),
            Error::Missing { key } => format!(
                "cannot set {key}: the key does not exist (nf_conntrack module not loaded?); {what}"
            ),
            e => format!("cannot set: {e}; {what}"),
        };
        warn!("{msg}");
        self.0.push(msg);
    }
}

/// Upstream's setIntSysCtl: writes `value` when the key holds something else.
async fn set_int<S: Sysctl>(s: &S, key: &str, value: i64) -> Result<()> {
    if s.get(key).await.ok() != Some(value) {
        info!(entry = key, value, "Set sysctl");
        s.set(key, value).await?;
    }
    Ok(())
}

/// Upstream's SetMax, never lowering a larger value already set: nf_conntrack_max, then the
/// hash table grown to max/4 when smaller.
async fn set_max<S: Sysctl>(s: &S, max: i64, warnings: &mut Warnings) {
    info!(nf_conntrack_max = max, "Setting nf_conntrack_max");
    match s.get(CONNTRACK_MAX).await {
        Ok(cur) if cur >= max => {
            info!(
                current = cur,
                wanted = max,
                "nf_conntrack_max already at least the wanted value; not lowered"
            );
            return;
        }
        _ => {}
    }
    if let Err(e) = s.set(CONNTRACK_MAX, max).await {
        warnings.push(&e, "the node keeps its conntrack table size");
        return;
    }
    let hashsize = match s.get(HASHSIZE).await {
        Ok(h) => h,
        Err(e) => {
            warnings.push(&e, "the conntrack hash table size is not checked");
            return;
        }
    };
    if hashsize >= max / 4 {
        return;
    }
    info!(conntrack_hashsize = max / 4, "Setting conntrack hashsize");
    if let Err(e) = s.set(HASHSIZE, max / 4).await {
        warnings.push(
            &e,
            "the conntrack hash table stays smaller than nf_conntrack_max/4 (lookups get slower as the table fills)",
        );
    }
}

/// Sets the conntrack sysctls from the configuration, in upstream's order; a zero or unset
/// value leaves its key alone. Never fails: what cannot be set is a warning.
pub async fn set_conntrack_sysctls<S: Sysctl>(
    s: &S,
    cfg: &ConntrackConfig,
    num_cpu: usize,
) -> Warnings {
    let mut warnings = Warnings::default();
    let max = conntrack_max(cfg, num_cpu);
    if max > 0 {
        set_max(s, max, &mut warnings).await;
    }
    let timeouts = [
        (TCP_ESTABLISHED, cfg.tcp_established_timeout),
        (TCP_CLOSE_WAIT, cfg.tcp_close_wait_timeout),
    ];
    for (key, d) in timeouts {
        if d.as_secs() > 0
            && let Err(e) = set_int(s, key, d.as_secs() as i64).await
        {
            warnings.push(&e, "the kernel's value stays");
        }
    }
    if cfg.tcp_be_liberal
        && let Err(e) = set_int(s, TCP_BE_LIBERAL, 1).await
    {
        warnings.push(&e, "the kernel's value stays");
    }
    let udp = [
        (UDP_TIMEOUT, cfg.udp_timeout),
        (UDP_TIMEOUT_STREAM, cfg.udp_stream_timeout),
    ];
    for (key, d) in udp {
        if d.as_secs() > 0
            && let Err(e) = set_int(s, key, d.as_secs() as i64).await
        {
            warnings.push(&e, "the kernel's value stays");
        }
    }
    warnings
}

/// The iptables mode's route_localnet=1 (upstream's PrivilegedInit), asked for only when
/// IPv4 is programmed, localhostNodePorts is on and nodePortAddresses takes 127.0.0.1.
/// Without it the kernel drops packets DNATed away from 127.0.0.1 as martians.
pub async fn ensure_route_localnet<S: Sysctl>(s: &S) -> Warnings {
    let mut warnings = Warnings::default();
    info!(
        "Setting route_localnet=1 to allow node-ports on localhost; to change this either disable iptables.localhostNodePorts (--iptables-localhost-nodeports) or set nodePortAddresses (--nodeport-addresses) to filter loopback addresses"
    );
    if let Err(e) = set_int(s, ROUTE_LOCALNET, 1).await {
        warnings.push(&e, "NodePorts do not answer on 127.0.0.1");
    }
    warnings
}

/// Upstream's check for bridged pods: bridge-nf-call-iptables must be 1 for bridged traffic
/// to traverse the proxy's rules. Returns the line logged, if any.
pub async fn check_bridge_nf_call_iptables<S: Sysctl>(s: &S) -> Option<String> {
    let msg = match s.get(BRIDGE_NF_CALL_IPTABLES).await {
        Ok(1) => return None,
        Ok(_) => "Missing br-netfilter module or unset sysctl br-nf-call-iptables, proxy may not work as intended".to_string(),
        Err(Error::Missing { .. }) => "br_netfilter module not loaded (no net/bridge/bridge-nf-call-iptables): traffic between pods on one Linux bridge bypasses the proxy's rules".to_string(),
        Err(e) => {
            debug!(error = %e, "cannot read bridge-nf-call-iptables");
            return None;
        }
    };
    warn!("{msg}");
    Some(msg)
}

/// Upstream reads nf_conntrack_tcp_be_liberal once: when set, the iptables rules skip the
/// DROP of INVALID packets.
pub async fn tcp_be_liberal<S: Sysctl>(s: &S) -> bool {
    let on = matches!(s.get(TCP_BE_LIBERAL).await, Ok(v) if v != 0);
    if on {
        info!("nf_conntrack_tcp_be_liberal set, not installing DROP rules for INVALID packets");
    }
    on
}

pub const VS_CONNTRACK: &str = "net/ipv4/vs/conntrack";
pub const VS_CONN_REUSE_MODE: &str = "net/ipv4/vs/conn_reuse_mode";
pub const VS_EXPIRE_NODEST_CONN: &str = "net/ipv4/vs/expire_nodest_conn";
pub const VS_EXPIRE_QUIESCENT_TEMPLATE: &str = "net/ipv4/vs/expire_quiescent_template";
pub const IP_FORWARD: &str = "net/ipv4/ip_forward";
pub const ARP_IGNORE: &str = "net/ipv4/conf/all/arp_ignore";
pub const ARP_ANNOUNCE: &str = "net/ipv4/conf/all/arp_announce";

/// The IPVS mode's settings, in upstream's order (pkg/proxy/ipvs NewProxier):
/// `net/ipv4/vs/conntrack=1`; `conn_reuse_mode=0` on kernels 4.1 to 5.8 (before 4.1 the
/// key does not exist, from 5.9 on the kernel's default is right: left alone);
/// `expire_nodest_conn=1`, `expire_quiescent_template=1`, `ip_forward=1`; with
/// `ipvs.strictARP`, `arp_ignore=1` and `arp_announce=2`. `kernel` is (major, minor).
pub async fn set_ipvs_sysctls<S: Sysctl>(
    s: &S,
    strict_arp: bool,
    kernel: Option<(u32, u32)>,
) -> Warnings {
    let mut warnings = Warnings::default();
    let mut keys: Vec<(&str, i64)> = vec![(VS_CONNTRACK, 1)];
    match kernel {
        Some(v) if v < (4, 1) => warn!(
            sysctl = VS_CONN_REUSE_MODE,
            minimum_kernel_version = "4.1",
            "Can't set sysctl, kernel version doesn't satisfy minimum version requirements"
        ),
        Some(v) if v >= (5, 9) => debug!(sysctl = VS_CONN_REUSE_MODE, "Left as-is"),
        _ => keys.push((VS_CONN_REUSE_MODE, 0)),
    }
    keys.extend([
        (VS_EXPIRE_NODEST_CONN, 1),
        (VS_EXPIRE_QUIESCENT_TEMPLATE, 1),
        (IP_FORWARD, 1),
    ]);
    if strict_arp {
        keys.extend([(ARP_IGNORE, 1), (ARP_ANNOUNCE, 2)]);
    }
    for (key, value) in keys {
        if let Err(e) = set_int(s, key, value).await {
            warnings.push(&e, "IPVS mode may not work as intended");
        }
    }
    warnings
}

/// (major, minor) of a kernel release string such as `6.18.44-fc-v782`.
pub fn parse_kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(any(test, feature = "test-util"))]
pub mod fake;

#[cfg(test)]
mod tests;
