//! Every flag and config field kube-proxy accepts, with what it does here: [`FLAGS`] and
//! [`FIELDS`]. The rule and the machinery are `plumbing::settings`.

use Status::*;
pub use plumbing::settings::{
    Findings, Setting, Status, check_file, check_flags, given_flags, implemented, markdown_table,
    not_implemented, refused, s,
};

/// kube-proxy's flags.
pub const FLAGS: &[Setting] = &[
    s("--config", Implemented, &[], "KubeProxyConfiguration file."),
    s("--version", Implemented, &[], "Prints the version."),
    s(
        "--cleanup",
        Implemented,
        &[],
        "Removes the proxy's rules and exits.",
    ),
    s("--kubeconfig", Implemented, &[], "Apiserver credentials."),
    s("--master", Implemented, &[], "Apiserver address override."),
    s("--kube-api-qps", Implemented, &[], "Client rate limit."),
    s("--kube-api-burst", Implemented, &[], "Client burst."),
    s(
        "--kube-api-content-type",
        NotImplemented,
        &["application/vnd.kubernetes.protobuf"],
        "the client always speaks JSON.",
    ),
    s("--hostname-override", Implemented, &[], "Node name."),
    s(
        "--bind-address",
        Implemented,
        &[],
        "Primary IP family and default server addresses.",
    ),
    s(
        "--healthz-bind-address",
        Implemented,
        &[],
        "Health server address.",
    ),
    s(
        "--metrics-bind-address",
        Implemented,
        &[],
        "Metrics server address (empty disables).",
    ),
    s(
        "--proxy-mode",
        Implemented,
        &[],
        "iptables (default, also for \"\"), nftables, and ipvs (deprecated upstream; its deprecation warning is logged; refused with a clear error where the kernel lacks ip_vs, a scheduler module, dummy interfaces, or where ipset is missing).",
    ),
    s(
        "--cluster-cidr",
        Implemented,
        &[],
        "Pod CIDRs for local-traffic detection.",
    ),
    s(
        "--nodeport-addresses",
        Implemented,
        &[],
        "NodePort addresses.",
    ),
    s(
        "--masquerade-all",
        Implemented,
        &[],
        "SNAT all service traffic.",
    ),
    s("--iptables-masquerade-bit", Implemented, &[], "fwmark bit."),
    s(
        "--iptables-localhost-nodeports",
        Implemented,
        &[],
        "NodePorts on localhost (iptables mode; warned about in nftables mode, which has none).",
    ),
    s(
        "--iptables-sync-period",
        Implemented,
        &[],
        "Full resync period.",
    ),
    s(
        "--iptables-min-sync-period",
        Implemented,
        &[],
        "Minimum time between syncs.",
    ),
    s(
        "--detect-local-mode",
        Implemented,
        &[],
        "ClusterCIDR (source in clusterCIDR), NodeCIDR (source in the Node's spec.podCIDRs, followed as the Node changes; no local detection until it has one), BridgeInterface (-i <bridge> / nft iifname <bridge>) and InterfaceNamePrefix (-i <prefix>+ / iifname <prefix>*), in iptables, nftables and ipvs modes as upstream.",
    ),
    s(
        "--pod-bridge-interface",
        Implemented,
        &[],
        "The bridge of detect-local-mode BridgeInterface (required by it; over detectLocal.bridgeInterface).",
    ),
    s(
        "--pod-interface-name-prefix",
        Implemented,
        &[],
        "The prefix of detect-local-mode InterfaceNamePrefix (required by it; over detectLocal.interfaceNamePrefix).",
    ),
    implemented(
        "--ipvs-scheduler",
        "rr (default), wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq, mh, …",
    ),
    implemented("--ipvs-sync-period", "Full resync period (ipvs mode)."),
    implemented(
        "--ipvs-min-sync-period",
        "Minimum time between syncs (ipvs mode).",
    ),
    implemented(
        "--ipvs-exclude-cidrs",
        "IPVS state in these CIDRs is never removed.",
    ),
    implemented("--ipvs-strict-arp", "arp_ignore=1, arp_announce=2."),
    implemented("--ipvs-tcp-timeout", "IPVS TCP timeout (0: kernel's)."),
    implemented(
        "--ipvs-tcpfin-timeout",
        "IPVS TCP FIN timeout (0: kernel's).",
    ),
    implemented("--ipvs-udp-timeout", "IPVS UDP timeout (0: kernel's)."),
    s(
        "--conntrack-max-per-core",
        Implemented,
        &[],
        "nf_conntrack_max = max(maxPerCore x CPUs, min), capped at 1048576; only raised, never lowered.",
    ),
    s(
        "--conntrack-min",
        Implemented,
        &[],
        "Floor of nf_conntrack_max.",
    ),
    s(
        "--conntrack-tcp-timeout-established",
        Implemented,
        &[],
        "nf_conntrack_tcp_timeout_established (0: untouched).",
    ),
    s(
        "--conntrack-tcp-timeout-close-wait",
        Implemented,
        &[],
        "nf_conntrack_tcp_timeout_close_wait (0: untouched).",
    ),
    s(
        "--conntrack-tcp-be-liberal",
        Implemented,
        &[],
        "nf_conntrack_tcp_be_liberal=1 when set.",
    ),
    s(
        "--conntrack-udp-timeout",
        Implemented,
        &[],
        "nf_conntrack_udp_timeout (0: untouched).",
    ),
    s(
        "--conntrack-udp-timeout-stream",
        Implemented,
        &[],
        "nf_conntrack_udp_timeout_stream (0: untouched).",
    ),
    s("--v", Implemented, &[], "Log verbosity."),
    s(
        "--feature-gates",
        NotImplemented,
        &[],
        "Checked as upstream: an unknown gate, or a locked gate set against its lock, exits 1 (\"unrecognized feature gate: X\"); known gates change nothing here.",
    ),
    s(
        "--oom-score-adj",
        Implemented,
        &[],
        "Written to the process's oom_score_adj at start (default -999); a failure (no CAP_SYS_RESOURCE) is logged and the proxy goes on, as upstream.",
    ),
    s(
        "--config-sync-period",
        NotImplemented,
        &["15m"],
        "watches are not resynced periodically.",
    ),
    s(
        "--profiling",
        NotImplemented,
        &["false"],
        "no pprof handlers are served.",
    ),
    s(
        "--bind-address-hard-fail",
        NotImplemented,
        &["false"],
        "a failed server bind is logged, not fatal.",
    ),
    s(
        "--logging-format",
        Implemented,
        &[],
        "klog text lines (the default: `Lmmdd hh:mm:ss.uuuuuu pid file:line] \"msg\" key=\"value\"`, the time in UTC) or component-base's JSON (`ts`, `caller`, `msg`, `v`, `err`, the key/values); another value is refused at start. Flags win over the file. The kubelet's hosted proxy role (`--proxy-config`) logs through the kubelet's logger and names a `logging` block of its file in a warning at start.",
    ),
    s(
        "--write-config-to",
        Implemented,
        &[],
        "Writes upstream's default KubeProxyConfiguration (v1alpha1, Linux) to the file and exits, as upstream (flags given beside it are not folded in).",
    ),
    s(
        "--init-only",
        Implemented,
        &[],
        "Exits 0 after checking the configuration: this proxy applies its kernel settings (conntrack sysctls) when it starts, so there is no separate privileged step; run the proxy itself with the privileges it needs.",
    ),
    s(
        "--healthz-port",
        Implemented,
        &[],
        "Deprecated upstream: 0 turns the health server off; another port is used where --healthz-bind-address (or healthzBindAddress) has none.",
    ),
    s(
        "--metrics-port",
        Implemented,
        &[],
        "Deprecated upstream: 0 turns the metrics server off; another port is used where --metrics-bind-address (or metricsBindAddress) has none.",
    ),
    s(
        "--show-hidden-metrics-for-version",
        NotImplemented,
        &[],
        "no metric is hidden, so there is nothing to show again.",
    ),
    s(
        "--vmodule",
        Implemented,
        &[],
        "klog's `pattern=N`: the glob matches the source file's name without `.rs` (for a `mod.rs` also its folder's name; with `/`, the path); first match wins.",
    ),
    s(
        "--log-flush-frequency",
        NotImplemented,
        &["5s"],
        "logs are written unbuffered.",
    ),
    s(
        "--log-text-split-stream",
        Implemented,
        &[],
        "errors to stderr, other lines to stdout (when the format is text).",
    ),
    s(
        "--log-text-info-buffer-size",
        NotImplemented,
        &["0"],
        "logs are written unbuffered.",
    ),
    s(
        "--log-json-split-stream",
        Implemented,
        &[],
        "errors to stderr, other lines to stdout (when the format is json).",
    ),
    s(
        "--log-json-info-buffer-size",
        NotImplemented,
        &["0"],
        "lines are written unbuffered (each line in one write).",
    ),
    s(
        "--boot-id-file",
        NotImplemented,
        &["/proc/sys/kernel/random/boot_id"],
        "kube-proxy reads no boot ID (a cAdvisor flag upstream's binary carries).",
    ),
    s(
        "--machine-id-file",
        NotImplemented,
        &["/etc/machine-id,/var/lib/dbus/machine-id"],
        "kube-proxy reads no machine ID (a cAdvisor flag upstream's binary carries).",
    ),
    s(
        "--static-services-dir",
        Implemented,
        &[],
        "Not upstream: Services/EndpointSlices from files instead of an apiserver.",
    ),
];

/// KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1) fields.
pub const FIELDS: &[Setting] = &[
    s(
        "apiVersion",
        Implemented,
        &[],
        "Must be kubeproxy.config.k8s.io/v1alpha1.",
    ),
    s("kind", Implemented, &[], "Must be KubeProxyConfiguration."),
    s(
        "featureGates",
        NotImplemented,
        &[],
        "Checked as upstream: an unknown gate, or a locked gate set against its lock, exits 1 (\"unrecognized feature gate: X\"); known gates change nothing here.",
    ),
    s(
        "clientConnection.kubeconfig",
        Implemented,
        &[],
        "Apiserver credentials.",
    ),
    s(
        "clientConnection.qps",
        Implemented,
        &[],
        "Client rate limit.",
    ),
    s("clientConnection.burst", Implemented, &[], "Client burst."),
    s(
        "clientConnection.contentType",
        NotImplemented,
        &["application/vnd.kubernetes.protobuf"],
        "the client always speaks JSON.",
    ),
    s(
        "clientConnection.acceptContentTypes",
        NotImplemented,
        &[],
        "the client always speaks JSON.",
    ),
    s("hostnameOverride", Implemented, &[], "Node name."),
    s(
        "bindAddress",
        Implemented,
        &[],
        "Primary IP family and default server addresses.",
    ),
    s(
        "healthzBindAddress",
        Implemented,
        &[],
        "Health server address.",
    ),
    s(
        "metricsBindAddress",
        Implemented,
        &[],
        "Metrics server address.",
    ),
    s(
        "bindAddressHardFail",
        NotImplemented,
        &["false"],
        "a failed server bind is logged, not fatal.",
    ),
    s(
        "enableProfiling",
        NotImplemented,
        &["false"],
        "no pprof handlers are served.",
    ),
    s(
        "showHiddenMetricsForVersion",
        NotImplemented,
        &[],
        "hidden metrics are not served.",
    ),
    s(
        "mode",
        Implemented,
        &[],
        "iptables (default, also for \"\"), nftables, and ipvs (deprecated upstream; its deprecation warning is logged; refused with a clear error where the kernel lacks ip_vs, a scheduler module, dummy interfaces, or where ipset is missing).",
    ),
    s(
        "iptables.masqueradeAll",
        Implemented,
        &[],
        "SNAT all service traffic.",
    ),
    s("iptables.masqueradeBit", Implemented, &[], "fwmark bit."),
    s(
        "iptables.localhostNodePorts",
        Implemented,
        &[],
        "NodePorts on localhost (iptables mode; warned about in nftables mode, which has none).",
    ),
    s(
        "iptables.syncPeriod",
        Implemented,
        &[],
        "Full resync period.",
    ),
    s(
        "iptables.minSyncPeriod",
        Implemented,
        &[],
        "Minimum time between syncs.",
    ),
    s(
        "syncPeriod",
        NotImplemented,
        &["0s", "30s"],
        "the top-level spelling is not read; iptables.syncPeriod is.",
    ),
    s(
        "minSyncPeriod",
        NotImplemented,
        &["0s", "1s"],
        "the top-level spelling is not read; iptables.minSyncPeriod is.",
    ),
    implemented(
        "ipvs.scheduler",
        "rr (default), wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq, mh, …",
    ),
    implemented("ipvs.syncPeriod", "Full resync period (ipvs mode)."),
    implemented(
        "ipvs.minSyncPeriod",
        "Minimum time between syncs (ipvs mode).",
    ),
    implemented(
        "ipvs.excludeCIDRs",
        "IPVS state in these CIDRs is never removed.",
    ),
    implemented("ipvs.strictARP", "arp_ignore=1, arp_announce=2."),
    implemented("ipvs.tcpTimeout", "IPVS TCP timeout (0: kernel's)."),
    implemented("ipvs.tcpFinTimeout", "IPVS TCP FIN timeout (0: kernel's)."),
    implemented("ipvs.udpTimeout", "IPVS UDP timeout (0: kernel's)."),
    s(
        "nftables.masqueradeAll",
        Implemented,
        &[],
        "SNAT all service traffic (nftables mode; ignored in iptables mode, as upstream).",
    ),
    s(
        "nftables.masqueradeBit",
        Implemented,
        &[],
        "fwmark bit (nftables mode).",
    ),
    s(
        "nftables.syncPeriod",
        Implemented,
        &[],
        "Full resync period (nftables mode).",
    ),
    s(
        "nftables.minSyncPeriod",
        Implemented,
        &[],
        "Minimum time between syncs (nftables mode).",
    ),
    s(
        "winkernel",
        Implemented,
        &[],
        "Windows only; upstream ignores it on Linux too.",
    ),
    s(
        "windowsRunAsService",
        Implemented,
        &[],
        "Windows only; upstream ignores it on Linux too.",
    ),
    s(
        "detectLocalMode",
        Implemented,
        &[],
        "ClusterCIDR (source in clusterCIDR), NodeCIDR (source in the Node's spec.podCIDRs, followed as the Node changes; no local detection until it has one), BridgeInterface (-i <bridge> / nft iifname <bridge>) and InterfaceNamePrefix (-i <prefix>+ / iifname <prefix>*), in iptables, nftables and ipvs modes as upstream.",
    ),
    s(
        "detectLocal.bridgeInterface",
        Implemented,
        &[],
        "The bridge of BridgeInterface mode (required by it).",
    ),
    s(
        "detectLocal.interfaceNamePrefix",
        Implemented,
        &[],
        "The prefix of InterfaceNamePrefix mode (required by it).",
    ),
    s(
        "clusterCIDR",
        Implemented,
        &[],
        "Pod CIDRs for local-traffic detection.",
    ),
    s("nodePortAddresses", Implemented, &[], "NodePort addresses."),
    s(
        "oomScoreAdj",
        Implemented,
        &[],
        "As --oom-score-adj; outside -1000..1000 the start stops.",
    ),
    s(
        "conntrack.maxPerCore",
        Implemented,
        &[],
        "nf_conntrack_max = max(maxPerCore x CPUs, min), capped at 1048576; only raised, never lowered.",
    ),
    s(
        "conntrack.min",
        Implemented,
        &[],
        "Floor of nf_conntrack_max.",
    ),
    s(
        "conntrack.tcpEstablishedTimeout",
        Implemented,
        &[],
        "nf_conntrack_tcp_timeout_established (0: untouched).",
    ),
    s(
        "conntrack.tcpCloseWaitTimeout",
        Implemented,
        &[],
        "nf_conntrack_tcp_timeout_close_wait (0: untouched).",
    ),
    s(
        "conntrack.tcpBeLiberal",
        Implemented,
        &[],
        "nf_conntrack_tcp_be_liberal=1 when true.",
    ),
    s(
        "conntrack.udpTimeout",
        Implemented,
        &[],
        "nf_conntrack_udp_timeout (0: untouched).",
    ),
    s(
        "conntrack.udpStreamTimeout",
        Implemented,
        &[],
        "nf_conntrack_udp_timeout_stream (0: untouched).",
    ),
    s(
        "configSyncPeriod",
        NotImplemented,
        &["15m", "0s"],
        "watches are not resynced periodically.",
    ),
    s(
        "portRange",
        NotImplemented,
        &[],
        "removed upstream; no effect.",
    ),
    s(
        "logging.format",
        Implemented,
        &[],
        "klog text lines (the default: `Lmmdd hh:mm:ss.uuuuuu pid file:line] \"msg\" key=\"value\"`, the time in UTC) or component-base's JSON (`ts`, `caller`, `msg`, `v`, `err`, the key/values); another value is refused at start. Flags win over the file. The kubelet's hosted proxy role (`--proxy-config`) logs through the kubelet's logger and names a `logging` block of its file in a warning at start.",
    ),
    s(
        "logging.flushFrequency",
        NotImplemented,
        &["5s", "0"],
        "logs are written unbuffered.",
    ),
    s(
        "logging.verbosity",
        Implemented,
        &[],
        "klog verbosity: ERROR, WARN and INFO lines are v0, DEBUG v2, TRACE v5; --v wins; RUST_LOG, when set, chooses at start.",
    ),
    s(
        "logging.vmodule",
        Implemented,
        &[],
        "A list of filePattern and verbosity; klog's `pattern=N`: the glob matches the source file's name without `.rs` (for a `mod.rs` also its folder's name; with `/`, the path); first match wins.",
    ),
    s(
        "logging.options.json.infoBufferSize",
        NotImplemented,
        &["0"],
        "lines are written unbuffered (each line in one write).",
    ),
    s(
        "logging.options.json.splitStream",
        Implemented,
        &[],
        "errors to stderr, other lines to stdout (when the format is json).",
    ),
    s(
        "logging.options.text.infoBufferSize",
        NotImplemented,
        &["0"],
        "logs are written unbuffered.",
    ),
    s(
        "logging.options.text.splitStream",
        Implemented,
        &[],
        "errors to stderr, other lines to stdout (when the format is text).",
    ),
];

/// Warnings and refusals for kube-proxy's flags and config file text.
pub fn check(given: &[(String, String)], file_text: Option<&str>) -> Findings {
    let mut out = check_flags(FLAGS, given);
    if let Some(t) = file_text {
        out.extend(check_file(FIELDS, "KubeProxyConfiguration", t));
    }
    out
}

#[cfg(test)]
mod tests;
