//! What a container's start gathers besides the runtime: the pod's pull credentials, its
//! service-link variables, the ConfigMaps and Secrets its env reads.

use super::ephemeral;
use super::*;
use crate::spec::{ContainerFiles, ContainerInputs};
use k8s_openapi::api::core::v1::EphemeralContainer;
use std::path::PathBuf;

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
        self.env
            .pod_env
            .env_objects(&self.pod, c)
            .await
            .map_err(|e| config_error(e.to_string()))
    }
}

impl Worker {
    /// The spec of the container `s` starts (an ephemeral container as a container, refused
    /// now if admission would refuse it), counted as started; its probes must parse.
    pub(super) fn container_to_start(
        &self,
        s: &Start,
    ) -> Result<(K8sContainer, Option<EphemeralContainer>), StartError> {
        let spec = self.pod.spec.as_ref();
        let inits = spec.and_then(|s| s.init_containers.as_ref());
        let debug = ephemeral::find(&self.pod, &s.name).cloned();
        let c = inits
            .into_iter()
            .flatten()
            .chain(spec.map(|s| &s.containers).into_iter().flatten())
            .find(|c| c.name == s.name)
            .cloned()
            .or_else(|| debug.as_ref().map(ephemeral::as_container))
            .expect("planned containers come from the spec");
        if debug.is_some() {
            // Added after the pod was admitted: the refusals of admission apply now.
            ephemeral::refused(&c, self.env.refusal)?;
        }
        crate::metrics::started_container(inits.into_iter().flatten().any(|i| i.name == s.name));
        if let Err(e) = ::probes::ContainerProbes::from_container(&c) {
            return Err(StartError::CreateContainerConfig {
                message: format!("invalid probe: {e}"),
                retry_after: Duration::from_secs(30),
            });
        }
        Ok((c, debug))
    }

    /// What container `c`'s config is built from, the runtime's answers and the devices
    /// aside: an ephemeral container's target (it must run: checked after the pull, as
    /// upstream), the objects its env reads, the service variables, the pod's IPs and
    /// volumes.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn gather(
        &self,
        c: &K8sContainer,
        debug: Option<&EphemeralContainer>,
        s: &Start,
        sandbox_id: &str,
        sandbox: &SandboxConfig,
        volumes: &BTreeMap<String, PathBuf>,
        obs: &Observed,
    ) -> Result<ContainerInputs, StartError> {
        let pid_target = match debug {
            Some(e) => ephemeral::target_id(e, obs, sandbox_id)?,
            None => None,
        };
        let env_objects = self.env_objects(c).await?;
        let service_env = self.service_env()?;
        Ok(ContainerInputs {
            restart_count: s.restart_count,
            env_objects,
            service_env,
            pod_ips: self.seen.sandbox_ips.1.clone(),
            volumes: volumes.clone(),
            handler: sandbox.runtime_handler.clone(),
            pid_target,
            ..Default::default()
        })
    }

    /// The devices' part of a container's inputs: the device plugins that asked for it hear
    /// of the start first (PreStartContainer), then their run options; the CDI names of the
    /// claims it uses.
    pub(super) async fn device_inputs(
        &self,
        c: &K8sContainer,
        inputs: &mut ContainerInputs,
    ) -> Result<(), StartError> {
        let devices = &self.env.devices;
        let uid = self.pod.metadata.uid.as_deref().unwrap_or("");
        let failed = |e: DeviceError| config_error(e.to_string());
        devices.pre_start(uid, &c.name).await.map_err(failed)?;
        (inputs.devices, inputs.cdi_devices) =
            devices.container_devices(&self.pod, c).map_err(failed)?;
        Ok(())
    }

    /// Makes the container's host files from its inputs (`/etc/hosts`, subPath mounts, the
    /// termination log, the log directory: they touch the disk or grow with the pod, so off
    /// the async workers) and builds its config; the env's invalid names become events.
    pub(super) async fn build_config(
        &self,
        c: &K8sContainer,
        sandbox: &SandboxConfig,
        inputs: ContainerInputs,
    ) -> Result<ContainerConfig, StartError> {
        let (env, pod, container) = (self.env.clone(), self.pod.clone(), c.clone());
        let log_dir = std::path::Path::new(&sandbox.log_directory).join(&c.name);
        let (cfg, invalid_names) = tokio::task::spawn_blocking(move || {
            let node = &env.node;
            let container_env = inputs.env(node, &pod, &container)?;
            let etc_hosts = pod_dirs::write_etc_hosts(node, &pod, &inputs.pod_ips)
                .map_err(|e| spec::ConfigError(e.to_string()))?;
            let paths = pod_dirs::prepare_container(
                node,
                &pod,
                &container,
                inputs.restart_count,
                &inputs.volumes,
                env.binder.as_ref(),
                &container_env,
            )?;
            let files = ContainerFiles {
                env: container_env,
                etc_hosts,
                paths,
            };
            let cfg = spec::build_container_config(node, &pod, &container, inputs, &files)?;
            let _ = std::fs::create_dir_all(&log_dir);
            Ok::<_, spec::ConfigError>((cfg, files.env.invalid_names))
        })
        .await
        .unwrap_or_else(|e| Err(spec::ConfigError(format!("preparing the container: {e}"))))
        .map_err(|e| config_error(e.0))?;
        for m in invalid_names {
            self.event(
                None,
                EventType::Warning,
                "InvalidEnvironmentVariableNames",
                &m,
            );
        }
        Ok(cfg)
    }
}

/// A container config that cannot be built: CreateContainerConfigError, tried again in 10 s.
pub(super) fn config_error(message: String) -> StartError {
    StartError::CreateContainerConfig {
        message,
        retry_after: Duration::from_secs(10),
    }
}
