use super::*;
use crate::cm::FakeCgroups;
use crate::events::FakeRecorder;
use crate::runtime::fake::{FAKE_IMAGE_SIZE, FakeRuntime};

const IMAGE: &str = "docker.io/library/busybox:1.35";

struct Rig {
    rt: Arc<FakeRuntime>,
    cg: Arc<FakeCgroups>,
    env: Arc<Deps>,
    events: Arc<FakeRecorder>,
    probe_rx: mpsc::Receiver<::probes::ProbeUpdate>,
    _dir: tempfile::TempDir,
}

fn rig() -> Rig {
    rig_with_binder(Arc::new(crate::volume::subpath::fake::FakeBinder::default()))
}

fn rig_with_binder(binder: Arc<dyn crate::volume::subpath::Binder>) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image(IMAGE);
    let cg = Arc::new(FakeCgroups::default());
    let (probes, probe_rx) = test_probes();
    let events = Arc::new(FakeRecorder::default());
    let env = Arc::new(Deps {
        events: events.clone(),
        probes,
        cgroups: crate::cm::ContainerManager::for_test(cg.clone()),
        binder,
        refusal: crate::pod::admission::fields::refusal,
        ..Deps::for_test(rt.clone(), dir.path())
    });
    Rig {
        rt,
        cg,
        env,
        events,
        probe_rx,
        _dir: dir,
    }
}

fn pod(policy: &str, extra: serde_json::Value) -> Pod {
    let mut spec = serde_json::json!({
        "restartPolicy": policy,
        "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"]}]
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    let mut p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "uid-1"},
        "spec": spec
    }))
    .unwrap();
    crate::podspec::apply_defaults(&mut p);
    p
}

fn status(r: &Rig) -> PodStatus {
    r.env.statuses.get("uid-1").unwrap().status.unwrap()
}

fn app_status(r: &Rig) -> k8s_openapi::api::core::v1::ContainerStatus {
    status(r).container_statuses.unwrap().remove(0)
}

fn condition(st: &PodStatus, t: &str) -> String {
    st.conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == t)
        .unwrap()
        .status
        .clone()
}

#[tokio::test(start_paused = true)]
async fn starts_sandbox_then_container_and_reports_running() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let calls = r.rt.calls();
    let pos = |op: &str| calls.iter().position(|c| c == op).unwrap();
    assert!(pos("RunPodSandbox") < pos("CreateContainer"));
    assert!(pos("CreateContainer") < pos("StartContainer"));
    assert_eq!(
        r.rt.count("PullImage"),
        0,
        "IfNotPresent with the image present must not pull"
    );
    let st = status(&r);
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(condition(&st, "Ready"), "True");
    assert_eq!(condition(&st, "PodReadyToStartContainers"), "True");
    let cs = app_status(&r);
    assert!(cs.state.unwrap().running.is_some());
    assert!(cs.container_id.unwrap().starts_with("containerd://"));
    assert!(cs.ready);
    assert_eq!(st.qos_class.as_deref(), Some("BestEffort"));
    assert_eq!(r.cg.live.lock().unwrap().len(), 1, "pod cgroup created");
    assert_eq!(
        r.events.events(),
        [
            format!(
                "Normal Pulled Container image {IMAGE:?} already present on machine and can be accessed by the pod"
            ),
            "Normal Created Container created".into(),
            "Normal Started Container started".into(),
        ]
    );
    // A second pass with nothing changed does nothing.
    r.rt.clear_calls();
    w.sync().await;
    assert_eq!(
        r.rt.count("RunPodSandbox") + r.rt.count("CreateContainer"),
        0
    );
}

#[tokio::test(start_paused = true)]
async fn crash_loop_backs_off_10s_then_20s() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let first = r.rt.running("app")[0].clone();
    r.rt.exit_container(&first, 1);
    // First exit: restarted at once.
    w.sync().await;
    assert_eq!(r.rt.running("app").len(), 1);
    assert_eq!(app_status(&r).restart_count, 1);
    let second = r.rt.running("app")[0].clone();
    r.rt.exit_container(&second, 1);
    let wake = w.sync().await;
    assert!(
        r.rt.running("app").is_empty(),
        "second restart waits for the back-off"
    );
    assert_eq!(wake, Duration::from_secs(10));
    let cs = app_status(&r);
    let waiting = cs.state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("CrashLoopBackOff"));
    assert!(
        waiting
            .message
            .unwrap()
            .starts_with("back-off 10s restarting failed container=app pod=web_default(uid-1)")
    );
    assert_eq!(cs.last_state.unwrap().terminated.unwrap().exit_code, 1);
    assert_eq!(status(&r).phase.as_deref(), Some("Running"));
    assert_eq!(
        r.events.events().last().unwrap(),
        "Warning BackOff Back-off restarting failed container app in pod web_default(uid-1)"
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    w.sync().await;
    assert_eq!(r.rt.running("app").len(), 1);
    assert_eq!(app_status(&r).restart_count, 2);
    let third = r.rt.running("app")[0].clone();
    r.rt.exit_container(&third, 1);
    assert_eq!(w.sync().await, Duration::from_secs(20));
}

#[tokio::test(start_paused = true)]
async fn on_failure_success_completes_the_pod() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("OnFailure", serde_json::json!({})), None);
    w.sync().await;
    let id = r.rt.running("app")[0].clone();
    r.rt.exit_container(&id, 0);
    w.sync().await;
    let st = status(&r);
    assert_eq!(st.phase.as_deref(), Some("Succeeded"));
    assert_eq!(condition(&st, "Ready"), "False");
    assert_eq!(
        r.rt.count("CreateContainer"),
        1,
        "a successful container is not restarted"
    );
    assert_eq!(
        r.rt.count("StopPodSandbox"),
        1,
        "the finished pod's sandbox is stopped"
    );
    w.sync().await;
    assert_eq!(
        r.rt.count("RunPodSandbox"),
        1,
        "no new sandbox for a finished pod"
    );
    let t = app_status(&r).state.unwrap().terminated.unwrap();
    assert_eq!(t.reason.as_deref(), Some("Completed"));
}

#[tokio::test(start_paused = true)]
async fn never_policy_failure_fails_the_pod() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Never", serde_json::json!({})), None);
    w.sync().await;
    let id = r.rt.running("app")[0].clone();
    r.rt.exit_container(&id, 3);
    w.sync().await;
    w.sync().await;
    assert_eq!(status(&r).phase.as_deref(), Some("Failed"));
    assert_eq!(
        app_status(&r).state.unwrap().terminated.unwrap().exit_code,
        3
    );
    assert_eq!(r.rt.count("CreateContainer"), 1);
    assert_eq!(r.rt.count("RunPodSandbox"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_new_worker_adopts_running_containers() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let before = r.rt.running("app");
    r.rt.clear_calls();
    // The agent restarted: a fresh worker with no memory of the pod.
    let fresh_env = Arc::new(Deps {
        events: r.env.events.clone(),
        cgroups: crate::cm::ContainerManager::for_test(r.cg.clone()),
        node: r.env.node.clone(),
        ..Deps::for_test(r.rt.clone(), r._dir.path())
    });
    let mut w2 = Worker::new(
        fresh_env.clone(),
        pod("Always", serde_json::json!({})),
        None,
    );
    w2.sync().await;
    assert_eq!(r.rt.running("app"), before);
    for op in [
        "RunPodSandbox",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
    ] {
        assert_eq!(r.rt.count(op), 0, "{op} must not be called on adoption");
    }
    let st = fresh_env.statuses.get("uid-1").unwrap().status.unwrap();
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert!(
        st.pod_ip.is_some(),
        "the pod IP is read back from the sandbox"
    );
}

#[tokio::test(start_paused = true)]
async fn spec_change_replaces_the_container() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let old = r.rt.running("app")[0].clone();
    let mut changed = pod("Always", serde_json::json!({}));
    // The container hash covers name and image (upstream's HashContainer): an image change
    // replaces the container.
    changed.spec.as_mut().unwrap().containers[0].image = Some("busybox:1.36".into());
    w.desired = changed;
    w.sync().await;
    let now = r.rt.running("app");
    assert_eq!(now.len(), 1);
    assert_ne!(now[0], old);
    assert_eq!(app_status(&r).restart_count, 1);
}

#[tokio::test(start_paused = true)]
async fn terminate_stops_and_removes_everything() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    assert!(w.terminate(Some(Duration::from_secs(5))).await);
    assert_eq!(r.rt.count("StopContainer"), 1);
    assert_eq!(
        r.rt.stop_timeouts(),
        vec![Duration::from_secs(5)],
        "SIGKILL comes at the grace deadline"
    );
    assert_eq!(r.rt.sandbox_count(), 0);
    assert!(r.rt.running("app").is_empty());
    assert!(r.cg.live.lock().unwrap().is_empty(), "pod cgroup removed");
    assert!(r.env.statuses.get("uid-1").is_none());
}

/// Log shippers find the started container under upstream's name in /var/log/containers,
/// pointing at its CRI log file; the link goes with the container when the pod goes.
#[tokio::test(start_paused = true)]
async fn a_started_container_gets_its_log_link_and_loses_it_with_the_container() {
    let r = rig();
    let fs = Arc::new(crate::logs::links::FakeLinkDir::default());
    let env = Arc::new(Deps {
        log_links: Arc::new(crate::logs::Links::with("/links".into(), fs.clone())),
        ..Deps::for_test(r.rt.clone(), r._dir.path())
    });
    let mut w = Worker::new(env, pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let id = r.rt.running("app")[0].clone();
    let log = r.rt.container_status(&id).await.unwrap().log_path;
    let links = fs.links.lock().unwrap().clone();
    let want = format!("web_default_app-{id}.log");
    assert_eq!(links.keys().collect::<Vec<_>>(), [&want], "{links:?}");
    assert!(links[&want].ends_with("app/0.log"), "{links:?}");
    if !log.is_empty() {
        assert_eq!(links[&want], std::path::PathBuf::from(&log));
    }
    assert!(w.terminate(Some(Duration::from_secs(5))).await);
    assert!(
        fs.links.lock().unwrap().is_empty(),
        "removed with the container"
    );
}

#[tokio::test(start_paused = true)]
async fn terminate_retries_when_the_runtime_fails() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    r.rt.fail_next(
        "RemovePodSandbox",
        RuntimeError::Unavailable("socket closed".into()),
    );
    assert!(!w.terminate(Some(Duration::from_secs(5))).await);
    assert!(w.terminate(Some(Duration::from_secs(5))).await);
    assert_eq!(r.rt.sandbox_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn image_policies() {
    let r = rig();
    let mut p = pod("Always", serde_json::json!({}));
    p.spec.as_mut().unwrap().containers[0].image_pull_policy = Some("Always".into());
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    assert_eq!(r.rt.count("PullImage"), 1);
    let ev = r.events.events();
    assert_eq!(ev[0], format!("Normal Pulling Pulling image {IMAGE:?}"));
    assert!(
        ev[1].starts_with(&format!(
            "Normal Pulled Successfully pulled image {IMAGE:?} in "
        )) && ev[1].ends_with(&format!(
            " including waiting). Image size: {FAKE_IMAGE_SIZE} bytes."
        )),
        "{}",
        ev[1]
    );

    let r = rig();
    let mut p = pod("Always", serde_json::json!({}));
    p.spec.as_mut().unwrap().containers[0].image = Some("example.org/missing:1".into());
    p.spec.as_mut().unwrap().containers[0].image_pull_policy = Some("Never".into());
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ErrImageNeverPull"));
    assert_eq!(status(&r).phase.as_deref(), Some("Pending"));
    assert_eq!(
        r.events.events(),
        [
            "Warning ErrImageNeverPull Container image \"example.org/missing:1\" is not present with pull policy of Never",
            "Warning Failed Error: ErrImageNeverPull",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn failed_pull_backs_off() {
    let r = rig();
    let mut p = pod("Always", serde_json::json!({}));
    p.spec.as_mut().unwrap().containers[0].image = Some("example.org/absent:1".into());
    let mut w = Worker::new(r.env.clone(), p, None);
    r.rt.fail_next(
        "PullImage",
        RuntimeError::Call {
            op: "PullImage",
            message: "no registry".into(),
        },
    );
    w.sync().await;
    assert_eq!(
        app_status(&r)
            .state
            .unwrap()
            .waiting
            .unwrap()
            .reason
            .as_deref(),
        Some("ErrImagePull")
    );
    w.sync().await;
    assert_eq!(
        app_status(&r)
            .state
            .unwrap()
            .waiting
            .unwrap()
            .reason
            .as_deref(),
        Some("ImagePullBackOff")
    );
    assert_eq!(r.rt.count("PullImage"), 1, "no pull during the back-off");
    assert_eq!(
        r.events.events(),
        [
            "Normal Pulling Pulling image \"example.org/absent:1\"",
            "Warning Failed Failed to pull image \"example.org/absent:1\": PullImage failed: no registry",
            "Warning Failed Error: ErrImagePull",
            "Normal BackOff Back-off pulling image \"example.org/absent:1\"",
            "Warning Failed Error: ImagePullBackOff",
        ]
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    w.sync().await;
    assert_eq!(r.rt.count("PullImage"), 2);
    assert!(app_status(&r).state.unwrap().running.is_some());
}

#[tokio::test(start_paused = true)]
async fn init_containers_run_first_and_in_order() {
    let r = rig();
    let p = pod(
        "Always",
        serde_json::json!({"initContainers": [
            {"name": "init-a", "image": IMAGE},
            {"name": "init-b", "image": IMAGE}
        ]}),
    );
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    assert_eq!(r.rt.running("init-a").len(), 1);
    assert!(r.rt.running("app").is_empty());
    let st = status(&r);
    assert_eq!(condition(&st, "Initialized"), "False");
    assert_eq!(
        app_status(&r)
            .state
            .unwrap()
            .waiting
            .unwrap()
            .reason
            .as_deref(),
        Some("PodInitializing")
    );
    let a = r.rt.running("init-a")[0].clone();
    r.rt.exit_container(&a, 0);
    w.sync().await;
    let b = r.rt.running("init-b")[0].clone();
    r.rt.exit_container(&b, 0);
    w.sync().await;
    assert_eq!(r.rt.running("app").len(), 1);
    assert_eq!(condition(&status(&r), "Initialized"), "True");
    assert_eq!(status(&r).phase.as_deref(), Some("Running"));
}

#[tokio::test(start_paused = true)]
async fn sandbox_failure_is_retried() {
    let r = rig();
    r.rt.fail_next(
        "RunPodSandbox",
        RuntimeError::Call {
            op: "RunPodSandbox",
            message: "cni failed".into(),
        },
    );
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    let wake = w.sync().await;
    assert!(wake <= Duration::from_secs(2));
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
    assert!(waiting.message.unwrap().contains("cni failed"));
    assert!(
        r.events
            .events()
            .contains(&"Warning FailedCreatePodSandBox Failed to create pod sandbox: RunPodSandbox failed: cni failed".to_string()),
        "{:?}",
        r.events.events()
    );
    w.sync().await;
    assert_eq!(r.rt.running("app").len(), 1);
}

#[test]
fn backoff_sequence_and_reset() {
    let mut b = Backoff::default();
    let t0 = Instant::now();
    assert!(b.check("c", "1", Duration::from_secs(1), t0).is_ok());
    assert_eq!(
        b.check("c", "2", Duration::from_secs(1), t0).unwrap_err().1,
        Duration::from_secs(10)
    );
    assert_eq!(
        b.check("c", "3", Duration::from_secs(1), t0).unwrap_err().1,
        Duration::from_secs(20)
    );
    // A container that ran for 10 minutes restarts at once.
    assert!(b.check("c", "4", Duration::from_secs(600), t0).is_ok());
    let mut cap = Backoff::default();
    let mut last = Duration::ZERO;
    for i in 0..12 {
        if let Err((_, d)) = cap.check("c", &i.to_string(), Duration::ZERO, t0) {
            last = d;
        }
    }
    assert_eq!(last, BACKOFF_MAX);
}

/// `crashLoopBackOff.maxContainerRestartPeriod` caps the delays; a cap below 10 s is also
/// the first delay, and a run of twice the cap resets the back-off (upstream's entries expire
/// after twice their maximum).
#[test]
fn the_configured_cap_bounds_the_restart_back_off() {
    let t0 = Instant::now();
    let delays = |max: u64, runs: &[u64]| -> Vec<u64> {
        let mut b = Backoff::new(Duration::from_secs(max));
        runs.iter()
            .enumerate()
            .map(|(i, ran)| {
                b.check("c", &i.to_string(), Duration::from_secs(*ran), t0)
                    .err()
                    .map_or(0, |(_, d)| d.as_secs())
            })
            .collect()
    };
    assert_eq!(delays(30, &[0, 0, 0, 0, 0]), [0, 10, 20, 30, 30]);
    assert_eq!(delays(5, &[0, 0, 0]), [0, 5, 5]);
    // Ran 59 s (under twice 30 s): still backing off; ran 60 s: afresh.
    assert_eq!(delays(30, &[0, 0, 59, 60]), [0, 10, 20, 0]);
}

#[test]
fn a_panicking_step_waits_1s_doubling_to_5min_and_resets_after_a_good_pass() {
    let mut p = StepPanics::default();
    let payload: Box<dyn std::any::Any + Send> = Box::new("boom");
    let waits: Vec<u64> = (0..11)
        .map(|_| p.record("sync", payload.as_ref()).as_secs())
        .collect();
    assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    p.reset();
    assert_eq!(p.record("sync", payload.as_ref()), Duration::from_secs(1));
}

async fn next_update(
    r: &mut Rig,
    kind: ::probes::ProbeKind,
    result: ::probes::ProbeStatus,
) -> ::probes::ProbeUpdate {
    tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let u = r.probe_rx.recv().await.unwrap();
            if u.kind == kind && u.result == result {
                return u;
            }
        }
    })
    .await
    .expect("probe update")
}

#[tokio::test(start_paused = true)]
async fn liveness_failure_kills_and_restarts_the_container() {
    let mut r = rig();
    let p = pod(
        "Always",
        serde_json::json!({"containers": [{"name": "app", "image": IMAGE,
            "livenessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1, "failureThreshold": 2}}]}),
    );
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let first = r.rt.running("app")[0].clone();
    // Two failing execs in a row reach the threshold.
    for _ in 0..2 {
        r.rt.push_exec_result(ExecResult {
            exit_code: 1,
            stdout: vec![],
            stderr: b"unhealthy".to_vec(),
        });
    }
    let u = next_update(
        &mut r,
        ::probes::ProbeKind::Liveness,
        ::probes::ProbeStatus::Failure,
    )
    .await;
    assert_eq!(u.container_id, first);
    w.on_probe(u);
    w.sync().await;
    assert_eq!(
        r.rt.count("StopContainer"),
        1,
        "the unhealthy container is killed"
    );
    let now = r.rt.running("app");
    assert_eq!(
        now.len(),
        1,
        "and restarted at once (first restart has no back-off)"
    );
    assert_ne!(now[0], first);
    let cs = app_status(&r);
    assert_eq!(cs.restart_count, 1);
    assert!(cs.last_state.unwrap().terminated.is_some());
    assert!(
        r.events.events().contains(
            &"Normal Killing Container app failed liveness probe, will be restarted".to_string()
        ),
        "{:?}",
        r.events.events()
    );
}

#[tokio::test(start_paused = true)]
async fn readiness_probe_gates_ready_and_startup_gates_started() {
    let mut r = rig();
    let p = pod(
        "Always",
        serde_json::json!({"containers": [{"name": "app", "image": IMAGE,
            "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
            "startupProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1}}]}),
    );
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let cs = app_status(&r);
    assert!(!cs.ready, "not ready before the readiness probe succeeds");
    assert_eq!(
        cs.started,
        Some(false),
        "not started before the startup probe succeeds"
    );
    assert_eq!(condition(&status(&r), "Ready"), "False");
    next_update(
        &mut r,
        ::probes::ProbeKind::Startup,
        ::probes::ProbeStatus::Success,
    )
    .await;
    next_update(
        &mut r,
        ::probes::ProbeKind::Readiness,
        ::probes::ProbeStatus::Success,
    )
    .await;
    w.sync().await;
    let cs = app_status(&r);
    assert_eq!(cs.started, Some(true));
    assert!(cs.ready);
    assert_eq!(condition(&status(&r), "Ready"), "True");
    // Readiness failing again flips it back.
    for _ in 0..3 {
        r.rt.push_exec_result(ExecResult {
            exit_code: 1,
            stdout: vec![],
            stderr: vec![],
        });
    }
    next_update(
        &mut r,
        ::probes::ProbeKind::Readiness,
        ::probes::ProbeStatus::Failure,
    )
    .await;
    w.sync().await;
    assert!(!app_status(&r).ready);
    assert_eq!(condition(&status(&r), "ContainersReady"), "False");
}

#[tokio::test(start_paused = true)]
async fn invalid_probe_is_reported_not_started() {
    let r = rig();
    let p = pod(
        "Always",
        serde_json::json!({"containers": [{"name": "app", "image": IMAGE,
            "livenessProbe": {"httpGet": {"port": "web"}}}]}),
    );
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert!(waiting.message.unwrap().contains("web"));
    assert_eq!(r.rt.count("CreateContainer"), 0);
}

#[tokio::test(start_paused = true)]
async fn run_as_non_root_is_checked_against_the_image_user() {
    use crate::runtime::ImageUser;
    let r = rig();
    // The image runs as root: refused before anything is created, as upstream.
    r.rt.set_image_user(
        IMAGE,
        ImageUser {
            uid: Some(0),
            username: String::new(),
        },
    );
    let p = pod(
        "Always",
        serde_json::json!({"securityContext": {"runAsNonRoot": true, "fsGroup": 2000}}),
    );
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert_eq!(
        waiting.message.as_deref(),
        Some(
            "container has runAsNonRoot and image will run as root (pod: \"web_default(uid-1)\", container: app)"
        )
    );
    assert_eq!(r.rt.count("CreateContainer"), 0);
    // A non-root image user: the container runs as it, with fsGroup as a supplemental group.
    r.rt.set_image_user(
        IMAGE,
        ImageUser {
            uid: Some(1000),
            username: String::new(),
        },
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    w.sync().await;
    let running = r.rt.running("app");
    assert_eq!(running.len(), 1);
    let cfg = r.rt.created_config(&running[0]).unwrap();
    assert_eq!(cfg.security.run_as_user, Some(1000));
    assert_eq!(cfg.security.supplemental_groups, vec![2000]);
}

#[tokio::test(start_paused = true)]
async fn zero_grace_still_gets_the_minimum_and_orphans_use_recorded_grace() {
    let r = rig();
    let mut w = Worker::new(
        r.env.clone(),
        pod(
            "Always",
            serde_json::json!({"terminationGracePeriodSeconds": 7}),
        ),
        None,
    );
    w.sync().await;
    // An agent restart lost the spec: the pod is only known by UID; its grace period was
    // recorded on the container.
    let mut orphan = Pod::default();
    orphan.metadata.uid = Some("uid-1".into());
    let mut o = Worker::new(r.env.clone(), orphan, None);
    assert!(o.terminate(None).await);
    assert_eq!(r.rt.stop_timeouts(), vec![Duration::from_secs(7)]);

    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    assert!(w.terminate(Some(Duration::ZERO)).await);
    assert_eq!(
        r.rt.stop_timeouts(),
        vec![MIN_GRACE],
        "upstream never kills with less than 2 s"
    );
}

/// A panic inside one pod's sync (a bug) is caught: the worker keeps running, retries after
/// a back-off, and the pod gets started; another pod's worker is untouched meanwhile.
#[tokio::test(start_paused = true)]
async fn a_panicking_step_is_retried_and_other_pods_keep_going() {
    let r = rig();
    let (done_tx, _done_rx) = mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    // Another pod, running first.
    let mut other = pod("Always", serde_json::json!({}));
    other.metadata.uid = Some("uid-2".into());
    other.metadata.name = Some("other".into());
    let (_tx2, rx2) = mpsc::unbounded_channel();
    let w2 = Worker::new(r.env.clone(), other, None);
    let task2 = tokio::spawn(w2.run(rx2, done_tx.clone(), cancel.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(r.rt.running("app").len(), 1);

    r.rt.panic_next("RunPodSandbox", 2);
    let (tx, rx) = mpsc::unbounded_channel();
    let w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    let task = tokio::spawn(w.run(rx, done_tx, cancel.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!task.is_finished(), "the worker survived its panic");
    assert!(!task2.is_finished());
    assert_eq!(
        r.rt.count("RunPodSandbox"),
        2,
        "uid-2's, then uid-1's that panicked"
    );
    // 1 s, then 2 s after the second panic: the third try starts the pod.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(r.rt.count("RunPodSandbox"), 4);
    assert_eq!(r.rt.running("app").len(), 2, "both pods run");
    assert!(app_status(&r).state.unwrap().running.is_some());
    // Still managed: termination works.
    tx.send(Msg::Terminate {
        grace: Some(Duration::from_secs(5)),
    })
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(task.is_finished());
    assert_eq!(r.rt.running("app").len(), 1);
    cancel.cancel();
    task2.await.unwrap();
}

/// A pull has no deadline (a big image may take an hour), so the pod's deletion is what ends
/// it: a worker pulling when the pod is deleted drops the pull and terminates at once.
#[tokio::test(start_paused = true)]
async fn deleting_a_pod_ends_its_pull_and_the_pod_terminates() {
    let r = rig();
    let slow = "registry.local/huge:1";
    r.rt.set_pull_delay(Duration::from_secs(24 * 3600));
    let mut p = pod("Always", serde_json::json!({}));
    p.spec.as_mut().unwrap().containers[0].image = Some(slow.into());
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(Worker::new(r.env.clone(), p, None).run(rx, done_tx, cancel));
    // An hour into the pull: still pulling (no deadline cut it).
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!task.is_finished());
    assert!(r.rt.running("app").is_empty());
    assert_eq!(
        r.rt.count("RunPodSandbox"),
        1,
        "the sandbox runs while the image comes"
    );
    tx.send(Msg::Terminate {
        grace: Some(Duration::from_secs(5)),
    })
    .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(10), done_rx.recv()).await;
    assert_eq!(done.ok().flatten().as_deref(), Some("uid-1"), "terminated");
    assert!(
        task.is_finished()
            || tokio::time::timeout(Duration::from_secs(1), task)
                .await
                .is_ok()
    );
    let images = r.rt.list_images().await.unwrap();
    assert!(
        images
            .iter()
            .all(|i| !i.repo_tags.iter().any(|t| t == slow)),
        "the pull was dropped, not finished"
    );
}

/// A bind mount that hangs until the test lets it go, as on a stuck disk.
#[derive(Debug, Default)]
struct StuckBinder {
    released: std::sync::Mutex<bool>,
    wake: std::sync::Condvar,
}

impl StuckBinder {
    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.wake.notify_all();
    }
}

impl crate::volume::subpath::Binder for StuckBinder {
    fn bind_fd(&self, _fd: &std::fs::File, _target: &std::path::Path) -> std::io::Result<()> {
        let mut released = self.released.lock().unwrap();
        while !*released {
            released = self.wake.wait(released).unwrap();
        }
        Ok(())
    }

    fn unmount_below(&self, _dir: &std::path::Path) -> std::io::Result<()> {
        Ok(())
    }
}

/// One pod's stuck filesystem work (a subPath bind that hangs) runs off the async workers:
/// with a single worker thread, another pod still starts while it hangs (were the bind on
/// the worker thread, the other pod could never start and the bounded wait would fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_stuck_disk_for_one_pod_does_not_stall_the_others() {
    let binder = Arc::new(StuckBinder::default());
    let r = rig_with_binder(binder.clone());
    let slow = pod(
        "Always",
        serde_json::json!({
            "volumes": [{"name": "v", "emptyDir": {}}],
            "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "v", "mountPath": "/x", "subPath": "data"}]}]
        }),
    );
    let mut quick = pod("Always", serde_json::json!({}));
    quick.metadata.uid = Some("uid-2".into());
    quick.metadata.name = Some("quick".into());
    let (done_tx, _done_rx) = mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let (_tx1, rx1) = mpsc::unbounded_channel();
    let (_tx2, rx2) = mpsc::unbounded_channel();
    let t1 = tokio::spawn(Worker::new(r.env.clone(), slow, None).run(
        rx1,
        done_tx.clone(),
        cancel.clone(),
    ));
    // The slow pod reaches its bind and hangs there.
    let stuck = async {
        while r.rt.count("PullImage") + r.rt.count("ImageStatus") == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stuck.await;
    let t2 =
        tokio::spawn(Worker::new(r.env.clone(), quick, None).run(rx2, done_tx, cancel.clone()));
    let running = |uid: &str| {
        r.env
            .statuses
            .get(uid)
            .and_then(|s| s.status)
            .is_some_and(|s| {
                s.container_statuses
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
            })
    };
    let quick_running = async {
        while !running("uid-2") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let ok = tokio::time::timeout(Duration::from_secs(20), quick_running).await;
    let slow_was_running = running("uid-1");
    binder.release();
    assert!(
        ok.is_ok(),
        "the quick pod never started beside the stuck one"
    );
    assert!(!slow_was_running, "the slow pod was held at its bind");
    cancel.cancel();
    let _ = t1.await;
    let _ = t2.await;
}

fn init_status(r: &Rig, name: &str) -> k8s_openapi::api::core::v1::ContainerStatus {
    status(r)
        .init_container_statuses
        .unwrap()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap()
}

fn sidecar_pod(sidecar: serde_json::Value) -> Pod {
    let mut side = serde_json::json!({"name": "side", "image": IMAGE, "restartPolicy": "Always"});
    if let (Some(s), Some(e)) = (side.as_object_mut(), sidecar.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    pod(
        "Never",
        serde_json::json!({"initContainers": [side, {"name": "init-b", "image": IMAGE}]}),
    )
}

#[tokio::test(start_paused = true)]
async fn sidecar_runs_beside_the_app_restarts_and_stops_last() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), sidecar_pod(serde_json::json!({})), None);
    w.sync().await;
    assert_eq!(r.rt.running("side").len(), 1, "the sidecar starts first");
    assert!(r.rt.running("init-b").is_empty());
    assert_eq!(status(&r).phase.as_deref(), Some("Pending"));
    // Running without a startup probe counts as started: the next init container follows.
    w.sync().await;
    assert_eq!(r.rt.running("init-b").len(), 1);
    let side = init_status(&r, "side");
    assert_eq!(side.started, Some(true));
    assert!(side.ready);
    assert_eq!(condition(&status(&r), "Initialized"), "False");
    let b = r.rt.running("init-b")[0].clone();
    r.rt.exit_container(&b, 0);
    w.sync().await;
    assert_eq!(r.rt.running("app").len(), 1);
    assert_eq!(r.rt.running("side").len(), 1, "the sidecar keeps running");
    let st = status(&r);
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(condition(&st, "Initialized"), "True");
    assert_eq!(condition(&st, "ContainersReady"), "True");
    // A sidecar that exits is restarted even with restartPolicy Never; init-b is not rerun.
    let s1 = r.rt.running("side")[0].clone();
    r.rt.exit_container(&s1, 1);
    w.sync().await;
    assert_eq!(r.rt.running("side").len(), 1);
    assert_eq!(init_status(&r, "side").restart_count, 1);
    assert_eq!(
        r.rt.count("CreateContainer"),
        4,
        "side, init-b, app, side again"
    );
    assert_eq!(status(&r).phase.as_deref(), Some("Running"));
    // The app finishing completes the pod: the sidecar is stopped, not restarted.
    let app = r.rt.running("app")[0].clone();
    r.rt.exit_container(&app, 0);
    w.sync().await;
    assert!(r.rt.running("side").is_empty());
    w.sync().await;
    assert!(r.rt.running("side").is_empty(), "no sidecar restart");
    assert_eq!(status(&r).phase.as_deref(), Some("Succeeded"));
}

#[tokio::test(start_paused = true)]
async fn termination_stops_app_containers_before_sidecars_in_reverse_order() {
    let r = rig();
    let p = pod(
        "Always",
        serde_json::json!({"initContainers": [
            {"name": "side-1", "image": IMAGE, "restartPolicy": "Always"},
            {"name": "side-2", "image": IMAGE, "restartPolicy": "Always"}
        ]}),
    );
    let mut w = Worker::new(r.env.clone(), p, None);
    for _ in 0..3 {
        w.sync().await;
    }
    assert_eq!(r.rt.running("app").len(), 1);
    let ids: Vec<String> = ["app", "side-2", "side-1"]
        .iter()
        .map(|n| r.rt.running(n)[0].clone())
        .collect();
    let obs = observe(r.rt.as_ref(), "uid-1").await.unwrap();
    w.stop_containers(&obs, Duration::from_secs(5)).await;
    let mut finished = Vec::new();
    for id in &ids {
        let st = r.rt.container_status(id).await.unwrap();
        assert_eq!(st.state, ContainerState::Exited);
        finished.push(st.finished_at);
    }
    assert!(
        finished[0] < finished[1] && finished[1] < finished[2],
        "app, then side-2, then side-1: {finished:?}"
    );
    assert!(w.terminate(Some(Duration::from_secs(5))).await);
}

#[tokio::test(start_paused = true)]
async fn sidecar_startup_probe_holds_back_the_next_init_container() {
    let mut r = rig();
    let p = sidecar_pod(serde_json::json!({
        "startupProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1}
    }));
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    w.sync().await;
    assert!(
        r.rt.running("init-b").is_empty(),
        "waits for the sidecar's startup probe"
    );
    assert_eq!(init_status(&r, "side").started, Some(false));
    next_update(
        &mut r,
        ::probes::ProbeKind::Startup,
        ::probes::ProbeStatus::Success,
    )
    .await;
    w.sync().await;
    assert_eq!(r.rt.running("init-b").len(), 1);
    assert_eq!(init_status(&r, "side").started, Some(true));
}

fn hook_pod(lifecycle: serde_json::Value) -> Pod {
    pod(
        "Always",
        serde_json::json!({"containers": [{"name": "app", "image": IMAGE, "lifecycle": lifecycle}]}),
    )
}

#[tokio::test(start_paused = true)]
async fn failed_post_start_hook_kills_the_container_which_restarts() {
    let r = rig();
    let p =
        hook_pod(serde_json::json!({"postStart": {"exec": {"command": ["sh", "-c", "exit 3"]}}}));
    r.rt.push_exec_result(ExecResult {
        exit_code: 3,
        stdout: b"out".to_vec(),
        stderr: b"boom".to_vec(),
    });
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    assert!(
        r.rt.running("app").is_empty(),
        "killed after the hook failed"
    );
    let events = r.events.events();
    assert!(
        events.contains(&"Warning FailedPostStartHook PostStartHook failed".to_string()),
        "{events:?}"
    );
    assert!(events.contains(&"Normal Killing FailedPostStartHook".to_string()));
    // The hook's output goes to the waiting message, not to the event.
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("PostStartHookError"));
    assert_eq!(
        waiting.message.as_deref(),
        Some(
            "Exec lifecycle hook ([sh -c exit 3]) for Container \"app\" in Pod \"web_default(uid-1)\" failed - error: command 'sh -c exit 3' exited with 3: boom, message: \"outboom\""
        )
    );
    // The next pass restarts it (the hook now succeeds: the fake's default exit 0).
    w.sync().await;
    assert_eq!(r.rt.running("app").len(), 1);
    let cs = app_status(&r);
    assert_eq!(cs.restart_count, 1);
    assert!(cs.state.unwrap().running.is_some());
}

#[tokio::test(start_paused = true)]
async fn pre_stop_runs_inside_the_grace_period() {
    let r = rig();
    let p = hook_pod(serde_json::json!({"preStop": {"sleep": {"seconds": 2}}}));
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let before = Instant::now();
    assert!(w.terminate(Some(Duration::from_secs(5))).await);
    assert!(
        before.elapsed() >= Duration::from_secs(2),
        "preStop slept first"
    );
    assert_eq!(
        r.rt.stop_timeouts(),
        [Duration::from_secs(3)],
        "StopContainer gets the grace left after preStop"
    );

    // A failing exec preStop is reported; the container still stops, with at least 2 s.
    let r = rig();
    let p = hook_pod(serde_json::json!({"preStop": {"exec": {"command": ["false"]}}}));
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    r.rt.push_exec_result(ExecResult {
        exit_code: 1,
        stdout: vec![],
        stderr: vec![],
    });
    assert!(w.terminate(Some(Duration::from_secs(1))).await);
    assert!(
        r.events
            .events()
            .contains(&"Warning FailedPreStopHook PreStopHook failed".to_string()),
        "{:?}",
        r.events.events()
    );
    assert_eq!(r.rt.stop_timeouts(), [MIN_GRACE]);
}

#[tokio::test(start_paused = true)]
async fn active_deadline_fails_the_pod_for_good() {
    let r = rig();
    let p = pod("Always", serde_json::json!({"activeDeadlineSeconds": 30}));
    let mut w = Worker::new(r.env.clone(), p, None);
    let wake = w.sync().await;
    assert!(wake <= Duration::from_secs(30), "wakes by the deadline");
    assert_eq!(r.rt.running("app").len(), 1);
    // The deadline passes (the start time is wall-clock).
    w.seen.start_time = Some(Timestamp::now() - std::time::Duration::from_secs(31));
    w.sync().await;
    assert!(r.rt.running("app").is_empty(), "stopped at the deadline");
    let st = status(&r);
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(st.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        st.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    assert!(
        r.events
            .events()
            .contains(&"Normal DeadlineExceeded Pod was active on the node longer than the specified deadline".to_string())
    );
    w.sync().await;
    assert!(r.rt.running("app").is_empty(), "never restarted");
    assert_eq!(status(&r).phase.as_deref(), Some("Failed"));
    // Nor by a new worker after an agent restart.
    let mut w = Worker::new(r.env.clone(), w.pod.clone(), Some(status(&r)));
    w.sync().await;
    assert!(
        r.rt.running("app").is_empty(),
        "not restarted after an agent restart"
    );
    assert_eq!(status(&r).reason.as_deref(), Some("DeadlineExceeded"));
}

#[tokio::test(start_paused = true)]
async fn a_stop_request_fails_the_pod_for_good_with_its_reason() {
    let r = rig();
    let p = pod(
        "Always",
        serde_json::json!({"terminationGracePeriodSeconds": 60}),
    );
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    assert_eq!(r.rt.running("app").len(), 1);
    let (done, mut done_rx) = tokio::sync::oneshot::channel();
    w.on_stop(
        Stopped {
            reason: "Terminated".into(),
            message: "Pod was terminated in response to imminent node shutdown.".into(),
            disruption: true,
        },
        Duration::from_secs(20),
        done,
    );
    w.sync().await;
    assert!(r.rt.running("app").is_empty(), "stopped");
    assert_eq!(
        r.rt.stop_timeouts(),
        [Duration::from_secs(20)],
        "the request's grace, shorter than the pod's 60 s"
    );
    assert!(done_rx.try_recv().is_ok(), "the requester is told");
    let st = status(&r);
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(st.reason.as_deref(), Some("Terminated"));
    let dt = st
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("DisruptionTarget condition");
    assert_eq!(
        (dt.status.as_str(), dt.reason.as_deref()),
        ("True", Some("TerminationByKubelet"))
    );
    w.sync().await;
    assert!(r.rt.running("app").is_empty(), "never restarted");
    // Nor after an agent restart.
    let mut w = Worker::new(r.env.clone(), w.pod.clone(), Some(status(&r)));
    w.sync().await;
    assert!(r.rt.running("app").is_empty());
    assert_eq!(status(&r).reason.as_deref(), Some("Terminated"));
}

#[tokio::test(start_paused = true)]
async fn termination_message_from_the_file_or_the_log_tail() {
    let r = rig();
    let p = pod(
        "Never",
        serde_json::json!({"containers": [
            {"name": "app", "image": IMAGE},
            {"name": "logs", "image": IMAGE, "terminationMessagePolicy": "FallbackToLogsOnError"}
        ]}),
    );
    let mut w = Worker::new(r.env.clone(), p.clone(), None);
    w.sync().await;
    // The file keeps its last 4096 bytes.
    let file = spec::termination_log_host_path(&r.env.node, "uid-1", "app", 0);
    std::fs::write(&file, format!("{}{}", "x".repeat(100), "y".repeat(4096))).unwrap();
    let log_dir = crate::node_settings::pod_log_dir(&r.env.node, &p).join("logs");
    std::fs::create_dir_all(&log_dir).unwrap();
    let mut log = String::new();
    for i in 0..100 {
        log.push_str(&format!(
            "2026-01-01T00:00:00.000000000Z stderr F line {i}\n"
        ));
    }
    log.push_str("2026-01-01T00:00:00.000000000Z stderr P par\n");
    log.push_str("2026-01-01T00:00:00.000000000Z stderr F tial\n");
    std::fs::write(log_dir.join("0.log"), log).unwrap();
    r.rt.exit_container(&r.rt.running("app")[0], 0);
    r.rt.exit_container(&r.rt.running("logs")[0], 2);
    w.sync().await;
    let statuses = status(&r).container_statuses.unwrap();
    let message = |i: usize| {
        statuses[i]
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap()
            .message
            .unwrap_or_default()
    };
    assert_eq!(message(0), "y".repeat(4096));
    // 80 entries from the end: lines 22..=99 and the joined partial line.
    let expected: String = (22..100)
        .map(|i| format!("line {i}\n"))
        .chain(["partial\n".to_string()])
        .collect();
    assert_eq!(message(1), expected);
    // A long log keeps the last 2048 bytes of its last 80 lines.
    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join("0.log");
    let mut log = String::new();
    for i in 0..90 {
        log.push_str(&format!(
            "2026-01-01T00:00:00Z stdout F {i:02}{}\n",
            "z".repeat(98)
        ));
    }
    std::fs::write(&long, log).unwrap();
    let tail = exit_message::log_tail(dir.path(), &long, 80, 2048);
    assert_eq!(tail.len(), 2048);
    assert!(tail.ends_with(&format!("89{}\n", "z".repeat(98))));
    assert!(
        exit_message::log_tail(dir.path(), &dir.path().join("gone.log"), 80, 2048)
            .starts_with("Error on reading termination message from logs: ")
    );
}

#[tokio::test]
async fn http_hook_defaults_to_the_pod_ip_and_resolves_named_ports() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = conn.read(&mut buf).await.unwrap();
        // The status code does not matter to a hook (upstream looks only for a failed
        // exchange).
        conn.write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    });
    let p = pod(
        "Always",
        serde_json::json!({"containers": [{"name": "app", "image": IMAGE,
            "ports": [{"name": "web", "containerPort": port}]}]}),
    );
    let c = p.spec.as_ref().unwrap().containers[0].clone();
    let handler: k8s_openapi::api::core::v1::LifecycleHandler =
        serde_json::from_value(serde_json::json!({"httpGet": {
            "path": "/hook", "port": "web",
            "httpHeaders": [{"name": "X-Test", "value": "yes"}]}}))
        .unwrap();
    let rt = FakeRuntime::new();
    let target = hooks::HookTarget {
        pod: &p,
        container: &c,
        container_id: "c1",
        pod_ip: "127.0.0.1",
    };
    hooks::run(&rt, &target, &handler, Duration::from_secs(5))
        .await
        .unwrap();
    let request = server.await.unwrap();
    assert!(request.starts_with("GET /hook HTTP/1.1\r\n"), "{request}");
    assert!(request.contains(&format!("127.0.0.1:{port}")), "{request}");
    assert!(request.to_lowercase().contains("x-test: yes"), "{request}");
    assert!(
        request.to_lowercase().contains(&format!(
            "user-agent: kube-lifecycle/{}",
            plumbing::version::MAJOR_MINOR
        )),
        "{request}"
    );
    // Nothing listens any more (the listener is gone): the hook fails with upstream's message.
    let err = hooks::run(&rt, &target, &handler, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, hooks::HookError::Http { .. }), "{err:?}");
    let err = err.to_string();
    assert!(
        err.starts_with("HTTP lifecycle hook (/hook) for Container \"app\" in Pod \"web_default(uid-1)\" failed - error: "),
        "{err}"
    );
    // A tcpSocket handler cannot be run, as upstream.
    let tcp: k8s_openapi::api::core::v1::LifecycleHandler =
        serde_json::from_value(serde_json::json!({"tcpSocket": {"port": 80}})).unwrap();
    let err = hooks::run(&rt, &target, &tcp, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, hooks::HookError::Invalid(_)), "{err:?}");
    let err = err.to_string();
    assert!(
        err.starts_with("Cannot run handler: invalid handler: "),
        "{err}"
    );
}

/// RunPodSandbox carries the pod's resources and its overhead on `LinuxPodSandboxConfig`,
/// as upstream's applySandboxResources: a Guaranteed 500m / 64Mi pod gets 512 shares, a
/// 50000 µs quota per 100000 µs and a 64 MiB limit, and an all-zero overhead; a pod with
/// `spec.overhead` gets it as both request and limit, outside its resources.
#[tokio::test(start_paused = true)]
async fn sandbox_config_carries_pod_resources_and_overhead() {
    let sandbox_cfg = |extra: serde_json::Value| async move {
        let r = rig();
        let mut p = pod("Always", extra);
        p.spec.as_mut().unwrap().containers[0].resources = Some(
            serde_json::from_value(serde_json::json!({
                "requests": {"cpu": "500m", "memory": "64Mi"},
                "limits": {"cpu": "500m", "memory": "64Mi"}}))
            .unwrap(),
        );
        let mut w = Worker::new(r.env.clone(), p, None);
        w.sync().await;
        let sandbox = r.rt.list_sandboxes().await.unwrap().remove(0);
        r.rt.sandbox_config(&sandbox.id).unwrap()
    };
    let guaranteed = LinuxResources {
        cpu_shares: 512,
        cpu_quota: 50_000,
        cpu_period: 100_000,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    let cfg = sandbox_cfg(serde_json::json!({})).await;
    assert_eq!(cfg.resources, Some(guaranteed.clone()));
    assert_eq!(cfg.overhead, Some(LinuxResources::default()));

    let cfg =
        sandbox_cfg(serde_json::json!({"overhead": {"cpu": "250m", "memory": "120Mi"}})).await;
    assert_eq!(
        cfg.resources,
        Some(guaranteed),
        "overhead is not in the resources"
    );
    assert_eq!(
        cfg.overhead,
        Some(LinuxResources {
            cpu_shares: 256,
            cpu_quota: 25_000,
            cpu_period: 100_000,
            memory_limit_in_bytes: 120 << 20,
            ..Default::default()
        })
    );
}

// Pull credentials, RuntimeClass handlers and service links through a worker.
mod cluster_inputs;
// ResourceClaims (DRA) through the DRA manager and a fake driver plugin.
mod dra;
// The worker over the fakes of its narrow dependencies.
mod fakes;
// Pod fields of issue 27 (shared PID namespace, ephemeral containers, restart rules, ...).
mod pod_fields;
mod pulled_images;
// hostUsers: false: ranges, records, refusals before the sandbox.
mod userns;
// Regression tests of upstream CVEs in the container start path.
mod security_regressions;
// The CRI calls a start pass makes.
mod start_calls;

/// FallbackToLogsOnError reads the tail of the container's log: a pod with a hostPath on
/// /var/log that replaces its log with a symlink to a host file never gets that file into
/// its `terminated.message` (visible through the API), and a FIFO there does not hang the
/// worker.
#[test]
fn the_log_tail_for_a_termination_message_never_reads_a_planted_link_or_fifo() {
    use std::os::unix::fs::OpenOptionsExt;
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("pods");
    let dir = root.join("ns_p_uid/c");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        d.path().join("secret"),
        "2026-01-01T00:00:00Z stdout F SECRET\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(d.path().join("secret"), dir.join("0.log")).unwrap();
    let tail = exit_message::log_tail(&root, &dir.join("0.log"), 80, 2048);
    assert!(!tail.contains("SECRET"), "{tail}");
    // The container directory swapped for a symlink out: the same.
    std::fs::remove_file(dir.join("0.log")).unwrap();
    std::fs::remove_dir(&dir).unwrap();
    std::os::unix::fs::symlink(d.path(), &dir).unwrap();
    let tail = exit_message::log_tail(&root, &dir.join("secret"), 80, 2048);
    assert!(!tail.contains("SECRET"), "{tail}");
    std::fs::remove_file(&dir).unwrap();
    std::fs::create_dir(&dir).unwrap();
    let fifo = dir.join("1.log");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (r2, f2) = (root.clone(), fifo.clone());
    std::thread::spawn(move || {
        let _ = tx.send(exit_message::log_tail(&r2, &f2, 80, 2048));
    });
    let answer = rx.recv_timeout(std::time::Duration::from_secs(5));
    if answer.is_err() {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo);
    }
    let answer = answer.expect("the FIFO hung the log tail");
    assert!(
        answer.starts_with("Error on reading termination message from logs: "),
        "{answer}"
    );
}
