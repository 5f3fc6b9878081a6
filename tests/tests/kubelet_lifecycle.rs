//! Container lifecycle on real containerd, with static pods: sidecars (restartable init
//! containers) start before the app, restart when they exit and stop after it; postStart and
//! preStop hooks run inside the container at the right moment; activeDeadlineSeconds fails the
//! pod; termination messages come from the file or, on failure, from the log; a container past
//! its memory limit is OOM-killed and its status says `OOMKilled`; with the `EventedPLEG` gate
//! on containerd 1.6 (no `GetContainerEvents`) the PLEG falls back to relisting every second.

use node_tests::require_rig;
use node_tests::{Kubelet, Rig, container, wait_for};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const IMAGE: &str = "docker.io/library/busybox:1.35";

/// A moment the container wrote down: the kernel's uptime in seconds (shared by every
/// container; busybox `date` has no sub-second format).
fn read_uptime(path: &Path) -> Option<f64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn init_container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["status"]["initContainerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no init container status {name} in {pod}"))
}

fn sidecar_pod(out: &Path) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: side
spec:
  terminationGracePeriodSeconds: 10
  volumes:
  - name: out
    hostPath: {{path: {out}, type: Directory}}
  initContainers:
  - name: sidecar
    image: {IMAGE}
    restartPolicy: Always
    volumeMounts: [{{name: out, mountPath: /out}}]
    command: ["sh", "-c", "read up _ < /proc/uptime; echo $up >> /out/sidecar-starts; trap 'read up _ < /proc/uptime; echo $up > /out/sidecar-stopped; exit 0' TERM; while [ ! -f /out/exit-sidecar ]; do sleep 0.2; done; rm /out/exit-sidecar; exit 1"]
  containers:
  - name: app
    image: {IMAGE}
    volumeMounts: [{{name: out, mountPath: /out}}]
    command: ["sh", "-c", "test -s /out/sidecar-starts && echo yes > /out/app-saw-sidecar; trap 'read up _ < /proc/uptime; echo $up > /out/app-stopped; exit 0' TERM; while true; do sleep 0.2; done"]
"#,
        out = out.display()
    )
}

fn hooks_pod(out: &Path) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: hooks
spec:
  terminationGracePeriodSeconds: 20
  volumes:
  - name: out
    hostPath: {{path: {out}, type: Directory}}
  containers:
  - name: app
    image: {IMAGE}
    volumeMounts: [{{name: out, mountPath: /out}}]
    command: ["sh", "-c", "while [ ! -f /tmp/post-start ]; do sleep 0.1; done; cp /tmp/post-start /out/main-saw; trap 'read up _ < /proc/uptime; echo $up > /out/term-at; exit 0' TERM; while true; do sleep 0.2; done"]
    lifecycle:
      postStart:
        exec: {{command: ["sh", "-c", "echo from-post-start > /tmp/post-start"]}}
      preStop:
        exec: {{command: ["sh", "-c", "read up _ < /proc/uptime; echo $up > /out/pre-stop-at; sleep 3"]}}
"#,
        out = out.display()
    )
}

#[test]
fn sidecar_and_hooks_run_in_order_on_containerd() {
    require_rig!();
    let rig = Rig::up("e2e-life-hooks");
    let agent = Kubelet::builder(&rig).start();
    let side_out = agent.dir().join("side-out");
    let hooks_out = agent.dir().join("hooks-out");
    std::fs::create_dir_all(&side_out).unwrap();
    std::fs::create_dir_all(&hooks_out).unwrap();
    agent.write_manifest("side.yaml", &sidecar_pod(&side_out));
    agent.write_manifest("hooks.yaml", &hooks_pod(&hooks_out));

    // The sidecar runs before the app container (which sees its file) and beside it.
    let pod = wait_for("side pod Running", Duration::from_secs(90), || {
        agent.pod("side-").filter(|p| {
            p["status"]["phase"] == "Running" && container(p, "app")["state"]["running"].is_object()
        })
    });
    let side = init_container(&pod, "sidecar");
    assert!(side["state"]["running"].is_object(), "{side}");
    assert_eq!(side["started"], true);
    assert_eq!(side["ready"], true);
    wait_for("app saw the sidecar", Duration::from_secs(20), || {
        side_out.join("app-saw-sidecar").exists().then_some(())
    });

    // postStart ran inside the container before the main process went on.
    wait_for(
        "main process saw postStart's file",
        Duration::from_secs(60),
        || std::fs::read_to_string(hooks_out.join("main-saw")).ok(),
    );
    assert_eq!(
        std::fs::read_to_string(hooks_out.join("main-saw"))
            .unwrap()
            .trim(),
        "from-post-start"
    );

    // A sidecar that exits is restarted; the app container is left alone.
    std::fs::write(side_out.join("exit-sidecar"), "").unwrap();
    let pod = wait_for("sidecar restarted", Duration::from_secs(60), || {
        agent.pod("side-").filter(|p| {
            let s = init_container(p, "sidecar");
            s["restartCount"].as_i64() >= Some(1) && s["state"]["running"].is_object()
        })
    });
    assert_eq!(container(&pod, "app")["restartCount"], 0);
    assert_eq!(pod["status"]["phase"], "Running");
    let starts = std::fs::read_to_string(side_out.join("sidecar-starts")).unwrap();
    assert_eq!(starts.lines().count(), 2, "two sidecar starts: {starts}");

    // Deleting: the app stops before the sidecar; preStop runs before the stop signal.
    std::fs::remove_file(agent.manifests().join("side.yaml")).unwrap();
    std::fs::remove_file(agent.manifests().join("hooks.yaml")).unwrap();
    wait_for("both pods gone", Duration::from_secs(60), || {
        (agent.pod("side-").is_none() && agent.pod("hooks-").is_none()).then_some(())
    });
    let app_stopped = read_uptime(&side_out.join("app-stopped")).expect("app got SIGTERM");
    let side_stopped = read_uptime(&side_out.join("sidecar-stopped")).expect("sidecar got SIGTERM");
    assert!(
        app_stopped <= side_stopped,
        "the sidecar is stopped after the app ({app_stopped} > {side_stopped})"
    );
    let pre_stop = read_uptime(&hooks_out.join("pre-stop-at")).expect("preStop ran");
    let term = read_uptime(&hooks_out.join("term-at")).expect("the app got SIGTERM");
    let waited = Duration::from_secs_f64((term - pre_stop).max(0.0));
    eprintln!("SIGTERM came {waited:?} after preStop started");
    assert!(
        waited >= Duration::from_secs(3),
        "SIGTERM only after the 3 s preStop hook finished (came after {waited:?})"
    );
    let log = agent.log_text();
    assert!(!log.contains("FailedPreStopHook"), "{log}");
}

const DEADLINE: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: deadline
spec:
  activeDeadlineSeconds: 5
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sleep", "3600"]
"#;

/// `logs` writes both lines to one stream: the runtime copies stdout and stderr separately, so
/// lines of two streams reach the log file in no fixed order.
const MESSAGES: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: messages
spec:
  restartPolicy: Never
  containers:
  - name: logs
    image: docker.io/library/busybox:1.35
    terminationMessagePolicy: FallbackToLogsOnError
    command: ["sh", "-c", "echo first line >&2; echo last words >&2; exit 4"]
  - name: file
    image: docker.io/library/busybox:1.35
    terminationMessagePolicy: FallbackToLogsOnError
    command: ["sh", "-c", "printf 'from the file' > /dev/termination-log; echo not this; exit 5"]
"#;

const POST_START_FAILS: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: post-start-fails
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sleep", "3600"]
    lifecycle:
      postStart:
        exec: {command: ["sh", "-c", "echo nope; exit 7"]}
"#;

#[test]
fn active_deadline_and_termination_messages_on_containerd() {
    require_rig!();
    let rig = Rig::up("e2e-life-deadline");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("deadline.yaml", DEADLINE);
    agent.write_manifest("messages.yaml", MESSAGES);
    agent.write_manifest("post-start-fails.yaml", POST_START_FAILS);

    let pod = wait_for("deadline pod Failed", Duration::from_secs(90), || {
        agent
            .pod("deadline-")
            .filter(|p| p["status"]["phase"] == "Failed")
    });
    assert_eq!(pod["status"]["reason"], "DeadlineExceeded");
    assert_eq!(
        pod["status"]["message"],
        "Pod was active on the node longer than the specified deadline"
    );
    let app = wait_for(
        "deadline container stopped",
        Duration::from_secs(30),
        || {
            agent
                .pod("deadline-")
                .map(|p| container(&p, "app").clone())
                .filter(|c| c["state"]["terminated"].is_object())
        },
    );
    assert_eq!(app["restartCount"], 0, "not restarted after the deadline");

    let pod = wait_for("messages pod Failed", Duration::from_secs(90), || {
        agent
            .pod("messages-")
            .filter(|p| p["status"]["phase"] == "Failed")
    });
    let logs = &container(&pod, "logs")["state"]["terminated"];
    assert_eq!(logs["exitCode"], 4);
    assert_eq!(logs["message"], "first line\nlast words\n", "{logs}");
    let file = &container(&pod, "file")["state"]["terminated"];
    assert_eq!(file["exitCode"], 5);
    assert_eq!(file["message"], "from the file", "{file}");

    // A failed postStart hook kills the container; with restartPolicy Never it stays dead.
    let pod = wait_for(
        "post-start-fails pod Failed",
        Duration::from_secs(90),
        || {
            agent
                .pod("post-start-fails-")
                .filter(|p| p["status"]["phase"] == "Failed")
        },
    );
    let app = container(&pod, "app");
    assert!(app["state"]["terminated"].is_object(), "{app}");
    assert_eq!(app["restartCount"], 0);
    let log = agent.log_text();
    assert!(
        log.contains("reason=\"FailedPostStartHook\" message=\"PostStartHook failed\""),
        "the FailedPostStartHook event is logged:\n{log}"
    );
}

/// Reads /dev/zero into memory (`tail` keeps the current "line", which never ends).
const HOG: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: hog
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["tail", "/dev/zero"]
    resources:
      limits:
        memory: 20Mi
"#;

#[test]
fn a_container_past_its_memory_limit_is_oom_killed() {
    require_rig!();
    let rig = Rig::up("e2e-oom");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("hog.yaml", HOG);
    // The runtime's reason comes through: in lastState once restarted (or in state while the
    // container waits in back-off).
    let (reason, code) = wait_for("an OOM kill in the status", Duration::from_secs(90), || {
        let p = agent.pod("hog-")?;
        let c = container(&p, "app");
        let t = [&c["lastState"]["terminated"], &c["state"]["terminated"]]
            .into_iter()
            .find(|t| t.is_object())?;
        Some((t["reason"].as_str()?.to_string(), t["exitCode"].as_i64()?))
    });
    assert_eq!((reason.as_str(), code), ("OOMKilled", 137));
    // The kernel's report is a cgroup OOM (oom_memcg names the container): no SystemOOM
    // event for the node, while the kernel log watch runs (it reads /dev/kmsg each second).
    std::thread::sleep(Duration::from_secs(2));
    let log = agent.log_text();
    assert!(!log.contains("cannot read the kernel log"), "{log}");
    assert!(!log.contains("SystemOOM"), "{log}");
}

const QUICK_EXIT: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: quick
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "sleep 2"]
"#;

/// containerd 1.6 has no `GetContainerEvents`: with the gate on, the agent falls back to
/// relisting every second (one info line), so a container's exit is seen in seconds, not at
/// the evented PLEG's 300 s relist.
#[test]
fn evented_pleg_on_containerd_1_6_falls_back_to_relisting_every_second() {
    require_rig!();
    let rig = Rig::up("e2e-life-evented");
    let agent = Kubelet::builder(&rig)
        .config("featureGates:\n  EventedPLEG: true\n")
        .start();
    agent.write_manifest("quick.yaml", QUICK_EXIT);
    wait_for("quick pod Running", Duration::from_secs(60), || {
        agent
            .pod("quick-")
            .filter(|p| p["status"]["phase"] == "Running")
    });
    // The container exits 2 s after it started; the generic relist sees it within a second
    // or two more (the pod worker's own resync is a minute away).
    let started = std::time::Instant::now();
    wait_for("quick pod Succeeded", Duration::from_secs(20), || {
        agent
            .pod("quick-")
            .filter(|p| p["status"]["phase"] == "Succeeded")
    });
    assert!(started.elapsed() < Duration::from_secs(20));
    let log = agent.log_text();
    assert_eq!(
        log.matches("falling back to relisting every second")
            .count(),
        1,
        "one info line:\n{log}"
    );
    assert!(!log.contains("feature gate EventedPLEG is set"), "{log}");
}
