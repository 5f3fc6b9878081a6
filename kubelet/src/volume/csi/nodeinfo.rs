//! The node's record of its CSI drivers in the cluster (upstream's nodeinfomanager): the Node's
//! `csi.volume.kubernetes.io/nodeid` annotation (a JSON map of driver name to the driver's
//! node ID) and topology labels, and the CSINode object named after the node (owned by the
//! Node) with one `spec.drivers[]` entry per driver. The edits are pure functions; the
//! apiserver calls are behind [`NodeInfoApi`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::objects::timed;

/// The Node annotation holding every driver's node ID.
pub const ANNOTATION_NODE_ID: &str = "csi.volume.kubernetes.io/nodeid";
/// The CSINode annotation listing the in-tree plugins migrated to CSI.
pub const ANNOTATION_MIGRATED_PLUGINS: &str = "storage.alpha.kubernetes.io/migrated-plugins";
/// In-tree plugins whose volumes go through CSI (all migrated and locked on in v1.36), sorted
/// as upstream joins them.
pub const MIGRATED_PLUGINS: [&str; 7] = [
    "kubernetes.io/aws-ebs",
    "kubernetes.io/azure-disk",
    "kubernetes.io/azure-file",
    "kubernetes.io/cinder",
    "kubernetes.io/gce-pd",
    "kubernetes.io/portworx-volume",
    "kubernetes.io/vsphere-volume",
];

/// Where a driver's node information is recorded.
/// Why the node's record of a CSI driver could not be written (upstream's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeInfoError {
    #[error(
        "failed to parse node's {:?} annotation value ({value:?}) err={message}",
        ANNOTATION_NODE_ID
    )]
    BadAnnotation { value: String, message: String },
    #[error(
        "detected topology value collision: driver reported {key:?}:{value:?} but existing label is {key:?}:{existing:?}"
    )]
    TopologyCollision {
        key: String,
        value: String,
        existing: String,
    },
    #[error("{0}")]
    Encode(String),
    /// An apiserver request failed.
    #[error("{0}")]
    Api(String),
    /// Every attempt failed.
    #[error("timed out waiting for the condition; caused by: [{}]", join(.0))]
    Retries(Vec<NodeInfoError>),
    #[error("error adding CSI driver node info: driverNodeID must not be empty")]
    EmptyNodeId,
    #[error("error updating Node object with CSI driver node info: error updating node: {0}")]
    UpdateNode(Box<NodeInfoError>),
    #[error("error updating CSINode object with CSI driver node info: error updating CSINode: {0}")]
    UpdateCsiNode(Box<NodeInfoError>),
    #[error("error uninstalling CSI driver from CSINode object {0}")]
    UninstallCsiNode(Box<NodeInfoError>),
    #[error("error removing CSI driver node info from Node object {0}")]
    UninstallNode(Box<NodeInfoError>),
}

fn join(errs: &[NodeInfoError]) -> String {
    let v: Vec<String> = errs.iter().map(ToString::to_string).collect();
    v.join(", ")
}

impl From<kube::Error> for NodeInfoError {
    fn from(e: kube::Error) -> Self {
        NodeInfoError::Api(e.to_string())
    }
}

impl From<serde_json::Error> for NodeInfoError {
    fn from(e: serde_json::Error) -> Self {
        NodeInfoError::Encode(e.to_string())
    }
}

#[async_trait::async_trait]
pub trait NodeInfoApi: Send + Sync {
    async fn install(
        &self,
        driver: &str,
        node_id: &str,
        max_volumes: i64,
        topology: &BTreeMap<String, String>,
    ) -> Result<(), NodeInfoError>;
    async fn uninstall(&self, driver: &str) -> Result<(), NodeInfoError>;
}

fn parse_ids(node: &Node) -> Result<BTreeMap<String, String>, NodeInfoError> {
    let prev = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_NODE_ID))
        .map(String::as_str)
        .unwrap_or("");
    if prev.is_empty() {
        return Ok(BTreeMap::new());
    }
    serde_json::from_str(prev).map_err(|e| NodeInfoError::BadAnnotation {
        value: prev.to_string(),
        message: e.to_string(),
    })
}

/// The Node's annotations and labels after installing a driver, or None when unchanged.
pub fn node_install(
    node: &Node,
    driver: &str,
    node_id: &str,
    topology: &BTreeMap<String, String>,
) -> Result<Option<serde_json::Value>, NodeInfoError> {
    let mut ids = parse_ids(node)?;
    let mut patch = serde_json::Map::new();
    if ids.get(driver).map(String::as_str) != Some(node_id) {
        ids.insert(driver.to_string(), node_id.to_string());
        let v = serde_json::to_string(&ids)?;
        patch.insert(
            "annotations".into(),
            serde_json::json!({ ANNOTATION_NODE_ID: v }),
        );
    }
    if !topology.is_empty() {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        for (k, v) in topology {
            if let Some(cur) = labels.get(k)
                && cur != v
            {
                return Err(NodeInfoError::TopologyCollision {
                    key: k.clone(),
                    value: v.clone(),
                    existing: cur.clone(),
                });
            }
        }
        patch.insert(
            "labels".into(),
            serde_json::to_value(topology).unwrap_or_default(),
        );
    }
    Ok((!patch.is_empty()).then(|| serde_json::json!({ "metadata": patch })))
}

/// The Node patch that removes a driver's node ID, or None when it is not there.
pub fn node_uninstall(
    node: &Node,
    driver: &str,
) -> Result<Option<serde_json::Value>, NodeInfoError> {
    let mut ids = parse_ids(node)?;
    if ids.remove(driver).is_none() {
        return Ok(None);
    }
    let v = if ids.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::Value::String(serde_json::to_string(&ids)?)
    };
    Ok(Some(
        serde_json::json!({ "metadata": { "annotations": { ANNOTATION_NODE_ID: v } } }),
    ))
}

/// A new CSINode for `node` (owned by it, no drivers yet).
pub fn new_csinode(node: &Node) -> CSINode {
    let mut c = CSINode {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: node.metadata.name.clone(),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.metadata.name.clone().unwrap_or_default(),
                uid: node.metadata.uid.clone().unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: CSINodeSpec { drivers: vec![] },
    };
    set_migration_annotation(&mut c);
    c
}

/// Sets the migrated-plugins annotation; true when it changed.
pub fn set_migration_annotation(c: &mut CSINode) -> bool {
    let want = MIGRATED_PLUGINS.join(",");
    let annotations = c.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let old: BTreeSet<&str> = annotations
        .get(ANNOTATION_MIGRATED_PLUGINS)
        .map(|s| s.split(',').filter(|p| !p.is_empty()).collect())
        .unwrap_or_default();
    if old == MIGRATED_PLUGINS.into_iter().collect() {
        return false;
    }
    annotations.insert(ANNOTATION_MIGRATED_PLUGINS.into(), want);
    true
}

/// Puts the driver's entry into the CSINode; true when the object changed.
pub fn csinode_install(
    c: &mut CSINode,
    driver: &str,
    node_id: &str,
    max_volumes: i64,
    topology: &BTreeMap<String, String>,
) -> bool {
    let keys: Vec<String> = topology.keys().cloned().collect();
    let mut modified = true;
    let mut others = Vec::new();
    for d in c.spec.drivers.drain(..) {
        if d.name == driver {
            let old: BTreeSet<&String> = d.topology_keys.iter().flatten().collect();
            if d.node_id == node_id && old == keys.iter().collect() {
                modified = false;
            }
        } else {
            others.push(d);
        }
    }
    let annotation = set_migration_annotation(c);
    let entry = CSINodeDriver {
        name: driver.to_string(),
        node_id: node_id.to_string(),
        topology_keys: Some(keys),
        allocatable: (max_volumes > 0).then(|| VolumeNodeResources {
            count: Some(i32::try_from(max_volumes).unwrap_or(i32::MAX)),
        }),
    };
    if !modified && !annotation {
        // Unchanged: the entry goes back where the list keeps it.
        others.push(entry);
        c.spec.drivers = others;
        return false;
    }
    others.push(entry);
    c.spec.drivers = others;
    true
}

/// Removes the driver's entry; true when there was one.
pub fn csinode_uninstall(c: &mut CSINode, driver: &str) -> bool {
    let before = c.spec.drivers.len();
    c.spec.drivers.retain(|d| d.name != driver);
    c.spec.drivers.len() != before
}

/// Attempts of each update (upstream's updateBackoff: 4 steps from 10 ms, factor 5).
const ATTEMPTS: u32 = 4;

/// [`NodeInfoApi`] over the apiserver.
pub struct KubeNodeInfo {
    pub client: crate::objects::ClientHandle,
    pub node_name: String,
    /// One update at a time (upstream's lock).
    lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for KubeNodeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeNodeInfo")
            .field("node_name", &self.node_name)
            .finish()
    }
}

async fn retry<F, Fut>(mut f: F) -> Result<(), NodeInfoError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), NodeInfoError>>,
{
    let mut delay = Duration::from_millis(10);
    let mut errs = Vec::new();
    for _ in 0..ATTEMPTS {
        match f().await {
            Ok(()) => return Ok(()),
            Err(e) => errs.push(e),
        }
        tokio::time::sleep(delay).await;
        delay *= 5;
    }
    Err(NodeInfoError::Retries(errs))
}

impl KubeNodeInfo {
    pub fn new(client: crate::objects::ClientHandle, node_name: String) -> Self {
        KubeNodeInfo {
            client,
            node_name,
            lock: tokio::sync::Mutex::new(()),
        }
    }

    fn nodes(&self) -> kube::Api<Node> {
        kube::Api::all(self.client.current())
    }

    fn csinodes(&self) -> kube::Api<CSINode> {
        kube::Api::all(self.client.current())
    }

    async fn patch_node(
        &self,
        edit: impl Fn(&Node) -> Result<Option<serde_json::Value>, NodeInfoError>,
    ) -> Result<(), NodeInfoError> {
        let node = self.nodes().get(&self.node_name).await?;
        if let Some(patch) = edit(&node)? {
            self.nodes()
                .patch(
                    &self.node_name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await?;
        }
        Ok(())
    }

    async fn edit_csinode(
        &self,
        create: bool,
        edit: impl Fn(&mut CSINode) -> bool,
    ) -> Result<(), NodeInfoError> {
        let api = self.csinodes();
        let mut c = match api.get_opt(&self.node_name).await? {
            Some(c) => c,
            None if !create => return Ok(()),
            None => {
                let node = self.nodes().get(&self.node_name).await?;
                api.create(&kube::api::PostParams::default(), &new_csinode(&node))
                    .await?
            }
        };
        if edit(&mut c) {
            timed(api.replace(&self.node_name, &kube::api::PostParams::default(), &c)).await?;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl NodeInfoApi for KubeNodeInfo {
    async fn install(
        &self,
        driver: &str,
        node_id: &str,
        max_volumes: i64,
        topology: &BTreeMap<String, String>,
    ) -> Result<(), NodeInfoError> {
        if node_id.is_empty() {
            return Err(NodeInfoError::EmptyNodeId);
        }
        let _one = self.lock.lock().await;
        retry(|| self.patch_node(|n| node_install(n, driver, node_id, topology)))
            .await
            .map_err(|e| NodeInfoError::UpdateNode(Box::new(e)))?;
        retry(|| {
            self.edit_csinode(true, |c| {
                csinode_install(c, driver, node_id, max_volumes, topology)
            })
        })
        .await
        .map_err(|e| NodeInfoError::UpdateCsiNode(Box::new(e)))
    }

    async fn uninstall(&self, driver: &str) -> Result<(), NodeInfoError> {
        let _one = self.lock.lock().await;
        retry(|| self.edit_csinode(false, |c| csinode_uninstall(c, driver)))
            .await
            .map_err(|e| NodeInfoError::UninstallCsiNode(Box::new(e)))?;
        retry(|| self.patch_node(|n| node_uninstall(n, driver)))
            .await
            .map_err(|e| NodeInfoError::UninstallNode(Box::new(e)))
    }
}

#[cfg(test)]
mod tests;
