use super::*;

fn parse(json: &str) -> Result<NetConf> {
    NetConf::parse(json.as_bytes())
}

#[test]
fn reads_the_documented_config_with_defaults() {
    let c = parse(r#"{"cniVersion":"1.0.0","name":"k8s","type":"node-agent-cni","ipam":{"subnet":"10.244.1.0/24"}}"#)
        .unwrap();
    assert_eq!(c.bridge, "cni0");
    assert_eq!(c.mtu, 1500);
    assert_eq!(c.subnets, vec!["10.244.1.0/24".parse().unwrap()]);
    assert_eq!(c.data_dir, PathBuf::from("/var/lib/cni/networks/k8s"));
    let dual = parse(
        r#"{"cniVersion":"1.1.0","name":"k8s","type":"node-agent-cni","bridge":"br9","mtu":1450,
            "dataDir":"/tmp/x","ipam":{"subnets":["10.244.1.0/24","fd00:1::/64"]},
            "runtimeConfig":{},"args":{"labels":{}}}"#,
    )
    .unwrap();
    assert_eq!(dual.subnets.len(), 2);
    assert_eq!(dual.mtu, 1450);
    assert_eq!(dual.data_dir, PathBuf::from("/tmp/x/k8s"));
}

#[test]
fn refuses_bad_configs_with_the_spec_codes() {
    let cases = [
        (
            r#"{"cniVersion":"9.9.9","name":"n","ipam":{"subnet":"10.0.0.0/24"}}"#,
            1,
        ),
        (r#"{"name":"n","ipam":{"subnet":"10.0.0.0/24"}}"#, 1),
        (
            r#"{"cniVersion":"1.0.0","name":"n","hairpin":true,"ipam":{"subnet":"10.0.0.0/24"}}"#,
            2,
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","ipMasq":true,"ipam":{"subnet":"10.0.0.0/24"}}"#,
            2,
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"type":"host-local","subnet":"10.0.0.0/24"}}"#,
            2,
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.0.0.0/24","routes":[]}}"#,
            2,
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.0.0.0/99"}}"#,
            6,
        ),
        ("not json", 6),
        (
            r#"{"cniVersion":"1.0.0","ipam":{"subnet":"10.0.0.0/24"}}"#,
            7,
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"-n","ipam":{"subnet":"10.0.0.0/24"}}"#,
            7,
        ),
        (r#"{"cniVersion":"1.0.0","name":"n"}"#, 7),
        (
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnet":"10.0.0.5/24"}}"#,
            7,
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","ipam":{"subnets":["10.0.0.0/24","10.1.0.0/24"]}}"#,
            7,
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","mtu":10,"ipam":{"subnet":"10.0.0.0/24"}}"#,
            7,
        ),
        (
            r#"{"cniVersion":"1.0.0","name":"n","bridge":"a-very-long-bridge","ipam":{"subnet":"10.0.0.0/24"}}"#,
            7,
        ),
    ];
    for (json, code) in cases {
        let err = parse(json).unwrap_err();
        assert_eq!(err.code(), code, "{json}: {err}");
    }
}

#[test]
fn versions_compare_and_peek() {
    assert_eq!(version_at_least("1.1.0", "1.0.0"), Some(true));
    assert_eq!(version_at_least("0.3.1", "0.4.0"), Some(false));
    assert_eq!(version_at_least("x", "0.4.0"), None);
    assert_eq!(peek_version(br#"{"cniVersion":"0.4.0"}"#), "0.4.0");
    assert_eq!(peek_version(b"garbage"), "0.1.0");
}
