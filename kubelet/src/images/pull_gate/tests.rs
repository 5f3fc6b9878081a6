//! Upstream's defaulting and validation of the two settings, and how many pulls the gate
//! lets through at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;

use super::*;

fn parse(
    flag: Option<bool>,
    file: Option<bool>,
    max: Option<serde_json::Value>,
) -> Result<PullSettings, String> {
    PullSettings::parse(flag, file, max.as_ref())
}

#[test]
fn defaults_and_upstreams_defaulting_of_serialize() {
    let p = parse(None, None, None).unwrap();
    assert_eq!(p, PullSettings::default());
    assert_eq!(p.limit(), Some(1), "serialized by default");
    // maxParallelImagePulls alone (>= 2) turns serialization off, as upstream's defaults.
    let p = parse(None, None, Some(json!(5))).unwrap();
    assert!(!p.serialize_image_pulls);
    assert_eq!(p.limit(), Some(5));
    let p = parse(None, None, Some(json!(1))).unwrap();
    assert!(p.serialize_image_pulls);
    // Not serialized without a maximum: no limit.
    let p = parse(None, Some(false), None).unwrap();
    assert_eq!(p.limit(), None);
    // The flag wins over the file.
    let p = parse(Some(false), Some(true), Some(json!(3))).unwrap();
    assert_eq!(p.limit(), Some(3));
}

#[test]
fn upstreams_validation_messages() {
    assert_eq!(
        parse(None, Some(false), Some(json!(0))).unwrap_err(),
        "maxParallelImagePulls 0 must be a positive number"
    );
    assert_eq!(
        parse(None, None, Some(json!(-2))).unwrap_err(),
        "maxParallelImagePulls -2 must be a positive number"
    );
    let both = "maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls (--serialize-image-pulls) is set to false";
    assert_eq!(parse(None, Some(true), Some(json!(3))).unwrap_err(), both);
    assert_eq!(parse(Some(true), None, Some(json!(3))).unwrap_err(), both);
    assert!(parse(None, Some(true), Some(json!(1))).is_ok());
    for hostile in [json!("3"), json!(2.5), json!(1u64 << 40), json!([1])] {
        let e = parse(None, Some(false), Some(hostile.clone())).unwrap_err();
        assert!(e.starts_with("maxParallelImagePulls:"), "{hostile}: {e}");
    }
}

/// Runs 8 pulls of 50 ms through the gate; the most that ran at once.
async fn most_at_once(gate: PullGate) -> usize {
    let gate = Arc::new(gate);
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (gate, now, most) = (gate.clone(), now.clone(), most.clone());
        tasks.spawn(async move {
            let _slot = gate.enter().await;
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            now.fetch_sub(1, Ordering::SeqCst);
        });
    }
    while tasks.join_next().await.is_some() {}
    most.load(Ordering::SeqCst)
}

#[tokio::test(start_paused = true)]
async fn the_gate_lets_through_as_many_pulls_as_configured() {
    assert_eq!(most_at_once(PullGate::serial()).await, 1);
    let three = parse(None, Some(false), Some(json!(3))).unwrap();
    assert_eq!(most_at_once(PullGate::new(&three)).await, 3);
    let unlimited = parse(None, Some(false), None).unwrap();
    assert_eq!(most_at_once(PullGate::new(&unlimited)).await, 8);
}

/// Through `ensure_image` and the fake runtime (each pull 1 s): four pods' images pulled at
/// once are pulled one at a time when serialized, two at a time with
/// `maxParallelImagePulls: 2`, all together without a limit.
#[tokio::test(start_paused = true)]
async fn ensure_image_pulls_as_many_at_once_as_the_gate_allows() {
    use crate::images::{PullBackoff, Puller, ensure_image};
    use crate::runtime::fake::FakeRuntime;
    use k8s_openapi::api::core::v1::Container;
    for (settings, want) in [
        (PullSettings::default(), 1),
        (parse(None, None, Some(json!(2))).unwrap(), 2),
        (parse(None, Some(false), None).unwrap(), 4),
    ] {
        let rt = Arc::new(FakeRuntime::new());
        rt.set_pull_delay(Duration::from_secs(1));
        let gate = Arc::new(PullGate::new(&settings));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..4 {
            let (rt, gate) = (rt.clone(), gate.clone());
            tasks.spawn(async move {
                let event = |_: crate::events::EventType, _: &str, _: &str| {};
                let p = Puller {
                    runtime: rt.as_ref(),
                    pull_gate: &gate,
                    event: &event,
                    keyrings: &[],
                    keyring_error: None,
                    records: None,
                    plugins: None,
                };
                let c = Container {
                    name: "c".into(),
                    image: Some(format!("registry.test/app{i}:v1")),
                    ..Default::default()
                };
                let logs = std::path::Path::new("/var/log/pods");
                let sandbox = crate::runtime::raw::sandbox(i, "gate", logs, "/kubepods");
                ensure_image(&p, &mut PullBackoff::default(), &c, &sandbox)
                    .await
                    .unwrap();
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        assert_eq!(rt.most_pulls_at_once(), want, "{settings:?}");
    }
}
