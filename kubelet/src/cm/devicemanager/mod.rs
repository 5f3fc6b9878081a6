//! The device manager (upstream's `pkg/kubelet/cm/devicemanager`).
pub mod checkpoint;
