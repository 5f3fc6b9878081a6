//! Harness for end-to-end tests on the node rig: a private containerd in a network namespace
//! (tests/rig/rig.sh) and our kubelet binary started inside that namespace.

#![allow(dead_code)]

pub mod joined;

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
        let ok = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {bin}"))
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
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
        if let Some(reason) = common::skip_reason() {
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
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let p = exe.parent().and_then(|d| d.parent()).unwrap().join(name);
    assert!(
        p.exists(),
        "{} not found: build it first with `cargo build --bins`",
        p.display()
    );
    p
}

/// Upstream's default disk thresholds (nodefs 10 %, imagefs 15 % available) put a shared
/// build machine's disk under DiskPressure, which rejects every new pod: test nodes turn the
/// disk signals off as kind's nodes do, and keep upstream's memory threshold.
pub const TEST_EVICTION_HARD: &str = "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: \"0%\"\n  nodefs.inodesFree: \"0%\"\n  imagefs.available: \"0%\"\n  imagefs.inodesFree: \"0%\"\n";

/// Our kubelet running in standalone mode inside a rig.
pub struct Agent {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    netns: String,
    endpoint: String,
    cgroup_root: String,
    pub log: PathBuf,
    starts: u32,
    env: Vec<(String, String)>,
    extra_config: String,
}

impl Agent {
    pub fn manifests(&self) -> PathBuf {
        self.dir.path().join("manifests")
    }

    pub fn start(rig: &Rig) -> Agent {
        Self::start_with_env(rig, &[])
    }

    /// Starts the agent with extra environment variables (e.g. systemd's NOTIFY_SOCKET).
    pub fn start_with_env(rig: &Rig, env: &[(&str, &str)]) -> Agent {
        Self::start_with(rig, env, "")
    }

    /// Starts the agent with extra environment variables and KubeletConfiguration lines.
    pub fn start_with(rig: &Rig, env: &[(&str, &str)], extra_config: &str) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("manifests")).unwrap();
        let mut a = Agent {
            log: dir.path().join("kubelet.log"),
            dir,
            child: None,
            netns: rig.netns_path().to_string(),
            endpoint: rig.get("CRI_ENDPOINT").to_string(),
            cgroup_root: rig.get("RIG_CGROUP_ROOT").to_string(),
            starts: 0,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            extra_config: extra_config.to_string(),
        };
        a.launch();
        a
    }

    fn launch(&mut self) {
        let d = self.dir.path();
        // Standalone (no kubeconfig): what an upstream standalone user sets, since v1beta1's
        // defaults (webhook authentication and authorization) refuse to start without a client.
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\npodLogsDir: {}\ncgroupRoot: {}\nfileCheckFrequency: 20s\n\
             authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n{}{}",
            d.join("manifests").display(),
            d.join("logs").display(),
            self.cgroup_root,
            if self.extra_config.contains("evictionHard:") {
                ""
            } else {
                TEST_EVICTION_HARD
            },
            self.extra_config
        );
        std::fs::write(d.join("config.yaml"), config).unwrap();
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--net={}", self.netns))
            .arg(bin("kubelet"))
            .arg(format!("--config={}", d.join("config.yaml").display()))
            .arg(format!("--container-runtime-endpoint={}", self.endpoint))
            .arg(format!("--root-dir={}", d.join("root").display()))
            .arg("--hostname-override=rig-node")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kubelet");
        self.child = Some(child);
        wait_for("kubelet healthz", Duration::from_secs(30), || {
            let out = self.curl("http://127.0.0.1:10248/healthz");
            (out == "ok").then_some(())
        });
    }

    /// Stops the agent the way systemd does (SIGTERM), leaving pods running.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if c.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills the agent outright (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// The namespace path the agent runs in.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    pub fn curl(&self, url: &str) -> String {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.netns))
            .args(["curl", "-sk", "--max-time", "5", url])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// The PodList served on :10250/pods.
    pub fn pods(&self) -> Vec<Value> {
        let body = self.curl("https://127.0.0.1:10250/pods");
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["items"].as_array().cloned().unwrap_or_default()
    }

    pub fn pod(&self, name_prefix: &str) -> Option<Value> {
        self.pods().into_iter().find(|p| {
            p["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(name_prefix))
        })
    }

    pub fn write_manifest(&self, file: &str, text: &str) {
        // Write then rename, so the agent never reads half a file.
        let tmp = self.dir.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.manifests().join(file)).unwrap();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("---- kubelet log ----\n{}", self.log_text());
        }
        // Pods left running keep their subPath bind mounts: unmount them before the
        // directory is removed (removal would go through them).
        unmount_below(self.dir.path());
    }
}

/// Lazily unmounts every mount at or below `dir` (deepest first), from /proc/self/mountinfo.
pub fn unmount_below(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut mounts: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        let _ = std::process::Command::new("umount")
            .args(["-l", m])
            .status();
    }
}

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

impl Agent {
    /// PID of the running kubelet (nsenter execs it, so it is the child's PID).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

// ---- cluster mode: a test control plane reachable from inside a rig ------------------------

/// Moves the calling thread into the network namespace at `path` (setns(2) on this thread only;
/// the process and the root namespace are untouched).
#[allow(unsafe_code)]
pub fn enter_netns(path: &str) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: setns only reads the descriptor, which stays open for the call.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns({path}): {}", std::io::Error::last_os_error());
}

/// A [`node_tests::controlplane::TestControlPlane`] listening on 127.0.0.1 *inside* a rig's
/// network namespace, so the agent (which runs there) reaches it, while the test reads and
/// writes its store directly in-process.
///
/// How: a throwaway thread enters the netns with setns(2) and builds a multi-threaded tokio
/// runtime; the runtime's worker threads are created by that thread and so live in the netns
/// too. Anything that binds a listener (start, resume) runs as a task on those workers.
pub struct NetnsControlPlane {
    pub cp: std::sync::Arc<node_tests::controlplane::TestControlPlane>,
    rt: Option<tokio::runtime::Runtime>,
}

impl NetnsControlPlane {
    pub fn start(rig: &Rig, opts: node_tests::controlplane::Options) -> NetnsControlPlane {
        Self::start_in(rig.netns_path(), opts)
    }

    /// Starts it inside the network namespace at `netns_path` (`/run/netns/NAME`).
    pub fn start_in(
        netns_path: &str,
        opts: node_tests::controlplane::Options,
    ) -> NetnsControlPlane {
        let netns = netns_path.to_string();
        let rt = std::thread::spawn(move || {
            enter_netns(&netns);
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime")
        })
        .join()
        .expect("netns thread");
        let cp = rt
            .block_on(async {
                tokio::spawn(node_tests::controlplane::TestControlPlane::start(opts))
                    .await
                    .expect("start task")
            })
            .expect("start control plane");
        NetnsControlPlane {
            cp: std::sync::Arc::new(cp),
            rt: Some(rt),
        }
    }

    /// Runs `f(cp)` as a task on the netns runtime and waits for it.
    pub fn run<T, F, Fut>(&self, f: F) -> T
    where
        F: FnOnce(std::sync::Arc<node_tests::controlplane::TestControlPlane>) -> Fut,
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let rt = self.rt.as_ref().unwrap();
        let fut = f(self.cp.clone());
        rt.block_on(async { tokio::spawn(fut).await.expect("task") })
    }

    /// Stops serving (an outage); data is kept.
    pub fn stop(&self) {
        self.run(|cp| async move { cp.stop().await })
    }

    /// Serves again on the same address (inside the netns).
    pub fn resume(&self) {
        self.run(|cp| async move { cp.resume().await })
            .expect("resume control plane")
    }
}

impl std::ops::Deref for NetnsControlPlane {
    type Target = node_tests::controlplane::TestControlPlane;
    fn deref(&self) -> &Self::Target {
        &self.cp
    }
}

impl Drop for NetnsControlPlane {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
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

/// A kubelet process started with an explicit command line inside a rig's netns.
pub struct KubeletProc {
    child: Option<Child>,
    netns: String,
    args: Vec<String>,
    pub log: PathBuf,
    /// `RUST_LOG` for the agent (default: `$AGENT_RUST_LOG`, else `info,kube=warn`).
    rust_log: Option<String>,
    /// Extra environment (test hooks such as `KUBELET_TEST_CONTAINER_GC_PERIOD`).
    env: Vec<(String, String)>,
}

impl KubeletProc {
    pub fn start(rig: &Rig, args: Vec<String>, log: PathBuf) -> KubeletProc {
        Self::start_logging(rig, args, log, None)
    }

    /// [`KubeletProc::start`] with the agent's `RUST_LOG` (e.g. to read debug lines).
    pub fn start_logging(
        rig: &Rig,
        args: Vec<String>,
        log: PathBuf,
        rust_log: Option<&str>,
    ) -> KubeletProc {
        let mut k = KubeletProc {
            child: None,
            netns: rig.netns_path().to_string(),
            args,
            log,
            rust_log: rust_log.map(str::to_string),
            env: Vec::new(),
        };
        k.launch();
        k
    }

    /// [`KubeletProc::start`] with extra environment variables (kept across restarts).
    pub fn start_with_env(
        rig: &Rig,
        args: Vec<String>,
        log: PathBuf,
        env: &[(&str, &str)],
    ) -> KubeletProc {
        let mut k = KubeletProc {
            child: None,
            netns: rig.netns_path().to_string(),
            args,
            log,
            rust_log: None,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        k.launch();
        k
    }

    /// Kills the agent outright (SIGKILL), as a crash would; [`KubeletProc::restart`] starts
    /// it again.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--net={}", self.netns))
            .arg(bin("kubelet"))
            .args(&self.args)
            .env(
                "RUST_LOG",
                self.rust_log.clone().unwrap_or_else(|| {
                    std::env::var("AGENT_RUST_LOG").unwrap_or_else(|_| "info,kube=warn".into())
                }),
            )
            .env("NO_COLOR", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kubelet");
        self.child = Some(child);
    }

    /// SIGTERM (as systemd stops it), then SIGKILL after 15 s.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if c.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// The kubelet's pid (nsenter execs it, so it is the child's).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn curl(&self, url: &str) -> (String, String) {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.netns))
            .args([
                "curl",
                "-sk",
                "--max-time",
                "5",
                "-w",
                "\n%{http_code}",
                url,
            ])
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
        (body.to_string(), code.to_string())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for KubeletProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- kubelet log ----\n{}", self.log_text());
        }
    }
}
