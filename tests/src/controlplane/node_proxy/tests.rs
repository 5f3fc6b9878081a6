use super::*;
use serde_json::json;

#[test]
fn proxy_paths_keep_what_is_below_proxy() {
    assert_eq!(
        parse("/api/v1/nodes/n1/proxy/logs/"),
        Some(("n1".into(), "/logs/".into()))
    );
    assert_eq!(
        parse("/api/v1/nodes/n1/proxy/debug/flags/v"),
        Some(("n1".into(), "/debug/flags/v".into()))
    );
    assert_eq!(
        parse("/api/v1/nodes/n1/proxy"),
        Some(("n1".into(), "/".into()))
    );
    assert_eq!(parse("/api/v1/nodes/n1/proxyx/a"), None);
    assert_eq!(parse("/api/v1/nodes/n1/status"), None);
    assert_eq!(parse("/api/v1/nodes/n1"), None);
    assert_eq!(parse("/api/v1/nodes//proxy/a"), None);
}

#[test]
fn the_kubelet_is_found_at_the_preferred_address_and_its_port() {
    let node = json!({"status": {
        "addresses": [
            {"type": "Hostname", "address": "node-a"},
            {"type": "InternalIP", "address": "10.0.0.7"},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10255}},
    }});
    assert_eq!(kubelet_address(&node).unwrap(), "10.0.0.7:10255");
    let v6 = json!({"status": {"addresses": [{"type": "InternalIP", "address": "fd00::7"}]}});
    assert_eq!(kubelet_address(&v6).unwrap(), "[fd00::7]:10250");
    let none = json!({"status": {"addresses": [{"type": "InternalDNS", "address": "a.b"}]}});
    let e = kubelet_address(&none).unwrap_err();
    assert_eq!(e.code, 503);
    assert!(
        e.to_status()["message"]
            .as_str()
            .unwrap()
            .starts_with("no preferred addresses found; known addresses: [{InternalDNS a.b}]"),
        "{:?}",
        e.to_status()
    );
}
