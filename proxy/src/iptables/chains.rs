//! Chain names: the fixed top-level chains and the hashed per-service ones.
//!
//! Per-service names are `PREFIX + first 16 chars of base32(sha256(s))`, where `s` is the
//! service port name (`ns/name:port`) followed by the lower-case protocol, plus `ip:port` for
//! endpoint chains — exactly as upstream, so names survive a switch between implementations.

use sha2::{Digest, Sha256};

pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
pub const KUBE_PROXY_CANARY: &str = "KUBE-PROXY-CANARY";
/// Shared with kubelet: carries the anti-martian rule for localhost node ports.
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";

pub const SVC_PREFIX: &str = "KUBE-SVC-";
pub const SVL_PREFIX: &str = "KUBE-SVL-";
pub const FW_PREFIX: &str = "KUBE-FW-";
pub const EXT_PREFIX: &str = "KUBE-EXT-";
pub const SEP_PREFIX: &str = "KUBE-SEP-";

/// True for chains kube-proxy creates per service or endpoint (and may garbage-collect).
pub fn is_service_chain(name: &str) -> bool {
    [SVC_PREFIX, SVL_PREFIX, FW_PREFIX, EXT_PREFIX, SEP_PREFIX]
        .iter()
        .any(|p| name.starts_with(p))
}

const BASE32_ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// Appends RFC 4648 base32 (standard alphabet, no padding) of `data` to `out`.
pub(crate) fn push_base32(out: &mut String, data: &[u8]) {
    let mut buffer: u64 = 0;
    let mut bits = 0u32;
    for &b in data {
        buffer = (buffer << 8) | u64::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(BASE32_ALPHABET[((buffer >> bits) & 0x1f) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(BASE32_ALPHABET[((buffer << (5 - bits)) & 0x1f) as usize] as char);
    }
}

/// `prefix` + the first 16 characters of base32(sha256(the concatenation of `parts`)).
/// The parts are hashed one after the other, which digests the same bytes as their
/// concatenation without building it; 16 base32 characters are exactly the digest's first
/// 10 bytes.
fn hashed_name(prefix: &str, parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for p in parts {
        hasher.update(p.as_bytes());
    }
    let digest = hasher.finalize();
    let mut name = String::with_capacity(prefix.len() + 16);
    name.push_str(prefix);
    push_base32(&mut name, &digest[..10]);
    name
}

/// The KUBE-SVC/SVL/FW/EXT chain names of one service port. They share one hash, computed
/// once here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceChainNames {
    /// `KUBE-SVC-…`: dispatch to endpoints under "Cluster" traffic policy.
    pub cluster: String,
    /// `KUBE-SVL-…`: dispatch to node-local endpoints under "Local" traffic policy.
    pub local: String,
    /// `KUBE-FW-…`: loadBalancerSourceRanges filtering.
    pub firewall: String,
    /// `KUBE-EXT-…`: entry for external (node port, external IP, LB) traffic.
    pub external: String,
}

impl ServiceChainNames {
    pub fn new(service_port_name: &str, protocol: &str) -> Self {
        let cluster = hashed_name(SVC_PREFIX, &[service_port_name, protocol]);
        let hash = &cluster[SVC_PREFIX.len()..];
        ServiceChainNames {
            local: [SVL_PREFIX, hash].concat(),
            firewall: [FW_PREFIX, hash].concat(),
            external: [EXT_PREFIX, hash].concat(),
            cluster,
        }
    }
}

/// `KUBE-SEP-…`: one endpoint (`endpoint` is `ip:port`).
pub fn service_endpoint_chain(service_port_name: &str, protocol: &str, endpoint: &str) -> String {
    hashed_name(SEP_PREFIX, &[service_port_name, protocol, endpoint])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base32(data: &[u8]) -> String {
        let mut s = String::new();
        push_base32(&mut s, data);
        s
    }

    #[test]
    fn base32_matches_rfc4648_vectors() {
        assert_eq!(base32(b""), "");
        assert_eq!(base32(b"f"), "MY");
        assert_eq!(base32(b"fo"), "MZXQ");
        assert_eq!(base32(b"foo"), "MZXW6");
        assert_eq!(base32(b"foob"), "MZXW6YQ");
        assert_eq!(base32(b"fooba"), "MZXW6YTB");
        assert_eq!(base32(b"foobar"), "MZXW6YTBOI");
    }

    /// Names taken from the expected dumps in upstream's pkg/proxy/iptables/proxier_test.go.
    #[test]
    fn chain_names_match_upstream_test_vectors() {
        let names = |spn: &str| ServiceChainNames::new(spn, "tcp");
        assert_eq!(names("ns1/svc1:p80").cluster, "KUBE-SVC-XPGD46QRK7WJZT7O");
        let svc2 = names("ns2/svc2:p80");
        assert_eq!(svc2.cluster, "KUBE-SVC-GNZBNJ2PO5MGZ6GT");
        assert_eq!(svc2.external, "KUBE-EXT-GNZBNJ2PO5MGZ6GT");
        assert_eq!(svc2.local, "KUBE-SVL-GNZBNJ2PO5MGZ6GT");
        assert_eq!(svc2.firewall, "KUBE-FW-GNZBNJ2PO5MGZ6GT");
        assert_eq!(names("ns3/svc3:p80").cluster, "KUBE-SVC-X27LE4BHSL4DOUIK");
        assert_eq!(names("ns4/svc4:p80").cluster, "KUBE-SVC-4SW47YFZTEDKD3PK");
        assert_eq!(names("ns5/svc5:p80").firewall, "KUBE-FW-NUKIZ6OKUXPJNT4C");
        assert_eq!(
            service_endpoint_chain("ns1/svc1:p80", "tcp", "10.180.0.1:80"),
            "KUBE-SEP-SXIVWICOYRO3J4NJ"
        );
        assert_eq!(
            service_endpoint_chain("ns2/svc2:p80", "tcp", "10.180.0.2:80"),
            "KUBE-SEP-RS4RBKLTHTF2IUXJ"
        );
        assert_eq!(
            service_endpoint_chain("ns4/svc4:p80", "tcp", "10.180.0.5:80"),
            "KUBE-SEP-C6EBXVWJJZMIWKLZ"
        );
    }
}
