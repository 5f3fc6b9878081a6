//! node-agent-cni behind containerd's CRI: the project's rig (tests/rig) with the plugin
//! replacing Debian's bridge plugin in the conflist (portmap still chained after it). A pod
//! started through CRI gets its address from the plugin's subnet, answers HTTP on it and
//! through its hostPort, and StopPodSandbox frees the address.
//! Root only; skipped with `SKIPPED: <reason>` without containerd or curl.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use node_tests::netns::{can_run, run_cmd};

const PLUGIN: &str = env!("CARGO_BIN_EXE_node-agent-cni");

const SUBNET_PREFIX: &str = "10.77.0.";

fn rig_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/rig")
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `rig.sh down` on drop, so a failing test leaves no containerd behind.
struct Rig {
    // Kept alive (and removed on drop) while containerd may run the plugin from it.
    name: String,
    bin_dir: tempfile::TempDir,
}

impl Drop for Rig {
    fn drop(&mut self) {
        let mut cmd = Command::new(rig_dir().join("rig.sh"));
        cmd.args(["down", &self.name]);
        let _ = run_cmd(&mut cmd, None);
    }
}

#[test]
fn pod_through_containerd_gets_an_address_from_the_plugin() {
    if !can_run("pod_through_containerd_gets_an_address_from_the_plugin") {
        return;
    }
    for tool in ["containerd", "runc", "curl", "nsenter"] {
        if !have(tool) {
            println!(
                "SKIPPED: pod_through_containerd_gets_an_address_from_the_plugin: {tool} is not installed"
            );
            return;
        }
    }
    // The rig checks its CNI bin dir for the Debian plugins; ours goes next to them.
    let bin_dir = tempfile::tempdir().unwrap();
    std::fs::copy(PLUGIN, bin_dir.path().join("node-agent-cni")).unwrap();
    for p in ["loopback", "portmap", "bridge", "host-local"] {
        std::os::unix::fs::symlink(Path::new("/usr/lib/cni").join(p), bin_dir.path().join(p))
            .unwrap();
    }
    let rig = Rig {
        name: format!("cni-{}", std::process::id()),
        bin_dir,
    };
    let mut up = Command::new(rig_dir().join("rig.sh"));
    up.args(["up", &rig.name])
        .env("CNI_BIN_DIR", rig.bin_dir.path());
    let (code, out, err) = run_cmd(&mut up, None);
    assert_eq!(code, 0, "rig up: {err}");
    let env: HashMap<&str, &str> = out.lines().filter_map(|l| l.split_once('=')).collect();
    let state = PathBuf::from(env["RIG_STATE"]);
    let data_dir = state.join("cni/agent");

    let conflist = serde_json::json!({
        "cniVersion": "1.0.0", "name": "rig",
        "plugins": [
            {"type": "node-agent-cni", "bridge": "cni0", "mtu": 1500,
             "ipam": {"subnet": format!("{SUBNET_PREFIX}0/24")}, "dataDir": data_dir},
            {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true}
        ]
    });
    let conf_dir = state.join("cni/net.d");
    std::fs::write(conf_dir.join("10-rig.conflist.tmp"), conflist.to_string()).unwrap();
    std::fs::rename(
        conf_dir.join("10-rig.conflist.tmp"),
        conf_dir.join("10-rig.conflist"),
    )
    .unwrap();
    // containerd reloads its CNI config on a file event.
    std::thread::sleep(std::time::Duration::from_secs(1));

    let smoke = |mode: &str| {
        let mut cmd = Command::new(rig_dir().join("cri-smoke.sh"));
        cmd.args([&rig.name, mode]);
        run_cmd(&mut cmd, None)
    };
    let (code, out, err) = smoke("run");
    assert_eq!(code, 0, "cri-smoke run: {out}\n{err}");
    let ip = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ip="))
        .unwrap_or_else(|| panic!("no pod IP in {out}"));
    assert!(
        ip.starts_with(SUBNET_PREFIX),
        "pod IP {ip} is not from the plugin's subnet"
    );
    assert!(err.contains("HTTP hostPort via portmap"), "{err}");
    let owner = std::fs::read_to_string(data_dir.join("rig").join(ip)).unwrap();
    assert!(owner.ends_with("\r\neth0"), "{owner:?}");

    let (code, out, err) = smoke("clean");
    assert_eq!(code, 0, "cri-smoke clean: {out}\n{err}");
    assert!(
        !data_dir.join("rig").join(ip).exists(),
        "StopPodSandbox did not free {ip}"
    );
}
