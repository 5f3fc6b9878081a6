use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;

use super::*;

fn node(annotation: Option<&str>, labels: &[(&str, &str)]) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some("n1".into());
    n.metadata.uid = Some("uid-1".into());
    if let Some(a) = annotation {
        n.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_NODE_ID.into(), a.into())]));
    }
    n.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    n
}

fn topo(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_node_id_annotation_is_a_json_map_of_drivers() {
    let p = node_install(&node(None, &[]), "b.csi", "id-b", &BTreeMap::new())
        .unwrap()
        .unwrap();
    assert_eq!(
        p,
        serde_json::json!({"metadata": {"annotations": {ANNOTATION_NODE_ID: "{\"b.csi\":\"id-b\"}"}}})
    );
    let p = node_install(
        &node(Some("{\"b.csi\":\"id-b\"}"), &[]),
        "a.csi",
        "id-a",
        &BTreeMap::new(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        p["metadata"]["annotations"][ANNOTATION_NODE_ID],
        "{\"a.csi\":\"id-a\",\"b.csi\":\"id-b\"}"
    );
    // Already there: no patch.
    assert!(
        node_install(
            &node(Some("{\"b.csi\":\"id-b\"}"), &[]),
            "b.csi",
            "id-b",
            &BTreeMap::new()
        )
        .unwrap()
        .is_none()
    );
}

#[test]
fn a_broken_annotation_is_an_error_not_overwritten() {
    let e = node_install(&node(Some("not json"), &[]), "d", "id", &BTreeMap::new()).unwrap_err();
    assert!(e.to_string().starts_with("failed to parse node's \"csi.volume.kubernetes.io/nodeid\" annotation value (\"not json\")"), "{e}");
}

#[test]
fn topology_labels_are_added_and_collisions_refused() {
    let p = node_install(
        &node(Some("{\"d\":\"id\"}"), &[]),
        "d",
        "id",
        &topo(&[("topology.d/zone", "z1")]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        p,
        serde_json::json!({"metadata": {"labels": {"topology.d/zone": "z1"}}})
    );
    let e = node_install(
        &node(None, &[("topology.d/zone", "z2")]),
        "d",
        "id",
        &topo(&[("topology.d/zone", "z1")]),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "detected topology value collision: driver reported \"topology.d/zone\":\"z1\" but existing label is \"topology.d/zone\":\"z2\""
    );
}

#[test]
fn uninstall_removes_the_driver_and_the_annotation_when_empty() {
    let p = node_uninstall(&node(Some("{\"a\":\"1\",\"b\":\"2\"}"), &[]), "a")
        .unwrap()
        .unwrap();
    assert_eq!(
        p["metadata"]["annotations"][ANNOTATION_NODE_ID],
        "{\"b\":\"2\"}"
    );
    let p = node_uninstall(&node(Some("{\"a\":\"1\"}"), &[]), "a")
        .unwrap()
        .unwrap();
    assert!(p["metadata"]["annotations"][ANNOTATION_NODE_ID].is_null());
    assert!(node_uninstall(&node(None, &[]), "a").unwrap().is_none());
}

#[test]
fn csinode_is_owned_by_the_node_and_lists_each_driver_once() {
    let mut c = new_csinode(&node(None, &[]));
    let owner = &c.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Node", "n1", "uid-1")
    );
    assert_eq!(
        c.metadata.annotations.as_ref().unwrap()[ANNOTATION_MIGRATED_PLUGINS],
        "kubernetes.io/aws-ebs,kubernetes.io/azure-disk,kubernetes.io/azure-file,kubernetes.io/cinder,kubernetes.io/gce-pd,kubernetes.io/portworx-volume,kubernetes.io/vsphere-volume"
    );
    assert!(csinode_install(
        &mut c,
        "d",
        "id",
        10,
        &topo(&[("z", "1"), ("a", "2")])
    ));
    assert_eq!(c.spec.drivers.len(), 1);
    let d = &c.spec.drivers[0];
    assert_eq!(d.topology_keys.clone().unwrap(), vec!["a", "z"]);
    assert_eq!(d.allocatable.as_ref().unwrap().count, Some(10));
    // The same again: unchanged.
    assert!(!csinode_install(
        &mut c,
        "d",
        "id",
        10,
        &topo(&[("z", "1"), ("a", "2")])
    ));
    assert_eq!(c.spec.drivers.len(), 1);
    // A new node ID replaces the entry; no limit, no allocatable; a huge one is capped.
    assert!(csinode_install(&mut c, "d", "id2", 0, &BTreeMap::new()));
    assert_eq!(c.spec.drivers.len(), 1);
    assert!(c.spec.drivers[0].allocatable.is_none());
    assert!(csinode_install(
        &mut c,
        "e",
        "id",
        i64::MAX,
        &BTreeMap::new()
    ));
    assert_eq!(
        c.spec.drivers[1].allocatable.as_ref().unwrap().count,
        Some(i32::MAX)
    );
    assert!(csinode_uninstall(&mut c, "d"));
    assert!(!csinode_uninstall(&mut c, "d"));
    assert_eq!(c.spec.drivers.len(), 1);
}
