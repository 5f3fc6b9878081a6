//! Conversions between the runtime's types and the CRI v1 messages, and the CRI errors.

use super::*;
use cri_proto::v1 as pb;
use std::collections::HashMap;

pub(super) fn err(op: &'static str, s: tonic::Status) -> RuntimeError {
    match s.code() {
        tonic::Code::NotFound => RuntimeError::NotFound {
            op,
            message: s.message().to_string(),
        },
        tonic::Code::Unavailable => RuntimeError::Unavailable(format!("{op}: {}", s.message())),
        _ => RuntimeError::Call {
            op,
            message: format!("{:?}: {}", s.code(), s.message()),
        },
    }
}

pub(super) fn btree(m: HashMap<String, String>) -> BTreeMap<String, String> {
    m.into_iter().collect()
}

pub(super) fn hash(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

pub(super) fn container_state(s: i32) -> ContainerState {
    match pb::ContainerState::try_from(s) {
        Ok(pb::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(pb::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(pb::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

pub(super) fn sandbox_state(s: i32) -> SandboxState {
    if s == pb::PodSandboxState::SandboxReady as i32 {
        SandboxState::Ready
    } else {
        SandboxState::NotReady
    }
}

/// The sandbox's namespaces: the node's where the pod asks for them; else the network and IPC
/// namespaces are the pod's, and the PID namespace the pod's with `shareProcessNamespace`,
/// each container's own otherwise (upstream's namespacesForPod).
pub(super) fn namespaces(c: &SandboxConfig) -> pb::NamespaceOption {
    let mode = |host: bool, otherwise: pb::NamespaceMode| {
        if host {
            pb::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    let pid = if c.share_process_namespace {
        pb::NamespaceMode::Pod
    } else {
        pb::NamespaceMode::Container
    };
    pb::NamespaceOption {
        network: mode(c.host_network, pb::NamespaceMode::Pod),
        pid: mode(c.host_pid, pid),
        ipc: mode(c.host_ipc, pb::NamespaceMode::Pod),
        userns_options: Some(userns(c.userns.as_ref())),
        ..Default::default()
    }
}

/// The pod's user namespace as upstream sends it: mode POD with the pod's mappings, or mode
/// NODE (the node's user namespace) for a pod without `hostUsers: false`.
pub(super) fn userns(u: Option<&UserNamespace>) -> pb::UserNamespace {
    match u {
        None => pb::UserNamespace {
            mode: pb::NamespaceMode::Node as i32,
            ..Default::default()
        },
        Some(u) => pb::UserNamespace {
            mode: pb::NamespaceMode::Pod as i32,
            uids: id_mappings(&u.uids),
            gids: id_mappings(&u.gids),
        },
    }
}

pub(super) fn id_mappings(m: &[IdMapping]) -> Vec<pb::IdMapping> {
    m.iter()
        .map(|m| pb::IdMapping {
            host_id: m.host_id,
            container_id: m.container_id,
            length: m.length,
        })
        .collect()
}

/// One container mount. In a pod with its own user namespace a bind mount is idmapped with
/// the pod's mappings, so the pod's root owns what the node's root owns in its volumes (an
/// image volume is the runtime's to map).
fn mount_pb(m: &Mount, userns: Option<&UserNamespace>) -> pb::Mount {
    let idmap = userns.filter(|_| m.image.is_none());
    pb::Mount {
        container_path: m.container_path.clone(),
        host_path: m.host_path.clone(),
        readonly: m.readonly,
        selinux_relabel: m.selinux_relabel,
        propagation: match m.propagation {
            Propagation::Private => pb::MountPropagation::PropagationPrivate,
            Propagation::HostToContainer => pb::MountPropagation::PropagationHostToContainer,
            Propagation::Bidirectional => pb::MountPropagation::PropagationBidirectional,
        } as i32,
        uid_mappings: idmap.map(|u| id_mappings(&u.uids)).unwrap_or_default(),
        gid_mappings: idmap.map(|u| id_mappings(&u.gids)).unwrap_or_default(),
        recursive_read_only: m.recursive_read_only,
        image: m.image.as_ref().map(|i| pb::ImageSpec {
            image: i.clone(),
            ..Default::default()
        }),
        image_sub_path: m.image_sub_path.clone(),
    }
}

/// A container's namespaces: the sandbox's, except that an ephemeral container with a target
/// joins the target's PID namespace when the pod has one per container (upstream).
pub(super) fn container_namespaces(
    c: &ContainerConfig,
    sandbox: &SandboxConfig,
) -> pb::NamespaceOption {
    let mut ns = namespaces(sandbox);
    if let Some(target) = &c.security.pid_target
        && ns.pid == pb::NamespaceMode::Container as i32
    {
        ns.pid = pb::NamespaceMode::Target as i32;
        ns.target_id = target.clone();
    }
    ns
}

pub(super) fn resources(r: &LinuxResources) -> pb::LinuxContainerResources {
    pb::LinuxContainerResources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit_in_bytes: r.memory_limit_in_bytes,
        oom_score_adj: r.oom_score_adj,
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|(page_size, limit)| pb::HugepageLimit {
                page_size: page_size.clone(),
                limit: *limit,
            })
            .collect(),
        unified: r
            .unified
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        memory_swap_limit_in_bytes: r.memory_swap_limit_in_bytes,
        ..Default::default()
    }
}

pub(super) fn profile(p: &SecurityProfile) -> pb::SecurityProfile {
    use pb::security_profile::ProfileType;
    let (kind, reference) = match p {
        SecurityProfile::RuntimeDefault => (ProfileType::RuntimeDefault, ""),
        SecurityProfile::Unconfined => (ProfileType::Unconfined, ""),
        SecurityProfile::Localhost(r) => (ProfileType::Localhost, r.as_str()),
    };
    pb::SecurityProfile {
        profile_type: kind as i32,
        localhost_ref: reference.into(),
    }
}

pub(super) fn selinux(o: &SeLinuxOptions) -> pb::SeLinuxOption {
    pb::SeLinuxOption {
        user: o.user.clone(),
        role: o.role.clone(),
        r#type: o.type_.clone(),
        level: o.level.clone(),
    }
}

pub(super) fn groups_policy(p: SupplementalGroupsPolicy) -> i32 {
    match p {
        SupplementalGroupsPolicy::Merge => pb::SupplementalGroupsPolicy::Merge as i32,
        SupplementalGroupsPolicy::Strict => pb::SupplementalGroupsPolicy::Strict as i32,
    }
}

pub(super) fn sandbox_security(c: &SandboxConfig) -> pb::LinuxSandboxSecurityContext {
    let s = &c.security;
    pb::LinuxSandboxSecurityContext {
        namespace_options: Some(namespaces(c)),
        selinux_options: s.selinux.as_ref().map(selinux),
        run_as_user: s.run_as_user.map(|value| pb::Int64Value { value }),
        run_as_group: s.run_as_group.map(|value| pb::Int64Value { value }),
        supplemental_groups: s.supplemental_groups.clone(),
        supplemental_groups_policy: groups_policy(s.supplemental_groups_policy),
        privileged: s.privileged,
        seccomp: s.seccomp.as_ref().map(profile),
        ..Default::default()
    }
}

/// The protobuf container security context the runtime gets for `c` in `sandbox`.
pub fn container_security_pb(
    c: &ContainerConfig,
    sandbox: &SandboxConfig,
) -> pb::LinuxContainerSecurityContext {
    let s = &c.security;
    let capabilities =
        (!s.capabilities_add.is_empty() || !s.capabilities_drop.is_empty()).then(|| {
            pb::Capability {
                add_capabilities: s.capabilities_add.clone(),
                drop_capabilities: s.capabilities_drop.clone(),
                ..Default::default()
            }
        });
    #[allow(deprecated)]
    pb::LinuxContainerSecurityContext {
        capabilities,
        privileged: s.privileged,
        namespace_options: Some(container_namespaces(c, sandbox)),
        selinux_options: s.selinux.as_ref().map(selinux),
        run_as_user: s.run_as_user.map(|value| pb::Int64Value { value }),
        run_as_group: s.run_as_group.map(|value| pb::Int64Value { value }),
        run_as_username: s.run_as_username.clone(),
        readonly_rootfs: s.readonly_rootfs,
        supplemental_groups: s.supplemental_groups.clone(),
        supplemental_groups_policy: groups_policy(s.supplemental_groups_policy),
        no_new_privs: s.no_new_privs,
        masked_paths: s.masked_paths.clone(),
        readonly_paths: s.readonly_paths.clone(),
        seccomp: s.seccomp.as_ref().map(profile),
        apparmor: s.apparmor.as_ref().map(profile),
        apparmor_profile: s.apparmor_profile.clone(),
        ..Default::default()
    }
}

/// The protobuf sandbox config the runtime gets for `c`.
pub fn sandbox_pb(c: &SandboxConfig) -> pb::PodSandboxConfig {
    pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: c.name.clone(),
            uid: c.uid.clone(),
            namespace: c.namespace.clone(),
            attempt: c.attempt,
        }),
        hostname: c.hostname.clone(),
        log_directory: c.log_directory.clone(),
        dns_config: c.dns.as_ref().map(|d| pb::DnsConfig {
            servers: d.servers.clone(),
            searches: d.searches.clone(),
            options: d.options.clone(),
        }),
        port_mappings: c
            .port_mappings
            .iter()
            .map(|p| pb::PortMapping {
                protocol: match p.protocol {
                    Protocol::Tcp => pb::Protocol::Tcp,
                    Protocol::Udp => pb::Protocol::Udp,
                    Protocol::Sctp => pb::Protocol::Sctp,
                } as i32,
                container_port: p.container_port,
                host_port: p.host_port,
                host_ip: p.host_ip.clone(),
            })
            .collect(),
        labels: hash(&c.labels),
        annotations: hash(&c.annotations),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: c.cgroup_parent.clone(),
            security_context: Some(sandbox_security(c)),
            sysctls: hash(&c.sysctls),
            resources: c.resources.as_ref().map(resources),
            overhead: c.overhead.as_ref().map(resources),
        }),
        ..Default::default()
    }
}

pub(super) fn container_pb(c: &ContainerConfig, sandbox: &SandboxConfig) -> pb::ContainerConfig {
    pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: c.name.clone(),
            attempt: c.attempt,
        }),
        image: Some(pb::ImageSpec {
            image: c.image.clone(),
            user_specified_image: c.image.clone(),
            ..Default::default()
        }),
        command: c.command.clone(),
        args: c.args.clone(),
        working_dir: c.working_dir.clone(),
        envs: c
            .envs
            .iter()
            .map(|(k, v)| pb::KeyValue {
                key: k.clone(),
                value: v.clone(),
            })
            .collect(),
        mounts: c
            .mounts
            .iter()
            .map(|m| mount_pb(m, sandbox.userns.as_ref()))
            .collect(),
        devices: c
            .devices
            .iter()
            .map(|d| pb::Device {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
        cdi_devices: c
            .cdi_devices
            .iter()
            .map(|n| pb::CdiDevice { name: n.clone() })
            .collect(),
        labels: hash(&c.labels),
        annotations: hash(&c.annotations),
        log_path: c.log_path.clone(),
        stdin: c.stdin,
        stdin_once: c.stdin_once,
        tty: c.tty,
        linux: Some(pb::LinuxContainerConfig {
            resources: Some(resources(&c.resources)),
            security_context: Some(container_security_pb(c, sandbox)),
        }),
        ..Default::default()
    }
}

/// Every handler's features and the runtime's own from a Status answer.
pub(crate) fn runtime_features(r: &pb::StatusResponse) -> RuntimeFeatures {
    RuntimeFeatures {
        handlers: r
            .runtime_handlers
            .iter()
            .map(|h| (h.name.clone(), handler_features(r, &h.name)))
            .collect(),
        supplemental_groups_policy: r.features.as_ref().map(|f| f.supplemental_groups_policy),
    }
}

/// A handler's features from a Status answer; a handler the runtime does not list has none.
pub(crate) fn handler_features(r: &pb::StatusResponse, handler: &str) -> HandlerFeatures {
    r.runtime_handlers
        .iter()
        .find(|h| h.name == handler)
        .and_then(|h| h.features.as_ref())
        .map(|f| HandlerFeatures {
            recursive_read_only_mounts: f.recursive_read_only_mounts,
            user_namespaces: f.user_namespaces,
        })
        .unwrap_or_default()
}

/// The CRI label selector for one pod's objects.
pub(super) fn pod_uid_selector(uid: &str) -> std::collections::HashMap<String, String> {
    [(LABEL_POD_UID.to_string(), uid.to_string())].into()
}
