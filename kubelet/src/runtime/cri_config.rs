//! CRI `RuntimeConfig` (the runtime's cgroup driver) as the CRI client reads it.

use super::{Result, RuntimeCgroupDriver, RuntimeError};
use cri_proto::v1 as pb;

/// The `linux` part of a RuntimeConfig answer as the kubelet reads it (the runtime's
/// Unimplemented is mapped by the caller).
pub(super) fn cgroup_driver_of(
    linux: Option<pb::LinuxRuntimeConfiguration>,
) -> Result<RuntimeCgroupDriver> {
    let Some(linux) = linux else {
        return Ok(RuntimeCgroupDriver::NotReported);
    };
    match pb::CgroupDriver::try_from(linux.cgroup_driver) {
        Ok(pb::CgroupDriver::Systemd) => Ok(RuntimeCgroupDriver::Systemd),
        Ok(pb::CgroupDriver::Cgroupfs) => Ok(RuntimeCgroupDriver::Cgroupfs),
        Err(_) => Err(RuntimeError::Call {
            op: "RuntimeConfig",
            message: format!(
                "runtime returned an unknown cgroup driver {}",
                linux.cgroup_driver
            ),
        }),
    }
}
