use super::*;
use crate::podspec::test_pod as pod;

#[test]
fn forbidden_sysctls_are_rejected_at_admission() {
    let mut a = Admission {
        sysctls: crate::pod::admission::sysctl::Allowlist::new(&["net.core.somaxconn".into()])
            .unwrap(),
        ..Default::default()
    };
    let sysctls =
        |n: &str| serde_json::json!({"securityContext": {"sysctls": [{"name": n, "value": "1"}]}});
    let pods = vec![
        pod("safe", "1", sysctls("net.ipv4.tcp_syncookies")),
        pod("allowed", "22", sysctls("net.core.somaxconn")),
        pod("bad", "333", sysctls("kernel.msgmax")),
    ];
    let rejected = a.admit(&pods, 0, 110, Some(&BTreeMap::new()), "n1");
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].0.metadata.name.as_deref(), Some("bad"));
    assert_eq!(rejected[0].1.reason, "SysctlForbidden");
    assert_eq!(
        rejected[0].1.message,
        "forbidden sysctl: \"kernel.msgmax\" not allowlisted"
    );
    assert!(a.is_admitted("1") && a.is_admitted("22"));
}

#[test]
fn max_pods_rejects_the_newest_with_upstreams_reason() {
    let mut a = Admission::default();
    let labels = BTreeMap::new();
    let pods = vec![
        pod("a", "1", serde_json::json!({})),
        pod("b", "22", serde_json::json!({})),
        pod("c", "333", serde_json::json!({})),
    ];
    let rej = a.admit(&pods, 1, 3, Some(&labels), "n1");
    assert_eq!(rej.len(), 1);
    assert_eq!(rej[0].0.metadata.name.as_deref(), Some("c"));
    assert_eq!(rej[0].1.reason, "OutOfpods");
    assert_eq!(
        rej[0].1.message,
        "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
    );
    assert_eq!(rejected_status(&rej[0].1).phase.as_deref(), Some("Failed"));
    // Sticky: a later pass does not re-decide, even when room appears.
    assert!(a.admit(&pods[..], 0, 3, Some(&labels), "n1").is_empty());
    assert!(a.is_rejected("333") && a.is_admitted("1"));
}

/// The node's allocatable is shared by the admitted pods, static pods included, by their
/// effective requests (pod-level when set): the newest pod that does not fit is rejected
/// with upstream's reason and message.
#[test]
fn requests_must_fit_allocatable() {
    let q = |s: &str| Quantity(s.into());
    let mut a = Admission {
        allocatable: Some(
            [
                ("cpu".to_string(), q("2")),
                ("memory".to_string(), q("4Gi")),
            ]
            .into(),
        ),
        static_pods: vec![pod(
            "static",
            "s",
            serde_json::json!({"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"cpu": "500m"}}}]}),
        )],
        ..Default::default()
    };
    let level =
        |cpu: &str| serde_json::json!({"resources": {"limits": {"cpu": cpu, "memory": "64Mi"}}});
    let pods = vec![pod("a", "1", level("1")), pod("b", "22", level("600m"))];
    let rej = a.admit(&pods, 1, 110, Some(&BTreeMap::new()), "n1");
    assert_eq!(rej.len(), 1);
    assert_eq!(rej[0].0.metadata.name.as_deref(), Some("b"));
    assert_eq!(rej[0].1.reason, "OutOfcpu");
    assert_eq!(
        rej[0].1.message,
        "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000"
    );
    assert!(a.is_admitted("1"));
}

#[test]
fn node_selector_and_affinity() {
    let labels = BTreeMap::from([
        ("zone".to_string(), "a".to_string()),
        ("gen".to_string(), "5".to_string()),
    ]);
    assert!(node_affinity_matches(
        &pod("p", "1", serde_json::json!({"nodeSelector": {"zone": "a"}})),
        &labels,
        "n1"
    ));
    assert!(!node_affinity_matches(
        &pod("p", "1", serde_json::json!({"nodeSelector": {"zone": "b"}})),
        &labels,
        "n1"
    ));
    let aff = |expr: serde_json::Value| {
        pod(
            "p",
            "1",
            serde_json::json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [expr]}}}}),
        )
    };
    assert!(node_affinity_matches(
        &aff(
            serde_json::json!({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["4"]}]})
        ),
        &labels,
        "n1"
    ));
    assert!(!node_affinity_matches(
        &aff(
            serde_json::json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]})
        ),
        &labels,
        "n1"
    ));
    assert!(node_affinity_matches(
        &aff(
            serde_json::json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]})
        ),
        &labels,
        "n1"
    ));
    let mut a = Admission::default();
    let rej = a.admit(
        &[pod(
            "p",
            "1",
            serde_json::json!({"nodeSelector": {"zone": "b"}}),
        )],
        0,
        110,
        Some(&labels),
        "n1",
    );
    assert_eq!(rej[0].1.reason, "NodeAffinity");
}

fn sized(name: &str, uid: &str, cpu: &str) -> Pod {
    pod(
        name,
        uid,
        serde_json::json!({"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"cpu": cpu, "memory": "64Mi"}}}]}),
    )
}

fn resizing(cpu: &str) -> Pod {
    let mut p = sized("a", "1", cpu);
    p.metadata.generation = Some(2);
    p
}

fn allocated_cpu(a: &crate::allocation::Allocations, uid: &str) -> String {
    a.get(uid).unwrap()["c"].requests.as_ref().unwrap()["cpu"]
        .0
        .clone()
}

/// A resize beyond the node's allocatable is Infeasible, one that does not fit beside the
/// other pods is Deferred (upstream's reasons and messages, with the generation asked for),
/// and the deferred one is allocated once the other pod is gone. Admitted pods count at their
/// allocation, not at a spec that asks for more.
#[test]
fn resizes_are_allocated_deferred_or_infeasible() {
    let allocations = Arc::new(crate::allocation::Allocations::in_memory());
    let recorder = Arc::new(crate::events::FakeRecorder::default());
    let q = |s: &str| Quantity(s.into());
    let mut a = Admission {
        allocatable: Some(
            [
                ("cpu".to_string(), q("4")),
                ("memory".to_string(), q("4Gi")),
            ]
            .into(),
        ),
        allocations: Some(allocations.clone()),
        events: Some(recorder.clone()),
        ..Default::default()
    };
    let labels = BTreeMap::new();
    let other = sized("b", "22", "2");
    assert!(
        a.admit(
            &[sized("a", "1", "1"), other.clone()],
            0,
            110,
            Some(&labels),
            "n1"
        )
        .is_empty()
    );
    assert_eq!(allocated_cpu(&allocations, "1"), "1");
    // More than the node has: Infeasible; the allocation stays.
    a.admit(
        &[resizing("64"), other.clone()],
        0,
        110,
        Some(&labels),
        "n1",
    );
    let p = allocations.pending("1").unwrap();
    assert_eq!(p.reason, "Infeasible");
    assert_eq!(
        p.message,
        "Node didn't have enough capacity: cpu, requested: 64000, capacity: 4000"
    );
    assert_eq!(p.generation, Some(2));
    assert_eq!(allocated_cpu(&allocations, "1"), "1");
    // Fits the node but not beside the other pod: Deferred.
    a.admit(&[resizing("3"), other.clone()], 0, 110, Some(&labels), "n1");
    let p = allocations.pending("1").unwrap();
    assert_eq!(p.reason, "Deferred");
    assert_eq!(
        p.message,
        "Node didn't have enough resource: cpu, requested: 3000, used: 2000, capacity: 4000"
    );
    // A new pod is admitted against the allocation (1 cpu), not the pending 3.
    let third = sized("c", "333", "1");
    assert!(
        a.admit(
            &[resizing("3"), other, third.clone()],
            0,
            110,
            Some(&labels),
            "n1"
        )
        .is_empty()
    );
    // The other pods leave: the deferred resize is allocated and no longer pending.
    a.admit(&[resizing("3")], 0, 110, Some(&labels), "n1");
    assert_eq!(allocated_cpu(&allocations, "1"), "3");
    assert_eq!(allocations.pending("1"), None);
    // Shrinking always fits.
    a.admit(&[resizing("500m")], 0, 110, Some(&labels), "n1");
    assert_eq!(allocated_cpu(&allocations, "1"), "500m");
    // One event per decision (a deferral whose message changed is told again), upstream's
    // reasons.
    let reasons: Vec<String> = recorder
        .events()
        .iter()
        .map(|e| e.split(' ').take(2).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        reasons,
        [
            "Warning ResizeInfeasible",
            "Warning ResizeDeferred",
            "Warning ResizeDeferred",
            "Normal ResizeStarted",
            "Normal ResizeStarted"
        ]
    );
    assert!(recorder.events()[0].contains(
        r#"Pod resize Infeasible: {"containers":[{"name":"c","resources":{"limits":{"cpu":"64","memory":"64Mi"},"requests":{"cpu":"64","memory":"64Mi"}}}],"generation":2,"error":"Node didn't have enough capacity"#
    ));
}

/// After an agent restart the checkpointed allocation is what is admitted: a resize asked
/// for while the agent was down is decided, not taken as the pod's original size.
#[test]
fn a_restarted_agent_admits_the_allocation_not_the_spec() {
    let allocations = Arc::new(crate::allocation::Allocations::in_memory());
    allocations.set("1", crate::allocation::from_spec(&sized("a", "1", "1")));
    let q = |s: &str| Quantity(s.into());
    let mut a = Admission {
        allocatable: Some(
            [
                ("cpu".to_string(), q("4")),
                ("memory".to_string(), q("4Gi")),
            ]
            .into(),
        ),
        allocations: Some(allocations.clone()),
        ..Default::default()
    };
    assert!(
        a.admit(&[resizing("64")], 0, 110, Some(&BTreeMap::new()), "n1")
            .is_empty()
    );
    assert_eq!(allocated_cpu(&allocations, "1"), "1");
    assert_eq!(allocations.pending("1").unwrap().reason, "Infeasible");
}

#[test]
fn static_pods_cannot_resize() {
    let mut p = resizing("2");
    p.metadata.annotations = Some(
        [(
            crate::podspec::ANN_CONFIG_SOURCE.to_string(),
            "file".to_string(),
        )]
        .into(),
    );
    let d = resize::decide(&p, &sized("a", "1", "1"), &BTreeMap::new(), None, true);
    assert_eq!(
        d,
        resize::Decision::Pending(crate::allocation::Pending {
            reason: "Infeasible".into(),
            message: "In-place resize of static-pods is not supported".into(),
            generation: Some(2),
        })
    );
}

mod devices {
    use super::*;
    use crate::devices::DeviceManager;
    use cri_proto::deviceplugin::sample::SamplePlugin;
    use std::time::Duration;

    fn foo_pod(name: &str, uid: &str) -> Pod {
        pod(
            name,
            uid,
            serde_json::json!({"containers": [{"name": "c", "image": "i",
                "resources": {"limits": {"example.com/foo": "1"}, "requests": {"example.com/foo": "1"}}}]}),
        )
    }

    /// Two devices: two pods get one each; the third is refused as upstream refuses it (the
    /// device manager's handler runs before the resource fit: UnexpectedAdmissionError), and
    /// the stale Node allocatable (0 before the plugin registered) does not refuse the first
    /// two. When the plugin's Allocate fails, the pod is rejected and its device freed.
    #[tokio::test]
    async fn device_requests_are_reserved_allocated_and_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("device-plugins");
        let dm = Arc::new(DeviceManager::new(dir.clone()));
        let cancel = tokio_util::sync::CancellationToken::new();
        tokio::spawn(dm.clone().serve(cancel.clone()));
        let sock = dir.join("kubelet.sock");
        for _ in 0..200 {
            if tokio::net::UnixStream::connect(&sock).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let plugin = SamplePlugin::start(
            &dir,
            "foo.sock",
            "example.com/foo",
            &["Dev-1", "Dev-2"],
            tmp.path(),
        )
        .await
        .unwrap();
        plugin.register().await.unwrap();
        for _ in 0..200 {
            if dm.capacity().1.get("example.com/foo").map(|q| q.0.as_str()) == Some("2") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut a = Admission {
            allocatable: Some(
                [
                    ("cpu".to_string(), Quantity("4".into())),
                    ("example.com/foo".to_string(), Quantity("0".into())),
                ]
                .into(),
            ),
            devices: Some(dm.clone()),
            ..Default::default()
        };
        let labels = BTreeMap::new();
        let mut pods = vec![foo_pod("a", "1"), foo_pod("b", "22")];
        assert!(a.admit(&pods, 0, 110, Some(&labels), "n1").is_empty());
        assert!(a.allocate_devices(&pods).await.is_empty());
        assert_eq!(plugin.allocate_calls().len(), 2);
        assert!(dm.run_options("1", "c").is_some() && dm.run_options("22", "c").is_some());
        pods.push(foo_pod("c", "333"));
        let rej = a.admit(&pods, 0, 110, Some(&labels), "n1");
        assert_eq!(rej.len(), 1);
        assert_eq!(rej[0].1.reason, "UnexpectedAdmissionError");
        assert_eq!(
            rej[0].1.message,
            "Allocate failed due to requested number of devices unavailable for example.com/foo. Requested: 1, Available: 0, which is unexpected"
        );
        // Pod "b" ends: its device goes to the next pod, whose plugin call fails.
        pods.retain(|p| p.metadata.uid.as_deref() != Some("22"));
        plugin.fail_allocate(Some("no luck"));
        pods.push(foo_pod("d", "4444"));
        assert!(a.admit(&pods, 0, 110, Some(&labels), "n1").is_empty());
        let rej = a.allocate_devices(&pods).await;
        assert_eq!(rej.len(), 1);
        assert_eq!(rej[0].0.metadata.uid.as_deref(), Some("4444"));
        assert_eq!(
            rej[0].1.message,
            "Allocate failed due to rpc error: code = Unknown desc = no luck, which is unexpected"
        );
        assert!(a.is_rejected("4444") && !a.is_admitted("4444"));
        assert!(dm.pod_devices("4444").is_empty());
        assert_eq!(dm.in_use()["example.com/foo"], 1);
        cancel.cancel();
    }
}
