use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, LocalVolumeSource, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
    PersistentVolumeSpec, Pod,
};

use super::fake::FakeFsUsage;
use super::*;
use crate::volume::csi::{CsiDrivers, CsiMounter};
use crate::volume::volume_claims::{Storage, fake::FakeStorageApi};

fn figures() -> VolumeStats {
    VolumeStats {
        capacity_bytes: 10 << 30,
        available_bytes: 6 << 30,
        used_bytes: 4 << 30,
        inodes: 1000,
        inodes_free: 900,
        inodes_used: 100,
    }
}

/// A pod with claims `ns/<claim>` bound to PV `pv-<claim>` of the given source.
fn storage(root: &Path, pvs: &[(&str, PersistentVolumeSpec)], usage: Arc<FakeFsUsage>) -> Storage {
    let api = Arc::new(FakeStorageApi::default());
    for (claim, spec) in pvs {
        let mut pvc = PersistentVolumeClaim::default();
        pvc.metadata.uid = Some(format!("{claim}-uid"));
        pvc.spec = Some(PersistentVolumeClaimSpec {
            volume_name: Some(format!("pv-{claim}")),
            ..Default::default()
        });
        pvc.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        });
        api.claims
            .lock()
            .unwrap()
            .insert(format!("ns/{claim}"), pvc);
        let pv = PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                claim_ref: Some(ObjectReference {
                    uid: Some(format!("{claim}-uid")),
                    ..Default::default()
                }),
                ..spec.clone()
            }),
            ..Default::default()
        };
        api.volumes
            .lock()
            .unwrap()
            .insert(format!("pv-{claim}"), pv);
    }
    Storage::new(
        api,
        CsiMounter {
            root_dir: root.to_path_buf(),
            node_name: "node-a".into(),
            drivers: Arc::new(CsiDrivers::default()),
            mounted: crate::volume::csi::mounter::is_mounted,
        },
    )
    .with_fs_usage(usage)
}

fn pod(claims: &[&str]) -> Pod {
    let volumes: Vec<serde_json::Value> = claims
        .iter()
        .map(|c| serde_json::json!({"name": format!("vol-{c}"), "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "ns", "uid": "uid-1"},
        "spec": {"volumes": volumes, "containers": [{"name": "c", "image": "i"}]}
    }))
    .unwrap()
}

/// The `kubelet_volume_stats_used_bytes` sample of a claim, as /metrics shows it.
fn metric(claim: &str) -> Option<String> {
    use prometheus::core::Collector;
    let families: Vec<_> = crate::metrics::volumes().stats[2]
        .collect()
        .into_iter()
        .filter(|f| !f.get_metric().is_empty())
        .collect();
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&families)
        .unwrap();
    text.lines().find_map(|l| {
        (l.starts_with("kubelet_volume_stats_used_bytes{")
            && l.contains(&format!("persistentvolumeclaim=\"{claim}\"")))
        .then(|| l.to_string())
    })
}

/// A local PV is measured with statfs of its path: in the pod's volume stats with its claim
/// and in kubelet_volume_stats_*; a hostPath PV is not (upstream's hostPath has no metrics).
/// Once the pod goes, both go.
#[tokio::test]
async fn a_local_pv_is_measured_and_a_host_path_pv_is_not() {
    let root = tempfile::tempdir().unwrap();
    let local_dir = root.path().join("local-disk");
    let host_dir = root.path().join("host-dir");
    std::fs::create_dir_all(&local_dir).unwrap();
    std::fs::create_dir_all(&host_dir).unwrap();
    let usage = Arc::new(FakeFsUsage::default());
    *usage.stats.lock().unwrap() = figures();
    let s = storage(
        root.path(),
        &[
            (
                "stats-local",
                PersistentVolumeSpec {
                    local: Some(LocalVolumeSource {
                        path: local_dir.display().to_string(),
                        fs_type: None,
                    }),
                    ..Default::default()
                },
            ),
            (
                "stats-host",
                PersistentVolumeSpec {
                    host_path: Some(HostPathVolumeSource {
                        path: host_dir.display().to_string(),
                        type_: None,
                    }),
                    ..Default::default()
                },
            ),
        ],
        usage.clone(),
    );
    let p = pod(&["stats-local", "stats-host"]);
    for v in p.spec.as_ref().unwrap().volumes.as_ref().unwrap() {
        s.set_up(&p, v).await.unwrap();
    }
    s.local.measure_due(Duration::from_secs(60)).await;
    assert_eq!(*usage.asked.lock().unwrap(), vec![local_dir.clone()]);
    let got = s.pod_volume_stats("uid-1");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].volume, "vol-stats-local");
    assert_eq!(
        got[0].claim,
        Some(("ns".to_string(), "stats-local".to_string()))
    );
    assert_eq!(got[0].stats, figures());
    assert!(got[0].at_ns > 0);
    let line = metric("stats-local").expect("kubelet_volume_stats_used_bytes for the local PV");
    assert!(line.ends_with(&format!(" {}", 4u64 << 30)), "{line}");
    assert_eq!(metric("stats-host"), None);
    s.tear_down("uid-1").await.unwrap();
    assert!(s.pod_volume_stats("uid-1").is_empty());
    assert_eq!(
        metric("stats-local"),
        None,
        "the claim's samples go with the pod"
    );
}

/// volumeStatsAggPeriod: a measurement is reused until it is `period` old; a failed statfs is
/// retried at the next look.
#[tokio::test]
async fn a_local_pv_is_measured_once_per_period() {
    let usage = Arc::new(FakeFsUsage::default());
    let local = LocalVolumes::new(usage.clone());
    local.add("uid-1", "a", None, Path::new("/mnt/a"));
    local.add("uid-1", "b", None, Path::new("/mnt/b"));
    usage.failing.lock().unwrap().push(PathBuf::from("/mnt/b"));
    let asked = |u: &FakeFsUsage| u.asked.lock().unwrap().len();
    local.measure_due(Duration::from_secs(3600)).await;
    assert_eq!(asked(&usage), 2);
    assert_eq!(local.pod_stats("uid-1").len(), 1, "the failed one has none");
    // Within the period: only the failed one is tried again.
    local.measure_due(Duration::from_secs(3600)).await;
    assert_eq!(usage.asked.lock().unwrap()[2..], [PathBuf::from("/mnt/b")]);
    usage.failing.lock().unwrap().clear();
    // A zero period measures every time.
    local.measure_due(Duration::ZERO).await;
    assert_eq!(asked(&usage), 5);
    assert_eq!(local.pod_stats("uid-1").len(), 2);
}

/// The real statfs of a directory: sane figures.
#[test]
fn statfs_of_a_real_directory() {
    let d = tempfile::tempdir().unwrap();
    let s = StatFs.usage(d.path()).unwrap();
    assert!(
        s.capacity_bytes > 0 && s.capacity_bytes >= s.available_bytes,
        "{s:?}"
    );
    assert_eq!(
        s.used_bytes + (s.capacity_bytes - s.used_bytes),
        s.capacity_bytes
    );
    assert!(s.inodes >= s.inodes_free);
    assert!(StatFs.usage(&d.path().join("missing")).is_err());
}
