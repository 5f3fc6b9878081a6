//! The `csi.v1` Node service of one driver, over its unix socket. Every call has a deadline
//! (upstream's csiTimeout); the channel dials again after the driver restarts.

use std::time::Duration;

use cri_proto::plugins::csi::{
    self, node_client::NodeClient, node_service_capability, volume_usage,
};

/// Deadline of each call (upstream's csiTimeout).
pub const CSI_TIMEOUT: Duration = Duration::from_secs(120);
/// Dialing the driver's socket.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// A failed call, shown as gRPC-go shows a status (`rpc error: code = Internal desc = ...`),
/// which is what upstream's events carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rpc error: code = {code} desc = {message}")]
pub struct CsiStatus {
    pub code: String,
    pub message: String,
}

impl CsiStatus {
    fn from_status(s: &tonic::Status) -> Self {
        CsiStatus {
            code: crate::runtime::go_code(s.code()).into(),
            message: s.message().into(),
        }
    }

    fn deadline() -> Self {
        CsiStatus {
            code: "DeadlineExceeded".into(),
            message: "context deadline exceeded".into(),
        }
    }

    fn unavailable(detail: String) -> Self {
        CsiStatus {
            code: "Unavailable".into(),
            message: detail,
        }
    }
}

/// What `NodeGetInfo` reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub node_id: String,
    pub max_volumes_per_node: i64,
    pub topology: std::collections::BTreeMap<String, String>,
}

/// The Node capabilities the kubelet acts on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub stage_unstage: bool,
    pub volume_stats: bool,
    pub expand: bool,
    pub volume_condition: bool,
    /// VOLUME_MOUNT_GROUP: the driver applies the pod's fsGroup itself.
    pub volume_mount_group: bool,
}

/// Usage of a published volume (`NodeGetVolumeStats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeStats {
    pub capacity_bytes: i64,
    pub available_bytes: i64,
    pub used_bytes: i64,
    pub inodes: i64,
    pub inodes_free: i64,
    pub inodes_used: i64,
}

/// The Node service of one CSI driver.
#[async_trait::async_trait]
pub trait CsiNode: Send + Sync {
    async fn node_get_info(&self) -> Result<NodeInfo, CsiStatus>;
    async fn capabilities(&self) -> Result<Capabilities, CsiStatus>;
    async fn stage(&self, req: csi::NodeStageVolumeRequest) -> Result<(), CsiStatus>;
    async fn unstage(&self, volume_id: &str, staging_path: &str) -> Result<(), CsiStatus>;
    async fn publish(&self, req: csi::NodePublishVolumeRequest) -> Result<(), CsiStatus>;
    async fn unpublish(&self, volume_id: &str, target_path: &str) -> Result<(), CsiStatus>;
    async fn volume_stats(
        &self,
        volume_id: &str,
        volume_path: &str,
        staging_path: &str,
    ) -> Result<VolumeStats, CsiStatus>;
    /// `NodeExpandVolume`; the capacity the driver reports (0: not reported).
    async fn expand(&self, req: csi::NodeExpandVolumeRequest) -> Result<i64, CsiStatus>;
}

/// The real client: one lazily dialed channel to the driver's socket.
pub struct GrpcCsiNode {
    endpoint: String,
    channel: Option<cri_proto::Channel>,
}

impl std::fmt::Debug for GrpcCsiNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcCsiNode")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl GrpcCsiNode {
    /// A client of the socket at `endpoint` (`unix:///path` or `/path`); nothing is dialed yet.
    pub fn new(endpoint: &str) -> Self {
        GrpcCsiNode {
            endpoint: endpoint.to_string(),
            channel: cri_proto::connect_lazy(endpoint, DIAL_TIMEOUT).ok(),
        }
    }

    fn client(&self) -> Result<NodeClient<cri_proto::Channel>, CsiStatus> {
        self.channel
            .clone()
            .map(NodeClient::new)
            .ok_or_else(|| CsiStatus::unavailable(format!("invalid endpoint {:?}", self.endpoint)))
    }
}

async fn call<T>(
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, CsiStatus> {
    match tokio::time::timeout(CSI_TIMEOUT, f).await {
        Err(_) => Err(CsiStatus::deadline()),
        Ok(Err(s)) => Err(CsiStatus::from_status(&s)),
        Ok(Ok(r)) => Ok(r.into_inner()),
    }
}

#[async_trait::async_trait]
impl CsiNode for GrpcCsiNode {
    async fn node_get_info(&self) -> Result<NodeInfo, CsiStatus> {
        let r = call(self.client()?.node_get_info(csi::NodeGetInfoRequest {})).await?;
        Ok(NodeInfo {
            node_id: r.node_id,
            max_volumes_per_node: r.max_volumes_per_node,
            topology: r
                .accessible_topology
                .map(|t| t.segments.into_iter().collect())
                .unwrap_or_default(),
        })
    }

    async fn capabilities(&self) -> Result<Capabilities, CsiStatus> {
        let r = call(
            self.client()?
                .node_get_capabilities(csi::NodeGetCapabilitiesRequest {}),
        )
        .await?;
        Ok(capabilities_of(&r))
    }

    async fn stage(&self, req: csi::NodeStageVolumeRequest) -> Result<(), CsiStatus> {
        call(self.client()?.node_stage_volume(req))
            .await
            .map(|_| ())
    }

    async fn unstage(&self, volume_id: &str, staging_path: &str) -> Result<(), CsiStatus> {
        call(
            self.client()?
                .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                    volume_id: volume_id.into(),
                    staging_target_path: staging_path.into(),
                }),
        )
        .await
        .map(|_| ())
    }

    async fn publish(&self, req: csi::NodePublishVolumeRequest) -> Result<(), CsiStatus> {
        call(self.client()?.node_publish_volume(req))
            .await
            .map(|_| ())
    }

    async fn unpublish(&self, volume_id: &str, target_path: &str) -> Result<(), CsiStatus> {
        call(
            self.client()?
                .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                    volume_id: volume_id.into(),
                    target_path: target_path.into(),
                }),
        )
        .await
        .map(|_| ())
    }

    async fn volume_stats(
        &self,
        volume_id: &str,
        volume_path: &str,
        staging_path: &str,
    ) -> Result<VolumeStats, CsiStatus> {
        let r = call(
            self.client()?
                .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                    volume_id: volume_id.into(),
                    volume_path: volume_path.into(),
                    staging_target_path: staging_path.into(),
                }),
        )
        .await?;
        Ok(stats_of(&r))
    }

    async fn expand(&self, req: csi::NodeExpandVolumeRequest) -> Result<i64, CsiStatus> {
        let r = call(self.client()?.node_expand_volume(req)).await?;
        Ok(r.capacity_bytes)
    }
}

/// The capabilities a `NodeGetCapabilities` answer lists.
pub fn capabilities_of(r: &csi::NodeGetCapabilitiesResponse) -> Capabilities {
    use node_service_capability::rpc::Type;
    let mut c = Capabilities::default();
    for cap in &r.capabilities {
        let Some(node_service_capability::Type::Rpc(rpc)) = &cap.r#type else {
            continue;
        };
        match Type::try_from(rpc.r#type) {
            Ok(Type::StageUnstageVolume) => c.stage_unstage = true,
            Ok(Type::GetVolumeStats) => c.volume_stats = true,
            Ok(Type::ExpandVolume) => c.expand = true,
            Ok(Type::VolumeCondition) => c.volume_condition = true,
            Ok(Type::VolumeMountGroup) => c.volume_mount_group = true,
            _ => {}
        }
    }
    c
}

/// Bytes and inodes from a `NodeGetVolumeStats` answer (negative numbers, which the spec
/// forbids, count as 0).
pub fn stats_of(r: &csi::NodeGetVolumeStatsResponse) -> VolumeStats {
    let mut s = VolumeStats::default();
    for u in &r.usage {
        let (total, avail, used) = (u.total.max(0), u.available.max(0), u.used.max(0));
        match volume_usage::Unit::try_from(u.unit) {
            Ok(volume_usage::Unit::Bytes) => {
                s.capacity_bytes = total;
                s.available_bytes = avail;
                s.used_bytes = used;
            }
            Ok(volume_usage::Unit::Inodes) => {
                s.inodes = total;
                s.inodes_free = avail;
                s.inodes_used = used;
            }
            _ => {}
        }
    }
    s
}
