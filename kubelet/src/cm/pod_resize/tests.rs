use super::*;
use crate::cm::{Cgroups, FakeCgroups};
use std::sync::Arc;

fn pod(cpu_req: &str, cpu_lim: &str, mem: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"uid": "u1"},
        "spec": {"containers": [{"name": "c", "resources": {
            "requests": {"cpu": cpu_req, "memory": "16Mi"},
            "limits": {"cpu": cpu_lim, "memory": mem}}}]}
    }))
    .unwrap()
}

fn files(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn values_read_back_from_either_layout() {
    let v1 = files(&[
        ("cpu.cfs_quota_us", "20000"),
        ("cpu.shares", "51"),
        ("memory.limit_in_bytes", "9223372036854771712"),
    ]);
    assert_eq!(
        parse_values(&v1, CgroupVersion::V1),
        PodCgroupValues {
            cpu_quota: Some(20_000),
            cpu_shares: Some(51),
            memory: Some(-1),
        }
    );
    let v2 = files(&[
        ("cpu.max", "max 100000"),
        ("cpu.weight", "2"),
        ("memory.max", "67108864"),
    ]);
    assert_eq!(
        parse_values(&v2, CgroupVersion::V2),
        PodCgroupValues {
            cpu_quota: Some(-1),
            cpu_shares: Some(28),
            memory: Some(64 << 20),
        }
    );
}

/// Each part writes its own files only: a CPU limit leaves the memory limit as it was, and
/// what is written reads back as the wanted values (v2 shares through the weight).
#[test]
fn one_part_at_a_time_and_read_back_as_wanted() {
    for fake in [FakeCgroups::default(), FakeCgroups::v2()] {
        let fake = Arc::new(fake);
        for tier in ["/kubepods/burstable", "/kubepods/besteffort"] {
            fake.create(tier).unwrap();
        }
        let cm = ContainerManager::for_test(fake.clone());
        let small = pod("50m", "100m", "64Mi");
        cm.ensure_pod(&small).unwrap();
        assert_eq!(
            cm.pod_values(&small).unwrap(),
            Some(cm.wanted_pod_values(&small))
        );
        let big = pod("100m", "200m", "128Mi");
        cm.set_pod_value(&big, PodCgroupPart::CpuLimit).unwrap();
        let now = cm.pod_values(&big).unwrap().unwrap();
        assert_eq!(now.cpu_quota, Some(20_000));
        assert_eq!(now.memory, Some(64 << 20), "memory untouched");
        assert_eq!(now.cpu_shares, cm.wanted_pod_values(&small).cpu_shares);
        cm.set_pod_value(&big, PodCgroupPart::MemoryLimit).unwrap();
        cm.set_pod_value(&big, PodCgroupPart::CpuRequest).unwrap();
        assert_eq!(
            cm.pod_values(&big).unwrap(),
            Some(cm.wanted_pod_values(&big))
        );
        // The Burstable tier's shares follow the new request (100m → 102).
        let tier = fake.read("/kubepods/burstable").unwrap();
        let key = if fake.v2 { "cpu.weight" } else { "cpu.shares" };
        let want = if fake.v2 { "4" } else { "102" };
        assert_eq!(tier[key], want);
    }
    let cm = ContainerManager::for_test(Arc::new(FakeCgroups::default()));
    assert_eq!(
        cm.pod_values(&pod("50m", "100m", "64Mi")).unwrap(),
        None,
        "no cgroup yet"
    );
}
