//! Raw pod starts straight through the runtime (RunPodSandbox + CreateContainer +
//! StartContainer, no kubelet logic): the baseline the pod-start benches compare the agent
//! with, in the same run. Used by `benches/pod_start.rs` and the cluster bench in `tests/`.

use super::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// The image the raw pods run (`sleep 3600`).
pub const IMAGE: &str = "docker.io/library/busybox:1.35";

pub fn sandbox(i: usize, tag: &str, logs: &Path, cgroup_root: &str) -> SandboxConfig {
    let uid = format!("raw-{tag}-{i}");
    let name = format!("raw-{tag}-{i}");
    SandboxConfig {
        name: name.clone(),
        namespace: "default".into(),
        uid: uid.clone(),
        attempt: 0,
        hostname: name.clone(),
        log_directory: logs.join(&uid).display().to_string(),
        dns: Some(DnsConfig::default()),
        port_mappings: vec![],
        labels: [
            (LABEL_POD_UID.to_string(), uid.clone()),
            (LABEL_POD_NAME.to_string(), name),
        ]
        .into(),
        annotations: BTreeMap::new(),
        cgroup_parent: format!("{cgroup_root}/kubepods/besteffort/pod{uid}"),
        host_network: false,
        host_pid: false,
        share_process_namespace: false,
        host_ipc: false,
        sysctls: BTreeMap::new(),
        security: Default::default(),
        resources: None,
        overhead: None,
        runtime_handler: String::new(),
        userns: None,
    }
}

pub fn container(sb: &SandboxConfig) -> ContainerConfig {
    ContainerConfig {
        name: "app".into(),
        attempt: 0,
        image: IMAGE.into(),
        command: vec!["sleep".into(), "3600".into()],
        args: vec![],
        working_dir: String::new(),
        envs: vec![],
        mounts: vec![],
        devices: vec![],
        cdi_devices: vec![],
        labels: sb.labels.clone(),
        annotations: BTreeMap::new(),
        log_path: "app/0.log".into(),
        stdin: false,
        stdin_once: false,
        tty: false,
        resources: LinuxResources {
            cpu_shares: 2,
            oom_score_adj: 1000,
            ..Default::default()
        },
        security: Default::default(),
    }
}

/// Starts `n` pods at once straight through the CRI; per-pod latencies in ms.
pub async fn pod_starts(
    rt: Arc<dyn Runtime>,
    n: usize,
    tag: &str,
    logs: &Path,
    cgroup_root: &str,
) -> Vec<f64> {
    let pods = (0..n)
        .map(|i| {
            let sb = sandbox(i, tag, logs, cgroup_root);
            let c = container(&sb);
            (sb, c)
        })
        .collect();
    pod_starts_of(rt, pods).await
}

/// Starts these pods at once straight through the CRI (RunPodSandbox + CreateContainer +
/// StartContainer each); per-pod latencies in ms. The sandboxes go afterwards.
pub async fn pod_starts_of(
    rt: Arc<dyn Runtime>,
    pods: Vec<(SandboxConfig, ContainerConfig)>,
) -> Vec<f64> {
    let mut set = tokio::task::JoinSet::new();
    for (sb, cfg) in pods {
        let rt = rt.clone();
        std::fs::create_dir_all(&sb.log_directory).unwrap();
        set.spawn(async move {
            let t = Instant::now();
            let id = rt.run_sandbox(&sb).await.expect("RunPodSandbox");
            let c = rt
                .create_container(&id, &cfg, &sb)
                .await
                .expect("CreateContainer");
            rt.start_container(&c).await.expect("StartContainer");
            (t.elapsed().as_secs_f64() * 1000.0, id)
        });
    }
    let mut out = Vec::new();
    let mut ids = Vec::new();
    while let Some(r) = set.join_next().await {
        let (ms, id) = r.unwrap();
        out.push(ms);
        ids.push(id);
    }
    for id in ids {
        let _ = rt.stop_sandbox(&id).await;
        let _ = rt.remove_sandbox(&id).await;
    }
    out
}
