//! Small helpers the e2e tests share: polling, reading pod JSON, systemd environment files.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// Polls `f` every 200 ms until it returns Some, or panics after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The status of container `name` in a pod object.
pub fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

/// The condition of `type_` in a pod object (`Value::Null` when absent).
pub fn pod_condition<'a>(pod: &'a Value, type_: &str) -> &'a Value {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

/// Every mount point at or below `dir` in this mount namespace, deepest first (from
/// /proc/self/mountinfo, its `\ooo` escapes decoded).
pub fn mounts_below(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    mounts
}

fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) if b[i] == b'\\' => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Lazily unmounts every mount at or below `dir` (deepest first). The agent leaves its
/// root directory's shared bind mount in place when it stops (as upstream's kubelet does),
/// and pods left running keep their volumes' mounts: a test's temporary root must be
/// unmounted before it can be removed.
pub fn unmount_below(dir: &Path) {
    for _ in 0..3 {
        let mounts = mounts_below(dir);
        if mounts.is_empty() {
            return;
        }
        for m in mounts {
            let _ = nix::mount::umount2(Path::new(&m), nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Parses systemd `EnvironmentFile` text (`KEY=value`, `KEY="value"`, comments).
pub fn parse_env_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            (k.trim().to_string(), v.to_string())
        })
        .collect()
}

/// The kubelet command line systemd builds from kubeadm's `10-kubeadm.conf` drop-in:
/// `$KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS`,
/// the first two from the drop-in's `Environment=` lines, the others from the environment files.
pub fn kubeadm_command_line(env: &BTreeMap<String, String>) -> Vec<String> {
    [
        "KUBELET_KUBECONFIG_ARGS",
        "KUBELET_CONFIG_ARGS",
        "KUBELET_KUBEADM_ARGS",
        "KUBELET_EXTRA_ARGS",
    ]
    .iter()
    .filter_map(|k| env.get(*k))
    .flat_map(|v| v.split_whitespace().map(str::to_string))
    .collect()
}
