//! One level-triggered pass: observe the pod in the runtime, plan the difference to the
//! spec, act on it (`act.rs`), then publish the pod's status.

use super::*;

impl Worker {
    /// One level-triggered pass: observe the pod in the runtime, [`plan`] the difference to
    /// the spec, [`Worker::act`] on it, then publish the status. Returns when to come back
    /// (at the latest).
    pub async fn sync(&mut self) -> Duration {
        // Containers run with the allocated resources; a resize reaches them once admission
        // has allocated it.
        self.pod = self.env.allocations.allocated_pod(&self.desired);
        let Some(mut obs) = self.observe_pass().await else {
            return Duration::from_secs(1);
        };
        obs.resize_restart = self.resize_restarts(&obs);
        let p = if self.stop.stopped.is_some() {
            // Stopped for good: nothing starts again.
            plan::plan_stopped(&obs)
        } else {
            plan(&self.pod, &obs, &mut self.starts.backoff, Instant::now())
        };
        if !p.actions.is_empty() {
            tracing::debug!(actions = ?p.actions, "planned");
        }
        for (name, w) in &p.waiting {
            if w.reason == "CrashLoopBackOff" {
                let message = format!(
                    "Back-off restarting failed container {name} in pod {}",
                    pod_ref(&self.pod)
                );
                self.event(Some(name), EventType::Warning, "BackOff", &message);
            }
        }
        self.starts.created = Default::default();
        let wake = self.act(&obs, &p).await;
        let mut obs = if p.actions.is_empty() {
            obs
        } else {
            self.observe_after(obs, &p).await
        };
        if self.stop.stopped.is_none() {
            self.resize_in_place(&obs).await;
        }
        self.add_exit_messages(&mut obs).await;
        let mut waiting = self.starts.errors.clone();
        waiting.extend(p.waiting.clone());
        self.update_probes(&obs);
        self.publish(&obs, waiting, false);
        self.release_claims_if_finished(&obs).await;
        // The deadline counts from the start time, which a new sandbox may just have set.
        let wake = match (wake, self.active_deadline_left().filter(|d| !d.is_zero())) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        wake.unwrap_or(self.env.resync).min(self.env.resync)
    }

    /// What a pass plans from: the pod in the runtime after the kills failed probes asked
    /// for (the plan must see those containers exited), with the sidecars not started yet.
    /// Also stops the pod for good once its `activeDeadlineSeconds` has passed. None: the
    /// runtime cannot be read.
    async fn observe_pass(&mut self) -> Option<Observed> {
        // Labels and annotations the downward API shows follow the latest spec.
        self.env.volumes.update_pod(&self.pod);
        let rt = self.env.runtime.clone();
        let obs = match observe(rt.as_ref(), &self.uid).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "cannot observe pod in the runtime; will retry");
                return None;
            }
        };
        let mut obs = if self.kill_for_probes(&obs).await {
            observe(rt.as_ref(), &self.uid).await.unwrap_or(obs)
        } else {
            obs
        };
        obs.not_started = self.sidecars_not_started(&obs);
        // A pod that already finished keeps its phase (upstream no longer syncs it).
        let finished = self
            .seen
            .last_status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        let deadline_left = self.active_deadline_left().filter(|_| !finished);
        if deadline_left == Some(Duration::ZERO) && self.stop.stopped.is_none() {
            self.stop.stopped = Some(Stopped {
                reason: DEADLINE_REASON.into(),
                message: DEADLINE_MESSAGE.into(),
                disruption: false,
            });
            tracing::info!("pod passed its activeDeadlineSeconds; stopping it");
            self.event(None, EventType::Normal, DEADLINE_REASON, DEADLINE_MESSAGE);
        }
        Some(obs)
    }

    /// Time left before `activeDeadlineSeconds` (counted from the pod's start time) runs
    /// out; None without a deadline or before the pod started.
    pub(super) fn active_deadline_left(&self) -> Option<Duration> {
        let secs = self.pod.spec.as_ref()?.active_deadline_seconds?;
        let start = self.seen.start_time?;
        let end = start.as_second().saturating_add(secs.max(0));
        let now = Timestamp::now();
        let left_ns = i128::from(end) * 1_000_000_000 - now.as_nanosecond();
        Some(Duration::from_nanos(
            left_ns.clamp(0, i128::from(u64::MAX)) as u64
        ))
    }

    /// Running sidecars whose startup probe has not passed yet (their probe workers may not
    /// even exist on the pass that started them).
    pub(super) fn sidecars_not_started(&self, obs: &Observed) -> HashSet<String> {
        let mut out = HashSet::new();
        let spec = self.pod.spec.clone().unwrap_or_default();
        for c in spec.init_containers.iter().flatten() {
            if !is_sidecar(c) || c.startup_probe.is_none() {
                continue;
            }
            for (_, s) in &obs.containers {
                if s.name == c.name
                    && s.state == ContainerState::Running
                    && (self.probing.probed.get(&c.name) != Some(&s.id)
                        || !self.env.probes.is_started(&self.uid, &c.name, &s.id))
                {
                    out.insert(s.id.clone());
                }
            }
        }
        out
    }
}
