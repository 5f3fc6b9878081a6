//! Devices for containers: the device manager (`device_plugins`: device plugins registered on
//! `<root-dir>/device-plugins/kubelet.sock`, their allocations and health, upstream's
//! `pkg/kubelet/cm/devicemanager`) and dynamic resource allocation (`dra`: ResourceClaims
//! prepared by the drivers' kubelet plugins, the node's ResourceSlices, upstream's
//! `pkg/kubelet/cm/dra`). Both checkpoint what they handed out under the root dir; their
//! metric families are in `metrics` (`devices`, `dra`).

pub mod device_plugins;
pub use device_plugins::{DeviceEntry, DeviceManager, DeviceScope, RunOptions};
pub mod dra;
pub use dra::{DraError, DraManager};
