use std::sync::Arc;

use super::*;
use crate::volume::csi::NodeInfoError;
use crate::volume::csi::fake::{FakeCsiNode, FakeNodeInfo};

fn v(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn versions_parse_as_upstreams_generic_versions() {
    assert_eq!(
        Version::parse_generic("1.0.0").unwrap(),
        Version(vec![1, 0, 0])
    );
    assert_eq!(Version::parse_generic("v1.2").unwrap(), Version(vec![1, 2]));
    assert_eq!(
        Version::parse_generic(" 1.10.3-beta ").unwrap(),
        Version(vec![1, 10, 3])
    );
    for bad in [
        "1",
        "",
        "v",
        "01.0",
        "a.b",
        "1..2",
        "99999999999999999999999.0",
    ] {
        assert!(Version::parse_generic(bad).is_err(), "{bad:?}");
    }
    assert!(Version::parse_generic("1.10").unwrap() > Version::parse_generic("1.9").unwrap());
}

#[test]
fn the_highest_1x_version_is_chosen() {
    assert_eq!(
        highest_supported_version(&v(&["0.3.0", "1.0.0", "1.2.0", "2.0.0"])).unwrap(),
        Version(vec![1, 2, 0])
    );
    assert_eq!(
        highest_supported_version(&v(&["0.3.0"]))
            .unwrap_err()
            .to_string(),
        "highest supported version reported by driver is 0.3.0, must be v1.x"
    );
    assert_eq!(
        highest_supported_version(&v(&["2.0.0", "bogus"]))
            .unwrap_err()
            .to_string(),
        "could not find a highest supported version from versions ([2.0.0 bogus]) reported by this driver: could not parse \"bogus\" as version"
    );
}

fn handler() -> (
    RegistrationHandler,
    Arc<CsiDrivers>,
    Arc<FakeCsiNode>,
    Arc<FakeNodeInfo>,
) {
    let drivers = Arc::new(CsiDrivers::default());
    let node = Arc::new(FakeCsiNode::default());
    node.info.lock().unwrap().node_id = "node-a".into();
    node.info.lock().unwrap().max_volumes_per_node = 16;
    let info = Arc::new(FakeNodeInfo::default());
    let n = node.clone();
    let h = RegistrationHandler::new(
        drivers.clone(),
        Arc::new(move |_: &str| n.clone() as Arc<dyn CsiNode>),
        Some(info.clone()),
    );
    (h, drivers, node, info)
}

#[tokio::test]
async fn registration_asks_node_get_info_and_records_the_node() {
    let (h, drivers, node, info) = handler();
    h.validate("csi.example.com", "/p/csi.sock", &v(&["1.0.0"]))
        .await
        .unwrap();
    h.register("csi.example.com", "/p/csi.sock", &v(&["1.0.0"]))
        .await
        .unwrap();
    assert_eq!(node.calls(), vec!["node_get_info"]);
    assert_eq!(
        info.calls.lock().unwrap().clone(),
        vec!["install csi.example.com node-a 16 {}"]
    );
    assert_eq!(
        drivers.get("csi.example.com").unwrap().endpoint,
        "/p/csi.sock"
    );
    h.deregister("csi.example.com").await;
    assert!(drivers.get("csi.example.com").is_none());
    assert_eq!(
        info.calls.lock().unwrap().last().unwrap(),
        "uninstall csi.example.com"
    );
}

#[tokio::test]
async fn a_failing_node_get_info_leaves_no_driver_behind() {
    let (h, drivers, node, info) = handler();
    node.fail_on("node_get_info", "Unavailable", "driver not ready");
    let e = h.register("d", "/s", &v(&["1.0.0"])).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "rpc error: code = Unavailable desc = driver not ready"
    );
    assert!(matches!(
        e.downcast_ref::<CsiError>(),
        Some(CsiError::Rpc(_))
    ));
    assert!(drivers.get("d").is_none());
    assert!(info.calls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_failing_cluster_update_leaves_no_driver_behind() {
    let (h, drivers, _node, info) = handler();
    *info.fail_install.lock().unwrap() = Some(NodeInfoError::Api("forbidden".into()));
    assert_eq!(
        h.register("d", "/s", &v(&["1.0.0"]))
            .await
            .unwrap_err()
            .to_string(),
        "forbidden"
    );
    assert!(drivers.get("d").is_none());
}

#[tokio::test]
async fn validation_refuses_bad_versions_and_duplicates_with_upstreams_messages() {
    let (h, _drivers, _node, _info) = handler();
    assert_eq!(
        h.validate("d", "/s", &[]).await.unwrap_err().to_string(),
        "validation failed for CSI Driver d at endpoint /s: kubernetes.io/csi: ValidatePlugin for CSI driver \"d\" failed. Plugin returned an empty list for supported versions"
    );
    let e = h.validate("d", "/s", &v(&["0.3.0"])).await.unwrap_err();
    assert!(e.to_string().ends_with("None of the versions specified [\"0.3.0\"] are supported. err=highest supported version reported by driver is 0.3.0, must be v1.x"), "{e}");
    h.register("d", "/s", &v(&["1.0.0"])).await.unwrap();
    let e = h.validate("d", "/s2", &v(&["1.0.0"])).await.unwrap_err();
    assert!(e.to_string().ends_with("Another driver with the same name is already registered with a higher supported version: \"1.0.0\""), "{e}");
    // A higher version replaces it.
    h.validate("d", "/s2", &v(&["1.1.0"])).await.unwrap();
}
