use super::*;
use crate::cm::resources::Reserved;
use crate::cm::settings::CgroupDriver;
use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const MI: i64 = 1 << 20;
const GI: i64 = 1 << 30;

fn rl(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    })
}

/// (requests, limits) of one container.
type Amounts<'a> = (&'a [(&'a str, &'a str)], &'a [(&'a str, &'a str)]);

fn pod(uid: &str, containers: &[Amounts]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: containers
                .iter()
                .enumerate()
                .map(|(i, (req, lim))| Container {
                    name: format!("c{i}"),
                    resources: Some(ResourceRequirements {
                        requests: rl(req),
                        limits: rl(lim),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn guaranteed() -> Pod {
    let both: &[(&str, &str)] = &[("cpu", "500m"), ("memory", "128Mi")];
    let both2: &[(&str, &str)] = &[("cpu", "250m"), ("memory", "64Mi")];
    pod("g", &[(both, both), (both2, both2)])
}

fn burstable(uid: &str, cpu: &'static str) -> Pod {
    let req: Vec<(&str, &str)> = vec![("cpu", cpu), ("memory", "100Mi")];
    let req: &'static [(&str, &str)] = Box::leak(req.into_boxed_slice());
    pod(uid, &[(req, &[("memory", "200Mi")])])
}

fn besteffort() -> Pod {
    pod("b", &[(&[], &[])])
}

fn manager(fake: Arc<FakeCgroups>, pids: i64, resources: NodeResources) -> ContainerManager {
    ContainerManager::new(
        fake,
        CmConfig {
            namer: CgroupNamer {
                driver: CgroupDriver::Cgroupfs,
                root: "/rig".into(),
                per_qos: true,
            },
            pod_limits: PodLimits {
                pod_pids_limit: pids,
                ..PodLimits::default()
            },
            resources,
            hugepage_sizes: vec![2 << 20],
        },
    )
}

fn files(fake: &FakeCgroups, path: &str) -> Vec<(String, String)> {
    fake.read(path).unwrap().into_iter().collect()
}

fn table(rows: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = rows
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

fn capacity() -> limits::NodeCapacity {
    limits::NodeCapacity {
        cpu_millis: 4000,
        memory_bytes: 8 * GI,
        pids: Some(32768),
        hugepages: [(2 << 20, 0)].into(),
    }
}

fn reserved() -> NodeResources {
    NodeResources {
        kube_reserved: Reserved {
            cpu_millis: 500,
            memory_bytes: GI,
            ephemeral_storage_bytes: 0,
            pids: 1000,
        },
        system_reserved: Reserved {
            cpu_millis: 500,
            memory_bytes: 512 * MI,
            ephemeral_storage_bytes: 0,
            pids: 0,
        },
        ..NodeResources::default()
    }
}

/// The whole tree for three pods, cgroup v1 files.
#[test]
fn v1_table_of_the_tree() {
    let fake = Arc::new(FakeCgroups::default());
    let cm = manager(fake.clone(), 1024, reserved());
    cm.setup_node(&capacity()).unwrap();
    cm.ensure_pod(&guaranteed()).unwrap();
    cm.ensure_pod(&burstable("u1", "250m")).unwrap();
    cm.ensure_pod(&burstable("u2", "1500m")).unwrap();
    cm.ensure_pod(&besteffort()).unwrap();
    // kubepods: allocatable without eviction = 4 − 0.5 − 0.5 CPUs, 8Gi − 1Gi − 512Mi.
    assert_eq!(
        files(&fake, "/rig/kubepods"),
        table(&[
            ("cpu.shares", "3072"),
            ("memory.limit_in_bytes", &(6 * GI + 512 * MI).to_string()),
            ("pids.max", "31768"),
            ("hugetlb.2MB.limit_in_bytes", "0"),
        ])
    );
    // Burstable: the two pods' requests, 1750m → 1792 shares.
    assert_eq!(
        files(&fake, "/rig/kubepods/burstable"),
        table(&[
            ("cpu.shares", "1792"),
            ("hugetlb.2MB.limit_in_bytes", "4611686018427387904"),
        ])
    );
    assert_eq!(
        files(&fake, "/rig/kubepods/besteffort"),
        table(&[
            ("cpu.shares", "2"),
            ("hugetlb.2MB.limit_in_bytes", "4611686018427387904"),
        ])
    );
    // Guaranteed: 750m → 768 shares, quota 75000 per 100000, 192Mi.
    assert_eq!(
        files(&fake, "/rig/kubepods/podg"),
        table(&[
            ("cpu.shares", "768"),
            ("cpu.cfs_period_us", "100000"),
            ("cpu.cfs_quota_us", "75000"),
            ("memory.limit_in_bytes", &(192 * MI).to_string()),
            ("pids.max", "1024"),
            ("hugetlb.2MB.limit_in_bytes", "0"),
        ])
    );
    // Burstable without a CPU limit: shares only; its memory limit is declared everywhere.
    assert_eq!(
        files(&fake, "/rig/kubepods/burstable/podu1"),
        table(&[
            ("cpu.shares", "256"),
            ("memory.limit_in_bytes", &(200 * MI).to_string()),
            ("pids.max", "1024"),
            ("hugetlb.2MB.limit_in_bytes", "0"),
        ])
    );
    assert_eq!(
        files(&fake, "/rig/kubepods/besteffort/podb"),
        table(&[
            ("cpu.shares", "2"),
            ("pids.max", "1024"),
            ("hugetlb.2MB.limit_in_bytes", "0"),
        ])
    );
    // A Burstable pod leaves: the tier's shares drop to the other's 250m.
    cm.remove_pod("u2").unwrap();
    assert!(!fake.exists("/rig/kubepods/burstable/podu2"));
    assert_eq!(
        fake.read("/rig/kubepods/burstable").unwrap()["cpu.shares"],
        "256"
    );
}

/// The same tree on cgroup v2: weights, cpu.max, memory.max; no pids limit configured.
#[test]
fn v2_table_of_the_tree() {
    let fake = Arc::new(FakeCgroups::v2());
    let cm = manager(fake.clone(), -1, reserved());
    cm.setup_node(&capacity()).unwrap();
    cm.ensure_pod(&guaranteed()).unwrap();
    cm.ensure_pod(&burstable("u1", "250m")).unwrap();
    cm.ensure_pod(&besteffort()).unwrap();
    assert_eq!(
        files(&fake, "/rig/kubepods"),
        table(&[
            ("cpu.weight", "118"),
            ("memory.max", &(6 * GI + 512 * MI).to_string()),
            ("pids.max", "31768"),
            ("hugetlb.2MB.max", "0"),
        ])
    );
    assert_eq!(
        files(&fake, "/rig/kubepods/burstable"),
        table(&[
            ("cpu.weight", "10"),
            ("hugetlb.2MB.max", "4611686018427387904"),
        ])
    );
    assert_eq!(
        files(&fake, "/rig/kubepods/besteffort"),
        table(&[
            ("cpu.weight", "1"),
            ("hugetlb.2MB.max", "4611686018427387904")
        ])
    );
    assert_eq!(
        files(&fake, "/rig/kubepods/podg"),
        table(&[
            ("cpu.weight", "30"),
            ("cpu.max", "75000 100000"),
            ("memory.max", &(192 * MI).to_string()),
            ("hugetlb.2MB.max", "0"),
        ])
    );
    assert_eq!(
        files(&fake, "/rig/kubepods/burstable/podu1"),
        table(&[
            ("cpu.weight", "10"),
            ("memory.max", &(200 * MI).to_string()),
            ("hugetlb.2MB.max", "0"),
        ])
    );
    assert_eq!(
        files(&fake, "/rig/kubepods/besteffort/podb"),
        table(&[("cpu.weight", "1"), ("hugetlb.2MB.max", "0")])
    );
}

#[test]
fn without_enforcement_kubepods_gets_capacity_and_cfs_off_means_no_quota() {
    let fake = Arc::new(FakeCgroups::default());
    let mut r = reserved();
    r.enforce_node_allocatable.clear();
    let mut cm = manager(fake.clone(), -1, r);
    cm.cfg.pod_limits.cpu_cfs_quota = false;
    cm.setup_node(&capacity()).unwrap();
    let k = fake.read("/rig/kubepods").unwrap();
    assert_eq!(k["cpu.shares"], "4096");
    assert_eq!(k["memory.limit_in_bytes"], (8 * GI).to_string());
    assert_eq!(k["pids.max"], "32768");
    cm.ensure_pod(&guaranteed()).unwrap();
    assert_eq!(
        fake.read("/rig/kubepods/podg").unwrap()["cpu.cfs_quota_us"],
        "-1"
    );
}

#[test]
fn reserved_cgroups_must_exist_and_get_their_reservation() {
    let fake = Arc::new(FakeCgroups::default());
    let mut r = reserved();
    r.enforce_node_allocatable = vec!["pods".into(), "kube-reserved".into()];
    r.kube_reserved_cgroup = Some("/kube.slice".into());
    let cm = manager(fake.clone(), -1, r);
    let e = cm.setup_node(&capacity()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "kube-reserved is enforced but its cgroup /kube.slice does not exist"
    );
    fake.create("/kube.slice").unwrap();
    cm.setup_node(&capacity()).unwrap();
    assert_eq!(
        files(&fake, "/kube.slice"),
        table(&[
            ("cpu.shares", "512"),
            ("memory.limit_in_bytes", &GI.to_string()),
            ("pids.max", "1000"),
        ])
    );
}

/// The systemd driver: slices started and limited through the unit fake, with v1 properties.
#[test]
fn systemd_driver_makes_limited_slices() {
    use systemd::{FakeUnits, PropValue, SystemdCgroups};
    let units = Arc::new(FakeUnits::default());
    let sd = Arc::new(SystemdCgroups::new(
        units.clone(),
        Arc::new(FakeCgroups::default()),
    ));
    let mut cm = manager(Arc::new(FakeCgroups::default()), 1024, reserved());
    cm.cgroups = sd;
    cm.cfg.namer.driver = CgroupDriver::Systemd;
    cm.setup_node(&capacity()).unwrap();
    cm.ensure_pod(&guaranteed()).unwrap();
    cm.remove_pod("g").unwrap();
    let calls = units.calls.lock().unwrap().clone();
    let started: Vec<&str> = calls
        .iter()
        .filter(|c| c.0 == "StartTransientUnit")
        .map(|c| c.1.as_str())
        .collect();
    assert_eq!(
        started,
        [
            "kubepods.slice",
            "kubepods-burstable.slice",
            "kubepods-besteffort.slice",
            "kubepods-podg.slice"
        ]
    );
    let set = |unit: &str| {
        calls
            .iter()
            .rfind(|c| c.0 == "SetUnitProperties" && c.1 == unit)
            .map(|c| c.2.clone())
            .unwrap()
    };
    assert_eq!(
        set("kubepods.slice"),
        vec![
            ("CPUShares", PropValue::U64(3072)),
            ("MemoryLimit", PropValue::U64((6 * GI + 512 * MI) as u64)),
            ("TasksMax", PropValue::U64(31768)),
        ]
    );
    // 750m over 100ms: 75ms per 100ms = 750000us per second.
    assert_eq!(
        set("kubepods-podg.slice"),
        vec![
            ("CPUShares", PropValue::U64(768)),
            ("CPUQuotaPeriodUSec", PropValue::U64(100_000)),
            ("CPUQuotaPerSecUSec", PropValue::U64(750_000)),
            ("MemoryLimit", PropValue::U64((192 * MI) as u64)),
            ("TasksMax", PropValue::U64(1024)),
        ]
    );
    assert_eq!(
        set("kubepods-besteffort.slice"),
        vec![("CPUShares", PropValue::U64(2))]
    );
    assert!(
        calls
            .iter()
            .any(|c| c.0 == "StopUnit" && c.1 == "kubepods-podg.slice")
    );
    assert_eq!(
        systemd::slice_path("kubepods-burstable-pod12_34.slice"),
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice"
    );
    assert_eq!(systemd::slice_path("/system.slice"), "/system.slice");
    assert_eq!(systemd::unit_name("/system.slice"), "system.slice");
    assert_eq!(systemd::quota_per_sec_usec(1000, 100_000), 10_000);
    assert_eq!(systemd::quota_per_sec_usec(1500, 100_000), 20_000);
    assert_eq!(systemd::quota_per_sec_usec(-1, 100_000), u64::MAX);
}

#[test]
fn systemd_driver_without_systemd_says_so() {
    use systemd::{NoSystemd, SystemdCgroups};
    let sd = Arc::new(SystemdCgroups::new(
        Arc::new(NoSystemd),
        Arc::new(FakeCgroups::default()),
    ));
    let mut cm = manager(Arc::new(FakeCgroups::default()), -1, reserved());
    cm.cgroups = sd;
    cm.cfg.namer.driver = CgroupDriver::Systemd;
    let e = cm.setup_node(&capacity()).unwrap_err();
    assert!(
        e.to_string().contains("systemd is not running as PID 1"),
        "{e}"
    );
}

#[test]
fn init_containers_and_overhead_count_as_upstream() {
    let mut p = pod("i", &[(&[("cpu", "100m")], &[])]);
    let spec = p.spec.as_mut().unwrap();
    spec.init_containers = Some(vec![
        Container {
            name: "sidecar".into(),
            restart_policy: Some("Always".into()),
            resources: Some(ResourceRequirements {
                requests: rl(&[("cpu", "50m")]),
                ..Default::default()
            }),
            ..Default::default()
        },
        Container {
            name: "init".into(),
            resources: Some(ResourceRequirements {
                requests: rl(&[("cpu", "400m")]),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]);
    spec.overhead = rl(&[("cpu", "10m")]);
    // max(100 + 50, 50 + 400) + 10 overhead.
    assert_eq!(limits::pod_amounts(&p, false, true)["cpu"], 460);
    assert_eq!(limits::milli_cpu_to_shares(460), 471);
    assert_eq!(limits::milli_cpu_to_quota(1, 100_000), 1000);
    assert_eq!(limits::milli_cpu_to_shares(1), 2);
    assert_eq!(limits::milli_cpu_to_shares(1_000_000), 262_144);
}

#[test]
fn node_setup_failures_name_the_cgroup_and_the_cause() {
    // kubepods cannot be created (cgroupRoot below a file: ENOTDIR).
    let fake = Arc::new(FakeCgroups::default());
    fake.fail_create
        .lock()
        .unwrap()
        .insert("/rig/kubepods".into(), 20);
    let e = manager(fake.clone(), -1, reserved())
        .setup_node(&capacity())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "failed to create the node allocatable cgroup /rig/kubepods: cgroup /rig/kubepods: Not a directory (os error 20)"
    );
    assert!(fake.live.lock().unwrap().is_empty());

    // Node allocatable cannot be written on kubepods (EBUSY: usage above the limit).
    let fake = Arc::new(FakeCgroups::default());
    fake.fail_set
        .lock()
        .unwrap()
        .insert("/rig/kubepods".into(), 16);
    let e = manager(fake.clone(), -1, reserved())
        .setup_node(&capacity())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "failed to enforce node allocatable limits on /rig/kubepods: cgroup /rig/kubepods: Device or resource busy (os error 16)"
    );

    // A QoS tier cannot be created.
    let fake = Arc::new(FakeCgroups::default());
    fake.fail_create
        .lock()
        .unwrap()
        .insert("/rig/kubepods/besteffort".into(), 13);
    let e = manager(fake.clone(), -1, reserved())
        .setup_node(&capacity())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "failed to create top level BestEffort QOS cgroup /rig/kubepods/besteffort: cgroup /rig/kubepods/besteffort: Permission denied (os error 13)"
    );

    // A tier's shares cannot be written.
    let fake = Arc::new(FakeCgroups::default());
    fake.fail_set
        .lock()
        .unwrap()
        .insert("/rig/kubepods/burstable".into(), 22);
    let e = manager(fake.clone(), -1, reserved())
        .setup_node(&capacity())
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("failed to update top level QOS cgroups: cgroup /rig/kubepods/burstable:"),
        "{e}"
    );

    // An enforced reserved cgroup that refuses its limits.
    let fake = Arc::new(FakeCgroups::default());
    fake.create("/system.slice").unwrap();
    fake.fail_set
        .lock()
        .unwrap()
        .insert("/system.slice".into(), 22);
    let mut r = reserved();
    r.enforce_node_allocatable = vec!["pods".into(), "system-reserved".into()];
    r.system_reserved_cgroup = Some("/system.slice".into());
    let e = manager(fake.clone(), -1, r)
        .setup_node(&capacity())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "failed to enforce System Reserved Cgroup Limits on \"/system.slice\": cgroup /system.slice: Invalid argument (os error 22)"
    );
}

/// A pod with pod-level `spec.resources` (upstream's PodLevelResources) on top of `containers`.
fn pod_level(
    uid: &str,
    requests: &[(&str, &str)],
    limits: &[(&str, &str)],
    containers: &[Amounts],
) -> Pod {
    let mut p = pod(uid, containers);
    p.spec.as_mut().unwrap().resources = Some(ResourceRequirements {
        requests: rl(requests),
        limits: rl(limits),
        ..Default::default()
    });
    p
}

/// Limits only at the pod level, containers without any: Guaranteed (the requests default to
/// the limits), the pod cgroup gets them.
fn pod_level_guaranteed() -> Pod {
    pod_level(
        "pl",
        &[],
        &[("cpu", "500m"), ("memory", "64Mi")],
        &[(&[], &[]), (&[], &[])],
    )
}

/// Pod-level cpu/memory requests and a memory limit; one container limits its cpu, the other
/// does not, so the pod has no CPU quota but the pod-level memory limit.
fn pod_level_burstable() -> Pod {
    pod_level(
        "pb",
        &[("cpu", "250m"), ("memory", "32Mi")],
        &[("memory", "128Mi")],
        &[(&[("cpu", "100m")], &[("cpu", "1")]), (&[], &[])],
    )
}

#[test]
fn v1_table_of_pod_level_resources() {
    let fake = Arc::new(FakeCgroups::default());
    let cm = manager(fake.clone(), 1024, reserved());
    cm.setup_node(&capacity()).unwrap();
    cm.ensure_pod(&pod_level_guaranteed()).unwrap();
    cm.ensure_pod(&pod_level_burstable()).unwrap();
    // 500m → 512 shares, 50000us per 100000us, 64Mi.
    assert_eq!(
        files(&fake, "/rig/kubepods/podpl"),
        table(&[
            ("cpu.shares", "512"),
            ("cpu.cfs_period_us", "100000"),
            ("cpu.cfs_quota_us", "50000"),
            ("memory.limit_in_bytes", &(64 * MI).to_string()),
            ("pids.max", "1024"),
            ("hugetlb.2MB.limit_in_bytes", "0"),
        ])
    );
    // Shares from the pod-level 250m (not the containers' 100m); no quota; 128Mi.
    assert_eq!(
        files(&fake, "/rig/kubepods/burstable/podpb"),
        table(&[
            ("cpu.shares", "256"),
            ("memory.limit_in_bytes", &(128 * MI).to_string()),
            ("pids.max", "1024"),
            ("hugetlb.2MB.limit_in_bytes", "0"),
        ])
    );
    // The Burstable tier counts the pod-level request too.
    assert_eq!(
        fake.read("/rig/kubepods/burstable").unwrap()["cpu.shares"],
        "256"
    );
}

#[test]
fn v2_table_of_pod_level_resources() {
    let fake = Arc::new(FakeCgroups::v2());
    let cm = manager(fake.clone(), -1, reserved());
    cm.setup_node(&capacity()).unwrap();
    cm.ensure_pod(&pod_level_guaranteed()).unwrap();
    cm.ensure_pod(&pod_level_burstable()).unwrap();
    assert_eq!(
        files(&fake, "/rig/kubepods/podpl"),
        table(&[
            ("cpu.weight", "20"),
            ("cpu.max", "50000 100000"),
            ("memory.max", &(64 * MI).to_string()),
            ("hugetlb.2MB.max", "0"),
        ])
    );
    assert_eq!(
        files(&fake, "/rig/kubepods/burstable/podpb"),
        table(&[
            ("cpu.weight", "10"),
            ("memory.max", &(128 * MI).to_string()),
            ("hugetlb.2MB.max", "0"),
        ])
    );
}

/// A pod-level CPU limit declares the quota even when no container limits its CPU; the
/// pod-level values replace the containers' sums; overhead adds to both.
#[test]
fn pod_level_limits_replace_the_containers_and_overhead_adds() {
    let mut p = pod_level(
        "po",
        &[("cpu", "200m")],
        &[("cpu", "1500m")],
        &[
            (&[("cpu", "100m"), ("memory", "10Mi")], &[]),
            (&[("cpu", "50m")], &[("memory", "20Mi")]),
        ],
    );
    p.spec.as_mut().unwrap().overhead = rl(&[("cpu", "10m")]);
    let l = limits::pod_limits(&p, &PodLimits::default(), &[]);
    assert_eq!(l.cpu_shares, Some(limits::milli_cpu_to_shares(210)));
    assert_eq!(l.cpu_quota, Some(151_000));
    // One container has no memory limit and the pod sets none: no memory limit.
    assert_eq!(l.memory, None);
    assert_eq!(
        limits::pod_amounts(&p, false, true)["memory"],
        30 * i128::from(MI)
    );
}

/// With `PodLevelResources: false` the pod-level fields are ignored, as upstream with the
/// gate off: the pod above is BestEffort and its cgroup gets 2 shares only.
#[test]
fn gate_off_ignores_pod_level_resources() {
    let fake = Arc::new(FakeCgroups::default());
    let mut cm = manager(fake.clone(), -1, reserved());
    cm.cfg.pod_limits.pod_level_resources = false;
    cm.setup_node(&capacity()).unwrap();
    cm.ensure_pod(&pod_level_guaranteed()).unwrap();
    assert!(!fake.exists("/rig/kubepods/podpl"));
    assert_eq!(
        files(&fake, "/rig/kubepods/besteffort/podpl"),
        table(&[("cpu.shares", "2"), ("hugetlb.2MB.limit_in_bytes", "0")])
    );
}
