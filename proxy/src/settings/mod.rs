//! Every flag and config field the agent accepts, with what it does here.
//!
//! The rule: no setting is accepted and silently ignored. A setting either works as upstream's
//! ([`Status::Implemented`]), or it has no effect here and one warning names it at start when it
//! is set to a value other than upstream's default ([`Status::NotImplemented`]), or it is
//! security-relevant and not provided, so the agent refuses to start when it is set to such a
//! value ([`Status::Refused`]).
//!
//! The machinery here ([`Setting`], [`check_file`], [`check_flags`], [`markdown_table`]) is
//! shared with the kubelet, which keeps its own registry in `kubelet::settings`; [`FLAGS`] and
//! [`FIELDS`] are kube-proxy's. `docs/settings.md` is generated from both registries.

use serde_json::Value;

/// What the agent does with a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Works as upstream's.
    Implemented,
    /// Accepted, has no effect: one warning at start when set to a value not in `ok`.
    NotImplemented,
    /// Security-relevant and not provided: the agent refuses to start when it is set to a value
    /// not in `ok`.
    Refused,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Implemented => "Implemented",
            Status::NotImplemented => "NotImplemented",
            Status::Refused => "Refused",
        }
    }
}

/// One flag (`--name`) or config field (`name`, nested ones as `outer.inner`).
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub name: &'static str,
    pub status: Status,
    /// Values (YAML scalars or `{}`/`[]`) that need no warning or refusal: upstream's default,
    /// the zero value upstream's defaulting replaces by it, and values whose behaviour the agent
    /// provides. An absent, `null`, `""`, `{}` or `[]` value is never "set".
    pub ok: &'static [&'static str],
    pub note: &'static str,
}

/// Shorthands for registry tables.
pub const fn implemented(name: &'static str, note: &'static str) -> Setting {
    Setting {
        name,
        status: Status::Implemented,
        ok: &[],
        note,
    }
}

pub const fn not_implemented(
    name: &'static str,
    ok: &'static [&'static str],
    note: &'static str,
) -> Setting {
    Setting {
        name,
        status: Status::NotImplemented,
        ok,
        note,
    }
}

pub const fn refused(
    name: &'static str,
    ok: &'static [&'static str],
    note: &'static str,
) -> Setting {
    Setting {
        name,
        status: Status::Refused,
        ok,
        note,
    }
}

/// What checking the settings found: warnings to log, and refusals that stop the start.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Findings {
    pub warnings: Vec<String>,
    pub refusals: Vec<String>,
}

impl Findings {
    pub fn extend(&mut self, other: Findings) {
        self.warnings.extend(other.warnings);
        self.refusals.extend(other.refusals);
    }
}

fn is_unset(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.trim().to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Whether two scalars mean the same: as booleans (Go's spellings), numbers, Go durations, or
/// text.
fn same_scalar(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    if let (Some(x), Some(y)) = (plumbing::go::parse_bool(a), plumbing::go::parse_bool(b)) {
        return x == y;
    }
    if let (Ok(x), Ok(y)) = (a.parse::<f64>(), b.parse::<f64>()) {
        return x == y;
    }
    if let (Some(x), Some(y)) = (
        plumbing::duration::parse_go_duration(a),
        plumbing::duration::parse_go_duration(b),
    ) {
        return x == y;
    }
    false
}

fn parse_ok(text: &str) -> Value {
    serde_saphyr::from_str::<Value>(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

/// Whether `v` needs no warning or refusal under `s`.
pub fn is_ok(s: &Setting, v: &Value) -> bool {
    if is_unset(v) {
        return true;
    }
    s.ok.iter().any(|o| {
        let o = parse_ok(o);
        if &o == v {
            return true;
        }
        match (scalar_text(&o), scalar_text(v)) {
            (Some(a), Some(b)) => same_scalar(&a, &b),
            _ => false,
        }
    })
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn judge(s: &Setting, v: &Value, what: &str, out: &mut Findings) {
    if is_ok(s, v) {
        return;
    }
    match s.status {
        Status::Implemented => {}
        Status::NotImplemented => out.warnings.push(format!(
            "{what} {} is set to {} but has no effect in this agent: {}",
            s.name,
            show(v),
            s.note
        )),
        Status::Refused => out.refusals.push(format!(
            "{what} {} is set to {}, which this agent does not provide: {}",
            s.name,
            show(v),
            s.note
        )),
    }
}

/// Checks a config file (already known to parse) against the registry `fields`: warnings for
/// NotImplemented fields set to non-default values and for fields the registry does not know
/// (upstream's lenient decoding drops those, with a message), refusals for Refused ones.
pub fn check_file(fields: &[Setting], kind: &str, text: &str) -> Findings {
    let mut out = Findings::default();
    let Ok(root) = serde_saphyr::from_str_with_options::<Value>(
        text,
        serde_saphyr::options! { legacy_octal_numbers: true },
    ) else {
        return out;
    };
    if let Value::Object(m) = &root {
        walk(fields, kind, "", m, &mut out);
    }
    out
}

fn walk(
    fields: &[Setting],
    kind: &str,
    prefix: &str,
    obj: &serde_json::Map<String, Value>,
    out: &mut Findings,
) {
    for (k, v) in obj {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if let Some(s) = fields.iter().find(|s| s.name == path) {
            judge(s, v, "field", out);
            continue;
        }
        let child = format!("{path}.");
        if fields.iter().any(|s| s.name.starts_with(&child)) {
            if let Value::Object(m) = v {
                walk(fields, kind, &path, m, out);
            }
            continue;
        }
        out.warnings.push(format!(
            "unknown field {path:?}: not a {kind} field this agent knows; ignored"
        ));
    }
}

/// Checks the flags given on the command line (`(name without dashes, raw value)`).
pub fn check_flags(flags: &[Setting], given: &[(String, String)]) -> Findings {
    let mut out = Findings::default();
    for (name, raw) in given {
        let dashed = format!("--{name}");
        if let Some(s) = flags.iter().find(|s| s.name == dashed) {
            judge(s, &Value::String(raw.clone()), "flag", &mut out);
        }
    }
    out
}

/// The flags given explicitly on the command line, as `(long name, raw value)`.
pub fn given_flags(cmd: &clap::Command, m: &clap::ArgMatches) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if m.value_source(id) != Some(clap::parser::ValueSource::CommandLine) {
            continue;
        }
        let Some(long) = arg.get_long() else {
            continue;
        };
        let raw = m
            .get_raw(id)
            .map(|vals| {
                vals.map(|v| v.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        out.push((long.to_string(), raw));
    }
    out
}

/// A markdown table of a registry.
pub fn markdown_table(settings: &[Setting]) -> String {
    let mut s = String::from("| Setting | Status | Note |\n|---|---|---|\n");
    for e in settings {
        let ok = if e.ok.is_empty() || e.status == Status::Implemented {
            String::new()
        } else {
            format!(
                " (no warning for: {})",
                e.ok.iter()
                    .map(|o| format!("`{o}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        s.push_str(&format!(
            "| `{}` | {} | {}{} |\n",
            e.name,
            e.status.as_str(),
            e.note.replace('|', "\\|"),
            ok
        ));
    }
    s
}

use Status::*;

/// A registry entry (short to write: the registries are long tables of these).
pub const fn s(
    name: &'static str,
    status: Status,
    ok: &'static [&'static str],
    note: &'static str,
) -> Setting {
    Setting {
        name,
        status,
        ok,
        note,
    }
}

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
        "Only ClusterCIDR; the other modes are refused with an error.",
    ),
    s(
        "--pod-bridge-interface",
        Implemented,
        &[],
        "Used only by detect-local-mode BridgeInterface (refused), as upstream.",
    ),
    s(
        "--pod-interface-name-prefix",
        Implemented,
        &[],
        "Used only by detect-local-mode InterfaceNamePrefix (refused), as upstream.",
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
        "feature gates are not read.",
    ),
    s(
        "--oom-score-adj",
        NotImplemented,
        &["-999"],
        "the process's OOM score is not changed.",
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
        NotImplemented,
        &["text"],
        "logs are always text.",
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
        "feature gates are not read.",
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
        "Only ClusterCIDR; the other modes are refused with an error.",
    ),
    s(
        "detectLocal.bridgeInterface",
        Implemented,
        &[],
        "Used only by BridgeInterface mode (refused), as upstream.",
    ),
    s(
        "detectLocal.interfaceNamePrefix",
        Implemented,
        &[],
        "Used only by InterfaceNamePrefix mode (refused), as upstream.",
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
        NotImplemented,
        &["-999"],
        "the process's OOM score is not changed.",
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
        NotImplemented,
        &["text"],
        "logs are always text.",
    ),
    s(
        "logging.flushFrequency",
        NotImplemented,
        &["5s", "0"],
        "logs are written unbuffered.",
    ),
    s(
        "logging.verbosity",
        NotImplemented,
        &["0"],
        "verbosity comes from --v (or RUST_LOG) only.",
    ),
    s(
        "logging.vmodule",
        NotImplemented,
        &[],
        "per-file verbosity is not supported; use RUST_LOG.",
    ),
    s(
        "logging.options.json.infoBufferSize",
        NotImplemented,
        &["0"],
        "logs are always text.",
    ),
    s(
        "logging.options.json.splitStream",
        NotImplemented,
        &["false"],
        "logs are always text.",
    ),
    s(
        "logging.options.text.infoBufferSize",
        NotImplemented,
        &["0"],
        "logs are written unbuffered.",
    ),
    s(
        "logging.options.text.splitStream",
        NotImplemented,
        &["false"],
        "all logs go to stderr.",
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
