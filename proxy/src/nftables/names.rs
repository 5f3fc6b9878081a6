//! nftables object names, as upstream's pkg/proxy/nftables names them: per-service chains
//! `service-`, `local-`, `external-`, `firewall-` + `HASH-ns/name/proto/port`, per-endpoint
//! `endpoint-`/`affinity-` + `HASH-ns/name/proto/port__ip/port`, where `HASH` is the first 8
//! characters of base32(sha256(the rest)), and names longer than 256 characters are cut to
//! 253 plus `...`.

use sha2::{Digest, Sha256};

use crate::iptables::chains::push_base32;
use crate::model::ServicePortName;

/// The table of each family (`ip kube-proxy`, `ip6 kube-proxy`).
pub const TABLE: &str = "kube-proxy";

pub const CLUSTER_IPS: &str = "cluster-ips";
pub const NODEPORT_IPS: &str = "nodeport-ips";
pub const SERVICE_IPS: &str = "service-ips";
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const FIREWALL_IPS: &str = "firewall-ips";

pub const MARK_MASQ: &str = "mark-for-masquerade";
pub const REJECT_CHAIN: &str = "reject-chain";
/// The fixed chain the periodic check lists (a few rules): gone means someone removed the
/// table or flushed it.
pub const SERVICES: &str = "services";

const CHAIN_NAME_MAX: usize = 256;

/// `HASH-name`, cut to 256 characters as upstream's hashAndTruncate.
pub fn hash_and_truncate(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let mut out = String::with_capacity(name.len() + 9);
    // 8 base32 characters are the first 5 bytes.
    push_base32(&mut out, &digest[..5]);
    out.push('-');
    out.push_str(name);
    if out.len() > CHAIN_NAME_MAX {
        let mut cut = CHAIN_NAME_MAX - 3;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}

/// The per-service chain names of one service port; they share one hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceNames {
    pub cluster: String,
    pub local: String,
    pub external: String,
    pub firewall: String,
    /// `ns/name/proto/port`: the endpoint names extend it.
    base: String,
}

impl ServiceNames {
    pub fn new(name: &ServicePortName) -> Self {
        let base = format!(
            "{}/{}/{}/{}",
            name.service.namespace,
            name.service.name,
            name.protocol.lower(),
            name.port
        );
        let hashed = hash_and_truncate(&base);
        ServiceNames {
            cluster: format!("service-{hashed}"),
            local: format!("local-{hashed}"),
            external: format!("external-{hashed}"),
            firewall: format!("firewall-{hashed}"),
            base,
        }
    }

    /// `(endpoint chain, affinity set)` of the endpoint `ip`/`port` (an IPv6 address with its
    /// colons turned into dots: chain names may not hold colons).
    pub fn endpoint(&self, ip: &str, port: u16) -> (String, String) {
        let ip = ip.replace(':', ".");
        let hashed = hash_and_truncate(&format!("{}__{ip}/{port}", self.base));
        (format!("endpoint-{hashed}"), format!("affinity-{hashed}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NamespacedName, Protocol};

    fn spn(ns: &str, name: &str) -> ServicePortName {
        ServicePortName {
            service: NamespacedName::new(ns, name),
            port: "p80".into(),
            protocol: Protocol::Tcp,
        }
    }

    /// Names from the expected ruleset of upstream's TestOverallNFTablesRules.
    #[test]
    fn names_match_upstream_test_vectors() {
        assert_eq!(
            ServiceNames::new(&spn("ns1", "svc1")).cluster,
            "service-ULMVA6XW-ns1/svc1/tcp/p80"
        );
        let svc2 = ServiceNames::new(&spn("ns2", "svc2"));
        assert_eq!(svc2.external, "external-42NFTM6N-ns2/svc2/tcp/p80");
        assert_eq!(
            svc2.endpoint("10.180.0.2", 80).0,
            "endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80"
        );
        let svc5 = ServiceNames::new(&spn("ns5", "svc5"));
        assert_eq!(svc5.firewall, "firewall-HVFWP5L3-ns5/svc5/tcp/p80");
        assert_eq!(
            svc5.endpoint("10.180.0.3", 80).1,
            "affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"
        );
        assert_eq!(
            ServiceNames::new(&spn("ns4", "svc4"))
                .endpoint("10.180.0.5", 80)
                .0,
            "endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80"
        );
    }

    #[test]
    fn long_names_are_cut_to_256() {
        let long = "a".repeat(300);
        let n = hash_and_truncate(&long);
        assert_eq!(n.len(), 256);
        assert!(n.ends_with("..."));
        assert!(n.starts_with(&hash_and_truncate(&long)[..9]));
    }
}
