//! A pass's actions: observe the pod in the runtime, create its sandbox, pull images and
//! start containers as the plan says, stop the ones it no longer wants.

use super::*;

/// Reads the pod's sandboxes and containers from the runtime, newest first.
pub async fn observe(rt: &dyn Runtime, uid: &str) -> Result<Observed> {
    let mut sandboxes: Vec<Sandbox> = rt
        .list_sandboxes()
        .await?
        .into_iter()
        .filter(|s| s.pod_uid == uid)
        .collect();
    sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let listed: Vec<Container> = rt
        .list_containers()
        .await?
        .into_iter()
        .filter(|c| c.labels.get(LABEL_POD_UID).map(String::as_str) == Some(uid))
        .collect();
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
}

impl StartError {
    pub fn reason(&self) -> &'static str {
        match self {
            StartError::Image(e) => e.reason.as_str(),
            StartError::CreateContainerConfig { .. } => "CreateContainerConfigError",
            StartError::CreateContainer(_) => "CreateContainerError",
            StartError::RunContainer(_) => "RunContainerError",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            StartError::Image(e) => &e.message,
            StartError::CreateContainerConfig { message, .. } => message,
            StartError::CreateContainer(m) | StartError::RunContainer(m) => m,
        }
    }

    /// When to try again.
    pub fn retry_after(&self) -> Duration {
        match self {
            StartError::Image(e) => e.retry_after,
            StartError::CreateContainerConfig { retry_after, .. } => *retry_after,
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

impl Worker {
    /// One level-triggered pass. Returns when to come back (at the latest).
    pub async fn sync(&mut self) -> Duration {
        let rt = self.env.runtime.clone();
        let obs = match observe(rt.as_ref(), &self.uid).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "cannot observe pod in the runtime; will retry");
                return Duration::from_secs(1);
            }
        };
        let now = Instant::now();
        let killed_for_probes = self.kill_for_probes(&obs).await;
        let obs = if killed_for_probes {
            observe(rt.as_ref(), &self.uid).await.unwrap_or(obs)
        } else {
            obs
        };
        let p = plan(&self.pod, &obs, &mut self.backoff, now);
        let acted = p.kill_pod
            || p.create_sandbox.is_some()
            || !p.start.is_empty()
            || !p.kill.is_empty()
            || !p.remove.is_empty();
        for (name, w) in &p.waiting {
            if w.reason == "CrashLoopBackOff" {
                let message = format!(
                    "Back-off restarting failed container {name} in pod {}",
                    pod_ref(&self.pod)
                );
                self.event(Some(name), EventType::Warning, "BackOff", &message);
            }
        }
        let mut wake = p.wake_after;
        let grace = self.grace();
        if p.kill_pod {
            tracing::info!("stopping pod's containers and sandbox");
            self.stop_containers(&obs, grace).await;
            if let Some(sb) = obs.sandboxes.first()
                && let Err(e) = rt.stop_sandbox(&sb.id).await
            {
                tracing::warn!(error = %e, sandbox = %sb.id, "StopPodSandbox failed");
            }
        }
        for (id, name) in &p.kill {
            tracing::info!(container = %name, "container spec changed, will be restarted");
            self.event(
                Some(name),
                EventType::Normal,
                "Killing",
                &format!("Container {name} definition changed, will be restarted"),
            );
            let _ = rt.stop_container(id, grace).await;
        }
        for id in &p.remove {
            if let Err(e) = rt.remove_container(id).await {
                tracing::debug!(error = %e, container = %id, "RemoveContainer failed");
            }
        }
        let mut sandbox = obs
            .sandboxes
            .first()
            .filter(|s| s.state == SandboxState::Ready)
            .map(|s| (s.id.clone(), s.attempt));
        if let Some(attempt) = p.create_sandbox {
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
                    for s in &p.start {
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
            if self.sandbox_ips.0 != *sandbox_id {
                let ips = rt
                    .sandbox_status(sandbox_id)
                    .await
                    .map(|s| s.ips)
                    .unwrap_or_default();
                self.sandbox_ips = (sandbox_id.clone(), ips);
            }
            let sandbox_cfg = self.sandbox_config(*attempt);
            for s in &p.start {
                match self.start_container(sandbox_id, &sandbox_cfg, s).await {
                    Ok(()) => {
                        self.errors.remove(&s.name);
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
                        let retry = e.retry_after();
                        wake = Some(wake.map_or(retry, |x| x.min(retry)));
                        // Init containers run in order: stop at the first failure.
                        if s.init {
                            break;
                        }
                    }
                }
            }
        }
        let obs = if acted {
            observe(rt.as_ref(), &self.uid).await.unwrap_or(obs)
        } else {
            obs
        };
        let mut waiting = self.errors.clone();
        waiting.extend(p.waiting.clone());
        self.update_probes(&obs);
        self.publish(&obs, waiting, false);
        wake.unwrap_or(self.env.resync).min(self.env.resync)
    }

    pub(super) async fn stop_containers(&self, obs: &Observed, grace: Duration) {
        let rt = &self.env.runtime;
        let stops = obs
            .containers
            .iter()
            .filter(|(_, c)| c.state == ContainerState::Running)
            .map(|(_, c)| async move {
                self.event(
                    Some(&c.name),
                    EventType::Normal,
                    "Killing",
                    &format!("Stopping container {}", c.name),
                );
                tracing::info!(container = %c.name, grace_seconds = grace.as_secs(), "Killing container with a grace period");
                if let Err(e) = rt.stop_container(&c.id, grace).await {
                    tracing::warn!(container = %c.name, error = %e, "StopContainer failed");
                }
            });
        futures::future::join_all(stops).await;
    }

    pub(super) async fn create_sandbox(&mut self, attempt: u32) -> Result<String, String> {
        let cfg = self.sandbox_config(attempt);
        if let Some(path) = self.env.namer.pod_path(self.qos(), &self.uid)
            && let Err(e) = self.env.cgroups.create(&path)
        {
            tracing::warn!(error = %e, "cannot create pod cgroup; the runtime will create it");
        }
        std::fs::create_dir_all(&cfg.log_directory)
            .map_err(|e| format!("creating {}: {e}", cfg.log_directory))?;
        let id = self
            .env
            .runtime
            .run_sandbox(&cfg)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(sandbox = %id, attempt, "sandbox started");
        self.start_time.get_or_insert_with(Timestamp::now);
        Ok(id)
    }

    /// Pulls if needed, creates and starts one container. On failure: the waiting reason and
    /// when to retry.
    pub(super) async fn start_container(
        &mut self,
        sandbox_id: &str,
        sandbox: &SandboxConfig,
        s: &Start,
    ) -> Result<(), StartError> {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let c = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .find(|c| c.name == s.name)
            .cloned()
            .expect("planned containers come from the spec");
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
        let puller = images::Puller {
            runtime: self.env.runtime.as_ref(),
            pull_lock: &self.env.pull_lock,
            event: &event,
        };
        images::ensure_image(&puller, &mut self.pulls, &c, sandbox)
            .await
            .map_err(StartError::Image)?;
        // Volume directories, /etc/hosts, subPath mounts and the log directory touch the
        // disk: off the async workers.
        let (env, pod, container) = (self.env.clone(), self.pod.clone(), c.clone());
        let (restart_count, pod_ips) = (s.restart_count, self.sandbox_ips.1.clone());
        let log_dir = std::path::Path::new(&sandbox.log_directory).join(&c.name);
        let prepared = tokio::task::spawn_blocking(move || {
            let volumes = pod_dirs::prepare_volumes(&env.node, &pod)?;
            let hosts = pod_dirs::write_etc_hosts(&env.node, &pod, &pod_ips)
                .map_err(|e| spec::ConfigError(e.to_string()))?;
            let host_paths = pod_dirs::prepare_container(
                &env.node,
                &pod,
                &container,
                restart_count,
                &volumes,
                env.binder.as_ref(),
            )?;
            let cfg = spec::container_config(
                &env.node,
                &pod,
                &container,
                restart_count,
                &pod_ips,
                &volumes,
                hosts.as_deref(),
                &host_paths,
            )?;
            let _ = std::fs::create_dir_all(&log_dir);
            Ok::<_, spec::ConfigError>(cfg)
        })
        .await
        .unwrap_or_else(|e| Err(spec::ConfigError(format!("preparing the container: {e}"))));
        let cfg = prepared.map_err(|e| StartError::CreateContainerConfig {
            message: e.0,
            retry_after: Duration::from_secs(10),
        })?;
        let rt = &self.env.runtime;
        let id = rt
            .create_container(sandbox_id, &cfg, sandbox)
            .await
            .map_err(|e| StartError::CreateContainer(e.to_string()))?;
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
        Ok(())
    }
}
