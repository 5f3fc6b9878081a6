//! Helpers for the root-only namespace tests: throwaway network namespaces (`ip netns add`,
//! removed on drop) and running a plugin binary inside one of them.

#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sched::CloneFlags;

pub const PLUGIN: &str = env!("CARGO_BIN_EXE_node-agent-cni");
const CHILD_TIMEOUT: Duration = Duration::from_secs(30);

/// `None` (after printing `SKIPPED: <reason>`) unless the test can create namespaces.
pub fn can_run(test: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED: {test}: needs root to create network namespaces");
        return false;
    }
    if Command::new("ip").arg("-V").output().is_err() {
        println!("SKIPPED: {test}: the ip binary (iproute2) is missing");
        return false;
    }
    true
}

/// A network namespace under /run/netns, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "cnit-{}-{}-{tag}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let out = run_cmd(Command::new("ip").args(["netns", "add", &name]), None);
        assert!(out.0 == 0, "ip netns add {name}: {}", out.2);
        Netns { name }
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    /// Runs `args` inside the namespace with `ip netns exec`; (exit code, stdout, stderr).
    pub fn exec(&self, args: &[&str]) -> (i32, String, String) {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).args(args);
        run_cmd(&mut cmd, None)
    }

    /// Like [`exec`] but the command must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.exec(args);
        assert_eq!(code, 0, "{args:?} in {}: {err}", self.name);
        out
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run_cmd(Command::new("ip").args(["netns", "del", &self.name]), None);
    }
}

/// Runs a command with a timeout; (exit code, stdout, stderr).
pub fn run_cmd(cmd: &mut Command, stdin: Option<&str>) -> (i32, String, String) {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} took over {CHILD_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    (
        status.code().unwrap_or(-1),
        reader.join().unwrap(),
        err_reader.join().unwrap(),
    )
}

/// Runs a plugin binary as a runtime would, from inside `host` (a thread joins the namespace
/// and spawns the plugin, which inherits it; the thread then ends).
pub fn run_plugin(
    binary: &str,
    host: &Path,
    env: &[(&str, String)],
    stdin: &str,
) -> (i32, String, String) {
    let ns = File::open(host).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET).expect("setns");
            let mut cmd = Command::new(binary);
            cmd.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
            for (k, v) in env {
                cmd.env(k, v);
            }
            run_cmd(&mut cmd, Some(stdin))
        })
        .join()
        .unwrap()
    })
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
