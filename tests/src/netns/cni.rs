//! Running a CNI plugin binary as a container runtime does (the `cni` crate's namespace tests).

use std::path::Path;
use std::process::Command;

use super::run_in;

/// Runs the plugin `binary` from inside the namespace `host` with only `PATH` and `env` in its
/// environment and `stdin` (the network config) on its stdin; (exit code, stdout, stderr).
pub fn run_plugin(
    binary: &str,
    host: &Path,
    env: &[(&str, String)],
    stdin: &str,
) -> (i32, String, String) {
    let mut cmd = Command::new(binary);
    cmd.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_in(host, &mut cmd, Some(stdin))
}

/// The `CNI_*` environment for one command.
pub fn cni_env(
    command: &str,
    container: &str,
    netns: &Path,
    ifname: &str,
    path: &str,
) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_COMMAND", command.to_string()),
        ("CNI_CONTAINERID", container.to_string()),
        ("CNI_NETNS", netns.display().to_string()),
        ("CNI_IFNAME", ifname.to_string()),
        ("CNI_PATH", path.to_string()),
    ]
}
