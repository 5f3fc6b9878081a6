//! A container's mounts as upstream's `makeMounts` builds them: each volume mount's host path
//! (its subPath, or its `subPathExpr` expanded from the container's environment, resolved
//! beforehand by `pod_dirs`), read-only-ness, recursive read-only mode against what the
//! runtime handler reports, propagation, and the SELinux relabel request.

use super::{ConfigError, ContainerEnv, ContainerHostPaths, NodeSettings, must_mount_read_only};
use crate::runtime::{HandlerFeatures, Mount, Propagation};
use k8s_openapi::api::core::v1::{Container, Pod, Volume, VolumeMount};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn err(s: String) -> ConfigError {
    ConfigError(s)
}

/// Upstream's `translateMountPropagation`; `Bidirectional` needs a privileged container (the
/// apiserver's validation says so for API pods; static pods never went through it).
pub fn propagation(c: &Container, m: &VolumeMount) -> Result<Propagation, ConfigError> {
    match m.mount_propagation.as_deref() {
        None | Some("None") => Ok(Propagation::Private),
        Some("HostToContainer") => Ok(Propagation::HostToContainer),
        Some("Bidirectional") => {
            let privileged = c
                .security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false);
            if !privileged {
                return Err(err(
                    "Bidirectional mount propagation is available only to privileged containers"
                        .into(),
                ));
            }
            Ok(Propagation::Bidirectional)
        }
        Some(other) => Err(err(format!("invalid MountPropagation mode: {other:?}"))),
    }
}

/// Upstream's `resolveRecursiveReadOnly`: whether the mount is recursively read-only, given
/// whether the runtime handler supports it.
pub fn recursive_read_only(m: &VolumeMount, supported: bool) -> Result<bool, ConfigError> {
    let mode = match m.recursive_read_only.as_deref() {
        None | Some("Disabled") => return Ok(false),
        Some(mode) => mode,
    };
    let fail = |why: String| {
        err(format!(
            "failed to resolve recursive read-only mode: volume {:?} requested recursive read-only mode, but {why}",
            m.name
        ))
    };
    if !m.read_only.unwrap_or(false) {
        return Err(fail("it is not read-only".into()));
    }
    if let Some(p) = m.mount_propagation.as_deref().filter(|p| *p != "None") {
        return Err(fail(format!("it is not compatible with propagation {p:?}")));
    }
    match mode {
        "IfPossible" => Ok(supported),
        "Enabled" if supported => Ok(true),
        "Enabled" => Err(fail("it is not supported by the runtime".into())),
        other => Err(err(format!(
            "failed to resolve recursive read-only mode: unknown recursive read-only mode {other:?}"
        ))),
    }
}

/// Whether building the container's config needs the runtime handler's features (a mount
/// asks for recursive read-only mode, or the pod for a user namespace).
pub fn wants_runtime_features(pod: &Pod, c: &Container) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_users) == Some(false)
        || c.volume_mounts.iter().flatten().any(|m| {
            m.recursive_read_only
                .as_deref()
                .is_some_and(|r| r != "Disabled")
        })
}

/// Upstream's `ExpandContainerVolumeMounts`: `$(VAR)` references from the container's
/// environment; a reference to a variable that is unset or empty is an error naming it.
pub fn expand_sub_path_expr(
    expr: &str,
    vars: &BTreeMap<String, String>,
) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(expr.len());
    let mut missing = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let (true, Some(end)) = (tail.starts_with("$("), tail.find(')')) {
            let name = &tail[2..end];
            match vars.get(name).filter(|v| !v.is_empty()) {
                Some(v) => out.push_str(v),
                None => {
                    missing.insert(name);
                }
            }
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    if !missing.is_empty() {
        let names: Vec<&str> = missing.into_iter().collect();
        return Err(err(format!("missing value for {}", names.join(", "))));
    }
    Ok(out)
}

/// The mount's subPath: `subPath`, or `subPathExpr` expanded; None for the whole volume.
/// Checked as upstream: relative, without `..`.
pub fn sub_path(
    m: &VolumeMount,
    vars: &BTreeMap<String, String>,
) -> Result<Option<String>, ConfigError> {
    let sp = match m.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
        Some(expr) => expand_sub_path_expr(expr, vars)?,
        None => m.sub_path.clone().unwrap_or_default(),
    };
    if sp.is_empty() {
        return Ok(None);
    }
    if Path::new(&sp).is_absolute() {
        return Err(err(format!(
            "error SubPath `{sp}` must not be an absolute path"
        )));
    }
    if sp.split('/').any(|part| part == "..") {
        return Err(err(format!(
            "unable to provision SubPath `{sp}`: must not contain '..'"
        )));
    }
    Ok(Some(sp))
}

/// Each volume mount's subPath by its index (those that have one).
pub fn sub_paths(
    c: &Container,
    env: &ContainerEnv,
) -> Result<BTreeMap<usize, String>, ConfigError> {
    let vars = env.map();
    let mut out = BTreeMap::new();
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        if let Some(sp) = sub_path(m, &vars)? {
            out.insert(i, sp);
        }
    }
    Ok(out)
}

/// Whether upstream's plugin for the volume is managed and relabels for SELinux (emptyDir and
/// the API-data volumes on it do; hostPath does not).
fn relabels(v: Option<&Volume>) -> bool {
    v.is_some_and(|v| {
        v.empty_dir.is_some()
            || v.config_map.is_some()
            || v.secret.is_some()
            || v.downward_api.is_some()
            || v.projected.is_some()
    })
}

/// The container's mounts: its volume mounts, then /etc/hosts and the termination message
/// file, as upstream orders them.
#[allow(clippy::too_many_arguments)]
pub fn container_mounts(
    node: &NodeSettings,
    pod: &Pod,
    c: &Container,
    volumes: &BTreeMap<String, PathBuf>,
    etc_hosts: Option<&Path>,
    host_paths: &ContainerHostPaths,
    env: &ContainerEnv,
    features: HandlerFeatures,
) -> Result<Vec<Mount>, ConfigError> {
    let vars = env.map();
    let pod_volumes: BTreeMap<&str, &Volume> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .map(|v| (v.name.as_str(), v))
        .collect();
    let mut mounts = Vec::new();
    for (index, m) in c.volume_mounts.iter().flatten().enumerate() {
        let volume = pod_volumes.get(m.name.as_str()).copied();
        if let Some(image) = volume.and_then(|v| v.image.as_ref()) {
            mounts.push(image_mount(m, image, &vars)?);
            continue;
        }
        let host = volumes.get(&m.name).ok_or_else(|| {
            err(format!(
                "cannot find volume {:?} to mount into container {:?}",
                m.name, c.name
            ))
        })?;
        let host = match sub_path(m, &vars)? {
            Some(sp) => host_paths.subpaths.get(&index).cloned().ok_or_else(|| {
                err(format!(
                    "subPath {sp:?} of volume {:?} was not prepared",
                    m.name
                ))
            })?,
            None => host.clone(),
        };
        let propagation = propagation(c, m)?;
        let recursive_read_only = recursive_read_only(m, features.recursive_read_only_mounts)?;
        mounts.push(Mount {
            container_path: m.mount_path.clone(),
            host_path: host.display().to_string(),
            readonly: m.read_only.unwrap_or(false) || must_mount_read_only(pod, &m.name),
            selinux_relabel: node.selinux_enabled
                && relabels(pod_volumes.get(m.name.as_str()).copied()),
            propagation,
            recursive_read_only,
            ..Default::default()
        });
    }
    if let Some(h) = etc_hosts
        && !mounts.iter().any(|m| m.container_path == "/etc/hosts")
    {
        mounts.push(Mount {
            container_path: "/etc/hosts".into(),
            host_path: h.display().to_string(),
            selinux_relabel: node.selinux_enabled,
            ..Default::default()
        });
    }
    // The termination message file: a fresh host file per container instance.
    let term_path = super::termination_message_path(c);
    if let (false, Some(file)) = (term_path.is_empty(), &host_paths.termination_log) {
        mounts.push(Mount {
            container_path: term_path,
            host_path: file.display().to_string(),
            selinux_relabel: node.selinux_enabled,
            ..Default::default()
        });
    }
    Ok(mounts)
}

/// An image volume's mount: the runtime mounts the (pulled) image read-only, or the
/// directory `subPath`/`subPathExpr` names in it (CRI `image_sub_path`), as upstream.
fn image_mount(
    m: &VolumeMount,
    image: &k8s_openapi::api::core::v1::ImageVolumeSource,
    vars: &BTreeMap<String, String>,
) -> Result<Mount, ConfigError> {
    let reference = image.reference.clone().unwrap_or_default();
    if reference.is_empty() {
        return Err(err(format!("image volume {:?} has no reference", m.name)));
    }
    Ok(Mount {
        container_path: m.mount_path.clone(),
        readonly: true,
        image: Some(reference),
        image_sub_path: sub_path(m, vars)?.unwrap_or_default(),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests;
