use std::collections::HashMap;

use serde_json::Value;

use super::*;
use crate::dataplane::fake::FakeDataplane;

struct Call {
    env: HashMap<String, String>,
}

impl Call {
    fn new(command: &str, container: &str) -> Call {
        let env = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", container),
            ("CNI_NETNS", "/run/netns/pod1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ];
        Call {
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn netns(mut self, path: &str) -> Call {
        self.env.insert("CNI_NETNS".into(), path.into());
        self
    }

    fn run(&self, stdin: &str, dp: &FakeDataplane) -> (Value, i32) {
        let out = run(|k| self.env.get(k).cloned(), stdin.as_bytes(), dp);
        let v = if out.stdout.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&out.stdout).unwrap()
        };
        (v, out.exit_code)
    }
}

fn conf(dir: &std::path::Path, version: &str, ipam: &str) -> String {
    format!(
        r#"{{"cniVersion":"{version}","name":"k8s","type":"node-agent-cni","mtu":1450,"dataDir":"{}","ipam":{ipam}}}"#,
        dir.display()
    )
}

#[test]
fn add_returns_the_spec_result_and_del_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let dp = FakeDataplane::default();
    let c = conf(
        dir.path(),
        "1.0.0",
        r#"{"subnets":["10.244.1.0/24","fd00:10:244:1::/64"]}"#,
    );
    let (res, code) = Call::new("ADD", "c1").run(&c, &dp);
    assert_eq!(code, 0, "{res}");
    assert_eq!(res["cniVersion"], "1.0.0");
    assert_eq!(res["interfaces"][0]["name"], "cni0");
    assert_eq!(res["interfaces"][2]["name"], "eth0");
    assert_eq!(res["interfaces"][2]["sandbox"], "/run/netns/pod1");
    assert_eq!(
        res["ips"][0],
        serde_json::json!({"address":"10.244.1.2/24","gateway":"10.244.1.1","interface":2})
    );
    assert_eq!(res["ips"][1]["address"], "fd00:10:244:1::2/64");
    assert_eq!(
        res["routes"][0],
        serde_json::json!({"dst":"0.0.0.0/0","gw":"10.244.1.1"})
    );
    assert_eq!(
        res["routes"][1],
        serde_json::json!({"dst":"::/0","gw":"fd00:10:244:1::1"})
    );
    let link = dp.pods.lock().unwrap().values().next().cloned().unwrap();
    assert_eq!(link.mtu, 1450);
    assert_eq!(link.gateways[0].to_string(), "10.244.1.1/24");

    let (_, code) = Call::new("ADD", "c2").netns("/run/netns/pod2").run(&c, &dp);
    assert_eq!(code, 0);
    assert_eq!(dp.pods.lock().unwrap().len(), 2);

    for _ in 0..2 {
        let (out, code) = Call::new("DEL", "c1").run(&c, &dp);
        assert_eq!((out, code), (Value::Null, 0));
    }
    assert_eq!(dp.pods.lock().unwrap().len(), 1);
    // c1's address is free again, but the next ADD continues after the last one handed out.
    let (res, _) = Call::new("ADD", "c3").netns("/run/netns/pod3").run(&c, &dp);
    assert_eq!(res["ips"][0]["address"], "10.244.1.4/24");
}

#[test]
fn check_passes_after_add_and_fails_when_the_interface_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let dp = FakeDataplane::default();
    let base = conf(dir.path(), "1.0.0", r#"{"subnet":"10.244.1.0/24"}"#);
    let (res, _) = Call::new("ADD", "c1").run(&base, &dp);
    let mut with_prev: Value = serde_json::from_str(&base).unwrap();
    with_prev["prevResult"] = res;
    let (out, code) = Call::new("CHECK", "c1").run(&with_prev.to_string(), &dp);
    assert_eq!((out, code), (Value::Null, 0));
    dp.pods.lock().unwrap().clear();
    let (err, code) = Call::new("CHECK", "c1").run(&with_prev.to_string(), &dp);
    assert_eq!(code, 1);
    assert_eq!(err["code"], 101);
    // CHECK without prevResult is an invalid config.
    let (err, _) = Call::new("CHECK", "c1").run(&base, &dp);
    assert_eq!(err["code"], 7);
    // CHECK did not exist before 0.4.0.
    let old = conf(dir.path(), "0.3.1", r#"{"subnet":"10.244.1.0/24"}"#);
    let (err, _) = Call::new("CHECK", "c1").run(&old, &dp);
    assert_eq!(err["code"], 1);
    assert_eq!(err["cniVersion"], "0.3.1");
}

#[test]
fn errors_are_spec_json_with_their_codes() {
    let dir = tempfile::tempdir().unwrap();
    let dp = FakeDataplane::default();
    let (err, code) = Call::new("ADD", "c1").run(
        &conf(dir.path(), "2.0.0", r#"{"subnet":"10.0.0.0/24"}"#),
        &dp,
    );
    assert_eq!(code, 1);
    assert_eq!(err["code"], 1);
    assert_eq!(err["cniVersion"], "1.1.0");
    assert_eq!(err["msg"], "incompatible CNI versions");
    let (err, _) =
        Call::new("ADD", "c1").run(&conf(dir.path(), "1.0.0", r#"{"subnet":"bogus"}"#), &dp);
    assert_eq!(err["code"], 6);
    let (err, _) = Call::new("ADD", "c1").run(&conf(dir.path(), "1.0.0", r#"{}"#), &dp);
    assert_eq!(err["code"], 7);
    assert_eq!(err["cniVersion"], "1.0.0");
    let mut missing = Call::new("ADD", "c1");
    missing.env.remove("CNI_IFNAME");
    let (err, _) = missing.run(
        &conf(dir.path(), "1.0.0", r#"{"subnet":"10.0.0.0/24"}"#),
        &dp,
    );
    assert_eq!(err["code"], 4);
    assert!(
        dp.calls.lock().unwrap().is_empty(),
        "nothing reached the kernel"
    );
}

#[test]
fn a_failed_attach_frees_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let dp = FakeDataplane::default();
    let c = conf(dir.path(), "1.0.0", r#"{"subnet":"10.244.1.0/24"}"#);
    *dp.fail_attach.lock().unwrap() = Some("boom".into());
    let (err, code) = Call::new("ADD", "c1").run(&c, &dp);
    assert_eq!((err["code"].as_u64(), code), (Some(999), 1));
    let held = Store::new(dir.path().join("k8s"))
        .lock()
        .unwrap()
        .get("c1", "eth0", &conf_subnets())
        .unwrap();
    assert!(held.is_empty());
}

fn conf_subnets() -> Vec<Cidr> {
    vec!["10.244.1.0/24".parse().unwrap()]
}

#[test]
fn version_status_and_gc() {
    let dir = tempfile::tempdir().unwrap();
    let dp = FakeDataplane::default();
    let (v, code) = Call::new("VERSION", "").run("", &dp);
    assert_eq!(code, 0);
    assert_eq!(v["cniVersion"], "1.1.0");
    assert_eq!(
        v["supportedVersions"],
        serde_json::json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );

    let tiny = conf(dir.path(), "1.1.0", r#"{"subnet":"10.0.0.0/30"}"#);
    assert_eq!(Call::new("STATUS", "").run(&tiny, &dp), (Value::Null, 0));
    let (res, _) = Call::new("ADD", "c1").run(&tiny, &dp);
    assert_eq!(res["ips"][0]["address"], "10.0.0.2/30");
    let (err, code) = Call::new("STATUS", "").run(&tiny, &dp);
    assert_eq!((err["code"].as_u64(), code), (Some(50), 1));
    let (err, _) = Call::new("STATUS", "").run(
        &conf(dir.path(), "1.0.0", r#"{"subnet":"10.0.0.0/30"}"#),
        &dp,
    );
    assert_eq!(err["code"], 1);

    let mut gc: Value = serde_json::from_str(&tiny).unwrap();
    gc["cni.dev/valid-attachments"] = serde_json::json!([{"containerID":"c1","ifname":"eth0"}]);
    assert_eq!(
        Call::new("GC", "").run(&gc.to_string(), &dp),
        (Value::Null, 0)
    );
    assert_eq!(
        Call::new("STATUS", "").run(&tiny, &dp).1,
        1,
        "c1 is still valid"
    );
    gc["cni.dev/valid-attachments"] = serde_json::json!([]);
    assert_eq!(
        Call::new("GC", "").run(&gc.to_string(), &dp),
        (Value::Null, 0)
    );
    assert_eq!(Call::new("STATUS", "").run(&tiny, &dp), (Value::Null, 0));
}

#[test]
fn legacy_versions_answer_in_their_own_format() {
    let dir = tempfile::tempdir().unwrap();
    let dp = FakeDataplane::default();
    let (res, code) = Call::new("ADD", "c1").run(
        &conf(dir.path(), "0.3.1", r#"{"subnet":"10.244.1.0/24"}"#),
        &dp,
    );
    assert_eq!(code, 0);
    assert_eq!(res["cniVersion"], "0.3.1");
    assert_eq!(res["ips"][0]["version"], "4");
}

#[test]
fn del_ignores_a_prev_result_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let dp = FakeDataplane::default();
    let base = conf(dir.path(), "1.0.0", r#"{"subnet":"10.244.1.0/24"}"#);
    Call::new("ADD", "c1").run(&base, &dp);
    let mut odd: Value = serde_json::from_str(&base).unwrap();
    odd["prevResult"] = serde_json::json!({"ips": "not a list"});
    assert_eq!(
        Call::new("DEL", "c1").run(&odd.to_string(), &dp),
        (Value::Null, 0)
    );
    assert!(dp.pods.lock().unwrap().is_empty());
    let (err, _) = Call::new("CHECK", "c1").run(&odd.to_string(), &dp);
    assert_eq!(err["code"], 6);
}
