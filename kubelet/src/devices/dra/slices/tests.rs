use super::*;
use crate::devices::dra::DraManager;
use crate::devices::dra::fake::{FakeDraPlugin, FakeSliceApi};

const NODE: &str = "n1";
const GPU: &str = "gpu.example.com";
const NIC: &str = "nic.example.com";

fn api() -> Arc<FakeSliceApi> {
    let api = FakeSliceApi::default();
    *api.nodes.lock().unwrap() = vec![NODE.into()];
    *api.slices.lock().unwrap() = [
        ("n1-gpu", NODE, GPU),
        ("n1-nic", NODE, NIC),
        ("n2-gpu", "n2", GPU),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    Arc::new(api)
}

/// A manager with the cleanup on `api`; the wipe at start has run.
async fn manager(api: &Arc<FakeSliceApi>) -> (tempfile::TempDir, DraManager) {
    let dir = tempfile::tempdir().unwrap();
    let m = DraManager::with_metrics(dir.path(), None, Arc::new(crate::metrics::Dra::new()));
    let cleanup = SliceCleanup::new(
        api.clone() as Arc<dyn SliceApi>,
        NODE,
        WIPING_DELAY,
        CancellationToken::new(),
    );
    m.start_slice_cleanup(cleanup);
    settle().await;
    (dir, m)
}

/// Lets spawned tasks run (the clock is paused: nothing waits for real).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn plugin() -> Arc<FakeDraPlugin> {
    Arc::new(FakeDraPlugin::new("v", Arc::default()))
}

#[test]
fn the_selector_and_the_backoff_are_upstreams() {
    assert_eq!(field_selector("n1", None), "spec.nodeName=n1");
    // Go's fields.Set.String(): terms sorted.
    assert_eq!(
        field_selector("n1", Some("gpu.example.com")),
        "spec.driver=gpu.example.com,spec.nodeName=n1"
    );
    let secs: Vec<u64> = backoff().iter().map(|d| d.as_secs()).collect();
    assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256]);
    for _ in 0..100 {
        let j = jitter(Duration::from_secs(10));
        assert!(
            j >= Duration::from_secs(10) && j <= Duration::from_secs(12),
            "{j:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn at_start_every_slice_of_the_node_is_deleted_and_no_other_nodes() {
    let api = api();
    let (_d, _m) = manager(&api).await;
    assert_eq!(api.selectors(), ["spec.nodeName=n1"]);
    assert_eq!(api.names(), ["n2-gpu"]);
}

#[tokio::test(start_paused = true)]
async fn the_start_wipe_waits_for_the_node_object_and_retries_errors_with_backoff() {
    let api = api();
    api.nodes.lock().unwrap().clear();
    api.failures.lock().unwrap().extend([
        SliceError::Unauthorized("401".into()),
        SliceError::Other("500".into()),
    ]);
    let started = tokio::time::Instant::now();
    let (_d, _m) = manager(&api).await;
    assert!(
        api.selectors().is_empty(),
        "no delete before the Node exists"
    );
    // The Node appears after the first two waits (1 s, 2 s, each up to 20 % longer).
    tokio::time::sleep(Duration::from_millis(3700)).await;
    api.nodes.lock().unwrap().push(NODE.into());
    tokio::time::sleep(Duration::from_secs(60)).await;
    settle().await;
    let deletes = api.deletes.lock().unwrap().clone();
    assert_eq!(deletes.len(), 3, "401, 500, then done: {deletes:?}");
    // Tries at about 0, 1 and 3 s found no Node; the fourth (after a 4 s wait) deletes.
    // Waits keep doubling between tries (8 s then 16 s, each up to 20 % longer).
    let first = deletes[0].0 - started;
    assert!(
        first >= Duration::from_secs(7) && first <= Duration::from_millis(8400),
        "{first:?}"
    );
    let gaps: Vec<Duration> = deletes.windows(2).map(|w| w[1].0 - w[0].0).collect();
    assert!(
        gaps[0] >= Duration::from_secs(8) && gaps[0] <= Duration::from_millis(9600),
        "{gaps:?}"
    );
    assert!(
        gaps[1] >= Duration::from_secs(16) && gaps[1] <= Duration::from_millis(19200),
        "{gaps:?}"
    );
    assert_eq!(api.names(), ["n2-gpu"]);
}

#[tokio::test(start_paused = true)]
async fn an_apiserver_that_keeps_failing_is_given_up_after_upstreams_nine_tries() {
    let api = api();
    api.failures
        .lock()
        .unwrap()
        .extend((0..50).map(|i| SliceError::Other(format!("500 #{i}"))));
    let (_d, _m) = manager(&api).await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    settle().await;
    assert_eq!(api.selectors().len(), 9);
    // A 404 on the collection is done, not retried.
    let api = self::api();
    api.failures
        .lock()
        .unwrap()
        .push_back(SliceError::NotFound("404".into()));
    let (_d, _m) = manager(&api).await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(api.selectors().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_driver_gone_past_the_grace_period_loses_its_slices_on_this_node_only() {
    let api = api();
    let (_d, m) = manager(&api).await;
    // Slices published again after the start (the drivers registered).
    *api.slices.lock().unwrap() = [
        ("n1-gpu", NODE, GPU),
        ("n1-nic", NODE, NIC),
        ("n2-gpu", "n2", GPU),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    m.add_plugin(GPU, "/gpu.sock", plugin()).unwrap();
    m.add_plugin(NIC, "/nic.sock", plugin()).unwrap();
    let gone = tokio::time::Instant::now();
    m.deregister_plugin(GPU);
    settle().await;
    tokio::time::sleep(Duration::from_secs(29)).await;
    settle().await;
    assert_eq!(
        api.selectors().len(),
        1,
        "nothing deleted within the grace period"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;
    let deletes = api.deletes.lock().unwrap().clone();
    assert_eq!(deletes.len(), 2);
    assert_eq!(deletes[1].1, "spec.driver=gpu.example.com,spec.nodeName=n1");
    assert_eq!(deletes[1].0 - gone, WIPING_DELAY);
    assert_eq!(api.names(), ["n1-nic", "n2-gpu"]);
    assert!(!m.slice_cleanup().unwrap().is_pending(GPU));
}

#[tokio::test(start_paused = true)]
async fn a_driver_back_within_the_grace_period_keeps_its_slices() {
    let api = api();
    let (_d, m) = manager(&api).await;
    api.slices
        .lock()
        .unwrap()
        .push(("n1-gpu-again".into(), NODE.into(), GPU.into()));
    m.add_plugin(GPU, "/gpu.sock", plugin()).unwrap();
    m.deregister_plugin(GPU);
    tokio::time::sleep(Duration::from_secs(20)).await;
    // The DaemonSet's new pod registers at another socket.
    m.add_plugin(GPU, "/gpu-2.sock", plugin()).unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    settle().await;
    assert_eq!(
        api.selectors(),
        ["spec.nodeName=n1"],
        "only the wipe at start"
    );
    assert_eq!(api.names(), ["n1-gpu-again", "n2-gpu"]);
}

#[tokio::test(start_paused = true)]
async fn a_second_goodbye_keeps_the_first_deadline() {
    let api = api();
    let (_d, m) = manager(&api).await;
    let cleanup = m.slice_cleanup().unwrap();
    let first = tokio::time::Instant::now();
    cleanup.driver_gone(GPU);
    settle().await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    cleanup.driver_gone(GPU);
    tokio::time::sleep(Duration::from_secs(60)).await;
    settle().await;
    let deletes = api.deletes.lock().unwrap().clone();
    assert_eq!(deletes.len(), 2, "{deletes:?}");
    assert_eq!(deletes[1].0 - first, WIPING_DELAY);
}

#[tokio::test(start_paused = true)]
async fn without_a_cleanup_standalone_nothing_is_deleted_and_deregistering_is_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let m = DraManager::with_metrics(dir.path(), None, Arc::new(crate::metrics::Dra::new()));
    m.add_plugin(GPU, "/gpu.sock", plugin()).unwrap();
    m.deregister_plugin(GPU);
    assert!(m.slice_cleanup().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_hostile_driver_name_only_narrows_what_is_deleted() {
    // A plugin registering under a name with selector syntax in it: the terms it adds are
    // ANDed with the node's (Go's fields.Set.String does not escape either), so it can
    // only match less, never another node's or another driver's slices.
    let api = api();
    let (_d, m) = manager(&api).await;
    *api.slices.lock().unwrap() = [
        ("n1-gpu", NODE, GPU),
        ("n1-nic", NODE, NIC),
        ("n2-gpu", "n2", GPU),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    for hostile in [
        format!("{GPU},spec.nodeName=n2"),
        format!("x,spec.driver={NIC}"),
        "x,spec.nodeName!=n1".to_string(),
    ] {
        m.add_plugin(&hostile, "/h.sock", plugin()).unwrap();
        m.deregister_plugin(&hostile);
    }
    tokio::time::sleep(WIPING_DELAY * 2).await;
    settle().await;
    let sels = api.selectors();
    assert_eq!(sels.len(), 4, "{sels:?}");
    assert!(
        sels[1..].iter().all(|s| s.ends_with(",spec.nodeName=n1")),
        "{sels:?}"
    );
    assert_eq!(api.names(), ["n1-gpu", "n1-nic", "n2-gpu"]);
}
