use super::rank::{self, Ranking};
use super::signals::{self, Observation, Observations};
use super::tracker::{Condition, Tracker};
use super::*;
use crate::cm::{Amount, Signal, Threshold};
use crate::stats::summary::*;
use std::sync::Mutex;

const MI: i128 = 1024 * 1024;

fn threshold(signal: Signal, value: Amount, grace: u64) -> Threshold {
    Threshold {
        signal,
        value,
        grace_period: Duration::from_secs(grace),
        min_reclaim: None,
    }
}

fn cfg(thresholds: Vec<Threshold>) -> Eviction {
    Eviction {
        thresholds,
        pressure_transition_period: Duration::from_secs(300),
        max_pod_grace_period: 0,
    }
}

fn mem_obs(available: i128, time: i64) -> Observations {
    let mut o = Observations::new();
    o.insert(
        Signal::MemoryAvailable,
        Observation {
            available,
            capacity: 1024 * MI,
            time,
        },
    );
    o
}

#[test]
fn hard_threshold_acts_at_once_and_condition_outlives_it_by_the_transition_period() {
    let mut t = Tracker::new(cfg(vec![threshold(
        Signal::MemoryAvailable,
        Amount::Quantity(100 * MI),
        0,
    )]));
    let t0 = Instant::now();
    let p = t.observe(&mem_obs(50 * MI, 1), t0);
    assert_eq!(p.conditions, vec![Condition::MemoryPressure]);
    assert_eq!(p.to_act.len(), 1);
    // Stats not refreshed since: nothing to act on, the condition stays.
    let p = t.observe(&mem_obs(50 * MI, 1), t0 + Duration::from_secs(10));
    assert!(p.to_act.is_empty());
    assert_eq!(p.conditions, vec![Condition::MemoryPressure]);
    // Resolved: the condition holds for the transition period, then goes.
    let p = t.observe(&mem_obs(500 * MI, 2), t0 + Duration::from_secs(20));
    assert!(p.to_act.is_empty());
    assert_eq!(p.conditions, vec![Condition::MemoryPressure]);
    let p = t.observe(&mem_obs(500 * MI, 3), t0 + Duration::from_secs(309));
    assert_eq!(p.conditions, vec![Condition::MemoryPressure]);
    let p = t.observe(&mem_obs(500 * MI, 4), t0 + Duration::from_secs(311));
    assert!(p.conditions.is_empty());
}

#[test]
fn soft_threshold_waits_for_its_grace_period_but_reports_pressure_at_once() {
    let mut t = Tracker::new(cfg(vec![threshold(
        Signal::MemoryAvailable,
        Amount::Quantity(100 * MI),
        30,
    )]));
    let t0 = Instant::now();
    let p = t.observe(&mem_obs(50 * MI, 1), t0);
    assert_eq!(p.conditions, vec![Condition::MemoryPressure]);
    assert!(p.to_act.is_empty());
    let p = t.observe(&mem_obs(50 * MI, 2), t0 + Duration::from_secs(20));
    assert!(p.to_act.is_empty());
    let p = t.observe(&mem_obs(50 * MI, 3), t0 + Duration::from_secs(30));
    assert_eq!(p.to_act.len(), 1);
    // Recovered in between: the grace period starts again.
    let p = t.observe(&mem_obs(500 * MI, 4), t0 + Duration::from_secs(40));
    assert!(p.to_act.is_empty());
    let p = t.observe(&mem_obs(50 * MI, 5), t0 + Duration::from_secs(50));
    assert!(p.to_act.is_empty());
}

#[test]
fn min_reclaim_keeps_a_threshold_met_until_it_is_reclaimed() {
    let mut th = threshold(Signal::MemoryAvailable, Amount::Quantity(100 * MI), 0);
    th.min_reclaim = Some(Amount::Quantity(50 * MI));
    let mut t = Tracker::new(cfg(vec![th]));
    let t0 = Instant::now();
    assert_eq!(t.observe(&mem_obs(90 * MI, 1), t0).to_act.len(), 1);
    // 120Mi is above the threshold but below threshold + min reclaim (150Mi).
    assert_eq!(
        t.observe(&mem_obs(120 * MI, 2), t0 + Duration::from_secs(10))
            .to_act
            .len(),
        1
    );
    assert!(
        t.observe(&mem_obs(160 * MI, 3), t0 + Duration::from_secs(20))
            .to_act
            .is_empty()
    );
}

#[test]
fn percentage_thresholds_scale_with_capacity_and_disk_signals_raise_disk_pressure() {
    let mut t = Tracker::new(cfg(vec![threshold(
        Signal::NodeFsAvailable,
        Amount::Fraction(0.1),
        0,
    )]));
    let mut o = Observations::new();
    o.insert(
        Signal::NodeFsAvailable,
        Observation {
            available: 99,
            capacity: 1000,
            time: 1,
        },
    );
    let p = t.observe(&o, Instant::now());
    assert_eq!(p.conditions, vec![Condition::DiskPressure]);
    o.get_mut(&Signal::NodeFsAvailable).unwrap().available = 100;
    o.get_mut(&Signal::NodeFsAvailable).unwrap().time = 2;
    assert!(t.observe(&o, Instant::now()).to_act.is_empty());
}

fn pod(name: &str, priority: i32, mem_request: Option<&str>, extra: serde_json::Value) -> Pod {
    let mut c = serde_json::json!({"name": "c", "image": "i"});
    if let Some(r) = mem_request {
        c["resources"] = serde_json::json!({"requests": {"memory": r}});
    }
    let mut spec = serde_json::json!({"containers": [c], "priority": priority});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": spec,
    }))
    .unwrap()
}

fn fs(used: u64) -> FsStats {
    FsStats {
        used_bytes: Some(used),
        inodes_used: Some(used / 100),
        ..Default::default()
    }
}

fn stats(name: &str, mem: u64, rootfs: u64) -> PodStats {
    PodStats {
        pod_ref: PodReference {
            name: name.into(),
            namespace: "default".into(),
            uid: format!("uid-{name}"),
        },
        containers: vec![ContainerStats {
            name: "c".into(),
            memory: Some(MemoryStats {
                working_set_bytes: Some(mem),
                ..Default::default()
            }),
            rootfs: Some(fs(rootfs)),
            logs: Some(fs(0)),
            ..Default::default()
        }],
        process_stats: Some(ProcessStats {
            process_count: Some(mem / (1 << 20)),
        }),
        ..Default::default()
    }
}

fn names(v: &[(Pod, Option<PodStats>)]) -> Vec<String> {
    v.iter()
        .map(|(p, _)| p.metadata.name.clone().unwrap())
        .collect()
}

#[test]
fn memory_ranking_is_exceeds_requests_then_priority_then_usage_above_requests() {
    const M: u64 = 1 << 20;
    let mut pods = vec![
        // Within its request: last whatever its priority.
        (
            pod("within", -10, Some("500Mi"), serde_json::json!({})),
            Some(stats("within", 400 * M, 0)),
        ),
        // Over its request, high priority.
        (
            pod("over-high", 100, Some("10Mi"), serde_json::json!({})),
            Some(stats("over-high", 300 * M, 0)),
        ),
        // Over (no request), low priority, small.
        (
            pod("over-low-small", 0, None, serde_json::json!({})),
            Some(stats("over-low-small", 20 * M, 0)),
        ),
        // Over, low priority, big.
        (
            pod("over-low-big", 0, None, serde_json::json!({})),
            Some(stats("over-low-big", 200 * M, 0)),
        ),
        // No stats at all: first.
        (pod("unknown", 1000, None, serde_json::json!({})), None),
    ];
    rank::rank(&mut pods, Ranking::Memory, true);
    assert_eq!(
        names(&pods),
        [
            "unknown",
            "over-low-big",
            "over-low-small",
            "over-high",
            "within"
        ]
    );
}

#[test]
fn pid_ranking_is_priority_then_process_count() {
    const M: u64 = 1 << 20;
    let mut pods = vec![
        (
            pod("a", 10, None, serde_json::json!({})),
            Some(stats("a", 500 * M, 0)),
        ),
        (
            pod("b", 0, None, serde_json::json!({})),
            Some(stats("b", 5 * M, 0)),
        ),
        (
            pod("c", 0, None, serde_json::json!({})),
            Some(stats("c", 50 * M, 0)),
        ),
    ];
    rank::rank(&mut pods, Ranking::Pids, true);
    assert_eq!(names(&pods), ["c", "b", "a"]);
}

#[test]
fn disk_ranking_uses_writable_layers_logs_and_local_volumes() {
    let mut pods = vec![
        (
            pod("small", 0, None, serde_json::json!({})),
            Some(stats("small", 0, 10)),
        ),
        (
            pod("big", 0, None, serde_json::json!({})),
            Some(stats("big", 0, 1000)),
        ),
    ];
    rank::rank(
        &mut pods,
        Ranking::for_signal(Signal::NodeFsAvailable, false),
        true,
    );
    assert_eq!(names(&pods), ["big", "small"]);
    // With a dedicated image fs, nodefs ignores writable layers: both use 0, the order stays.
    rank::rank(
        &mut pods,
        Ranking::for_signal(Signal::NodeFsAvailable, true),
        true,
    );
    assert_eq!(names(&pods), ["big", "small"]);
    let mut pods = vec![pods.pop().unwrap(), pods.pop().unwrap()];
    rank::rank(
        &mut pods,
        Ranking::for_signal(Signal::ImageFsAvailable, true),
        true,
    );
    assert_eq!(names(&pods), ["big", "small"]);
}

#[test]
fn memory_eviction_message_is_upstreams() {
    let p = pod("p", 0, None, serde_json::json!({}));
    let s = stats("p", 80 << 20, 0);
    let th = [threshold(
        Signal::MemoryAvailable,
        Amount::Quantity(100 * MI),
        0,
    )];
    let (msg, ann) =
        rank::eviction_message(Resource::Memory, &p, Some(&s), &th, &mem_obs(50 * MI, 1));
    assert_eq!(
        msg,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container c was using 80Mi, request is 0, has larger consumption of memory. "
    );
    assert_eq!(ann["offending_containers"], "c");
    assert_eq!(ann["starved_resource"], "memory");
    assert_eq!(rank::binary_si(1536 * 1024), "1536Ki");
    assert_eq!(rank::decimal_si(5000), "5k");
}

#[test]
fn local_storage_limits_as_upstream() {
    let p = pod(
        "p",
        0,
        None,
        serde_json::json!({"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]}),
    );
    let mut s = stats("p", 0, 0);
    s.volume.push(VolumeStats {
        fs: fs(2 << 20),
        name: "scratch".into(),
        ..Default::default()
    });
    let v = rank::storage_violation(&p, &s, &[], false, true).unwrap();
    assert_eq!(
        v.message,
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "
    );
    assert_eq!(v.signal, "emptydirfs.limit");
    s.volume[0].fs.used_bytes = Some(1 << 20);
    assert_eq!(rank::storage_violation(&p, &s, &[], false, true), None);

    let mut p: Pod = pod("q", 0, None, serde_json::json!({}));
    p.spec.as_mut().unwrap().containers[0].resources = Some(
        serde_json::from_value(serde_json::json!({"limits": {"ephemeral-storage": "1Mi"}}))
            .unwrap(),
    );
    let s = stats("q", 0, 3 << 20);
    let v = rank::storage_violation(&p, &s, &[], false, true).unwrap();
    assert_eq!(
        v.message,
        "Container c exceeded its local ephemeral storage limit \"1Mi\". "
    );
    // A dedicated image fs holds the writable layer: only logs count then.
    assert_eq!(rank::storage_violation(&p, &s, &[], true, true), None);
    let mut s = stats("q", 0, 0);
    s.ephemeral_storage = Some(fs(5 << 20));
    let v = rank::storage_violation(&p, &s, &[], true, true).unwrap();
    assert_eq!(
        v.message,
        "Pod ephemeral local storage usage exceeds the total limit of containers 1Mi. "
    );
}

#[test]
fn admission_under_pressure() {
    let state = PressureState::default();
    let best_effort = pod("be", 0, None, serde_json::json!({}));
    let burstable = pod("bu", 0, Some("10Mi"), serde_json::json!({}));
    let tolerant = pod(
        "t",
        0,
        None,
        serde_json::json!({"tolerations": [{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}]}),
    );
    let critical = pod("crit", 2_000_000_000, None, serde_json::json!({}));
    assert_eq!(admit(&state, &best_effort, true), None);
    state.set(vec![Condition::MemoryPressure]);
    assert_eq!(
        admit(&state, &best_effort, true),
        Some((
            "Evicted".into(),
            "The node had condition: [MemoryPressure]. ".into()
        ))
    );
    assert_eq!(admit(&state, &burstable, true), None);
    assert_eq!(admit(&state, &tolerant, true), None);
    state.set(vec![Condition::MemoryPressure, Condition::DiskPressure]);
    assert_eq!(
        admit(&state, &burstable, true).unwrap().1,
        "The node had condition: [MemoryPressure DiskPressure]. "
    );
    assert_eq!(admit(&state, &critical, true), None);
}

#[test]
fn observations_from_a_summary() {
    let mut s = Summary::default();
    s.node.memory = Some(MemoryStats {
        available_bytes: Some(300),
        working_set_bytes: Some(700),
        ..Default::default()
    });
    s.node.rlimit = Some(RlimitStats {
        time: StatTime(5),
        maxpid: Some(1000),
        curproc: Some(400),
    });
    s.pods.push(stats("p", 100, 0));
    let o = signals::observe(&s, Some(500));
    assert_eq!(o[&Signal::MemoryAvailable].available, 300);
    assert_eq!(o[&Signal::MemoryAvailable].capacity, 1000);
    assert_eq!(o[&Signal::AllocatableMemoryAvailable].available, 400);
    assert_eq!(o[&Signal::PidAvailable].available, 600);
    assert!(!o.contains_key(&Signal::NodeFsAvailable));
}

/// Fakes for a whole pass: one answer per call, the last one repeated (an `Err` is a failed
/// refresh).
struct FakeStats(Mutex<Vec<Result<Observed, String>>>);

#[async_trait::async_trait]
impl StatsSource for FakeStats {
    async fn summary(&self, _fresh: bool) -> Result<Observed, EvictionError> {
        let mut v = self.0.lock().unwrap();
        let s = if v.len() > 1 {
            v.remove(0)
        } else {
            v[0].clone()
        };
        s.map_err(EvictionError::Stats)
    }
}

#[derive(Default)]
struct FakePods {
    pods: Vec<Pod>,
    evicted: Mutex<Vec<(String, Stopped, Duration)>>,
}

#[async_trait::async_trait]
impl PodKiller for FakePods {
    async fn active_pods(&self) -> Vec<Pod> {
        self.pods.clone()
    }
    async fn evict(&self, pod: &Pod, stopped: Stopped, grace: Duration) -> bool {
        self.evicted
            .lock()
            .unwrap()
            .push((pod.metadata.name.clone().unwrap(), stopped, grace));
        true
    }
}

#[derive(Default)]
struct FakeReclaim(Mutex<Vec<&'static str>>);

#[async_trait::async_trait]
impl NodeReclaim for FakeReclaim {
    async fn delete_all_unused_containers(&self) -> Result<(), EvictionError> {
        self.0.lock().unwrap().push("containers");
        Ok(())
    }
    async fn delete_unused_images(&self) -> Result<(), EvictionError> {
        self.0.lock().unwrap().push("images");
        Ok(())
    }
}

fn summary(mem_available: u64, fs_available: u64, pods: Vec<PodStats>) -> Summary {
    let mut s = Summary::default();
    s.node.memory = Some(MemoryStats {
        time: StatTime(crate::clock::unix_now_ns()),
        available_bytes: Some(mem_available),
        working_set_bytes: Some((1 << 30) - mem_available),
        ..Default::default()
    });
    s.node.fs = Some(FsStats {
        time: StatTime(crate::clock::unix_now_ns()),
        available_bytes: Some(fs_available),
        capacity_bytes: Some(1000),
        ..Default::default()
    });
    s.pods = pods;
    s
}

fn manager(
    summaries: Vec<Summary>,
    pods: Vec<Pod>,
    thresholds: Vec<Threshold>,
) -> (Manager, Arc<FakePods>, Arc<FakeReclaim>, Arc<PressureState>) {
    let events = Arc::new(crate::events::FakeRecorder::default());
    manager_recording(summaries, pods, thresholds, events)
}

fn manager_recording(
    summaries: Vec<Summary>,
    pods: Vec<Pod>,
    thresholds: Vec<Threshold>,
    events: Arc<crate::events::FakeRecorder>,
) -> (Manager, Arc<FakePods>, Arc<FakeReclaim>, Arc<PressureState>) {
    let answers = summaries
        .into_iter()
        .map(|s| {
            Ok(Observed {
                summary: Arc::new(s),
                gaps: Default::default(),
                unmeasured: Default::default(),
            })
        })
        .collect();
    manager_answering(answers, pods, thresholds, events)
}

/// A manager whose stats source gives `answers`, one per call (the last repeated).
fn manager_answering(
    answers: Vec<Result<Observed, String>>,
    pods: Vec<Pod>,
    thresholds: Vec<Threshold>,
    events: Arc<crate::events::FakeRecorder>,
) -> (Manager, Arc<FakePods>, Arc<FakeReclaim>, Arc<PressureState>) {
    let killer = Arc::new(FakePods {
        pods,
        ..Default::default()
    });
    let reclaim = Arc::new(FakeReclaim::default());
    let state = Arc::new(PressureState::default());
    let m = Manager::new(
        cfg(thresholds),
        Parts {
            stats: Arc::new(FakeStats(Mutex::new(answers))),
            pods: killer.clone(),
            reclaim: reclaim.clone(),
            events,
            state: state.clone(),
            node_name: "n".into(),
            allocatable_memory: None,
            pod_level_resources: true,
        },
    );
    (m, killer, reclaim, state)
}

#[tokio::test]
async fn memory_pressure_evicts_one_pod_the_ranking_picks_with_a_one_second_grace() {
    const M: u64 = 1 << 20;
    let pods = vec![
        pod("small", 0, None, serde_json::json!({})),
        pod("big", 0, None, serde_json::json!({})),
    ];
    let s = summary(
        50 * M,
        900,
        vec![stats("small", 10 * M, 0), stats("big", 80 * M, 0)],
    );
    let (mut m, killer, reclaim, state) = manager(
        vec![s],
        pods,
        vec![threshold(
            Signal::MemoryAvailable,
            Amount::Quantity(100 * MI),
            0,
        )],
    );
    let out = m.synchronize(Instant::now()).await.unwrap();
    assert_eq!(out.evicted, vec!["uid-big".to_string()]);
    assert_eq!(state.conditions(), vec![Condition::MemoryPressure]);
    assert!(
        reclaim.0.lock().unwrap().is_empty(),
        "no node-level reclaim for memory"
    );
    let ev = killer.evicted.lock().unwrap();
    assert_eq!(ev.len(), 1);
    let (name, stopped, grace) = &ev[0];
    assert_eq!(name, "big");
    assert_eq!(stopped.reason, "Evicted");
    assert!(stopped.disruption);
    assert!(stopped.message.starts_with(
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container c was using 80Mi"
    ));
    assert_eq!(*grace, Duration::from_secs(1));
}

#[tokio::test]
async fn disk_pressure_reclaims_node_resources_first_and_evicts_nothing_when_that_suffices() {
    let pods = vec![pod("p", 0, None, serde_json::json!({}))];
    let before = summary(1 << 30, 50, vec![stats("p", 0, 100)]);
    let after = summary(1 << 30, 500, vec![stats("p", 0, 100)]);
    let (mut m, killer, reclaim, state) = manager(
        vec![before, after],
        pods,
        vec![threshold(Signal::NodeFsAvailable, Amount::Fraction(0.1), 0)],
    );
    let out = m.synchronize(Instant::now()).await.unwrap();
    assert!(out.reclaimed);
    assert!(out.evicted.is_empty());
    assert_eq!(*reclaim.0.lock().unwrap(), vec!["containers", "images"]);
    assert!(killer.evicted.lock().unwrap().is_empty());
    assert_eq!(state.conditions(), vec![Condition::DiskPressure]);
}

#[tokio::test]
async fn emptydir_over_its_size_limit_is_evicted_without_node_pressure_but_critical_pods_never() {
    let spec =
        serde_json::json!({"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]});
    let mut critical = pod("crit", 0, None, spec.clone());
    critical.metadata.annotations = Some(
        [(
            crate::podspec::ANN_CONFIG_SOURCE.to_string(),
            "file".to_string(),
        )]
        .into(),
    );
    let pods = vec![pod("p", 0, None, spec), critical];
    let mut sp = stats("p", 0, 0);
    sp.volume.push(VolumeStats {
        fs: fs(2 << 20),
        name: "scratch".into(),
        ..Default::default()
    });
    let mut sc = stats("crit", 0, 0);
    sc.volume.push(VolumeStats {
        fs: fs(2 << 20),
        name: "scratch".into(),
        ..Default::default()
    });
    let (mut m, killer, _, state) =
        manager(vec![summary(1 << 30, 900, vec![sp, sc])], pods, vec![]);
    let out = m.synchronize(Instant::now()).await.unwrap();
    assert_eq!(out.evicted, vec!["uid-p".to_string()]);
    assert!(state.conditions().is_empty());
    let ev = killer.evicted.lock().unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(
        ev[0].1.message,
        "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "
    );
    assert!(!ev[0].1.disruption);
}

/// Issue 37.3: a volume whose walk could not finish (a container made it too long to walk)
/// counts as over its `sizeLimit`, whatever the floor it was measured at; a pod without a
/// limit that it falls under is left alone.
#[tokio::test]
async fn an_emptydir_whose_walk_could_not_finish_counts_as_over_its_size_limit() {
    use crate::stats::Unfinished;
    let limited =
        serde_json::json!({"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "10Mi"}}]});
    let unlimited = serde_json::json!({"volumes": [{"name": "scratch", "emptyDir": {}}]});
    let pods = vec![pod("p", 0, None, limited), pod("q", 0, None, unlimited)];
    let mut sums = Vec::new();
    for name in ["p", "q"] {
        let mut s = stats(name, 0, 0);
        s.volume.push(VolumeStats {
            fs: fs(4 << 10),
            name: "scratch".into(),
            ..Default::default()
        });
        sums.push(s);
    }
    let why = "it holds more than 5000000 entries".to_string();
    let unmeasured = ["uid-p", "uid-q"]
        .map(|uid| {
            let part = (Unfinished::Volume("scratch".into()), why.clone());
            (uid.to_string(), vec![part])
        })
        .into();
    let answers = vec![Ok(Observed {
        summary: Arc::new(summary(1 << 30, 900, sums)),
        gaps: Default::default(),
        unmeasured,
    })];
    let events = Arc::new(crate::events::FakeRecorder::default());
    let (mut m, killer, _, _) = manager_answering(answers, pods, vec![], events);
    let out = m.synchronize(Instant::now()).await.unwrap();
    assert_eq!(out.evicted, vec!["uid-p".to_string()]);
    let ev = killer.evicted.lock().unwrap();
    assert_eq!(
        ev[0].1.message,
        "Usage of EmptyDir volume \"scratch\" could not be measured in full (it holds more than 5000000 entries): it counts as over the limit \"10Mi\". "
    );
}

/// A pod with `ephemeral-storage` limits: an unfinished walk of any part of its storage
/// counts as over them.
#[test]
fn unfinished_walks_count_as_over_ephemeral_storage_limits() {
    use crate::stats::Unfinished;
    let p = pod(
        "p",
        0,
        None,
        serde_json::json!({"containers": [{"name": "c", "image": "i",
            "resources": {"limits": {"ephemeral-storage": "1Gi"}}}]}),
    );
    let s = stats("p", 0, 0);
    let why = |part| {
        vec![(
            part,
            "its directories kept moving during the walk (3 restarts)".to_string(),
        )]
    };
    assert_eq!(rank::storage_violation(&p, &s, &[], false, true), None);
    let v = rank::storage_violation(&p, &s, &why(Unfinished::EtcHosts), false, true).unwrap();
    assert_eq!(v.signal, "ephemeralpodfs.limit");
    assert!(
        v.message.contains("could not be measured in full"),
        "{}",
        v.message
    );
    // A container's logs, under the same limits.
    let logs = why(Unfinished::Logs("c".into()));
    let v = rank::storage_violation(&p, &s, &logs, false, true).unwrap();
    assert_eq!(v.signal, "ephemeralpodfs.limit");
}

/// A stats source that goes blind costs only its own signals: the pass still acts on what the
/// snapshot carries, and says so once when it goes blind and once when it is back (not at
/// every pass).
#[tokio::test]
async fn a_blind_stats_source_is_said_once_and_the_signals_left_still_act() {
    use crate::stats::gaps::Source;
    let spec =
        serde_json::json!({"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]});
    let pods = vec![pod("p", 0, None, spec)];
    // The runtime's stats failed for this pod's sandbox: no writable layer, but its volume
    // was walked on disk.
    let mut sp = stats("p", 0, 0);
    sp.containers[0].rootfs = None;
    sp.volume.push(VolumeStats {
        fs: fs(2 << 20),
        name: "scratch".into(),
        ..Default::default()
    });
    let with_gap = |summary: Summary, source: Source| {
        Ok(Observed {
            summary: Arc::new(summary),
            gaps: [(
                source,
                "Unknown: failed to decode sandbox container metrics".to_string(),
            )]
            .into(),
            unmeasured: Default::default(),
        })
    };
    let blind = with_gap(summary(1 << 30, 900, vec![sp]), Source::SandboxStats);
    // Then the pod list itself fails: the node's memory still raises MemoryPressure.
    let no_pods = with_gap(summary(50 << 20, 900, vec![]), Source::PodSandboxes);
    let clear = Ok(Observed {
        summary: Arc::new(summary(1 << 30, 900, vec![])),
        gaps: Default::default(),
        unmeasured: Default::default(),
    });
    let answers = vec![
        blind.clone(),
        blind,
        no_pods.clone(),
        no_pods,
        Err("stats refresh task failed".to_string()),
        Err("stats refresh task failed".to_string()),
        clear,
    ];
    let events = Arc::new(crate::events::FakeRecorder::default());
    let memory = threshold(Signal::MemoryAvailable, Amount::Quantity(100 * MI), 0);
    let (mut m, killer, _, state) = manager_answering(answers, pods, vec![memory], events);
    let t0 = Instant::now();
    let out = m.synchronize(t0).await.unwrap();
    assert_eq!(out.went_blind, [Source::SandboxStats]);
    assert_eq!(out.evicted, ["uid-p"], "the volume walk still counts");
    let out = m.synchronize(t0).await.unwrap();
    assert!(
        out.went_blind.is_empty() && out.recovered.is_empty(),
        "{out:?}"
    );
    let out = m.synchronize(t0).await.unwrap();
    assert_eq!(out.went_blind, [Source::PodSandboxes]);
    assert_eq!(out.recovered, [Source::SandboxStats]);
    assert_eq!(state.conditions(), vec![Condition::MemoryPressure]);
    assert_eq!(
        out.evicted,
        ["uid-p"],
        "ranked without usage, still evicted"
    );
    let out = m.synchronize(t0).await.unwrap();
    assert!(
        out.went_blind.is_empty() && out.recovered.is_empty(),
        "{out:?}"
    );
    // No snapshot at all: said once too.
    assert!(m.synchronize(t0).await.is_err());
    assert_eq!(
        m.blind.blind().keys().copied().collect::<Vec<_>>(),
        [Source::Refresh]
    );
    assert!(m.synchronize(t0).await.is_err());
    let out = m.synchronize(t0).await.unwrap();
    assert_eq!(out.recovered, [Source::Refresh]);
    assert!(out.went_blind.is_empty());
    assert_eq!(killer.evicted.lock().unwrap().len(), 3);
}

fn container_stats(name: &str, mem: u64, rootfs: u64, logs: u64) -> ContainerStats {
    ContainerStats {
        name: name.into(),
        memory: Some(MemoryStats {
            working_set_bytes: Some(mem),
            ..Default::default()
        }),
        rootfs: Some(fs(rootfs)),
        logs: Some(fs(logs)),
        ..Default::default()
    }
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Containers in the order the stats list them, init containers included, requests and
/// usages in Go's canonical quantity text.
#[test]
fn memory_eviction_annotations_are_upstreams_byte_for_byte() {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "uid-p"},
        "spec": {
            "initContainers": [{"name": "init", "image": "i"}],
            "containers": [
                {"name": "a", "image": "i", "resources": {"requests": {"memory": "64Mi"}}},
                {"name": "b", "image": "i", "resources": {"requests": {"memory": "0.5Gi"}}},
                {"name": "quiet", "image": "i", "resources": {"requests": {"memory": "1Gi"}}},
            ],
        },
    }))
    .unwrap();
    let mut s = stats("p", 0, 0);
    s.containers = vec![
        container_stats("b", 600 << 20, 0, 0),
        container_stats("quiet", 10 << 20, 0, 0),
        container_stats("a", 80 << 20, 0, 0),
        container_stats("init", 1000, 0, 0),
    ];
    let th = [threshold(
        Signal::MemoryAvailable,
        Amount::Quantity(100 * MI),
        0,
    )];
    let (msg, ann) =
        rank::eviction_message(Resource::Memory, &p, Some(&s), &th, &mem_obs(50 * MI, 1));
    assert_eq!(
        msg,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
         Container b was using 600Mi, request is 512Mi, has larger consumption of memory. \
         Container a was using 80Mi, request is 64Mi, has larger consumption of memory. \
         Container init was using 1k, request is 0, has larger consumption of memory. "
    );
    assert_eq!(
        ann,
        annotations(&[
            ("offending_containers", "b,a,init"),
            ("offending_containers_usage", "600Mi,80Mi,1k"),
            ("starved_resource", "memory"),
        ])
    );
    // Without the pod's stats: the message alone and no annotations, as upstream.
    let (msg, ann) = rank::eviction_message(Resource::Memory, &p, None, &th, &mem_obs(50 * MI, 1));
    assert_eq!(
        msg,
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
    );
    assert!(ann.is_empty());
}

/// Pod-level resources (memory): the pod's usage and request lead the message, whether or not
/// it is above the request, with `offending_pod` and `offending_pod_usage`.
#[test]
fn pod_level_memory_request_is_named_as_upstream() {
    let p = pod(
        "p",
        0,
        Some("32Mi"),
        serde_json::json!({"resources": {"requests": {"memory": "256Mi"}}}),
    );
    let mut s = stats("p", 40 << 20, 0);
    s.memory = Some(MemoryStats {
        working_set_bytes: Some(200 << 20),
        ..Default::default()
    });
    let (msg, ann) =
        rank::eviction_message(Resource::Memory, &p, Some(&s), &[], &Observations::new());
    assert_eq!(
        msg,
        "The node was low on resource: memory. \
         Pod p was using 200Mi, request is 256Mi, has larger consumption of memory. \
         Container c was using 40Mi, request is 32Mi, has larger consumption of memory. "
    );
    assert_eq!(
        ann,
        annotations(&[
            ("offending_containers", "c"),
            ("offending_containers_usage", "40Mi"),
            ("offending_pod", "p"),
            ("offending_pod_usage", "200Mi"),
            ("starved_resource", "memory"),
        ])
    );
}

/// ephemeral-storage: writable layer + logs against the request; usages BinarySI as Go's
/// NewQuantity prints them (2e9 bytes → 1953125Ki).
#[test]
fn ephemeral_storage_eviction_annotations_are_upstreams_byte_for_byte() {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default", "uid": "uid-p"},
        "spec": {"containers": [
            {"name": "w", "image": "i", "resources": {"requests": {"ephemeral-storage": "1000M"}}},
            {"name": "r", "image": "i"},
        ]},
    }))
    .unwrap();
    let mut s = stats("p", 0, 0);
    s.containers = vec![
        container_stats("w", 0, 1_500_000_000, 500_000_000),
        container_stats("r", 0, 0, 0),
    ];
    let mut o = Observations::new();
    o.insert(
        Signal::NodeFsAvailable,
        Observation {
            available: 512 * MI,
            capacity: 20 << 30,
            time: 1,
        },
    );
    let th = [threshold(
        Signal::NodeFsAvailable,
        Amount::Quantity(1 << 30),
        0,
    )];
    let (msg, ann) = rank::eviction_message(Resource::EphemeralStorage, &p, Some(&s), &th, &o);
    assert_eq!(
        msg,
        "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, available: 512Mi. \
         Container w was using 1953125Ki, request is 1G, has larger consumption of ephemeral-storage. "
    );
    assert_eq!(
        ann,
        annotations(&[
            ("offending_containers", "w"),
            ("offending_containers_usage", "1953125Ki"),
            ("starved_resource", "ephemeral-storage"),
        ])
    );
}

/// The Evicted Event carries the annotations for a threshold eviction, none for a local
/// storage limit.
#[tokio::test]
async fn evicted_event_carries_the_annotations() {
    const M: u64 = 1 << 20;
    let events = Arc::new(crate::events::FakeRecorder::default());
    let (mut m, _, _, _) = manager_recording(
        vec![summary(50 * M, 900, vec![stats("big", 80 * M, 0)])],
        vec![pod("big", 0, Some("16Mi"), serde_json::json!({}))],
        vec![threshold(
            Signal::MemoryAvailable,
            Amount::Quantity(100 * MI),
            0,
        )],
        events.clone(),
    );
    m.synchronize(Instant::now()).await.unwrap();
    let evicted: Vec<usize> = events
        .events()
        .iter()
        .enumerate()
        .filter(|(_, e)| e.starts_with("Warning Evicted "))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(evicted.len(), 1, "{:?}", events.events());
    assert_eq!(
        events.annotations()[evicted[0]],
        annotations(&[
            ("offending_containers", "c"),
            ("offending_containers_usage", "80Mi"),
            ("starved_resource", "memory"),
        ])
    );

    let spec =
        serde_json::json!({"volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]});
    let mut sp = stats("p", 0, 0);
    sp.volume.push(VolumeStats {
        fs: fs(2 << 20),
        name: "scratch".into(),
        ..Default::default()
    });
    let events = Arc::new(crate::events::FakeRecorder::default());
    let (mut m, _, _, _) = manager_recording(
        vec![summary(1 << 30, 900, vec![sp])],
        vec![pod("p", 0, None, spec)],
        vec![],
        events.clone(),
    );
    m.synchronize(Instant::now()).await.unwrap();
    assert_eq!(
        events.events(),
        ["Warning Evicted Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "]
    );
    assert!(events.annotations()[0].is_empty());
}

/// Pod-level memory requests are what usage is compared with: a pod whose containers request
/// 10Mi but whose pod-level request is 500Mi is within its request at 300Mi and goes last.
#[test]
fn memory_ranking_uses_pod_level_requests() {
    const M: u64 = 1 << 20;
    let level = serde_json::json!({"resources": {"requests": {"memory": "500Mi"}}});
    let mut pods = vec![
        (
            pod("pod-level", 0, Some("10Mi"), level),
            Some(stats("pod-level", 300 * M, 0)),
        ),
        (
            pod("containers", 0, Some("10Mi"), serde_json::json!({})),
            Some(stats("containers", 100 * M, 0)),
        ),
    ];
    rank::rank(&mut pods, Ranking::Memory, true);
    assert_eq!(names(&pods), ["containers", "pod-level"]);
    assert_eq!(
        rank::pod_amount(&pods[1].0, false, "memory", true),
        Some(500 * (1 << 20))
    );
    // With the PodLevelResources gate off the containers' 10Mi counts: the pod is 290Mi over
    // its request and goes first.
    rank::rank(&mut pods, Ranking::Memory, false);
    assert_eq!(names(&pods), ["pod-level", "containers"]);
    assert_eq!(
        rank::pod_amount(&pods[0].0, false, "memory", false),
        Some(10 * (1 << 20))
    );
}
