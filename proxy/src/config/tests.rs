use super::*;

fn flags(args: &[&str]) -> Flags {
    let mut all = vec!["kube-proxy"];
    all.extend_from_slice(args);
    Flags::try_parse_from(all).unwrap()
}

#[test]
fn defaults_match_upstream() {
    let c = resolve(&flags(&[]), None, "Node-A").unwrap();
    assert_eq!(c.node_name, "node-a");
    assert_eq!(
        c.healthz_bind_address,
        Some("0.0.0.0:10256".parse().unwrap())
    );
    assert_eq!(
        c.metrics_bind_address,
        Some("127.0.0.1:10249".parse().unwrap())
    );
    assert_eq!(c.mode, ProxyMode::Iptables);
    assert_eq!(c.masquerade_bit, 14);
    assert!(!c.masquerade_all);
    assert!(c.localhost_node_ports);
    assert_eq!(c.sync_period, Duration::from_secs(30));
    assert_eq!(c.min_sync_period, Duration::from_secs(1));
    assert_eq!(c.health_timeout(), Duration::from_secs(60));
    assert_eq!(c.conntrack.max_per_core, 32768);
    assert_eq!(c.conntrack.min, 131072);
    assert_eq!(
        c.conntrack.tcp_established_timeout,
        Duration::from_secs(86400)
    );
    assert_eq!(
        c.conntrack.tcp_close_wait_timeout,
        Duration::from_secs(3600)
    );
    assert_eq!((c.qps, c.burst), (5.0, 10));
    assert!(c.cluster_cidrs.is_empty());
    assert!(!c.cleanup);
}

#[test]
fn ipv6_bind_address_moves_default_servers() {
    let c = resolve(&flags(&["--bind-address", "fd00::1"]), None, "n").unwrap();
    assert_eq!(c.healthz_bind_address, Some("[::]:10256".parse().unwrap()));
    assert_eq!(c.metrics_bind_address, Some("[::1]:10249".parse().unwrap()));
    assert_eq!(c.primary_family(), IpFamily::V6);
}

#[test]
fn conntrack_udp_timeouts_and_be_liberal_from_flags_and_file() {
    let c = resolve(&flags(&[]), None, "n").unwrap();
    assert!(!c.conntrack.tcp_be_liberal);
    assert_eq!(c.conntrack.udp_timeout, Duration::ZERO, "0: untouched");
    assert_eq!(c.conntrack.udp_stream_timeout, Duration::ZERO);
    let c = resolve(
        &flags(&[
            "--conntrack-tcp-be-liberal",
            "--conntrack-udp-timeout=45s",
            "--conntrack-udp-timeout-stream=2m",
        ]),
        None,
        "n",
    )
    .unwrap();
    assert!(c.conntrack.tcp_be_liberal);
    assert_eq!(c.conntrack.udp_timeout, Duration::from_secs(45));
    assert_eq!(c.conntrack.udp_stream_timeout, Duration::from_secs(120));
    let file = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack:\n  tcpBeLiberal: true\n  udpTimeout: 30s\n  udpStreamTimeout: 0s\n";
    let c = resolve(&flags(&[]), Some(file), "n").unwrap();
    assert!(c.conntrack.tcp_be_liberal);
    assert_eq!(c.conntrack.udp_timeout, Duration::from_secs(30));
    assert_eq!(c.conntrack.udp_stream_timeout, Duration::ZERO);
    let e = resolve(&flags(&["--conntrack-udp-timeout=soon"]), None, "n").unwrap_err();
    assert!(e.to_string().contains("conntrack.udpTimeout"), "{e}");
}

const FILE: &str = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
  burst: 0
  acceptContentTypes: ""
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
conntrack:
  maxPerCore: null
  min: 0
  tcpCloseWaitTimeout: 1h0m0s
  tcpEstablishedTimeout: 2h
detectLocalMode: ""
healthzBindAddress: ""
hostnameOverride: "Worker-1"
iptables:
  masqueradeAll: true
  masqueradeBit: 15
  minSyncPeriod: 0s
  syncPeriod: 1m30s
ipvs:
  scheduler: ""
metricsBindAddress: 0.0.0.0
mode: ""
nodePortAddresses: ["192.168.0.0/16", "primary"]
someFutureField: {a: 1}
"#;

#[test]
fn file_fields_and_unknown_fields() {
    let c = resolve(&flags(&[]), Some(FILE), "host").unwrap();
    assert_eq!(c.node_name, "worker-1");
    assert_eq!(
        c.kubeconfig,
        Some(PathBuf::from("/var/lib/kube-proxy/kubeconfig.conf"))
    );
    assert_eq!(c.cluster_cidrs.len(), 2);
    assert_eq!(
        c.cluster_cidr(IpFamily::V4).unwrap().to_string(),
        "10.244.0.0/16"
    );
    assert_eq!(c.conntrack.max_per_core, 32768);
    assert_eq!(c.conntrack.min, 0);
    assert_eq!(
        c.conntrack.tcp_established_timeout,
        Duration::from_secs(7200)
    );
    assert!(c.masquerade_all);
    assert_eq!(c.masquerade_bit, 15);
    assert_eq!(c.min_sync_period, Duration::from_secs(1));
    assert_eq!(c.sync_period, Duration::from_secs(90));
    assert_eq!(
        c.metrics_bind_address,
        Some("0.0.0.0:10249".parse().unwrap())
    );
    assert_eq!(c.node_port_addresses, vec!["192.168.0.0/16", "primary"]);
    assert_eq!(
        c.kubeconfig.as_deref(),
        Some(std::path::Path::new("/var/lib/kube-proxy/kubeconfig.conf"))
    );
}

#[test]
fn flags_override_file() {
    let f = flags(&[
        "--config=/etc/kp.yaml",
        "--hostname-override=Other",
        "--masquerade-all=false",
        "--iptables-sync-period=10s",
        "--iptables-min-sync-period=0",
        "--cluster-cidr=10.0.0.0/8",
        "--nodeport-addresses=10.1.0.0/16,10.2.0.0/16",
        "--metrics-bind-address=",
        "--healthz-bind-address=127.0.0.1:12345",
        "--kubeconfig",
        "/k",
        "--v=4",
        "--cleanup",
    ]);
    let c = resolve(&f, Some(FILE), "host").unwrap();
    assert_eq!(c.node_name, "other");
    assert!(!c.masquerade_all);
    assert_eq!(c.sync_period, Duration::from_secs(10));
    assert_eq!(c.min_sync_period, Duration::ZERO);
    assert_eq!(c.cluster_cidrs.len(), 1);
    assert_eq!(c.node_port_addresses, vec!["10.1.0.0/16", "10.2.0.0/16"]);
    assert_eq!(c.metrics_bind_address, None);
    assert_eq!(
        c.healthz_bind_address,
        Some("127.0.0.1:12345".parse().unwrap())
    );
    assert_eq!(c.kubeconfig, Some(PathBuf::from("/k")));
    assert_eq!(c.verbosity, 4);
    assert!(c.cleanup);
    assert_eq!(c.masquerade_bit, 15, "untouched file value stays");
}

#[test]
fn nftables_mode_reads_its_own_section() {
    let file = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\niptables:\n  masqueradeBit: 3\n  syncPeriod: 5s\n  localhostNodePorts: true\nnftables:\n  masqueradeBit: 12\n  masqueradeAll: true\n  syncPeriod: 45s\n  minSyncPeriod: 2s\n";
    let c = resolve(&flags(&[]), Some(file), "n").unwrap();
    assert_eq!(c.mode, ProxyMode::Nftables);
    assert_eq!(c.masquerade_bit, 12);
    assert!(c.masquerade_all);
    assert_eq!(c.sync_period, Duration::from_secs(45));
    assert_eq!(c.min_sync_period, Duration::from_secs(2));
    assert!(!c.localhost_node_ports, "iptables-only");
    assert!(c.localhost_node_ports_ignored, "asked for: warned at start");

    let c = resolve(&flags(&["--proxy-mode=nftables"]), None, "n").unwrap();
    assert_eq!(c.mode, ProxyMode::Nftables);
    assert_eq!(c.masquerade_bit, 14);
    assert_eq!(c.sync_period, Duration::from_secs(30));
    assert!(
        !c.localhost_node_ports_ignored,
        "the default is not a request"
    );
    let c = resolve(&flags(&["--proxy-mode="]), None, "n").unwrap();
    assert_eq!(
        c.mode,
        ProxyMode::Iptables,
        "empty mode means iptables on Linux"
    );
}

#[test]
fn version_flag_forms() {
    assert_eq!(flags(&["--version"]).version.as_deref(), Some("true"));
    assert_eq!(flags(&["--version=raw"]).version.as_deref(), Some("raw"));
    assert_eq!(flags(&[]).version, None);
}

#[test]
fn rejects_bad_values_clearly() {
    let bad = |args: &[&str]| resolve(&flags(args), None, "n").unwrap_err().to_string();
    assert!(bad(&["--proxy-mode=ipvs", "--ipvs-scheduler=fastest"]).contains("ipvs.scheduler"));
    assert!(bad(&["--proxy-mode=ipvs", "--ipvs-sync-period=0s"]).contains("ipvs.syncPeriod"));
    assert!(
        bad(&["--ipvs-exclude-cidrs=10.0.0.1"]).contains("ipvs.excludeCIDRs"),
        "checked in every mode, as upstream validates the whole file"
    );
    assert!(bad(&["--proxy-mode=userspace"]).contains("not a valid proxy mode"));
    assert!(bad(&["--iptables-masquerade-bit=32"]).contains("[0, 31]"));
    assert!(bad(&["--iptables-sync-period=0s"]).contains("greater than 0"));
    assert!(bad(&["--iptables-sync-period=5 minutes"]).contains("duration"));
    assert!(bad(&["--cluster-cidr=10.0.0.0/33"]).contains("clusterCIDR"));
    assert!(bad(&["--cluster-cidr=10.0.0.0/8,11.0.0.0/8"]).contains("one CIDR per IP family"));
    assert!(bad(&["--healthz-bind-address=localhost:1"]).contains("healthzBindAddress"));
    assert!(bad(&["--nodeport-addresses=eth0"]).contains("nodePortAddresses"));
    assert!(bad(&["--conntrack-min=-1"]).contains("conntrack.min"));
    assert!(
        bad(&["--detect-local-mode=BridgeInterface"])
            .contains("detectLocal.bridgeInterface: must not be empty")
    );
    assert!(
        bad(&["--detect-local-mode=InterfaceNamePrefix"])
            .contains("detectLocal.interfaceNamePrefix: must not be empty")
    );
    assert!(
        bad(&[
            "--detect-local-mode=BridgeInterface",
            "--pod-bridge-interface=br0 -j ACCEPT"
        ])
        .contains("not a valid interface name")
    );
    assert!(bad(&["--detect-local-mode=Everything"]).contains("is not valid"));
    assert!(bad(&["--hostname-override= "]).contains("empty hostname-override"));
    let wrong_kind = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    assert!(
        resolve(&flags(&[]), Some(wrong_kind), "n")
            .unwrap_err()
            .to_string()
            .contains("unsupported")
    );
    let bad_yaml = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables: [1\n";
    assert!(matches!(
        resolve(&flags(&[]), Some(bad_yaml), "n"),
        Err(Error::Decode(_))
    ));
    let bad_field = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables:\n  masqueradeBit: many\n";
    assert!(matches!(
        resolve(&flags(&[]), Some(bad_field), "n"),
        Err(Error::Decode(_))
    ));
    assert!(Flags::try_parse_from(["kube-proxy", "--no-such-flag"]).is_err());
}

#[test]
fn json_config_is_accepted() {
    let json = r#"{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"iptables","iptables":{"syncPeriod":"45s"}}"#;
    let c = resolve(&flags(&[]), Some(json), "n").unwrap();
    assert_eq!(c.sync_period, Duration::from_secs(45));
}

#[test]
fn ipvs_mode_reads_the_ipvs_section() {
    let text = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ipvs
iptables:
  masqueradeBit: 15
  syncPeriod: 10s
ipvs:
  scheduler: lc
  syncPeriod: 20s
  minSyncPeriod: 2s
  excludeCIDRs: ["10.200.0.0/16"]
  strictARP: true
  tcpTimeout: 900s
  tcpFinTimeout: 120s
  udpTimeout: 300s
"#;
    let c = resolve(&flags(&[]), Some(text), "n").unwrap();
    assert_eq!(c.mode, ProxyMode::Ipvs);
    assert_eq!(c.mode.as_str(), "ipvs");
    assert_eq!(c.sync_period, Duration::from_secs(20));
    assert_eq!(c.min_sync_period, Duration::from_secs(2));
    assert_eq!(c.masquerade_bit, 15, "masquerading stays iptables:'s");
    assert_eq!(c.ipvs.scheduler, "lc");
    assert_eq!(c.ipvs.exclude_cidrs, vec!["10.200.0.0/16".parse().unwrap()]);
    assert!(c.ipvs.strict_arp);
    assert_eq!(
        (
            c.ipvs.tcp_timeout,
            c.ipvs.tcp_fin_timeout,
            c.ipvs.udp_timeout
        ),
        (900, 120, 300)
    );
    assert!(
        !c.localhost_node_ports,
        "localhost node ports are iptables-only"
    );

    // Upstream's defaults: rr, 30s, and no minimum (a change syncs at once).
    let d = resolve(&flags(&["--proxy-mode=ipvs"]), None, "n").unwrap();
    assert_eq!(d.ipvs.scheduler, "rr");
    assert_eq!(d.sync_period, Duration::from_secs(30));
    assert_eq!(d.min_sync_period, Duration::ZERO);
    // Flags win over the file.
    let f = resolve(
        &flags(&["--ipvs-scheduler=sh", "--ipvs-strict-arp=false"]),
        Some(text),
        "n",
    )
    .unwrap();
    assert_eq!(f.ipvs.scheduler, "sh");
    assert!(!f.ipvs.strict_arp);
}

#[test]
fn detect_local_modes_and_their_interfaces_from_flags_and_file() {
    let c = resolve(&flags(&["--detect-local-mode=NodeCIDR"]), None, "n").unwrap();
    assert_eq!(c.local_detect, LocalDetect::NodeCidr);
    let file = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\ndetectLocalMode: BridgeInterface\ndetectLocal:\n  bridgeInterface: cbr0\n  interfaceNamePrefix: veth\n";
    let c = resolve(&flags(&[]), Some(file), "n").unwrap();
    assert_eq!(c.local_detect, LocalDetect::BridgeInterface("cbr0".into()));
    let c = resolve(
        &flags(&["--detect-local-mode=InterfaceNamePrefix"]),
        Some(file),
        "n",
    )
    .unwrap();
    assert_eq!(
        c.local_detect,
        LocalDetect::InterfaceNamePrefix("veth".into())
    );
    let c = resolve(&flags(&["--pod-bridge-interface=br-pods"]), Some(file), "n").unwrap();
    assert_eq!(
        c.local_detect,
        LocalDetect::BridgeInterface("br-pods".into())
    );
}

/// `oomScoreAdj`: upstream's -999 by default, the flag over the file, the kernel's range.
#[test]
fn oom_score_adj_defaults_to_minus_999_and_is_range_checked() {
    assert_eq!(resolve(&flags(&[]), None, "n").unwrap().oom_score_adj, -999);
    let file = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\noomScoreAdj: -100\n";
    assert_eq!(
        resolve(&flags(&[]), Some(file), "n").unwrap().oom_score_adj,
        -100
    );
    let c = resolve(&flags(&["--oom-score-adj=-5"]), Some(file), "n").unwrap();
    assert_eq!(c.oom_score_adj, -5);
    let e = resolve(&flags(&["--oom-score-adj=-1001"]), None, "n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: oomScoreAdj: -1001: must be within the range [-1000, 1000]"
    );
}

#[test]
fn deprecated_port_flags_turn_servers_off_or_fill_in_the_port() {
    let c = resolve(&flags(&["--healthz-port=0", "--metrics-port=0"]), None, "n").unwrap();
    assert_eq!(c.healthz_bind_address, None);
    assert_eq!(c.metrics_bind_address, None);
    let c = resolve(
        &flags(&[
            "--healthz-port=12345",
            "--healthz-bind-address=127.0.0.1",
            "--metrics-port=23456",
        ]),
        None,
        "n",
    )
    .unwrap();
    assert_eq!(
        c.healthz_bind_address,
        Some("127.0.0.1:12345".parse().unwrap())
    );
    assert_eq!(
        c.metrics_bind_address,
        Some("127.0.0.1:23456".parse().unwrap())
    );
    // An address with its own port keeps it, as upstream's addressFromDeprecatedFlags.
    let c = resolve(
        &flags(&[
            "--healthz-port=12345",
            "--healthz-bind-address=0.0.0.0:10256",
        ]),
        None,
        "n",
    )
    .unwrap();
    assert_eq!(
        c.healthz_bind_address,
        Some("0.0.0.0:10256".parse().unwrap())
    );
}
