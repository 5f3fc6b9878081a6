//! Probes on real containerd, as a user sees them in the kubelet's `:10250/pods`: a failing
//! liveness probe restarts the container, readiness (httpGet, tcpSocket, grpc) flips the
//! container's `ready` and the pod's `Ready` condition both ways, and a startup probe holds the
//! liveness probe back until it succeeds.

use node_tests::require_rig;
use node_tests::{Kubelet, Rig, container, pod_condition, wait_for};
use serde_json::Value;
use std::time::{Duration, Instant};

/// Polls the pod until `f` accepts the status of container `name`; returns (pod, container).
fn wait_container(
    agent: &Kubelet,
    prefix: &str,
    name: &str,
    what: &str,
    timeout: Duration,
    mut f: impl FnMut(&Value) -> bool,
) -> (Value, Value) {
    wait_for(what, timeout, || {
        let p = agent.pod(prefix)?;
        let c = container(&p, name).clone();
        f(&c).then_some((p, c))
    })
}

fn running(c: &Value) -> bool {
    c["state"]["running"].is_object()
}

fn ts(v: &Value) -> jiff::Timestamp {
    v.as_str()
        .unwrap_or_else(|| panic!("not a timestamp: {v}"))
        .parse()
        .unwrap_or_else(|e| panic!("bad timestamp {v}: {e}"))
}

/// Upstream's pod `Ready` condition for a running pod whose containers' readiness is `ready`
/// (single-container pods): True, or False with reason ContainersNotReady naming the container.
fn assert_ready_condition(pod: &Value, container_name: &str, ready: bool) {
    for t in ["Ready", "ContainersReady"] {
        let cond = pod_condition(pod, t);
        if ready {
            assert_eq!(cond["status"], "True", "{t} condition: {cond}");
        } else {
            assert_eq!(cond["status"], "False", "{t} condition: {cond}");
            assert_eq!(
                cond["reason"], "ContainersNotReady",
                "{t} condition: {cond}"
            );
            assert_eq!(
                cond["message"],
                format!("containers with unready status: [{container_name}]"),
                "{t} condition: {cond}"
            );
        }
    }
}

/// Watches a single-container pod whose readiness toggles on a schedule and checks that it
/// goes ready → not ready → ready again, with the pod's Ready condition agreeing in every
/// answer and the container never restarted.
fn assert_readiness_toggles(agent: &Kubelet, prefix: &str, name: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let want = [true, false, true];
    let mut seen: Vec<bool> = Vec::new();
    let mut id = Value::Null;
    while seen.len() < want.len() {
        assert!(
            Instant::now() < deadline,
            "readiness of {prefix}/{name}: wanted {want:?}, saw {seen:?} within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
        let Some(pod) = agent.pod(prefix) else {
            continue;
        };
        let c = container(&pod, name);
        if !running(c) {
            continue;
        }
        if id.is_null() {
            id = c["containerID"].clone();
        }
        assert_eq!(
            c["containerID"], id,
            "readiness failures never restart: {c}"
        );
        assert_eq!(c["restartCount"], 0, "{c}");
        assert_eq!(
            c["started"], true,
            "no startup probe: started once running: {c}"
        );
        let ready = c["ready"]
            .as_bool()
            .unwrap_or_else(|| panic!("ready missing: {c}"));
        assert_ready_condition(&pod, name, ready);
        // The first answers may be "not ready" (before the first success): not a transition.
        if seen.last() != Some(&ready) && (ready || !seen.is_empty()) {
            seen.push(ready);
        }
        assert_eq!(
            seen[..],
            want[..seen.len()],
            "unexpected readiness sequence for {prefix}/{name}"
        );
    }
}

const LIVENESS_EXEC: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: liveness-exec
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "touch /tmp/healthy; trap 'exit 143' TERM; sleep 5; rm -f /tmp/healthy; while true; do sleep 1; done"]
    livenessProbe:
      exec:
        command: ["test", "-f", "/tmp/healthy"]
      periodSeconds: 1
      failureThreshold: 2
"#;

#[test]
fn liveness_exec_failure_restarts_the_container() {
    require_rig!();
    let rig = Rig::up("pe2e-live");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("liveness.yaml", LIVENESS_EXEC);

    let (_, first) = wait_container(
        &agent,
        "liveness-exec-",
        "app",
        "app running",
        Duration::from_secs(30),
        running,
    );
    assert_eq!(first["restartCount"], 0);
    assert_eq!(
        first["ready"], true,
        "no readiness probe: ready once started"
    );
    let first_id = first["containerID"].clone();
    let first_started = ts(&first["state"]["running"]["startedAt"]);

    // /tmp/healthy goes at ~5 s; two failures 1 s apart; SIGTERM → exit 143.
    let (pod, c) = wait_container(
        &agent,
        "liveness-exec-",
        "app",
        "restart after the liveness failure",
        Duration::from_secs(30),
        |c| c["restartCount"].as_i64().unwrap_or(0) >= 1 && running(c),
    );
    assert_eq!(c["restartCount"], 1, "{c}");
    assert_ne!(c["containerID"], first_id, "a new container: {c}");
    let last = &c["lastState"]["terminated"];
    assert!(last.is_object(), "lastState.terminated present: {c}");
    assert_eq!(last["containerID"], first_id, "{c}");
    assert_eq!(last["exitCode"], 143, "{c}");
    assert_eq!(last["reason"], "Error", "{c}");
    let lived = ts(&last["finishedAt"]).duration_since(first_started);
    assert!(
        lived >= jiff::SignedDuration::from_secs(4),
        "killed only once the file was gone (~5 s + 2 failures), lived {lived:?}: {c}"
    );
    assert_eq!(ts(&last["startedAt"]), first_started, "{c}");
    assert_eq!(
        pod["status"]["phase"], "Running",
        "restartPolicy Always: Running"
    );
    let log = agent.log_text();
    assert!(
        log.contains("failed liveness probe, will be restarted"),
        "the kill is logged:\n{log}"
    );
}

const READINESS_HTTP: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: readiness-http
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: web
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "mkdir -p /www; httpd -p 8080 -h /www; trap 'exit 0' TERM; while true; do echo ok > /www/ready; sleep 6; rm -f /www/ready; sleep 6; done"]
    ports: [{containerPort: 8080}]
    readinessProbe:
      httpGet:
        path: /ready
        port: 8080
      periodSeconds: 1
      failureThreshold: 1
"#;

#[test]
fn readiness_http_get_follows_the_served_file_both_ways() {
    require_rig!();
    let rig = Rig::up("pe2e-ready");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("readiness.yaml", READINESS_HTTP);
    wait_container(
        &agent,
        "readiness-http-",
        "web",
        "web running",
        Duration::from_secs(30),
        running,
    );
    // Present 6 s, absent 6 s, present again: ready, not ready, ready.
    assert_readiness_toggles(&agent, "readiness-http-", "web", Duration::from_secs(40));
}

const STARTUP_GATE: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: startup-gate
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 6; touch /tmp/started; while true; do sleep 1; done"]
    startupProbe:
      exec:
        command: ["test", "-f", "/tmp/started"]
      periodSeconds: 1
      failureThreshold: 30
    livenessProbe:
      exec:
        command: ["test", "-f", "/tmp/started"]
      periodSeconds: 1
      failureThreshold: 1
"#;

#[test]
fn startup_probe_holds_liveness_back_until_it_succeeds() {
    require_rig!();
    let rig = Rig::up("pe2e-start");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("startup.yaml", STARTUP_GATE);

    // Before /tmp/started exists (~6 s) the liveness probe would fail at once, but it is not run.
    let (pod, c) = wait_container(
        &agent,
        "startup-gate-",
        "app",
        "app running, not started yet",
        Duration::from_secs(30),
        running,
    );
    assert_eq!(c["started"], false, "startup probe not yet succeeded: {c}");
    assert_eq!(c["ready"], false, "not started ⇒ not ready: {c}");
    assert_ready_condition(&pod, "app", false);
    let id = c["containerID"].clone();

    let (pod, c) = wait_container(
        &agent,
        "startup-gate-",
        "app",
        "started",
        Duration::from_secs(30),
        |c| {
            assert_eq!(c["restartCount"], 0, "liveness must wait for startup: {c}");
            c["started"] == true
        },
    );
    assert_eq!(c["containerID"], id, "{c}");
    assert_eq!(
        c["ready"], true,
        "no readiness probe: ready once started: {c}"
    );
    assert_ready_condition(&pod, "app", true);

    // Liveness now runs and passes: still the same container a few periods later.
    std::thread::sleep(Duration::from_secs(4));
    let pod = agent.pod("startup-gate-").unwrap();
    let c = container(&pod, "app");
    assert_eq!(c["restartCount"], 0, "{c}");
    assert_eq!(c["containerID"], id, "{c}");
    assert_eq!(c["started"], true, "{c}");
    assert!(
        !agent.log_text().contains("probe, will be restarted"),
        "no probe kill:\n{}",
        agent.log_text()
    );
}

const READINESS_TCP: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: readiness-tcp
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: listener
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 2; nc -ll -p 7000 -e true & wait"]
    readinessProbe:
      tcpSocket:
        port: 7000
      periodSeconds: 1
  - name: closed
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
    readinessProbe:
      tcpSocket:
        port: 7001
      periodSeconds: 1
"#;

#[test]
fn readiness_tcp_socket_is_ready_when_the_port_accepts() {
    require_rig!();
    let rig = Rig::up("pe2e-tcp");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("tcp.yaml", READINESS_TCP);

    let (pod, c) = wait_container(
        &agent,
        "readiness-tcp-",
        "listener",
        "listener ready",
        Duration::from_secs(40),
        |c| running(c) && c["ready"] == true,
    );
    assert_eq!(c["restartCount"], 0, "{c}");
    let closed = container(&pod, "closed");
    assert!(running(closed), "{closed}");
    assert_eq!(closed["ready"], false, "nothing listens on 7001: {closed}");
    assert_ready_condition(&pod, "closed", false);

    // Still so a few periods later (the listener keeps accepting).
    std::thread::sleep(Duration::from_secs(3));
    let pod = agent.pod("readiness-tcp-").unwrap();
    assert_eq!(container(&pod, "listener")["ready"], true, "{pod}");
    assert_eq!(container(&pod, "closed")["ready"], false, "{pod}");
    assert_eq!(container(&pod, "closed")["restartCount"], 0, "{pod}");
}

fn readiness_grpc(image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: readiness-grpc
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: health
    image: {image}
    args: ["--port", "9090", "--toggle-every", "8"]
    readinessProbe:
      grpc:
        port: 9090
      periodSeconds: 1
      failureThreshold: 1
"#
    )
}

#[test]
fn readiness_grpc_follows_the_health_service_status() {
    require_rig!();
    let rig = Rig::up("pe2e-grpc");
    let image = node_tests::import_grpc_health_image(&rig);
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("grpc.yaml", &readiness_grpc(image));
    wait_container(
        &agent,
        "readiness-grpc-",
        "health",
        "grpc server running",
        Duration::from_secs(30),
        running,
    );
    // SERVING for 8 s, NOT_SERVING for 8 s, SERVING again: ready, not ready, ready.
    assert_readiness_toggles(&agent, "readiness-grpc-", "health", Duration::from_secs(45));
    let logs = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("cat {}/logs/*/health/*.log", agent.dir().display()))
        .output()
        .unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(
        logs.contains("-> SERVING") && logs.contains("-> NOT_SERVING"),
        "the server answered both ways:\n{logs}"
    );
}
