//! The IPVS backend (upstream's pkg/proxy/ipvs, deprecated upstream since v1.35): every
//! service address is an IPVS virtual server whose real servers are the endpoints; cluster,
//! external and load-balancer IPs sit on the dummy interface `kube-ipvs0` so the kernel takes
//! them as local; ipsets (`KUBE-CLUSTER-IP`, `KUBE-NODE-PORT-TCP`, …) and a small fixed
//! iptables part do the masquerading and filtering.
//!
//! - netlink framing and the blocking socket are [`crate::netlink`], shared with ctnetlink;
//! - [`genl`]: IPVS generic netlink messages; [`rtnl`]: the dummy interface's requests and
//!   operations, over the shared rtnetlink wrapper `plumbing::rtnl::Rtnl`;
//! - [`kernel`]: the OS edge ([`IpvsKernel`], batches of operations; [`NetlinkIpvs`]);
//! - [`ipset`]: the sets, their `ipset restore` texts and the [`Ipset`] edge;
//! - [`render`]: desired state (pure); [`proxier`]: [`IpvsBackend`], this mode's
//!   [`crate::proxier::Backend`], and [`IpvsProxier`], the generic proxier over it.
//!
//! [`check_support`] is upstream's CanUseIPVSProxier; [`cleanup`] what `--cleanup` and a
//! switch to another mode remove.

#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod genl;
pub mod ipset;
pub mod kernel;
pub mod proxier;
pub mod render;
pub mod rtnl;

#[cfg(test)]
mod tests;

use thiserror::Error;
use tracing::{info, warn};

pub use ipset::{ExecIpset, Ipset};
pub use kernel::{IpvsKernel, NetlinkIpvs};
pub use proxier::{IpvsBackend, IpvsProxier};
pub use render::IpvsSettings;

use genl::VirtualServer;
use kernel::{Answer, Op, PROBE_VS};

/// Upstream's start-up line for this mode (logged at error level, as upstream does).
pub const DEPRECATION: &str = "The ipvs proxier is now deprecated and may be removed in a future release. Please use 'nftables' instead.";

/// The schedulers the kernel ships (`ip_vs_<name>` modules).
pub const SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos",
];

/// Why the IPVS mode cannot run here.
#[derive(Debug, Error)]
#[error("can't use the IPVS proxier: {0}")]
pub struct Unsupported(pub String);

/// Upstream's CanUseIPVSProxier, plus the dummy interface: `ipset` at least 6.0; IPVS in
/// the kernel (the generic netlink family exists); the scheduler usable (a virtual server
/// already uses it, or a probe one on 198.51.100.0:20000 can be made with it); dummy
/// interfaces available.
pub async fn check_support<K: IpvsKernel, S: Ipset>(
    kernel: &K,
    ipset_tool: &S,
    scheduler: &str,
) -> Result<(), Unsupported> {
    let v = ipset_tool
        .version()
        .await
        .map_err(|e| Unsupported(format!("error getting ipset version, error: {e}")))?;
    match ipset::parse_version(&v) {
        Some(have) if have >= ipset::MIN_IPSET_VERSION => {}
        _ => {
            return Err(Unsupported(format!(
                "ipset version: {} is less than min required version: 6.0",
                v.trim()
            )));
        }
    }
    let scheduler = if scheduler.is_empty() {
        render::DEFAULT_SCHEDULER
    } else {
        scheduler
    };
    let mut r = kernel.batch(vec![Op::ListServices]).await;
    let existing = match r.pop() {
        Some(Ok(Answer::Services(v))) => v,
        Some(Err(e)) => {
            return Err(Unsupported(format!(
                "ipvs not supported by the kernel: {e}"
            )));
        }
        _ => Vec::new(),
    };
    if !existing.iter().any(|vs| vs.scheduler == scheduler) {
        let probe = VirtualServer {
            key: PROBE_VS,
            scheduler: scheduler.to_string(),
            flags: 0,
            timeout: 0,
        };
        let mut r = kernel
            .batch(vec![Op::AddService(probe), Op::DeleteService(PROBE_VS)])
            .await
            .into_iter();
        if let Some(Err(e)) = r.next() {
            return Err(Unsupported(format!(
                "could not create a virtual server with scheduler {scheduler:?} (kernel module ip_vs_{scheduler} missing?): {e}"
            )));
        }
    }
    if let Some(Err(e)) = kernel.batch(vec![Op::EnsureDummy]).await.pop() {
        return Err(Unsupported(e.to_string()));
    }
    Ok(())
}

/// What a cleanup removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    pub virtual_servers: usize,
    pub dummy: bool,
    pub sets: usize,
}

/// Whether a previous IPVS-mode run left `kube-ipvs0` behind.
pub async fn leftovers_present<K: IpvsKernel>(kernel: &K) -> bool {
    matches!(
        kernel
            .batch(vec![Op::DummyAddrs(crate::model::IpFamily::V4)])
            .await
            .pop(),
        Some(Ok(Answer::Addrs(Some(_))))
    )
}

/// Upstream's CleanupLeftovers without the iptables part (the caller removes kube-proxy's
/// chains first, since a set still matched by a rule cannot be destroyed): every virtual
/// server, `kube-ipvs0`, then the sets of both families. A missing IPVS or ipset is
/// nothing to clean.
pub async fn cleanup<K: IpvsKernel, S: Ipset>(kernel: &K, ipset_tool: &S) -> Cleaned {
    let mut out = Cleaned::default();
    if let Some(Ok(Answer::Services(v))) = kernel.batch(vec![Op::ListServices]).await.pop() {
        let ops: Vec<Op> = v.iter().map(|vs| Op::DeleteService(vs.key)).collect();
        for r in kernel.batch(ops).await {
            match r {
                Ok(_) => out.virtual_servers += 1,
                Err(e) => warn!(error = %e, "IPVS virtual server not removed"),
            }
        }
    }
    match kernel.batch(vec![Op::DeleteDummy]).await.pop() {
        Some(Ok(Answer::Existed(e))) => out.dummy = e,
        Some(Err(e)) => warn!(error = %e, "kube-ipvs0 not removed"),
        _ => {}
    }
    if let Ok(names) = ipset_tool.list_names().await {
        let mut text = String::new();
        for f in [crate::model::IpFamily::V4, crate::model::IpFamily::V6] {
            text.push_str(&ipset::destroy_text(f, &names));
        }
        out.sets = text.lines().count();
        if !text.is_empty()
            && let Err(e) = ipset_tool.restore(&text).await
        {
            warn!(error = %e, "IPVS mode's ipsets not removed");
            out.sets = 0;
        }
    }
    info!(
        virtual_servers = out.virtual_servers,
        dummy = out.dummy,
        sets = out.sets,
        "IPVS leftovers removed"
    );
    out
}
