//! A container's CRI config from what the worker gathered (upstream's
//! `generateContainerConfig`): [`ContainerInputs`] holds every value read from elsewhere (the
//! objects the env reads, the service variables, the pod's IPs, the volumes' host paths, the
//! runtime's answers, the devices' run options and CDI names); [`ContainerInputs::env`] gives
//! the environment the host files are made with (`pod_dirs`, beforehand); and
//! [`build_container_config`] puts them together. Both are pure: a test needs no runtime.

use super::devices::add_devices;
use super::security::apply_image_user;
use super::{
    ConfigError, ContainerEnv, ContainerHostPaths, EnvObjects, ExpandBudget, NodeSettings,
    container_config, container_env,
};
use crate::devices::RunOptions;
use crate::runtime::{ContainerConfig, HandlerFeatures, ImageUser};
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What one container's config is built from besides the node's settings, the pod and the
/// container itself, gathered before the build.
#[derive(Debug, Clone, Default)]
pub struct ContainerInputs {
    /// The attempt being started (its log file, the restart-count annotation).
    pub restart_count: u32,
    /// The ConfigMaps and Secrets the env reads (`None`: not found).
    pub env_objects: EnvObjects,
    /// The service-link variables of the pod's namespace.
    pub service_env: BTreeMap<String, String>,
    /// The sandbox's IPs (`status.podIP(s)` in the downward API).
    pub pod_ips: Vec<String>,
    /// The pod's volumes set up on the host, by volume name.
    pub volumes: BTreeMap<String, PathBuf>,
    /// The sandbox's runtime handler and what it supports.
    pub handler: String,
    pub features: HandlerFeatures,
    /// The image's user: runAsNonRoot is checked against it, and it fills a missing UID.
    pub image_user: ImageUser,
    /// An ephemeral container's target: the container whose PID namespace it shares.
    pub pid_target: Option<String>,
    /// The device plugins' envs, mounts, device nodes, annotations and CDI names.
    pub devices: Option<RunOptions>,
    /// The CDI device names of the ResourceClaims the container uses.
    pub cdi_devices: Vec<String>,
}

/// The host files a container's config names, made from its inputs by `pod_dirs`.
#[derive(Debug, Clone, Default)]
pub struct ContainerFiles {
    pub env: ContainerEnv,
    /// The pod's `/etc/hosts` (None: the runtime's own).
    pub etc_hosts: Option<PathBuf>,
    pub paths: ContainerHostPaths,
}

impl ContainerInputs {
    /// The container's environment: envFrom and env (with the downward API and the node's
    /// allocatable standing in for limits the container does not set), then the service
    /// variables.
    pub fn env(
        &self,
        node: &NodeSettings,
        pod: &Pod,
        c: &Container,
    ) -> Result<ContainerEnv, ConfigError> {
        let gate = node.pod_limits.pod_level_resources;
        container_env(
            pod,
            c,
            &self.pod_ips,
            &node.host_ips,
            &self.env_objects,
            &self.service_env,
            &crate::podspec::downward::limit_defaults(pod, &node.allocatable, gate),
            &mut ExpandBudget::default(),
        )
    }
}

/// The CRI config of container `c` of `pod`: the spec's config, run as the image's user
/// where the spec names none, with the devices' run options (their envs and mounts before the
/// container's own, the kubelet's annotations winning) and the claims' CDI devices after
/// the plugins' ones.
pub fn build_container_config(
    node: &NodeSettings,
    pod: &Pod,
    c: &Container,
    inputs: ContainerInputs,
    files: &ContainerFiles,
) -> Result<ContainerConfig, ConfigError> {
    let mut cfg = container_config(
        node,
        pod,
        c,
        inputs.restart_count,
        &inputs.volumes,
        files.etc_hosts.as_deref(),
        &files.paths,
        &files.env,
        &inputs.handler,
        inputs.features,
    )?;
    apply_image_user(&mut cfg.security, pod, c, &inputs.image_user)?;
    cfg.security.pid_target = inputs.pid_target;
    if let Some(opts) = inputs.devices {
        add_devices(&mut cfg, opts);
    }
    for id in inputs.cdi_devices {
        if !cfg.cdi_devices.contains(&id) {
            cfg.cdi_devices.push(id);
        }
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests;
