//! `hostUsers: false` through the pod worker: the pod's range is taken before its sandbox
//! (recorded in its directory, kept across a restart, freed with the directory), and a pod
//! the runtime cannot give a user namespace is refused before any sandbox exists.

use super::*;
use crate::runtime::HandlerFeatures;
use crate::userns::{DirRecords, UsernsManager};

fn userns_rig(supported: bool) -> (Rig, Arc<UsernsManager>) {
    let r = rig();
    if supported {
        r.rt.set_handler_features(
            "",
            HandlerFeatures {
                user_namespaces: true,
                ..Default::default()
            },
        );
    }
    let manager = Arc::new(manager_for(&r.env.node.root_dir));
    let env = Arc::new(Deps {
        userns: Some(manager.clone()),
        events: r.events.clone(),
        ..Deps::for_test(r.rt.clone(), r._dir.path())
    });
    (Rig { env, ..r }, manager)
}

fn manager_for(root_dir: &std::path::Path) -> UsernsManager {
    let records = Arc::new(DirRecords {
        pods_dir: root_dir.join("pods"),
    });
    UsernsManager::new(
        records,
        65536,
        (
            crate::userns::DEFAULT_FIRST_ID,
            crate::userns::DEFAULT_LENGTH,
        ),
        110,
    )
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn user_namespace_pods_run_in_their_own_range_kept_across_restarts() {
    let (r, manager) = userns_rig(true);
    let mut w = Worker::new(
        r.env.clone(),
        pod("Always", serde_json::json!({"hostUsers": false})),
        None,
    );
    w.sync().await;
    let sandbox = r.rt.list_sandboxes().await.unwrap().remove(0);
    let ns =
        r.rt.sandbox_config(&sandbox.id)
            .unwrap()
            .userns
            .expect("a user namespace");
    let m = ns.uids[0];
    assert_eq!((m.container_id, m.length), (0, 65536));
    assert!(m.host_id >= 65536, "never the node's own IDs: {m:?}");
    assert_eq!(ns.uids, ns.gids);
    assert_eq!(r.rt.running("app").len(), 1, "the container runs");
    // The range is recorded in the pod's directory; a restarted agent takes it again.
    let record = r.env.node.root_dir.join("pods/uid-1/userns");
    assert!(record.exists());
    let again = manager_for(&r.env.node.root_dir);
    assert_eq!(again.mapping("uid-1"), Some(ns.clone()));
    // The pod's removal frees the range with its directory.
    assert!(w.terminate(Some(Duration::ZERO)).await);
    assert!(!record.exists());
    assert_eq!(manager.allocated(), 0);
}

#[tokio::test(start_paused = true)]
async fn user_namespace_pods_are_refused_before_the_sandbox_without_runtime_support() {
    // containerd 1.6: Status reports no handler with user namespaces.
    let (r, manager) = userns_rig(false);
    let mut w = Worker::new(
        r.env.clone(),
        pod("Always", serde_json::json!({"hostUsers": false})),
        None,
    );
    w.sync().await;
    assert_eq!(r.rt.count("RunPodSandbox"), 0, "no sandbox is created");
    assert_eq!(manager.allocated(), 0);
    let ev = r.events.events();
    assert!(
        ev.iter().any(|e| e.contains("FailedCreatePodSandBox")
            && e.contains(
                "can't set `spec.hostUsers: false`, runtime does not support user namespaces"
            )),
        "{ev:?}"
    );
    // A pod asking for the node's network with a user namespace: upstream's validation.
    let (r, _) = userns_rig(true);
    let p = pod(
        "Always",
        serde_json::json!({"hostUsers": false, "hostNetwork": true}),
    );
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    assert_eq!(r.rt.count("RunPodSandbox"), 0);
    let ev = r.events.events();
    assert!(
        ev.iter().any(|e| e.contains(
            "spec.securityContext.hostNetwork: Forbidden: when `pod.Spec.HostUsers` is false"
        )),
        "{ev:?}"
    );
}
