use super::*;
use crate::spec::{ContainerEnv, ContainerHostPaths};

fn pod(containers: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-0", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": containers, "volumes": [
            {"name": "host", "hostPath": {"path": "/srv/data"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "conf", "configMap": {"name": "c"}}]}}))
    .unwrap()
}

fn volumes() -> BTreeMap<String, PathBuf> {
    [
        ("host", "/srv/data"),
        (
            "scratch",
            "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/scratch",
        ),
        (
            "conf",
            "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~configmap/conf",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
    .collect()
}

fn env(vars: &[(&str, &str)]) -> ContainerEnv {
    ContainerEnv {
        vars: vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        invalid_names: Vec::new(),
    }
}

fn mounts_of(
    node: &NodeSettings,
    mounts: serde_json::Value,
    privileged: bool,
    host_paths: &ContainerHostPaths,
    features: HandlerFeatures,
) -> Result<Vec<Mount>, ConfigError> {
    let p = pod(serde_json::json!([{"name": "c", "image": "i",
        "securityContext": {"privileged": privileged}, "volumeMounts": mounts}]));
    let c = &p.spec.as_ref().unwrap().containers[0];
    container_mounts(
        node,
        &p,
        c,
        &volumes(),
        None,
        host_paths,
        &env(&[("POD_NAME", "web-0"), ("EMPTY", "")]),
        features,
    )
}

fn mounts(m: serde_json::Value, privileged: bool) -> Result<Vec<Mount>, ConfigError> {
    mounts_of(
        &NodeSettings::default(),
        m,
        privileged,
        &ContainerHostPaths::default(),
        HandlerFeatures::default(),
    )
}

#[test]
fn mount_propagation_reaches_the_mount_as_upstream_translates_it() {
    let got = mounts(
        serde_json::json!([
            {"name": "host", "mountPath": "/a"},
            {"name": "host", "mountPath": "/b", "mountPropagation": "None"},
            {"name": "host", "mountPath": "/c", "mountPropagation": "HostToContainer"},
            {"name": "host", "mountPath": "/d", "mountPropagation": "Bidirectional"}]),
        true,
    )
    .unwrap();
    assert_eq!(
        got,
        vec![
            Mount {
                container_path: "/a".into(),
                host_path: "/srv/data".into(),
                ..Default::default()
            },
            Mount {
                container_path: "/b".into(),
                host_path: "/srv/data".into(),
                ..Default::default()
            },
            Mount {
                container_path: "/c".into(),
                host_path: "/srv/data".into(),
                propagation: Propagation::HostToContainer,
                ..Default::default()
            },
            Mount {
                container_path: "/d".into(),
                host_path: "/srv/data".into(),
                propagation: Propagation::Bidirectional,
                ..Default::default()
            },
        ]
    );
    // Bidirectional would let an unprivileged container mount onto the host.
    let e = mounts(
        serde_json::json!([{"name": "host", "mountPath": "/d", "mountPropagation": "Bidirectional"}]),
        false,
    )
    .unwrap_err();
    assert_eq!(
        e.0,
        "Bidirectional mount propagation is available only to privileged containers"
    );
    let e = mounts(
        serde_json::json!([{"name": "host", "mountPath": "/d", "mountPropagation": "rshared"}]),
        true,
    )
    .unwrap_err();
    assert_eq!(e.0, "invalid MountPropagation mode: \"rshared\"");
}

#[test]
fn recursive_read_only_follows_what_the_runtime_handler_reports() {
    let m = serde_json::json!([
        {"name": "host", "mountPath": "/e", "readOnly": true, "recursiveReadOnly": "Enabled"},
        {"name": "host", "mountPath": "/i", "readOnly": true, "recursiveReadOnly": "IfPossible"},
        {"name": "host", "mountPath": "/d", "readOnly": true, "recursiveReadOnly": "Disabled"}]);
    let rro = |f: bool| {
        mounts_of(
            &NodeSettings::default(),
            m.clone(),
            false,
            &ContainerHostPaths::default(),
            HandlerFeatures {
                recursive_read_only_mounts: f,
                user_namespaces: false,
            },
        )
    };
    let got = rro(true).unwrap();
    assert_eq!(
        got.iter()
            .map(|m| (m.readonly, m.recursive_read_only))
            .collect::<Vec<_>>(),
        [(true, true), (true, true), (true, false)]
    );
    // containerd 1.6 reports no handler features: Enabled is refused with upstream's message.
    let e = rro(false).unwrap_err();
    assert_eq!(
        e.0,
        "failed to resolve recursive read-only mode: volume \"host\" requested recursive read-only mode, but it is not supported by the runtime"
    );
    let got = mounts(
        serde_json::json!([{"name": "host", "mountPath": "/i", "readOnly": true, "recursiveReadOnly": "IfPossible"}]),
        false,
    )
    .unwrap();
    assert_eq!((got[0].readonly, got[0].recursive_read_only), (true, false));
    for (m, why) in [
        (
            serde_json::json!({"name": "host", "mountPath": "/e", "recursiveReadOnly": "IfPossible"}),
            "it is not read-only",
        ),
        (
            serde_json::json!({"name": "host", "mountPath": "/e", "readOnly": true, "recursiveReadOnly": "Enabled", "mountPropagation": "HostToContainer"}),
            "it is not compatible with propagation \"HostToContainer\"",
        ),
    ] {
        let e = mounts(serde_json::json!([m]), false).unwrap_err();
        assert_eq!(
            e.0,
            format!(
                "failed to resolve recursive read-only mode: volume \"host\" requested recursive read-only mode, but {why}"
            )
        );
    }
    let plain = pod(serde_json::json!([]));
    assert!(wants_runtime_features(
        &plain,
        &serde_json::from_value(serde_json::json!({"name": "c", "volumeMounts": m})).unwrap()
    ));
    assert!(!wants_runtime_features(
        &plain,
        &serde_json::from_value(
            serde_json::json!({"name": "c", "volumeMounts": [{"name": "host", "mountPath": "/m"}]})
        )
        .unwrap()
    ));
    let mut userns = plain.clone();
    userns.spec.as_mut().unwrap().host_users = Some(false);
    assert!(wants_runtime_features(
        &userns,
        &serde_json::from_value(serde_json::json!({"name": "c"})).unwrap()
    ));
}

#[test]
fn sub_path_expr_is_expanded_from_the_container_env() {
    let vars: BTreeMap<String, String> = [("POD_NAME", "web-0"), ("NS", "ns"), ("EMPTY", "")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let vm = |j: serde_json::Value| -> VolumeMount { serde_json::from_value(j).unwrap() };
    let sp = |expr: &str| {
        sub_path(
            &vm(serde_json::json!({"name": "v", "mountPath": "/m", "subPathExpr": expr})),
            &vars,
        )
    };
    assert_eq!(
        sp("$(NS)/$(POD_NAME)").unwrap().as_deref(),
        Some("ns/web-0")
    );
    assert_eq!(
        sp("logs-$$(POD_NAME)").unwrap().as_deref(),
        Some("logs-$(POD_NAME)")
    );
    assert_eq!(sp("a$b").unwrap().as_deref(), Some("a$b"));
    assert_eq!(
        sp("$(NOPE)/$(EMPTY)/$(NOPE)").unwrap_err().0,
        "missing value for EMPTY, NOPE"
    );
    // Hostile expansions are refused before anything touches the volume.
    let mut hostile = vars.clone();
    hostile.insert("UP".into(), "../..".into());
    hostile.insert("ABS".into(), "/etc".into());
    let e = sub_path(
        &vm(serde_json::json!({"name": "v", "mountPath": "/m", "subPathExpr": "x/$(UP)"})),
        &hostile,
    )
    .unwrap_err();
    assert_eq!(
        e.0,
        "unable to provision SubPath `x/../..`: must not contain '..'"
    );
    let e = sub_path(
        &vm(serde_json::json!({"name": "v", "mountPath": "/m", "subPathExpr": "$(ABS)"})),
        &hostile,
    )
    .unwrap_err();
    assert_eq!(e.0, "error SubPath `/etc` must not be an absolute path");
    // subPath as written, none for the whole volume.
    assert_eq!(
        sub_path(
            &vm(serde_json::json!({"name": "v", "mountPath": "/m", "subPath": "a/b"})),
            &vars
        )
        .unwrap()
        .as_deref(),
        Some("a/b")
    );
    assert_eq!(
        sub_path(
            &vm(serde_json::json!({"name": "v", "mountPath": "/m"})),
            &vars
        )
        .unwrap(),
        None
    );
    // The container gets the prepared subPath mount of the expanded path.
    let c: Container = serde_json::from_value(serde_json::json!({"name": "c", "volumeMounts": [
        {"name": "host", "mountPath": "/whole"},
        {"name": "host", "mountPath": "/mine", "subPathExpr": "$(POD_NAME)"}]}))
    .unwrap();
    let e = env(&[("POD_NAME", "web-0")]);
    assert_eq!(
        sub_paths(&c, &e).unwrap(),
        BTreeMap::from([(1, "web-0".to_string())])
    );
    let mut prepared = ContainerHostPaths::default();
    prepared.subpaths.insert(
        1,
        PathBuf::from("/var/lib/kubelet/pods/u1/volume-subpaths/host/c/1"),
    );
    let got = mounts_of(
        &NodeSettings::default(),
        serde_json::json!([
            {"name": "host", "mountPath": "/whole"},
            {"name": "host", "mountPath": "/mine", "subPathExpr": "$(POD_NAME)"}]),
        false,
        &prepared,
        HandlerFeatures::default(),
    )
    .unwrap();
    assert_eq!(got[0].host_path, "/srv/data");
    assert_eq!(
        got[1].host_path,
        "/var/lib/kubelet/pods/u1/volume-subpaths/host/c/1"
    );
    // Without the prepared mount the container is not created with the whole volume.
    let e = mounts(
        serde_json::json!([{"name": "host", "mountPath": "/mine", "subPathExpr": "$(POD_NAME)"}]),
        false,
    )
    .unwrap_err();
    assert_eq!(e.0, "subPath \"web-0\" of volume \"host\" was not prepared");
}

#[test]
fn selinux_relabel_is_asked_for_managed_volumes_on_selinux_hosts() {
    let m = serde_json::json!([
        {"name": "host", "mountPath": "/h"},
        {"name": "scratch", "mountPath": "/s"},
        {"name": "conf", "mountPath": "/c"}]);
    let hp = ContainerHostPaths {
        termination_log: Some(PathBuf::from("/var/lib/kubelet/pods/u1/containers/c/0")),
        ..Default::default()
    };
    let run = |selinux: bool| {
        let node = NodeSettings {
            selinux_enabled: selinux,
            ..Default::default()
        };
        let p = pod(serde_json::json!([{"name": "c", "image": "i", "volumeMounts": m}]));
        let c = &p.spec.as_ref().unwrap().containers[0];
        container_mounts(
            &node,
            &p,
            c,
            &volumes(),
            Some(Path::new("/var/lib/kubelet/pods/u1/etc-hosts")),
            &hp,
            &env(&[]),
            HandlerFeatures::default(),
        )
        .unwrap()
        .into_iter()
        .map(|m| (m.container_path, m.selinux_relabel))
        .collect::<Vec<_>>()
    };
    let path = |s: &str| s.to_string();
    assert_eq!(
        run(true),
        [
            (path("/h"), false),
            (path("/s"), true),
            (path("/c"), true),
            (path("/etc/hosts"), true),
            (path("/dev/termination-log"), true)
        ]
    );
    assert!(run(false).iter().all(|(_, relabel)| !relabel));
}
