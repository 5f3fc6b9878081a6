//! Our kubelet binary as a process inside a rig's network namespace, built with
//! [`Kubelet::builder`]. Two ways to configure it:
//!
//! - **standalone** (the default): the harness writes a KubeletConfiguration (static pods from
//!   [`Kubelet::manifests`], the rig's cgroup root, anonymous and AlwaysAllow on :10250, the
//!   test eviction thresholds) plus [`KubeletBuilder::config`]'s lines into a temporary
//!   directory, starts the agent with it and waits for healthz;
//! - **command line** ([`KubeletBuilder::args`]): the test gives the whole command line (e.g.
//!   the one systemd builds for a kubeadm-joined node); the harness only starts it.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::rig::{Rig, bin};
use crate::util::{unmount_below, wait_for};

/// Upstream's default disk thresholds (nodefs 10 %, imagefs 15 % available) put a shared
/// build machine's disk under DiskPressure, which rejects every new pod: test nodes turn the
/// disk signals off as kind's nodes do, and keep upstream's memory threshold.
pub const TEST_EVICTION_HARD: &str = "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: \"0%\"\n  nodefs.inodesFree: \"0%\"\n  imagefs.available: \"0%\"\n  imagefs.inodesFree: \"0%\"\n";

/// The agent's test hook for its container log link directory.
pub const LOG_LINKS_DIR_ENV: &str = "KUBELET_TEST_CONTAINER_LOG_LINKS_DIR";

/// How a [`Kubelet`] is configured.
enum Mode {
    /// The harness writes the config into `dir`; `extra_config` is appended to it.
    Standalone {
        dir: tempfile::TempDir,
        endpoint: String,
        cgroup_root: String,
        extra_config: String,
    },
    /// The test's own command line.
    Args(Vec<String>),
}

/// Options for starting a [`Kubelet`]; see the module docs.
#[must_use]
pub struct KubeletBuilder<'a> {
    rig: &'a Rig,
    args: Option<Vec<String>>,
    log: Option<PathBuf>,
    env: Vec<(String, String)>,
    extra_config: String,
    rust_log: Option<String>,
}

impl KubeletBuilder<'_> {
    /// The whole command line (no generated config; the harness does not wait for healthz).
    pub fn args(mut self, args: Vec<String>) -> Self {
        self.args = Some(args);
        self
    }

    /// Where the agent's stderr goes (appended). Standalone default: `<dir>/kubelet.log`;
    /// required with [`KubeletBuilder::args`].
    pub fn log(mut self, path: PathBuf) -> Self {
        self.log = Some(path);
        self
    }

    /// Extra environment (e.g. `NOTIFY_SOCKET`, test hooks), kept across restarts.
    pub fn env(mut self, env: &[(&str, &str)]) -> Self {
        self.env
            .extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    /// KubeletConfiguration lines appended to the standalone config. An `evictionHard:` here
    /// replaces [`TEST_EVICTION_HARD`].
    pub fn config(mut self, lines: &str) -> Self {
        self.extra_config.push_str(lines);
        self
    }

    /// The agent's `RUST_LOG`. Default: `info` standalone; with a command line
    /// `$AGENT_RUST_LOG`, else `info,kube=warn`.
    pub fn rust_log(mut self, filter: &str) -> Self {
        self.rust_log = Some(filter.to_string());
        self
    }

    /// Starts the agent; standalone, returns once healthz answers `ok` (panics after 30 s).
    pub fn start(self) -> Kubelet {
        let netns = self.rig.netns_path().to_string();
        let (mode, log, rust_log) = match self.args {
            Some(args) => {
                assert!(
                    self.extra_config.is_empty(),
                    "config() is for the standalone kubelet; put it in the args' config file"
                );
                let log = self.log.expect("a kubelet started with args() needs log()");
                let rust_log = self.rust_log.unwrap_or_else(|| {
                    std::env::var("AGENT_RUST_LOG").unwrap_or_else(|_| "info,kube=warn".into())
                });
                (Mode::Args(args), log, rust_log)
            }
            None => {
                let dir = tempfile::tempdir().unwrap();
                std::fs::create_dir_all(dir.path().join("manifests")).unwrap();
                let log = self.log.unwrap_or_else(|| dir.path().join("kubelet.log"));
                let mode = Mode::Standalone {
                    dir,
                    endpoint: self.rig.get("CRI_ENDPOINT").to_string(),
                    cgroup_root: self.rig.get("RIG_CGROUP_ROOT").to_string(),
                    extra_config: self.extra_config,
                };
                (mode, log, self.rust_log.unwrap_or_else(|| "info".into()))
            }
        };
        let mut k = Kubelet {
            child: None,
            netns,
            mode,
            log,
            rust_log,
            env: self.env,
        };
        k.launch();
        k
    }
}

/// Our kubelet running inside a rig's network namespace; killed on drop (its log is printed
/// when the test panicked).
pub struct Kubelet {
    child: Option<Child>,
    netns: String,
    mode: Mode,
    pub log: PathBuf,
    rust_log: String,
    env: Vec<(String, String)>,
}

impl Kubelet {
    /// Starts describing a kubelet for `rig`; [`KubeletBuilder::start`] runs it.
    pub fn builder(rig: &Rig) -> KubeletBuilder<'_> {
        KubeletBuilder {
            rig,
            args: None,
            log: None,
            env: Vec::new(),
            extra_config: String::new(),
            rust_log: None,
        }
    }

    /// The standalone kubelet's directory (config, manifests, logs, root dir).
    pub fn dir(&self) -> &Path {
        match &self.mode {
            Mode::Standalone { dir, .. } => dir.path(),
            Mode::Args(_) => panic!("a kubelet started with args() has no harness directory"),
        }
    }

    /// Where the agent's root directory is: the standalone kubelet's whole directory, or a
    /// command line's `--root-dir` (`None` without one: the default /var/lib/kubelet is not
    /// the harness's to unmount).
    fn root_dir(&self) -> Option<PathBuf> {
        match &self.mode {
            Mode::Standalone { dir, .. } => Some(dir.path().to_path_buf()),
            Mode::Args(args) => root_dir_arg(args),
        }
    }

    /// Where the agent makes its container log links (upstream's /var/log/containers): the
    /// standalone kubelet's `containers/`, else `containers/` beside its log, so agents on
    /// one host never share it. A test's own [`KubeletBuilder::env`] may override it.
    pub fn log_links_dir(&self) -> PathBuf {
        if let Some((_, v)) = self.env.iter().find(|(k, _)| k == LOG_LINKS_DIR_ENV) {
            return PathBuf::from(v);
        }
        match &self.mode {
            Mode::Standalone { dir, .. } => dir.path().join("containers"),
            Mode::Args(_) => self
                .log
                .parent()
                .unwrap_or(Path::new("/tmp"))
                .join("containers"),
        }
    }

    /// The standalone kubelet's static pod directory.
    pub fn manifests(&self) -> PathBuf {
        self.dir().join("manifests")
    }

    fn write_config(&self) {
        let Mode::Standalone {
            dir,
            cgroup_root,
            extra_config,
            ..
        } = &self.mode
        else {
            return;
        };
        let d = dir.path();
        // Standalone (no kubeconfig): what an upstream standalone user sets, since v1beta1's
        // defaults (webhook authentication and authorization) refuse to start without a client.
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\npodLogsDir: {}\ncgroupRoot: {}\nfileCheckFrequency: 20s\n\
             authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n{}{}",
            d.join("manifests").display(),
            d.join("logs").display(),
            cgroup_root,
            if extra_config.contains("evictionHard:") {
                ""
            } else {
                TEST_EVICTION_HARD
            },
            extra_config
        );
        std::fs::write(d.join("config.yaml"), config).unwrap();
    }

    fn command_line(&self) -> Vec<String> {
        match &self.mode {
            Mode::Args(args) => args.clone(),
            Mode::Standalone { dir, endpoint, .. } => {
                let d = dir.path();
                vec![
                    format!("--config={}", d.join("config.yaml").display()),
                    format!("--container-runtime-endpoint={endpoint}"),
                    format!("--root-dir={}", d.join("root").display()),
                    "--hostname-override=rig-node".into(),
                ]
            }
        }
    }

    fn launch(&mut self) {
        self.write_config();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new("nsenter")
            .arg(format!("--net={}", self.netns))
            .arg(bin("kubelet"))
            .args(self.command_line())
            .env("RUST_LOG", &self.rust_log)
            .env("NO_COLOR", "1")
            .env(LOG_LINKS_DIR_ENV, self.log_links_dir())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kubelet");
        self.child = Some(child);
        if matches!(self.mode, Mode::Standalone { .. }) {
            wait_for("kubelet healthz", Duration::from_secs(30), || {
                let out = self.curl("http://127.0.0.1:10248/healthz");
                (out == "ok").then_some(())
            });
        }
    }

    /// Stops the agent the way systemd does (SIGTERM, then SIGKILL after 15 s), leaving pods
    /// running.
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

    /// Kills the agent outright (SIGKILL), as a crash would; [`Kubelet::restart`] starts it
    /// again.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// [`Kubelet::stop`], then the same command line again (standalone: the config is
    /// rewritten and healthz awaited).
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// The namespace path the agent runs in.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// PID of the running kubelet (nsenter execs it, so it is the child's PID).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The exit status, once the agent has exited by itself.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The body of a GET from inside the agent's netns (`curl -sk`, 5 s).
    pub fn curl(&self, url: &str) -> String {
        self.curl_code(url).0
    }

    /// (body, HTTP status code) of a GET from inside the agent's netns (code empty when no
    /// answer).
    pub fn curl_code(&self, url: &str) -> (String, String) {
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

    /// The PodList served on :10250/pods.
    pub fn pods(&self) -> Vec<Value> {
        let body = self.curl("https://127.0.0.1:10250/pods");
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        v["items"].as_array().cloned().unwrap_or_default()
    }

    /// The first pod of [`Kubelet::pods`] whose name starts with `name_prefix`.
    pub fn pod(&self, name_prefix: &str) -> Option<Value> {
        self.pods().into_iter().find(|p| {
            p["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(name_prefix))
        })
    }

    /// Writes a static pod manifest (write then rename, so the agent never reads half a file).
    pub fn write_manifest(&self, file: &str, text: &str) {
        let tmp = self.dir().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.manifests().join(file)).unwrap();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The value of `--root-dir` in a command line (`--root-dir=X` or `--root-dir X`; the last
/// one wins, as with the agent's flag parser).
fn root_dir_arg(args: &[String]) -> Option<PathBuf> {
    let mut found = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--root-dir=") {
            found = Some(PathBuf::from(v));
        } else if a == "--root-dir" {
            found = it.next().map(PathBuf::from);
        }
    }
    found
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("---- kubelet log ----\n{}", self.log_text());
        }
        // The agent's root directory stays a bind mount of itself, and pods left running
        // keep their volumes' mounts: unmount them before the directory is removed (removal
        // would fail on the mount point and go through the others).
        if let Some(root) = self.root_dir() {
            unmount_below(&root);
        }
    }
}
