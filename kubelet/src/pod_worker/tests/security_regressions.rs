//! Regression tests for upstream kubelet CVEs that live in the pod worker's container start
//! path (named `cve_<year>_<number>_...`; the table is in docs/security.md).

use super::*;
use crate::runtime::ImageUser;

fn image_user(uid: i64) -> ImageUser {
    ImageUser {
        uid: Some(uid),
        username: String::new(),
    }
}

/// The UID the runtime was asked to run the running `app` container as.
fn running_uid(r: &Rig) -> Option<i64> {
    let running = r.rt.running("app");
    assert_eq!(running.len(), 1, "one app container running");
    r.rt.created_config(&running[0])
        .unwrap()
        .security
        .run_as_user
}

/// A fresh worker over the same runtime: the agent restarted and lost its memory.
fn restarted_agent(r: &Rig) -> Arc<Deps> {
    Arc::new(Deps {
        events: r.env.events.clone(),
        cgroups: crate::cm::ContainerManager::for_test(r.cg.clone()),
        node: r.env.node.clone(),
        ..Deps::for_test(r.rt.clone(), r._dir.path())
    })
}

/// CVE-2019-11245: a pod that names no runAsUser ran its restarted containers (and containers
/// of images already on the node) as UID 0 instead of the image's USER. Every start asks the
/// runtime for the image's user: the first start, a restart after an exit, a restart by a
/// fresh agent, and with `imagePullPolicy: Always` a start after a pull.
#[tokio::test(start_paused = true)]
async fn cve_2019_11245_restarted_containers_keep_the_image_uid() {
    for policy in ["IfNotPresent", "Always"] {
        let r = rig();
        r.rt.set_image_user(IMAGE, image_user(1000));
        let mut p = pod("Always", serde_json::json!({}));
        p.spec.as_mut().unwrap().containers[0].image_pull_policy = Some(policy.into());
        let mut w = Worker::new(r.env.clone(), p.clone(), None);
        w.sync().await;
        assert_eq!(running_uid(&r), Some(1000), "{policy}: first start");

        // The container exits and is restarted.
        r.rt.exit_container(&r.rt.running("app")[0], 1);
        w.sync().await;
        assert_eq!(app_status(&r).restart_count, 1);
        assert_eq!(running_uid(&r), Some(1000), "{policy}: after a restart");

        // The agent restarts, then the container exits again: the new worker restarts it.
        r.rt.exit_container(&r.rt.running("app")[0], 1);
        let mut fresh = Worker::new(restarted_agent(&r), p, None);
        tokio::time::advance(Duration::from_secs(300)).await;
        fresh.sync().await;
        assert_eq!(
            running_uid(&r),
            Some(1000),
            "{policy}: restarted by a fresh agent"
        );
        assert_eq!(r.rt.count("CreateContainer"), 3);
    }
}

/// CVE-2019-11245, the same with the pod's own runAsUser and runAsNonRoot: the configured
/// UID wins over the image's on every start, and runAsNonRoot is checked on every start too
/// (an image that turned into a root image between two starts is refused on the restart).
#[tokio::test(start_paused = true)]
async fn cve_2019_11245_the_pods_run_as_user_survives_restarts() {
    let r = rig();
    r.rt.set_image_user(IMAGE, image_user(1000));
    let p = pod(
        "Always",
        serde_json::json!({"securityContext": {"runAsUser": 2000}}),
    );
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    assert_eq!(running_uid(&r), Some(2000));
    r.rt.exit_container(&r.rt.running("app")[0], 1);
    w.sync().await;
    assert_eq!(app_status(&r).restart_count, 1);
    assert_eq!(running_uid(&r), Some(2000), "after a restart");

    let r = rig();
    r.rt.set_image_user(IMAGE, image_user(1000));
    let p = pod(
        "Always",
        serde_json::json!({"securityContext": {"runAsNonRoot": true}}),
    );
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    assert_eq!(running_uid(&r), Some(1000));
    r.rt.set_image_user(IMAGE, image_user(0));
    r.rt.exit_container(&r.rt.running("app")[0], 1);
    w.sync().await;
    assert!(
        r.rt.running("app").is_empty(),
        "a root image is not restarted"
    );
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert_eq!(r.rt.count("CreateContainer"), 1);
}

/// CVE-2023-2431: a Localhost seccomp profile with an empty `localhostProfile` ran the
/// container unconfined. Here it is a CreateContainerConfigError (on the pod or on the
/// container, with or without seccompDefault) and no container is created.
#[tokio::test(start_paused = true)]
async fn cve_2023_2431_empty_localhost_seccomp_profile_is_refused() {
    let empty =
        serde_json::json!({"seccompProfile": {"type": "Localhost", "localhostProfile": ""}});
    for on_pod in [true, false] {
        let r = rig();
        let mut p = pod("Always", serde_json::json!({}));
        let sc = serde_json::from_value(empty.clone()).unwrap();
        if on_pod {
            p.spec.as_mut().unwrap().security_context = Some(sc);
        } else {
            p.spec.as_mut().unwrap().containers[0].security_context =
                Some(serde_json::from_value(empty.clone()).unwrap());
        }
        let mut w = Worker::new(r.env.clone(), p, None);
        w.sync().await;
        let waiting = app_status(&r).state.unwrap().waiting.unwrap();
        assert_eq!(
            waiting.reason.as_deref(),
            Some("CreateContainerConfigError"),
            "on_pod={on_pod}"
        );
        assert_eq!(
            waiting.message.as_deref(),
            Some("localhostProfile must be set if seccompProfile type is Localhost.")
        );
        assert_eq!(r.rt.count("CreateContainer"), 0, "on_pod={on_pod}");
    }
}
