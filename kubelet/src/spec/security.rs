//! Pod and container `securityContext` → the CRI's Linux security contexts, merged as
//! upstream's kubelet merges them (pkg/securitycontext and kuberuntime's security_context.go):
//! the container's fields override the pod's; seccomp and AppArmor profiles fall back from
//! container to pod (to `RuntimeDefault` under `seccompDefault`); fsGroup and
//! supplementalGroups become supplemental groups; runAsNonRoot is checked against the image's
//! user. Pure: the image user is looked up by the caller.

use super::{ConfigError, NodeSettings};
use crate::runtime::{
    ContainerSecurity, ImageUser, SandboxSecurity, SeLinuxOptions, SecurityProfile,
    SupplementalGroupsPolicy,
};
use k8s_openapi::api::core::v1::{
    AppArmorProfile, Container, Pod, PodSecurityContext, PodSpec, SeccompProfile, SecurityContext,
};
use std::path::Path;

/// Paths masked in every container unless its procMount is `Unmasked` (upstream's
/// defaultMaskedPaths, kept in sync with moby's).
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Paths made read-only unless procMount is `Unmasked` (upstream's defaultReadonlyPaths).
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The pre-GA annotation that still names a container's AppArmor profile.
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The container's effective security context (upstream's DetermineEffectiveSecurityContext):
/// the pod's SELinux options, runAsUser, runAsGroup and runAsNonRoot, overridden by whatever
/// the container sets.
pub fn effective(pod: &Pod, c: &Container) -> SecurityContext {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let mut e = SecurityContext {
        se_linux_options: psc.and_then(|p| p.se_linux_options.clone()),
        windows_options: psc.and_then(|p| p.windows_options.clone()),
        run_as_user: psc.and_then(|p| p.run_as_user),
        run_as_group: psc.and_then(|p| p.run_as_group),
        run_as_non_root: psc.and_then(|p| p.run_as_non_root),
        ..Default::default()
    };
    let Some(csc) = &c.security_context else {
        return e;
    };
    macro_rules! over {
        ($($f:ident),*) => { $( if csc.$f.is_some() { e.$f = csc.$f.clone(); } )* };
    }
    over!(
        se_linux_options,
        windows_options,
        capabilities,
        privileged,
        run_as_user,
        run_as_group,
        run_as_non_root,
        read_only_root_filesystem,
        allow_privilege_escalation,
        proc_mount
    );
    e
}

/// Upstream's AddNoNewPrivileges: set only when allowPrivilegeEscalation is explicitly false.
pub fn no_new_privs(sc: &SecurityContext) -> bool {
    sc.allow_privilege_escalation == Some(false)
}

fn unmasked(sc: &SecurityContext) -> bool {
    sc.proc_mount.as_deref() == Some("Unmasked")
}

/// Masked paths for the container: none with procMount `Unmasked`, else the defaults.
pub fn masked_paths(sc: &SecurityContext) -> Vec<String> {
    if unmasked(sc) {
        return Vec::new();
    }
    DEFAULT_MASKED_PATHS.iter().map(|s| s.to_string()).collect()
}

/// Read-only paths for the container: none with procMount `Unmasked`, else the defaults.
pub fn readonly_paths(sc: &SecurityContext) -> Vec<String> {
    if unmasked(sc) {
        return Vec::new();
    }
    DEFAULT_READONLY_PATHS
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn seccomp_field(
    p: &SeccompProfile,
    root: &Path,
    fallback_default: bool,
) -> Result<SecurityProfile, ConfigError> {
    match p.type_.as_str() {
        "RuntimeDefault" => Ok(SecurityProfile::RuntimeDefault),
        "Localhost" => match p.localhost_profile.as_deref() {
            Some(name) if !name.is_empty() => Ok(SecurityProfile::Localhost(
                root.join(name).display().to_string(),
            )),
            _ => Err(ConfigError(
                "localhostProfile must be set if seccompProfile type is Localhost.".into(),
            )),
        },
        "Unconfined" => Ok(SecurityProfile::Unconfined),
        _ if fallback_default => Ok(SecurityProfile::RuntimeDefault),
        _ => Ok(SecurityProfile::Unconfined),
    }
}

/// The container's seccomp profile: the container's field, else the pod's, else
/// `RuntimeDefault` with `seccompDefault`, else `Unconfined`. Localhost profiles live under
/// `<root-dir>/seccomp/`.
pub fn seccomp(
    psc: Option<&PodSecurityContext>,
    csc: Option<&SecurityContext>,
    root: &Path,
    seccomp_default: bool,
) -> Result<SecurityProfile, ConfigError> {
    if let Some(p) = csc.and_then(|c| c.seccomp_profile.as_ref()) {
        return seccomp_field(p, root, seccomp_default);
    }
    if let Some(p) = psc.and_then(|c| c.seccomp_profile.as_ref()) {
        return seccomp_field(p, root, seccomp_default);
    }
    Ok(if seccomp_default {
        SecurityProfile::RuntimeDefault
    } else {
        SecurityProfile::Unconfined
    })
}

fn apparmor_field(p: &AppArmorProfile) -> Result<(SecurityProfile, String), ConfigError> {
    match p.type_.as_str() {
        "RuntimeDefault" => Ok((SecurityProfile::RuntimeDefault, "runtime/default".into())),
        "Unconfined" => Ok((SecurityProfile::Unconfined, "unconfined".into())),
        "Localhost" => match p.localhost_profile.as_deref() {
            Some(name) if !name.is_empty() => Ok((
                SecurityProfile::Localhost(name.into()),
                format!("localhost/{name}"),
            )),
            _ => Err(ConfigError(
                "missing localhost apparmor profile name".into(),
            )),
        },
        other => Err(ConfigError(format!(
            "unknown apparmor profile type: {other:?}"
        ))),
    }
}

/// The container's AppArmor profile (container field, pod field, then the beta annotation)
/// and its deprecated string form; None lets the runtime apply its default.
pub fn apparmor(
    pod: &Pod,
    c: &Container,
) -> Result<Option<(SecurityProfile, String)>, ConfigError> {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    if let Some(p) = c
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref())
        .or_else(|| psc.and_then(|s| s.app_armor_profile.as_ref()))
    {
        return apparmor_field(p).map(Some);
    }
    let key = format!("{APPARMOR_ANNOTATION_PREFIX}{}", c.name);
    let Some(value) = pod.metadata.annotations.as_ref().and_then(|a| a.get(&key)) else {
        return Ok(None);
    };
    let profile = match value.as_str() {
        "runtime/default" => SecurityProfile::RuntimeDefault,
        "unconfined" => SecurityProfile::Unconfined,
        v => match v.strip_prefix("localhost/") {
            Some(name) if !name.is_empty() => SecurityProfile::Localhost(name.into()),
            _ => {
                return Err(ConfigError(format!(
                    "invalid AppArmor profile annotation {key}: {v:?}"
                )));
            }
        },
    };
    Ok(Some((profile, value.clone())))
}

fn selinux(o: &k8s_openapi::api::core::v1::SELinuxOptions) -> SeLinuxOptions {
    SeLinuxOptions {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        type_: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    }
}

fn groups_policy(
    psc: Option<&PodSecurityContext>,
) -> Result<SupplementalGroupsPolicy, ConfigError> {
    match psc.and_then(|p| p.supplemental_groups_policy.as_deref()) {
        None | Some("Merge") => Ok(SupplementalGroupsPolicy::Merge),
        Some("Strict") => Ok(SupplementalGroupsPolicy::Strict),
        Some(other) => Err(ConfigError(format!(
            "unsupported supplementalGroupsPolicy: {other}"
        ))),
    }
}

/// fsGroup first, then supplementalGroups, as upstream appends them for containers.
fn container_groups(psc: Option<&PodSecurityContext>) -> Vec<i64> {
    let Some(p) = psc else { return Vec::new() };
    p.fs_group
        .into_iter()
        .chain(p.supplemental_groups.iter().flatten().copied())
        .collect()
}

/// `hostUsers: false` needs the runtime handler to report user namespace support (upstream's
/// message when it does not, as containerd 1.6 never does). The sandbox is refused first
/// (`userns`); this keeps a container from ever being built for such a pod without it.
pub fn check_user_namespace(
    pod: &Pod,
    handler: &str,
    features: crate::runtime::HandlerFeatures,
) -> Result<(), ConfigError> {
    if pod.spec.as_ref().and_then(|s| s.host_users) != Some(false) || features.user_namespaces {
        return Ok(());
    }
    Err(ConfigError(if handler.is_empty() {
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces".into()
    } else {
        format!(
            "can't set `spec.hostUsers: false`, RuntimeClass handler {handler:?} does not support user namespaces"
        )
    }))
}

/// The container's security settings, before the image user is known (see [`apply_image_user`]).
pub fn container_security(
    node: &NodeSettings,
    pod: &Pod,
    c: &Container,
) -> Result<ContainerSecurity, ConfigError> {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let e = effective(pod, c);
    let caps = e.capabilities.clone().unwrap_or_default();
    let apparmor = apparmor(pod, c)?;
    Ok(ContainerSecurity {
        privileged: e.privileged.unwrap_or(false),
        readonly_rootfs: e.read_only_root_filesystem.unwrap_or(false),
        run_as_user: e.run_as_user,
        run_as_username: String::new(),
        run_as_group: e.run_as_group,
        supplemental_groups: container_groups(psc),
        supplemental_groups_policy: groups_policy(psc)?,
        capabilities_add: caps.add.unwrap_or_default(),
        capabilities_drop: caps.drop.unwrap_or_default(),
        no_new_privs: no_new_privs(&e),
        masked_paths: masked_paths(&e),
        readonly_paths: readonly_paths(&e),
        seccomp: Some(seccomp(
            psc,
            c.security_context.as_ref(),
            &node.root_dir.join("seccomp"),
            node.seccomp_default,
        )?),
        apparmor_profile: apparmor.as_ref().map(|a| a.1.clone()).unwrap_or_default(),
        apparmor: apparmor.map(|a| a.0),
        selinux: e.se_linux_options.as_ref().map(selinux),
        // Set by the pod worker for an ephemeral container with a target.
        pid_target: None,
    })
}

/// `name_namespace(uid)`, upstream's format.Pod.
fn pod_desc(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.uid.as_deref().unwrap_or("")
    )
}

/// Upstream's verifyRunAsNonRoot, with its messages: with runAsNonRoot, a runAsUser of 0, an
/// image running as UID 0, an image user that is a name (cannot be verified) or an invalid
/// UID is refused (reported as `CreateContainerConfigError`).
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    user: &ImageUser,
) -> Result<(), ConfigError> {
    let e = effective(pod, c);
    if e.run_as_non_root != Some(true) {
        return Ok(());
    }
    let who = pod_desc(pod);
    if let Some(uid) = e.run_as_user {
        if uid == 0 {
            return Err(ConfigError(format!(
                "container's runAsUser breaks non-root policy (pod: {who:?}, container: {})",
                c.name
            )));
        }
        return Ok(());
    }
    match user.uid {
        None if !user.username.is_empty() => Err(ConfigError(format!(
            "container has runAsNonRoot and image has non-numeric user ({}), cannot verify user is non-root (pod: {who:?}, container: {})",
            user.username, c.name
        ))),
        Some(0) => Err(ConfigError(format!(
            "container has runAsNonRoot and image will run as root (pod: {who:?}, container: {})",
            c.name
        ))),
        Some(uid) if !(0..=i64::from(i32::MAX)).contains(&uid) => Err(ConfigError(format!(
            "container has runAsNonRoot and image has an invalid user id ({uid}). (Must be 1-({})): must be between 0 and {}, inclusive (pod: {who:?}, container: {})",
            i32::MAX,
            i32::MAX,
            c.name
        ))),
        _ => Ok(()),
    }
}

/// Checks runAsNonRoot against the image's user and, when the spec names no UID, runs the
/// container as the image's UID (or its user name), as upstream does.
pub fn apply_image_user(
    sec: &mut ContainerSecurity,
    pod: &Pod,
    c: &Container,
    user: &ImageUser,
) -> Result<(), ConfigError> {
    verify_run_as_non_root(pod, c, user)?;
    if sec.run_as_user.is_none() {
        match user.uid {
            Some(uid) => sec.run_as_user = Some(uid),
            None => sec.run_as_username = user.username.clone(),
        }
    }
    Ok(())
}

/// True when any container (init, regular or ephemeral) is privileged.
pub fn has_privileged_container(spec: &PodSpec) -> bool {
    let privileged =
        |sc: &Option<SecurityContext>| sc.as_ref().and_then(|s| s.privileged).unwrap_or(false);
    spec.containers
        .iter()
        .any(|c| privileged(&c.security_context))
        || spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| privileged(&c.security_context))
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| privileged(&c.security_context))
}

/// The sandbox's security settings (upstream's generatePodSandboxLinuxConfig): privileged
/// when any container is, always the runtime's default seccomp profile (so pods can use
/// least-privilege profiles), and the pod's runAsUser/runAsGroup, fsGroup and
/// supplementalGroups.
/// An unknown supplementalGroupsPolicy falls back to Merge here; the containers' configs
/// refuse it.
pub fn sandbox_security(pod: &Pod) -> SandboxSecurity {
    let spec = pod.spec.clone().unwrap_or_default();
    let psc = spec.security_context.as_ref();
    SandboxSecurity {
        privileged: has_privileged_container(&spec),
        run_as_user: psc.and_then(|p| p.run_as_user),
        run_as_group: psc.and_then(|p| p.run_as_group),
        supplemental_groups: container_groups(psc),
        supplemental_groups_policy: groups_policy(psc).unwrap_or_default(),
        seccomp: Some(SecurityProfile::RuntimeDefault),
        selinux: psc.and_then(|p| p.se_linux_options.as_ref()).map(selinux),
    }
}

#[cfg(test)]
mod tests;
