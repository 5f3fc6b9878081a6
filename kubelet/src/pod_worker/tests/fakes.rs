//! A worker over the fakes of its narrow dependencies: what it asks of the pod cgroups, the
//! volumes, the image puller and the pod-environment source, and how it takes their
//! failures.

use super::*;
use crate::images::{PullError, PullReason};

struct Fakes {
    cgroups: Arc<FakePodCgroups>,
    volumes: Arc<FakePodVolumes>,
    images: Arc<FakeImagePuller>,
}

fn rig_with_fakes(
    volumes: FakePodVolumes,
    images: FakeImagePuller,
    pod_env: FakePodEnvironment,
) -> (Rig, Fakes) {
    let r = rig();
    let f = Fakes {
        cgroups: Arc::new(FakePodCgroups::default()),
        volumes: Arc::new(volumes),
        images: Arc::new(images),
    };
    let env = Arc::new(Deps {
        events: r.events.clone(),
        cgroups: f.cgroups.clone(),
        volumes: f.volumes.clone(),
        images: f.images.clone(),
        pod_env: Arc::new(pod_env),
        ..Deps::for_test(r.rt.clone(), r._dir.path())
    });
    (Rig { env, ..r }, f)
}

#[tokio::test(start_paused = true)]
async fn a_pod_goes_through_its_dependencies_in_order() {
    let pod_env = FakePodEnvironment {
        services: Some([("WEB_SERVICE_HOST".to_string(), "10.96.0.7".to_string())].into()),
        handlers: [("fast".to_string(), "runc-fast".to_string())].into(),
    };
    let (r, f) = rig_with_fakes(
        FakePodVolumes::default(),
        FakeImagePuller::default(),
        pod_env,
    );
    let p = pod("Always", serde_json::json!({"runtimeClassName": "fast"}));
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let app = r.rt.running("app");
    assert_eq!(app.len(), 1, "{:?}", r.events.events());
    // The handler and the cgroup parent come from the dependencies.
    let sandbox = r.rt.list_sandboxes().await.unwrap().remove(0);
    let cfg = r.rt.sandbox_config(&sandbox.id).unwrap();
    assert_eq!(cfg.runtime_handler, "runc-fast");
    assert_eq!(cfg.cgroup_parent, "/kubepods/besteffort/poduid-1");
    let env: BTreeMap<_, _> =
        r.rt.created_config(&app[0])
            .unwrap()
            .envs
            .into_iter()
            .collect();
    assert_eq!(env["WEB_SERVICE_HOST"], "10.96.0.7");
    assert_eq!(f.images.asked(), [IMAGE]);
    assert_eq!(f.volumes.calls(), ["update uid-1", "mount uid-1"]);
    assert_eq!(f.cgroups.calls(), ["ensure uid-1"]);

    assert!(w.terminate(Some(Duration::from_secs(1))).await);
    assert_eq!(f.cgroups.calls(), ["ensure uid-1", "remove uid-1"]);
    assert_eq!(
        f.volumes.calls().last().map(String::as_str),
        Some("forget uid-1")
    );
}

#[tokio::test(start_paused = true)]
async fn the_dependencies_failures_show_as_the_containers_waiting_reasons() {
    // Services not synced yet: CreateContainerConfigError with the source's message.
    let not_synced = FakePodEnvironment {
        services: None,
        ..Default::default()
    };
    let (r, _) = rig_with_fakes(
        FakePodVolumes::default(),
        FakeImagePuller::default(),
        not_synced,
    );
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert_eq!(
        waiting.message.as_deref(),
        Some("services have not synced yet")
    );

    // An unknown RuntimeClass: no sandbox, ContainerCreating.
    let (r, f) = rig_with_fakes(
        FakePodVolumes::default(),
        FakeImagePuller::default(),
        FakePodEnvironment::default(),
    );
    let p = pod("Always", serde_json::json!({"runtimeClassName": "nope"}));
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    assert_eq!(r.rt.count("RunPodSandbox"), 0);
    assert!(
        f.cgroups.calls().is_empty(),
        "no cgroup for a pod without a sandbox"
    );
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
    assert!(
        r.events.events().contains(
            &"Warning FailedCreatePodSandBox Failed to create pod sandbox: no RuntimeClass \"nope\"".to_string()
        ),
        "{:?}",
        r.events.events()
    );

    // A volume that cannot be set up: FailedMount, and nothing is pulled or started.
    let broken = FakePodVolumes::failing(crate::volume::VolumeError {
        volume: "data".into(),
        message: "disk on fire".into(),
    });
    let (r, f) = rig_with_fakes(
        broken,
        FakeImagePuller::default(),
        FakePodEnvironment::default(),
    );
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    assert!(f.images.asked().is_empty());
    assert!(r.rt.running("app").is_empty());
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
    assert!(
        r.events
            .events()
            .iter()
            .any(|e| e.contains("FailedMount") && e.contains("disk on fire")),
        "{:?}",
        r.events.events()
    );

    // An image that cannot be had: its reason and message.
    let missing = FakeImagePuller::without(
        IMAGE,
        PullError {
            reason: PullReason::ErrImagePull,
            message: "no such image".into(),
            retry_after: Duration::from_secs(10),
        },
    );
    let (r, _) = rig_with_fakes(
        FakePodVolumes::default(),
        missing,
        FakePodEnvironment::default(),
    );
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ErrImagePull"));
    assert_eq!(waiting.message.as_deref(), Some("no such image"));
}
