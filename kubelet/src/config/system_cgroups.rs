//! The cgroups of the Summary's `node.systemContainers`: `--kubelet-cgroups` /
//! `kubeletCgroups`, `--runtime-cgroups`, `--system-cgroups` / `systemCgroups` (the flag over
//! the file), and where the pod cgroups live.

use super::KubeletConfiguration;
use crate::settings::cli::Flags;
use crate::stats::system::SystemCgroups;

/// The system containers' cgroups; `cgroup_root` and `per_qos` place the pod cgroup root.
pub fn system_cgroups(
    flags: &Flags,
    file: &KubeletConfiguration,
    cgroup_root: &str,
    per_qos: bool,
) -> SystemCgroups {
    let text = |v: &Option<serde_json::Value>| {
        v.as_ref()
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .filter(|s| !s.is_empty())
    };
    let flag = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
    let root = cgroup_root.trim_end_matches('/');
    let pods = if per_qos {
        // cgroupfs: `<root>/kubepods`; systemd: `kubepods.slice` (the driver is known only
        // once the runtime answers: the one that exists is read).
        vec![format!("{root}/kubepods"), "/kubepods.slice".to_string()]
    } else {
        vec![if root.is_empty() {
            "/".into()
        } else {
            root.to_string()
        }]
    };
    SystemCgroups {
        kubelet: flag(&flags.kubelet_cgroups).or_else(|| text(&file.kubelet_cgroups)),
        runtime: flag(&flags.runtime_cgroups),
        misc: flag(&flags.extra.system_cgroups).or_else(|| text(&file.system_cgroups)),
        pods,
    }
}
