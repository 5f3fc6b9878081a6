use super::logind::fake::FakeLogind;
use super::*;
use crate::events::FakeRecorder;
use crate::sync_loop::Control;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn pg(priority: i32, secs: i64) -> PriorityGrace {
    PriorityGrace {
        priority,
        shutdown_grace_period_seconds: secs,
    }
}

fn pod(name: &str, priority: Option<i32>, grace: Option<i64>) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": name},
        "spec": {"containers": [], "priority": priority, "terminationGracePeriodSeconds": grace},
    }))
    .unwrap()
}

#[test]
fn settings_follow_upstream_validation_and_migration() {
    assert!(!Settings::new(s(0), s(0), vec![]).unwrap().enabled());
    let two = Settings::new(s(30), s(10), vec![]).unwrap();
    assert_eq!(two.groups, [pg(0, 20), pg(2_000_000_000, 10)]);
    assert_eq!(two.period_requested(), s(30));
    let e = Settings::new(s(10), s(30), vec![]).unwrap_err();
    assert!(e.contains("must be <= shutdownGracePeriod"), "{e}");
    let e = Settings::new(s(30), s(0), vec![pg(0, 10)]).unwrap_err();
    assert!(e.contains("Cannot specify both"), "{e}");
    let e = Settings::new(Duration::from_millis(500), s(0), vec![]).unwrap_err();
    assert!(e.contains(">= 1 sec"), "{e}");
    let by = Settings::new(s(0), s(0), vec![pg(100_000, 5), pg(0, 7), pg(-10, 1)]).unwrap();
    assert_eq!(by.groups, [pg(-10, 1), pg(0, 7), pg(100_000, 5)], "sorted");
    assert_eq!(by.period_requested(), s(13));
}

#[test]
fn pods_go_to_the_highest_group_not_above_their_priority() {
    let groups = [pg(0, 20), pg(1000, 10), pg(2_000_000_000, 5)];
    let pods = [
        pod("none", None, None),
        pod("negative", Some(-5), None),
        pod("mid", Some(999), None),
        pod("boundary", Some(1000), None),
        pod("critical", Some(2_000_001_000), None),
    ];
    let names = |g: &Vec<&Pod>| -> Vec<String> {
        g.iter().map(|p| p.metadata.name.clone().unwrap()).collect()
    };
    let got: Vec<Vec<String>> = group_pods(&groups, &pods).iter().map(names).collect();
    assert_eq!(
        got,
        [
            vec!["none", "negative", "mid"],
            vec!["boundary"],
            vec!["critical"]
        ]
    );
}

/// What the fake sync loop saw: (uid, grace) in order of Stop requests.
type Stops = Arc<std::sync::Mutex<Vec<(String, Duration)>>>;

/// Answers Control requests like the sync loop: ActivePods with `pods`; Stop is recorded and
/// finished after `stop_takes`.
fn fake_sync_loop(pods: Vec<Pod>, stop_takes: Duration) -> (mpsc::Sender<Control>, Stops) {
    let (tx, mut rx) = mpsc::channel(16);
    let stops: Stops = Arc::default();
    let seen = stops.clone();
    tokio::spawn(async move {
        while let Some(c) = rx.recv().await {
            match c {
                Control::ActivePods(reply) => {
                    let _ = reply.send(pods.clone());
                }
                Control::KnownPods(reply) => {
                    let _ = reply.send(None);
                }
                Control::Resync(_) => {}
                Control::Stop {
                    uid,
                    stopped,
                    grace,
                    done,
                } => {
                    assert_eq!(stopped.reason, SHUTDOWN_REASON);
                    assert_eq!(stopped.message, SHUTDOWN_MESSAGE);
                    assert!(stopped.disruption);
                    seen.lock().unwrap().push((uid, grace));
                    tokio::spawn(async move {
                        tokio::time::sleep(stop_takes).await;
                        let _ = done.send(());
                    });
                }
            }
        }
    });
    (tx, stops)
}

fn parts(logind: Arc<FakeLogind>, pods: mpsc::Sender<Control>) -> (Parts, Arc<FakeRecorder>) {
    let events = Arc::new(FakeRecorder::default());
    (
        Parts {
            logind,
            pods: Arc::new(pods),
            state: Arc::default(),
            events: events.clone(),
            node_name: "node-a".into(),
        },
        events,
    )
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn stops_pods_lowest_priority_first_then_releases_the_inhibitor() {
    let logind = Arc::new(FakeLogind::default());
    *logind.delay.lock().unwrap() = s(5);
    *logind.delay_after_reload.lock().unwrap() = Some(s(30));
    let pods = vec![
        pod("critical", Some(2_000_000_000), Some(30)),
        pod("web", None, Some(300)),
        pod("quick", None, Some(2)),
    ];
    let (control, stops) = fake_sync_loop(pods, s(1));
    let (parts, events) = parts(logind.clone(), control);
    let state = parts.state.clone();
    let cancel = CancellationToken::new();
    let settings = Settings::new(s(30), s(10), vec![]).unwrap();
    let task = tokio::spawn(run(settings, parts, cancel.clone()));
    settle().await;
    assert_eq!(
        *logind.overrides.lock().unwrap(),
        [s(30)],
        "InhibitDelayMaxSec raised to the whole period"
    );
    assert!(logind.inhibited(), "the delay inhibitor is held");
    assert!(!state.shutting_down());

    logind.prepare_for_shutdown(true).await;
    settle().await;
    assert!(state.shutting_down(), "NotReady and admission see it");
    assert_eq!(
        *stops.lock().unwrap(),
        [("web".into(), s(20)), ("quick".into(), s(2))],
        "the default group first, each pod with min(its grace, the group's 20 s)"
    );
    assert!(logind.inhibited(), "held while pods stop");
    tokio::time::sleep(s(2)).await;
    settle().await;
    assert_eq!(
        stops.lock().unwrap().last().unwrap(),
        &("critical".to_string(), s(10)),
        "critical pods only after the others stopped"
    );
    tokio::time::sleep(s(2)).await;
    settle().await;
    assert!(!logind.inhibited(), "released once every group is done");
    assert!(
        events
            .events()
            .contains(&"Normal NodeShutdown Shutdown manager detected shutdown event".to_string())
    );

    // A cancelled shutdown takes the inhibitor again.
    logind.prepare_for_shutdown(false).await;
    settle().await;
    assert!(logind.inhibited());
    assert!(!state.shutting_down());
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_group_that_overruns_its_period_does_not_hold_the_next_one() {
    let logind = Arc::new(FakeLogind::default());
    *logind.delay.lock().unwrap() = s(60);
    let pods = vec![
        pod("stuck", None, Some(300)),
        pod("critical", Some(2_000_000_000), None),
    ];
    // Stops never finish within the group's 5 s.
    let (control, stops) = fake_sync_loop(pods, s(1000));
    let (parts, _) = parts(logind.clone(), control);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(run(
        Settings::new(s(8), s(3), vec![]).unwrap(),
        parts,
        cancel.clone(),
    ));
    settle().await;
    assert!(logind.overrides.lock().unwrap().is_empty(), "60 s suffices");
    logind.prepare_for_shutdown(true).await;
    settle().await;
    assert_eq!(stops.lock().unwrap().len(), 1);
    tokio::time::sleep(s(5) + Duration::from_millis(10)).await;
    settle().await;
    assert_eq!(stops.lock().unwrap().len(), 2, "the critical group started");
    tokio::time::sleep(s(3) + Duration::from_millis(10)).await;
    settle().await;
    assert!(!logind.inhibited(), "released after the last period");
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn logind_refusing_a_longer_delay_disables_it_clearly() {
    let logind = Arc::new(FakeLogind::default());
    *logind.delay.lock().unwrap() = s(5);
    let (control, _) = fake_sync_loop(vec![], s(0));
    let (parts, _) = parts(logind.clone(), control);
    let settings = Settings::new(s(30), s(0), vec![]).unwrap();
    let e = start(&settings, &parts).await.unwrap_err().to_string();
    assert!(
        e.contains("unable to update logind InhibitDelayMaxSec to 30s"),
        "{e}"
    );
    assert!(!logind.inhibited());
    // run() logs it and returns: the kubelet keeps going.
    run(settings, parts, CancellationToken::new()).await;
}
