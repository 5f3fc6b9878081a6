//! Pod fields of issue 27 through a worker over the fake runtime: what reaches the runtime
//! (the exact CRI request) and what the pod's status says.

use super::*;
use crate::runtime::cri::{container_security_pb, sandbox_pb};
use cri_proto::v1 as pb;

async fn sandbox_of(r: &Rig) -> String {
    let sandboxes = r.rt.list_sandboxes().await.unwrap();
    assert_eq!(sandboxes.len(), 1);
    sandboxes[0].id.clone()
}

fn ephemeral_status(r: &Rig, name: &str) -> k8s_openapi::api::core::v1::ContainerStatus {
    status(r)
        .ephemeral_container_statuses
        .unwrap_or_default()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no ephemeral container status for {name}"))
}

/// `shareProcessNamespace: true` reaches the runtime as one PID namespace for the pod (the
/// sandbox and each container: CRI `NamespaceMode::POD`); without it each container has its
/// own.
#[tokio::test(start_paused = true)]
async fn share_process_namespace_gives_the_pod_one_pid_namespace() {
    for (share, mode) in [
        (true, pb::NamespaceMode::Pod),
        (false, pb::NamespaceMode::Container),
    ] {
        let r = rig();
        let p = pod(
            "Always",
            serde_json::json!({"shareProcessNamespace": share}),
        );
        let mut w = Worker::new(r.env.clone(), p, None);
        w.sync().await;
        let sandbox = r.rt.sandbox_config(&sandbox_of(&r).await).unwrap();
        assert_eq!(sandbox.share_process_namespace, share);
        let sb_pid = sandbox_pb(&sandbox)
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap()
            .pid;
        assert_eq!(sb_pid, mode as i32, "sandbox PID namespace, share={share}");
        let app = r.rt.running("app")[0].clone();
        let cfg = r.rt.created_config(&app).unwrap();
        let ns = container_security_pb(&cfg, &sandbox)
            .namespace_options
            .unwrap();
        assert_eq!(
            ns.pid, mode as i32,
            "container PID namespace, share={share}"
        );
        assert_eq!(ns.target_id, "");
    }
}

fn add_debugger(w: &mut Worker, target: Option<&str>) {
    let mut e = serde_json::json!({"name": "debugger", "image": IMAGE, "command": ["sh"],
        "stdin": true, "tty": true});
    if let Some(t) = target {
        e["targetContainerName"] = t.into();
    }
    let spec = w.desired.spec.as_mut().unwrap();
    spec.ephemeral_containers = Some(vec![serde_json::from_value(e).unwrap()]);
}

/// An ephemeral container added to a running pod starts once, in its target's PID namespace
/// (CRI `NamespaceMode::TARGET` + the target's ID), is reported in
/// `status.ephemeralContainerStatuses` (never ready), leaves the pod's phase and readiness
/// alone, and is not restarted when it exits.
#[tokio::test(start_paused = true)]
async fn ephemeral_container_runs_once_in_the_target_pid_namespace() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let app = r.rt.running("app")[0].clone();
    assert!(status(&r).ephemeral_container_statuses.is_none());

    add_debugger(&mut w, Some("app"));
    r.rt.clear_calls();
    w.sync().await;
    assert_eq!(r.rt.count("RunPodSandbox"), 0, "same sandbox");
    assert_eq!(
        r.rt.running("app"),
        std::slice::from_ref(&app),
        "the target keeps running"
    );
    let debugger = r.rt.running("debugger");
    assert_eq!(debugger.len(), 1);
    let cfg = r.rt.created_config(&debugger[0]).unwrap();
    assert_eq!(cfg.security.pid_target.as_deref(), Some(app.as_str()));
    assert!(cfg.stdin && cfg.tty);
    let sandbox = r.rt.sandbox_config(&sandbox_of(&r).await).unwrap();
    let ns = container_security_pb(&cfg, &sandbox)
        .namespace_options
        .unwrap();
    assert_eq!(ns.pid, pb::NamespaceMode::Target as i32);
    assert_eq!(ns.target_id, app);

    let st = ephemeral_status(&r, "debugger");
    assert!(st.state.unwrap().running.is_some());
    assert!(!st.ready);
    assert_eq!(st.started, None);
    assert_eq!(st.image, IMAGE);
    let pod_status = status(&r);
    assert_eq!(pod_status.phase.as_deref(), Some("Running"));
    assert_eq!(condition(&pod_status, "Ready"), "True");
    assert_eq!(pod_status.container_statuses.unwrap().len(), 1);

    // It exits: never restarted, reported terminated; the pod runs on.
    r.rt.exit_container(&debugger[0], 0);
    r.rt.clear_calls();
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(30)).await;
        w.sync().await;
    }
    assert_eq!(r.rt.count("CreateContainer"), 0, "{:?}", r.rt.calls());
    let st = ephemeral_status(&r, "debugger");
    assert_eq!(st.state.unwrap().terminated.unwrap().exit_code, 0);
    assert_eq!(st.restart_count, 0);
    assert_eq!(status(&r).phase.as_deref(), Some("Running"));
}

/// A target that does not run fails the start as upstream: CreateContainerConfigError
/// "unable to find target container <name>", and a `Failed` event.
#[tokio::test(start_paused = true)]
async fn ephemeral_container_with_a_missing_target_waits_with_upstreams_reason() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    add_debugger(&mut w, Some("nope"));
    w.sync().await;
    assert!(r.rt.running("debugger").is_empty());
    let waiting = ephemeral_status(&r, "debugger")
        .state
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert_eq!(
        waiting.message.as_deref(),
        Some("unable to find target container nope")
    );
    assert!(
        r.events
            .events()
            .contains(&"Warning Failed Error: unable to find target container nope".to_string()),
        "{:?}",
        r.events.events()
    );
}

/// Without a target an ephemeral container shares whatever the pod shares (no TARGET mode).
#[tokio::test(start_paused = true)]
async fn ephemeral_container_without_a_target_uses_the_pods_namespaces() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    add_debugger(&mut w, None);
    w.sync().await;
    let debugger = r.rt.running("debugger");
    assert_eq!(debugger.len(), 1);
    assert_eq!(
        r.rt.created_config(&debugger[0])
            .unwrap()
            .security
            .pid_target,
        None
    );
}

/// `status.observedGeneration` and each kubelet condition's `observedGeneration` follow the
/// generation of the spec the worker acted on.
#[tokio::test(start_paused = true)]
async fn status_and_conditions_carry_the_observed_generation() {
    let r = rig();
    let mut p = pod("Always", serde_json::json!({}));
    p.metadata.generation = Some(3);
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let generations = |st: &PodStatus| {
        st.conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.clone(), c.observed_generation))
            .collect::<Vec<_>>()
    };
    let st = status(&r);
    assert_eq!(st.observed_generation, Some(3));
    let conds = generations(&st);
    assert!(!conds.is_empty());
    assert!(conds.iter().all(|(_, g)| *g == Some(3)), "{conds:?}");
    w.desired.metadata.generation = Some(4);
    w.sync().await;
    let st = status(&r);
    assert_eq!(st.observed_generation, Some(4));
    assert!(generations(&st).iter().all(|(_, g)| *g == Some(4)));
}

fn with_container_policy(pod_policy: &str, container: serde_json::Value) -> Pod {
    let mut p = pod(pod_policy, serde_json::json!({}));
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    let mut v = serde_json::to_value(&*c).unwrap();
    for (k, x) in container.as_object().unwrap() {
        v[k] = x.clone();
    }
    *c = serde_json::from_value(v).unwrap();
    p
}

/// `restartPolicyRules`: an exit code a `Restart` rule matches restarts the container even
/// though its policy (and the pod's) is Never; another exit code leaves it stopped and the
/// pod ends per the exit.
#[tokio::test(start_paused = true)]
async fn restart_rules_restart_only_the_exit_codes_they_match() {
    let r = rig();
    let p = with_container_policy(
        "Never",
        serde_json::json!({"restartPolicy": "Never", "restartPolicyRules": [
            {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}),
    );
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let first = r.rt.running("app")[0].clone();
    r.rt.exit_container(&first, 42);
    w.sync().await;
    assert_eq!(
        r.rt.running("app").len(),
        1,
        "exit 42 matches the rule: restarted"
    );
    assert_eq!(app_status(&r).restart_count, 1);
    assert_eq!(status(&r).phase.as_deref(), Some("Running"));

    let second = r.rt.running("app")[0].clone();
    r.rt.exit_container(&second, 3);
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(30)).await;
        w.sync().await;
    }
    assert!(
        r.rt.running("app").is_empty(),
        "exit 3 matches no rule: Never"
    );
    let st = status(&r);
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    let cs = app_status(&r);
    assert_eq!(cs.restart_count, 1);
    assert_eq!(cs.state.unwrap().terminated.unwrap().exit_code, 3);
}

/// A container's own `restartPolicy` overrides the pod's, both ways.
#[tokio::test(start_paused = true)]
async fn a_containers_restart_policy_overrides_the_pods() {
    // Pod Always, container Never: a failed exit is final and fails the pod.
    let r = rig();
    let p = with_container_policy("Always", serde_json::json!({"restartPolicy": "Never"}));
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let id = r.rt.running("app")[0].clone();
    r.rt.exit_container(&id, 1);
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(30)).await;
        w.sync().await;
    }
    assert!(r.rt.running("app").is_empty());
    assert_eq!(status(&r).phase.as_deref(), Some("Failed"));

    // Pod Never, container OnFailure: a failure restarts it, a success ends the pod.
    let r = rig();
    let p = with_container_policy("Never", serde_json::json!({"restartPolicy": "OnFailure"}));
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let id = r.rt.running("app")[0].clone();
    r.rt.exit_container(&id, 1);
    w.sync().await;
    assert_eq!(r.rt.running("app").len(), 1, "OnFailure restarts a failure");
    let id = r.rt.running("app")[0].clone();
    r.rt.exit_container(&id, 0);
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(30)).await;
        w.sync().await;
    }
    assert!(r.rt.running("app").is_empty());
    assert_eq!(status(&r).phase.as_deref(), Some("Succeeded"));
}

/// An ephemeral container arrives after admission; a value admission refuses in a container
/// fails its start with admission's message instead of being dropped.
#[tokio::test(start_paused = true)]
async fn an_ephemeral_container_with_a_refused_value_waits_with_the_refusal() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    w.desired.spec.as_mut().unwrap().ephemeral_containers = Some(vec![
        serde_json::from_value(serde_json::json!({"name": "debugger", "image": IMAGE,
            "env": [{"name": "A", "valueFrom": {"fileKeyRef": {"volumeName": "v", "path": "p", "key": "k"}}}]}))
        .unwrap(),
    ]);
    r.rt.clear_calls();
    w.sync().await;
    assert_eq!(r.rt.count("CreateContainer"), 0);
    let waiting = ephemeral_status(&r, "debugger")
        .state
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert_eq!(
        waiting.message.as_deref(),
        Some(crate::pod::admission::fields::refuse::FILE_KEY_REF)
    );
}

/// `setHostnameAsFQDN: true` with a subdomain names the sandbox (the pod's UTS namespace) by
/// its FQDN; an FQDN past the kernel's 64 characters fails the sandbox with upstream's message
/// and creates nothing.
#[tokio::test(start_paused = true)]
async fn set_hostname_as_fqdn_names_the_sandbox_by_its_fqdn() {
    let r = rig();
    let fields =
        serde_json::json!({"setHostnameAsFQDN": true, "subdomain": "db", "hostname": "web-0"});
    let mut w = Worker::new(r.env.clone(), pod("Always", fields), None);
    w.sync().await;
    let sandbox = r.rt.sandbox_config(&sandbox_of(&r).await).unwrap();
    let domain = match r.env.node.cluster_domain.as_str() {
        "" => "db.default.svc".to_string(),
        d => format!("db.default.svc.{d}"),
    };
    assert_eq!(sandbox.hostname, format!("web-0.{domain}"));

    let r = rig();
    let long = "h".repeat(60);
    let fields =
        serde_json::json!({"setHostnameAsFQDN": true, "subdomain": "db", "hostname": long});
    let mut w = Worker::new(r.env.clone(), pod("Always", fields), None);
    w.sync().await;
    assert!(r.rt.list_sandboxes().await.unwrap().is_empty());
    let fqdn = format!("{long}.{domain}");
    let want = format!(
        "Warning FailedCreatePodSandBox Failed to create pod sandbox: failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long (64 characters is the max, {} characters requested)",
        fqdn.len()
    );
    assert!(r.events.events().contains(&want), "{:?}", r.events.events());
}

/// The rig with image volumes supported by the runtime or not (the volume manager and the
/// spec builder both read the node settings).
fn with_image_volumes(r: Rig, supported: bool) -> Rig {
    let mut node = r.env.node.clone();
    node.image_volumes = supported;
    node.runtime_version = "containerd 1.6.20".into();
    let volumes = Arc::new(crate::volume::VolumeManager::new(
        node.clone(),
        Arc::new(crate::objects::ObjectCache::new(None)),
        Arc::new(crate::objects::token::TokenManager::new(None)),
        r.env.binder.clone(),
    ));
    let env = Arc::new(Deps {
        node,
        volumes,
        events: r.events.clone(),
        cgroups: crate::cm::ContainerManager::for_test(r.cg.clone()),
        binder: r.env.binder.clone(),
        refusal: crate::pod::admission::fields::refusal,
        ..Deps::for_test(r.rt.clone(), r._dir.path())
    });
    Rig { env, ..r }
}

/// An image volume: where the runtime mounts images, the image is pulled as the volume's
/// pullPolicy says and reaches CreateContainer as a read-only CRI image mount with its
/// subPath; where it cannot (containerd 1.6), the pod waits with FailedMount naming the
/// runtime, and nothing starts.
#[tokio::test(start_paused = true)]
async fn image_volumes_are_pulled_and_mounted_by_the_runtime_or_refused_without_it() {
    let fields = serde_json::json!({
        "volumes": [{"name": "tools", "image": {"reference": "tools:2", "pullPolicy": "Always"}}],
        "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"],
            "volumeMounts": [{"name": "tools", "mountPath": "/tools", "subPath": "bin"}]}]});
    let r = with_image_volumes(rig(), true);
    r.rt.add_image("tools:2");
    let mut w = Worker::new(r.env.clone(), pod("Always", fields.clone()), None);
    w.sync().await;
    assert!(
        r.rt.pulls().iter().any(|(image, _)| image == "tools:2"),
        "{:?}",
        r.rt.pulls()
    );
    let id = r.rt.running("app").pop().expect("the container runs");
    let mounts = r.rt.created_config(&id).unwrap().mounts;
    let tools = mounts
        .iter()
        .find(|m| m.container_path == "/tools")
        .expect("the image mount");
    assert_eq!(
        (
            tools.image.as_deref(),
            tools.image_sub_path.as_str(),
            tools.readonly,
            tools.host_path.as_str()
        ),
        (Some("tools:2"), "bin", true, "")
    );

    let r = with_image_volumes(rig(), false);
    r.rt.add_image("tools:2");
    let mut w = Worker::new(r.env.clone(), pod("Always", fields), None);
    w.sync().await;
    assert!(r.rt.running("app").is_empty());
    assert!(
        r.events.events().iter().any(|e| e.starts_with("Warning FailedMount")
            && e.contains("image volumes need a container runtime that mounts images (CRI Mount.image: containerd 2.1 or CRI-O 1.31 and later); containerd 1.6.20 does not")),
        "{:?}",
        r.events.events()
    );
}
