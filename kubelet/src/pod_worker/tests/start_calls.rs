//! The CRI calls of a pod's start: what a start pass asks the runtime, beyond the three
//! calls of the start itself (each one is a round trip that a busy runtime makes slow).

use super::*;

#[tokio::test(start_paused = true)]
async fn a_start_pass_reads_back_what_it_created_instead_of_listing_the_pod_again() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    assert_eq!(
        r.rt.calls(),
        [
            "ListPodSandbox",
            "ListContainers",
            "RunPodSandbox",
            "PodSandboxStatus",
            "ImageStatus",
            "CreateContainer",
            "StartContainer",
            "ContainerStatus",
        ],
        "one ImageStatus per container start (it also gives the image's user), and the started container read back by ID"
    );
    let after_start = status(&r);
    assert_eq!(after_start.phase.as_deref(), Some("Running"));
    assert_eq!(condition(&after_start, "PodReadyToStartContainers"), "True");
    assert!(app_status(&r).state.unwrap().running.is_some());
    // A pass that lists the pod sees the same pod: the status does not change.
    r.rt.clear_calls();
    w.sync().await;
    assert_eq!(r.rt.count("ListContainers"), 1);
    assert_eq!(status(&r), after_start);
}

#[tokio::test(start_paused = true)]
async fn a_restart_in_the_same_sandbox_reads_back_only_the_new_instance() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let first = r.rt.running("app")[0].clone();
    r.rt.exit_container(&first, 1);
    r.rt.clear_calls();
    w.sync().await;
    let calls = r.rt.calls();
    let started = calls.iter().rposition(|c| c == "StartContainer").unwrap();
    assert_eq!(calls[started + 1..], ["ContainerStatus"]);
    let cs = app_status(&r);
    assert_eq!(cs.restart_count, 1);
    assert!(cs.state.unwrap().running.is_some());
    assert!(cs.last_state.unwrap().terminated.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_pass_that_stopped_a_container_lists_the_pod_again() {
    let r = rig();
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    // A new image replaces the container (kill, then start).
    r.rt.add_image("docker.io/library/busybox:1.36");
    let mut changed = pod("Always", serde_json::json!({}));
    changed.spec.as_mut().unwrap().containers[0].image =
        Some("docker.io/library/busybox:1.36".into());
    w.desired = changed;
    r.rt.clear_calls();
    w.sync().await;
    let calls = r.rt.calls();
    assert!(calls.iter().any(|c| c == "StopContainer"), "{calls:?}");
    let started = calls.iter().rposition(|c| c == "StartContainer").unwrap();
    assert_eq!(
        calls[started + 1..started + 3],
        ["ListPodSandbox", "ListContainers"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_that_could_not_be_made_lists_the_pod_again() {
    let r = rig();
    r.rt.fail_next(
        "RunPodSandbox",
        RuntimeError::Call {
            op: "RunPodSandbox",
            message: "no network for the sandbox".into(),
        },
    );
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let calls = r.rt.calls();
    assert_eq!(
        calls[calls.len() - 2..],
        ["ListPodSandbox", "ListContainers"]
    );
    let st = status(&r);
    assert_eq!(condition(&st, "PodReadyToStartContainers"), "False");
}
