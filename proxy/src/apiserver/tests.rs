use super::*;
use crate::model::{IpFamily, ServiceState};
use crate::tracker::{ProxyHandle, ProxyHandles};
use kube::runtime::watcher::Event;
use serde_json::json;

/// A reflector over its own store, as `run` makes one per kind.
fn reflector<S: Sink<DynamicObject>>(sink: S) -> Reflector<DynamicObject, S> {
    Reflector::new(Arc::new(Store::default()), sink)
}

#[test]
fn selectors_match_upstream() {
    assert_eq!(
        label_selector(),
        "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"
    );
    assert_eq!(node_field_selector("node-a"), "metadata.name=node-a");
}

#[test]
fn rate_window_defaults() {
    assert_eq!(rate_window(5.0, 10), (10, Duration::from_secs(2)));
    assert_eq!(rate_window(0.0, 0), (1, Duration::from_millis(200)));
    assert_eq!(rate_window(50.0, 100), (100, Duration::from_secs(2)));
    assert_eq!(rate_window(1e-30, 10), (10, Duration::from_secs(3600)));
}

#[test]
fn master_must_be_a_url() {
    assert!(parse_master("https://10.0.0.1:6443").is_ok());
    assert!(parse_master("http://h").is_ok());
    assert!(matches!(
        parse_master("10.0.0.1:6443"),
        Err(Error::Master { .. })
    ));
    assert!(matches!(parse_master(""), Err(Error::Master { .. })));
}

fn dyn_obj(v: serde_json::Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

fn svc(name: &str, ip: &str) -> DynamicObject {
    dyn_obj(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name, "resourceVersion": "1",
                     "managedFields": [{"manager": "x"}]},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP",
                 "ports": [{"name": "p", "port": 80, "protocol": "TCP"}]}
    }))
}

fn slice(name: &str, svc: &str, ips: &[&str]) -> DynamicObject {
    dyn_obj(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "default", "name": name,
                     "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>(),
        "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}]
    }))
}

#[test]
fn events_drive_the_handle_and_relist_deletes() {
    let handle = ProxyHandle::new(ServiceState::new(IpFamily::V4, "n"));
    let mut sm = reflector(ServiceSink(handle.clone().into()));
    let mut em = reflector(EndpointSliceSink(handle.clone().into()));

    sm.handle(Event::Init);
    sm.handle(Event::InitApply(svc("a", "10.96.0.1")));
    sm.handle(Event::InitApply(svc("b", "10.96.0.2")));
    // Malformed: a port that is not a number. Skipped, the rest of the list is kept.
    let bad = dyn_obj(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": "bad"},
        "spec": {"ports": [{"port": "eighty"}]}
    }));
    sm.handle(Event::InitApply(bad.clone()));
    assert!(!handle.initialized());
    sm.handle(Event::InitDone);
    assert_eq!(sm.store().len(), 2);
    assert!(
        sm.store()
            .get("default/a")
            .unwrap()
            .metadata
            .managed_fields
            .is_none(),
        "managedFields stripped"
    );
    em.handle(Event::Init);
    em.handle(Event::InitApply(slice(
        "a-1",
        "a",
        &["10.244.0.2", "10.244.1.2"],
    )));
    em.handle(Event::InitDone);
    assert!(handle.initialized());
    assert_eq!(handle.with_state(|s| s.service_port_map().len()), 2);
    assert_eq!(
        handle.with_state(|s| s.endpoints_map().values().map(Vec::len).sum::<usize>()),
        2
    );

    // Watch events: a malformed update is skipped (the old version stays).
    sm.handle(Event::Apply(bad));
    let mut bad_a = svc("a", "10.96.0.1");
    bad_a.data["spec"]["ports"] = json!("not a list");
    sm.handle(Event::Apply(bad_a));
    assert_eq!(handle.with_state(|s| s.service_port_map().len()), 2);
    em.handle(Event::Apply(slice("a-1", "a", &["10.244.0.2"])));
    assert_eq!(
        handle.with_state(|s| s.endpoints_map().values().map(Vec::len).sum::<usize>()),
        1
    );

    // Re-list after an outage: b and the slice vanished meanwhile.
    sm.handle(Event::Init);
    sm.handle(Event::InitApply(svc("a", "10.96.0.1")));
    sm.handle(Event::InitDone);
    em.handle(Event::Init);
    em.handle(Event::InitDone);
    assert_eq!(handle.with_state(|s| s.service_port_map().len()), 1);
    assert!(handle.with_state(|s| s.endpoints_map().is_empty()));

    // Delete events.
    sm.handle(Event::Delete(svc("a", "10.96.0.1")));
    assert!(handle.with_state(|s| s.service_port_map().is_empty()));
    assert!(sm.store().is_empty());
}

#[test]
fn node_facts_reach_the_proxiers_and_health() {
    let node = |taints: serde_json::Value, deleting: bool| {
        let mut meta = json!({"name": "node-a", "labels": {"topology.kubernetes.io/zone": "z1"}});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        dyn_obj(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": meta,
            "spec": {"podCIDR": "10.244.1.0/24", "taints": taints},
            "status": {"addresses": [
                {"type": "Hostname", "address": "node-a"},
                {"type": "ExternalIP", "address": "203.0.113.7"},
                {"type": "InternalIP", "address": "fd00::2"},
                {"type": "InternalIP", "address": "192.168.0.2"}
            ]}
        }))
    };
    let v4 = ProxyHandle::new(ServiceState::new(IpFamily::V4, "node-a"));
    let v6 = ProxyHandle::with_health(
        ServiceState::new(IpFamily::V6, "node-a"),
        v4.health().clone(),
    );
    let handles = ProxyHandles::new(vec![v4.clone(), v6.clone()]);
    let mut m = reflector(NodeSink::new(handles));
    m.handle(Event::Init);
    m.handle(Event::InitApply(node(json!([]), false)));
    m.handle(Event::InitDone);

    let cur = m.sink().current.clone().unwrap();
    assert_eq!(cur.pod_cidrs, vec!["10.244.1.0/24"]);
    let facts = v4.with_state(|s| s.node().clone());
    assert_eq!(facts.zone.as_deref(), Some("z1"));
    // InternalIPs before ExternalIPs; one per family for each proxier.
    assert_eq!(
        facts.ip_of(IpFamily::V4),
        Some("192.168.0.2".parse().unwrap())
    );
    let facts6 = v6.with_state(|s| s.node().clone());
    assert_eq!(facts6.ip_of(IpFamily::V6), Some("fd00::2".parse().unwrap()));
    assert!(v4.health().node_eligible());

    // The autoscaler's taint, then deletion, make the node ineligible for /healthz.
    let tainted = json!([{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]);
    m.handle(Event::Apply(node(tainted, false)));
    assert!(!v4.health().node_eligible());
    m.handle(Event::Apply(node(json!([]), false)));
    assert!(v4.health().node_eligible());
    m.handle(Event::Apply(node(json!([]), true)));
    assert!(!v4.health().node_eligible());

    m.handle(Event::Init);
    m.handle(Event::InitDone);
    assert!(m.sink().current.is_none(), "node gone after re-list");
}

#[tokio::test]
async fn kubeconfig_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.conf");
    let opts = ClientOptions {
        kubeconfig: Some(path.clone()),
        master: None,
        qps: 5.0,
        burst: 10,
    };
    let e = build_client(&opts)
        .await
        .err()
        .expect("missing kubeconfig must fail");
    assert!(matches!(e, Error::Kubeconfig { .. }), "{e}");
    assert!(e.to_string().contains("missing.conf"), "{e}");

    // --master alone: an unauthenticated client to that URL.
    let opts = ClientOptions {
        kubeconfig: None,
        master: Some("http://127.0.0.1:1".into()),
        qps: 5.0,
        burst: 10,
    };
    assert!(build_client(&opts).await.is_ok());

    // Neither: the in-cluster configuration, which outside a pod fails clearly.
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
        let opts = ClientOptions {
            kubeconfig: None,
            master: None,
            qps: 5.0,
            burst: 10,
        };
        let e = build_client(&opts).await.err().expect("not in a pod");
        assert!(matches!(e, Error::InCluster(_)), "{e}");
        assert!(e.to_string().contains("KUBERNETES_SERVICE_HOST"), "{e}");
    }
}

#[test]
fn service_cidrs_reach_each_family() {
    let v4 = ProxyHandle::new(ServiceState::new(IpFamily::V4, "n"));
    let v6 = ProxyHandle::new(ServiceState::new(IpFamily::V6, "n"));
    let mut sink = ServiceCidrSink::new(ProxyHandles::new(vec![v4.clone(), v6.clone()]));
    let cidr = |name: &str, cidrs: &[&str]| {
        sink_decode(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": {"name": name},
            "spec": {"cidrs": cidrs},
        }))
    };
    let a = cidr("kubernetes", &["10.96.0.0/16", "fd00:10:96::/112"]);
    let b = cidr("extra", &["10.97.0.0/24"]);
    sink.upsert(&a);
    sink.upsert(&b);
    let got = |h: &ProxyHandle| -> Vec<String> {
        h.with_state(|s| s.service_cidrs().iter().map(|c| c.to_string()).collect())
    };
    assert_eq!(got(&v4), ["10.96.0.0/16", "10.97.0.0/24"]);
    assert_eq!(got(&v6), ["fd00:10:96::/112"]);
    sink.delete(&b);
    assert_eq!(got(&v4), ["10.96.0.0/16"]);
}

fn sink_decode(v: serde_json::Value) -> ServiceCIDR {
    ServiceCidrSink::new(ProxyHandles::new(vec![]))
        .decode(dyn_obj(v))
        .unwrap()
        .unwrap()
}
