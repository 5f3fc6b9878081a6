use super::*;
use clap::{CommandFactory, Parser};

#[test]
fn every_flag_entry_is_a_real_flag_and_every_flag_has_an_entry() {
    let cmd = crate::config::Flags::command();
    let longs: Vec<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    for s in FLAGS {
        assert!(
            longs.contains(&s.name.to_string()),
            "{} is not a flag",
            s.name
        );
    }
    for l in &longs {
        assert!(
            FLAGS.iter().any(|s| s.name == l),
            "flag {l} has no registry entry"
        );
    }
}

#[test]
fn every_field_entry_is_known_to_serde() {
    let header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
    for s in FIELDS {
        let top = s.name.split('.').next().unwrap();
        if matches!(top, "apiVersion" | "kind") {
            continue;
        }
        let cfg = crate::config::KubeProxyConfiguration::parse(&format!("{header}{top}: null\n"))
            .unwrap();
        assert!(
            !cfg.extra.contains_key(top),
            "{} is in the registry but not declared in KubeProxyConfiguration",
            s.name
        );
    }
    let cfg =
        crate::config::KubeProxyConfiguration::parse(&format!("{header}fooBar: 1\n")).unwrap();
    assert!(cfg.extra.contains_key("fooBar"));
}

#[test]
fn kubeadm_proxy_config_gives_no_warnings() {
    let text = r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;
    let f = check(&[], Some(text));
    assert_eq!(f, Findings::default());
}

#[test]
fn non_defaults_warn_once_each() {
    let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack:\n  min: 0\n  maxPerCore: 32768\noomScoreAdj: -999\nfooBar: 1\n";
    let f = check(&[], Some(text));
    assert_eq!(f.warnings.len(), 2, "{f:#?}");
    assert!(f.warnings[0].contains("conntrack.min"), "{f:#?}");
    assert!(f.warnings[1].contains("unknown field \"fooBar\""), "{f:#?}");
    assert!(f.refusals.is_empty());

    let cmd = crate::config::Flags::command();
    let m = cmd
        .clone()
        .try_get_matches_from(["kube-proxy", "--profiling", "--oom-score-adj=-999", "--v=2"])
        .unwrap();
    let given = given_flags(&cmd, &m);
    let f = check(&given, None);
    assert_eq!(f.warnings.len(), 1, "{f:#?}");
    assert!(f.warnings[0].contains("--profiling"), "{f:#?}");
    let _ = crate::config::Flags::parse_from(["kube-proxy"]);
}
