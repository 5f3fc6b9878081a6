//! The pod's ResourceClaims through the DRA manager: prepared before its sandbox and
//! containers (upstream's SyncPod order), their CDI devices in the containers that reference
//! them, unprepared once nothing of the pod runs.

use super::*;

/// How soon a pod whose claims could not be prepared tries again (upstream's pod worker
/// back-off after a failed sync).
pub(super) const DRA_RETRY: Duration = Duration::from_secs(10);

impl Worker {
    /// Prepares the pod's claims. False: they are not ready; the containers in `starts` wait
    /// in ContainerCreating and the pod gets upstream's `FailedPrepareDynamicResources` event.
    pub(super) async fn prepare_claims(&mut self, starts: &[Start]) -> bool {
        let Some(dra) = self.env.dra.clone() else {
            return true;
        };
        let has_claims = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .is_some_and(|c| !c.is_empty());
        if !has_claims {
            return true;
        }
        match dra.prepare(&self.pod).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "Failed to prepare dynamic resources");
                self.event(
                    None,
                    EventType::Warning,
                    crate::devices::FAILED_PREPARE_REASON,
                    &format!("Failed to prepare dynamic resources: {e}"),
                );
                for s in starts {
                    self.errors.insert(
                        s.name.clone(),
                        Waiting {
                            reason: "ContainerCreating".into(),
                            message: String::new(),
                        },
                    );
                }
                false
            }
        }
    }

    /// Unprepares the claims only this pod used. False: a driver failed; try again.
    pub(super) async fn unprepare_claims(&self) -> bool {
        let Some(dra) = self.env.dra.as_ref() else {
            return true;
        };
        match dra.unprepare(&self.uid).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot unprepare the pod's ResourceClaims; retrying");
                false
            }
        }
    }
}

impl Worker {
    /// A pod that reached Succeeded or Failed runs nothing again: its claims go back to their
    /// drivers now (upstream's SyncTerminatedPod), not at its deletion. A failure is logged
    /// and tried again on the next pass.
    pub(super) async fn release_claims_if_finished(&self, obs: &Observed) {
        let Some(dra) = self.env.dra.as_ref() else {
            return;
        };
        let finished = self
            .last_status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        let running = obs
            .containers
            .iter()
            .any(|(_, c)| c.state == ContainerState::Running);
        if finished && !running && dra.has_pod(&self.uid) {
            self.unprepare_claims().await;
        }
    }
}

/// Adds the CDI devices of the claims `c` references to its config (after the device
/// plugins' ones).
pub(super) fn add_claim_devices(
    dra: Option<&Arc<crate::devices::DraManager>>,
    pod: &Pod,
    c: &K8sContainer,
    cfg: &mut crate::runtime::ContainerConfig,
) -> Result<(), spec::ConfigError> {
    let Some(dra) = dra else {
        return Ok(());
    };
    for id in dra
        .cdi_devices(pod, c)
        .map_err(|e| spec::ConfigError(e.0))?
    {
        if !cfg.cdi_devices.contains(&id) {
            cfg.cdi_devices.push(id);
        }
    }
    Ok(())
}
