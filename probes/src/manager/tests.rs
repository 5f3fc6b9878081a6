//! Worker and manager behaviour on tokio's paused clock, with a scripted exec runner.

use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::*;
use crate::exec::ExecError;
use crate::fake::{FakeExecRunner, exit};
use crate::spec::Handler;

const LIVE: &str = "check live";
const READY: &str = "check ready";
const START: &str = "check start";

fn exec_spec(kind: ProbeKind, cmd: &str, tweak: impl FnOnce(&mut ProbeSpec)) -> ProbeSpec {
    let mut s = ProbeSpec {
        kind,
        handler: Handler::Exec {
            command: cmd.split(' ').map(String::from).collect(),
        },
        initial_delay_seconds: 0,
        timeout_seconds: 1,
        period_seconds: 10,
        success_threshold: 1,
        failure_threshold: 3,
        termination_grace_period_seconds: None,
    };
    tweak(&mut s);
    s
}

fn pod() -> PodRef {
    PodRef {
        uid: "uid-1".into(),
        name: "web-0".into(),
        namespace: "default".into(),
    }
}

fn container(id: &str, started_at: Instant) -> ContainerRef {
    ContainerRef {
        name: "app".into(),
        id: id.into(),
        started_at,
    }
}

/// Failed probes and warnings as `"<pod>/<container> <kind> failed|warning: <output>"`.
#[derive(Default)]
struct RecordedEvents(std::sync::Mutex<Vec<String>>);

impl ProbeEvents for RecordedEvents {
    fn probe_failed(&self, pod: &PodRef, container: &str, kind: ProbeKind, output: &str) {
        let line = format!("{}/{container} {kind} failed: {output}", pod.name);
        self.0.lock().unwrap().push(line);
    }

    fn probe_warning(&self, pod: &PodRef, container: &str, kind: ProbeKind, output: &str) {
        let line = format!("{}/{container} {kind} warning: {output}", pod.name);
        self.0.lock().unwrap().push(line);
    }
}

struct Rig {
    m: ProbeManager,
    rx: mpsc::Receiver<ProbeUpdate>,
    fake: Arc<FakeExecRunner>,
    registry: Registry,
}

fn rig() -> Rig {
    let registry = Registry::new();
    let metrics = ProberMetrics::new(&registry).unwrap();
    let (m, rx) = ProbeManager::new(
        ManagerConfig {
            updates_capacity: 64,
            jitter: false,
        },
        metrics,
    );
    Rig {
        m,
        rx,
        fake: Arc::new(FakeExecRunner::new()),
        registry,
    }
}

impl Rig {
    fn add(&self, id: &str, started_at: Instant, probes: ContainerProbes) {
        self.m.add_container(
            &pod(),
            container(id, started_at),
            probes,
            "10.0.0.5",
            self.fake.clone(),
        );
    }

    async fn next(&mut self) -> ProbeUpdate {
        tokio::time::timeout(Duration::from_secs(3600), self.rx.recv())
            .await
            .expect("an update within an hour")
            .expect("channel open")
    }

    /// Asserts that nothing arrives during `d` (paused clock: this is exact, not a race).
    async fn quiet_for(&mut self, d: Duration) {
        if let Ok(u) = tokio::time::timeout(d, self.rx.recv()).await {
            panic!("unexpected update {u:?}");
        }
    }

    fn counter(&self, probe_type: &str, result: &str) -> u64 {
        let families = self.registry.gather();
        let Some(f) = families.iter().find(|f| f.name() == "prober_probe_total") else {
            return 0;
        };
        f.get_metric()
            .iter()
            .filter(|m| {
                let l = m.get_label();
                let get = |n: &str| {
                    l.iter()
                        .find(|p| p.name() == n)
                        .map(|p| p.value().to_string())
                };
                get("probe_type").as_deref() == Some(probe_type)
                    && get("result").as_deref() == Some(result)
                    && get("pod").as_deref() == Some("web-0")
                    && get("namespace").as_deref() == Some("default")
                    && get("pod_uid").as_deref() == Some("uid-1")
                    && get("container").as_deref() == Some("app")
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }
}

fn offsets(calls: &[crate::fake::ExecCall], t0: Instant) -> Vec<u64> {
    calls.iter().map(|c| (c.at - t0).as_secs()).collect()
}

#[tokio::test(start_paused = true)]
async fn readiness_honours_initial_delay() {
    let mut r = rig();
    let t0 = Instant::now();
    r.add(
        "c1",
        t0,
        ContainerProbes {
            readiness: Some(exec_spec(ProbeKind::Readiness, READY, |s| {
                s.initial_delay_seconds = 5;
                s.period_seconds = 1;
            })),
            ..Default::default()
        },
    );
    let u = r.next().await;
    assert_eq!(
        u,
        ProbeUpdate {
            pod_uid: "uid-1".into(),
            container_name: "app".into(),
            container_id: "c1".into(),
            kind: ProbeKind::Readiness,
            result: ProbeStatus::Failure,
            message: String::new(),
            termination_grace_period_seconds: None,
        }
    );
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert!(!r.m.is_ready("uid-1", "app", "c1"));

    let u = r.next().await;
    assert_eq!(u.result, ProbeStatus::Success);
    assert_eq!(t0.elapsed(), Duration::from_secs(5));
    assert_eq!(offsets(&r.fake.calls(), t0), vec![5]);
    assert_eq!(r.fake.calls()[0].container_id, "c1");
    assert!(r.m.is_ready("uid-1", "app", "c1"));
    assert_eq!(r.counter("Readiness", "successful"), 1);
}

#[tokio::test(start_paused = true)]
async fn liveness_needs_failure_threshold_then_holds_until_new_container() {
    let mut r = rig();
    let events = Arc::new(RecordedEvents::default());
    r.m.set_events(events.clone());
    let t0 = Instant::now();
    r.fake.set_default(LIVE, exit(1, "boom"));
    let probes = ContainerProbes {
        liveness: Some(exec_spec(ProbeKind::Liveness, LIVE, |s| {
            s.termination_grace_period_seconds = Some(7);
        })),
        ..Default::default()
    };
    r.add("c1", t0, probes.clone());

    let u = r.next().await;
    assert_eq!(
        (u.kind, u.result),
        (ProbeKind::Liveness, ProbeStatus::Success)
    );
    assert_eq!(u.termination_grace_period_seconds, None);

    let u = r.next().await;
    assert_eq!(u.result, ProbeStatus::Failure);
    assert_eq!(u.message, "boom");
    assert_eq!(u.container_id, "c1");
    assert_eq!(u.termination_grace_period_seconds, Some(7));
    assert_eq!(t0.elapsed(), Duration::from_secs(20));
    assert_eq!(offsets(&r.fake.calls(), t0), vec![0, 10, 20]);
    assert_eq!(r.counter("Liveness", "failed"), 3);
    assert_eq!(
        *events.0.lock().unwrap(),
        ["web-0/app Liveness failed: boom"; 3],
        "every failed probe is reported, below the threshold too"
    );

    // On hold: no more probes while the container ID stays the same.
    r.quiet_for(Duration::from_secs(100)).await;
    assert_eq!(r.fake.calls().len(), 3);

    // The container restarted: probing resumes for the new ID.
    r.fake.set_default(LIVE, exit(0, ""));
    r.add("c2", Instant::now(), probes);
    let u = r.next().await;
    assert_eq!(
        (u.container_id.as_str(), u.result),
        ("c2", ProbeStatus::Success)
    );
    assert_eq!(r.m.results().get("c1", ProbeKind::Liveness), None);
    r.quiet_for(Duration::from_secs(30)).await;
    let calls = r.fake.calls();
    assert!(calls.len() >= 6, "{calls:?}");
    assert!(calls[3..].iter().all(|c| c.container_id == "c2"));
    assert_eq!(
        r.m.results().get("c2", ProbeKind::Liveness),
        Some(ProbeStatus::Success)
    );
    assert_eq!(r.m.worker_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn success_threshold_needs_consecutive_successes() {
    let mut r = rig();
    let t0 = Instant::now();
    r.add(
        "c1",
        t0,
        ContainerProbes {
            readiness: Some(exec_spec(ProbeKind::Readiness, READY, |s| {
                s.period_seconds = 1;
                s.success_threshold = 2;
            })),
            ..Default::default()
        },
    );
    assert_eq!(r.next().await.result, ProbeStatus::Failure);
    let u = r.next().await;
    assert_eq!(u.result, ProbeStatus::Success);
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    assert_eq!(offsets(&r.fake.calls(), t0), vec![0, 1]);
}

#[tokio::test(start_paused = true)]
async fn failures_must_be_consecutive() {
    let mut r = rig();
    let t0 = Instant::now();
    r.fake.push(
        READY,
        [
            exit(0, ""),
            exit(1, "a"),
            exit(1, "b"),
            exit(0, ""),
            exit(1, "c"),
            exit(1, "d"),
        ],
    );
    r.fake.set_default(READY, exit(1, "e"));
    r.add(
        "c1",
        t0,
        ContainerProbes {
            readiness: Some(exec_spec(ProbeKind::Readiness, READY, |s| {
                s.period_seconds = 1
            })),
            ..Default::default()
        },
    );
    assert_eq!(r.next().await.result, ProbeStatus::Failure); // initial value
    let u = r.next().await;
    assert_eq!(
        (u.result, t0.elapsed().as_secs()),
        (ProbeStatus::Success, 0)
    );
    // Failures at 1, 2 (reset by the success at 3), then 4, 5, 6: the third in a row wins.
    let u = r.next().await;
    assert_eq!(
        (u.result, t0.elapsed().as_secs()),
        (ProbeStatus::Failure, 6)
    );
    assert_eq!(u.message, "e");
    // Readiness keeps probing after a failure (no hold).
    r.quiet_for(Duration::from_millis(3500)).await;
    assert_eq!(r.fake.calls().len(), 10);
}

#[tokio::test(start_paused = true)]
async fn startup_gates_liveness_and_readiness() {
    let mut r = rig();
    let t0 = Instant::now();
    r.fake.push(START, [exit(1, ""), exit(1, "")]);
    let per1 = |s: &mut ProbeSpec| s.period_seconds = 1;
    r.add(
        "c1",
        t0,
        ContainerProbes {
            liveness: Some(exec_spec(ProbeKind::Liveness, LIVE, per1)),
            readiness: Some(exec_spec(ProbeKind::Readiness, READY, per1)),
            startup: Some(exec_spec(ProbeKind::Startup, START, |s| {
                s.period_seconds = 1;
                s.failure_threshold = 10;
            })),
        },
    );
    assert!(!r.m.is_started("uid-1", "app", "c1"));
    let started_at = loop {
        let u = r.next().await;
        if (u.kind, u.result) == (ProbeKind::Startup, ProbeStatus::Success) {
            break Instant::now();
        }
        // Before startup succeeds only the initial values show up.
        let initial = match u.kind {
            ProbeKind::Startup => ProbeStatus::Unknown,
            ProbeKind::Readiness => ProbeStatus::Failure,
            ProbeKind::Liveness => ProbeStatus::Success,
        };
        assert_eq!(u.result, initial, "{u:?}");
    };
    assert_eq!(started_at - t0, Duration::from_secs(2));
    assert!(r.m.is_started("uid-1", "app", "c1"));
    // Readiness now runs and reports success; liveness starts probing too.
    let u = r.next().await;
    assert_eq!(
        (u.kind, u.result),
        (ProbeKind::Readiness, ProbeStatus::Success)
    );
    assert!(r.m.is_ready("uid-1", "app", "c1"));
    r.quiet_for(Duration::from_secs(3)).await;
    let live = r.fake.calls_of(LIVE);
    let ready = r.fake.calls_of(READY);
    assert!(!live.is_empty() && !ready.is_empty());
    assert!(
        live.iter().chain(&ready).all(|c| c.at >= started_at),
        "{live:?} {ready:?}"
    );
    // The startup probe stops once the container has started.
    assert_eq!(offsets(&r.fake.calls_of(START), t0), vec![0, 1, 2]);
}

#[tokio::test(start_paused = true)]
async fn startup_failure_holds_and_never_runs_liveness() {
    let mut r = rig();
    let t0 = Instant::now();
    r.fake.set_default(START, exit(1, "not yet"));
    r.add(
        "c1",
        t0,
        ContainerProbes {
            liveness: Some(exec_spec(ProbeKind::Liveness, LIVE, |s| {
                s.period_seconds = 1
            })),
            startup: Some(exec_spec(ProbeKind::Startup, START, |s| {
                s.period_seconds = 1;
                s.failure_threshold = 2;
                s.termination_grace_period_seconds = Some(3);
            })),
            ..Default::default()
        },
    );
    let failure = loop {
        let u = r.next().await;
        if u.result == ProbeStatus::Failure {
            break u;
        }
    };
    assert_eq!(failure.kind, ProbeKind::Startup);
    assert_eq!(failure.message, "not yet");
    assert_eq!(failure.termination_grace_period_seconds, Some(3));
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    r.quiet_for(Duration::from_secs(60)).await;
    assert_eq!(r.fake.calls_of(START).len(), 2);
    assert!(r.fake.calls_of(LIVE).is_empty());
    assert!(!r.m.is_started("uid-1", "app", "c1"));
}

#[tokio::test(start_paused = true)]
async fn errored_probes_are_retried_then_discarded() {
    let mut r = rig();
    r.fake
        .set_default(READY, Err(ExecError::Runtime("container not found".into())));
    r.add(
        "c1",
        Instant::now(),
        ContainerProbes {
            readiness: Some(exec_spec(ProbeKind::Readiness, READY, |_| {})),
            ..Default::default()
        },
    );
    assert_eq!(r.next().await.result, ProbeStatus::Failure); // initial value only
    r.quiet_for(Duration::from_secs(25)).await;
    // Three periods (0, 10, 20), three attempts each; no result recorded.
    assert_eq!(r.fake.calls().len(), 9);
    assert_eq!(r.counter("Readiness", "failed"), 0);
    assert_eq!(r.counter("Readiness", "successful"), 0);
}

#[tokio::test(start_paused = true)]
async fn exited_container_reports_failure_and_stops_probing() {
    let mut r = rig();
    r.add(
        "c1",
        Instant::now(),
        ContainerProbes {
            readiness: Some(exec_spec(ProbeKind::Readiness, READY, |s| {
                s.period_seconds = 1
            })),
            ..Default::default()
        },
    );
    assert_eq!(r.next().await.result, ProbeStatus::Failure);
    assert_eq!(r.next().await.result, ProbeStatus::Success);
    r.m.container_exited("uid-1", "app");
    let u = r.next().await;
    assert_eq!((u.result, u.message.as_str()), (ProbeStatus::Failure, ""));
    let calls = r.fake.calls().len();
    r.quiet_for(Duration::from_secs(10)).await;
    assert_eq!(r.fake.calls().len(), calls);
}

#[tokio::test(start_paused = true)]
async fn remove_container_and_pod_stop_workers() {
    let mut r = rig();
    r.add(
        "c1",
        Instant::now(),
        ContainerProbes {
            liveness: Some(exec_spec(ProbeKind::Liveness, LIVE, |s| {
                s.period_seconds = 1
            })),
            readiness: Some(exec_spec(ProbeKind::Readiness, READY, |s| {
                s.period_seconds = 1
            })),
            ..Default::default()
        },
    );
    assert_eq!(r.m.worker_count(), 2);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    r.m.remove_container("uid-1", "app");
    assert_eq!(r.m.worker_count(), 0);
    assert_eq!(r.m.results().get("c1", ProbeKind::Readiness), None);
    assert_eq!(r.m.results().get("c1", ProbeKind::Liveness), None);
    while r.rx.try_recv().is_ok() {}
    let calls = r.fake.calls().len();
    r.quiet_for(Duration::from_secs(10)).await;
    assert_eq!(r.fake.calls().len(), calls);
    // The workers' metric series are gone.
    assert_eq!(r.counter("Liveness", "successful"), 0);

    r.add(
        "c2",
        Instant::now(),
        ContainerProbes {
            readiness: Some(exec_spec(ProbeKind::Readiness, READY, |_| {})),
            ..Default::default()
        },
    );
    assert_eq!(r.m.worker_count(), 1);
    r.m.remove_pod("uid-1");
    assert_eq!(r.m.worker_count(), 0);
    r.m.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn terminating_pod_keeps_only_readiness() {
    let r = rig();
    r.add(
        "c1",
        Instant::now(),
        ContainerProbes {
            liveness: Some(exec_spec(ProbeKind::Liveness, LIVE, |s| {
                s.period_seconds = 1
            })),
            readiness: Some(exec_spec(ProbeKind::Readiness, READY, |s| {
                s.period_seconds = 1
            })),
            ..Default::default()
        },
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    r.m.stop_liveness_and_startup("uid-1");
    assert_eq!(r.m.worker_count(), 1);
    let live = r.fake.calls_of(LIVE).len();
    let ready = r.fake.calls_of(READY).len();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(r.fake.calls_of(LIVE).len(), live);
    assert_eq!(r.fake.calls_of(READY).len(), ready + 5);
}

#[tokio::test(start_paused = true)]
async fn first_probe_is_jittered_within_one_period_after_start() {
    let registry = Registry::new();
    let (m, _rx) = ProbeManager::new(
        ManagerConfig::default(),
        ProberMetrics::new(&registry).unwrap(),
    );
    let fake = Arc::new(FakeExecRunner::new());
    let t0 = Instant::now();
    let probes = ContainerProbes {
        readiness: Some(exec_spec(ProbeKind::Readiness, READY, |_| {})),
        ..Default::default()
    };
    m.add_container(
        &pod(),
        container("c1", t0),
        probes,
        "10.0.0.5",
        fake.clone(),
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let calls = fake.calls();
    assert!(!calls.is_empty());
    assert!(calls[0].at - t0 < Duration::from_secs(10));
}

#[test]
fn container_probes_from_k8s_container() {
    use k8s_openapi::api::core::v1::{ContainerPort, HTTPGetAction, Probe};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let c = Container {
        name: "app".into(),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: 8080,
            ..Default::default()
        }]),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::String("http".into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        liveness_probe: Some(Probe::default()),
        ..Default::default()
    };
    assert_eq!(
        ContainerProbes::from_container(&c).unwrap_err(),
        SpecError::NoHandler {
            probe: "livenessProbe"
        }
    );
    let c = Container {
        liveness_probe: None,
        ..c
    };
    let p = ContainerProbes::from_container(&c).unwrap();
    assert!(p.liveness.is_none() && p.startup.is_none());
    assert_eq!(p.readiness.unwrap().kind, ProbeKind::Readiness);
}
