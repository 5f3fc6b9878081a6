//! The node rig (tests/rig/rig.sh): a private containerd in its own network namespace, and
//! the checks that say whether it can run here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Repository root (this crate lives in `<root>/tests`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rig_sh() -> PathBuf {
    repo_root().join("tests/rig/rig.sh")
}

/// Why these tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root: the node rig needs root (network namespaces, containerd)".into());
    }
    for bin in ["containerd", "runc", "nsenter", "curl", "ip"] {
        if !crate::netns::have(bin) {
            return Some(format!(
                "{bin} is not installed: run `tests/rig/rig.sh install` first"
            ));
        }
    }
    None
}

/// Skips the calling test (with the reason printed) when the rig cannot run here.
#[macro_export]
macro_rules! require_rig {
    () => {
        if let Some(reason) = $crate::skip_reason() {
            eprintln!("SKIPPED: {reason}");
            return;
        }
    };
}

/// A started rig; torn down on drop.
pub struct Rig {
    pub name: String,
    pub env: BTreeMap<String, String>,
}

impl Rig {
    pub fn up(name: &str) -> Rig {
        Self::up_with_env(name, &[])
    }

    /// [`Rig::up`] with environment for rig.sh (e.g. `CNI_BIN_DIR`).
    pub fn up_with_env(name: &str, env: &[(&str, &str)]) -> Rig {
        Self::try_up_with_env(name, env).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Rig::up_with_env`], returning rig.sh's output when `up` fails (it has torn itself
    /// down then), for tests that skip when an optional part (e.g. `RIG_IMAGEFS_SIZE`'s
    /// tmpfs) cannot be set up here.
    pub fn try_up_with_env(name: &str, env: &[(&str, &str)]) -> Result<Rig, String> {
        // A rig of the same name left by a crashed run goes first.
        let _ = Command::new(rig_sh()).args(["down", name]).output();
        let out = Command::new(rig_sh())
            .args(["up", name])
            .envs(env.iter().copied())
            .output()
            .expect("run rig.sh");
        if !out.status.success() {
            return Err(format!(
                "rig.sh up {name} failed:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let env = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Ok(Rig {
            name: name.into(),
            env,
        })
    }

    pub fn get(&self, k: &str) -> &str {
        self.env
            .get(k)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("rig env has no {k}"))
    }

    pub fn netns_path(&self) -> &str {
        self.get("RIG_NETNS_PATH")
    }

    /// Runs a command inside the rig's network namespace.
    pub fn sh(&self, script: &str) -> std::process::Output {
        Command::new("nsenter")
            .arg(format!("--net={}", self.netns_path()))
            .args(["sh", "-c", script])
            .output()
            .expect("nsenter")
    }

    pub fn restart_containerd(&mut self) {
        let out = Command::new(rig_sh())
            .args(["restart-containerd", &self.name])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "restart-containerd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((k, v)) = l.split_once('=') {
                self.env.insert(k.into(), v.into());
            }
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = Command::new(rig_sh()).args(["down", &self.name]).output();
    }
}

/// Path of a workspace binary, built before the tests run (`cargo build --bins`).
pub fn bin(name: &str) -> PathBuf {
    if let Ok(p) = std::env::var(format!("{}_BIN", name.to_uppercase().replace('-', "_"))) {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    // A binary of the harness (target/<profile>/<bin>) finds it beside itself.
    if let Some(beside) = exe.parent().map(|d| d.join(name)).filter(|p| p.is_file()) {
        return beside;
    }
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let p = exe.parent().and_then(|d| d.parent()).unwrap().join(name);
    assert!(
        p.exists(),
        "{} not found: build it first with `cargo build --bins`",
        p.display()
    );
    p
}

/// The offline image of `src/bin/grpc-health-server.rs` (`registry.local/grpc-health:1`),
/// built by `tests/rig/build-test-images.sh` into `$RIG_HOME/test-images/` (shared and
/// stamped, so parallel tests build it once) and imported into this rig's containerd.
pub fn import_grpc_health_image(rig: &Rig) -> &'static str {
    let script = repo_root().join("tests/rig/build-test-images.sh");
    let dir = Path::new(rig.get("RIG_IMAGES"))
        .parent()
        .unwrap()
        .join("test-images");
    let tar = dir.join("grpc-health.tar");
    let out = Command::new(&script)
        .arg("grpc-health")
        .arg(bin("grpc-health-server"))
        .arg(&tar)
        .output()
        .expect("run build-test-images.sh");
    assert!(
        out.status.success(),
        "build-test-images.sh grpc-health failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&script)
        .arg("import")
        .arg(&tar)
        .arg(rig.get("CONTAINERD_SOCK"))
        .output()
        .expect("run build-test-images.sh import");
    assert!(
        out.status.success(),
        "importing {} failed:\n{}",
        tar.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    "registry.local/grpc-health:1"
}

/// What the rig's runtime reports of itself (CRI Status), for tests that need a feature.
#[derive(Debug, Clone, Default)]
pub struct RuntimeFeatures {
    /// Handler name → (recursiveReadOnlyMounts, userNamespaces).
    pub handlers: BTreeMap<String, (bool, bool)>,
    /// `features.supplemental_groups_policy`.
    pub supplemental_groups_policy: bool,
}

impl RuntimeFeatures {
    /// Whether `handler` (empty: the default) runs pods in their own user namespace.
    pub fn user_namespaces(&self, handler: &str) -> bool {
        self.handlers.get(handler).is_some_and(|f| f.1)
    }

    /// Whether `handler` (empty: the default) can make a mount read-only recursively.
    pub fn recursive_read_only(&self, handler: &str) -> bool {
        self.handlers.get(handler).is_some_and(|f| f.0)
    }
}

impl Rig {
    /// Asks the rig's runtime (`CRI_ENDPOINT`) what its handlers support, with a deadline.
    pub fn runtime_features(&self) -> Result<RuntimeFeatures, String> {
        cri_status(self.get("CRI_ENDPOINT"))
    }
}

/// CRI Status of `endpoint`: its handlers' and its own features.
pub fn cri_status(endpoint: &str) -> Result<RuntimeFeatures, String> {
    use std::time::Duration;
    let endpoint = endpoint.to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let ch = cri_proto::connect(&endpoint, Duration::from_secs(5))
            .await
            .map_err(|e| e.to_string())?;
        let mut req = tonic::Request::new(cri_proto::v1::StatusRequest { verbose: false });
        req.set_timeout(Duration::from_secs(10));
        let s = cri_proto::runtime_client(ch)
            .status(req)
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        Ok(RuntimeFeatures {
            handlers: s
                .runtime_handlers
                .iter()
                .map(|h| {
                    let f = h.features.unwrap_or_default();
                    (
                        h.name.clone(),
                        (f.recursive_read_only_mounts, f.user_namespaces),
                    )
                })
                .collect(),
            supplemental_groups_policy: s.features.is_some_and(|f| f.supplemental_groups_policy),
        })
    })
}
