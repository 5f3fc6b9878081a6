//! SELinux mount labels of volumes (KEP-1710, upstream's `pkg/volume/util/selinux.go` and the
//! label part of the volume manager's desired state).
//!
//! On an SELinux host, a volume whose CSI driver says `seLinuxMount: true`, whose access modes
//! allow it (ReadWriteOncePod only; every PV with the `SELinuxMount` gate, beta and off by
//! default in v1.36) and whose pod does not ask for `seLinuxChangePolicy: Recursive` is mounted
//! with `-o context="<label>"` (NodeStageVolume and NodePublishVolume mount flags), and the
//! runtime is then not asked to relabel it. The label is the file label of the containers
//! that mount the volume: the host's container file context (`lxc_contexts`' `file` entry of
//! the loaded policy) with a fresh MCS level, the user and level of the container's (or else
//! the pod's) `seLinuxOptions` over it, as `go-selinux`' `InitLabels` builds it for upstream.
//!
//! The host is a value read once at start ([`SeLinuxHost::detect`]); tests build it
//! directly. Conflicts between pods and between a pod's containers are kept by
//! `volume::selinux_registry::SeLinuxVolumes`.
//!
//! One deliberate difference: upstream formats the option with Go's `%q`, which escapes a `"`
//! in the label as `\"`; the kernel's mount option parser knows no escapes, so such a label
//! would end the quoted value early and add options of the pod's choosing. A label field with
//! a `"`, a `\` or a control character is refused here (a translation error, as upstream counts
//! one) instead of reaching a mount.

use std::hash::{BuildHasher, Hasher};
use std::path::Path;

use k8s_openapi::api::core::v1::{Pod, SELinuxOptions};

/// The feature gate that extends mount labels from ReadWriteOncePod volumes to every access
/// mode (beta, default off in v1.36). `SELinuxMountReadWriteOncePod` and `SELinuxChangePolicy`
/// are GA and locked on in v1.36.
pub const SELINUX_MOUNT_GATE: &str = "SELinuxMount";

/// The key of `vol_data.json` recording the label a volume was published with (upstream's
/// `volDataKey.seLinuxMountContext`).
pub const VOL_DATA_KEY: &str = "seLinuxMountContext";

/// The host's SELinux: whether it is on and the container contexts of its policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeLinuxHost {
    pub enabled: bool,
    /// `lxc_contexts`' `process` entry (empty: not found).
    pub process_context: String,
    /// `lxc_contexts`' `file` entry (empty: not found).
    pub file_context: String,
}

/// A label that cannot be built from a container's options (upstream's
/// SELinuxLabelTranslationError).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TranslationError(pub String);

impl SeLinuxHost {
    /// A host without SELinux.
    pub fn disabled() -> SeLinuxHost {
        SeLinuxHost::default()
    }

    /// Reads the host below `/`. Blocking (small files).
    pub fn detect() -> SeLinuxHost {
        SeLinuxHost::detect_at(Path::new("/"))
    }

    /// Reads the host below `root`: SELinux is on when `sys/fs/selinux/enforce` exists (the
    /// selinuxfs is mounted); the contexts come from
    /// `etc/selinux/<SELINUXTYPE of etc/selinux/config>/contexts/lxc_contexts`, as go-selinux
    /// reads them. Blocking.
    pub fn detect_at(root: &Path) -> SeLinuxHost {
        if !root.join("sys/fs/selinux/enforce").exists() {
            return SeLinuxHost::disabled();
        }
        let policy = std::fs::read_to_string(root.join("etc/selinux/config"))
            .ok()
            .and_then(|t| config_value(&t, "SELINUXTYPE"))
            .unwrap_or_default();
        let mut host = SeLinuxHost {
            enabled: true,
            ..SeLinuxHost::default()
        };
        if policy.is_empty() || policy.contains('/') {
            return host;
        }
        let path = root
            .join("etc/selinux")
            .join(&policy)
            .join("contexts/lxc_contexts");
        if let Ok(text) = std::fs::read_to_string(path) {
            host.process_context = config_value(&text, "process").unwrap_or_default();
            host.file_context = config_value(&text, "file").unwrap_or_default();
        }
        host
    }

    /// The file label of a container process with `opts` (upstream's
    /// SELinuxOptionsToFileLabel through go-selinux' InitLabels): empty when SELinux is off or
    /// no field is set; else the policy's container file context with a fresh MCS level
    /// (`level`, when the policy's process context has a level), then the options' user and
    /// level over it (their role and type are the process's, not the file's).
    pub fn file_label(
        &self,
        opts: &SELinuxOptions,
        level: impl FnOnce() -> String,
    ) -> Result<String, TranslationError> {
        if !self.enabled {
            return Ok(String::new());
        }
        let fields = [&opts.user, &opts.role, &opts.type_, &opts.level];
        if fields.iter().all(|f| f.as_deref().unwrap_or("").is_empty()) {
            return Ok(String::new());
        }
        for f in fields.into_iter().flatten() {
            if f.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
                return Err(TranslationError(format!(
                    "SELinux option {} contains a quote, a backslash or a control character",
                    go_quote(f)
                )));
            }
        }
        if self.process_context.is_empty() || self.file_context.is_empty() {
            // go-selinux without container contexts: the file context as it is.
            return Ok(self.file_context.clone());
        }
        let process = Context::parse(&self.process_context)?;
        let mut file = Context::parse(&self.file_context)?;
        if !process.level.is_empty() {
            file.level = level();
        }
        if let Some(u) = opts.user.as_deref().filter(|u| !u.is_empty()) {
            file.user = u.to_string();
        }
        if let Some(l) = opts.level.as_deref().filter(|l| !l.is_empty()) {
            file.level = l.to_string();
        }
        Ok(file.to_string())
    }
}

/// `key = value` (or `KEY=value`) of a config file, quotes trimmed; `#` and `;` start comments.
fn config_value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
}

/// An SELinux context `user:role:type[:level]` (the level may hold `:` and `,`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Context {
    user: String,
    role: String,
    kind: String,
    level: String,
}

impl Context {
    fn parse(s: &str) -> Result<Context, TranslationError> {
        let mut parts = s.splitn(4, ':');
        let (Some(user), Some(role), Some(kind)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(TranslationError(format!(
                "context {} has fewer than three fields",
                go_quote(s)
            )));
        };
        Ok(Context {
            user: user.into(),
            role: role.into(),
            kind: kind.into(),
            level: parts.next().unwrap_or_default().into(),
        })
    }
}

impl std::fmt::Display for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.user, self.role, self.kind)?;
        if !self.level.is_empty() {
            write!(f, ":{}", self.level)?;
        }
        Ok(())
    }
}

/// A fresh MCS level `s0:cA,cB` (A < B < 1024), as go-selinux' uniqMcs picks one.
pub fn random_level() -> String {
    let draw = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0);
        (h.finish() % 1024) as u32
    };
    loop {
        let (a, b) = (draw(), draw());
        if a != b {
            return format!("s0:c{},c{}", a.min(b), a.max(b));
        }
    }
}

/// Go's `%q` of a string: double quotes, with `\"`, `\\`, the C escapes and `\x`/`\u`/`\U`
/// for other non-printable characters.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => {
                if (c as u32) < 0x10000 {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The mount flag of a label (upstream's AddSELinuxMountOption): `context="<label>"`, quoted
/// so that the commas of an MCS level stay inside the value.
pub fn mount_option(label: &str) -> String {
    format!("context={}", go_quote(label))
}

/// The options as upstream's error messages print a `*v1.SELinuxOptions` with `%q`.
pub fn go_quote_options(o: &SELinuxOptions) -> String {
    let q = |f: &Option<String>| go_quote(f.as_deref().unwrap_or(""));
    format!(
        "&{{{} {} {} {}}}",
        q(&o.user),
        q(&o.role),
        q(&o.type_),
        q(&o.level)
    )
}

/// The effective `seLinuxOptions` of each container of the pod that mounts `volume` (init,
/// regular and ephemeral containers), as upstream's GetPodVolumeNames collects them: the
/// container's own options, else the pod's; containers with neither add nothing.
pub fn container_options(pod: &Pod, volume: &str) -> Vec<SELinuxOptions> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let pod_opts = spec
        .security_context
        .as_ref()
        .and_then(|s| s.se_linux_options.as_ref());
    let mut out = Vec::new();
    let mut visit = |mounts: Option<&Vec<k8s_openapi::api::core::v1::VolumeMount>>,
                     own: Option<&SELinuxOptions>| {
        let uses = mounts.is_some_and(|ms| ms.iter().any(|m| m.name == volume));
        if let (true, Some(o)) = (uses, own.or(pod_opts)) {
            out.push(o.clone());
        }
    };
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        let own = c
            .security_context
            .as_ref()
            .and_then(|s| s.se_linux_options.as_ref());
        visit(c.volume_mounts.as_ref(), own);
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        let own = c
            .security_context
            .as_ref()
            .and_then(|s| s.se_linux_options.as_ref());
        visit(c.volume_mounts.as_ref(), own);
    }
    out
}

/// Whether the pod opted out of mount labels (`securityContext.seLinuxChangePolicy:
/// Recursive`).
pub fn recursive_policy(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.se_linux_change_policy.as_deref())
        == Some("Recursive")
}

/// Whether a volume's access modes allow a mount label (upstream's
/// VolumeSupportsSELinuxMount): only PVs; every PV with the `SELinuxMount` gate, else a PV
/// whose only access mode is ReadWriteOncePod.
pub fn access_modes_allow(pv: bool, access_modes: &[String], selinux_mount_gate: bool) -> bool {
    if !pv {
        return false;
    }
    selinux_mount_gate || (access_modes.len() == 1 && access_modes[0] == "ReadWriteOncePod")
}

/// Upstream's `access_mode` metric label of a volume: `inline` without a PV, else the
/// "highest" mode of the PV: RWX, ROX, RWO, RWOP.
pub fn access_mode_label(pv: bool, access_modes: &[String]) -> &'static str {
    if !pv {
        return "inline";
    }
    let has = |m: &str| access_modes.iter().any(|x| x == m);
    if has("ReadWriteMany") {
        "RWX"
    } else if has("ReadOnlyMany") {
        "ROX"
    } else if has("ReadWriteOnce") {
        "RWO"
    } else if has("ReadWriteOncePod") {
        "RWOP"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests;
