//! The sections of [`super::resolve`]: each turns its flags and file fields into validated
//! values with upstream's defaults (explicit flags win over the file).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::{
    ConntrackConfig, Flags, HEALTHZ_PORT, IptablesFile, KubeProxyConfiguration, LocalDetect,
    METRICS_PORT, ProxyMode, Result, cidrs, deprecated_port, duration, flag_or, host_port,
    interface, invalid, ipvs,
};
use crate::model::Cidr;

/// `mode` (`--proxy-mode`).
pub(super) fn mode(flags: &Flags, file: &KubeProxyConfiguration) -> Result<ProxyMode> {
    let mode = flag_or(&flags.proxy_mode, file.mode.clone()).unwrap_or_default();
    match mode.trim() {
        "" | "iptables" => Ok(ProxyMode::Iptables),
        "nftables" => Ok(ProxyMode::Nftables),
        "ipvs" => Ok(ProxyMode::Ipvs),
        m => Err(invalid(
            "mode",
            format!("{m:?} is not a valid proxy mode (iptables, ipvs, nftables)"),
        )),
    }
}

/// `bindAddress`, `healthzBindAddress`, `metricsBindAddress` (None: that server is off).
pub(super) struct Servers {
    pub bind_address: IpAddr,
    pub healthz: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
}

pub(super) fn servers(flags: &Flags, file: &KubeProxyConfiguration) -> Result<Servers> {
    let bind = flag_or(&flags.bind_address, file.bind_address.clone()).unwrap_or_default();
    let bind_address: IpAddr = if bind.trim().is_empty() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        bind.trim()
            .parse()
            .map_err(|_| invalid("bindAddress", format!("{bind:?} is not a valid IP")))?
    };
    let (healthz_ip, metrics_ip) = if bind_address.is_ipv4() {
        (
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
        )
    } else {
        (
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        )
    };
    // The deprecated --healthz-port / --metrics-port: 0 disables the server; another port
    // applies where the address has none (upstream's addressFromDeprecatedFlags).
    let healthz_port = deprecated_port("healthz-port", flags.more.healthz_port, HEALTHZ_PORT)?;
    let healthz = match healthz_port {
        None => None,
        Some(port) => Some(host_port(
            "healthzBindAddress",
            &flag_or(
                &flags.healthz_bind_address,
                file.healthz_bind_address.clone(),
            )
            .unwrap_or_default(),
            healthz_ip,
            port,
        )?),
    };
    let metrics_port = deprecated_port("metrics-port", flags.more.metrics_port, METRICS_PORT)?;
    // An explicitly empty --metrics-bind-address disables the server (upstream's flag help).
    let metrics = match (
        flags.metrics_bind_address.as_deref().map(str::trim),
        metrics_port,
    ) {
        (Some(""), _) | (_, None) => None,
        (_, Some(port)) => Some(host_port(
            "metricsBindAddress",
            &flag_or(
                &flags.metrics_bind_address,
                file.metrics_bind_address.clone(),
            )
            .unwrap_or_default(),
            metrics_ip,
            port,
        )?),
    };
    Ok(Servers {
        bind_address,
        healthz,
        metrics,
    })
}

/// `hostnameOverride` (`--hostname-override`) or the machine's hostname, lower-cased.
pub(super) fn node_name(
    flags: &Flags,
    file: &KubeProxyConfiguration,
    hostname: &str,
) -> Result<String> {
    match flag_or(&flags.hostname_override, file.hostname_override.clone()) {
        Some(h) if !h.trim().is_empty() => Ok(h.trim().to_lowercase()),
        Some(_) if flags.hostname_override.is_some() => Err(invalid(
            "hostnameOverride",
            "empty hostname-override is invalid",
        )),
        _ => Ok(hostname.trim().to_lowercase()),
    }
}

/// `oomScoreAdj` (`--oom-score-adj`, default -999), range-checked.
pub(super) fn oom_score_adj(flags: &Flags, file: &KubeProxyConfiguration) -> Result<i32> {
    let v = match (flags.oom_score_adj, &file.oom_score_adj) {
        (Some(n), _) => n,
        (None, None | Some(serde_json::Value::Null)) => -999,
        (None, Some(v)) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| invalid("oomScoreAdj", format!("{v} is not an integer")))?,
    };
    if !plumbing::oom_score::RANGE.contains(&v) {
        return Err(invalid(
            "oomScoreAdj",
            format!("{v}: must be within the range [-1000, 1000]"),
        ));
    }
    Ok(v)
}

/// `clusterCIDR` (at most one per family).
pub(super) fn cluster_cidrs(flags: &Flags, file: &KubeProxyConfiguration) -> Result<Vec<Cidr>> {
    cidrs(
        "clusterCIDR",
        &flag_or(&flags.cluster_cidr, file.cluster_cidr.clone()).unwrap_or_default(),
    )
}

/// `detectLocalMode` with the interface its mode needs.
pub(super) fn local_detect(flags: &Flags, file: &KubeProxyConfiguration) -> Result<LocalDetect> {
    let detect =
        flag_or(&flags.detect_local_mode, file.detect_local_mode.clone()).unwrap_or_default();
    let dl = file.detect_local.clone().unwrap_or_default();
    match detect.trim() {
        "" | "ClusterCIDR" => Ok(LocalDetect::ClusterCidr),
        "NodeCIDR" => Ok(LocalDetect::NodeCidr),
        "BridgeInterface" => Ok(LocalDetect::BridgeInterface(interface(
            "detectLocal.bridgeInterface",
            flag_or(&flags.pod_bridge_interface, dl.bridge_interface),
        )?)),
        "InterfaceNamePrefix" => Ok(LocalDetect::InterfaceNamePrefix(interface(
            "detectLocal.interfaceNamePrefix",
            flag_or(&flags.pod_interface_name_prefix, dl.interface_name_prefix),
        )?)),
        m => Err(invalid(
            "detectLocalMode",
            format!(
                "{m:?} is not valid (ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix)"
            ),
        )),
    }
}

/// `nodePortAddresses`: CIDRs or `primary`, `localhost`, `all`.
pub(super) fn node_port_addresses(
    flags: &Flags,
    file: &KubeProxyConfiguration,
) -> Result<Vec<String>> {
    let out: Vec<String> = flag_or(&flags.nodeport_addresses, file.node_port_addresses.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    for a in &out {
        let ok = a == "primary"
            || a == "all"
            || a == "localhost"
            || (a.contains('/') && Cidr::parse_or_host(a).is_ok());
        if !ok {
            return Err(invalid(
                "nodePortAddresses",
                format!("{a:?} must be a CIDR or one of primary, localhost, all"),
            ));
        }
    }
    Ok(out)
}

/// The mode's masquerading and sync settings.
pub(super) struct Rules {
    pub masquerade_all: bool,
    pub masquerade_bit: u8,
    pub localhost_node_ports: bool,
    pub localhost_node_ports_ignored: bool,
    pub sync_period: Duration,
    pub min_sync_period: Duration,
}

/// In nftables mode the masquerade and sync settings come from `nftables:` (the
/// `--iptables-*` flags still win, as upstream's flags apply to every mode), and the
/// iptables-only localhostNodePorts has no effect there; in IPVS mode the sync periods come
/// from `ipvs:` (masquerading stays `iptables:`'s, as upstream's IPVS proxier reads it there).
pub(super) fn rules(
    flags: &Flags,
    file: &KubeProxyConfiguration,
    mode: ProxyMode,
) -> Result<Rules> {
    let mut ipt = file.iptables.clone().unwrap_or_default();
    let localhost_asked = flags
        .iptables_localhost_nodeports
        .or(ipt.localhost_node_ports)
        == Some(true);
    if mode == ProxyMode::Nftables {
        let nft = file.nftables.clone().unwrap_or_default();
        ipt = IptablesFile {
            masquerade_bit: nft.masquerade_bit,
            masquerade_all: nft.masquerade_all,
            localhost_node_ports: None,
            sync_period: nft.sync_period,
            min_sync_period: nft.min_sync_period,
        };
    }
    let ipvs_periods = if mode == ProxyMode::Ipvs {
        Some(ipvs::sync_periods(
            flags,
            &file.ipvs.clone().unwrap_or_default(),
        )?)
    } else {
        None
    };
    let bit = flag_or(&flags.iptables_masquerade_bit, ipt.masquerade_bit).unwrap_or(14);
    if !(0..=31).contains(&bit) {
        return Err(invalid(
            "iptables.masqueradeBit",
            format!("{bit} must be within the range [0, 31]"),
        ));
    }
    // The iptables periods are checked in every mode, as they were before IPVS mode read its own.
    let iptables_periods = iptables_sync_periods(flags, &ipt)?;
    let (sync_period, min_sync_period) = ipvs_periods.unwrap_or(iptables_periods);
    Ok(Rules {
        masquerade_all: flag_or(&flags.masquerade_all, ipt.masquerade_all).unwrap_or(false),
        masquerade_bit: bit as u8,
        localhost_node_ports: mode == ProxyMode::Iptables
            && flag_or(
                &flags.iptables_localhost_nodeports,
                ipt.localhost_node_ports,
            )
            .unwrap_or(true),
        localhost_node_ports_ignored: mode != ProxyMode::Iptables && localhost_asked,
        sync_period,
        min_sync_period,
    })
}

/// `iptables.syncPeriod` (default 30 s, > 0) and `iptables.minSyncPeriod` (default 1 s).
fn iptables_sync_periods(flags: &Flags, ipt: &IptablesFile) -> Result<(Duration, Duration)> {
    let sync_period = duration(
        "iptables.syncPeriod",
        flag_or(&flags.iptables_sync_period, ipt.sync_period.clone()).as_deref(),
        Duration::from_secs(30),
    )?;
    if sync_period.is_zero() {
        return Err(invalid("iptables.syncPeriod", "must be greater than 0"));
    }
    // Upstream defaults a zero minSyncPeriod in the file to 1s; an explicit flag of 0 means
    // "sync on every change".
    let min_sync_period = match flags.iptables_min_sync_period.as_deref() {
        Some(s) => duration("iptables.minSyncPeriod", Some(s), Duration::from_secs(1))?,
        None => {
            let d = duration(
                "iptables.minSyncPeriod",
                ipt.min_sync_period.as_deref(),
                Duration::from_secs(1),
            )?;
            if d.is_zero() {
                Duration::from_secs(1)
            } else {
                d
            }
        }
    };
    Ok((sync_period, min_sync_period))
}

/// `conntrack.*` (`--conntrack-*`).
pub(super) fn conntrack(flags: &Flags, file: &KubeProxyConfiguration) -> Result<ConntrackConfig> {
    let ct = file.conntrack.clone().unwrap_or_default();
    let max_per_core = flag_or(&flags.conntrack_max_per_core, ct.max_per_core).unwrap_or(32768);
    let min = flag_or(&flags.conntrack_min, ct.min).unwrap_or(131072);
    if max_per_core < 0 {
        return Err(invalid(
            "conntrack.maxPerCore",
            "must be greater than or equal to 0",
        ));
    }
    if min < 0 {
        return Err(invalid(
            "conntrack.min",
            "must be greater than or equal to 0",
        ));
    }
    let timeout = |field: &str, flag: &Option<String>, file: &Option<String>, default| {
        duration(field, flag_or(flag, file.clone()).as_deref(), default)
    };
    Ok(ConntrackConfig {
        max_per_core,
        min,
        tcp_established_timeout: timeout(
            "conntrack.tcpEstablishedTimeout",
            &flags.conntrack_tcp_timeout_established,
            &ct.tcp_established_timeout,
            Duration::from_secs(24 * 3600),
        )?,
        tcp_close_wait_timeout: timeout(
            "conntrack.tcpCloseWaitTimeout",
            &flags.conntrack_tcp_timeout_close_wait,
            &ct.tcp_close_wait_timeout,
            Duration::from_secs(3600),
        )?,
        tcp_be_liberal: flag_or(&flags.conntrack_tcp_be_liberal, ct.tcp_be_liberal)
            .unwrap_or(false),
        udp_timeout: timeout(
            "conntrack.udpTimeout",
            &flags.conntrack_udp_timeout,
            &ct.udp_timeout,
            Duration::ZERO,
        )?,
        udp_stream_timeout: timeout(
            "conntrack.udpStreamTimeout",
            &flags.conntrack_udp_timeout_stream,
            &ct.udp_stream_timeout,
            Duration::ZERO,
        )?,
    })
}

/// `clientConnection`: the kubeconfig, QPS (default 5) and burst (default 10).
pub(super) struct Client {
    pub kubeconfig: Option<PathBuf>,
    pub qps: f32,
    pub burst: i32,
}

pub(super) fn client(flags: &Flags, file: &KubeProxyConfiguration) -> Result<Client> {
    let cc = file.client_connection.clone().unwrap_or_default();
    let qps = flag_or(&flags.kube_api_qps, cc.qps).unwrap_or(0.0);
    let qps = if qps == 0.0 { 5.0 } else { qps };
    if qps < 0.0 {
        return Err(invalid("clientConnection.qps", "must be >= 0"));
    }
    let burst = flag_or(&flags.kube_api_burst, cc.burst).unwrap_or(0);
    let burst = if burst == 0 { 10 } else { burst };
    if burst < 0 {
        return Err(invalid("clientConnection.burst", "must be >= 0"));
    }
    let kubeconfig = flags.kubeconfig.clone().or(cc
        .kubeconfig
        .filter(|k| !k.trim().is_empty())
        .map(PathBuf::from));
    Ok(Client {
        kubeconfig,
        qps,
        burst,
    })
}
