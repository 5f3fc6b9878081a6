use super::*;

fn pod(json: serde_json::Value) -> Pod {
    let mut p: Pod = serde_json::from_value(json).unwrap();
    crate::pod::apply_defaults(&mut p);
    p
}

fn node() -> NodeSettings {
    NodeSettings {
        node_name: "n1".into(),
        host_ips: vec!["192.0.2.10".into()],
        cluster_dns: vec!["10.96.0.10".into()],
        cluster_domain: "cluster.local".into(),
        host_dns: parse_resolv_conf("nameserver 1.1.1.1\nsearch example.com\noptions edns0\n"),
        pod_logs_dir: "/var/log/pods".into(),
        root_dir: std::env::temp_dir().join("kubelet-spec-test"),
        memory_capacity: 8 << 30,
        seccomp_default: false,
    }
}

#[test]
fn dns_follows_policy() {
    let p = pod(
        serde_json::json!({"metadata": {"name": "a", "namespace": "prod", "uid": "u"}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}),
    );
    let d = dns_config(&node(), &p);
    assert_eq!(d.servers, vec!["10.96.0.10"]);
    assert_eq!(
        d.searches,
        vec![
            "prod.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local",
            "example.com"
        ]
    );
    assert_eq!(d.options, vec!["ndots:5"]);
    let host = pod(
        serde_json::json!({"metadata": {"name": "a", "uid": "u"}, "spec": {"hostNetwork": true, "containers": [{"name": "c", "image": "i:1"}]}}),
    );
    assert_eq!(dns_config(&node(), &host).servers, vec!["1.1.1.1"]);
    let mut standalone = node();
    standalone.cluster_dns.clear();
    assert_eq!(dns_config(&standalone, &p).servers, vec!["1.1.1.1"]);
}

#[test]
fn sandbox_carries_identity_and_ports() {
    let p = pod(
        serde_json::json!({"metadata": {"name": "web", "namespace": "ns", "uid": "u1", "labels": {"app": "w"}}, "spec": {"containers": [{"name": "c", "image": "i:1", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}}),
    );
    let sb = sandbox_config(&node(), &p, 0, "/kubepods/besteffort/podu1".into());
    assert_eq!(sb.labels[LABEL_POD_NAME], "web");
    assert_eq!(sb.labels[LABEL_POD_UID], "u1");
    assert_eq!(sb.labels["app"], "w");
    assert_eq!(sb.hostname, "web");
    assert_eq!(sb.log_directory, "/var/log/pods/ns_web_u1");
    assert_eq!(sb.port_mappings[0].host_port, 8080);
}

#[test]
fn resources_convert_like_upstream() {
    let c: Container = serde_json::from_value(serde_json::json!({"name": "c", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}})).unwrap();
    let r = linux_resources(&c, Qos::Guaranteed, 1 << 33);
    assert_eq!(r.cpu_shares, 512);
    assert_eq!(r.cpu_quota, 50_000);
    assert_eq!(r.cpu_period, 100_000);
    assert_eq!(r.memory_limit_in_bytes, 64 << 20);
    assert_eq!(r.oom_score_adj, -997);
    let none: Container = serde_json::from_value(serde_json::json!({"name": "c"})).unwrap();
    let r = linux_resources(&none, Qos::BestEffort, 1 << 33);
    assert_eq!((r.cpu_shares, r.cpu_quota, r.oom_score_adj), (2, 0, 1000));
}

/// The largest quantities the parser accepts convert without overflow (this panicked in
/// debug builds and wrapped in release ones), clamped as upstream clamps them.
#[test]
fn extreme_resources_clamp_instead_of_overflowing() {
    let c: Container = serde_json::from_value(serde_json::json!({"name": "c", "resources": {
        "limits": {"cpu": "9223372036854775807m", "memory": "9223372036854775807m"},
        "requests": {"cpu": "9223372036854775807m", "memory": "9223372036854775807m"}}}))
    .unwrap();
    let r = linux_resources(&c, Qos::Guaranteed, 1 << 33);
    assert_eq!(r.cpu_shares, 262_144, "upstream's MaxShares");
    assert_eq!(
        r.cpu_quota,
        922_337_203_685_477_580_700_i128.min(i64::MAX as i128) as i64
    );
    assert_eq!(r.memory_limit_in_bytes, 9_223_372_036_854_776);
    let r = linux_resources(&c, Qos::Burstable, 1);
    assert_eq!(r.oom_score_adj, 2);
    // Past an int64 of thousandths: the pod is refused at validation, not run.
    let p = pod(
        serde_json::json!({"metadata": {"name": "w", "uid": "u"}, "spec": {"containers": [{"name": "c", "image": "i:1",
        "resources": {"limits": {"memory": "1e40"}}}]}}),
    );
    let e = crate::pod::validate(&p).unwrap_err();
    assert!(e.to_string().contains("too large"), "{e}");
}

#[test]
fn env_expansion_and_field_refs() {
    let p = pod(
        serde_json::json!({"metadata": {"name": "web", "namespace": "ns", "uid": "u1"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i:1",
        "env": [{"name": "A", "value": "x"}, {"name": "B", "value": "$(A)-$$(A)-$(NOPE)"},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "command": ["echo", "$(POD)"]}]}}),
    );
    let c = &p.spec.as_ref().unwrap().containers[0];
    let cfg = container_config(
        &node(),
        &p,
        c,
        2,
        &["10.88.0.5".into()],
        &BTreeMap::new(),
        None,
        &ContainerHostPaths::default(),
    )
    .unwrap();
    let env: BTreeMap<_, _> = cfg.envs.iter().cloned().collect();
    assert_eq!(env["B"], "x-$(A)-$(NOPE)");
    assert_eq!(env["POD"], "web");
    assert_eq!(env["IP"], "10.88.0.5");
    assert_eq!(cfg.command, vec!["echo", "web"]);
    assert_eq!(cfg.log_path, "c/2.log");
    assert_eq!(cfg.annotations[ANN_RESTART_COUNT], "2");
    assert_eq!(cfg.labels[LABEL_CONTAINER_NAME], "c");
}

/// Variables that double each other: 40 levels would be 2^40 bytes. The expansion stops
/// at its budget with an error naming the variable, before allocating past it.
#[test]
fn an_env_bomb_is_a_config_error() {
    let mut env = vec![serde_json::json!({"name": "V0", "value": "x".repeat(1024)})];
    for i in 1..40 {
        env.push(serde_json::json!({"name": format!("V{i}"), "value": format!("$(V{p})$(V{p})", p = i - 1)}));
    }
    let p = pod(
        serde_json::json!({"metadata": {"name": "w", "uid": "u"}, "spec": {"containers": [{"name": "c", "image": "i:1", "env": env}]}}),
    );
    let c = &p.spec.as_ref().unwrap().containers[0];
    let err = container_config(
        &node(),
        &p,
        c,
        0,
        &[],
        &BTreeMap::new(),
        None,
        &ContainerHostPaths::default(),
    )
    .unwrap_err();
    assert!(err.0.contains("more than 2097152 bytes"), "{}", err.0);
    assert!(err.0.contains("$(V"), "{}", err.0);

    // The same through command arguments.
    let p = pod(
        serde_json::json!({"metadata": {"name": "w", "uid": "u"}, "spec": {"containers": [{"name": "c", "image": "i:1",
        "env": [{"name": "A", "value": "y".repeat(100_000)}],
        "args": vec!["$(A)$(A)$(A)$(A)$(A)"; 5]}]}}),
    );
    let c = &p.spec.as_ref().unwrap().containers[0];
    let err = container_config(
        &node(),
        &p,
        c,
        0,
        &[],
        &BTreeMap::new(),
        None,
        &ContainerHostPaths::default(),
    )
    .unwrap_err();
    assert!(err.0.contains("$(A)"), "{}", err.0);

    // Large but within budget: expanded as written.
    let mut b = ExpandBudget::default();
    let vars = BTreeMap::from([("A".to_string(), "z".repeat(1 << 20))]);
    assert_eq!(expand("$(A)", &vars, &mut b).unwrap().len(), 1 << 20);
    assert!(expand("$(A)$(A)", &vars, &mut b).is_err());
}

/// The pod's FQDN in its /etc/hosts follows clusterDomain (it was always cluster.local).
#[test]
fn etc_hosts_fqdn_uses_the_cluster_domain() {
    let mut n = node();
    n.cluster_domain = "corp.example".into();
    let p = pod(
        serde_json::json!({"metadata": {"name": "web-0", "namespace": "shop", "uid": "u"}, "spec": {
        "hostname": "web-0", "subdomain": "web", "containers": [{"name": "c", "image": "i:1"}]}}),
    );
    let text = etc_hosts_text(&n, &p, &["10.88.0.7".into()]).unwrap();
    assert!(
        text.contains("10.88.0.7\tweb-0.web.shop.svc.corp.example\tweb-0\n"),
        "{text}"
    );
    assert!(!text.contains("cluster.local"), "{text}");
}

#[test]
fn missing_secret_is_a_config_error() {
    let p = pod(
        serde_json::json!({"metadata": {"name": "w", "uid": "u"}, "spec": {"containers": [{"name": "c", "image": "i:1",
        "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}]}]}}),
    );
    let c = &p.spec.as_ref().unwrap().containers[0];
    let err = container_config(
        &node(),
        &p,
        c,
        0,
        &[],
        &BTreeMap::new(),
        None,
        &ContainerHostPaths::default(),
    )
    .unwrap_err();
    assert!(err.0.contains("secret \"db\" not found"));
}
