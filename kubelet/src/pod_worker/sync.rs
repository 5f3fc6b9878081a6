//! A pass's actions: observe the pod in the runtime, create its sandbox, pull images and
//! start containers as the plan says, stop the ones it no longer wants.

use super::*;

/// Reads the pod's sandboxes and containers from the runtime, newest first.
pub async fn observe(rt: &dyn Runtime, uid: &str) -> Result<Observed> {
    let mut sandboxes: Vec<Sandbox> = rt.list_pod_sandboxes(uid).await?;
    sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let listed: Vec<Container> = rt.list_pod_containers(uid).await?;
    let mut containers = Vec::with_capacity(listed.len());
    for c in listed {
        match rt.container_status(&c.id).await {
            Ok(s) => containers.push((c.sandbox_id, s)),
            Err(RuntimeError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    containers.sort_by_key(|c| std::cmp::Reverse(c.1.created_at));
    Ok(Observed {
        sandboxes,
        containers,
        not_started: HashSet::new(),
        resize_restart: HashSet::new(),
    })
}

/// Why a container did not start: upstream's waiting reasons, each with its retry delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// ErrImagePull, ImagePullBackOff, ErrImageNeverPull, ImageInspectError.
    Image(images::PullError),
    CreateContainerConfig {
        message: String,
        retry_after: Duration,
    },
    CreateContainer(String),
    RunContainer(String),
    /// A volume could not be set up: the containers wait in `ContainerCreating` and the pod
    /// gets a `FailedMount` event.
    Volumes(crate::volume::VolumeError),
    /// The postStart hook failed (upstream's message); the container was killed.
    PostStartHook(String),
}

/// A pull dropped because the pod is stopping: no back-off is recorded, the pass ends.
fn pull_cancelled() -> images::PullError {
    images::PullError {
        reason: images::PullReason::ErrImagePull,
        message: "image pull cancelled: the pod is stopping".into(),
        retry_after: Duration::ZERO,
    }
}

/// How soon a pod whose volumes failed tries again.
pub(super) const VOLUME_RETRY: Duration = Duration::from_secs(2);

impl StartError {
    pub fn reason(&self) -> &'static str {
        match self {
            StartError::Image(e) => e.reason.as_str(),
            StartError::CreateContainerConfig { .. } => "CreateContainerConfigError",
            StartError::CreateContainer(_) => "CreateContainerError",
            StartError::RunContainer(_) => "RunContainerError",
            StartError::Volumes(_) => "ContainerCreating",
            StartError::PostStartHook(_) => "PostStartHookError",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            StartError::Image(e) => &e.message,
            StartError::CreateContainerConfig { message, .. } => message,
            StartError::CreateContainer(m)
            | StartError::RunContainer(m)
            | StartError::PostStartHook(m) => m,
            // Upstream leaves the message empty while volumes are pending.
            StartError::Volumes(_) => "",
        }
    }

    /// When to try again.
    pub fn retry_after(&self) -> Duration {
        match self {
            StartError::Image(e) => e.retry_after,
            StartError::CreateContainerConfig { retry_after, .. } => *retry_after,
            StartError::Volumes(_) => VOLUME_RETRY,
            _ => Duration::from_secs(10),
        }
    }

    /// The detail of the `Failed` event: image errors give their reason ("Error:
    /// ErrImagePull"), the others the runtime's message, as upstream.
    pub fn event_detail(&self) -> &str {
        match self {
            StartError::Image(_) => self.reason(),
            _ => self.message(),
        }
    }

    pub fn waiting(&self) -> Waiting {
        Waiting {
            reason: self.reason().into(),
            message: self.message().into(),
        }
    }
}

/// Why a pod's sandbox could not be made (the `FailedCreatePodSandBox` event says
/// "Failed to create pod sandbox: " and this).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The pod's RuntimeClass names no handler.
    #[error(transparent)]
    RuntimeClass(#[from] PodEnvError),
    #[error("creating {path}: {source}")]
    LogDirectory {
        path: String,
        source: std::io::Error,
    },
    /// `setHostnameAsFQDN` asks for an FQDN longer than the kernel's nodename.
    #[error("{0}")]
    Hostname(String),
    /// RunPodSandbox failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// `hostUsers: false`: the pod's user namespace cannot be had (validation, the runtime
    /// handler's support, the node's range), so no sandbox is created.
    #[error("{0}")]
    UserNamespace(String),
}

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
        let p = if self.stopped.is_some() {
            // Stopped for good: nothing starts again.
            plan::plan_stopped(&obs)
        } else {
            plan(&self.pod, &obs, &mut self.backoff, Instant::now())
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
        let wake = self.act(&obs, &p).await;
        let mut obs = if p.actions.is_empty() {
            obs
        } else {
            let rt = self.env.runtime.clone();
            observe(rt.as_ref(), &self.uid).await.unwrap_or(obs)
        };
        if self.stopped.is_none() {
            self.resize_in_place(&obs).await;
        }
        self.add_exit_messages(&mut obs).await;
        let mut waiting = self.errors.clone();
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
            .last_status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        let deadline_left = self.active_deadline_left().filter(|_| !finished);
        if deadline_left == Some(Duration::ZERO) && self.stopped.is_none() {
            self.stopped = Some(Stopped {
                reason: DEADLINE_REASON.into(),
                message: DEADLINE_MESSAGE.into(),
                disruption: false,
            });
            tracing::info!("pod passed its activeDeadlineSeconds; stopping it");
            self.event(None, EventType::Normal, DEADLINE_REASON, DEADLINE_MESSAGE);
        }
        Some(obs)
    }

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
        self.start_time.get_or_insert_with(Timestamp::now);
        Ok(id)
    }

    /// The pod's user namespace (`hostUsers: false`), before its sandbox exists: upstream's
    /// validation, then the handler's support (from the runtime's Status), then its range.
    async fn user_namespace(&self, handler: &str) -> Result<Option<UserNamespace>, SandboxError> {
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

    /// Pulls if needed, creates and starts one container. On failure: the waiting reason and
    /// when to retry.
    pub(super) async fn start_container(
        &mut self,
        sandbox_id: &str,
        sandbox: &SandboxConfig,
        s: &Start,
        volumes: &BTreeMap<String, std::path::PathBuf>,
        keyrings: &PodKeyrings,
        obs: &Observed,
    ) -> Result<(), StartError> {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let debug = super::ephemeral::find(&self.pod, &s.name).cloned();
        let c = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .find(|c| c.name == s.name)
            .cloned()
            .or_else(|| debug.as_ref().map(super::ephemeral::as_container))
            .expect("planned containers come from the spec");
        if debug.is_some() {
            // Added after the pod was admitted: the refusals of admission apply now.
            super::ephemeral::refused(&c, self.env.refusal)?;
        }
        crate::metrics::started_container(
            spec.init_containers
                .iter()
                .flatten()
                .any(|i| i.name == s.name),
        );
        if let Err(e) = ::probes::ContainerProbes::from_container(&c) {
            return Err(StartError::CreateContainerConfig {
                message: format!("invalid probe: {e}"),
                retry_after: Duration::from_secs(30),
            });
        }
        let (pod_ref, events) = (&self.pod, self.env.events.clone());
        let event = move |t: EventType, reason: &str, message: &str| {
            events.record(
                &crate::events::container_ref(pod_ref, &s.name),
                t,
                reason,
                message,
            );
        };
        // The container's image, then those of the image volumes it mounts, each as its
        // pull policy says. A termination arriving meanwhile cancels the pull.
        let images = std::iter::once(c.clone()).chain(super::image_volumes::pulls(&self.pod, &c));
        for image_c in images {
            let pull =
                self.env
                    .images
                    .ensure_image(&image_c, sandbox, keyrings, &event, &mut self.pulls);
            tokio::select! {
                biased;
                _ = self.pull_cancel.cancelled() => return Err(StartError::Image(pull_cancelled())),
                r = pull => r.map_err(StartError::Image)?,
            }
        }
        // An ephemeral container's target must run (checked after the pull, as upstream).
        let pid_target = match &debug {
            Some(e) => super::ephemeral::target_id(e, obs, sandbox_id)?,
            None => None,
        };
        let objects = self.env_objects(&c).await?;
        let service_env = self.service_env()?;
        // /etc/hosts, subPath mounts, the env and the log directory touch the disk or grow
        // with the pod: off the async workers.
        let (env, pod, container) = (self.env.clone(), self.pod.clone(), c.clone());
        let (restart_count, pod_ips) = (s.restart_count, self.sandbox_ips.1.clone());
        let log_dir = std::path::Path::new(&sandbox.log_directory).join(&c.name);
        let volumes = volumes.clone();
        // The runtime's features matter only to recursive read-only mounts and user
        // namespaces: asked for then.
        let features = if spec::mounts::wants_runtime_features(&self.pod, &c) {
            self.env
                .runtime
                .handler_features(&sandbox.runtime_handler)
                .await
                .unwrap_or_default()
        } else {
            Default::default()
        };
        let handler = sandbox.runtime_handler.clone();
        let prepared = tokio::task::spawn_blocking(move || {
            let gate = env.node.pod_limits.pod_level_resources;
            let container_env = spec::container_env(
                &pod,
                &container,
                &pod_ips,
                &env.node.host_ips,
                &objects,
                &service_env,
                &crate::podspec::downward::limit_defaults(&pod, &env.node.allocatable, gate),
                &mut spec::ExpandBudget::default(),
            )?;
            let hosts = pod_dirs::write_etc_hosts(&env.node, &pod, &pod_ips)
                .map_err(|e| spec::ConfigError(e.to_string()))?;
            let host_paths = pod_dirs::prepare_container(
                &env.node,
                &pod,
                &container,
                restart_count,
                &volumes,
                env.binder.as_ref(),
                &container_env,
            )?;
            let cfg = spec::container_config(
                &env.node,
                &pod,
                &container,
                restart_count,
                &volumes,
                hosts.as_deref(),
                &host_paths,
                &container_env,
                &handler,
                features,
            )?;
            let _ = std::fs::create_dir_all(&log_dir);
            Ok::<_, spec::ConfigError>((cfg, container_env.invalid_names))
        })
        .await
        .unwrap_or_else(|e| Err(spec::ConfigError(format!("preparing the container: {e}"))));
        let rt = self.env.runtime.clone();
        // runAsNonRoot is checked against the image's user, which also fills a missing UID.
        let user = crate::runtime::image_user(rt.as_ref(), c.image.as_deref().unwrap_or(""))
            .await
            .map_err(|e| spec::ConfigError(format!("failed to get image user: {e}")));
        // Device plugins that asked for it hear of the start first (PreStartContainer).
        let pre_start = match &self.env.devices {
            Some(d) => {
                let uid = self.pod.metadata.uid.as_deref().unwrap_or("");
                d.pre_start(uid, &c.name).await.map_err(spec::ConfigError)
            }
            None => Ok(()),
        };
        let (cfg, invalid_names) = prepared
            .and_then(|(mut cfg, invalid_names)| {
                pre_start?;
                spec::security::apply_image_user(&mut cfg.security, &self.pod, &c, &user?)?;
                cfg.security.pid_target = pid_target;
                let uid = self.pod.metadata.uid.as_deref().unwrap_or("");
                if let Some(opts) = self
                    .env
                    .devices
                    .as_ref()
                    .and_then(|d| d.run_options(uid, &c.name))
                {
                    add_devices(&mut cfg, opts);
                }
                super::dra::add_claim_devices(self.env.dra.as_ref(), &self.pod, &c, &mut cfg)?;
                Ok((cfg, invalid_names))
            })
            .map_err(|e| StartError::CreateContainerConfig {
                message: e.0,
                retry_after: Duration::from_secs(10),
            })?;
        for m in invalid_names {
            self.event(
                None,
                EventType::Warning,
                "InvalidEnvironmentVariableNames",
                &m,
            );
        }
        let id = rt
            .create_container(sandbox_id, &cfg, sandbox)
            .await
            .map_err(|e| StartError::CreateContainer(e.to_string()))?;
        self.note_created(&id, &c);
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

    /// Time left before `activeDeadlineSeconds` (counted from the pod's start time) runs
    /// out; None without a deadline or before the pod started.
    pub(super) fn active_deadline_left(&self) -> Option<Duration> {
        let secs = self.pod.spec.as_ref()?.active_deadline_seconds?;
        let start = self.start_time?;
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
                    && (self.probed.get(&c.name) != Some(&s.id)
                        || !self.env.probes.is_started(&self.uid, &c.name, &s.id))
                {
                    out.insert(s.id.clone());
                }
            }
        }
        out
    }
}

impl Worker {
    /// The pod's pull credentials (pull secrets, then the node's docker config); a pull
    /// secret that cannot be read is a warning, as upstream, and the pull goes on; one whose
    /// docker config does not parse fails the pulls, as upstream.
    pub(super) async fn pull_keyrings(&self) -> PodKeyrings {
        let keyrings = self.env.images.pod_keyrings(&self.pod).await;
        if !keyrings.missing.is_empty() {
            self.event(
                None,
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                &format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    keyrings.missing.join(", ")
                ),
            );
        }
        for message in &keyrings.refused {
            self.event(
                None,
                EventType::Warning,
                images::REFUSED_PULL_SECRET_KEY,
                message,
            );
        }
        keyrings
    }

    /// The service-link variables of the pod (none standalone; an API pod waits for the
    /// Services informer's first list, as upstream).
    fn service_env(&self) -> Result<BTreeMap<String, String>, StartError> {
        self.env
            .pod_env
            .service_env(&self.pod)
            .map_err(|e| StartError::CreateContainerConfig {
                message: e.to_string(),
                retry_after: Duration::from_secs(1),
            })
    }

    /// The ConfigMaps and Secrets container `c`'s env reads (`None`: not found; any other
    /// failure to read one is a CreateContainerConfigError).
    async fn env_objects(&self, c: &K8sContainer) -> Result<spec::EnvObjects, StartError> {
        let mut only = Pod {
            metadata: self.pod.metadata.clone(),
            ..Default::default()
        };
        only.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            containers: vec![c.clone()],
            ..Default::default()
        });
        let mut out = spec::EnvObjects::new();
        let cache = &self.env.objects;
        for key in crate::objects::referenced(&only) {
            match cache.get(&key).await {
                Ok(o) => {
                    out.insert(key, o);
                }
                Err(e) => {
                    return Err(StartError::CreateContainerConfig {
                        message: e.to_string(),
                        retry_after: Duration::from_secs(10),
                    });
                }
            }
        }
        Ok(out)
    }
}

/// A container's device plugin settings into its config, as upstream's run options: the
/// devices' envs and mounts come before the container's own (a spec env of the same name
/// wins, being later), the kubelet's own annotations win over the plugins'.
fn add_devices(cfg: &mut crate::runtime::ContainerConfig, opts: crate::devices::RunOptions) {
    let mut envs = opts.envs;
    envs.append(&mut cfg.envs);
    cfg.envs = envs;
    let mut mounts: Vec<crate::runtime::Mount> = opts
        .mounts
        .into_iter()
        .map(
            |(container_path, host_path, readonly)| crate::runtime::Mount {
                container_path,
                host_path,
                readonly,
                ..Default::default()
            },
        )
        .collect();
    mounts.append(&mut cfg.mounts);
    cfg.mounts = mounts;
    // The plugins' devices, then the block volumes' (the container's volumeDevices), in
    // upstream's order.
    let mut devices: Vec<crate::runtime::DeviceMapping> = opts
        .devices
        .into_iter()
        .map(
            |(container_path, host_path, permissions)| crate::runtime::DeviceMapping {
                container_path,
                host_path,
                permissions,
            },
        )
        .collect();
    devices.append(&mut cfg.devices);
    cfg.devices = devices;
    for (k, v) in opts.annotations {
        cfg.annotations.entry(k).or_insert(v);
    }
    cfg.cdi_devices = opts.cdi_devices;
}
