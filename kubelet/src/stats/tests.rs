use super::build::{CpuHistory, Raw};
use super::node::{FakeNode, FsInfo, NodeUsage};
use super::*;
use crate::runtime::fake::FakeRuntime;
use crate::runtime::{
    ContainerConfig, ContainerSecurity, LinuxResources, SandboxConfig, SandboxSecurity,
};
use std::collections::BTreeMap;

fn sandbox(name: &str, uid: &str) -> SandboxConfig {
    SandboxConfig {
        name: name.into(),
        namespace: "default".into(),
        uid: uid.into(),
        attempt: 0,
        hostname: name.into(),
        log_directory: String::new(),
        dns: None,
        port_mappings: Vec::new(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        cgroup_parent: String::new(),
        host_network: false,
        host_pid: false,
        share_process_namespace: false,
        host_ipc: false,
        sysctls: BTreeMap::new(),
        security: SandboxSecurity::default(),
        resources: None,
        overhead: None,
        runtime_handler: String::new(),
        userns: None,
    }
}

fn container(name: &str) -> ContainerConfig {
    ContainerConfig {
        name: name.into(),
        attempt: 0,
        image: "busybox:1.35".into(),
        command: Vec::new(),
        args: Vec::new(),
        working_dir: String::new(),
        envs: Vec::new(),
        mounts: Vec::new(),
        devices: Vec::new(),
        cdi_devices: Vec::new(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        log_path: format!("{name}/0.log"),
        stdin: false,
        stdin_once: false,
        tty: false,
        resources: LinuxResources::default(),
        security: ContainerSecurity::default(),
    }
}

/// Runs `pods` pods of `per_pod` containers each on the fake; returns the container IDs.
async fn run(rt: &FakeRuntime, pods: usize, per_pod: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for p in 0..pods {
        let cfg = sandbox(&format!("web-{p}"), &format!("uid-{p}"));
        let sb = rt.run_sandbox(&cfg).await.unwrap();
        for c in 0..per_pod {
            let id = rt
                .create_container(&sb, &container(&format!("c{c}")), &cfg)
                .await
                .unwrap();
            rt.start_container(&id).await.unwrap();
            ids.push(id);
        }
    }
    ids
}

const GIB: u64 = 1 << 30;

fn fake_node() -> Arc<FakeNode> {
    Arc::new(FakeNode {
        usage: std::sync::Mutex::new(NodeUsage {
            cpu_core_nano_seconds: Some(5_000_000_000),
            memory_usage_bytes: Some(3 * GIB),
            memory_working_set_bytes: Some(2 * GIB),
            memory_capacity_bytes: Some(8 * GIB),
            ..NodeUsage::default()
        }),
        fs: FsInfo {
            capacity_bytes: 100 * GIB,
            available_bytes: 60 * GIB,
            used_bytes: 40 * GIB,
            inodes: 1000,
            inodes_free: 900,
        },
        fs_at: Default::default(),
        boot_time: 1_700_000_000,
        cgroups: None,
        proc_root: "/nonexistent".into(),
        machine: cadvisor::Machine {
            cores: 2,
            memory_bytes: 8 * GIB,
            machine_id: "m1".into(),
            system_uuid: "u1".into(),
            boot_id: "b1".into(),
            ..cadvisor::Machine::default()
        },
    })
}

fn config(dir: &std::path::Path) -> ProviderConfig {
    ProviderConfig::new("node-a".into(), dir.join("root"), dir.join("logs"))
}

fn provider(rt: Arc<FakeRuntime>, dir: &std::path::Path) -> Provider {
    Provider::new(rt, fake_node(), config(dir))
}

#[tokio::test]
async fn summary_json_has_upstreams_fields_and_figures() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let ids = run(&rt, 1, 2).await;
    rt.set_usage(&ids[0], 3_000_000_000, 10 << 20);
    rt.set_usage(&ids[1], 1_000_000_000, 6 << 20);
    rt.set_network("sb1", 1500, 700);
    rt.set_image_fs_used(123 << 20);
    // An emptyDir with 8 KiB of data and a log file: both count in ephemeral-storage.
    let vol = dir
        .path()
        .join("root/pods/uid-0/volumes/kubernetes.io~empty-dir/cache");
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::write(vol.join("data"), vec![7u8; 8192]).unwrap();
    let logs = dir.path().join("logs/default_web-0_uid-0/c0");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join("0.log"), vec![b'x'; 4096]).unwrap();

    let p = provider(rt.clone(), dir.path());
    let snap = p.snapshot().await.unwrap();
    let v = serde_json::to_value(&snap.summary).unwrap();
    let node = &v["node"];
    assert_eq!(node["nodeName"], "node-a");
    assert_eq!(node["startTime"], "2023-11-14T22:13:20Z");
    assert_eq!(node["cpu"]["usageCoreNanoSeconds"], 5_000_000_000u64);
    assert_eq!(node["memory"]["workingSetBytes"], 2 * GIB);
    assert_eq!(node["memory"]["usageBytes"], 3 * GIB);
    assert_eq!(
        node["memory"]["availableBytes"],
        6 * GIB,
        "capacity minus working set"
    );
    assert_eq!(node["fs"]["capacityBytes"], 100 * GIB);
    assert_eq!(node["fs"]["availableBytes"], 60 * GIB);
    assert_eq!(node["fs"]["inodesUsed"], 100);
    assert_eq!(node["runtime"]["imageFs"]["usedBytes"], 123u64 << 20);
    // Second-precision RFC 3339, as metav1.Time.
    let t = node["cpu"]["time"].as_str().unwrap();
    assert!(t.ends_with('Z') && !t.contains('.'), "{t}");

    let pods = v["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 1);
    let pod = &pods[0];
    assert_eq!(
        pod["podRef"],
        serde_json::json!({"name": "web-0", "namespace": "default", "uid": "uid-0"})
    );
    assert_eq!(pod["cpu"]["usageCoreNanoSeconds"], 4_000_000_000u64);
    assert_eq!(pod["memory"]["workingSetBytes"], 16u64 << 20);
    assert_eq!(pod["network"]["name"], "eth0");
    assert_eq!(pod["network"]["rxBytes"], 1500);
    assert_eq!(pod["network"]["txBytes"], 700);
    assert_eq!(pod["network"]["interfaces"][0]["name"], "eth0");
    assert_eq!(pod["process_stats"]["process_count"], 2);
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers[0]["name"], "c0");
    assert_eq!(
        containers[0]["cpu"]["usageCoreNanoSeconds"],
        3_000_000_000u64
    );
    assert_eq!(containers[0]["memory"]["workingSetBytes"], 10u64 << 20);
    assert_eq!(containers[0]["rootfs"]["usedBytes"], 4096);
    assert!(containers[0]["logs"]["usedBytes"].as_u64().unwrap() >= 4096);
    assert!(containers[1].get("logs").is_none(), "c1 has no log dir");
    let volume = &pod["volume"][0];
    assert_eq!(volume["name"], "cache");
    assert!(volume["usedBytes"].as_u64().unwrap() >= 8192);
    let eph = pod["ephemeral-storage"]["usedBytes"].as_u64().unwrap();
    // Two writable layers (4096 each) + the log dir + the volume.
    assert!(eph >= 2 * 4096 + 4096 + 8192, "{eph}");
    assert_eq!(
        eph,
        2 * 4096
            + containers[0]["logs"]["usedBytes"].as_u64().unwrap()
            + volume["usedBytes"].as_u64().unwrap()
    );
}

/// CVE-2020-8557: the pod's managed /etc/hosts is mounted writable into its containers and
/// lives in the pod's directory. Writes to it count in the pod's ephemeral storage, so a
/// container filling it is evicted at its `ephemeral-storage` limit like one filling its
/// writable layer.
#[tokio::test]
async fn cve_2020_8557_etc_hosts_counts_in_the_pods_ephemeral_storage() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    run(&rt, 1, 1).await;
    // The container appended 1 MiB to its /etc/hosts.
    let pod_dir = dir.path().join("root/pods/uid-0");
    std::fs::create_dir_all(&pod_dir).unwrap();
    std::fs::write(pod_dir.join("etc-hosts"), vec![b'#'; 1 << 20]).unwrap();
    let p = provider(rt.clone(), dir.path());
    let snap = p.snapshot().await.unwrap();
    let stats = &snap.summary.pods[0];
    let eph = stats.ephemeral_storage.as_ref().unwrap();
    let used = eph.used_bytes.unwrap();
    let layer = stats.containers[0].rootfs.as_ref().unwrap();
    // The writable layer and the file's blocks.
    assert!(used >= layer.used_bytes.unwrap() + (1 << 20), "{used}");
    assert_eq!(
        eph.inodes_used,
        Some(layer.inodes_used.unwrap() + 1),
        "the layer's inodes and the file's"
    );

    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-0", "namespace": "default", "uid": "uid-0"},
        "spec": {"containers": [{"name": "c0", "image": "i",
            "resources": {"limits": {"ephemeral-storage": "512Ki"}}}]}
    }))
    .unwrap();
    let v = crate::eviction::rank::storage_violation(&pod, stats, &[], false, true)
        .expect("over its limit through /etc/hosts");
    assert_eq!(v.signal, "ephemeralpodfs.limit");
    assert_eq!(
        v.message,
        "Pod ephemeral local storage usage exceeds the total limit of containers 512Ki. "
    );
}

#[tokio::test]
async fn a_refresh_makes_a_fixed_number_of_cri_calls_and_requests_make_none() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    run(&rt, 20, 3).await;
    rt.clear_calls();
    let p = provider(rt.clone(), dir.path());
    // The first request finds no snapshot: it waits for (here: makes) one.
    let s = p.snapshot().await.unwrap();
    assert_eq!(s.summary.pods.len(), 20);
    let mut calls = rt.calls();
    calls.sort();
    assert_eq!(
        calls,
        [
            "ImageFsInfo",
            "ListContainers",
            "ListPodSandbox",
            "ListPodSandboxStats"
        ],
        "60 containers, still one call of each kind"
    );
    // Requests only read the last snapshot, however many.
    for _ in 0..50 {
        p.snapshot().await.unwrap();
    }
    assert_eq!(rt.calls().len(), 4);
    // The next refresh makes the same calls again.
    p.refresh().await.unwrap();
    assert_eq!(rt.calls().len(), 8);
}

#[tokio::test]
async fn the_housekeeping_task_refreshes_on_its_period_and_requests_cost_no_call() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let ids = run(&rt, 3, 1).await;
    rt.clear_calls();
    let cfg = ProviderConfig {
        housekeeping: Duration::from_millis(200),
        ..config(dir.path())
    };
    let p = Arc::new(Provider::new(rt.clone(), fake_node(), cfg));
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(p.clone().run(cancel.clone()));
    rt.set_usage(&ids[0], 1_000_000_000, 1);
    let first = p.snapshot().await.unwrap();
    let stats = |calls: &[String]| calls.iter().filter(|c| *c == "ListPodSandboxStats").count();
    // Within one period, 100 requests: the same snapshot, no CRI call.
    let before = rt.calls().len();
    for _ in 0..100 {
        let s = p.snapshot().await.unwrap();
        if !Arc::ptr_eq(&s, &first) {
            break;
        }
    }
    assert!(
        rt.calls().len() - before <= 4,
        "at most one refresh meanwhile"
    );
    // New figures show up after a period without any request asking for them.
    rt.set_usage(&ids[0], 3_000_000_000, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let cpu = |s: &Snapshot| {
        s.summary.pods.iter().find_map(|p| {
            p.containers
                .iter()
                .find(|c| c.id == ids[0])
                .and_then(|c| c.cpu.as_ref()?.usage_core_nano_seconds)
        })
    };
    while cpu(&p.snapshot().await.unwrap()) != Some(3_000_000_000) {
        assert!(Instant::now() < deadline, "the task refreshed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refreshes = stats(&rt.calls());
    assert!(refreshes >= 2, "{refreshes}");
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the task stops when cancelled")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stats(&rt.calls()), refreshes, "no refresh after cancel");
}

#[tokio::test]
async fn usage_nano_cores_comes_from_two_samples() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let ids = run(&rt, 1, 1).await;
    let p = provider(rt.clone(), dir.path());
    rt.set_usage(&ids[0], 1_000_000_000, 1);
    let first = p.refresh().await.unwrap();
    let c = &first.summary.pods[0].containers[0];
    assert_eq!(c.cpu.as_ref().unwrap().usage_nano_cores, None);
    // The fake's clock advances 1 ms per call: 4 calls later, 2 ms of CPU more = 0.5 cores.
    rt.set_usage(&ids[0], 1_002_000_000, 1);
    let second = p.refresh().await.unwrap();
    let c = &second.summary.pods[0].containers[0];
    assert_eq!(c.cpu.as_ref().unwrap().usage_nano_cores, Some(500_000_000));
}

#[test]
fn node_nano_cores_from_the_previous_refresh() {
    let mut prev = CpuHistory::new();
    let mut raw = Raw {
        now_ns: 10_000_000_000,
        node: NodeUsage {
            cpu_core_nano_seconds: Some(20_000_000_000),
            ..NodeUsage::default()
        },
        ..Raw::default()
    };
    let s = build::summary(&raw, &mut prev);
    assert_eq!(s.node.cpu.unwrap().usage_nano_cores, None);
    raw.now_ns += 2_000_000_000;
    raw.node.cpu_core_nano_seconds = Some(23_000_000_000);
    let s = build::summary(&raw, &mut prev);
    assert_eq!(s.node.cpu.unwrap().usage_nano_cores, Some(1_500_000_000));
}

#[test]
fn working_set_is_usage_minus_inactive_file() {
    let stat = "cache 100\nrss 5\ntotal_rss 4096\ntotal_inactive_file 1000\ntotal_pgfault 7\ntotal_pgmajfault 1\n";
    let u = node::v1_memory(5000, stat);
    assert_eq!(u.memory_usage_bytes, Some(5000));
    assert_eq!(u.memory_working_set_bytes, Some(4000));
    assert_eq!(u.memory_rss_bytes, Some(4096));
    assert_eq!((u.page_faults, u.major_page_faults), (Some(7), Some(1)));
    // Never below zero.
    assert_eq!(node::v1_memory(500, stat).memory_working_set_bytes, Some(0));
    let meminfo = "MemTotal:       8000 kB\nMemFree:        3000 kB\nInactive(file):  1000 kB\n";
    let u = node::meminfo_memory(meminfo);
    assert_eq!(u.memory_usage_bytes, Some(5000 * 1024));
    assert_eq!(u.memory_working_set_bytes, Some(4000 * 1024));
}

#[tokio::test]
async fn resource_metrics_carry_upstream_names_labels_and_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let ids = run(&rt, 1, 1).await;
    rt.set_usage(&ids[0], 2_500_000_000, 4096);
    let p = Arc::new(provider(rt.clone(), dir.path()));
    let snap = p.snapshot().await.unwrap();
    let text = resource::render(&snap.summary, false);
    let ts = snap.summary.node.cpu.as_ref().unwrap().time.millis();
    assert!(ts > 1_600_000_000_000, "a millisecond timestamp: {ts}");
    assert!(
        text.contains(&format!("node_cpu_usage_seconds_total 5 {ts}\n")),
        "{text}"
    );
    assert!(text.contains(&format!("node_memory_working_set_bytes 2147483648 {ts}\n")));
    assert!(text.contains(
        "container_cpu_usage_seconds_total{container=\"c0\",namespace=\"default\",pod=\"web-0\"} 2.5 "
    ));
    assert!(text.contains(
        "container_memory_working_set_bytes{container=\"c0\",namespace=\"default\",pod=\"web-0\"} 4096 "
    ));
    assert!(text.contains("pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"web-0\"} 2.5 "));
    assert!(
        text.contains("pod_memory_working_set_bytes{namespace=\"default\",pod=\"web-0\"} 4096 ")
    );
    assert!(text.contains("# TYPE container_start_time_seconds gauge\n"));
    assert!(text.contains("# TYPE node_cpu_usage_seconds_total counter\n"));
    assert!(text.contains("\nscrape_error 0\n"));
    assert!(text.contains("\nresource_scrape_error 0\n"));
}

#[tokio::test]
async fn without_the_pod_list_requests_get_500_and_a_scrape_error_but_node_figures_stay() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    run(&rt, 1, 1).await;
    let handle = Handle::default();
    // Before the runtime answers: 503.
    assert_eq!(
        handle.summary().await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let p = Arc::new(provider(rt.clone(), dir.path()));
    handle.set(p.clone());
    let unavailable = crate::runtime::RuntimeError::Unavailable("down".into());
    rt.fail_next("ListPodSandbox", unavailable);
    assert_eq!(
        handle.summary().await.status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let text = body(handle.resource_metrics().await).await;
    assert!(text.contains("\nscrape_error 1\n"), "{text}");
    assert!(!text.contains("node_cpu_usage_seconds_total "), "{text}");
    let text = body(handle.cadvisor_metrics().await).await;
    assert!(text.contains("\ncontainer_scrape_error 1\n"), "{text}");
    assert!(
        !text.contains("container_cpu_usage_seconds_total{"),
        "{text}"
    );
    // What the eviction manager reads still has the node's own figures.
    let snap = p.snapshot().await.unwrap();
    assert!(snap.gaps.contains_key(&gaps::Source::PodSandboxes));
    assert_eq!(
        snap.summary.node.memory.as_ref().unwrap().working_set_bytes,
        Some(2 * GIB)
    );
    assert!(snap.summary.node.fs.is_some());
    // Recovered at the next refresh: requests are served again.
    p.refresh().await.unwrap();
    assert_eq!(handle.summary().await.status(), StatusCode::OK);
    let text = body(handle.cadvisor_metrics().await).await;
    assert!(text.contains("\ncontainer_scrape_error 0\n"), "{text}");
}

/// The node: a pod's old sandbox was stopped behind the agent's back and a new one
/// runs. containerd 1.6 fails the whole ListPodSandboxStats over the stopped one; the
/// refresh still serves every pod with the runtime's figures, asked of each ready sandbox.
#[tokio::test]
async fn a_stats_list_failing_on_a_stopped_sandbox_falls_back_to_each_ready_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let ids = run(&rt, 2, 1).await;
    rt.set_usage(&ids[0], 1_000_000_000, 10 << 20);
    // Pod 0's first sandbox died; its second runs the container again.
    let cfg = sandbox("web-0", "uid-0");
    let old = rt.list_pod_sandboxes("uid-0").await.unwrap().remove(0).id;
    rt.stop_sandbox(&old).await.unwrap();
    let new = rt.run_sandbox(&cfg).await.unwrap();
    let c = rt
        .create_container(&new, &container("c0"), &cfg)
        .await
        .unwrap();
    rt.start_container(&c).await.unwrap();
    rt.set_usage(&c, 2_000_000_000, 20 << 20);
    rt.fail_stats_list_on_not_ready();
    let err = rt.list_sandbox_stats().await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "failed to decode sandbox container metrics for sandbox {old:?}: failed to get pod sandbox stats since sandbox container {old:?} is not in ready state"
        )),
        "{err}"
    );
    let vol = dir
        .path()
        .join("root/pods/uid-0/volumes/kubernetes.io~empty-dir/scratch");
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::write(vol.join("fill"), vec![1u8; 64 << 10]).unwrap();

    let p = Arc::new(provider(rt.clone(), dir.path()));
    let handle = Handle::default();
    handle.set(p.clone());
    rt.clear_calls();
    let snap = p
        .refresh()
        .await
        .expect("one stopped sandbox fails no refresh");
    // Each ready sandbox was asked once; the stopped one not at all.
    assert_eq!(rt.count("PodSandboxStats"), 2, "{:?}", rt.calls());
    assert_eq!(snap.summary.pods.len(), 2);
    let pod0 = snap
        .summary
        .pods
        .iter()
        .find(|s| s.pod_ref.uid == "uid-0")
        .unwrap();
    let c0 = &pod0.containers[0];
    assert_eq!(
        c0.memory.as_ref().unwrap().working_set_bytes,
        Some(20 << 20)
    );
    assert!(c0.rootfs.as_ref().unwrap().used_bytes.is_some(), "{c0:?}");
    assert!(
        pod0.volume
            .iter()
            .any(|v| v.name == "scratch" && v.fs.used_bytes.is_some_and(|b| b >= 64 << 10)),
        "{pod0:?}"
    );
    // The list's failure is noted, no sandbox is blind, and requests are served.
    assert_eq!(
        snap.gaps.keys().copied().collect::<Vec<_>>(),
        [gaps::Source::SandboxStatsList]
    );
    assert!(snap.gaps[&gaps::Source::SandboxStatsList].contains("is not in ready state"));
    assert_eq!(handle.summary().await.status(), StatusCode::OK);
    // Once the old sandbox is gone, the list answers again.
    rt.remove_sandbox(&old).await.unwrap();
    let snap = p.refresh().await.unwrap();
    assert!(snap.gaps.is_empty(), "{:?}", snap.gaps);
    assert_eq!(snap.summary.pods.len(), 2);
}

/// A sandbox whose own PodSandboxStats fails too costs only that pod's runtime figures.
#[tokio::test]
async fn a_sandbox_whose_own_stats_fail_costs_only_its_figures() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    run(&rt, 2, 1).await;
    rt.fail_next(
        "ListPodSandboxStats",
        crate::runtime::RuntimeError::Call {
            op: "ListPodSandboxStats",
            message: "Unknown: one bad item".into(),
        },
    );
    rt.fail_next(
        "PodSandboxStats",
        crate::runtime::RuntimeError::Call {
            op: "PodSandboxStats",
            message: "Unknown: shim gone".into(),
        },
    );
    let snap = provider(rt.clone(), dir.path()).refresh().await.unwrap();
    assert_eq!(snap.summary.pods.len(), 2);
    let with_rootfs = snap
        .summary
        .pods
        .iter()
        .filter(|p| p.containers.iter().any(|c| c.rootfs.is_some()))
        .count();
    assert_eq!(with_rootfs, 1, "{:?}", snap.summary.pods);
    assert!(
        snap.gaps[&gaps::Source::SandboxStats].starts_with("1 of 2 ready sandboxes: "),
        "{:?}",
        snap.gaps
    );
}

async fn body(r: Response) -> String {
    assert_eq!(r.status(), StatusCode::OK);
    let b = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
    String::from_utf8(b.to_vec()).unwrap()
}

#[test]
fn only_the_kubelets_own_volume_kinds_are_walked() {
    let dir = tempfile::tempdir().unwrap();
    let vols = dir.path().join("volumes");
    for kind in ["kubernetes.io~secret/token", "kubernetes.io~csi/data"] {
        std::fs::create_dir_all(vols.join(kind)).unwrap();
        std::fs::write(vols.join(kind).join("f"), b"abc").unwrap();
    }
    let d = disk::pod_disk(&disk::PodDirs {
        uid: "u".into(),
        volumes: vols,
        logs: dir.path().join("none"),
        etc_hosts: dir.path().join("none"),
    });
    let names: Vec<&str> = d.volumes.iter().map(|v| v.0.as_str()).collect();
    assert_eq!(names, ["token"]);
    assert_eq!(d.volumes[0].2, 2, "the directory and its file");
    assert!(d.logs.is_empty());
}

#[test]
fn times_serialize_as_metav1_time() {
    use summary::StatTime;
    let t = serde_json::to_value(StatTime(1_700_000_000_999_999_999)).unwrap();
    assert_eq!(t, "2023-11-14T22:13:20Z");
    assert_eq!(
        serde_json::to_value(StatTime(0)).unwrap(),
        serde_json::Value::Null
    );
    assert_eq!(
        StatTime(1_700_000_000_999_999_999).millis(),
        1_700_000_000_999
    );
}

/// A cgroup v1 tree as runc lays it out with cgroupfs: memory and cpuacct hierarchies with
/// `<root>/kubepods/besteffort/pod<uid>/<container id>`.
fn cgroup_tree(base: &std::path::Path, uid: &str, members: &[(&str, u64, u64)]) {
    let rel = format!("rig/kubepods/besteffort/pod{uid}");
    let pod_mem = base.join("memory").join(&rel);
    let pod_cpu = base.join("cpuacct").join(&rel);
    let write = |dir: &std::path::Path, cpu_dir: &std::path::Path, cpu: u64, usage: u64| {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::create_dir_all(cpu_dir).unwrap();
        std::fs::write(dir.join("memory.usage_in_bytes"), format!("{usage}\n")).unwrap();
        std::fs::write(
            dir.join("memory.stat"),
            "total_cache 3000\ntotal_rss 7000\ntotal_inactive_file 1000\ntotal_pgfault 5\ntotal_pgmajfault 0\n",
        )
        .unwrap();
        std::fs::write(cpu_dir.join("cpuacct.usage"), format!("{cpu}\n")).unwrap();
    };
    let total_cpu = members.iter().map(|m| m.1).sum();
    let total_mem = members.iter().map(|m| m.2).sum();
    write(&pod_mem, &pod_cpu, total_cpu, total_mem);
    for (id, cpu, mem) in members {
        write(&pod_mem.join(id), &pod_cpu.join(id), *cpu, *mem);
    }
}

#[tokio::test]
async fn cpu_memory_and_network_come_from_cgroups_and_the_runtimes_stats_once_a_period() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let ids = run(&rt, 1, 1).await;
    // The runtime says something else: the cgroup files win.
    rt.set_usage(&ids[0], 1, 1);
    let cg = dir.path().join("cgroup");
    cgroup_tree(
        &cg,
        "uid-0",
        &[("sb1", 1_000, 10_000), (&ids[0], 2_000_000_000, 20_000)],
    );
    std::fs::write(
        cg.join("memory/rig/kubepods/besteffort/poduid-0/sb1/cgroup.procs"),
        "4242\n",
    )
    .unwrap();
    let net = dir.path().join("proc/4242/net");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(
        net.join("dev"),
        "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0\n  eth0:    5000      40    1    0    0     0          0         0     3000      30    2    0    0     0       0          0\n",
    )
    .unwrap();
    let mut node = Arc::into_inner(fake_node()).unwrap();
    node.cgroups = Some(cgroups::Layout::V1 {
        memory: cg.join("memory"),
        cpuacct: cg.join("cpuacct"),
    });
    node.proc_root = dir.path().join("proc");
    rt.clear_calls();
    let p = Provider::new(rt.clone(), Arc::new(node), config(dir.path()));
    let s = p.refresh().await.unwrap();
    let pod = &s.summary.pods[0];
    let c = &pod.containers[0];
    assert_eq!(
        c.cpu.as_ref().unwrap().usage_core_nano_seconds,
        Some(2_000_000_000)
    );
    let m = c.memory.as_ref().unwrap();
    assert_eq!(
        (m.usage_bytes, m.working_set_bytes, m.rss_bytes),
        (Some(20_000), Some(19_000), Some(7000))
    );
    assert_eq!(
        pod.memory.as_ref().unwrap().usage_bytes,
        Some(30_000),
        "the pod cgroup"
    );
    let n = pod.network.as_ref().unwrap();
    assert_eq!(
        (
            n.default.name.as_str(),
            n.default.rx_bytes,
            n.default.tx_errors
        ),
        ("eth0", Some(5000), Some(2))
    );
    assert_eq!(n.interfaces.len(), 1, "lo is not reported");
    assert_eq!(
        c.rootfs.as_ref().unwrap().used_bytes,
        Some(4096),
        "writable layer from the runtime"
    );
    let pod_cg = "/rig/kubepods/besteffort/poduid-0";
    assert_eq!(s.cadvisor.cgroups.pods["uid-0"], pod_cg);
    assert_eq!(
        s.cadvisor.cgroups.containers[&ids[0]],
        format!("{pod_cg}/{}", ids[0])
    );
    assert_eq!(rt.calls().len(), 4);
    // Within the aggregation period a refresh reads the cgroups again but not the runtime's
    // stats: three list calls, none per container.
    std::fs::write(
        cg.join("cpuacct/rig/kubepods/besteffort/poduid-0")
            .join(&ids[0])
            .join("cpuacct.usage"),
        "2500000000\n",
    )
    .unwrap();
    rt.clear_calls();
    let s = p.refresh().await.unwrap();
    let mut calls = rt.calls();
    calls.sort();
    assert_eq!(calls, ["ImageFsInfo", "ListContainers", "ListPodSandbox"]);
    let cpu = s.summary.pods[0].containers[0].cpu.clone().unwrap();
    assert_eq!(cpu.usage_core_nano_seconds, Some(2_500_000_000));
    assert!(
        cpu.usage_nano_cores.is_some_and(|n| n > 0),
        "a rate from two samples"
    );
    assert_eq!(
        s.summary.pods[0].containers[0]
            .rootfs
            .as_ref()
            .unwrap()
            .used_bytes,
        Some(4096),
        "the runtime's last figures stand"
    );
}

#[test]
fn pod_and_container_cgroups_are_found_with_either_driver() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let sd = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice";
    std::fs::create_dir_all(root.join(sd).join("cri-containerd-abc.scope")).unwrap();
    std::fs::create_dir_all(root.join(sd).join("cri-containerd-xabc.scope")).unwrap();
    std::fs::create_dir_all(root.join("kubepods/pod56-78/def")).unwrap();
    std::fs::create_dir_all(root.join("system.slice/other.service")).unwrap();
    let layout = cgroups::Layout::V2 { root: root.into() };
    let mut l = cgroups::Locator::default();
    let ids = l.resolve(
        &layout,
        &[
            ("12-34".into(), vec!["abc".into()]),
            ("56-78".into(), vec!["def".into(), "gone".into()]),
        ],
    );
    assert_eq!(ids.pods["12-34"], format!("/{sd}"));
    assert_eq!(
        ids.containers["abc"],
        format!("/{sd}/cri-containerd-abc.scope")
    );
    assert_eq!(ids.pods["56-78"], "/kubepods/pod56-78");
    assert_eq!(ids.containers["def"], "/kubepods/pod56-78/def");
    assert!(!ids.containers.contains_key("gone"));
}

/// A cgroup v2 tree (systemd driver) with the files cAdvisor reads beyond usage, PSI among them.
#[tokio::test]
async fn on_cgroup_v2_psi_reaches_the_summary_and_throttling_and_pressure_the_cadvisor_series() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let ids = run(&rt, 1, 1).await;
    let root = dir.path().join("cgroup");
    let pod = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poduid_0.slice";
    let files = |d: &std::path::Path, some: u64| {
        std::fs::create_dir_all(d).unwrap();
        for (name, text) in [
            ("memory.current", "20000\n".to_string()),
            ("memory.stat", "anon 7000\nfile 3000\ninactive_file 1000\nfile_mapped 11\n".into()),
            (
                "cpu.stat",
                "usage_usec 2000000\nnr_periods 50\nnr_throttled 20\nthrottled_usec 700000\n".into(),
            ),
            ("cpu.max", "30000 100000\n".into()),
            ("memory.max", "67108864\n".into()),
            (
                "cpu.pressure",
                format!("some avg10=12.50 avg60=3.00 avg300=1.00 total={some}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=250000\n"),
            ),
            (
                "memory.pressure",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=5\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=2\n".into(),
            ),
            (
                "io.pressure",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=40\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=30\n".into(),
            ),
        ] {
            std::fs::write(d.join(name), text).unwrap();
        }
    };
    files(&root, 9_000_000);
    files(&root.join(pod), 4_000_000);
    files(
        &root
            .join(pod)
            .join(format!("cri-containerd-{}.scope", ids[0])),
        1_500_000,
    );
    let mut node = Arc::into_inner(fake_node()).unwrap();
    node.cgroups = Some(cgroups::Layout::V2 { root: root.clone() });
    let p = Provider::new(rt.clone(), Arc::new(node), config(dir.path()));
    let s = p.refresh().await.unwrap();
    let pod_stats = &s.summary.pods[0];
    let c = &pod_stats.containers[0];
    let cpu_psi = c
        .cpu
        .as_ref()
        .unwrap()
        .psi
        .as_ref()
        .expect("container cpu psi");
    assert_eq!((cpu_psi.some.total, cpu_psi.some.avg10), (1_500_000, 12.5));
    assert_eq!(cpu_psi.full.total, 250_000);
    assert_eq!(
        c.memory.as_ref().unwrap().psi.as_ref().unwrap().full.total,
        2
    );
    assert_eq!(c.io.as_ref().unwrap().psi.as_ref().unwrap().some.total, 40);
    let pod_psi = pod_stats.cpu.as_ref().unwrap().psi.as_ref().unwrap();
    assert_eq!(pod_psi.some.total, 4_000_000);
    assert!(pod_stats.io.is_some());
    let node_psi = s.summary.node.cpu.as_ref().unwrap().psi.as_ref().unwrap();
    assert_eq!(node_psi.some.total, 9_000_000, "the root cgroup's");
    assert!(s.summary.node.io.as_ref().unwrap().psi.is_some());
    // Upstream's JSON: `psi` with `full` and `some`, each total/avg10/avg60/avg300.
    let json: serde_json::Value = serde_json::from_slice(&s.summary_json()).unwrap();
    let c_json = &json["pods"][0]["containers"][0];
    assert_eq!(c_json["cpu"]["psi"]["some"]["total"], 1_500_000);
    assert_eq!(c_json["cpu"]["psi"]["some"]["avg10"], 12.5);
    assert_eq!(c_json["cpu"]["psi"]["full"]["avg300"], 0.0);
    assert_eq!(c_json["io"]["psi"]["full"]["total"], 30);
    assert!(c_json["io"]["time"].is_string());
    assert_eq!(json["node"]["memory"]["psi"]["some"]["total"], 5);

    let text = cadvisor::render(&s.summary, &*s.cadvisor_meta().await, false);
    let line = |family: &str, id: &str| -> String {
        text.lines()
            .find(|l| l.starts_with(&format!("{family}{{")) && l.contains(&format!("id=\"{id}\"")))
            .unwrap_or_else(|| panic!("{family} for {id} in:\n{text}"))
            .to_string()
    };
    let ctr_cg = format!("/{pod}/cri-containerd-{}.scope", ids[0]);
    assert!(line("container_cpu_cfs_throttled_periods_total", &ctr_cg).contains(" 20 "));
    assert!(line("container_cpu_cfs_throttled_seconds_total", &ctr_cg).contains(" 0.7 "));
    assert!(line("container_spec_cpu_quota", &ctr_cg).ends_with(" 30000"));
    assert!(line("container_spec_memory_limit_bytes", &ctr_cg).ends_with(" 67108864"));
    assert!(line("container_memory_mapped_file", &ctr_cg).contains(" 11 "));
    assert!(line("container_pressure_cpu_waiting_seconds_total", &ctr_cg).contains(" 1.5 "));
    assert!(
        line(
            "container_pressure_cpu_stalled_seconds_total",
            &format!("/{pod}")
        )
        .contains(" 0.25 ")
    );
    assert!(line("container_pressure_io_waiting_seconds_total", "/").contains(" 0.00004 "));
}

/// The refresh reads usage and pressure only; the rest of what `/metrics/cadvisor` serves
/// (limits, throttling, memory details, I/O) is read by the first scrape of a snapshot and
/// shared by its later scrapes.
#[tokio::test]
async fn cadvisor_details_are_read_by_the_first_scrape_of_a_snapshot_not_by_the_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let ids = run(&rt, 1, 1).await;
    let root = dir.path().join("cgroup");
    let ctr = root.join(format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poduid_0.slice/cri-containerd-{}.scope",
        ids[0]
    ));
    std::fs::create_dir_all(&ctr).unwrap();
    for d in [&root, &ctr] {
        std::fs::write(d.join("memory.current"), "20000\n").unwrap();
        std::fs::write(d.join("memory.stat"), "anon 7000\ninactive_file 1000\n").unwrap();
        std::fs::write(d.join("cpu.stat"), "usage_usec 2000000\n").unwrap();
    }
    let quota = |q: u64| std::fs::write(ctr.join("cpu.max"), format!("{q} 100000\n")).unwrap();
    quota(10_000);
    let mut node = Arc::into_inner(fake_node()).unwrap();
    node.cgroups = Some(cgroups::Layout::V2 { root: root.clone() });
    let p = Provider::new(rt.clone(), Arc::new(node), config(dir.path()));
    let scraped = |m: &cadvisor::Meta| {
        let cg = &m.cgroups.containers[&ids[0]];
        m.details.get(cg).and_then(|d| d.spec.cpu_quota)
    };
    let s = p.refresh().await.unwrap();
    assert!(
        s.cadvisor.details.is_empty(),
        "the refresh reads no details"
    );
    // The limit changes after the refresh: the first scrape reads it then.
    quota(20_000);
    let first = s.cadvisor_meta().await;
    assert_eq!(scraped(&first), Some(20_000));
    assert!(first.details.contains_key("/"), "the root cgroup's too");
    assert!(first.details_time.is_some_and(|t| t.0 >= s.cadvisor.time.0));
    // Later scrapes of the same snapshot share that reading.
    quota(30_000);
    assert_eq!(scraped(&*s.cadvisor_meta().await), Some(20_000));
    let text = cadvisor::render(&s.summary, &*s.cadvisor_meta().await, false);
    assert!(
        text.lines()
            .any(|l| l.starts_with("container_spec_cpu_quota{") && l.ends_with(" 20000")),
        "{text}"
    );
    // The next snapshot reads again.
    let s = p.refresh().await.unwrap();
    assert_eq!(scraped(&*s.cadvisor_meta().await), Some(30_000));
}

/// The process series: the first scrape counts the container's processes, their descriptors
/// and sockets under the node's `/proc`, and its first process's open-files limit; the
/// pod's own cgroup lists none.
#[tokio::test]
async fn a_scrape_counts_a_containers_processes_descriptors_and_threads() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let ids = run(&rt, 1, 1).await;
    let root = dir.path().join("cgroup");
    let pod =
        root.join("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poduid_0.slice");
    let ctr = pod.join(format!("cri-containerd-{}.scope", ids[0]));
    std::fs::create_dir_all(&ctr).unwrap();
    for d in [&root, &ctr] {
        std::fs::write(d.join("memory.current"), "20000\n").unwrap();
        std::fs::write(d.join("memory.stat"), "anon 7000\npgfault 42\n").unwrap();
        std::fs::write(
            d.join("cpu.stat"),
            "usage_usec 2000000\nuser_usec 1500000\n",
        )
        .unwrap();
    }
    std::fs::write(ctr.join("cgroup.procs"), "300\n301\n").unwrap();
    std::fs::write(ctr.join("pids.current"), "5\n").unwrap();
    std::fs::write(ctr.join("pids.max"), "max\n").unwrap();
    let proc_root = dir.path().join("proc");
    for (pid, fds) in [(300, 3), (301, 1)] {
        let fd = proc_root.join(format!("{pid}/fd"));
        std::fs::create_dir_all(&fd).unwrap();
        for i in 0..fds {
            let target = if i == 0 { "socket:[7]" } else { "/dev/null" };
            std::os::unix::fs::symlink(target, fd.join(i.to_string())).unwrap();
        }
    }
    std::fs::write(
        proc_root.join("300/limits"),
        "Max open files            65536                65536                files     \n",
    )
    .unwrap();
    let mut node = Arc::into_inner(fake_node()).unwrap();
    node.cgroups = Some(cgroups::Layout::V2 { root: root.clone() });
    node.proc_root = proc_root;
    let p = Provider::new(rt.clone(), Arc::new(node), config(dir.path()));
    let s = p.refresh().await.unwrap();
    let meta = s.cadvisor_meta().await;
    let text = cadvisor::render(&s.summary, &meta, false);
    let dms = meta.details_time.unwrap().millis();
    let line = |family: &str, name: &str| {
        text.lines()
            .find(|l| {
                l.starts_with(&format!("{family}{{"))
                    && l.contains(&format!("name=\"{name}\""))
                    && l.contains("container=\"")
            })
            .unwrap_or_else(|| panic!("{family} {name:?} in:\n{text}"))
            .to_string()
    };
    let value =
        |family: &str, name: &str| line(family, name).split(' ').nth(1).unwrap().to_string();
    let id = ids[0].as_str();
    assert_eq!(value("container_processes", id), "2");
    assert_eq!(value("container_file_descriptors", id), "4");
    assert_eq!(value("container_sockets", id), "2");
    assert_eq!(value("container_threads", id), "5");
    assert_eq!(value("container_threads_max", id), "0");
    assert!(line("container_ulimits_soft", id).contains("ulimit=\"max_open_files\"} 65536 "));
    assert_eq!(value("container_cpu_user_seconds_total", id), "1.5");
    assert!(
        text.lines()
            .any(|l| l.starts_with("container_memory_failures_total{")
                && l.contains("failure_type=\"pgmajfault\"")
                && l.contains(&format!("name=\"{id}\""))
                && l.ends_with(&format!(" 0 {dms}"))),
        "{text}"
    );
    // Only containers have a process whose limits cAdvisor reads.
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("container_ulimits_soft{") && l.contains("name=\"\"")),
        "{text}"
    );
}

/// `node.systemContainers`: each reading becomes a container with CPU (usageNanoCores from the
/// previous refresh) and memory and no filesystem figures; `kubelet` starts with the agent.
#[test]
fn system_containers_carry_cpu_and_memory() {
    use super::cgroups::CgroupUsage;
    use super::system::{KUBELET, PODS};
    let usage = |cpu_ns: u64| CgroupUsage {
        cpu_ns: Some(cpu_ns),
        usage: Some(4000),
        working_set: Some(3900),
        rss: Some(700),
        ..CgroupUsage::default()
    };
    let mut prev = CpuHistory::new();
    let mut raw = Raw {
        now_ns: 10_000_000_000,
        boot_time: Some(1),
        kubelet_start_ns: 5,
        system: vec![
            (KUBELET, usage(2_000_000_000)),
            (PODS, usage(7_000_000_000)),
        ],
        ..Raw::default()
    };
    let s = build::summary(&raw, &mut prev);
    let sys = &s.node.system_containers;
    assert_eq!(
        sys.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        vec!["kubelet", "pods"]
    );
    assert_eq!(sys[0].start_time.0, 5);
    assert_eq!(sys[1].start_time.0, 1_000_000_000);
    let mem = sys[0].memory.as_ref().unwrap();
    assert_eq!(
        (mem.usage_bytes, mem.working_set_bytes),
        (Some(4000), Some(3900))
    );
    assert!(sys[0].rootfs.is_none() && sys[0].logs.is_none());
    raw.now_ns = 20_000_000_000;
    raw.system[1].1 = usage(8_000_000_000);
    let s = build::summary(&raw, &mut prev);
    assert_eq!(
        s.node.system_containers[1]
            .cpu
            .as_ref()
            .unwrap()
            .usage_nano_cores,
        Some(100_000_000),
        "1 s of CPU over 10 s"
    );
}
