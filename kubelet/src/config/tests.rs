use super::*;
use crate::cm::CgroupDriver;
use clap::Parser;

pub(crate) const KUBEADM_CONFIG: &str = r#"apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: ""
cpuManagerReconcilePeriod: 0s
evictionPressureTransitionPeriod: 0s
fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
resolvConf: /run/systemd/resolve/resolv.conf
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
"#;

fn flags(args: &[&str]) -> Flags {
    Flags::try_parse_from(std::iter::once("kubelet").chain(args.iter().copied())).unwrap()
}

#[test]
fn kubeadm_written_config_parses() {
    let file = parse_file("config.yaml", KUBEADM_CONFIG).unwrap();
    assert_eq!(file.cgroup_driver.as_deref(), Some("systemd"));
    assert_eq!(
        file.static_pod_path.as_deref(),
        Some("/etc/kubernetes/manifests")
    );
    let cfg = merge(
        &flags(&["--container-runtime-endpoint=unix:///run/x.sock"]),
        file,
        "Node-A",
    )
    .unwrap();
    assert_eq!(cfg.node.node_name, "node-a");
    assert_eq!(cfg.cm.cgroup_driver, CgroupDriver::Systemd);
    assert_eq!(
        cfg.cluster_dns,
        vec!["10.96.0.10".parse::<IpAddr>().unwrap()]
    );
    assert!(cfg.rotate_certificates);
    assert_eq!(cfg.runtime.container_runtime_endpoint, "unix:///run/x.sock");
}

#[test]
fn defaults_match_upstream() {
    let cfg = merge(&flags(&[]), KubeletConfiguration::default(), "n").unwrap();
    assert_eq!(cfg.server.port, 10250);
    assert_eq!(cfg.server.healthz_port, 10248);
    assert_eq!(cfg.server.read_only_port, 0);
    assert_eq!(cfg.node.max_pods, 110);
    assert_eq!(cfg.file_check_frequency, Duration::from_secs(20));
    assert_eq!(
        cfg.node.node_status_update_frequency,
        Duration::from_secs(10)
    );
    assert_eq!(
        cfg.runtime.container_runtime_endpoint,
        DEFAULT_RUNTIME_ENDPOINT
    );
    assert_eq!(cfg.cm.cgroup_driver, CgroupDriver::Cgroupfs);
    assert!(cfg.cm.cgroups_per_qos);
    assert_eq!(
        cfg.node.node_status_report_frequency,
        Duration::from_secs(300)
    );
    assert_eq!(
        (
            cfg.kube_api_qps,
            cfg.kube_api_burst,
            cfg.node.node_lease_duration_seconds
        ),
        (50, 100, 40)
    );
    assert!(cfg.node.register_node);
    assert!(cfg.server.enable_debugging_handlers);
}

#[test]
fn make_iptables_util_chains_defaults_on_and_can_be_turned_off() {
    let on = |text: &str| {
        let file = parse_file("c", text).unwrap();
        merge(&flags(&[]), file, "n")
            .unwrap()
            .make_iptables_util_chains
    };
    assert!(on(""));
    assert!(on("makeIPTablesUtilChains: true\n"));
    assert!(!on("makeIPTablesUtilChains: false\n"));
}

#[test]
fn flags_override_file() {
    let file = parse_file("c", "maxPods: 20\nport: 11000\n").unwrap();
    let cfg = merge(&flags(&["--max-pods=30"]), file, "n").unwrap();
    assert_eq!(cfg.node.max_pods, 30);
    assert_eq!(cfg.server.port, 11000);
}

#[test]
fn seccomp_default_and_unsafe_sysctls() {
    let file = parse_file(
        "c",
        "seccompDefault: true\nallowedUnsafeSysctls: [\"net.core.somaxconn\", \"kernel.msg*\"]\n",
    )
    .unwrap();
    let cfg = merge(&flags(&[]), file, "n").unwrap();
    assert!(cfg.seccomp_default);
    assert_eq!(
        cfg.allowed_unsafe_sysctls,
        ["net.core.somaxconn", "kernel.msg*"]
    );
    let cfg = merge(
        &flags(&[
            "--seccomp-default=false",
            "--allowed-unsafe-sysctls=net.*,kernel.sem",
        ]),
        parse_file("c", "seccompDefault: true\n").unwrap(),
        "n",
    )
    .unwrap();
    assert!(!cfg.seccomp_default);
    assert_eq!(cfg.allowed_unsafe_sysctls, ["net.*", "kernel.sem"]);
    // A sysctl that is not namespaced would change the node: the start fails, as upstream.
    let err = merge(
        &flags(&["--allowed-unsafe-sysctls=kernel.panic"]),
        KubeletConfiguration::default(),
        "n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("kernel.panic") && err.contains("namespaced"),
        "{err}"
    );
}

#[test]
fn invalid_values_are_named() {
    let file = parse_file("c", "cgroupDriver: upstart\n").unwrap();
    let err = merge(&flags(&[]), file, "n").unwrap_err().to_string();
    assert!(
        err.contains("cgroupDriver") && err.contains("upstart"),
        "{err}"
    );
    let err = merge(
        &flags(&["--port=70000"]),
        KubeletConfiguration::default(),
        "n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("port") && err.contains("70000"), "{err}");
    let err = parse_file("c", "syncFrequency: soon\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("soon"), "{err}");
}

#[test]
fn the_verification_policy_once_refused_now_loads_and_unknown_settings_warn() {
    // imagePullCredentialsVerificationPolicy was the last setting the agent refused: it is
    // provided now (images::pull_records), so every policy loads.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "kind: KubeletConfiguration\nimagePullCredentialsVerificationPolicy: AlwaysVerify\n",
    )
    .unwrap();
    let f = flags(&[&format!("--config={}", path.display())]);
    let (cfg, warnings) = load_checked(&f, &[], "n").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        cfg.images.image_pulls.verify_policy().unwrap().name,
        crate::images::pull_records::policy::PolicyName::AlwaysVerify
    );
    std::fs::write(
        &path,
        "kind: KubeletConfiguration\nqosReserved: {memory: 50%}\nfooBar: 1\n",
    )
    .unwrap();
    let (_, warnings) = load_checked(&f, &[], "n").unwrap();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
}

#[test]
fn upstream_field_names() {
    let file = parse_file(
            "c",
            "kubeAPIBurst: 7\ncgroupsPerQOS: false\npodCIDR: 10.1.0.0/24\nserverTLSBootstrap: true\nfooBar: 1\n",
        )
        .unwrap();
    assert_eq!(file.kube_api_burst, Some(7));
    assert_eq!(file.cgroups_per_qos, Some(false));
    assert_eq!(file.pod_cidr.as_deref(), Some("10.1.0.0/24"));
    assert_eq!(file.server_tls_bootstrap, Some(true));
    assert_eq!(file.extra.keys().collect::<Vec<_>>(), ["fooBar"]);
}

#[test]
fn wrong_kind_rejected_unknown_fields_tolerated() {
    assert!(parse_file("c", "kind: Pod\n").is_err());
    assert!(parse_file("c", "someFutureField: 3\nmaxPods: 5\n").is_ok());
}

#[test]
fn unread_feature_gates_are_named_and_read_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        "kind: KubeletConfiguration\nfeatureGates: {PodLevelResources: false, MemoryQoS: true}\n",
    )
    .unwrap();
    let f = flags(&[
        &format!("--config={}", path.display()),
        "--feature-gates=CustomCPUCFSQuotaPeriod=true,KubeletTracing=true",
    ]);
    let (cfg, warnings) = load_checked(&f, &[], "n").unwrap();
    let read = super::limits::READ_GATES.join(", ");
    assert!(
        read.starts_with("CustomCPUCFSQuotaPeriod, PodLevelResources"),
        "{read}"
    );
    assert_eq!(
        warnings,
        [
            format!(
                "feature gate KubeletTracing is set but has no effect in this agent (it reads only {read})"
            ),
            format!(
                "feature gate MemoryQoS is set but has no effect in this agent (it reads only {read})"
            ),
        ]
    );
    assert!(
        !cfg.cm.pod_limits.pod_level_resources,
        "the file's gate is read"
    );
    assert!(
        !cfg.evented_pleg,
        "EventedPLEG is off by default, as upstream"
    );
    let f = flags(&[
        &format!("--config={}", path.display()),
        "--feature-gates=EventedPLEG=true",
    ]);
    let (cfg, warnings) = load_checked(&f, &[], "n").unwrap();
    assert!(cfg.evented_pleg);
    assert!(
        warnings
            .iter()
            .all(|w| !w.starts_with("feature gate EventedPLEG")),
        "{warnings:?}"
    );
}

#[test]
fn pulled_image_verification_settings_default_validate_and_show_in_configz() {
    let load = |yaml: &str, args: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, format!("kind: KubeletConfiguration\n{yaml}")).unwrap();
        let mut all = vec![format!("--config={}", path.display())];
        all.extend(args.iter().map(|a| a.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        load_checked(&flags(&all), &[], "n")
    };
    let (cfg, warnings) = load("", &[]).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(cfg.images.image_pulls.enabled);
    let v = serde_json::to_value(&cfg).unwrap();
    assert_eq!(
        v["imagePullCredentialsVerificationPolicy"],
        "NeverVerifyPreloadedImages"
    );
    let (cfg, warnings) = load(
        "imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages\npreloadedImagesVerificationAllowlist: [\"registry.k8s.io/*\"]\n",
        &[],
    )
    .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(
        cfg.images
            .image_pulls
            .verify_policy()
            .unwrap()
            .allowlist
            .matches("registry.k8s.io/pause:3.10")
    );
    let err = load(
        "imagePullCredentialsVerificationPolicy: NeverVerifyAllowlistedImages\npreloadedImagesVerificationAllowlist: [\"registry.k8s.io/pause:3.10\"]\n",
        &[],
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid configuration: invalid image pattern in `preloadedImagesVerificationAllowlist`: neither tag nor digest is accepted in an image reference: registry.k8s.io/pause:3.10"
    );
    // The gate off, from the flag or the file: nothing verified, and the fields refused.
    let (cfg, _) = load(
        "",
        &["--feature-gates=KubeletEnsureSecretPulledImages=false"],
    )
    .unwrap();
    assert!(cfg.images.image_pulls.verify_policy().is_none());
    let err = load(
        "featureGates: {KubeletEnsureSecretPulledImages: false}\nimagePullCredentialsVerificationPolicy: AlwaysVerify\n",
        &[],
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid configuration: `imagePullCredentialsVerificationPolicy` must not be set if KubeletEnsureSecretPulledImages feature gate is not enabled"
    );
}

#[test]
fn the_selinux_mount_gate_is_read_and_off_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, "kind: KubeletConfiguration\n").unwrap();
    let f = flags(&[&format!("--config={}", path.display())]);
    let (cfg, _) = load_checked(&f, &[], "n").unwrap();
    assert!(!cfg.selinux_mount);
    std::fs::write(
        &path,
        "kind: KubeletConfiguration\nfeatureGates: {SELinuxMount: true}\n",
    )
    .unwrap();
    let (cfg, warnings) = load_checked(&f, &[], "n").unwrap();
    assert!(cfg.selinux_mount);
    assert!(
        !warnings.iter().any(|w| w.contains("SELinuxMount")),
        "{warnings:?}"
    );
}

/// `oomScoreAdj` defaults to upstream's -999, the flag wins, and a value outside the
/// kernel's range stops the start with upstream's message.
#[test]
fn oom_score_adj_defaults_to_minus_999_and_is_range_checked() {
    let cfg = merge(&flags(&[]), KubeletConfiguration::default(), "n").unwrap();
    assert_eq!(cfg.oom_score_adj, -999);
    let file = parse_file("c", "oomScoreAdj: -500\n").unwrap();
    assert_eq!(
        merge(&flags(&[]), file.clone(), "n").unwrap().oom_score_adj,
        -500
    );
    let cfg = merge(&flags(&["--oom-score-adj=-10"]), file, "n").unwrap();
    assert_eq!(cfg.oom_score_adj, -10);
    let bad = parse_file("c", "oomScoreAdj: 1001\n").unwrap();
    let e = merge(&flags(&[]), bad, "n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: oomScoreAdj (--oom-score-adj) 1001 must be between -1000 and 1000, inclusive"
    );
}

/// `registryPullQPS`/`registryBurst` and `eventRecordQPS`/`eventBurst`: upstream's defaults
/// (5/10, 50/100), the flags win over the file, 0 is accepted, and a negative value stops
/// the start with upstream's message.
#[test]
fn registry_and_event_rate_limits_default_and_validate_as_upstream() {
    let cfg = merge(&flags(&[]), KubeletConfiguration::default(), "n").unwrap();
    assert_eq!(
        (
            cfg.images.registry_pull_qps,
            cfg.images.registry_burst,
            cfg.event_record_qps,
            cfg.event_burst
        ),
        (5, 10, 50, 100)
    );
    let file = parse_file(
        "c",
        "registryPullQPS: 0\nregistryBurst: 3\neventRecordQPS: 7\neventBurst: 0\n",
    )
    .unwrap();
    let cfg = merge(&flags(&[]), file.clone(), "n").unwrap();
    assert_eq!(
        (
            cfg.images.registry_pull_qps,
            cfg.images.registry_burst,
            cfg.event_record_qps,
            cfg.event_burst
        ),
        (0, 3, 7, 0)
    );
    let cfg = merge(
        &flags(&[
            "--registry-qps=2",
            "--registry-burst=4",
            "--event-qps=9",
            "--event-burst=11",
        ]),
        file,
        "n",
    )
    .unwrap();
    assert_eq!(
        (
            cfg.images.registry_pull_qps,
            cfg.images.registry_burst,
            cfg.event_record_qps,
            cfg.event_burst
        ),
        (2, 4, 9, 11)
    );
    let configz = serde_json::to_value(&cfg).unwrap();
    assert_eq!(configz["registryPullQPS"], 2);
    assert_eq!(configz["eventRecordQPS"], 9);
    for (args, yaml, msg) in [
        (
            &["--registry-qps=-1"][..],
            "",
            "registryPullQPS (--registry-qps) -1 must not be a negative number",
        ),
        (
            &[][..],
            "registryBurst: -2\n",
            "registryBurst (--registry-burst) -2 must not be a negative number",
        ),
        (
            &["--event-qps=-3"][..],
            "",
            "eventRecordQPS (--event-qps) -3 must not be a negative number",
        ),
        (
            &[][..],
            "eventBurst: -4\n",
            "eventBurst (--event-burst) -4 must not be a negative number",
        ),
    ] {
        let file = if yaml.is_empty() {
            KubeletConfiguration::default()
        } else {
            parse_file("c", yaml).unwrap()
        };
        let e = merge(&flags(args), file, "n").unwrap_err();
        assert_eq!(e.to_string(), format!("invalid configuration: {msg}"));
    }
}

/// `crashLoopBackOff.maxContainerRestartPeriod`: 5m unless set, 1s..300s, and refused with
/// the gate turned off, in upstream's words.
#[test]
fn crash_loop_back_off_max_is_read_and_validated_as_upstream() {
    let cfg = merge(&flags(&[]), KubeletConfiguration::default(), "n").unwrap();
    assert_eq!(cfg.crash_loop_max, Duration::from_secs(300));
    let file = parse_file("c", "crashLoopBackOff: {maxContainerRestartPeriod: 30s}\n").unwrap();
    let cfg = merge(&flags(&[]), file.clone(), "n").unwrap();
    assert_eq!(cfg.crash_loop_max, Duration::from_secs(30));
    let too_long =
        parse_file("c", "crashLoopBackOff: {maxContainerRestartPeriod: 301s}\n").unwrap();
    assert_eq!(
        merge(&flags(&[]), too_long, "n").unwrap_err().to_string(),
        "invalid configuration: CrashLoopBackOff.MaxContainerRestartPeriod (got: 301 seconds) must be set between 1s and 300s"
    );
    let short = parse_file(
        "c",
        "crashLoopBackOff: {maxContainerRestartPeriod: 500ms}\n",
    )
    .unwrap();
    assert!(
        merge(&flags(&[]), short, "n")
            .unwrap_err()
            .to_string()
            .contains("(got: 0.5 seconds)")
    );
    let off = flags(&["--feature-gates=KubeletCrashLoopBackOffMax=false"]);
    assert_eq!(
        merge(&off, file, "n").unwrap_err().to_string(),
        "invalid configuration: FeatureGate KubeletCrashLoopBackOffMax not enabled, CrashLoopBackOff.MaxContainerRestartPeriod must not be set"
    );
}

/// `ResourceHealthStatus` is on by default (beta in v1.36, as upstream) and read: turning it
/// off is no warning.
#[test]
fn resource_health_status_gate_is_on_by_default_and_read() {
    let (cfg, warnings) = load_checked(&flags(&[]), &[], "n").unwrap();
    assert!(cfg.resource_health_status);
    assert!(warnings.iter().all(|w| !w.contains("ResourceHealthStatus")));
    let f = flags(&["--feature-gates=ResourceHealthStatus=false"]);
    let (cfg, warnings) = load_checked(&f, &[], "n").unwrap();
    assert!(!cfg.resource_health_status);
    assert!(
        warnings
            .iter()
            .all(|w| !w.contains("is set but has no effect")),
        "{warnings:?}"
    );
}

/// The config file's `featureGates` are checked as the flag's: an unknown gate or a locked
/// one set against its lock refuses the start; a known gate is accepted and, when the agent
/// does not act on it, warned about by name.
#[test]
fn config_file_feature_gates_are_checked_as_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    let f = flags(&[&format!("--config={}", path.display())]);
    let load = |gates: &str| {
        std::fs::write(
            &path,
            format!("kind: KubeletConfiguration\nfeatureGates: {{{gates}}}\n"),
        )
        .unwrap();
        load_checked(&f, &[], "n")
    };
    let e = load("EventedPLEG: true, NotAGate: true").unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: failed to set feature gates from initial flags-based config: unrecognized feature gate: NotAGate"
    );
    let e = load("SidecarContainers: false").unwrap_err().to_string();
    assert!(
        e.ends_with(
            "cannot set feature gate SidecarContainers to false, feature is locked to true"
        ),
        "{e}"
    );
    let (_, warnings) = load("KubeletPSI: false").unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("feature gate KubeletPSI")),
        "{warnings:?}"
    );
}

#[test]
fn logging_from_the_file_with_the_flags_over_it() {
    use plumbing::logging::Format;
    let yaml = "logging:\n  format: json\n  verbosity: 3\n  vmodule:\n  - filePattern: pod_worker\n    verbosity: 5\n";
    let cfg = merge(&flags(&[]), parse_file("c", yaml).unwrap(), "n").unwrap();
    assert_eq!(cfg.logging.format, Format::Json);
    assert_eq!(cfg.logging.verbosity, 3);
    assert_eq!(cfg.logging.vmodule[0].pattern, "pod_worker");
    let cfg = merge(
        &flags(&["--logging-format=text", "--v=1", "--log-text-split-stream"]),
        parse_file("c", yaml).unwrap(),
        "n",
    )
    .unwrap();
    assert_eq!(cfg.logging.format, Format::Text);
    assert_eq!(cfg.logging.verbosity, 1);
    assert!(cfg.logging.split_stream);
    let err = merge(
        &flags(&["--logging-format=xml"]),
        KubeletConfiguration::default(),
        "n",
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "invalid configuration: logging.format: Invalid value: \"xml\": Unsupported log format"
    );
}

/// `/configz` shows the settings under the names it always had: each subsystem's settings
/// are flattened into the one object, not nested under the subsystem's name.
#[test]
fn configz_keeps_its_flat_field_names() {
    let cfg = merge(&flags(&[]), KubeletConfiguration::default(), "n").unwrap();
    let v = serde_json::to_value(&cfg).unwrap();
    let obj = v.as_object().unwrap();
    for key in [
        "nodeName",
        "nodeIps",
        "nodeLabels",
        "kubeconfig",
        "bootstrapKubeconfig",
        "rootDir",
        "certDir",
        "staticPodPath",
        "syncFrequency",
        "fileCheckFrequency",
        "address",
        "port",
        "readOnlyPort",
        "maxOpenFiles",
        "oomScoreAdj",
        "server",
        "nodeStatusMaxImages",
        "tlsCertFile",
        "tlsPrivateKeyFile",
        "healthzPort",
        "healthzBindAddress",
        "clusterDNS",
        "clusterDomain",
        "resolvConf",
        "cgroupDriver",
        "cgroupRoot",
        "cgroupsPerQos",
        "maxPods",
        "podLogsDir",
        "enableSystemLogHandler",
        "enableDebuggingHandlers",
        "enableDebugFlagsHandler",
        "enableProfilingHandler",
        "enableSystemLogQuery",
        "containerRuntimeEndpoint",
        "imageServiceEndpoint",
        "runtimeRequestTimeout",
        "streamingConnectionIdleTimeout",
        "volumeStatsAggPeriod",
        "pullGate",
        "registryPullQPS",
        "registryBurst",
        "eventRecordQPS",
        "eventBurst",
        "makeIptablesUtilChains",
        "rotateCertificates",
        "nodeStatusUpdateFrequency",
        "failSwapOn",
        "podInfraContainerImage",
        "verbosity",
        "nodeStatusReportFrequency",
        "shutdown",
        "nodeLeaseDurationSeconds",
        "kubeAPIQPS",
        "kubeApiBurst",
        "registerNode",
        "registerWithTaints",
        "enableServer",
        "auth",
        "tlsMinVersion",
        "tlsCipherSuites",
        "serverTlsBootstrap",
        "protectKernelDefaults",
        "seccompDefault",
        "allowedUnsafeSysctls",
        "resources",
        "containerLog",
        "network",
        "podLimits",
        "crashLoopMax",
        "imageGc",
        "containerGc",
        "imagePullCredentialsVerificationPolicy",
        "imageCredentialProviderConfig",
        "imageCredentialProviderBinDir",
        "cloud",
    ] {
        assert!(obj.contains_key(key), "/configz lost {key}: {v}");
    }
    for nested in ["node", "images", "runtime", "connections", "limits"] {
        assert!(!obj.contains_key(nested), "/configz nests {nested}");
    }
    assert_eq!(v["server"]["maxConnections"], 4096, "{v}");
    assert_eq!(v["port"], 10250);
}
