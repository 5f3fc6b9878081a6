//! Graceful node shutdown against a fake systemd-logind on a private D-Bus daemon: the agent
//! takes a delay inhibitor, and on `PrepareForShutdown(true)` stops the default-priority pod
//! before the system-critical one, marks both Failed/Terminated with a DisruptionTarget
//! condition, then releases the inhibitor.

use node_tests::require_rig;
use node_tests::{Kubelet, Rig, container, wait_for};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// logind's Manager interface, as much of it as the kubelet uses.
struct Manager {
    inhibits: Arc<Mutex<Vec<String>>>,
    /// Inhibitors whose descriptor the holder closed.
    released: Arc<AtomicUsize>,
}

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl Manager {
    #[zbus(property(emits_changed_signal = "false"), name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> u64 {
        // 30 s: more than the agent asks for, so it never writes logind's drop-in.
        30_000_000
    }

    fn inhibit(
        &self,
        what: String,
        who: String,
        why: String,
        mode: String,
    ) -> zbus::fdo::Result<zbus::zvariant::OwnedFd> {
        self.inhibits
            .lock()
            .unwrap()
            .push(format!("{what}|{who}|{why}|{mode}"));
        let (mut reader, writer) =
            std::io::pipe().map_err(|e| zbus::fdo::Error::Failed(e.to_string()))?;
        let released = self.released.clone();
        // The read end sees EOF once every copy of the write end is closed: the holder
        // released the inhibitor.
        std::thread::spawn(move || {
            let mut buf = [0u8; 8];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    released.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
        });
        Ok(std::os::fd::OwnedFd::from(writer).into())
    }

    #[zbus(signal)]
    async fn prepare_for_shutdown(
        emitter: &zbus::object_server::SignalEmitter<'_>,
        start: bool,
    ) -> zbus::Result<()>;
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const LOW: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: low
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "trap 'sleep 2; exit 0' TERM; while true; do sleep 1; done"]
"#;

const CRITICAL: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: critical
spec:
  priority: 2000000000
  terminationGracePeriodSeconds: 30
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "trap 'sleep 3; exit 0' TERM; while true; do sleep 1; done"]
"#;

fn state_of(agent: &Kubelet, pod: &str) -> Option<String> {
    let p = agent.pod(pod)?;
    let state = container(&p, "app")["state"].as_object()?.clone();
    state.keys().next().cloned()
}

#[test]
fn pods_stop_by_priority_and_the_inhibitor_is_released() {
    require_rig!();
    if Command::new("dbus-daemon")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!(
            "SKIPPED: dbus-daemon is not installed (graceful shutdown is covered by the fake-logind unit tests)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bus = dir.path().join("bus");
    let address = format!("unix:path={}", bus.display());
    let daemon = Daemon(
        Command::new("dbus-daemon")
            .args(["--session", "--nofork", "--nopidfile"])
            .arg(format!("--address={address}"))
            .stdout(Stdio::null())
            .spawn()
            .expect("start dbus-daemon"),
    );
    wait_for("the private bus socket", Duration::from_secs(10), || {
        bus.exists().then_some(())
    });

    let rt = tokio::runtime::Runtime::new().unwrap();
    let inhibits = Arc::new(Mutex::new(Vec::new()));
    let released = Arc::new(AtomicUsize::new(0));
    let conn = rt.block_on(async {
        zbus::connection::Builder::address(address.as_str())
            .unwrap()
            .name("org.freedesktop.login1")
            .unwrap()
            .serve_at(
                "/org/freedesktop/login1",
                Manager {
                    inhibits: inhibits.clone(),
                    released: released.clone(),
                },
            )
            .unwrap()
            .build()
            .await
            .expect("serve the fake logind")
    });

    let rig = Rig::up("node-shutdown");
    let agent = Kubelet::builder(&rig)
        .env(&[("DBUS_SYSTEM_BUS_ADDRESS", &address)])
        .config("shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 4s\n")
        .start();
    agent.write_manifest("low.yaml", LOW);
    agent.write_manifest("critical.yaml", CRITICAL);
    wait_for("both pods running", Duration::from_secs(120), || {
        (state_of(&agent, "low").as_deref() == Some("running")
            && state_of(&agent, "critical").as_deref() == Some("running"))
        .then_some(())
    });
    wait_for("the delay inhibitor", Duration::from_secs(20), || {
        (!inhibits.lock().unwrap().is_empty()).then_some(())
    });
    assert_eq!(
        inhibits.lock().unwrap()[0],
        "shutdown|kubelet|Kubelet needs time to handle node shutdown|delay"
    );
    assert_eq!(released.load(Ordering::SeqCst), 0);

    rt.block_on(async {
        let iface = conn
            .object_server()
            .interface::<_, Manager>("/org/freedesktop/login1")
            .await
            .unwrap();
        Manager::prepare_for_shutdown(iface.signal_emitter(), true)
            .await
            .unwrap();
    });

    // The default-priority pod goes first; the critical one runs until it has stopped.
    wait_for(
        "low stopped while critical still runs",
        Duration::from_secs(20),
        || {
            let (low, critical) = (state_of(&agent, "low"), state_of(&agent, "critical"));
            assert_ne!(
                (low.as_deref(), critical.as_deref()),
                (Some("running"), Some("terminated")),
                "the critical pod must not stop first"
            );
            (low.as_deref() == Some("terminated") && critical.as_deref() == Some("running"))
                .then_some(())
        },
    );
    for name in ["low", "critical"] {
        let p = wait_for(&format!("{name} Failed"), Duration::from_secs(30), || {
            agent.pod(name).filter(|p| p["status"]["phase"] == "Failed")
        });
        assert_eq!(p["status"]["reason"], "Terminated", "{name}");
        assert_eq!(
            p["status"]["message"],
            "Pod was terminated in response to imminent node shutdown."
        );
        let dt = p["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "DisruptionTarget")
            .cloned()
            .unwrap_or_else(|| panic!("{name}: DisruptionTarget in {}", p["status"]));
        assert_eq!(dt["reason"], "TerminationByKubelet");
    }
    wait_for("the inhibitor released", Duration::from_secs(20), || {
        (released.load(Ordering::SeqCst) >= 1).then_some(())
    });
    assert!(
        agent
            .log_text()
            .contains("shutdown manager finished stopping pods"),
        "the log says so"
    );
    drop(conn);
    drop(daemon);
}
