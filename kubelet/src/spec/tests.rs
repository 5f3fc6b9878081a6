use super::*;
use crate::podspec::downward::limit_defaults;

fn pod(json: serde_json::Value) -> Pod {
    let mut p: Pod = serde_json::from_value(json).unwrap();
    crate::podspec::apply_defaults(&mut p);
    p
}

/// The container's env, then its config, as the worker computes them.
fn config_for(
    p: &Pod,
    c: &Container,
    restart_count: u32,
    pod_ips: &[String],
    objects: &EnvObjects,
) -> Result<ContainerConfig, ConfigError> {
    let n = node();
    let mut budget = ExpandBudget::default();
    let env = container_env(
        p,
        c,
        pod_ips,
        &n.host_ips,
        objects,
        &BTreeMap::new(),
        &limit_defaults(p, &n.allocatable, n.pod_limits.pod_level_resources),
        &mut budget,
    )?;
    container_config(
        &n,
        p,
        c,
        restart_count,
        &BTreeMap::new(),
        None,
        &ContainerHostPaths::default(),
        &env,
        "",
        crate::runtime::HandlerFeatures::default(),
    )
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
        ..Default::default()
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

fn res_pod(containers: serde_json::Value) -> Pod {
    pod(
        serde_json::json!({"metadata": {"name": "r", "uid": "u"}, "spec": {"containers": containers}}),
    )
}

/// One row: the pod's containers, then per container (shares, quota, period, memory limit,
/// oom_score_adj), on a node of 8Gi with the 2MB and 1GB page sizes.
#[test]
fn resources_table_matches_upstream() {
    let n = NodeSettings {
        memory_capacity: 8 << 30,
        hugepage_sizes: vec![2 << 20, 1 << 30],
        ..node()
    };
    type Row = (serde_json::Value, Vec<(i64, i64, i64, i64, i64)>);
    let rows: Vec<Row> = vec![
        // Guaranteed: 500m → 512 shares, quota 50000/100000, 64Mi, -997.
        (
            serde_json::json!([{"name": "a", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}]),
            vec![(512, 50_000, 100_000, 64 << 20, -997)],
        ),
        // BestEffort: min shares, no quota, the period still set (cpuCFSQuota), 1000.
        (
            serde_json::json!([{"name": "a"}]),
            vec![(2, 0, 100_000, 0, 1000)],
        ),
        // Burstable: a 1Gi request of 8Gi → 1000 − 125 = 875; a 1m limit → quota 1000
        // (MinQuotaPeriod); shares from the request; no request → 999.
        (
            serde_json::json!([
                {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"cpu": "1m"}}},
                {"name": "b", "resources": {"limits": {"memory": "1Gi"}, "requests": {"memory": "0"}}}
            ]),
            vec![(256, 1000, 100_000, 0, 875), (2, 0, 100_000, 1 << 30, 999)],
        ),
        // Burstable asking for the whole node: floored at 3 (1000 + −997).
        (
            serde_json::json!([{"name": "a", "resources": {"requests": {"memory": "8Gi"}}}]),
            vec![(2, 0, 100_000, 0, 3)],
        ),
    ];
    for (containers, want) in rows {
        let p = res_pod(containers.clone());
        let spec = p.spec.clone().unwrap();
        let got: Vec<_> = spec
            .containers
            .iter()
            .map(|c| {
                let r = linux_resources(&n, &p, c);
                (
                    r.cpu_shares,
                    r.cpu_quota,
                    r.cpu_period,
                    r.memory_limit_in_bytes,
                    r.oom_score_adj,
                )
            })
            .collect();
        assert_eq!(got, want, "{containers}");
    }
}

#[test]
fn hugepages_cfs_off_and_critical_pods() {
    let n = NodeSettings {
        hugepage_sizes: vec![2 << 20, 1 << 30],
        ..node()
    };
    let p = res_pod(serde_json::json!([{"name": "a", "resources": {
        "limits": {"cpu": "1", "memory": "1Gi", "hugepages-2Mi": "64Mi"}}}]));
    let c = &p.spec.as_ref().unwrap().containers[0];
    let r = linux_resources(&n, &p, c);
    assert_eq!(
        r.hugepage_limits,
        vec![("2MB".to_string(), 64 << 20), ("1GB".to_string(), 0)]
    );
    let off = NodeSettings {
        pod_limits: crate::cm::PodLimits {
            cpu_cfs_quota: false,
            ..Default::default()
        },
        ..node()
    };
    let r = linux_resources(&off, &p, c);
    assert_eq!((r.cpu_quota, r.cpu_period), (0, 0));
    // A node-critical Burstable pod is protected like a Guaranteed one.
    let mut crit =
        res_pod(serde_json::json!([{"name": "a", "resources": {"requests": {"memory": "1Gi"}}}]));
    crit.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
    crit.spec.as_mut().unwrap().priority = Some(2_000_001_000);
    let c = crit.spec.as_ref().unwrap().containers[0].clone();
    assert_eq!(linux_resources(&node(), &crit, &c).oom_score_adj, -997);
}

#[test]
fn swap_follows_the_behaviour_and_cgroup_version() {
    use crate::cm::{PodLimits, SwapBehavior};
    let p = res_pod(serde_json::json!([{"name": "a", "resources": {
        "requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}}]));
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    let v2 = |behavior| NodeSettings {
        memory_capacity: 8 << 30,
        swap_capacity: 4 << 30,
        cgroup_v2: true,
        pod_limits: PodLimits {
            swap_behavior: behavior,
            ..Default::default()
        },
        ..node()
    };
    // LimitedSwap: 1Gi of 8Gi → an eighth of 4Gi of swap.
    let r = linux_resources(&v2(SwapBehavior::LimitedSwap), &p, &c);
    assert_eq!(r.unified["memory.swap.max"], (512u64 << 20).to_string());
    let r = linux_resources(&v2(SwapBehavior::NoSwap), &p, &c);
    assert_eq!(r.unified["memory.swap.max"], "0");
    // A Guaranteed container never swaps.
    let g = res_pod(
        serde_json::json!([{"name": "a", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]),
    );
    let gc = g.spec.as_ref().unwrap().containers[0].clone();
    let r = linux_resources(&v2(SwapBehavior::LimitedSwap), &g, &gc);
    assert_eq!(r.unified["memory.swap.max"], "0");
    // cgroup v1 with swap on the node: memory+swap = memory.
    let v1 = NodeSettings {
        swap_capacity: 4 << 30,
        ..node()
    };
    let r = linux_resources(&v1, &p, &c);
    assert!(r.unified.is_empty());
    assert_eq!(r.memory_swap_limit_in_bytes, 2 << 30);
    // No swap on a v1 node: nothing is set.
    assert_eq!(
        linux_resources(&node(), &p, &c).memory_swap_limit_in_bytes,
        0
    );
}

/// The largest quantities the parser accepts convert without overflow (this panicked in
/// debug builds and wrapped in release ones), clamped as upstream clamps them.
#[test]
fn extreme_resources_clamp_instead_of_overflowing() {
    let huge = serde_json::json!([{"name": "c", "resources": {
        "limits": {"cpu": "9223372036854775807m", "memory": "9223372036854775807m"},
        "requests": {"cpu": "9223372036854775807m", "memory": "9223372036854775807m"}}}]);
    let p = res_pod(huge);
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    let r = linux_resources(&node(), &p, &c);
    assert_eq!(r.cpu_shares, 262_144, "upstream's MaxShares");
    assert_eq!(
        r.cpu_quota,
        922_337_203_685_477_580_700_i128.min(i64::MAX as i128) as i64
    );
    assert_eq!(r.memory_limit_in_bytes, 9_223_372_036_854_776);
    let tiny = NodeSettings {
        memory_capacity: 1,
        ..node()
    };
    let b = res_pod(
        serde_json::json!([{"name": "c", "resources": {"requests": {"memory": "9223372036854775807m"}}}]),
    );
    let bc = b.spec.as_ref().unwrap().containers[0].clone();
    assert_eq!(linux_resources(&tiny, &b, &bc).oom_score_adj, 3);
    // Past an int64 of thousandths: the pod is refused at validation, not run.
    let p = pod(
        serde_json::json!({"metadata": {"name": "w", "uid": "u"}, "spec": {"containers": [{"name": "c", "image": "i:1",
        "resources": {"limits": {"memory": "1e40"}}}]}}),
    );
    let e = crate::podspec::validate(&p).unwrap_err();
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
    let cfg = config_for(&p, c, 2, &["10.88.0.5".into()], &EnvObjects::new()).unwrap();
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
    let err = config_for(&p, c, 0, &[], &EnvObjects::new()).unwrap_err();
    assert!(err.0.contains("more than 2097152 bytes"), "{}", err.0);
    assert!(err.0.contains("$(V"), "{}", err.0);

    // The same through command arguments.
    let p = pod(
        serde_json::json!({"metadata": {"name": "w", "uid": "u"}, "spec": {"containers": [{"name": "c", "image": "i:1",
        "env": [{"name": "A", "value": "y".repeat(100_000)}],
        "args": vec!["$(A)$(A)$(A)$(A)$(A)"; 5]}]}}),
    );
    let c = &p.spec.as_ref().unwrap().containers[0];
    let err = config_for(&p, c, 0, &[], &EnvObjects::new()).unwrap_err();
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
    let text = etc_hosts_text(&n, &p, &["10.88.0.7".into()], "").unwrap();
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
    let err = config_for(&p, c, 0, &[], &EnvObjects::new()).unwrap_err();
    assert!(err.0.contains("secret \"db\" not found"));
}

type ObjectList<'a> = &'a [(crate::objects::Kind, &'a str, &'a [(&'a str, &'a str)])];

fn objects(list: ObjectList<'_>) -> EnvObjects {
    use crate::objects::{Kind, ObjectData, ObjectKey};
    list.iter()
        .map(|(kind, name, pairs)| {
            let map = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>();
            let data = match kind {
                Kind::ConfigMap => ObjectData {
                    text: map,
                    binary: BTreeMap::new(),
                    uid: String::new(),
                },
                Kind::Secret => ObjectData {
                    text: BTreeMap::new(),
                    binary: map.into_iter().map(|(k, v)| (k, v.into_bytes())).collect(),
                    uid: String::new(),
                },
            };
            (
                ObjectKey {
                    kind: *kind,
                    namespace: "ns".into(),
                    name: name.to_string(),
                },
                Some(std::sync::Arc::new(data)),
            )
        })
        .collect()
}

fn env_of(spec: serde_json::Value, objs: &EnvObjects) -> Result<ContainerEnv, ConfigError> {
    let p = pod(
        serde_json::json!({"metadata": {"name": "w", "namespace": "ns", "uid": "u"},
        "spec": {"containers": [spec]}}),
    );
    let c = &p.spec.as_ref().unwrap().containers[0];
    let services = BTreeMap::from([
        ("DB_SERVICE_HOST".to_string(), "10.96.0.7".to_string()),
        ("A".to_string(), "from-service".to_string()),
    ]);
    container_env(
        &p,
        c,
        &[],
        &[],
        objs,
        &services,
        &BTreeMap::new(),
        &mut ExpandBudget::default(),
    )
}

/// Upstream's order: envFrom, then env (replacing), then service variables nobody set;
/// `$(VAR)` sees envFrom values and services.
#[test]
fn env_from_config_maps_and_secrets_with_upstreams_precedence() {
    use crate::objects::Kind;
    let objs = objects(&[
        (
            Kind::ConfigMap,
            "app",
            &[("A", "cm"), ("MODE", "prod"), ("bad=key", "x")],
        ),
        (Kind::Secret, "db", &[("PASSWORD", "hunter2")]),
    ]);
    let env = env_of(
        serde_json::json!({"name": "c", "image": "i",
            "envFrom": [{"configMapRef": {"name": "app"}}, {"prefix": "DB_", "secretRef": {"name": "db"}},
                        {"configMapRef": {"name": "absent", "optional": true}}],
            "env": [{"name": "A", "value": "env-$(MODE)-$(DB_SERVICE_HOST)"},
                    {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "MODE"}}},
                    {"name": "S", "valueFrom": {"secretKeyRef": {"name": "db", "key": "PASSWORD"}}},
                    {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "nope", "optional": true}}},
                    {"name": "E", "value": "", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}),
        &objs,
    )
    .unwrap();
    let names: Vec<&str> = env.vars.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        ["A", "MODE", "DB_PASSWORD", "K", "S", "E", "DB_SERVICE_HOST"]
    );
    let m = env.map();
    assert_eq!(m["A"], "env-prod-10.96.0.7");
    assert_eq!(m["K"], "prod");
    assert_eq!(m["S"], "hunter2");
    assert_eq!(m["DB_PASSWORD"], "hunter2");
    assert_eq!(m["E"], "w");
    assert!(
        !m.contains_key("OPT"),
        "a missing optional key leaves the variable unset"
    );
    assert_eq!(
        env.invalid_names,
        [
            "Keys [bad=key] from the EnvFrom configMap ns/app were skipped since they are considered invalid environment variable names."
        ]
    );
}

#[test]
fn missing_env_sources_fail_with_upstreams_messages() {
    use crate::objects::Kind;
    let objs = objects(&[
        (Kind::ConfigMap, "app", &[("A", "1")]),
        (Kind::Secret, "db", &[]),
    ]);
    let cases = [
        (
            serde_json::json!({"configMapKeyRef": {"name": "app", "key": "B"}}),
            "couldn't find key B in ConfigMap ns/app",
        ),
        (
            serde_json::json!({"secretKeyRef": {"name": "db", "key": "pw"}}),
            "couldn't find key pw in Secret ns/db",
        ),
        (
            serde_json::json!({"configMapKeyRef": {"name": "gone", "key": "B"}}),
            "configmap \"gone\" not found",
        ),
        (
            serde_json::json!({"secretKeyRef": {"name": "gone", "key": "B"}}),
            "secret \"gone\" not found",
        ),
    ];
    for (from, want) in cases {
        let e = env_of(
            serde_json::json!({"name": "c", "image": "i", "env": [{"name": "X", "valueFrom": from}]}),
            &objs,
        )
        .unwrap_err();
        assert_eq!(e.0, want);
    }
    let e = env_of(
        serde_json::json!({"name": "c", "image": "i", "envFrom": [{"secretRef": {"name": "nope"}}]}),
        &objs,
    )
    .unwrap_err();
    assert_eq!(e.0, "secret \"nope\" not found");
    // Optional and missing: nothing set, no error.
    let env = env_of(
        serde_json::json!({"name": "c", "image": "i", "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k", "optional": true}}}]}),
        &objs,
    )
    .unwrap();
    assert!(!env.map().contains_key("X"));
}

#[test]
fn relaxed_env_var_names() {
    assert!(is_env_var_name("1badkey"));
    assert!(is_env_var_name("app.properties"));
    assert!(!is_env_var_name("a=b"));
    assert!(!is_env_var_name(""));
    assert!(!is_env_var_name("tab\there"));
}

/// hostNetwork pods see the node's hosts file under upstream's header; aliases follow one
/// header in both cases.
#[test]
fn etc_hosts_for_host_network_and_aliases() {
    let aliases = serde_json::json!([{"ip": "10.1.2.3", "hostnames": ["foo", "bar"]}, {"ip": "10.1.2.4", "hostnames": ["baz"]}]);
    let hn = pod(
        serde_json::json!({"metadata": {"name": "h", "namespace": "ns", "uid": "u"}, "spec": {
        "hostNetwork": true, "hostAliases": aliases, "containers": [{"name": "c", "image": "i:1"}]}}),
    );
    let text = etc_hosts_text(&node(), &hn, &[], "127.0.0.1 localhost\n192.0.2.1 node1\n").unwrap();
    assert_eq!(
        text,
        "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n192.0.2.1 node1\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo\tbar\n10.1.2.4\tbaz\n"
    );
    let p = pod(
        serde_json::json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {
        "hostAliases": aliases, "containers": [{"name": "c", "image": "i:1"}]}}),
    );
    assert!(
        etc_hosts_text(&node(), &p, &[], "").is_none(),
        "no IP yet: not mounted"
    );
    let text = etc_hosts_text(&node(), &p, &["10.88.0.9".into()], "").unwrap();
    assert!(
        text.ends_with(
            "10.88.0.9\tp\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo\tbar\n10.1.2.4\tbaz\n"
        ),
        "{text}"
    );
}

/// Upstream's expansion test vectors (third_party/forked/golang/expansion/expand_test.go).
#[test]
fn expansion_matches_upstreams_vectors() {
    let vars: BTreeMap<String, String> = [
        ("VAR_A", "A"),
        ("VAR_B", "B"),
        ("VAR_C", "C"),
        ("VAR_REF", "$(VAR_A)"),
        ("VAR_EMPTY", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let cases = [
        ("$(VAR_A)", "A"),
        ("$(VAR_A)-$(VAR_A)", "A-A"),
        ("$(VAR_A)-1", "A-1"),
        ("___$(VAR_B)___", "___B___"),
        ("___$(VAR_C)", "___C"),
        ("$(VAR_A)_$(VAR_B)_$(VAR_C)", "A_B_C"),
        ("$$(VAR_B)_$(VAR_A)", "$(VAR_B)_A"),
        ("$$(VAR_A)_$$(VAR_B)", "$(VAR_A)_$(VAR_B)"),
        ("f000-$$VAR_A", "f000-$VAR_A"),
        ("foo\\$(VAR_C)bar", "foo\\Cbar"),
        ("foo\\\\$(VAR_C)bar", "foo\\\\Cbar"),
        ("foo\\\\\\\\$(VAR_A)bar", "foo\\\\\\\\Abar"),
        ("$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"),
        ("$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"),
        ("$(VAR_REF)", "$(VAR_A)"),
        ("%%$(VAR_REF)--$(VAR_REF)%%", "%%$(VAR_A)--$(VAR_A)%%"),
        ("foo$(VAR_EMPTY)bar", "foobar"),
        ("foo$(VAR_Awhoops!", "foo$(VAR_Awhoops!"),
        ("f00__(VAR_A)__", "f00__(VAR_A)__"),
        ("$?_boo_$!", "$?_boo_$!"),
        ("$VAR_A", "$VAR_A"),
        ("$(VAR_DNE)", "$(VAR_DNE)"),
        ("$$$$$$(BIG_MONEY)", "$$$(BIG_MONEY)"),
        ("$$$$$$(VAR_A)", "$$$(VAR_A)"),
        ("$$$$$$$(GOOD_ODDS)", "$$$$(GOOD_ODDS)"),
        ("$$$$$$$(VAR_A)", "$$$A"),
        ("$VAR_A)", "$VAR_A)"),
        ("${VAR_A}", "${VAR_A}"),
        ("$(VAR_B)_______$(A", "B_______$(A"),
        ("$(VAR_C)_______$(", "C_______$("),
        ("$(VAR_A)foobarzab$", "Afoobarzab$"),
        ("foo-\\$(VAR_A", "foo-\\$(VAR_A"),
        ("--$($($($($--", "--$($($($($--"),
        ("$($($($($--foo$(", "$($($($($--foo$("),
        ("foo0--$($($($(", "foo0--$($($($("),
        ("$(foo$$var)", "$(foo$$var)"),
        ("\n", "\n"),
    ];
    for (input, want) in cases {
        let got = expand(input, &vars, &mut ExpandBudget::default()).unwrap();
        assert_eq!(got, want, "input {input:?}");
    }
}

/// A container without limits of its own in a pod with pod-level limits gets the pod's limits
/// (upstream's getCPULimit/getMemoryLimit) and shares from the cpu limit when it requests
/// none; the oom_score_adj follows the pod's QoS (Guaranteed from the pod level). With the gate
/// off the pod-level fields are ignored.
#[test]
fn pod_level_limits_reach_containers_without_their_own() {
    use crate::cm::PodLimits;
    let mut p = res_pod(serde_json::json!([
        {"name": "a"},
        {"name": "b", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "200m", "memory": "16Mi"}}}
    ]));
    p.spec.as_mut().unwrap().resources =
        serde_json::from_value(serde_json::json!({"limits": {"cpu": "500m", "memory": "64Mi"}}))
            .unwrap();
    let n = NodeSettings {
        memory_capacity: 8 << 30,
        ..node()
    };
    let cs = p.spec.as_ref().unwrap().containers.clone();
    let row = |n: &NodeSettings, c| {
        let r = linux_resources(n, &p, c);
        (
            r.cpu_shares,
            r.cpu_quota,
            r.cpu_period,
            r.memory_limit_in_bytes,
            r.oom_score_adj,
        )
    };
    assert_eq!(row(&n, &cs[0]), (512, 50_000, 100_000, 64 << 20, -997));
    // Its own limits win.
    assert_eq!(row(&n, &cs[1]), (102, 20_000, 100_000, 16 << 20, -997));
    let off = NodeSettings {
        pod_limits: PodLimits {
            pod_level_resources: false,
            ..Default::default()
        },
        ..n.clone()
    };
    // Gate off: container b alone makes the pod Burstable; a has no limits at all.
    assert_eq!(row(&off, &cs[0]).0, 2);
    assert_eq!(row(&off, &cs[0]).1, 0);
    assert_eq!(row(&off, &cs[0]).3, 0);
    assert_eq!(row(&off, &cs[0]).4, 999);
}

/// A node with allocatable cpu 1500m, memory 3Gi and ephemeral-storage 10Gi.
fn allocatable() -> BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    BTreeMap::from([
        ("cpu".to_string(), Quantity("1500m".into())),
        ("memory".to_string(), Quantity("3Gi".into())),
        ("ephemeral-storage".to_string(), Quantity("10Gi".into())),
        ("pods".to_string(), Quantity("110".into())),
    ])
}

/// The env of the pod's first container as the worker computes it on that node.
fn downward_env(pod_json: serde_json::Value, gate: bool) -> BTreeMap<String, String> {
    let p = pod(pod_json);
    let c = &p.spec.as_ref().unwrap().containers[0];
    let defaults = limit_defaults(&p, &allocatable(), gate);
    container_env(
        &p,
        c,
        &[],
        &[],
        &EnvObjects::new(),
        &BTreeMap::new(),
        &defaults,
        &mut ExpandBudget::default(),
    )
    .unwrap()
    .map()
}

fn limits_env(container: &str) -> serde_json::Value {
    let field = |resource: &str, divisor: Option<&str>| {
        let mut r = serde_json::json!({"resource": resource});
        if let Some(d) = divisor {
            r["divisor"] = d.into();
        }
        if !container.is_empty() {
            r["containerName"] = container.into();
        }
        serde_json::json!({"valueFrom": {"resourceFieldRef": r}})
    };
    let mut env = Vec::new();
    for (name, resource, divisor) in [
        ("CPU", "limits.cpu", None),
        ("CPU_M", "limits.cpu", Some("1m")),
        ("MEM", "limits.memory", None),
        ("MEM_MI", "limits.memory", Some("1Mi")),
        ("DISK", "limits.ephemeral-storage", None),
        ("REQ_CPU", "requests.cpu", Some("1m")),
    ] {
        let mut e = field(resource, divisor);
        e["name"] = name.into();
        env.push(e);
    }
    serde_json::Value::Array(env)
}

/// Upstream's defaultPodLimitsForDownwardAPI: a container without limits reads the node's
/// allocatable (cpu rounded up to the divisor), not 0.
#[test]
fn downward_limits_default_to_node_allocatable() {
    let env = downward_env(
        serde_json::json!({"metadata": {"name": "d", "namespace": "ns", "uid": "u"},
        "spec": {"containers": [{"name": "c", "image": "i", "env": limits_env("")}]}}),
        true,
    );
    assert_eq!(env["CPU"], "2");
    assert_eq!(env["CPU_M"], "1500");
    assert_eq!(env["MEM"], "3221225472");
    assert_eq!(env["MEM_MI"], "3072");
    assert_eq!(env["DISK"], "10737418240");
    assert_eq!(env["REQ_CPU"], "0");
}

/// With pod-level limits (PodLevelResources on) those replace the allocatable for cpu and
/// memory; ephemeral-storage is not a pod-level resource and keeps the allocatable. With
/// the gate off, the pod-level limits are not read.
#[test]
fn downward_limits_default_to_pod_level_limits() {
    let p = serde_json::json!({"metadata": {"name": "d", "namespace": "ns", "uid": "u"},
        "spec": {"resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
        "containers": [{"name": "c", "image": "i", "env": limits_env("")}]}});
    let env = downward_env(p.clone(), true);
    assert_eq!(env["CPU"], "1");
    assert_eq!(env["CPU_M"], "500");
    assert_eq!(env["MEM"], "67108864");
    assert_eq!(env["DISK"], "10737418240");
    let off = downward_env(p, false);
    assert_eq!(off["CPU"], "2");
    assert_eq!(off["MEM"], "3221225472");
}

/// A container's own limits win over pod-level limits and the allocatable; a container
/// named by `containerName` is read the same way.
#[test]
fn downward_limits_keep_the_containers_own() {
    let env = downward_env(
        serde_json::json!({"metadata": {"name": "d", "namespace": "ns", "uid": "u"},
        "spec": {"resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
        "containers": [
            {"name": "c", "image": "i", "env": limits_env("side")},
            {"name": "side", "image": "i",
             "resources": {"limits": {"cpu": "250m", "memory": "32Mi"}}}]}}),
        true,
    );
    assert_eq!(env["CPU"], "1");
    assert_eq!(env["CPU_M"], "250");
    assert_eq!(env["MEM"], "33554432");
    // Without limits of its own, the named container reads the pod-level ones.
    let env = downward_env(
        serde_json::json!({"metadata": {"name": "d", "namespace": "ns", "uid": "u"},
        "spec": {"resources": {"limits": {"cpu": "2", "memory": "1Gi"}},
        "containers": [
            {"name": "c", "image": "i", "env": limits_env("side")},
            {"name": "side", "image": "i"}]}}),
        true,
    );
    assert_eq!(env["CPU_M"], "2000");
    assert_eq!(env["MEM_MI"], "1024");
}

/// A resourceFieldRef naming a container the pod does not have fails the container as
/// upstream's ("container x not found").
#[test]
fn downward_limits_of_an_unknown_container_fail() {
    let p = pod(
        serde_json::json!({"metadata": {"name": "d", "namespace": "ns", "uid": "u"},
        "spec": {"containers": [{"name": "c", "image": "i", "env": limits_env("nope")}]}}),
    );
    let c = &p.spec.as_ref().unwrap().containers[0];
    let e = container_env(
        &p,
        c,
        &[],
        &[],
        &EnvObjects::new(),
        &BTreeMap::new(),
        &allocatable(),
        &mut ExpandBudget::default(),
    )
    .unwrap_err();
    assert_eq!(e.0, "container nope not found");
}

/// The sandbox's resources are the pod's totals: pod-level `spec.resources` replace the
/// containers' sums when the gate is on; a Burstable pod without limits gets shares from
/// its requests and neither quota nor memory limit.
#[test]
fn sandbox_resources_are_the_pods_totals() {
    let p = pod(
        serde_json::json!({"metadata": {"name": "s", "namespace": "ns", "uid": "u"},
        "spec": {"resources": {"limits": {"cpu": "1", "memory": "128Mi"}},
        "containers": [{"name": "a", "image": "i", "resources": {"requests": {"cpu": "100m"}}},
                       {"name": "b", "image": "i"}]}}),
    );
    let n = node();
    let r = sandbox_resources(&n, &p);
    assert_eq!(
        (
            r.cpu_shares,
            r.cpu_quota,
            r.cpu_period,
            r.memory_limit_in_bytes
        ),
        (1024, 100_000, 100_000, 128 << 20)
    );
    let mut off = node();
    off.pod_limits.pod_level_resources = false;
    let r = sandbox_resources(&off, &p);
    assert_eq!(
        (
            r.cpu_shares,
            r.cpu_quota,
            r.cpu_period,
            r.memory_limit_in_bytes
        ),
        (102, 0, 100_000, 0)
    );
    assert_eq!(sandbox_overhead(&n, &p), LinuxResources::default());
}

/// CVE-2017-1002102: configMap, secret, downwardAPI and projected volumes are mounted
/// read-only whatever the mount says, subPath mounts included; so is a claim with
/// `persistentVolumeClaim.readOnly` (issue 37.4: hostPath and local PVs were mounted
/// read-write) and an inline CSI volume with `readOnly`; emptyDir, hostPath and other claims
/// follow the mount's `readOnly`.
#[test]
fn api_data_volumes_are_always_mounted_read_only() {
    let p = pod(serde_json::json!({
        "metadata": {"name": "a", "namespace": "ns", "uid": "u"},
        "spec": {
            "volumes": [
                {"name": "cm", "configMap": {"name": "c"}},
                {"name": "sec", "secret": {"secretName": "s"}},
                {"name": "info", "downwardAPI": {"items": []}},
                {"name": "proj", "projected": {"sources": []}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "host", "hostPath": {"path": "/var/tmp"}},
                {"name": "ro-claim", "persistentVolumeClaim": {"claimName": "a", "readOnly": true}},
                {"name": "rw-claim", "persistentVolumeClaim": {"claimName": "b"}},
                {"name": "ro-csi", "csi": {"driver": "d", "readOnly": true}}
            ],
            "containers": [{"name": "c", "image": "i:1", "volumeMounts": [
                {"name": "cm", "mountPath": "/cm", "readOnly": false},
                {"name": "sec", "mountPath": "/sec"},
                {"name": "info", "mountPath": "/info"},
                {"name": "proj", "mountPath": "/proj"},
                {"name": "info", "mountPath": "/one", "subPath": "labels"},
                {"name": "scratch", "mountPath": "/scratch"},
                {"name": "scratch", "mountPath": "/ro-scratch", "readOnly": true},
                {"name": "host", "mountPath": "/host"},
                {"name": "ro-claim", "mountPath": "/ro-claim", "readOnly": false},
                {"name": "ro-claim", "mountPath": "/ro-claim-sub", "subPath": "x"},
                {"name": "rw-claim", "mountPath": "/rw-claim"},
                {"name": "rw-claim", "mountPath": "/rw-claim-ro", "readOnly": true},
                {"name": "ro-csi", "mountPath": "/ro-csi"}
            ]}]
        }
    }));
    let c = &p.spec.as_ref().unwrap().containers[0];
    let n = node();
    let names = [
        "cm", "sec", "info", "proj", "scratch", "host", "ro-claim", "rw-claim", "ro-csi",
    ];
    let volumes: BTreeMap<String, PathBuf> = names
        .iter()
        .map(|v| (v.to_string(), PathBuf::from(format!("/vol/{v}"))))
        .collect();
    let mut host_paths = ContainerHostPaths::default();
    host_paths
        .subpaths
        .insert(4, PathBuf::from("/pod/volume-subpaths/info/c/4"));
    host_paths
        .subpaths
        .insert(9, PathBuf::from("/pod/volume-subpaths/ro-claim/c/9"));
    let env = ContainerEnv::default();
    let cfg = container_config(
        &n,
        &p,
        c,
        0,
        &volumes,
        None,
        &host_paths,
        &env,
        "",
        Default::default(),
    )
    .unwrap();
    let ro: BTreeMap<&str, bool> = cfg
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.readonly))
        .collect();
    for path in [
        "/cm",
        "/sec",
        "/info",
        "/proj",
        "/one",
        "/ro-scratch",
        "/ro-claim",
        "/ro-claim-sub",
        "/rw-claim-ro",
        "/ro-csi",
    ] {
        assert_eq!(ro.get(path), Some(&true), "{path} must be read-only");
    }
    for path in ["/scratch", "/host", "/rw-claim"] {
        assert_eq!(ro.get(path), Some(&false), "{path} follows readOnly");
    }
}

#[test]
fn namespace_modes_reach_the_sandbox_config() {
    let p = pod(
        serde_json::json!({"metadata": {"name": "a", "uid": "u"}, "spec": {
        "hostNetwork": true, "hostPID": true, "hostIPC": true,
        "containers": [{"name": "c", "image": "i:1", "workingDir": "/srv"}]}}),
    );
    let sb = sandbox_config(&node(), &p, 0, "/kubepods".into());
    assert!(sb.host_network && sb.host_pid && sb.host_ipc);
    let c = config_for(
        &p,
        &p.spec.as_ref().unwrap().containers[0],
        0,
        &[],
        &EnvObjects::new(),
    )
    .unwrap();
    assert_eq!(c.working_dir, "/srv");
    let q = pod(
        serde_json::json!({"metadata": {"name": "a", "uid": "u"}, "spec": {
        "containers": [{"name": "c", "image": "i:1"}]}}),
    );
    let sb = sandbox_config(&node(), &q, 0, "/kubepods".into());
    assert!(!sb.host_network && !sb.host_pid && !sb.host_ipc);
}

#[test]
fn stdin_flags_reach_the_container_config() {
    let p = pod(
        serde_json::json!({"metadata": {"name": "a", "uid": "u"}, "spec": {
        "containers": [{"name": "c", "image": "i:1", "stdin": true, "stdinOnce": true, "tty": true},
                       {"name": "d", "image": "i:1"}]}}),
    );
    let spec = p.spec.as_ref().unwrap();
    let c = config_for(&p, &spec.containers[0], 0, &[], &EnvObjects::new()).unwrap();
    assert_eq!((c.stdin, c.stdin_once, c.tty), (true, true, true));
    let d = config_for(&p, &spec.containers[1], 0, &[], &EnvObjects::new()).unwrap();
    assert_eq!((d.stdin, d.stdin_once, d.tty), (false, false, false));
}

#[test]
fn set_hostname_as_fqdn_needs_a_subdomain_and_fits_the_kernel_nodename() {
    let with = |fields: serde_json::Value| {
        let mut spec = serde_json::json!({"containers": [{"name": "c", "image": "i:1"}]});
        spec.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        pod(
            serde_json::json!({"metadata": {"name": "web-0", "namespace": "shop", "uid": "u"}, "spec": spec}),
        )
    };
    let n = node();
    let fqdn = with(serde_json::json!({"subdomain": "web", "setHostnameAsFQDN": true}));
    assert_eq!(
        kernel_hostname(&n, &fqdn).unwrap(),
        "web-0.web.shop.svc.cluster.local"
    );
    assert_eq!(
        sandbox_config(&n, &fqdn, 0, String::new()).hostname,
        "web-0.web.shop.svc.cluster.local"
    );
    // Without a subdomain there is no domain to add; without the flag the name stays short.
    let no_sub = with(serde_json::json!({"setHostnameAsFQDN": true}));
    assert_eq!(kernel_hostname(&n, &no_sub).unwrap(), "web-0");
    let no_flag = with(serde_json::json!({"subdomain": "web"}));
    assert_eq!(kernel_hostname(&n, &no_flag).unwrap(), "web-0");
    // 64 characters fit; 65 do not.
    let fits = with(
        serde_json::json!({"hostname": "h".repeat(64 - ".web.shop.svc.cluster.local".len()), "subdomain": "web", "setHostnameAsFQDN": true}),
    );
    assert_eq!(kernel_hostname(&n, &fits).unwrap().len(), 64);
    let long = with(
        serde_json::json!({"hostname": "h".repeat(65 - ".web.shop.svc.cluster.local".len()), "subdomain": "web", "setHostnameAsFQDN": true}),
    );
    let err = kernel_hostname(&n, &long).unwrap_err();
    assert!(
        err.ends_with("is too long (64 characters is the max, 65 characters requested)"),
        "{err}"
    );
}

/// Upstream's singleProcessOOMKill: on cgroup v2 a container's cgroup is killed as a whole
/// on OOM (`memory.oom.group` 1) unless singleProcessOOMKill is true; cgroup v1 never gets it.
#[test]
fn cgroup_v2_containers_are_oom_killed_as_a_group_unless_single_process_is_set() {
    use crate::cm::PodLimits;
    let p = res_pod(serde_json::json!([{"name": "a", "resources": {"limits": {"memory": "1Gi"}}}]));
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    let with = |v2: bool, single: Option<bool>| NodeSettings {
        cgroup_v2: v2,
        pod_limits: PodLimits {
            single_process_oom_kill: single,
            ..Default::default()
        },
        ..node()
    };
    for single in [None, Some(false)] {
        let r = linux_resources(&with(true, single), &p, &c);
        assert_eq!(
            r.unified.get("memory.oom.group").map(String::as_str),
            Some("1"),
            "{single:?}"
        );
        // The swap setting sits beside it.
        assert_eq!(r.unified["memory.swap.max"], "0");
    }
    let r = linux_resources(&with(true, Some(true)), &p, &c);
    assert!(!r.unified.contains_key("memory.oom.group"));
    let r = linux_resources(&with(false, None), &p, &c);
    assert!(!r.unified.contains_key("memory.oom.group"));
}
