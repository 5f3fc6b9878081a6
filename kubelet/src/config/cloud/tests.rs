use super::*;
use clap::Parser;

fn flags(args: &[&str]) -> Flags {
    Flags::parse_from(std::iter::once("kubelet").chain(args.iter().copied()))
}

fn file(provider_id: Option<serde_json::Value>) -> KubeletConfiguration {
    KubeletConfiguration {
        provider_id,
        ..Default::default()
    }
}

#[test]
fn external_or_nothing_and_built_in_providers_are_refused_in_upstreams_words() {
    assert_eq!(
        parse(&flags(&[]), &file(None)).unwrap(),
        CloudSettings::default()
    );
    assert!(
        parse(&flags(&["--cloud-provider=external"]), &file(None))
            .unwrap()
            .external
    );
    let e = parse(&flags(&["--cloud-provider=aws"]), &file(None))
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
        parse(&flags(&[]), &f).unwrap().provider_id,
        "gce://p/z/from-file"
    );
    let s = parse(&flags(&["--provider-id=aws:///z/i-1"]), &f).unwrap();
    assert_eq!(s.provider_id, "aws:///z/i-1");
    assert!(parse(&flags(&[]), &file(Some(7.into()))).is_err());
}
