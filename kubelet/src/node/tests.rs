use super::*;

#[test]
fn node_images_largest_first_bounded_with_at_most_five_names() {
    use crate::runtime::ImageSummary;
    let img = |id: &str, size: u64, tags: usize| ImageSummary {
        id: id.into(),
        repo_tags: (0..tags).map(|i| format!("r/{id}:t{i}")).collect(),
        repo_digests: vec![format!("r/{id}@sha256:{id}")],
        size,
        pinned: false,
    };
    let list = vec![
        img("a", 10, 1),
        img("b", 30, 6),
        img("c", 10, 0),
        img("d", 20, 1),
    ];
    let got = node_images(list.clone(), 3);
    let names: Vec<&str> = got
        .iter()
        .map(|i| i.names.as_ref().unwrap()[0].as_str())
        .collect();
    assert_eq!(
        names,
        ["r/b@sha256:b", "r/d@sha256:d", "r/c@sha256:c"],
        "by size, ties by greater ID"
    );
    assert_eq!(
        got[0].names.as_ref().unwrap().len(),
        5,
        "digest + 4 of 6 tags"
    );
    assert_eq!(got[0].size_bytes, Some(30));
    assert_eq!(node_images(list.clone(), -1).len(), 4);
    assert!(node_images(list, 0).is_empty());
}

#[tokio::test]
async fn ready_follows_the_runtime_conditions_with_upstream_messages() {
    use crate::runtime::RuntimeCondition;
    let rt = Arc::new(crate::runtime::fake::FakeRuntime::new());
    let shutdown = Arc::new(crate::shutdown::ShutdownState::default());
    let health = CriHealth {
        runtime: rt.clone(),
        pleg: Arc::default(),
        started_unix: crate::clock::unix_now(),
        shutdown,
        pressure: Arc::default(),
    };
    assert!(health.errors().await.is_empty());
    rt.set_conditions(vec![
        RuntimeCondition {
            type_: "RuntimeReady".into(),
            status: true,
            reason: String::new(),
            message: String::new(),
        },
        RuntimeCondition {
            type_: "NetworkReady".into(),
            status: false,
            reason: "NetworkPluginNotReady".into(),
            message: "Network plugin returns error: cni plugin not initialized".into(),
        },
    ]);
    let errs = health.errors().await;
    assert_eq!(
        errs,
        [
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"
        ]
    );
    assert_eq!(aggregate(&errs), errs[0], "one error: its text alone");
    rt.set_conditions(vec![]);
    let errs = health.errors().await;
    assert_eq!(
        aggregate(&errs),
        "[container runtime not ready: <nil>, container runtime network not ready: <nil>]"
    );
}

/// Capacity comes from statvfs(2), the same figure `df` prints, with no child process.
#[test]
fn ephemeral_storage_from_statvfs_matches_df() {
    let dir = tempfile::tempdir().unwrap();
    let host = LinuxHost {
        root_dir: dir.path().to_path_buf(),
    };
    let got = host.host_info().ephemeral_storage_bytes.unwrap();
    let out = std::process::Command::new("df")
        .args(["-P", "-B1"])
        .arg(dir.path())
        .output()
        .unwrap();
    let df: i64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert_eq!(got, df);
}

pub(super) fn cfg() -> NodeConfig {
    NodeConfig {
        name: "n1".into(),
        labels: BTreeMap::from([("role".to_string(), "worker".to_string())]),
        taints: vec![],
        node_ips: vec!["10.0.0.5".parse().unwrap()],
        hostname: "n1".into(),
        port: 10250,
        max_pods: 110,
        update_frequency: Duration::from_secs(10),
        report_frequency: Duration::from_secs(300),
        lease_duration_seconds: 40,
        register_node: true,
        max_images: 50,
        resources: crate::cm::resources::NodeResources::default(),
        cloud: Default::default(),
        given_node_ips: vec![],
    }
}

pub(super) fn host() -> HostInfo {
    HostInfo {
        machine_id: "m".into(),
        system_uuid: "u".into(),
        boot_id: "b".into(),
        kernel_version: "6.1".into(),
        os_image: "Debian GNU/Linux 12 (bookworm)".into(),
        cpus: 2,
        memory_bytes: 4 * 1024 * 1024 * 1024,
        ephemeral_storage_bytes: Some(100 * 1024 * 1024 * 1024),
        hugepages: BTreeMap::new(),
    }
}

#[test]
fn allocatable_subtracts_reservations_and_huge_pages() {
    let mut c = cfg();
    c.resources.kube_reserved.cpu_millis = 100;
    c.resources.kube_reserved.memory_bytes = 256 << 20;
    c.resources.system_reserved.memory_bytes = 256 << 20;
    c.resources.system_reserved.ephemeral_storage_bytes = 1 << 30;
    let mut h = host();
    h.hugepages = BTreeMap::from([(2u64 << 20, 512i64 << 20)]);
    let (cap, alloc) = capacity_and_allocatable(&c, &h);
    assert_eq!(cap["hugepages-2Mi"].0, "512Mi");
    assert_eq!(cap["hugepages-1Gi"].0, "0");
    assert_eq!(alloc["cpu"].0, "1900m");
    // 4Gi − 512Mi reserved − 100Mi eviction − 512Mi of huge pages.
    assert_eq!(alloc["memory"].0, "2972Mi");
    assert_eq!(alloc["hugepages-2Mi"].0, "512Mi");
    assert_eq!(alloc["ephemeral-storage"].0, "95563022176");
    assert_eq!(alloc["pods"].0, "110");
}

#[test]
fn initial_node_has_default_and_configured_labels() {
    let n = initial_node(&cfg());
    let l = n.metadata.labels.unwrap();
    assert_eq!(l["kubernetes.io/hostname"], "n1");
    assert_eq!(l["beta.kubernetes.io/os"], "linux");
    assert_eq!(l["kubernetes.io/arch"], go_arch());
    assert_eq!(l["role"], "worker");
}

#[test]
fn an_external_cloud_provider_registers_the_node_uninitialized_with_its_provider_id() {
    let plain = initial_node(&cfg());
    assert!(plain.spec.as_ref().unwrap().taints.is_none());
    assert!(plain.spec.as_ref().unwrap().provider_id.is_none());
    let mut c = cfg();
    c.taints = vec![Taint {
        key: "dedicated".into(),
        value: Some("gpu".into()),
        effect: "NoExecute".into(),
        time_added: None,
    }];
    c.cloud = CloudSettings {
        external: true,
        provider_id: "aws:///eu-west-1a/i-0abc".into(),
    };
    c.given_node_ips = vec!["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
    let n = initial_node(&c);
    let spec = n.spec.unwrap();
    assert_eq!(
        spec.provider_id.as_deref(),
        Some("aws:///eu-west-1a/i-0abc")
    );
    let taints = spec.taints.unwrap();
    assert_eq!(taints.len(), 2);
    assert_eq!(
        taints[1].key,
        "node.cloudprovider.kubernetes.io/uninitialized"
    );
    assert_eq!(taints[1].value.as_deref(), Some("true"));
    assert_eq!(taints[1].effect, "NoSchedule");
    assert_eq!(
        n.metadata.annotations.unwrap()["alpha.kubernetes.io/provided-node-ip"],
        "10.0.0.5,fd00::5"
    );
}

#[test]
fn with_an_external_cloud_the_addresses_it_set_are_kept() {
    let t0: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let mut c = cfg();
    c.cloud.external = true;
    let (first, _) = compute_status(None, &c, &host(), None, &[], &[], t0);
    assert_eq!(first.addresses.as_ref().unwrap()[0].address, "10.0.0.5");
    let mut from_cloud = first.clone();
    from_cloud.addresses = Some(vec![
        NodeAddress {
            type_: "InternalIP".into(),
            address: "172.31.0.9".into(),
        },
        NodeAddress {
            type_: "ExternalIP".into(),
            address: "203.0.113.9".into(),
        },
    ]);
    let (s, _) = compute_status(Some(&from_cloud), &c, &host(), None, &[], &[], t0);
    assert_eq!(s.addresses, from_cloud.addresses);
    // Without a cloud the kubelet's own addresses are written back.
    let (s, _) = compute_status(Some(&from_cloud), &cfg(), &host(), None, &[], &[], t0);
    assert_eq!(s.addresses.unwrap()[0].address, "10.0.0.5");
}

#[test]
fn ready_status_and_transitions() {
    let t0: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let rt = ("containerd".to_string(), "1.6.20".to_string());
    let (s, ev) = compute_status(None, &cfg(), &host(), Some(&rt), &[], &[], t0);
    let conds = s.conditions.clone().unwrap();
    let types: Vec<_> = conds.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    );
    assert_eq!(conds[3].reason.as_deref(), Some("KubeletReady"));
    assert_eq!(
        conds[0].reason.as_deref(),
        Some("KubeletHasSufficientMemory")
    );
    let reasons: Vec<_> = ev.iter().map(|e| e.1).collect();
    assert_eq!(
        reasons,
        [
            "NodeHasSufficientMemory",
            "NodeHasNoDiskPressure",
            "NodeHasSufficientPID",
            "NodeReady"
        ]
    );
    let info = s.node_info.clone().unwrap();
    assert_eq!(info.container_runtime_version, "containerd://1.6.20");
    assert_eq!(info.kubelet_version, crate::KUBERNETES_VERSION);
    let cap = s.capacity.clone().unwrap();
    assert_eq!(cap["pods"].0, "110");
    assert_eq!(cap["memory"].0, "4Gi");
    assert_eq!(cap["cpu"].0, "2");
    assert_eq!(cap["ephemeral-storage"].0, "100Gi");
    assert_eq!(cap["hugepages-2Mi"].0, "0");
    let alloc = s.allocatable.clone().unwrap();
    // The default hard thresholds: memory.available<100Mi, nodefs.available<10% (a float32
    // fraction, as upstream's).
    assert_eq!(alloc["memory"].0, "3996Mi");
    assert_eq!(alloc["ephemeral-storage"].0, "96636764000");
    assert_eq!(alloc["cpu"].0, "2");
    assert_eq!(
        s.daemon_endpoints
            .as_ref()
            .unwrap()
            .kubelet_endpoint
            .as_ref()
            .unwrap()
            .port,
        10250
    );

    // Later, runtime down: NotReady with upstream's message, transition time moves.
    let t1: jiff::Timestamp = "2026-01-01T00:00:10Z".parse().unwrap();
    let (s2, ev2) = compute_status(
        Some(&s),
        &cfg(),
        &host(),
        None,
        &["container runtime is down".into()],
        &[],
        t1,
    );
    let ready = s2
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
    assert_eq!(ready.message.as_deref(), Some("container runtime is down"));
    assert_eq!(ready.last_transition_time, Some(Time(t1)));
    assert_eq!(ev2, vec![(EventType::Normal, "NodeNotReady")]);
    // Pressure conditions kept their transition time; heartbeat moved; runtime version kept.
    let mem = &s2.conditions.as_ref().unwrap()[0];
    assert_eq!(mem.last_transition_time, Some(Time(t0)));
    assert_eq!(mem.last_heartbeat_time, Some(Time(t1)));
    assert_eq!(
        s2.node_info.unwrap().container_runtime_version,
        "containerd://1.6.20"
    );
    // Only heartbeats differ between two healthy evaluations: nothing to write.
    let (s3, _) = compute_status(Some(&s), &cfg(), &host(), Some(&rt), &[], &[], t1);
    assert_eq!(comparable(&s3), comparable(&s));
    // The eviction manager reports memory pressure: True with upstream's reason and event.
    let (s4, ev4) = compute_status(
        Some(&s3),
        &cfg(),
        &host(),
        Some(&rt),
        &[],
        &[crate::eviction::Condition::MemoryPressure],
        t1,
    );
    let mem = &s4.conditions.as_ref().unwrap()[0];
    assert_eq!(mem.type_, "MemoryPressure");
    assert_eq!(mem.status, "True");
    assert_eq!(mem.reason.as_deref(), Some("KubeletHasInsufficientMemory"));
    assert_eq!(
        mem.message.as_deref(),
        Some("kubelet has insufficient memory available")
    );
    assert_eq!(mem.last_transition_time, Some(Time(t1)));
    assert_eq!(ev4, vec![(EventType::Normal, "NodeHasInsufficientMemory")]);
}

#[test]
fn os_image_from_os_release() {
    assert_eq!(
        os_image("NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"),
        "Debian GNU/Linux 12 (bookworm)"
    );
    assert_eq!(os_image(""), "Linux");
}

/// The runtime's handlers reach `status.runtimeHandlers` with both features each, and its
/// `supplemental_groups_policy` reaches `status.features` (upstream's setters); a runtime
/// listing no handlers (containerd 1.6) leaves no list, and one sending no features leaves
/// `features` as read.
#[test]
fn runtime_handlers_and_features_reach_the_node_status() {
    use crate::runtime::{HandlerFeatures, RuntimeFeatures};
    let mut status = k8s_openapi::api::core::v1::NodeStatus::default();
    let f = RuntimeFeatures {
        handlers: vec![
            (
                String::new(),
                HandlerFeatures {
                    recursive_read_only_mounts: true,
                    user_namespaces: true,
                },
            ),
            ("kata".into(), HandlerFeatures::default()),
        ],
        supplemental_groups_policy: Some(true),
    };
    set_runtime_features(&mut status, &f);
    let v = serde_json::to_value(&status).unwrap();
    assert_eq!(
        v["runtimeHandlers"],
        serde_json::json!([
            {"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
            {"name": "kata", "features": {"recursiveReadOnlyMounts": false, "userNamespaces": false}},
        ])
    );
    assert_eq!(
        v["features"],
        serde_json::json!({"supplementalGroupsPolicy": true})
    );
    let patch = status_patch(&Default::default(), &status).unwrap();
    assert_eq!(patch["status"]["runtimeHandlers"], v["runtimeHandlers"]);
    // containerd 1.6: no handlers, no features.
    set_runtime_features(&mut status, &RuntimeFeatures::default());
    assert!(status.runtime_handlers.is_none());
    assert_eq!(
        status.features.and_then(|f| f.supplemental_groups_policy),
        Some(true),
        "left as read"
    );
}
