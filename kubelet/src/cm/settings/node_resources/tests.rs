use super::*;

fn file(text: &str) -> KubeletConfiguration {
    crate::settings::parse_file("t.yaml", text).unwrap()
}

fn hard(r: &NodeResources) -> Vec<(Signal, Amount)> {
    r.eviction
        .thresholds
        .iter()
        .filter(|t| t.is_hard())
        .map(|t| (t.signal, t.value))
        .collect()
}

#[test]
fn defaults_are_upstreams() {
    let r = NodeResources::default();
    assert_eq!(r.kube_reserved, Reserved::default());
    assert_eq!(r.enforce_node_allocatable, vec!["pods".to_string()]);
    assert_eq!(
        r.eviction.pressure_transition_period,
        Duration::from_secs(300)
    );
    assert_eq!(r.eviction.max_pod_grace_period, 0);
    // The five Linux defaults (sorted by name), then the allocatable copy of memory.available.
    assert_eq!(
        hard(&r),
        vec![
            (Signal::ImageFsAvailable, Amount::Fraction(0.15)),
            (Signal::ImageFsInodesFree, Amount::Fraction(0.05)),
            (Signal::MemoryAvailable, Amount::Quantity(100 << 20)),
            (Signal::NodeFsAvailable, Amount::Fraction(0.10)),
            (Signal::NodeFsInodesFree, Amount::Fraction(0.05)),
            (
                Signal::AllocatableMemoryAvailable,
                Amount::Quantity(100 << 20)
            ),
        ]
    );
}

#[test]
fn a_given_eviction_hard_replaces_the_defaults_unless_merged() {
    let r = parse(
        &Flags::default(),
        &file("evictionHard: {memory.available: 200Mi}\nenforceNodeAllocatable: []\n"),
    )
    .unwrap();
    assert_eq!(
        hard(&r),
        vec![(Signal::MemoryAvailable, Amount::Quantity(200 << 20))]
    );
    let r = parse(
        &Flags::default(),
        &file(
            "evictionHard: {memory.available: 200Mi, nodefs.available: 0%}\n\
             mergeDefaultEvictionSettings: true\nenforceNodeAllocatable: []\n",
        ),
    )
    .unwrap();
    // 0% switches nodefs.available off; the other defaults are merged in.
    let signals: Vec<Signal> = hard(&r).into_iter().map(|(s, _)| s).collect();
    assert_eq!(
        signals,
        vec![
            Signal::ImageFsAvailable,
            Signal::ImageFsInodesFree,
            Signal::MemoryAvailable,
            Signal::NodeFsInodesFree
        ]
    );
}

#[test]
fn soft_thresholds_need_a_grace_period_and_take_min_reclaim() {
    let err = parse(
        &Flags::default(),
        &file("evictionSoft: {memory.available: 1Gi}\n"),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid configuration: grace period must be specified for the soft eviction threshold memory.available"
    );
    let r = parse(
        &Flags::default(),
        &file(
            "evictionSoft: {memory.available: 1Gi}\n\
             evictionSoftGracePeriod: {memory.available: 1m30s}\n\
             evictionMinimumReclaim: {memory.available: 500Mi, nodefs.available: 5%}\n",
        ),
    )
    .unwrap();
    let soft: Vec<&Threshold> = r
        .eviction
        .thresholds
        .iter()
        .filter(|t| !t.is_hard())
        .collect();
    assert_eq!(soft.len(), 1);
    assert_eq!(soft[0].grace_period, Duration::from_secs(90));
    assert_eq!(soft[0].min_reclaim, Some(Amount::Quantity(500 << 20)));
    let nodefs = r
        .eviction
        .thresholds
        .iter()
        .find(|t| t.signal == Signal::NodeFsAvailable)
        .unwrap();
    assert_eq!(nodefs.min_reclaim, Some(Amount::Fraction(0.05)));
}

#[test]
fn bad_eviction_values_are_refused_with_upstreams_words() {
    let cases = [
        (
            "evictionHard: {memory.free: 1Gi}\n",
            "unsupported eviction signal memory.free",
        ),
        (
            "evictionHard: {memory.available: \"-1\"}\n",
            "eviction threshold memory.available must be positive: -1",
        ),
        (
            "evictionHard: {nodefs.available: 120%}\n",
            "eviction percentage threshold nodefs.available must be <= 100%: 120%",
        ),
        (
            "evictionMinimumReclaim: {nodefs.available: 0%}\n",
            "eviction percentage minimum reclaim nodefs.available must be positive: 0%",
        ),
    ];
    for (text, want) in cases {
        let err = parse(&Flags::default(), &file(text))
            .unwrap_err()
            .to_string();
        assert!(err.ends_with(want), "{text}: {err}");
    }
}

#[test]
fn flags_win_over_the_file() {
    let flags = Flags {
        eviction_hard: Some(BTreeMap::from([(
            "memory.available".to_string(),
            "1Gi".to_string(),
        )])),
        kube_reserved: Some(BTreeMap::from([("cpu".to_string(), "250m".to_string())])),
        eviction_pressure_transition_period: Some("30s".into()),
        ..Flags::default()
    };
    let r = parse(
        &flags,
        &file("evictionHard: {memory.available: 2Gi}\nkubeReserved: {cpu: \"1\"}\n"),
    )
    .unwrap();
    assert_eq!(r.kube_reserved.cpu_millis, 250);
    assert_eq!(
        hard(&r)[0],
        (Signal::MemoryAvailable, Amount::Quantity(1 << 30))
    );
    assert_eq!(
        r.eviction.pressure_transition_period,
        Duration::from_secs(30)
    );
}

#[test]
fn reservations_parse_as_upstreams_resource_list() {
    let r = parse(
        &Flags::default(),
        &file(
            "kubeReserved: {cpu: 100m, memory: 256Mi, ephemeral-storage: 1Gi, pid: 1000}\n\
             systemReserved: {memory: 1G}\n",
        ),
    )
    .unwrap();
    assert_eq!(
        r.kube_reserved,
        Reserved {
            cpu_millis: 100,
            memory_bytes: 256 << 20,
            ephemeral_storage_bytes: 1 << 30,
            pids: 1000
        }
    );
    assert_eq!(r.system_reserved.memory_bytes, 1_000_000_000);
    let err = parse(&Flags::default(), &file("kubeReserved: {gpu: \"1\"}\n")).unwrap_err();
    assert!(
        err.to_string().ends_with("cannot reserve \"gpu\" resource"),
        "{err}"
    );
    let err = parse(&Flags::default(), &file("kubeReserved: {memory: -1Mi}\n")).unwrap_err();
    assert!(err.to_string().contains("cannot be negative"), "{err}");
}

#[test]
fn reserved_system_cpus_replace_system_reserved_cpu() {
    let r = parse(
        &Flags::default(),
        &file("reservedSystemCPUs: \"0-1,3\"\nsystemReserved: {cpu: 100m}\n"),
    )
    .unwrap();
    assert_eq!(r.system_reserved.cpu_millis, 3000);
    assert_eq!(cpuset_size("0-3,2,7").unwrap(), 5);
    assert!(cpuset_size("3-1").is_err());
    let err = parse(
        &Flags::default(),
        &file("reservedSystemCPUs: \"0\"\nkubeReservedCgroup: /kube.slice\n"),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("can't use reservedSystemCPUs"),
        "{err}"
    );
}

#[test]
fn enforce_node_allocatable_is_validated() {
    let r = parse(&Flags::default(), &file("enforceNodeAllocatable: [none]\n")).unwrap();
    assert!(r.enforce_node_allocatable.is_empty());
    // Without "pods" there is no allocatable memory threshold.
    assert!(
        r.eviction
            .thresholds
            .iter()
            .all(|t| t.signal != Signal::AllocatableMemoryAvailable)
    );
    for (text, want) in [
        (
            "enforceNodeAllocatable: [pods, none]\n",
            "may not contain additional",
        ),
        (
            "enforceNodeAllocatable: [cpus]\n",
            "invalid option \"cpus\"",
        ),
        (
            "enforceNodeAllocatable: [pods, system-reserved]\n",
            "systemReservedCgroup (--system-reserved-cgroup) must be specified",
        ),
    ] {
        let err = parse(&Flags::default(), &file(text))
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{text}: {err}");
    }
    let r = parse(
        &Flags::default(),
        &file("enforceNodeAllocatable: [pods, kube-reserved]\nkubeReservedCgroup: /kube.slice\n"),
    )
    .unwrap();
    assert!(r.enforces("kube-reserved"));
    assert_eq!(r.kube_reserved_cgroup.as_deref(), Some("/kube.slice"));
}
