//! Carrying out a pass's [`Plan`]: the stops (pod, changed containers, never-started
//! instances), then the sandbox and the starts, with volumes set up meanwhile. Each action is
//! logged in the pod's span.

use super::dra::DRA_RETRY;
use super::ephemeral;
use super::sync::VOLUME_RETRY;
use super::*;

impl Worker {
    /// Does what `p` says, in order. Returns when to come back (the plan's wake-up, or sooner
    /// for a failure to retry).
    pub(super) async fn act(&mut self, obs: &Observed, p: &Plan) -> Option<Duration> {
        let rt = self.env.runtime.clone();
        let grace = self.grace();
        let mut create_sandbox = None;
        for action in &p.actions {
            match action {
                Action::KillPod => {
                    tracing::info!(%action, "stopping pod's containers and sandbox");
                    self.stop_containers(obs, grace).await;
                    if let Some(sb) = obs.sandboxes.first()
                        && let Err(e) = rt.stop_sandbox(&sb.id).await
                    {
                        tracing::warn!(error = %e, sandbox = %sb.id, "StopPodSandbox failed");
                    }
                }
                Action::KillContainer { id, name } => {
                    tracing::info!(%action, container = %name, "container spec changed, will be restarted");
                    let message = if obs.resize_restart.contains(id) {
                        format!("Container {name} resize requires restart")
                    } else {
                        format!("Container {name} definition changed, will be restarted")
                    };
                    self.kill_container(id, name, grace, Some(&message)).await;
                }
                Action::RemoveContainer { id } => {
                    tracing::info!(%action, "removing a container that never started");
                    // The container's log files go first, as upstream's removeContainerLog.
                    if let Err(e) = crate::logs::clean(rt.as_ref(), id).await {
                        tracing::debug!(error = %e, container = %id, "removing the container's logs failed");
                    }
                    if let Some((_, c)) = obs.containers.iter().find(|(_, c)| &c.id == id)
                        && let Err(e) = self.env.log_links.remove(id, &c.labels).await
                    {
                        tracing::warn!(error = %e, container = %id, "removing the container's log link failed");
                    }
                    if let Err(e) = rt.remove_container(id).await {
                        tracing::debug!(error = %e, container = %id, "RemoveContainer failed");
                    }
                }
                Action::CreateSandbox { attempt } => create_sandbox = Some(*attempt),
                // Started below, once the sandbox and the volumes are there.
                Action::StartInitContainer { .. }
                | Action::StartContainer { .. }
                | Action::StartEphemeralContainer { .. } => {}
            }
        }
        if self.stopped.is_some() {
            // Stopped for good: whoever asked (node shutdown, eviction) may go on.
            for w in self.stop_waiters.drain(..) {
                let _ = w.send(());
            }
        }
        self.start_all(obs, create_sandbox, &p.starts(), p.wake_after)
            .await
    }

    /// Creates the sandbox if `create_sandbox` says so and starts `starts` in it (init
    /// containers stop at the first failure). Volumes are set up while the sandbox is made
    /// (both wait on others: the apiserver for tokens, CNI for the network), not one after
    /// the other, and every one of them is before any container starts.
    async fn start_all(
        &mut self,
        obs: &Observed,
        create_sandbox: Option<u32>,
        starts: &[Start],
        wake_after: Option<Duration>,
    ) -> Option<Duration> {
        let rt = self.env.runtime.clone();
        let mut wake = wake_after;
        // Awaited before this pass ends, whatever happens to the sandbox (no mount outlives
        // its pass).
        let mut mounting = (!starts.is_empty()).then(|| {
            let (volumes, pod) = (self.env.volumes.clone(), self.pod.clone());
            tokio::spawn(async move { volumes.mount(&pod).await })
        });
        // The pod's claims are prepared before its sandbox and containers; until they are,
        // nothing starts.
        let claims_ready = starts.is_empty() || self.prepare_claims(starts).await;
        if !claims_ready {
            wake = Some(wake.map_or(DRA_RETRY, |x| x.min(DRA_RETRY)));
        }
        let mut sandbox = obs
            .sandboxes
            .first()
            .filter(|s| s.state == SandboxState::Ready && claims_ready)
            .map(|s| (s.id.clone(), s.attempt));
        if let Some(attempt) = create_sandbox.filter(|_| claims_ready) {
            tracing::info!(action = %Action::CreateSandbox { attempt }, "creating the pod sandbox");
            match self.create_sandbox(attempt).await {
                Ok(id) => sandbox = Some((id, attempt)),
                Err(e) => {
                    tracing::warn!(error = %e, "FailedCreatePodSandBox");
                    self.event(
                        None,
                        EventType::Warning,
                        "FailedCreatePodSandBox",
                        &format!("Failed to create pod sandbox: {e}"),
                    );
                    for s in starts {
                        self.errors.insert(
                            s.name.clone(),
                            Waiting {
                                reason: "ContainerCreating".into(),
                                message: format!("Failed to create pod sandbox: {e}"),
                            },
                        );
                    }
                    sandbox = None;
                    wake = Some(Duration::from_secs(2));
                }
            }
        }
        if let Some((sandbox_id, attempt)) = &sandbox {
            let sandbox_cfg = self.sandbox_config(*attempt);
            if self.sandbox_ips.0 != *sandbox_id {
                let status = rt.sandbox_status(sandbox_id).await.ok();
                // A sandbox made this pass is known from this status from now on.
                if let Some(st) = status.as_ref().filter(|_| create_sandbox.is_some()) {
                    self.created.sandbox = Some(super::started::created_sandbox(&sandbox_cfg, st));
                }
                let ips = status.map(|s| s.ips).unwrap_or_default();
                self.sandbox_ips = (sandbox_id.clone(), ips);
            }
            // Every volume is set up before any container starts (upstream's
            // WaitForAttachAndMount); until then the containers wait in ContainerCreating.
            let volumes = match mounting.take() {
                None => Ok(BTreeMap::new()),
                Some(task) => task.await.unwrap_or_else(|e| {
                    Err(crate::volume::VolumeError {
                        volume: String::new(),
                        message: format!("setting up volumes: {e}"),
                    })
                }),
            };
            let (volumes, starts): (_, &[Start]) = match volumes {
                Ok(v) => (v, starts),
                Err(e) => {
                    tracing::warn!(error = %e, "volumes are not ready");
                    self.event(None, EventType::Warning, "FailedMount", &e.to_string());
                    let e = StartError::Volumes(e);
                    for s in starts {
                        self.errors.insert(s.name.clone(), e.waiting());
                    }
                    wake = Some(wake.map_or(VOLUME_RETRY, |x| x.min(VOLUME_RETRY)));
                    (BTreeMap::new(), &[])
                }
            };
            let keyrings = if starts.is_empty() {
                PodKeyrings::default()
            } else {
                self.pull_keyrings().await
            };
            for s in starts {
                let action = if s.init {
                    "StartInitContainer"
                } else if ephemeral::find(&self.pod, &s.name).is_some() {
                    "StartEphemeralContainer"
                } else {
                    "StartContainer"
                };
                tracing::info!(action, container = %s.name, restart_count = s.restart_count, "starting a container");
                let started = self
                    .start_container(sandbox_id, &sandbox_cfg, s, &volumes, &keyrings, obs)
                    .await;
                if let Err(retry) = self.record_start(s, started) {
                    if let Some(retry) = retry {
                        wake = Some(wake.map_or(retry, |x| x.min(retry)));
                    }
                    // Init containers run in order: stop at the first failure.
                    if s.init {
                        break;
                    }
                }
            }
        }
        // No sandbox this pass: the mount still finishes before the pass ends (its result is
        // cached work for the next one).
        if let Some(task) = mounting.take() {
            let _ = task.await;
        }
        wake
    }

    /// Notes how a start went in the container's waiting reason. A failure gives when to
    /// retry (None: no sooner than planned).
    fn record_start(
        &mut self,
        s: &Start,
        started: Result<(), StartError>,
    ) -> Result<(), Option<Duration>> {
        match started {
            Ok(()) => {
                self.errors.remove(&s.name);
                Ok(())
            }
            Err(StartError::PostStartHook(message)) => {
                // Killed: it restarts (with back-off) per its restart policy; one that will
                // not restart shows as terminated, as upstream.
                let spec = self.pod.spec.clone().unwrap_or_default();
                let restarts = self.spec_container(&s.name).is_some_and(|c| {
                    is_sidecar(&c) || (!s.init && pod::container_restartable(&c, &spec))
                }) || (s.init && spec.restart_policy.as_deref() != Some("Never"));
                if restarts {
                    self.errors
                        .insert(s.name.clone(), StartError::PostStartHook(message).waiting());
                } else {
                    self.errors.remove(&s.name);
                }
                Err(None)
            }
            Err(e) => {
                tracing::warn!(container = %s.name, reason = e.reason(), message = e.message(), "cannot start container");
                self.event(
                    Some(&s.name),
                    EventType::Warning,
                    "Failed",
                    &format!("Error: {}", e.event_detail()),
                );
                self.errors.insert(s.name.clone(), e.waiting());
                Err(Some(e.retry_after()))
            }
        }
    }
}
