//! The upstream Kubernetes release this agent (kubelet and kube-proxy) stands in for: one
//! place, so `--version`, the node's `kubeletVersion` and the probes' `User-Agent` agree.

/// `<major>.<minor>` as a literal, so both constants below are built from it.
macro_rules! major_minor {
    () => {
        "1.36"
    };
}

/// The major.minor, as in `kube-probe/1.36` and `kube-lifecycle/1.36`.
pub const MAJOR_MINOR: &str = major_minor!();

/// The release, as `--version` prints it and the node reports as `kubeletVersion`.
pub const KUBERNETES_VERSION: &str = concat!("v", major_minor!(), ".0");

#[cfg(test)]
mod tests {
    #[test]
    fn release_and_major_minor_agree() {
        assert_eq!(super::KUBERNETES_VERSION, "v1.36.0");
        assert_eq!(super::MAJOR_MINOR, "1.36");
    }
}
