//! Carrying out a pass's [`Plan`]: the stops (pod, changed containers, never-started
//! instances), then the sandbox and the starts, with volumes set up meanwhile. Each action is
//! logged in the pod's span.

use super::dra::DRA_RETRY;
use super::ephemeral;
use super::errors::{VOLUME_RETRY, pull_cancelled};
use super::gather::config_error;
use super::*;
use crate::spec::ContainerInputs;

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
        if self.stop.stopped.is_some() {
            // Stopped for good: whoever asked (node shutdown, eviction) may go on.
            for w in self.stop.waiters.drain(..) {
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
                        self.starts.errors.insert(
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
            if self.seen.sandbox_ips.0 != *sandbox_id {
                let status = rt.sandbox_status(sandbox_id).await.ok();
                // A sandbox made this pass is known from this status from now on.
                if let Some(st) = status.as_ref().filter(|_| create_sandbox.is_some()) {
                    self.starts.created.sandbox =
                        Some(super::started::created_sandbox(&sandbox_cfg, st));
                }
                let ips = status.map(|s| s.ips).unwrap_or_default();
                self.seen.sandbox_ips = (sandbox_id.clone(), ips);
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
                        self.starts.errors.insert(s.name.clone(), e.waiting());
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
                self.starts.errors.remove(&s.name);
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
                    self.starts
                        .errors
                        .insert(s.name.clone(), StartError::PostStartHook(message).waiting());
                } else {
                    self.starts.errors.remove(&s.name);
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
                self.starts.errors.insert(s.name.clone(), e.waiting());
                Err(Some(e.retry_after()))
            }
        }
    }
}

/// Reads the pod's sandboxes and containers from the runtime, newest first.
pub async fn observe(rt: &dyn Runtime, uid: &str) -> Result<Observed> {
    let mut sandboxes: Vec<Sandbox> = rt.list_pod_sandboxes(uid).await?;
    sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let listed: Vec<Container> = rt.list_pod_containers(uid).await?;
    let mut containers = Vec::with_capacity(listed.len());
    super::started::add_statuses(
        rt,
        listed.into_iter().map(|c| (c.sandbox_id, c.id)),
        &mut containers,
    )
    .await?;
    Ok(Observed {
        sandboxes,
        containers,
        not_started: HashSet::new(),
        resize_restart: HashSet::new(),
    })
}

impl Worker {
    pub(super) async fn create_sandbox(&mut self, attempt: u32) -> Result<String, SandboxError> {
        spec::kernel_hostname(&self.env.node, &self.pod).map_err(SandboxError::Hostname)?;
        let mut cfg = self.sandbox_config(attempt);
        cfg.runtime_handler = self.runtime_handler()?;
        cfg.userns = self.user_namespace(&cfg.runtime_handler).await?;
        // The pod cgroup with its limits (and the QoS tier's shares) before the sandbox, as
        // upstream's pod container manager; file work off the async workers.
        let (cgroups, pod) = (self.env.cgroups.clone(), self.pod.clone());
        match tokio::task::spawn_blocking(move || cgroups.ensure_pod(&pod)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot create or limit the pod cgroup; the runtime will create it")
            }
            Err(e) => tracing::warn!(error = %e, "pod cgroup setup panicked"),
        }
        std::fs::create_dir_all(&cfg.log_directory).map_err(|source| {
            SandboxError::LogDirectory {
                path: cfg.log_directory.clone(),
                source,
            }
        })?;
        let id = self.env.runtime.run_sandbox(&cfg).await?;
        tracing::info!(sandbox = %id, attempt, "sandbox started");
        self.seen.start_time.get_or_insert_with(Timestamp::now);
        Ok(id)
    }

    /// The pod's user namespace (`hostUsers: false`), before its sandbox exists: upstream's
    /// validation, then the handler's support (from the runtime's Status), then its range.
    async fn user_namespace(
        &self,
        handler: &str,
    ) -> Result<Option<crate::runtime::UserNamespace>, SandboxError> {
        if !crate::userns::wants_userns(&self.pod) {
            return Ok(None);
        }
        crate::userns::validate(&self.pod)
            .map_err(|e| SandboxError::UserNamespace(e.to_string()))?;
        let supported = self
            .env
            .runtime
            .handler_features(handler)
            .await
            .is_ok_and(|f| f.user_namespaces);
        let Some(manager) = self.env.userns.clone() else {
            return Err(SandboxError::UserNamespace(
                "user namespaces: this node agent runs without an ID range for pods".into(),
            ));
        };
        let (uid, handler) = (self.uid.clone(), handler.to_string());
        tokio::task::spawn_blocking(move || manager.get_or_create(&uid, &handler, supported))
            .await
            .map_err(|e| SandboxError::UserNamespace(e.to_string()))?
            .map(Some)
            .map_err(|e| SandboxError::UserNamespace(e.to_string()))
    }

    /// Starts one container: pull → gather → build → create → start → post-start. On
    /// failure: the waiting reason and when to retry.
    pub(super) async fn start_container(
        &mut self,
        sandbox_id: &str,
        sandbox: &SandboxConfig,
        s: &Start,
        volumes: &BTreeMap<String, std::path::PathBuf>,
        keyrings: &PodKeyrings,
        obs: &Observed,
    ) -> Result<(), StartError> {
        let (c, debug) = self.container_to_start(s)?;
        let own_image = self.pull_images(&c, sandbox, keyrings).await?;
        let mut inputs = self
            .gather(&c, debug.as_ref(), s, sandbox_id, sandbox, volumes, obs)
            .await?;
        self.runtime_inputs(&c, own_image, &mut inputs)
            .await
            .map_err(|e| config_error(e.0))?;
        self.device_inputs(&c, &mut inputs).await?;
        let cfg = self.build_config(&c, sandbox, inputs).await?;
        let rt = self.env.runtime.clone();
        let id = rt
            .create_container(sandbox_id, &cfg, sandbox)
            .await
            .map_err(|e| StartError::CreateContainer(e.to_string()))?;
        self.note_created(&id, &c);
        self.starts
            .created
            .containers
            .push((sandbox_id.to_string(), id.clone()));
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Created",
            "Container created",
        );
        rt.start_container(&id)
            .await
            .map_err(|e| StartError::RunContainer(e.to_string()))?;
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Started",
            "Container started",
        );
        tracing::info!(container = %c.name, id = %id, restart_count = s.restart_count, "Started container");
        self.link_log(sandbox, &c.name, &id, &cfg.log_path).await;
        self.post_start(&c, &id)
            .await
            .map_err(|e| StartError::PostStartHook(e.to_string()))
    }

    /// The container's image, then those of the image volumes it mounts, each as its pull
    /// policy says. A termination arriving meanwhile cancels the pull. Gives the container's
    /// own image status when the puller read it (it also gives the image's user).
    async fn pull_images(
        &mut self,
        c: &K8sContainer,
        sandbox: &SandboxConfig,
        keyrings: &PodKeyrings,
    ) -> Result<Option<crate::runtime::ImageInfo>, StartError> {
        let (pod_ref, events) = (&self.pod, self.env.events.clone());
        let event = move |t: EventType, reason: &str, message: &str| {
            events.record(
                &crate::events::container_ref(pod_ref, &c.name),
                t,
                reason,
                message,
            );
        };
        let images = std::iter::once(c.clone()).chain(super::image_volumes::pulls(&self.pod, c));
        let mut own_image = None;
        for (i, image_c) in images.enumerate() {
            let pull = self.env.images.ensure_image(
                &image_c,
                sandbox,
                keyrings,
                &event,
                &mut self.starts.pulls,
            );
            let info = tokio::select! {
                biased;
                _ = self.starts.pull_cancel.cancelled() => return Err(StartError::Image(pull_cancelled())),
                r = pull => r.map_err(StartError::Image)?,
            };
            if i == 0 {
                own_image = info;
            }
        }
        Ok(own_image)
    }

    /// The runtime's part of a container's inputs: its handler's features (asked only when
    /// they matter: recursive read-only mounts, user namespaces) and the image's user
    /// (runAsNonRoot is checked against it, and it fills a missing UID).
    async fn runtime_inputs(
        &self,
        c: &K8sContainer,
        own_image: Option<crate::runtime::ImageInfo>,
        inputs: &mut ContainerInputs,
    ) -> Result<(), spec::ConfigError> {
        let rt = self.env.runtime.as_ref();
        if spec::mounts::wants_runtime_features(&self.pod, c) {
            inputs.features = rt
                .handler_features(&inputs.handler)
                .await
                .unwrap_or_default();
        }
        // Read from the status the pull step just got when it has one (one ImageStatus
        // per start).
        inputs.image_user = match own_image {
            Some(info) => crate::runtime::image_user_of(Some(info)),
            None => crate::runtime::image_user(rt, c.image.as_deref().unwrap_or(""))
                .await
                .map_err(|e| spec::ConfigError(format!("failed to get image user: {e}")))?,
        };
        Ok(())
    }

    /// The started container's `/var/log/containers` link for log shippers; a failure is
    /// only logged, as upstream.
    async fn link_log(&self, sandbox: &SandboxConfig, name: &str, id: &str, log_path: &str) {
        let log = (!sandbox.log_directory.is_empty() && !log_path.is_empty())
            .then(|| std::path::Path::new(&sandbox.log_directory).join(log_path));
        let links = &self.env.log_links;
        if let Err(e) = links
            .create(&sandbox.name, &sandbox.namespace, name, id, log)
            .await
        {
            tracing::error!(error = %e, container_id = %id, "Failed to create legacy symbolic link");
        }
    }
}
