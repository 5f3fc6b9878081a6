//! `ipvs:` of KubeProxyConfiguration and the `--ipvs-*` flags, resolved into
//! [`IpvsSettings`] and the IPVS mode's sync periods (upstream's v1alpha1 defaults and
//! validation).

use std::time::Duration;

use serde::Deserialize;

use super::{Flags, Result, duration, flag_or, invalid};
use crate::ipvs::{IpvsSettings, SCHEDULERS};
use crate::model::Cidr;

/// `ipvs:` as written (KubeProxyIPVSConfiguration).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpvsFile {
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    pub scheduler: Option<String>,
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    pub strict_arp: Option<bool>,
    pub tcp_timeout: Option<String>,
    pub tcp_fin_timeout: Option<String>,
    pub udp_timeout: Option<String>,
}

/// The IPVS mode's sync periods: `ipvs.syncPeriod` (default 30 s, must be > 0) and
/// `ipvs.minSyncPeriod` (default 0: a change is synced at once, as upstream).
pub fn sync_periods(flags: &Flags, file: &IpvsFile) -> Result<(Duration, Duration)> {
    let sync = duration(
        "ipvs.syncPeriod",
        flag_or(&flags.ipvs_sync_period, file.sync_period.clone()).as_deref(),
        Duration::from_secs(30),
    )?;
    if sync.is_zero() {
        return Err(invalid("ipvs.syncPeriod", "must be greater than 0"));
    }
    let min = duration(
        "ipvs.minSyncPeriod",
        flag_or(&flags.ipvs_min_sync_period, file.min_sync_period.clone()).as_deref(),
        Duration::ZERO,
    )?;
    if min > sync {
        return Err(invalid(
            "ipvs.minSyncPeriod",
            format!("must be less than or equal to ipvs.syncPeriod ({sync:?})"),
        ));
    }
    Ok((sync, min))
}

fn seconds(field: &str, flag: &Option<String>, file: &Option<String>) -> Result<u32> {
    let d = duration(
        field,
        flag_or(flag, file.clone()).as_deref(),
        Duration::ZERO,
    )?;
    u32::try_from(d.as_secs()).map_err(|_| invalid(field, "too large"))
}

/// The `ipvs.*` settings; a scheduler must be one the kernel ships.
pub fn settings(flags: &Flags, file: &IpvsFile) -> Result<IpvsSettings> {
    let scheduler = flag_or(&flags.ipvs_scheduler, file.scheduler.clone())
        .unwrap_or_default()
        .trim()
        .to_string();
    let scheduler = if scheduler.is_empty() {
        crate::ipvs::render::DEFAULT_SCHEDULER.to_string()
    } else if SCHEDULERS.contains(&scheduler.as_str()) {
        scheduler
    } else {
        return Err(invalid(
            "ipvs.scheduler",
            format!(
                "{scheduler:?} is not a valid IPVS scheduler ({})",
                SCHEDULERS.join(", ")
            ),
        ));
    };
    let mut exclude_cidrs = Vec::new();
    for c in flag_or(&flags.ipvs_exclude_cidrs, file.exclude_cidrs.clone())
        .unwrap_or_default()
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
    {
        let cidr: Cidr = Cidr::parse_or_host(c)
            .ok()
            .filter(|_| c.contains('/'))
            .ok_or_else(|| invalid("ipvs.excludeCIDRs", format!("{c:?} is not a valid CIDR")))?;
        exclude_cidrs.push(cidr);
    }
    Ok(IpvsSettings {
        scheduler,
        exclude_cidrs,
        strict_arp: flag_or(&flags.ipvs_strict_arp, file.strict_arp).unwrap_or(false),
        tcp_timeout: seconds(
            "ipvs.tcpTimeout",
            &flags.ipvs_tcp_timeout,
            &file.tcp_timeout,
        )?,
        tcp_fin_timeout: seconds(
            "ipvs.tcpFinTimeout",
            &flags.ipvs_tcpfin_timeout,
            &file.tcp_fin_timeout,
        )?,
        udp_timeout: seconds(
            "ipvs.udpTimeout",
            &flags.ipvs_udp_timeout,
            &file.udp_timeout,
        )?,
    })
}
