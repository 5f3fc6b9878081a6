//! Pod sysctl admission, as upstream's `pkg/kubelet/sysctl`: a pod may set the safe sysctls
//! and those matching `allowedUnsafeSysctls`; anything else is rejected with reason
//! `SysctlForbidden`. Network sysctls are refused on hostNetwork pods, IPC ones on hostIPC
//! pods (they would change the node's own namespace).

use k8s_openapi::api::core::v1::Pod;

/// The admission reason upstream gives a pod with a forbidden sysctl.
pub const FORBIDDEN_REASON: &str = "SysctlForbidden";

/// Upstream's safe sysctls (v1.36 SafeSysctlAllowlist; each is namespaced and cannot affect
/// other pods or the node). The kernel-version gates upstream applies are all below 4.15.
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// The kernel namespace a sysctl lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Namespace {
    Ipc,
    Net,
}

impl Namespace {
    fn as_str(self) -> &'static str {
        match self {
            Namespace::Ipc => "IPC",
            Namespace::Net => "Net",
        }
    }
}

/// Which namespace `name` (dotted) belongs to; None for sysctls that are node-wide.
pub fn namespaced_by(name: &str) -> Option<Namespace> {
    if name == "kernel.sem" {
        return Some(Namespace::Ipc);
    }
    for (prefix, ns) in [
        ("kernel.shm", Namespace::Ipc),
        ("kernel.msg", Namespace::Ipc),
        ("fs.mqueue.", Namespace::Ipc),
        ("net.", Namespace::Net),
    ] {
        if name.starts_with(prefix) {
            return Some(ns);
        }
    }
    None
}

/// A sysctl name with `/` separators turned into the dotted form (`net/ipv4/conf/eth0.1/x`
/// is `net.ipv4.conf.eth0/1.x`), as upstream's NormalizeName.
pub fn normalize(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '/' => '.',
                '.' => '/',
                c => c,
            })
            .collect(),
        _ => name.to_string(),
    }
}

fn valid_pattern(p: &str) -> bool {
    let body = p.strip_suffix('*').unwrap_or(p);
    let segment_ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_'))
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
    };
    if p.ends_with('*') {
        // `net.*` or `kernel.shm*`: segments, the last possibly empty or partial.
        let mut parts: Vec<&str> = body.split(['.', '/']).collect();
        let last = parts.pop().unwrap_or("");
        parts.iter().all(|s| segment_ok(s))
            && (last.is_empty()
                || last
                    .bytes()
                    .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_')))
            && !body.is_empty()
    } else {
        body.split(['.', '/']).all(segment_ok)
    }
}

/// The safe sysctls plus `allowedUnsafeSysctls` (exact names or `prefix*` patterns).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    exact: Vec<(String, Namespace)>,
    prefixes: Vec<(String, Namespace)>,
}

impl Allowlist {
    /// Upstream's NewAllowlist over the safe list and `unsafe_patterns`; a pattern that is
    /// malformed or names a sysctl not known to be namespaced is an error (the kubelet does
    /// not start).
    pub fn new(unsafe_patterns: &[String]) -> Result<Self, String> {
        let mut list = Allowlist::default();
        for p in SAFE_SYSCTLS
            .iter()
            .map(|s| s.to_string())
            .chain(unsafe_patterns.iter().cloned())
        {
            let p = normalize(&p);
            if !valid_pattern(&p) {
                return Err(format!(
                    "sysctl {p:?} must have at most 253 characters and match the regex ^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$ (optionally ending in *)"
                ));
            }
            let Some(ns) = namespaced_by(p.trim_end_matches('*')) else {
                return Err(format!("the sysctls {p:?} are not known to be namespaced"));
            };
            match p.strip_suffix('*') {
                Some(prefix) => list.prefixes.push((prefix.to_string(), ns)),
                None => list.exact.push((p, ns)),
            }
        }
        Ok(list)
    }

    /// Whether the pod may set `name`, with upstream's error text when not.
    pub fn validate(&self, name: &str, host_net: bool, host_ipc: bool) -> Result<(), String> {
        let name = normalize(name);
        let check = |ns: Namespace| match ns {
            Namespace::Ipc if host_ipc => Err(format!(
                "{name:?} not allowed with host {} enabled",
                ns.as_str()
            )),
            Namespace::Net if host_net => Err(format!(
                "{name:?} not allowed with host {} enabled",
                ns.as_str()
            )),
            _ => Ok(()),
        };
        if let Some((_, ns)) = self.exact.iter().find(|(n, _)| *n == name) {
            return check(*ns);
        }
        if let Some((_, ns)) = self
            .prefixes
            .iter()
            .find(|(p, _)| name.starts_with(p.as_str()))
        {
            return check(*ns);
        }
        Err(format!("{name:?} not allowlisted"))
    }

    /// Admission: `Err((reason, message))` for the first forbidden sysctl of the pod.
    pub fn admit(&self, pod: &Pod) -> Result<(), (String, String)> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let host_net = spec.host_network.unwrap_or(false);
        let host_ipc = spec.host_ipc.unwrap_or(false);
        let sysctls = spec
            .security_context
            .as_ref()
            .and_then(|s| s.sysctls.as_ref());
        for s in sysctls.into_iter().flatten() {
            self.validate(&s.name, host_net, host_ipc).map_err(|e| {
                (
                    FORBIDDEN_REASON.to_string(),
                    format!("forbidden sysctl: {e}"),
                )
            })?;
        }
        Ok(())
    }
}

/// Splits `pods` into the admitted ones and the rejected ones with their reason and message
/// (static pods, which no apiserver admission sees).
pub fn partition(list: &Allowlist, pods: Vec<Pod>) -> (Vec<Pod>, Vec<(Pod, String, String)>) {
    let mut admitted = Vec::new();
    let mut rejected = Vec::new();
    for p in pods {
        match list.admit(&p) {
            Ok(()) => admitted.push(p),
            Err((reason, message)) => rejected.push((p, reason, message)),
        }
    }
    (admitted, rejected)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(sysctls: &[&str], host_net: bool) -> Pod {
        let list: Vec<_> = sysctls
            .iter()
            .map(|n| serde_json::json!({"name": n, "value": "1"}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"hostNetwork": host_net, "securityContext": {"sysctls": list},
                     "containers": [{"name": "c", "image": "i:1"}]}
        }))
        .unwrap()
    }

    #[test]
    fn safe_sysctls_pass_and_others_are_forbidden_with_upstreams_message() {
        let a = Allowlist::new(&[]).unwrap();
        assert_eq!(
            a.admit(&pod(
                &["net.ipv4.ip_local_port_range", "kernel.shm_rmid_forced"],
                false
            )),
            Ok(())
        );
        assert_eq!(
            a.admit(&pod(&["net.core.somaxconn"], false)),
            Err((
                "SysctlForbidden".into(),
                "forbidden sysctl: \"net.core.somaxconn\" not allowlisted".into()
            ))
        );
        // A namespaced net sysctl on a hostNetwork pod would change the node's own.
        assert_eq!(
            a.admit(&pod(&["net.ipv4.tcp_syncookies"], true))
                .unwrap_err()
                .1,
            "forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host Net enabled"
        );
        let (ok, bad) = partition(&a, vec![pod(&[], false), pod(&["kernel.sem"], false)]);
        assert_eq!((ok.len(), bad.len()), (1, 1));
        assert_eq!(bad[0].1, "SysctlForbidden");
        // Slash-separated names are normalized first.
        assert_eq!(a.admit(&pod(&["net/ipv4/tcp_syncookies"], false)), Ok(()));
    }

    #[test]
    fn unsafe_patterns_allow_exact_names_and_prefixes() {
        let a = Allowlist::new(&["net.core.somaxconn".into(), "kernel.msg*".into()]).unwrap();
        assert_eq!(a.validate("net.core.somaxconn", false, false), Ok(()));
        assert_eq!(a.validate("kernel.msgmax", false, false), Ok(()));
        assert!(
            a.validate("kernel.msgmax", false, true)
                .unwrap_err()
                .contains("host IPC")
        );
        assert!(a.validate("net.core.rmem_max", false, false).is_err());
    }

    #[test]
    fn patterns_outside_a_namespace_or_malformed_are_refused() {
        let e = Allowlist::new(&["kernel.panic".into()]).unwrap_err();
        assert!(e.contains("not known to be namespaced"), "{e}");
        assert!(Allowlist::new(&["Net.Core".into()]).is_err());
        assert!(Allowlist::new(&["net.*".into()]).is_ok());
        assert_eq!(
            normalize("net/ipv4/conf/eth0.1/rp_filter"),
            "net.ipv4.conf.eth0/1.rp_filter"
        );
    }
}
