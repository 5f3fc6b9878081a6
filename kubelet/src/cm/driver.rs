//! The cgroup driver from the runtime (upstream's KubeletCgroupDriverFromCRI, GA): the
//! kubelet asks the runtime through CRI `RuntimeConfig` and uses its answer over
//! `cgroupDriver`, so a kubeadm-written `systemd` on a runtime set to cgroupfs (or the other
//! way round) no longer breaks every sandbox. A runtime without the call (containerd 1.6)
//! keeps the configured driver, with one info line; other errors are retried (three tries,
//! two seconds apart, as upstream) and then stop the start.

use std::time::Duration;

use crate::runtime::{Runtime, RuntimeCgroupDriver, RuntimeError};

use super::CgroupDriver;

/// Tries of the `RuntimeConfig` call before the start fails.
pub const ATTEMPTS: usize = 3;
/// Pause after a failed try (upstream: two seconds, a runtime still starting up).
pub const RETRY_DELAY: Duration = Duration::from_secs(2);

/// The driver to use: the runtime's, else `configured`.
pub async fn from_runtime(
    rt: &dyn Runtime,
    configured: CgroupDriver,
    retry_delay: Duration,
) -> Result<CgroupDriver, RuntimeError> {
    tracing::debug!("Getting CRI runtime configuration information");
    let mut last = None;
    for _ in 0..ATTEMPTS {
        match rt.cgroup_driver().await {
            Ok(answer) => {
                let driver = match answer {
                    RuntimeCgroupDriver::Systemd => CgroupDriver::Systemd,
                    RuntimeCgroupDriver::Cgroupfs => CgroupDriver::Cgroupfs,
                    RuntimeCgroupDriver::NotReported => return Ok(configured),
                    RuntimeCgroupDriver::Unimplemented => {
                        tracing::info!(
                            cgroupDriver = name(configured),
                            "CRI implementation should be updated to support RuntimeConfig when KubeletCgroupDriverFromCRI feature gate has been enabled. Falling back to using cgroupDriver from kubelet config."
                        );
                        return Ok(configured);
                    }
                };
                tracing::info!(
                    cgroupDriver = name(driver),
                    "Using cgroup driver setting received from the CRI runtime"
                );
                return Ok(driver);
            }
            Err(e) => {
                tracing::warn!(error = %e, "RuntimeConfig from runtime service failed");
                last = Some(e);
                tokio::time::sleep(retry_delay).await;
            }
        }
    }
    Err(last.expect("at least one attempt"))
}

fn name(d: CgroupDriver) -> &'static str {
    match d {
        CgroupDriver::Cgroupfs => "cgroupfs",
        CgroupDriver::Systemd => "systemd",
    }
}

#[cfg(test)]
mod tests;
