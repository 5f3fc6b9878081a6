//! Kubernetes object-name rules shared by both binaries.

/// An RFC 1123 label: 1 to 63 of `a-z`, `0-9` and `-`, alphanumeric at both ends (the kubelet
/// checks pod names with it, kube-proxy Service and namespace names).
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}
