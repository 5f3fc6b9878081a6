//! Network namespaces for root-only tests, in the three shapes the crates' tests use; none
//! touches the root namespace's links, addresses, routes or rules:
//!
//! - [`Netns`]: a named namespace (`ip netns add`, deleted on drop) to run commands in
//!   ([`Netns::exec`]) or to spawn a process in ([`spawn_in`]);
//! - [`in_new_netns`]: a closure on a thread of its own that has unshared a fresh anonymous
//!   namespace (gone when the thread ends);
//! - [`enter_netns`]: moves the calling thread into an existing namespace (a rig's);
//! - [`cni`]: a CNI plugin binary run as a runtime runs it;
//! - [`topology`]: the proxy's client —node— pods topology with helper processes.

pub mod cni;
pub mod topology;

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sched::CloneFlags;

/// How long [`run_cmd`] lets a child run.
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `bin` is on `PATH`.
pub fn have(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Why a namespace test cannot run here (not root, no `ip`), if it cannot.
pub fn netns_skip_reason() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root to create network namespaces".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("the ip binary (iproute2) is missing".into());
    }
    None
}

/// `true` when the test can create namespaces; otherwise prints `SKIPPED: <test>: <reason>`.
pub fn can_run(test: &str) -> bool {
    match netns_skip_reason() {
        None => true,
        Some(reason) => {
            println!("SKIPPED: {test}: {reason}");
            false
        }
    }
}

/// Runs `args` (program first); `Err` with its stderr when it fails.
pub fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A network namespace under /run/netns, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// A fresh namespace named `nt-<pid>-<n>-<tag>`.
    pub fn new(tag: &str) -> Netns {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "nt-{}-{}-{tag}",
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

    /// Like [`Netns::exec`] but the command must succeed; returns stdout.
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

/// Runs a command with [`CHILD_TIMEOUT`] (panics past it), `stdin` written to it;
/// (exit code, stdout, stderr).
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

/// Runs `cmd` (through [`run_cmd`]) from inside the namespace at `netns`: a thread joins
/// the namespace and spawns it, the child inherits the namespace, the thread then ends.
pub fn run_in(netns: &Path, cmd: &mut Command, stdin: Option<&str>) -> (i32, String, String) {
    let ns = File::open(netns).unwrap_or_else(|e| panic!("open {}: {e}", netns.display()));
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET).expect("setns");
            run_cmd(cmd, stdin)
        })
        .join()
        .unwrap()
    })
}

/// Moves the calling thread into the network namespace at `path` (setns(2) on this thread
/// only; the process and the root namespace are untouched).
pub fn enter_netns(path: &str) {
    let f = File::open(path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    nix::sched::setns(&f, CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|e| panic!("setns({path}): {e}"));
}

/// Runs `f` on a thread of its own inside a fresh anonymous network namespace (unshare(2);
/// gone when the thread ends), after `setup` (a shell script, e.g. links and addresses) ran
/// there, on a current-thread tokio runtime. Returns `false` after printing
/// `SKIPPED: <what>: <reason>` when namespaces cannot be made here.
pub fn in_new_netns<F, Fut>(what: &str, setup: &str, f: F) -> bool
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    if let Some(reason) = netns_skip_reason() {
        eprintln!("SKIPPED: {what}: {reason}");
        return false;
    }
    let setup = setup.to_string();
    std::thread::spawn(move || {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).expect("unshare");
        let out = Command::new("sh")
            .args(["-c", &setup])
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "{setup}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f());
    })
    .join()
    .expect("the namespace thread");
    true
}
