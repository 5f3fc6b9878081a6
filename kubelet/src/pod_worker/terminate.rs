//! Stopping a pod: its containers with the grace period, then its sandbox, cgroup and
//! directories, as upstream's SyncTerminatingPod / SyncTerminatedPod.

use super::*;

impl Worker {
    pub(super) fn grace(&self) -> Duration {
        let spec = pod::kill_grace(pod::spec_grace_seconds(&self.pod));
        // A stop request (node shutdown, eviction) may only shorten it.
        self.stop.grace.map_or(spec, |g| g.min(spec))
    }

    /// A stop request: the next passes kill everything with at most `grace`, then tell `done`.
    pub(super) fn on_stop(
        &mut self,
        stopped: Stopped,
        grace: Duration,
        done: tokio::sync::oneshot::Sender<()>,
    ) {
        if self.stop.stopped.is_none() {
            tracing::info!(reason = %stopped.reason, grace_secs = grace.as_secs(), "stopping the pod for good: {}", stopped.message);
            self.stop.stopped = Some(stopped);
        }
        self.stop.grace = Some(self.stop.grace.map_or(grace, |g| g.min(grace)));
        self.stop.waiters.push(done);
    }

    /// Stops and removes everything of the pod, with `grace` (None: the grace recorded on its
    /// containers). Returns false if something must be retried.
    pub async fn terminate(&mut self, grace: Option<Duration>) -> bool {
        let rt = self.env.runtime.clone();
        let obs = match observe(rt.as_ref(), &self.uid).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the pod's containers to stop them; will retry");
                return false;
            }
        };
        // A pod no source knows (found in the runtime after a restart): its identity and grace
        // period come from what we recorded on its sandbox and containers.
        if self.pod.metadata.name.is_none()
            && let Some(sb) = obs.sandboxes.first()
        {
            self.pod.metadata.name = Some(sb.pod_name.clone());
            self.pod.metadata.namespace = Some(sb.pod_namespace.clone());
        }
        let grace = grace
            .unwrap_or_else(|| {
                let recorded = obs
                    .containers
                    .iter()
                    .filter_map(|(_, c)| {
                        c.annotations.get(ANN_POD_GRACE_PERIOD)?.parse::<i64>().ok()
                    })
                    .max();
                pod::kill_grace(recorded.unwrap_or(pod::DEFAULT_GRACE_SECONDS))
            })
            .max(MIN_GRACE);
        // A terminating pod is not probed for liveness; its readiness no longer matters.
        self.env.probes.remove_pod(&self.uid);
        self.probing.probed.clear();
        // An httpGet preStop hook defaults to the pod's IP, unknown to a fresh worker.
        if self.seen.sandbox_ips.1.is_empty()
            && let Some(sb) = obs
                .sandboxes
                .first()
                .filter(|s| s.state == SandboxState::Ready)
            && let Ok(st) = rt.sandbox_status(&sb.id).await
        {
            self.seen.sandbox_ips = (sb.id.clone(), st.ips);
        }
        self.stop_containers(&obs, grace).await;
        let mut clean = true;
        for sb in &obs.sandboxes {
            if let Err(e) = rt.stop_sandbox(&sb.id).await {
                tracing::warn!(error = %e, sandbox = %sb.id, "StopPodSandbox failed");
                clean = false;
            }
        }
        if let Ok(mut after) = observe(rt.as_ref(), &self.uid).await {
            self.add_exit_messages(&mut after).await;
            self.publish(&after, BTreeMap::new(), true);
        }
        for (_, c) in &obs.containers {
            // Its log link goes first (upstream's removeContainerLog); one that cannot go
            // keeps the container for the next pass.
            if let Err(e) = self.env.log_links.remove(&c.id, &c.labels).await {
                tracing::warn!(error = %e, container = %c.id, "cannot remove the container's log link; retrying");
                clean = false;
                continue;
            }
            if let Err(e) = rt.remove_container(&c.id).await
                && !matches!(e, RuntimeError::NotFound { .. })
            {
                clean = false;
            }
        }
        for sb in &obs.sandboxes {
            if let Err(e) = rt.remove_sandbox(&sb.id).await
                && !matches!(e, RuntimeError::NotFound { .. })
            {
                tracing::warn!(error = %e, sandbox = %sb.id, "RemovePodSandbox failed");
                clean = false;
            }
        }
        if !clean {
            return false;
        }
        // Nothing of the pod runs: its claims go back to their drivers.
        if !self.unprepare_claims().await {
            return false;
        }
        let (cgroups, uid) = (self.env.cgroups.clone(), self.uid.clone());
        match tokio::task::spawn_blocking(move || cgroups.remove_pod(&uid)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot remove pod cgroup"),
            Err(e) => tracing::warn!(error = %e, "pod cgroup removal panicked"),
        }
        // Only a UID that is one path component names a directory of ours (a runtime's
        // label or a manifest could say `..`); removal walks the disk, off the async workers.
        // Containers are gone: nothing reads the volumes any more. A volume its driver could
        // not tear down keeps the pod's directory (removing it would unmount the volume behind
        // the driver's back, or delete through it) until a later pass succeeds.
        if let Err(e) = self.env.volumes.forget(&self.uid).await {
            tracing::warn!(error = %e, "cannot tear down the pod's volumes; keeping its directory and retrying");
            return false;
        }
        if crate::podspec::is_safe_uid(&self.uid) {
            let pod_dir = crate::node_settings::pod_dir(&self.env.node, &self.uid);
            let log_dir = crate::node_settings::pod_log_dir(&self.env.node, &self.pod);
            let binder = self.env.binder.clone();
            let (userns, uid) = (self.env.userns.clone(), self.uid.clone());
            // Mounts go first: removing the directory through a bind mount would delete the
            // volume's (a hostPath's) files. While one is left, the directory stays. The pod's
            // user namespace range is free once its directory (and record) is gone.
            let removed = tokio::task::spawn_blocking(move || {
                crate::pod_dirs::remove(binder.as_ref(), &pod_dir, &log_dir)?;
                if let Some(u) = userns {
                    u.release(&uid);
                }
                Ok::<(), std::io::Error>(())
            })
            .await;
            if let Ok(Err(e)) = removed {
                tracing::warn!(error = %e, "cannot unmount the pod's subPath mounts; retrying");
                return false;
            }
        } else {
            tracing::warn!(uid = %self.uid, "not removing pod directories: the UID is not a safe path component");
        }
        self.env.statuses.remove(&self.uid);
        tracing::info!("pod stopped and removed");
        true
    }
}
