use super::*;
use crate::settings::parse_file;
use clap::Parser;

fn flags(args: &[&str]) -> Flags {
    Flags::try_parse_from(std::iter::once("kubelet").chain(args.iter().copied())).unwrap()
}

/// The Node's part of the configuration, as `config::merge` assembles it.
fn merge(
    flags: &Flags,
    file: KubeletConfiguration,
    hostname: &str,
) -> Result<Settings, ConfigError> {
    resolve(flags, &file, hostname)
}

fn file(provider_id: Option<serde_json::Value>) -> KubeletConfiguration {
    KubeletConfiguration {
        provider_id,
        ..Default::default()
    }
}

#[test]
fn register_with_taints_flag() {
    let cfg = merge(
        &flags(&["--register-with-taints=dedicated=infra:NoSchedule,gpu:NoExecute"]),
        KubeletConfiguration::default(),
        "n",
    )
    .unwrap();
    assert_eq!(cfg.register_with_taints.len(), 2);
    assert_eq!(cfg.register_with_taints[0].value.as_deref(), Some("infra"));
    assert_eq!(cfg.register_with_taints[1].key, "gpu");
    assert!(
        merge(
            &flags(&["--register-with-taints=x=y:Sometimes"]),
            KubeletConfiguration::default(),
            "n"
        )
        .is_err()
    );
}

#[test]
fn node_status_max_images_defaults_to_50_and_refuses_below_minus_one() {
    let file = parse_file("c", "{}").unwrap();
    assert_eq!(
        merge(&flags(&["--config=c"]), file.clone(), "n")
            .unwrap()
            .node_status_max_images,
        50
    );
    let cfg = merge(
        &flags(&["--config=c", "--node-status-max-images=-1"]),
        file.clone(),
        "n",
    )
    .unwrap();
    assert_eq!(cfg.node_status_max_images, -1);
    let err = merge(
        &flags(&["--config=c", "--node-status-max-images=-2"]),
        file,
        "n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("must be -1 or greater"), "{err}");
}

/// `podsPerCore` caps the pod capacity at podsPerCore × CPUs when that is below maxPods.
#[test]
fn pods_per_core_caps_the_pod_capacity() {
    assert_eq!(pod_capacity(110, 0, 4), 110);
    assert_eq!(pod_capacity(110, 10, 4), 40);
    assert_eq!(pod_capacity(30, 10, 4), 30);
    assert_eq!(pod_capacity(110, u32::MAX, 64), 110);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let file = parse_file("c", "podsPerCore: 1\nmaxPods: 500\n").unwrap();
    assert_eq!(
        merge(&flags(&[]), file, "n").unwrap().max_pods,
        cores.min(500)
    );
    let e = merge(
        &flags(&["--pods-per-core=-1"]),
        KubeletConfiguration::default(),
        "n",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: podsPerCore (--pods-per-core) -1 must not be a negative number"
    );
}

#[test]
fn external_or_nothing_and_built_in_providers_are_refused_in_upstreams_words() {
    assert_eq!(
        cloud(&flags(&[]), &file(None)).unwrap(),
        CloudSettings::default()
    );
    assert!(
        cloud(&flags(&["--cloud-provider=external"]), &file(None))
            .unwrap()
            .external
    );
    let e = cloud(&flags(&["--cloud-provider=aws"]), &file(None))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "invalid configuration: cloud provider \"aws\" was specified, but built-in cloud providers are disabled. Please set --cloud-provider=external and migrate to an external cloud provider"
    );
}

#[test]
fn the_provider_id_flag_wins_over_the_file() {
    let f = file(Some("gce://p/z/from-file".into()));
    assert_eq!(
        cloud(&flags(&[]), &f).unwrap().provider_id,
        "gce://p/z/from-file"
    );
    let s = cloud(&flags(&["--provider-id=aws:///z/i-1"]), &f).unwrap();
    assert_eq!(s.provider_id, "aws:///z/i-1");
    assert!(cloud(&flags(&[]), &file(Some(7.into()))).is_err());
}
