use super::*;
use k8s_openapi::api::core::v1::Pod;

fn host() -> SeLinuxHost {
    SeLinuxHost {
        enabled: true,
        process_context: "system_u:system_r:container_t:s0".into(),
        file_context: "system_u:object_r:container_file_t:s0".into(),
    }
}

fn fixed() -> String {
    "s0:c998,c999".into()
}

/// A pod whose containers (`levels`: each container's own level, `None` for none) mount
/// volume `data`; `pod_level` is the pod's level.
fn pod(uid: &str, pod_level: Option<&str>, levels: &[Option<&str>], policy: Option<&str>) -> Pod {
    let containers: Vec<serde_json::Value> = levels
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut c = serde_json::json!({
                "name": format!("c{i}"), "image": "busybox",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            });
            if let Some(l) = l {
                c["securityContext"] = serde_json::json!({"seLinuxOptions": {"level": l}});
            }
            c
        })
        .collect();
    let mut sc = serde_json::json!({});
    if let Some(l) = pod_level {
        sc["seLinuxOptions"] = serde_json::json!({"level": l});
    }
    if let Some(p) = policy {
        sc["seLinuxChangePolicy"] = serde_json::json!(p);
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {"containers": containers, "securityContext": sc},
    }))
    .unwrap()
}

fn modes(m: &[&str]) -> Vec<String> {
    m.iter().map(|s| s.to_string()).collect()
}

fn vref<'a>(unique: &'a str, modes: &'a [String], supports: bool) -> VolumeRef<'a> {
    VolumeRef {
        unique_name: unique,
        spec_name: "pv-1",
        plugin: "kubernetes.io/csi/hostpath.csi.k8s.io",
        pv: true,
        access_modes: modes,
        driver_supports: supports,
    }
}

const L1: &str = "system_u:object_r:container_file_t:s0:c1,c2";

#[test]
fn an_rwop_volume_of_a_supporting_driver_gets_the_pods_label() {
    let r = SeLinuxVolumes::new(host(), false).with_level(fixed);
    let m = modes(&["ReadWriteOncePod"]);
    let p = pod("u1", Some("s0:c1,c2"), &[None, None], None);
    assert_eq!(r.admit(&p, "data", &vref("vol-a", &m, true)).unwrap(), L1);
    // The container's own options win over the pod's.
    let p = pod("u2", Some("s0:c7,c8"), &[Some("s0:c1,c2")], None);
    assert_eq!(r.admit(&p, "data", &vref("vol-b", &m, true)).unwrap(), L1);
    assert_eq!(r.label_of("vol-b").as_deref(), Some(L1));
}

#[test]
fn no_label_without_selinux_driver_support_a_qualifying_mode_or_with_recursive() {
    let m = modes(&["ReadWriteOncePod"]);
    let p = pod("u1", Some("s0:c1,c2"), &[None], None);
    let off = SeLinuxVolumes::new(SeLinuxHost::disabled(), true);
    assert_eq!(off.admit(&p, "data", &vref("v", &m, true)).unwrap(), "");
    let r = SeLinuxVolumes::new(host(), false).with_level(fixed);
    assert_eq!(r.admit(&p, "data", &vref("v1", &m, false)).unwrap(), "");
    let rwo = modes(&["ReadWriteOnce"]);
    assert_eq!(r.admit(&p, "data", &vref("v2", &rwo, true)).unwrap(), "");
    let rec = pod("u2", Some("s0:c1,c2"), &[None], Some("Recursive"));
    assert_eq!(r.admit(&rec, "data", &vref("v3", &m, true)).unwrap(), "");
    let mo = pod("u3", Some("s0:c1,c2"), &[None], Some("MountOption"));
    assert_eq!(r.admit(&mo, "data", &vref("v4", &m, true)).unwrap(), L1);
    // With the SELinuxMount gate every PV qualifies; an inline volume never does.
    let gate = SeLinuxVolumes::new(host(), true).with_level(fixed);
    assert_eq!(gate.admit(&p, "data", &vref("v5", &rwo, true)).unwrap(), L1);
    let mut inline = vref("v6", &rwo, true);
    inline.pv = false;
    assert_eq!(gate.admit(&p, "data", &inline).unwrap(), "");
}

#[test]
fn containers_of_one_pod_with_different_labels_are_refused_as_upstream() {
    let r = SeLinuxVolumes::new(host(), false).with_level(fixed);
    let m = modes(&["ReadWriteOncePod"]);
    let g = crate::metrics::selinux::selinux()
        .pod_mismatch_errors
        .with_label_values(&["RWOP"]);
    let before = g.get();
    let p = pod("u1", None, &[Some("s0:c1,c2"), Some("s0:c3,c4")], None);
    let err = r.admit(&p, "data", &vref("v", &m, true)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "volume pv-1 is used with two different SELinux contexts in the same pod: \"system_u:object_r:container_file_t:s0:c1,c2\", \"system_u:object_r:container_file_t:s0:c3,c4\""
    );
    assert!(g.get() >= before + 1.0);
    // On a volume whose mode does not qualify it is a warning only.
    let rwx = modes(&["ReadWriteMany"]);
    assert_eq!(r.admit(&p, "data", &vref("w", &rwx, true)).unwrap(), "");
}

#[test]
fn a_second_pod_with_another_label_is_refused_until_the_first_is_gone() {
    let r = SeLinuxVolumes::new(host(), false).with_level(fixed);
    let m = modes(&["ReadWriteOncePod"]);
    let a = pod("ua", Some("s0:c1,c2"), &[None], None);
    let b = pod("ub", Some("s0:c3,c4"), &[None], None);
    let g = crate::metrics::selinux::selinux()
        .volume_mismatch_errors
        .with_label_values(&["kubernetes.io/csi/hostpath.csi.k8s.io", "RWOP"]);
    let before = g.get();
    assert_eq!(r.admit(&a, "data", &vref("v", &m, true)).unwrap(), L1);
    let err = r.admit(&b, "data", &vref("v", &m, true)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "conflicting SELinux labels of volume pv-1: \"system_u:object_r:container_file_t:s0:c1,c2\" and \"system_u:object_r:container_file_t:s0:c3,c4\""
    );
    assert!(g.get() >= before + 1.0);
    // The first pod's next sync is not a conflict with itself.
    assert_eq!(r.admit(&a, "data", &vref("v", &m, true)).unwrap(), L1);
    r.forget_pod("ua");
    assert_eq!(
        r.admit(&b, "data", &vref("v", &m, true)).unwrap(),
        "system_u:object_r:container_file_t:s0:c3,c4"
    );
}

#[test]
fn a_hostile_level_is_an_error_not_a_mount_flag() {
    let r = SeLinuxVolumes::new(host(), false).with_level(fixed);
    let m = modes(&["ReadWriteOncePod"]);
    let p = pod("u1", Some("s0:c1\",rw,context=\"x"), &[None], None);
    let err = r.admit(&p, "data", &vref("v", &m, true)).unwrap_err();
    assert!(
        err.to_string().starts_with("failed to construct SELinux label from context &{\"\" \"\" \"\" \"s0:c1\\\",rw,context=\\\"x\"}: "),
        "{err}"
    );
    assert_eq!(r.label_of("v"), None);
}

#[test]
fn a_restored_volume_keeps_its_label_for_its_pod_and_conflicts_for_others() {
    let r = SeLinuxVolumes::new(host(), false).with_level(fixed);
    let m = modes(&["ReadWriteOncePod"]);
    r.restore("ua", "v", L1);
    // The restarted agent's pod gets the label it was mounted with.
    let a = pod("ua", Some("s0:c1,c2"), &[None], None);
    assert_eq!(r.admit(&a, "data", &vref("v", &m, true)).unwrap(), L1);
    let b = pod("ub", Some("s0:c3,c4"), &[None], None);
    assert!(r.admit(&b, "data", &vref("v", &m, true)).is_err());
}

#[tokio::test]
async fn every_selinux_family_is_served_as_a_gauge() {
    let text = crate::metrics::Metrics::new("node-s").render();
    for name in [
        "volume_manager_selinux_container_errors_total",
        "volume_manager_selinux_container_warnings_total",
        "volume_manager_selinux_pod_context_mismatch_errors_total",
        "volume_manager_selinux_pod_context_mismatch_warnings_total",
        "volume_manager_selinux_volume_context_mismatch_errors_total",
        "volume_manager_selinux_volume_context_mismatch_warnings_total",
        "volume_manager_selinux_volumes_admitted_total",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} gauge")),
            "{name} missing"
        );
    }
}
