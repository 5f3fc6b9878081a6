//! A pod's ResourceClaims through the DRA manager and a fake driver plugin: prepared before
//! the sandbox and its containers, their CDI devices in the containers that reference them,
//! unprepared once the pod is gone; a claim not reserved for the pod holds the pod back.

use super::*;
use crate::devices::DraManager;
use crate::devices::testing::{FakeClaimApi, FakeDraPlugin, claim};
use crate::devices::{ClaimApi, DraPlugin};
use cri_proto::dra::v1 as pb;

const DRIVER: &str = "gpu.example.com";

/// The fake plugin, noting what the runtime had been asked when each call came.
struct Witness {
    rt: Arc<FakeRuntime>,
    inner: FakeDraPlugin,
    seen: Arc<std::sync::Mutex<Vec<String>>>,
}

#[async_trait::async_trait]
impl DraPlugin for Witness {
    async fn prepare(
        &self,
        req: pb::NodePrepareResourcesRequest,
    ) -> Result<pb::NodePrepareResourcesResponse, String> {
        let calls = self.rt.calls().join(",");
        for c in &req.claims {
            self.seen
                .lock()
                .unwrap()
                .push(format!("prepare {} after [{calls}]", c.uid));
        }
        self.inner.prepare(req).await
    }

    async fn unprepare(
        &self,
        req: pb::NodeUnprepareResourcesRequest,
    ) -> Result<pb::NodeUnprepareResourcesResponse, String> {
        let running = self.rt.running("app").len();
        for c in &req.claims {
            self.seen
                .lock()
                .unwrap()
                .push(format!("unprepare {} with {running} running", c.uid));
        }
        self.inner.unprepare(req).await
    }
}

struct DraRig {
    r: Rig,
    api: Arc<FakeClaimApi>,
    seen: Arc<std::sync::Mutex<Vec<String>>>,
}

fn dra_rig() -> DraRig {
    let r = rig();
    let api = Arc::new(FakeClaimApi::default());
    let m = DraManager::new(r._dir.path(), Some(api.clone() as Arc<dyn ClaimApi>));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let plugin = Witness {
        rt: r.rt.clone(),
        inner: FakeDraPlugin::new("example.com/gpu", Arc::default()),
        seen: seen.clone(),
    };
    m.add_plugin(DRIVER, "/plugin.sock", Arc::new(plugin))
        .unwrap();
    let env = Arc::new(Deps {
        dra: Some(Arc::new(m)),
        events: r.events.clone(),
        ..Deps::for_test(r.rt.clone(), r._dir.path())
    });
    let r = Rig { env, ..r };
    DraRig { r, api, seen }
}

fn claim_pod() -> Pod {
    pod(
        "Always",
        serde_json::json!({
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-claim"}],
            "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"],
                "resources": {"claims": [{"name": "gpu"}]}}],
        }),
    )
}

#[tokio::test(start_paused = true)]
async fn dra_claims_are_prepared_before_the_container_and_reach_its_cdi_devices() {
    let d = dra_rig();
    let r = &d.r;
    d.api.put(claim(
        "default",
        "gpu-claim",
        "claim-uid-7",
        Some(DRIVER),
        Some("uid-1"),
    ));
    let mut w = Worker::new(r.env.clone(), claim_pod(), None);
    w.sync().await;
    let app = r.rt.running("app");
    assert_eq!(app.len(), 1, "{:?}", r.events.events());
    // The claim's UID reached NodePrepareResources before the runtime was asked for anything
    // of the pod.
    let seen = d.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].starts_with("prepare claim-uid-7 after ["),
        "{seen:?}"
    );
    for op in ["RunPodSandbox", "CreateContainer", "StartContainer"] {
        assert!(!seen[0].contains(op), "{seen:?}");
    }
    // The driver's CDI device is in the container's CRI config.
    let cfg = r.rt.created_config(&app[0]).unwrap();
    assert_eq!(cfg.cdi_devices, ["example.com/gpu=gpu-claim"]);
    // Gone: unprepared once its containers are.
    assert!(w.terminate(Some(Duration::from_secs(5))).await);
    let seen = d.seen.lock().unwrap().clone();
    assert_eq!(seen[1], "unprepare claim-uid-7 with 0 running");
}

#[tokio::test(start_paused = true)]
async fn a_pod_whose_claim_is_not_reserved_for_it_waits_with_upstreams_event() {
    let d = dra_rig();
    let r = &d.r;
    d.api.put(claim(
        "default",
        "gpu-claim",
        "claim-uid-7",
        Some(DRIVER),
        Some("other-pod"),
    ));
    let mut w = Worker::new(r.env.clone(), claim_pod(), None);
    w.sync().await;
    assert!(r.rt.running("app").is_empty());
    assert_eq!(
        r.rt.count("RunPodSandbox"),
        0,
        "no sandbox before the claims"
    );
    assert!(
        r.events.events().contains(&"Warning FailedPrepareDynamicResources Failed to prepare dynamic resources: prepare dynamic resources: pod web (uid-1) is not allowed to use ResourceClaim gpu-claim (claim-uid-7)".to_string()),
        "{:?}",
        r.events.events()
    );
    let waiting = app_status(r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
    assert!(
        d.seen.lock().unwrap().is_empty(),
        "the driver was not called"
    );
    // Reserved now: the next pass runs it.
    d.api.put(claim(
        "default",
        "gpu-claim",
        "claim-uid-7",
        Some(DRIVER),
        Some("uid-1"),
    ));
    w.sync().await;
    assert_eq!(r.rt.running("app").len(), 1, "{:?}", r.events.events());
}

#[tokio::test(start_paused = true)]
async fn a_finished_pod_gives_its_claims_back_before_it_is_deleted() {
    let d = dra_rig();
    let r = &d.r;
    d.api.put(claim(
        "default",
        "gpu-claim",
        "claim-uid-7",
        Some(DRIVER),
        Some("uid-1"),
    ));
    let mut p = claim_pod();
    p.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let id = r.rt.running("app")[0].clone();
    assert_eq!(d.seen.lock().unwrap().len(), 1);
    r.rt.exit_container(&id, 0);
    w.sync().await;
    assert_eq!(status(r).phase.as_deref(), Some("Succeeded"));
    let seen = d.seen.lock().unwrap().clone();
    assert_eq!(
        seen.get(1).map(String::as_str),
        Some("unprepare claim-uid-7 with 0 running"),
        "{seen:?}"
    );
    // Once only.
    w.sync().await;
    assert_eq!(d.seen.lock().unwrap().len(), 2);
}
