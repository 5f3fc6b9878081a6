//! Recording fakes of a CSI driver's Node service and of the cluster record, for tests.

use std::collections::BTreeMap;
use std::sync::Mutex;

use cri_proto::plugins::csi;

use super::client::{Capabilities, CsiNode, CsiStatus, NodeInfo, VolumeStats};
use super::nodeinfo::{NodeInfoApi, NodeInfoError};

/// A driver that answers from its fields and records each call as a line.
#[derive(Debug, Default)]
pub struct FakeCsiNode {
    pub info: Mutex<NodeInfo>,
    pub caps: Mutex<Capabilities>,
    pub stats: Mutex<VolumeStats>,
    /// Calls named here (`stage`, `publish`, `node_get_info`, ...) fail with this error.
    pub fail: Mutex<BTreeMap<String, CsiStatus>>,
    pub calls: Mutex<Vec<String>>,
    pub stage_requests: Mutex<Vec<csi::NodeStageVolumeRequest>>,
    pub publish_requests: Mutex<Vec<csi::NodePublishVolumeRequest>>,
    pub expand_requests: Mutex<Vec<csi::NodeExpandVolumeRequest>>,
}

impl FakeCsiNode {
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    pub fn fail_on(&self, call: &str, code: &str, message: &str) {
        self.fail.lock().unwrap().insert(
            call.into(),
            CsiStatus {
                code: code.into(),
                message: message.into(),
            },
        );
    }

    fn record(&self, call: &str, detail: String) -> Result<(), CsiStatus> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("{call} {detail}").trim_end().to_string());
        match self.fail.lock().unwrap().get(call) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

#[async_trait::async_trait]
impl CsiNode for FakeCsiNode {
    async fn node_get_info(&self) -> Result<NodeInfo, CsiStatus> {
        self.record("node_get_info", String::new())?;
        Ok(self.info.lock().unwrap().clone())
    }
    async fn capabilities(&self) -> Result<Capabilities, CsiStatus> {
        self.record("capabilities", String::new())?;
        Ok(*self.caps.lock().unwrap())
    }
    async fn stage(&self, req: csi::NodeStageVolumeRequest) -> Result<(), CsiStatus> {
        self.stage_requests.lock().unwrap().push(req.clone());
        self.record(
            "stage",
            format!("{} {}", req.volume_id, req.staging_target_path),
        )
    }
    async fn unstage(&self, volume_id: &str, staging_path: &str) -> Result<(), CsiStatus> {
        self.record("unstage", format!("{volume_id} {staging_path}"))
    }
    async fn publish(&self, req: csi::NodePublishVolumeRequest) -> Result<(), CsiStatus> {
        self.publish_requests.lock().unwrap().push(req.clone());
        self.record("publish", format!("{} {}", req.volume_id, req.target_path))
    }
    async fn unpublish(&self, volume_id: &str, target_path: &str) -> Result<(), CsiStatus> {
        self.record("unpublish", format!("{volume_id} {target_path}"))
    }
    async fn volume_stats(
        &self,
        volume_id: &str,
        volume_path: &str,
        _staging_path: &str,
    ) -> Result<VolumeStats, CsiStatus> {
        self.record("volume_stats", format!("{volume_id} {volume_path}"))?;
        Ok(*self.stats.lock().unwrap())
    }
    async fn expand(&self, req: csi::NodeExpandVolumeRequest) -> Result<i64, CsiStatus> {
        self.expand_requests.lock().unwrap().push(req.clone());
        let bytes = req.capacity_range.map_or(0, |r| r.required_bytes);
        self.record(
            "expand",
            format!("{} {} {bytes}", req.volume_id, req.volume_path),
        )?;
        Ok(bytes)
    }
}

/// Records installs and uninstalls; fails installs when told to.
#[derive(Debug, Default)]
pub struct FakeNodeInfo {
    pub calls: Mutex<Vec<String>>,
    pub fail_install: Mutex<Option<NodeInfoError>>,
}

#[async_trait::async_trait]
impl NodeInfoApi for FakeNodeInfo {
    async fn install(
        &self,
        driver: &str,
        node_id: &str,
        max_volumes: i64,
        topology: &BTreeMap<String, String>,
    ) -> Result<(), NodeInfoError> {
        self.calls.lock().unwrap().push(format!(
            "install {driver} {node_id} {max_volumes} {topology:?}"
        ));
        match self.fail_install.lock().unwrap().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
    async fn uninstall(&self, driver: &str) -> Result<(), NodeInfoError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("uninstall {driver}"));
        Ok(())
    }
}
