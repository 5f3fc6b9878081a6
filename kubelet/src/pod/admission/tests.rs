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

mod devices {
    use super::*;
    use crate::cm::devicemanager::DeviceManager;
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
