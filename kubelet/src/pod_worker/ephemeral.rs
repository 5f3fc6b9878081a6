//! Ephemeral containers (`kubectl debug`): entries of `spec.ephemeralContainers` run once in
//! the pod's sandbox, are never restarted, get no probes, ports or lifecycle hooks, and with a
//! `targetContainerName` join that container's PID namespace (upstream's startSpec).

use super::*;
use k8s_openapi::api::core::v1::EphemeralContainer;

/// The ephemeral container named `name` of `pod`.
pub fn find<'a>(pod: &'a Pod, name: &str) -> Option<&'a EphemeralContainer> {
    pod.spec
        .as_ref()?
        .ephemeral_containers
        .iter()
        .flatten()
        .find(|e| e.name == name)
}

/// An ephemeral container as the container the runtime runs: its image, command, env, mounts
/// and security context; never probes, ports, lifecycle hooks, resources, restart rules or
/// volumeDevices
/// (the API refuses them; a static pod's manifest is not validated, so they are dropped here).
pub fn as_container(e: &EphemeralContainer) -> K8sContainer {
    K8sContainer {
        name: e.name.clone(),
        image: e.image.clone(),
        image_pull_policy: e.image_pull_policy.clone(),
        command: e.command.clone(),
        args: e.args.clone(),
        working_dir: e.working_dir.clone(),
        env: e.env.clone(),
        env_from: e.env_from.clone(),
        volume_mounts: e.volume_mounts.clone(),
        security_context: e.security_context.clone(),
        stdin: e.stdin,
        stdin_once: e.stdin_once,
        tty: e.tty,
        termination_message_path: e.termination_message_path.clone(),
        termination_message_policy: e.termination_message_policy.clone(),
        ..Default::default()
    }
}

/// An ephemeral container is added to a pod already admitted: a value admission refuses in
/// a container (e.g. an env `fileKeyRef`) fails its start with the same message instead.
pub fn refused(c: &K8sContainer, refusal: super::deps::Refusal) -> Result<(), StartError> {
    let only = Pod {
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            containers: vec![c.clone()],
            ..Default::default()
        }),
        ..Default::default()
    };
    match refusal(&only) {
        Some((_, message)) => Err(StartError::CreateContainerConfig {
            message: message.into(),
            retry_after: Duration::from_secs(30),
        }),
        None => Ok(()),
    }
}

/// The ID of the running container an ephemeral container targets (None: no target). A
/// target that does not run fails the start as upstream does (CreateContainerConfigError).
pub fn target_id(
    e: &EphemeralContainer,
    obs: &Observed,
    sandbox: &str,
) -> Result<Option<String>, StartError> {
    let Some(target) = e.target_container_name.as_deref().filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    match obs.newest(target, Some(sandbox)) {
        Some(s) if s.state == ContainerState::Running => Ok(Some(s.id.clone())),
        _ => Err(StartError::CreateContainerConfig {
            message: format!("unable to find target container {target}"),
            retry_after: Duration::from_secs(10),
        }),
    }
}

#[cfg(test)]
mod tests;
