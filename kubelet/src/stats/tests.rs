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
        host_ipc: false,
        sysctls: BTreeMap::new(),
        security: SandboxSecurity::default(),
        resources: None,
        runtime_handler: String::new(),
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
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        log_path: format!("{name}/0.log"),
        stdin: false,
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
        boot_time: 1_700_000_000,
    })
}

fn provider(rt: Arc<FakeRuntime>, dir: &std::path::Path, max_age: Duration) -> Provider {
    Provider::new(
        rt,
        fake_node(),
        ProviderConfig {
            node_name: "node-a".into(),
            root_dir: dir.join("root"),
            pod_logs_dir: dir.join("logs"),
            max_age,
        },
    )
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

    let p = provider(rt.clone(), dir.path(), DEFAULT_MAX_AGE);
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

#[tokio::test]
async fn a_refresh_makes_a_fixed_number_of_cri_calls_and_is_cached() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    run(&rt, 20, 3).await;
    rt.clear_calls();
    let p = provider(rt.clone(), dir.path(), DEFAULT_MAX_AGE);
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
    // Within max age: served from the cache, no call at all.
    for _ in 0..5 {
        p.snapshot().await.unwrap();
    }
    assert_eq!(rt.calls().len(), 4);
}

#[tokio::test]
async fn usage_nano_cores_comes_from_two_samples() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    let ids = run(&rt, 1, 1).await;
    let p = provider(rt.clone(), dir.path(), Duration::ZERO);
    rt.set_usage(&ids[0], 1_000_000_000, 1);
    let first = p.snapshot().await.unwrap();
    let c = &first.summary.pods[0].containers[0];
    assert_eq!(c.cpu.as_ref().unwrap().usage_nano_cores, None);
    // The fake's clock advances 1 ms per call: 4 calls later, 2 ms of CPU more = 0.5 cores.
    rt.set_usage(&ids[0], 1_002_000_000, 1);
    let second = p.snapshot().await.unwrap();
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
    let p = Arc::new(provider(rt.clone(), dir.path(), DEFAULT_MAX_AGE));
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
async fn a_failed_refresh_is_a_scrape_error_and_a_500_summary() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    run(&rt, 1, 1).await;
    let handle = Handle::default();
    // Before the runtime answers: 503.
    assert_eq!(
        handle.summary().await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    handle.set(Arc::new(provider(rt.clone(), dir.path(), Duration::ZERO)));
    let unavailable = crate::runtime::RuntimeError::Unavailable("down".into());
    rt.fail_next("ListPodSandboxStats", unavailable.clone());
    assert_eq!(
        handle.summary().await.status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
    rt.fail_next("ListPodSandboxStats", unavailable);
    let r = handle.resource_metrics().await;
    assert_eq!(r.status(), StatusCode::OK);
    let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.contains("\nscrape_error 1\n"), "{text}");
    assert!(!text.contains("node_cpu_usage_seconds_total "), "{text}");
    // Recovered: the next request is served.
    assert_eq!(handle.summary().await.status(), StatusCode::OK);
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
