//! Devices for containers: the device manager (`device_plugins`: device plugins registered on
//! `<root-dir>/device-plugins/kubelet.sock`, their allocations and health, upstream's
//! `pkg/kubelet/cm/devicemanager`) and dynamic resource allocation (`dra`: ResourceClaims
//! prepared by the drivers' kubelet plugins, the node's ResourceSlices, upstream's
//! `pkg/kubelet/cm/dra`). Both checkpoint what they handed out under the root dir; their
//! metric families are in `metrics` (`devices`, `dra`).

mod device_plugins;
mod dra;

pub use device_plugins::{
    DIR_NAME as DEVICE_PLUGINS_DIR, DeviceEntry, DeviceManager, DeviceScope, HealthUpdates,
    RESOURCE_HEALTH_STATUS_GATE, RunOptions,
};
pub use dra::slices::WIPING_DELAY as SLICE_WIPING_DELAY;
pub use dra::{
    ClaimApi, DraError, DraManager, DraPlugin, FAILED_PREPARE_REASON, KubeClaimApi, KubeSliceApi,
    SliceCleanup,
};

/// Test doubles: DRA's fake claim API, plugin and slice API, and the device manager's
/// checkpoint format (to write one as an earlier agent would have).
#[cfg(any(test, feature = "test-util"))]
pub mod testing {
    pub use super::device_plugins::checkpoint as device_checkpoint;
    pub use super::dra::fake::{FakeClaimApi, FakeDraPlugin, FakeSliceApi, claim};
}
