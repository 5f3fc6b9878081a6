//! Growing a claim's CSI volume on the node, with upstream's node expander's events and
//! claim statuses (the rules and messages are in [`crate::volume::csi::expand`]).

use std::path::Path;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};

use super::{Bound, Storage, unique_csi_name};
use crate::events::{EventType, pod_ref};
use crate::volume::csi::Prepared;
use crate::volume::csi::expand::{self, Failure};
use crate::volume::csi::mounter::CsiVolume;

/// One volume the sync just set up, with what the expansion check needs.
pub(super) struct Grow<'a> {
    pub pod: &'a Pod,
    /// `(namespace, name)` of the claim.
    pub claim: (&'a str, &'a str),
    /// The claim and PV the resolution read (no API read here).
    pub bound: &'a Bound,
    pub volume: &'a CsiVolume,
    pub target: &'a Path,
    pub prepared: &'a Prepared,
    /// The volume was mounted before this sync: a failure is reported with a
    /// `VolumeResizeFailed` event and the mount stays; otherwise it fails the mount.
    pub online: bool,
}

/// A reference to a claim for its events.
fn claim_ref(pvc: &PersistentVolumeClaim, ns: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(ns.into()),
        name: Some(name.into()),
        uid: pvc.metadata.uid.clone(),
        resource_version: pvc.metadata.resource_version.clone(),
        ..Default::default()
    }
}

impl Storage {
    /// Grows the volume when its claim waits for the node. An error fails the mount (only
    /// for a volume that was not mounted before: see [`Grow::online`]).
    pub(super) async fn expand_if_due(&self, g: Grow<'_>) -> Result<(), String> {
        let name = &g.volume.spec_name;
        match self.try_expand(&g).await {
            Ok(()) => Ok(()),
            Err(e) if g.online => {
                let message = expand::online_failed_message(name, &e);
                tracing::warn!(pod_uid = ?g.pod.metadata.uid, volume = %name, error = %e, "expanding a mounted volume failed");
                self.events.record(
                    &pod_ref(g.pod),
                    EventType::Warning,
                    expand::VOLUME_RESIZE_FAILED,
                    &message,
                );
                Ok(())
            }
            Err(e) => Err(expand::mount_failed_message(name, &e)),
        }
    }

    fn remembered(&self, key: &str) -> expand::Remembered {
        self.expansions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    fn remember(&self, key: &str, f: impl FnOnce(&mut expand::Remembered)) {
        let mut all = self.expansions.lock().unwrap_or_else(|p| p.into_inner());
        f(all.entry(key.to_string()).or_default());
    }

    async fn try_expand(&self, g: &Grow<'_>) -> Result<(), String> {
        let Bound { pvc, pv } = g.bound;
        let (ns, claim) = g.claim;
        let c = g.volume;
        let key = unique_csi_name(&c.driver, &c.volume_handle);
        let before = self.remembered(&key);
        // A read-only volume is not grown (upstream checks this before anything else).
        if c.read_only {
            if let Some(grown) = expand::grown(pvc, pv)
                && before.read_only_reported != Some(grown.new_bytes)
            {
                let message = expand::read_only_message(&c.spec_name);
                tracing::warn!(pod_uid = ?g.pod.metadata.uid, "{message}");
                for object in [pod_ref(g.pod), claim_ref(pvc, ns, claim)] {
                    self.events.record(
                        &object,
                        EventType::Warning,
                        expand::FILE_SYSTEM_RESIZE_FAILED,
                        &message,
                    );
                }
                self.remember(&key, |r| r.read_only_reported = Some(grown.new_bytes));
            }
            return Ok(());
        }
        let Some(due) = expand::due(pvc, pv) else {
            return Ok(());
        };
        if g.online && before.in_use_error {
            return Ok(());
        }
        if !self.csi.can_expand(&c.driver).await? {
            return Ok(());
        }
        self.api
            .patch_claim_status(ns, claim, expand::in_progress_patch())
            .await?;
        if let Err(e) = self
            .csi
            .expand(c, g.target, due.new_bytes, g.prepared)
            .await
        {
            let error = expand::expander_error(&e);
            let failure = Failure::of(&e.code);
            if failure != Failure::Uncertain {
                let infeasible = expand::infeasible_now(pvc, &due, &before);
                self.remember(&key, |r| {
                    r.failed_finally = true;
                    r.in_use_error |= failure == Failure::InUse;
                });
                let now =
                    serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::now(),
                    ))
                    .unwrap_or_default();
                let patch =
                    expand::failed_patch(pvc, &error, infeasible, now.as_str().unwrap_or_default());
                if let Err(pe) = self.api.patch_claim_status(ns, claim, patch).await {
                    tracing::error!(volume = %c.spec_name, error = %pe, "MountVolume.NodeExpandVolume failed to mark node expansion as failed");
                }
            }
            if failure == Failure::InUse {
                // Final for this node, but the mount goes on (upstream: MarkForInUseExpansionError).
                tracing::warn!(volume = %c.spec_name, error = %error, "MountVolume.NodeExapndVolume failed");
                return Ok(());
            }
            return Err(error);
        }
        self.remember(&key, |r| r.failed_finally = false);
        let node = g
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or(&self.csi.node_name);
        let message = expand::succeeded_message(&c.spec_name, node);
        tracing::info!(pod_uid = ?g.pod.metadata.uid, "{message}");
        for object in [pod_ref(g.pod), claim_ref(pvc, ns, claim)] {
            self.events.record(
                &object,
                EventType::Normal,
                expand::FILE_SYSTEM_RESIZE_SUCCESSFUL,
                &message,
            );
        }
        self.api
            .patch_claim_status(ns, claim, expand::finished_patch(pvc, &due.new_size))
            .await
            .map_err(|e| format!("mountVolume.NodeExpandVolume update pvc status failed: {e}"))
    }
}

#[cfg(test)]
mod tests;
