use super::super::tests::{container, sandbox};
use super::super::{PlegHealth, Relist, run};
use super::*;
use crate::runtime::fake::FakeRuntime;
use crate::runtime::{RuntimeEvent, RuntimeEventKind};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

struct Running {
    rt: Arc<FakeRuntime>,
    rx: mpsc::Receiver<Relist>,
    health: Arc<PlegHealth>,
    cancel: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The PLEG loop over `rt` with the `EventedPLEG` gate on; its first relist taken.
async fn start(rt: FakeRuntime) -> Running {
    let rt = Arc::new(rt);
    let (tx, mut rx) = mpsc::channel(8);
    let health = Arc::new(PlegHealth::default());
    let cancel = CancellationToken::new();
    tokio::spawn(run(
        rt.clone(),
        GENERIC_RELIST_PERIOD,
        true,
        tx,
        health.clone(),
        crate::metrics::Metrics::new("n"),
        cancel.clone(),
    ));
    rx.recv().await.expect("the first relist");
    Running {
        rt,
        rx,
        health,
        cancel,
    }
}

/// Starts a pod `uid` with one container on the fake (no event sent).
async fn start_pod(rt: &FakeRuntime, uid: &str) -> String {
    let sb = rt.run_sandbox(&sandbox(uid)).await.unwrap();
    let c = rt
        .create_container(&sb, &container(uid), &sandbox(uid))
        .await
        .unwrap();
    rt.start_container(&c).await.unwrap();
    c
}

fn started(id: &str, uid: &str) -> RuntimeEvent {
    RuntimeEvent {
        container_id: id.into(),
        kind: RuntimeEventKind::Started,
        pod_uid: uid.into(),
        created_at: 1,
    }
}

/// Lets the PLEG task run until it waits (tokio's clock does not move).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn container_events_drive_the_pleg_and_the_relist_period_grows_to_300_s() {
    let rt = FakeRuntime::new();
    rt.offer_events(true);
    let mut p = start(rt).await;
    settle().await;
    // A change the runtime does not announce waits for the safety-net relist: none within
    // 10 s (the generic PLEG relists every second).
    let c = start_pod(&p.rt, "a").await;
    assert!(
        timeout(Duration::from_secs(10), p.rx.recv()).await.is_err(),
        "no relist between events"
    );
    // An event: a relist at once, reporting the pod.
    assert_eq!(p.rt.emit_event(started(&c, "a")), 1, "one open stream");
    let at = Instant::now();
    let r = timeout(Duration::from_millis(10), p.rx.recv())
        .await
        .expect("a relist at the event")
        .unwrap();
    assert_eq!(r.changed, BTreeSet::from(["a".to_string()]));
    assert_eq!(at.elapsed(), Duration::ZERO);
    // A burst of events is one relist.
    for _ in 0..5 {
        p.rt.emit_event(started(&c, "a"));
    }
    timeout(Duration::from_millis(10), p.rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        timeout(Duration::from_secs(10), p.rx.recv()).await.is_err(),
        "the burst made one relist"
    );
    // The health threshold grows with the period (upstream's 10 minutes).
    assert_eq!(p.health.threshold_secs.load(Ordering::Relaxed), 600);
    let last = p.health.last_ok_unix.load(Ordering::Relaxed);
    assert!(p.health.healthy(last + 500));
    assert!(!p.health.healthy(last + 601));
    // The safety net: a relist 300 s after the last one.
    let since = Instant::now();
    timeout(Duration::from_secs(301), p.rx.recv())
        .await
        .expect("the periodic relist")
        .unwrap();
    let waited = since.elapsed();
    assert!(
        waited >= Duration::from_secs(280) && waited <= EVENTED_RELIST_PERIOD,
        "{waited:?}"
    );
    // Only one stream was opened.
    let opened =
        p.rt.calls()
            .iter()
            .filter(|c| *c == "GetContainerEvents")
            .count();
    assert_eq!(opened, 1);
}

#[tokio::test(start_paused = true)]
async fn without_get_container_events_it_falls_back_to_relisting_every_second() {
    // As containerd 1.6: the call is not offered.
    let mut p = start(FakeRuntime::new()).await;
    // Each failure forces a relist; the fifth is the fallback.
    for _ in 0..MAX_STREAM_RETRIES {
        timeout(Duration::from_millis(10), p.rx.recv())
            .await
            .expect("a forced relist per failure")
            .unwrap();
    }
    settle().await;
    assert_eq!(
        p.health.threshold_secs.load(Ordering::Relaxed),
        GENERIC_RELIST_THRESHOLD_SECS
    );
    // Then every second, as without the gate, and a change is seen within that second.
    let c = start_pod(&p.rt, "b").await;
    let since = Instant::now();
    let r = timeout(Duration::from_secs(2), p.rx.recv())
        .await
        .expect("a relist a second later")
        .unwrap();
    assert_eq!(since.elapsed(), GENERIC_RELIST_PERIOD);
    assert_eq!(r.changed, BTreeSet::from(["b".to_string()]));
    for _ in 0..3 {
        timeout(Duration::from_millis(1001), p.rx.recv())
            .await
            .expect("every second")
            .unwrap();
    }
    // The stream is not asked for again, and an event now (the runtime offers them late)
    // changes nothing.
    p.rt.offer_events(true);
    assert_eq!(p.rt.emit_event(started(&c, "b")), 0);
    let asked =
        p.rt.calls()
            .iter()
            .filter(|c| *c == "GetContainerEvents")
            .count();
    assert_eq!(asked, MAX_STREAM_RETRIES as usize);
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_ends_forces_a_relist_and_is_opened_again() {
    let rt = FakeRuntime::new();
    rt.offer_events(true);
    let mut p = start(rt).await;
    settle().await;
    // The runtime restarts: its streams end (and it offers new ones).
    p.rt.offer_events(true);
    timeout(Duration::from_millis(10), p.rx.recv())
        .await
        .expect("a forced relist when the stream ends")
        .unwrap();
    settle().await;
    let c = start_pod(&p.rt, "c").await;
    assert_eq!(p.rt.emit_event(started(&c, "c")), 1, "a new stream is open");
    let r = timeout(Duration::from_millis(10), p.rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.changed, BTreeSet::from(["c".to_string()]));
    assert_eq!(
        p.health.threshold_secs.load(Ordering::Relaxed),
        600,
        "one failure is no fallback"
    );
}

const GENERIC_RELIST_THRESHOLD_SECS: i64 = 180;
