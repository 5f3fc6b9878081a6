//! Expansion as upstream's node expander reports it: events, claim conditions and statuses.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaimCondition, PersistentVolumeClaimStatus, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::events::FakeRecorder;
use crate::volume::csi::client::Capabilities;
use crate::volume::csi::fake::FakeCsiNode;
use crate::volume::volume_claims::Storage;
use crate::volume::volume_claims::fake::FakeStorageApi;
use crate::volume::volume_claims::tests::node_side::{calls, mounted_always, storage};
use crate::volume::volume_claims::tests::{claim_vol, pod};

const CAPS: Capabilities = Capabilities {
    expand: true,
    stage_unstage: true,
    volume_stats: false,
    volume_condition: false,
    volume_mount_group: false,
};

/// Storage whose claim `ns/data` (1Gi) waits for the node to grow its PV to 2Gi.
async fn pending(
    root: &std::path::Path,
    mounted: fn(&std::path::Path) -> bool,
) -> (
    Storage,
    Arc<FakeStorageApi>,
    Arc<FakeCsiNode>,
    Arc<FakeRecorder>,
) {
    let (s, api, node) =
        storage(root, CAPS, "2Gi", "1Gi", Some("NodeResizePending"), mounted).await;
    let rec = Arc::new(FakeRecorder::default());
    (s.with_events(rec.clone()), api, node, rec)
}

fn status(api: &FakeStorageApi) -> PersistentVolumeClaimStatus {
    api.claims.lock().unwrap()["ns/data"]
        .status
        .clone()
        .unwrap()
}

fn condition(
    st: &PersistentVolumeClaimStatus,
    kind: &str,
) -> Option<PersistentVolumeClaimCondition> {
    st.conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind)
        .cloned()
}

const DRIVER_ERROR: &str = "Expander.NodeExpand failed to expand the volume : rpc error: code = Internal desc = resize2fs exploded";

#[tokio::test]
async fn a_successful_expansion_is_an_event_on_the_pod_and_the_claim() {
    let root = tempfile::tempdir().unwrap();
    let (s, _api, _node, rec) = pending(root.path(), mounted_always).await;
    s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
    // The volume spec's name (the PV's) and the node, as upstream's GenerateMsg: once on the
    // pod, once on the claim.
    let ok = "Normal FileSystemResizeSuccessful MountVolume.NodeExpandVolume succeeded for volume \"pv-data\" node-a";
    assert_eq!(rec.events(), vec![ok.to_string(), ok.to_string()]);
}

#[tokio::test]
async fn a_final_failure_on_a_mounted_volume_marks_the_claim_and_the_pod_keeps_its_mount() {
    let root = tempfile::tempdir().unwrap();
    let (s, api, node, rec) = pending(root.path(), mounted_always).await;
    node.fail_on("expand", "Internal", "resize2fs exploded");
    s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
    assert_eq!(
        rec.events(),
        vec![format!(
            "Warning VolumeResizeFailed NodeExpandVolume.NodeExpandVolume failed for volume \"pv-data\" : {DRIVER_ERROR}"
        )]
    );
    let st = status(&api);
    let cond = condition(&st, "NodeResizeError").expect("a NodeResizeError condition");
    assert_eq!(cond.status, "True");
    assert_eq!(
        cond.message.as_deref(),
        Some(format!("failed to expand pvc with {DRIVER_ERROR}").as_str())
    );
    assert!(cond.last_transition_time.is_some());
    // Not infeasible yet: the claim still asks for the PV's size; the node tries again.
    assert_eq!(
        st.allocated_resource_statuses.unwrap()["storage"],
        "NodeResizeInProgress"
    );
    assert_eq!(st.capacity.unwrap()["storage"], Quantity("1Gi".into()));
    // A second failure with another message keeps the first condition as it is (upstream's
    // merge keeps a condition whose status did not change).
    node.fail_on("expand", "Internal", "still broken");
    s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
    assert_eq!(calls(&node, "expand").len(), 2);
    let st = status(&api);
    let conds: Vec<_> = st
        .conditions
        .iter()
        .flatten()
        .filter(|c| c.type_ == "NodeResizeError")
        .collect();
    assert_eq!(conds.len(), 1);
    assert_eq!(conds[0].message, cond.message);
}

#[tokio::test]
async fn after_a_final_failure_a_changed_request_makes_the_expansion_infeasible() {
    let root = tempfile::tempdir().unwrap();
    let (s, api, node, _rec) = pending(root.path(), mounted_always).await;
    node.fail_on("expand", "OutOfRange", "too big for this node");
    s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
    assert_eq!(
        status(&api).allocated_resource_statuses.unwrap()["storage"],
        "NodeResizeInProgress"
    );
    // The user asks for less than the PV's new size to recover (upstream's
    // RecoverVolumeExpansionFailure): the next final failure marks the node's part infeasible.
    api.claims
        .lock()
        .unwrap()
        .get_mut("ns/data")
        .unwrap()
        .spec
        .as_mut()
        .unwrap()
        .resources = Some(VolumeResourceRequirements {
        requests: Some([("storage".to_string(), Quantity("1536Mi".into()))].into()),
        ..Default::default()
    });
    s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
    let st = status(&api);
    assert_eq!(
        st.allocated_resource_statuses.as_ref().unwrap()["storage"],
        "NodeResizeInfeasible"
    );
    assert!(condition(&st, "NodeResizeError").is_some());
    // Infeasible is the resizer's to reconcile: the node does not try again.
    s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
    assert_eq!(calls(&node, "expand").len(), 2);
}

#[tokio::test]
async fn a_failure_while_mounting_fails_the_mount_and_an_uncertain_one_leaves_the_claim() {
    let root = tempfile::tempdir().unwrap();
    let real = crate::volume::csi::mounter::is_mounted;
    let (s, api, node, rec) = pending(root.path(), real).await;
    node.fail_on("expand", "Internal", "resize2fs exploded");
    let e = s
        .set_up(&pod(), &claim_vol("data", "data"))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        format!(
            "MountVolume.Setup failed while expanding volume for volume \"pv-data\" : {DRIVER_ERROR}"
        )
    );
    // The mount's error is the FailedMount event (the volume manager's), not a resize event.
    assert!(rec.events().is_empty());
    assert!(condition(&status(&api), "NodeResizeError").is_some());
    // A timeout may still be running in the driver: the claim is not marked failed.
    let (s, api, node, _rec) = pending(root.path(), real).await;
    node.fail_on("expand", "DeadlineExceeded", "context deadline exceeded");
    assert!(s.set_up(&pod(), &claim_vol("data", "data")).await.is_err());
    let st = status(&api);
    assert!(condition(&st, "NodeResizeError").is_none());
    assert_eq!(
        st.allocated_resource_statuses.unwrap()["storage"],
        "NodeResizeInProgress"
    );
}

#[tokio::test]
async fn failed_precondition_stops_online_tries_without_failing_anything() {
    let root = tempfile::tempdir().unwrap();
    let (s, api, node, rec) = pending(root.path(), mounted_always).await;
    node.fail_on("expand", "FailedPrecondition", "volume in use");
    s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
    // No VolumeResizeFailed (upstream returns no error), but the claim says why.
    assert!(rec.events().is_empty());
    assert!(condition(&status(&api), "NodeResizeError").is_some());
    // The mounted volume is not asked again on this node.
    s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
    assert_eq!(calls(&node, "expand").len(), 1);
}

#[tokio::test]
async fn a_read_only_volume_is_not_grown_and_says_so_once() {
    let root = tempfile::tempdir().unwrap();
    let (s, api, node, rec) = pending(root.path(), mounted_always).await;
    let mut v = claim_vol("data", "data");
    v.persistent_volume_claim.as_mut().unwrap().read_only = Some(true);
    s.set_up(&pod(), &v).await.unwrap();
    s.set_up(&pod(), &v).await.unwrap();
    assert!(calls(&node, "expand").is_empty());
    assert!(api.status_patches.lock().unwrap().is_empty());
    let w = "Warning FileSystemResizeFailed MountVolume.NodeExpandVolume failed for volume \"pv-data\" requested read-only file system";
    assert_eq!(rec.events(), vec![w.to_string(), w.to_string()]);
}
