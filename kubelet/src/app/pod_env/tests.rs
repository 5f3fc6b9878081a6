//! ApiPodEnvironment over the informers' stores, as upstream answers.

use super::*;
use crate::objects::services::{ServiceInfo, ServicePort};

fn svc(ns: &str, name: &str, ip: &str, port: i32) -> (String, ServiceInfo) {
    let info = ServiceInfo {
        namespace: ns.into(),
        name: name.into(),
        cluster_ip: ip.into(),
        ports: vec![ServicePort {
            name: String::new(),
            port,
            protocol: "TCP".into(),
        }],
    };
    (format!("{ns}/{name}"), info)
}

fn pod(source: &str, links: bool) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default",
            "annotations": {crate::podspec::ANN_CONFIG_SOURCE: source}},
        "spec": {"enableServiceLinks": links, "containers": []},
    }))
    .unwrap()
}

#[test]
fn service_links_wait_for_the_first_list_except_for_static_pods() {
    let store = Arc::new(ServiceStore::default());
    let env = ApiPodEnvironment {
        services: Some(store.clone()),
        runtime_classes: None,
        objects: None,
    };
    assert!(matches!(
        env.service_env(&pod("api", true)),
        Err(PodEnvError::Services(_))
    ));
    assert_eq!(env.service_env(&pod("file", true)), Ok(BTreeMap::new()));
    store.replace(
        [
            svc("default", "kubernetes", "10.96.0.1", 443),
            svc("default", "web", "10.96.0.7", 80),
        ]
        .into(),
    );
    let all = env.service_env(&pod("api", true)).unwrap();
    assert_eq!(all["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
    assert_eq!(all["WEB_PORT_80_TCP_ADDR"], "10.96.0.7");
    // Without service links only the master services' variables.
    let some = env.service_env(&pod("api", false)).unwrap();
    assert_eq!(some["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
    assert!(!some.keys().any(|k| k.starts_with("WEB_")), "{some:?}");
    // Standalone: no variables.
    let standalone = ApiPodEnvironment::default();
    assert_eq!(
        standalone.service_env(&pod("api", true)),
        Ok(BTreeMap::new())
    );
}

#[test]
fn runtime_class_handlers_with_upstreams_messages() {
    let classes = Arc::new(RuntimeClassStore::default());
    classes.replace([("fast".to_string(), "runc-fast".to_string())].into());
    let env = ApiPodEnvironment {
        services: None,
        runtime_classes: Some(classes),
        objects: None,
    };
    assert_eq!(env.runtime_handler(None), Ok(String::new()));
    assert_eq!(env.runtime_handler(Some("fast")), Ok("runc-fast".into()));
    assert_eq!(
        env.runtime_handler(Some("nope")),
        Err(PodEnvError::RuntimeClass(
            "runtimeclass.node.k8s.io \"nope\" not found".into()
        ))
    );
    let standalone = ApiPodEnvironment::default().runtime_handler(Some("fast"));
    assert!(
        matches!(&standalone, Err(PodEnvError::RuntimeClass(m)) if m.contains("standalone")),
        "{standalone:?}"
    );
}
