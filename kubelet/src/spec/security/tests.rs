use super::*;
use crate::runtime::{ImageUser, SecurityProfile, SupplementalGroupsPolicy};
use std::path::PathBuf;

fn pod(spec: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
        "spec": spec
    }))
    .unwrap()
}

fn node(seccomp_default: bool) -> NodeSettings {
    NodeSettings {
        root_dir: PathBuf::from("/var/lib/kubelet"),
        seccomp_default,
        ..Default::default()
    }
}

fn first(p: &Pod) -> Container {
    p.spec.as_ref().unwrap().containers[0].clone()
}

fn sec(p: &Pod, seccomp_default: bool) -> Result<ContainerSecurity, ConfigError> {
    container_security(&node(seccomp_default), p, &first(p))
}

#[test]
fn container_fields_override_the_pods() {
    let p = pod(serde_json::json!({
        "securityContext": {"runAsUser": 1000, "runAsGroup": 2000, "runAsNonRoot": true,
                            "seLinuxOptions": {"level": "s0:c1"}},
        "containers": [{"name": "c", "image": "i:1",
                        "securityContext": {"runAsUser": 1001, "readOnlyRootFilesystem": true,
                                            "privileged": false}}]
    }));
    let s = sec(&p, false).unwrap();
    assert_eq!(s.run_as_user, Some(1001));
    assert_eq!(s.run_as_group, Some(2000));
    assert!(s.readonly_rootfs && !s.privileged);
    assert_eq!(s.selinux.as_ref().unwrap().level, "s0:c1");
}

#[test]
fn fs_group_then_supplemental_groups_and_their_policy() {
    let p = pod(serde_json::json!({
        "securityContext": {"fsGroup": 3000, "supplementalGroups": [4000, 5000],
                            "supplementalGroupsPolicy": "Strict"},
        "containers": [{"name": "c", "image": "i:1"}]
    }));
    let s = sec(&p, false).unwrap();
    assert_eq!(s.supplemental_groups, vec![3000, 4000, 5000]);
    assert_eq!(
        s.supplemental_groups_policy,
        SupplementalGroupsPolicy::Strict
    );
    let sb = sandbox_security(&p);
    assert_eq!(sb.supplemental_groups, vec![3000, 4000, 5000]);
    let mut bad = p.clone();
    bad.spec
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .supplemental_groups_policy = Some("Loose".into());
    assert!(sec(&bad, false).is_err());
}

#[test]
fn capabilities_are_passed_as_written() {
    let p = pod(serde_json::json!({
        "containers": [{"name": "c", "image": "i:1", "securityContext":
            {"capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}}]
    }));
    let s = sec(&p, false).unwrap();
    assert_eq!(s.capabilities_add, vec!["NET_ADMIN"]);
    assert_eq!(s.capabilities_drop, vec!["ALL"]);
}

#[test]
fn no_new_privs_only_when_escalation_is_explicitly_disallowed() {
    let with = |v: serde_json::Value| {
        let p = pod(serde_json::json!({
            "containers": [{"name": "c", "image": "i:1", "securityContext": v}]
        }));
        sec(&p, false).unwrap().no_new_privs
    };
    assert!(with(serde_json::json!({"allowPrivilegeEscalation": false})));
    assert!(!with(serde_json::json!({"allowPrivilegeEscalation": true})));
    assert!(!with(serde_json::json!({})));
}

#[test]
fn masked_and_readonly_paths_unless_proc_mount_unmasked() {
    let p = pod(serde_json::json!({"containers": [{"name": "c", "image": "i:1"}]}));
    let s = sec(&p, false).unwrap();
    assert_eq!(s.masked_paths.len(), 11);
    assert!(s.masked_paths.contains(&"/proc/kcore".to_string()));
    assert_eq!(s.readonly_paths[3], "/proc/sys");
    let p = pod(serde_json::json!({
        "containers": [{"name": "c", "image": "i:1", "securityContext": {"procMount": "Unmasked"}}]
    }));
    let s = sec(&p, false).unwrap();
    assert!(s.masked_paths.is_empty() && s.readonly_paths.is_empty());
}

#[test]
fn seccomp_container_then_pod_then_the_node_default() {
    let p = pod(serde_json::json!({"containers": [{"name": "c", "image": "i:1"}]}));
    assert_eq!(
        sec(&p, false).unwrap().seccomp,
        Some(SecurityProfile::Unconfined)
    );
    assert_eq!(
        sec(&p, true).unwrap().seccomp,
        Some(SecurityProfile::RuntimeDefault)
    );
    let p = pod(serde_json::json!({
        "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "prof.json"}},
        "containers": [{"name": "c", "image": "i:1"},
                       {"name": "d", "image": "i:1", "securityContext":
                           {"seccompProfile": {"type": "Unconfined"}}}]
    }));
    assert_eq!(
        sec(&p, true).unwrap().seccomp,
        Some(SecurityProfile::Localhost(
            "/var/lib/kubelet/seccomp/prof.json".into()
        ))
    );
    let d = p.spec.as_ref().unwrap().containers[1].clone();
    assert_eq!(
        container_security(&node(true), &p, &d).unwrap().seccomp,
        Some(SecurityProfile::Unconfined)
    );
    let p = pod(serde_json::json!({
        "securityContext": {"seccompProfile": {"type": "Localhost"}},
        "containers": [{"name": "c", "image": "i:1"}]
    }));
    assert_eq!(
        sec(&p, false).unwrap_err().0,
        "localhostProfile must be set if seccompProfile type is Localhost."
    );
    // The sandbox always runs the runtime's default profile.
    assert_eq!(
        sandbox_security(&p).seccomp,
        Some(SecurityProfile::RuntimeDefault)
    );
}

#[test]
fn apparmor_from_fields_or_the_beta_annotation() {
    let p = pod(serde_json::json!({
        "securityContext": {"appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-x"}},
        "containers": [{"name": "c", "image": "i:1"}]
    }));
    let s = sec(&p, false).unwrap();
    assert_eq!(s.apparmor, Some(SecurityProfile::Localhost("k8s-x".into())));
    assert_eq!(s.apparmor_profile, "localhost/k8s-x");
    let mut p = pod(serde_json::json!({"containers": [{"name": "c", "image": "i:1"}]}));
    assert_eq!(sec(&p, false).unwrap().apparmor, None);
    p.metadata.annotations = Some(
        [(
            format!("{APPARMOR_ANNOTATION_PREFIX}c"),
            "unconfined".to_string(),
        )]
        .into(),
    );
    let s = sec(&p, false).unwrap();
    assert_eq!(s.apparmor, Some(SecurityProfile::Unconfined));
    assert_eq!(s.apparmor_profile, "unconfined");
}

#[test]
fn sandbox_is_privileged_when_any_container_is() {
    let p = pod(serde_json::json!({
        "securityContext": {"runAsUser": 7, "runAsGroup": 8},
        "initContainers": [{"name": "i", "image": "i:1", "securityContext": {"privileged": true}}],
        "containers": [{"name": "c", "image": "i:1"}]
    }));
    let sb = sandbox_security(&p);
    assert!(sb.privileged);
    assert_eq!((sb.run_as_user, sb.run_as_group), (Some(7), Some(8)));
    let p = pod(serde_json::json!({"containers": [{"name": "c", "image": "i:1"}]}));
    assert!(!sandbox_security(&p).privileged);
}

#[test]
fn run_as_non_root_is_checked_against_the_image_user() {
    let p = pod(serde_json::json!({
        "securityContext": {"runAsNonRoot": true},
        "containers": [{"name": "c", "image": "i:1"}]
    }));
    let c = first(&p);
    let uid = |u: i64| ImageUser {
        uid: Some(u),
        username: String::new(),
    };
    let mut s = sec(&p, false).unwrap();
    assert_eq!(
        apply_image_user(&mut s, &p, &c, &uid(0)).unwrap_err().0,
        "container has runAsNonRoot and image will run as root (pod: \"web_ns(u1)\", container: c)"
    );
    let named = ImageUser {
        uid: None,
        username: "app".into(),
    };
    assert_eq!(
        apply_image_user(&mut s, &p, &c, &named).unwrap_err().0,
        "container has runAsNonRoot and image has non-numeric user (app), cannot verify user is non-root (pod: \"web_ns(u1)\", container: c)"
    );
    apply_image_user(&mut s, &p, &c, &uid(1000)).unwrap();
    assert_eq!(s.run_as_user, Some(1000));
    // runAsUser 0 in the spec breaks the policy whatever the image says.
    let p = pod(serde_json::json!({
        "securityContext": {"runAsNonRoot": true, "runAsUser": 0},
        "containers": [{"name": "c", "image": "i:1"}]
    }));
    let mut s = sec(&p, false).unwrap();
    assert_eq!(
        apply_image_user(&mut s, &p, &first(&p), &uid(1000))
            .unwrap_err()
            .0,
        "container's runAsUser breaks non-root policy (pod: \"web_ns(u1)\", container: c)"
    );
}

#[test]
fn image_user_fills_a_missing_uid_or_name() {
    let p = pod(serde_json::json!({"containers": [{"name": "c", "image": "i:1"}]}));
    let c = first(&p);
    let mut s = sec(&p, false).unwrap();
    let named = ImageUser {
        uid: None,
        username: "app".into(),
    };
    apply_image_user(&mut s, &p, &c, &named).unwrap();
    assert_eq!((s.run_as_user, s.run_as_username.as_str()), (None, "app"));
    let p = pod(serde_json::json!({
        "securityContext": {"runAsUser": 5},
        "containers": [{"name": "c", "image": "i:1"}]
    }));
    let mut s = sec(&p, false).unwrap();
    apply_image_user(&mut s, &p, &first(&p), &named).unwrap();
    assert_eq!((s.run_as_user, s.run_as_username.as_str()), (Some(5), ""));
}

#[test]
fn user_namespaces_need_the_runtime_handlers_support() {
    use crate::runtime::HandlerFeatures;
    let p =
        pod(serde_json::json!({"hostUsers": false, "containers": [{"name": "c", "image": "i:1"}]}));
    // containerd 1.6 reports no handler features: upstream's messages.
    assert_eq!(
        check_user_namespace(&p, "", HandlerFeatures::default())
            .unwrap_err()
            .0,
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces"
    );
    assert_eq!(
        check_user_namespace(&p, "kata", HandlerFeatures::default())
            .unwrap_err()
            .0,
        "can't set `spec.hostUsers: false`, RuntimeClass handler \"kata\" does not support user namespaces"
    );
    // A handler with support runs the pod in its own user namespace.
    let userns = HandlerFeatures {
        user_namespaces: true,
        ..Default::default()
    };
    assert!(check_user_namespace(&p, "", userns).is_ok());
    assert!(sec(&p, false).is_ok());
    for host_users in [serde_json::json!(true), serde_json::Value::Null] {
        let q = pod(
            serde_json::json!({"hostUsers": host_users, "containers": [{"name": "c", "image": "i:1"}]}),
        );
        assert!(check_user_namespace(&q, "", HandlerFeatures::default()).is_ok());
    }
}
