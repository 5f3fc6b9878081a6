use super::super::tests::{cfg, host};
use super::super::*;
use serde_json::{Value, json};
use std::sync::Mutex;

fn t(s: &str) -> jiff::Timestamp {
    s.parse().unwrap()
}

/// A Node the kubelet wrote once, then node-problem-detector added KernelDeadlock, the
/// network plugin NetworkUnavailable and an operator `example.com/dongle: 4` capacity.
fn node_with_others_fields() -> NodeStatus {
    let (mut s, _) = compute_status(
        None,
        &cfg(),
        &host(),
        None,
        &[],
        &[],
        t("2026-01-01T00:00:00Z"),
    );
    let conds = s.conditions.as_mut().unwrap();
    conds.insert(
        0,
        NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: "False".into(),
            reason: Some("CalicoIsUp".into()),
            ..Default::default()
        },
    );
    conds.push(NodeCondition {
        type_: "KernelDeadlock".into(),
        status: "True".into(),
        reason: Some("DockerHung".into()),
        ..Default::default()
    });
    s.capacity
        .as_mut()
        .unwrap()
        .insert("example.com/dongle".into(), Quantity("4".into()));
    s
}

#[test]
fn others_conditions_and_extended_resources_survive_and_reach_allocatable() {
    let old = node_with_others_fields();
    let (new, _) = compute_status(
        Some(&old),
        &cfg(),
        &host(),
        None,
        &[],
        &[],
        t("2026-01-01T00:00:10Z"),
    );
    let types: Vec<_> = new
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(
        types,
        [
            "NetworkUnavailable",
            "MemoryPressure",
            "DiskPressure",
            "PIDPressure",
            "Ready",
            "KernelDeadlock"
        ],
        "every condition kept, in the Node's order"
    );
    assert_eq!(new.capacity.as_ref().unwrap()["example.com/dongle"].0, "4");
    assert_eq!(
        new.allocatable.as_ref().unwrap()["example.com/dongle"].0,
        "4"
    );

    let patch = status_patch(&old, &new).unwrap();
    let st = &patch["status"];
    // Only the kubelet's conditions, each keyed by type; others' are not in the patch.
    let patched: Vec<_> = st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        patched,
        ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    );
    assert_eq!(
        st["conditions"][3],
        json!({"type": "Ready", "lastHeartbeatTime": "2026-01-01T00:00:10Z"}),
        "only what changed"
    );
    assert_eq!(
        st["$setElementOrder/conditions"],
        json!([{"type": "NetworkUnavailable"}, {"type": "MemoryPressure"}, {"type": "DiskPressure"},
               {"type": "PIDPressure"}, {"type": "Ready"}, {"type": "KernelDeadlock"}])
    );
    assert!(st.get("capacity").is_none(), "capacity unchanged: {st}");
    assert_eq!(st["allocatable"], json!({"example.com/dongle": "4"}));
    assert!(
        st.get("addresses").is_none() && st.get("nodeInfo").is_none(),
        "{st}"
    );
}

#[test]
fn removed_extended_resources_leave_allocatable_and_changed_addresses_are_replaced() {
    let mut old = node_with_others_fields();
    old.allocatable
        .as_mut()
        .unwrap()
        .insert("example.com/gone".into(), Quantity("1".into()));
    old.addresses = Some(vec![
        NodeAddress {
            type_: "InternalIP".into(),
            address: "10.0.0.9".into(),
        },
        NodeAddress {
            type_: "InternalIP".into(),
            address: "fd00::9".into(),
        },
    ]);
    let (new, _) = compute_status(
        Some(&old),
        &cfg(),
        &host(),
        None,
        &[],
        &[],
        t("2026-01-01T00:00:10Z"),
    );
    let patch = status_patch(&old, &new).unwrap();
    assert_eq!(
        patch["status"]["allocatable"]["example.com/gone"],
        Value::Null
    );
    assert_eq!(
        patch["status"]["addresses"],
        json!([{"type": "InternalIP", "address": "10.0.0.5"}, {"type": "Hostname", "address": "n1"},
               {"$patch": "replace"}])
    );
    // A condition gone from the new status is deleted by its key.
    let mut fewer = new.clone();
    fewer
        .conditions
        .as_mut()
        .unwrap()
        .retain(|c| c.type_ != "KernelDeadlock");
    let p = status_patch(&new, &fewer).unwrap();
    assert_eq!(
        p["status"]["conditions"],
        json!([{"$patch": "delete", "type": "KernelDeadlock"}])
    );
    assert!(status_patch(&new, &new).is_none());
}

/// A fake apiserver holding one Node: GET returns it, a strategic merge PATCH of the status
/// applies (conditions by type, maps by key, `null` deletes); every request is recorded.
#[derive(Default)]
struct FakeNodes {
    node: Mutex<Value>,
    requests: Mutex<Vec<(String, String, Value)>>,
}

fn apply(target: &mut Value, patch: &Value) {
    let (Value::Object(t), Value::Object(p)) = (target, patch) else {
        return;
    };
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(_) => apply(t.entry(k.clone()).or_insert(json!({})), v),
            Value::Array(items) if k == "conditions" => {
                let list = t
                    .entry(k.clone())
                    .or_insert(json!([]))
                    .as_array_mut()
                    .unwrap();
                for item in items {
                    match list.iter_mut().find(|c| c["type"] == item["type"]) {
                        Some(c) => apply(c, item),
                        None => list.push(item.clone()),
                    }
                }
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
}

fn fake_client(fake: Arc<FakeNodes>) -> ClientHandle {
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let fake = fake.clone();
        async move {
            use http_body_util::BodyExt;
            let method = req.method().to_string();
            let ctype = req
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&body).unwrap_or_default();
            if method == "PATCH" {
                apply(&mut fake.node.lock().unwrap(), &body);
            }
            fake.requests.lock().unwrap().push((method, ctype, body));
            let out = serde_json::to_vec(&*fake.node.lock().unwrap()).unwrap();
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(200)
                    .body(kube::client::Body::from(out))
                    .unwrap(),
            )
        }
    });
    ClientHandle::new(kube::Client::new(svc, "default")).0
}

struct Healthy;
#[async_trait::async_trait]
impl RuntimeHealth for Healthy {
    async fn version(&self) -> Option<(String, String)> {
        Some(("containerd".into(), "1.6.20".into()))
    }
    async fn errors(&self) -> Vec<String> {
        Vec::new()
    }
}

struct Host;
impl HostFacts for Host {
    fn host_info(&self) -> HostInfo {
        host()
    }
}

/// Two status updates on a Node carrying others' fields: one strategic merge PATCH that
/// leaves them in place, then nothing but the read (nothing the kubelet owns changed).
#[tokio::test]
async fn one_strategic_patch_keeps_others_fields_then_no_write_while_unchanged() {
    let fake = Arc::new(FakeNodes::default());
    let node = Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        status: Some(node_with_others_fields()),
        ..Default::default()
    };
    *fake.node.lock().unwrap() = serde_json::to_value(&node).unwrap();
    let client = fake_client(fake.clone());
    let lp = NodeStatusLoop {
        volumes: None,
        cfg: cfg(),
        client: client.clone(),
        host: Arc::new(Host),
        health: Arc::new(Healthy),
        events: Arc::new(crate::events::LogRecorder),
        node_tx: watch::channel(None).0,
        devices: None,
    };
    let api: Api<Node> = Api::all(client.current());
    let nref = crate::events::node_ref("n1");
    let mut last = None;
    lp.update_once(&api, &mut last, &nref).await.unwrap();
    let reqs = fake.requests.lock().unwrap().clone();
    let methods: Vec<_> = reqs.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(methods, ["GET", "PATCH"], "one read, one write");
    assert_eq!(reqs[1].1, "application/strategic-merge-patch+json");
    let stored = fake.node.lock().unwrap().clone();
    let types: Vec<_> = stored["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].clone())
        .collect();
    assert!(
        types.contains(&json!("KernelDeadlock")) && types.contains(&json!("NetworkUnavailable")),
        "{types:?}"
    );
    assert_eq!(stored["status"]["capacity"]["example.com/dongle"], "4");
    assert_eq!(stored["status"]["allocatable"]["example.com/dongle"], "4");
    assert_eq!(
        stored["status"]["nodeInfo"]["containerRuntimeVersion"],
        "containerd://1.6.20"
    );

    fake.requests.lock().unwrap().clear();
    lp.update_once(&api, &mut last, &nref).await.unwrap();
    let methods: Vec<_> = fake
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.0.clone())
        .collect();
    assert_eq!(
        methods,
        ["GET"],
        "nothing owned changed: no write before the report frequency"
    );
}
