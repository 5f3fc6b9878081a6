//! The kubelet in standalone mode on real containerd: static pods start, restart, stop, survive
//! agent and runtime restarts, and a bad manifest does not disturb good ones.

use node_tests::require_rig;
use node_tests::{Kubelet, Rig, container, wait_for};
use std::time::{Duration, Instant};

const WEB: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - name: httpd
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "echo hello-from-$(hostname) > /tmp/index.html; trap 'exit 0' TERM; httpd -f -p 8080 -h /tmp & wait"]
    ports: [{containerPort: 8080}]
"#;

fn running(agent: &Kubelet, prefix: &str) -> Option<serde_json::Value> {
    agent
        .pod(prefix)
        .filter(|p| p["status"]["phase"] == "Running" && p["status"]["podIP"].is_string())
}

#[test]
fn static_pod_runs_serves_survives_agent_restart_and_stops_on_removal() {
    require_rig!();
    let rig = Rig::up("e2e-static");
    let mut agent = Kubelet::builder(&rig).start();
    agent.write_manifest("web.yaml", WEB);
    // A broken manifest next to it must not disturb the good one.
    agent.write_manifest(
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: broken\nspec:\n  containers: 7\n",
    );

    let pod = wait_for("web pod Running", Duration::from_secs(60), || {
        running(&agent, "web-")
    });
    assert_eq!(pod["metadata"]["name"], "web-rig-node");
    assert_eq!(
        pod["metadata"]["annotations"]["kubernetes.io/config.source"],
        "file"
    );
    let c = container(&pod, "httpd");
    assert_eq!(c["ready"], true);
    assert!(
        c["containerID"]
            .as_str()
            .unwrap()
            .starts_with("containerd://")
    );
    assert!(c["imageID"].as_str().unwrap().starts_with("sha256:"));
    let ip = pod["status"]["podIP"].as_str().unwrap().to_string();
    let body = wait_for(
        "HTTP answer from the pod IP",
        Duration::from_secs(20),
        || {
            let b = agent.curl(&format!("http://{ip}:8080/index.html"));
            (!b.is_empty()).then_some(b)
        },
    );
    assert_eq!(body.trim(), "hello-from-web-rig-node");
    assert!(agent.pod("broken").is_none());
    let log = agent.log_text();
    assert!(
        log.contains("broken.yaml") && log.contains("spec.containers"),
        "the bad manifest is named with its field in the log:\n{log}"
    );

    // Kubelet restart (SIGTERM, then a crash): the same containers keep running.
    let id = c["containerID"].clone();
    agent.restart();
    let after = wait_for(
        "pod reported after restart",
        Duration::from_secs(30),
        || running(&agent, "web-"),
    );
    assert_eq!(
        container(&after, "httpd")["containerID"],
        id,
        "graceful restart must adopt, not recreate"
    );
    assert_eq!(container(&after, "httpd")["restartCount"], 0);
    agent.kill();
    agent.restart();
    let after = wait_for("pod reported after crash", Duration::from_secs(30), || {
        running(&agent, "web-")
    });
    assert_eq!(
        container(&after, "httpd")["containerID"],
        id,
        "restart after a crash must adopt too"
    );

    // Removing the manifest stops the pod within its grace period (3 s) plus a sync.
    std::fs::remove_file(agent.manifests().join("web.yaml")).unwrap();
    let t = Instant::now();
    wait_for("pod gone", Duration::from_secs(20), || {
        agent.pod("web-").is_none().then_some(())
    });
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "stopped in {:?}",
        t.elapsed()
    );
    let out = rig.sh(&format!("curl -s --max-time 2 http://{ip}:8080/index.html"));
    assert!(out.stdout.is_empty(), "nothing answers on the old pod IP");
    let sandboxes = std::process::Command::new(node_tests::bin("cri"))
        .args(["--endpoint", rig.get("CRI_ENDPOINT"), "pods", "-q"])
        .output()
        .unwrap();
    assert!(
        sandboxes.stdout.is_empty(),
        "sandbox removed: {}",
        String::from_utf8_lossy(&sandboxes.stdout)
    );
}

const CRASHER: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: crasher
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "sleep 1; exit 3"]
"#;

#[test]
fn crashing_container_restarts_with_backoff() {
    require_rig!();
    let rig = Rig::up("e2e-crash");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("crasher.yaml", CRASHER);
    // First restart is immediate, the second waits 10 s: within 40 s we see restartCount ≥ 2
    // and, in between, CrashLoopBackOff with the previous exit in lastState.
    let backoff = wait_for("CrashLoopBackOff", Duration::from_secs(40), || {
        let p = agent.pod("crasher-")?;
        let c = container(&p, "app").clone();
        (c["state"]["waiting"]["reason"] == "CrashLoopBackOff").then_some(c)
    });
    assert!(backoff["restartCount"].as_i64().unwrap() >= 1);
    assert_eq!(backoff["lastState"]["terminated"]["exitCode"], 3);
    assert_eq!(backoff["lastState"]["terminated"]["reason"], "Error");
    assert!(
        backoff["state"]["waiting"]["message"]
            .as_str()
            .unwrap()
            .starts_with(
                "back-off 10s restarting failed container=app pod=crasher-rig-node_default("
            ),
        "{backoff}"
    );
    let p = agent.pod("crasher-").unwrap();
    assert_eq!(
        p["status"]["phase"], "Running",
        "restartPolicy Always keeps the pod Running"
    );
    wait_for("restartCount 2", Duration::from_secs(30), || {
        let p = agent.pod("crasher-")?;
        (container(&p, "app")["restartCount"].as_i64()? >= 2).then_some(())
    });
}

const ONESHOT: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: oneshot
spec:
  restartPolicy: Never
  containers:
  - name: job
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "echo done; exit 0"]
"#;

#[test]
fn containerd_restart_is_survived_and_run_to_completion_pods_succeed() {
    require_rig!();
    let mut rig = Rig::up("e2e-runtime");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("web.yaml", WEB);
    let before = wait_for("web Running", Duration::from_secs(60), || {
        running(&agent, "web-")
    });
    let id = container(&before, "httpd")["containerID"].clone();

    rig.restart_containerd();
    // The agent reconnects: new work is done and old pods are untouched.
    agent.write_manifest("oneshot.yaml", ONESHOT);
    let done = wait_for("oneshot Succeeded", Duration::from_secs(60), || {
        agent
            .pod("oneshot-")
            .filter(|p| p["status"]["phase"] == "Succeeded")
    });
    let t = &container(&done, "job")["state"]["terminated"];
    assert_eq!(t["exitCode"], 0);
    assert_eq!(t["reason"], "Completed");
    let web = agent.pod("web-").unwrap();
    assert_eq!(container(&web, "httpd")["containerID"], id);
    assert_eq!(container(&web, "httpd")["restartCount"], 0);
    let logs = std::fs::read_dir(agent.dir().join("logs")).unwrap().count();
    assert!(logs >= 2, "each pod has a log directory");
}

/// The subPath escape: a container replaces its subPath directory in an emptyDir with a
/// symlink to `/` and exits. The restarted container must not get the host's `/`: the kubelet
/// refuses the mount (CreateContainerConfigError, naming the escape), and the first run shows
/// a legitimate subPath works (written through the subPath, read through the whole volume).
const ESCAPE: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: escape
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{name: scratch, emptyDir: {}}]
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "echo inside > /sub/f && [ \"$(cat /data/escape/f)\" = inside ] || exit 3; rm -rf /data/escape; ln -s / /data/escape; exit 1"]
    volumeMounts:
    - {name: scratch, mountPath: /data}
    - {name: scratch, mountPath: /sub, subPath: escape}
"#;

#[test]
fn subpath_symlink_escape_is_refused() {
    require_rig!();
    let rig = Rig::up("e2e-subpath");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("escape.yaml", ESCAPE);
    let pod = wait_for(
        "the restarted container refused",
        Duration::from_secs(90),
        || {
            agent.pod("escape-").filter(|p| {
                container(p, "app")["state"]["waiting"]["reason"] == "CreateContainerConfigError"
            })
        },
    );
    let c = container(&pod, "app");
    let message = c["state"]["waiting"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("escapes the volume"),
        "waiting message: {message}"
    );
    // The first run exited 1 (not 3): the subPath worked before it was swapped.
    assert_eq!(
        c["lastState"]["terminated"]["exitCode"], 1,
        "first run: {c}"
    );
    // Removing the pod unmounts its subPath mounts before its directory goes. (The root
    // directory itself stays a mount: the agent makes it rshared at start, as upstream.)
    let pods_dir = agent.dir().join("root/pods");
    let mounts = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&*pods_dir.to_string_lossy()))
            .count()
    };
    assert!(mounts() > 0, "the first run's subPath mount is in place");
    std::fs::remove_file(agent.manifests().join("escape.yaml")).unwrap();
    wait_for("escape pod removed", Duration::from_secs(60), || {
        agent.pod("escape-").is_none().then_some(())
    });
    wait_for("its mounts gone", Duration::from_secs(10), || {
        (mounts() == 0).then_some(())
    });
}

/// The kubelet's iptables chains (makeIPTablesUtilChains, on by default) in the network
/// namespace it runs in (the rig's): the hint chain the iptables-wrapper of kube-proxy,
/// flannel and Calico images reads, the canaries in mangle, nat and filter, both families,
/// and the IPv4 localnet firewall. The runtime (containerd 1.6 here) lacks RuntimeConfig:
/// the configured cgroup driver stays, with upstream's one info line.
#[test]
fn iptables_hint_and_canary_chains_and_the_cgroup_driver_fallback() {
    require_rig!();
    let rig = Rig::up("e2e-chains");
    let agent = Kubelet::builder(&rig).start();
    let save = |cmd: &str| {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net={}", agent.netns()))
            .arg(cmd)
            .output()
            .expect(cmd);
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let complete = |text: &str| {
        text.contains(":KUBE-IPTABLES-HINT - [0:0]")
            && text.matches(":KUBE-KUBELET-CANARY - [0:0]").count() == 3
    };
    let (v4, v6) = wait_for("the kubelet's chains", Duration::from_secs(30), || {
        let (v4, v6) = (save("iptables-save"), save("ip6tables-save"));
        (complete(&v4) && complete(&v6)).then_some((v4, v6))
    });
    assert!(v4.contains("-A INPUT -j KUBE-FIREWALL"), "{v4}");
    assert!(
        v4.contains("--comment \"block incoming localnet connections\""),
        "{v4}"
    );
    assert!(!v6.contains("KUBE-FIREWALL"), "{v6}");
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert!(log.contains("Initialized iptables rules."), "{log}");
    if log.contains("Using cgroup driver setting received from the CRI runtime") {
        eprintln!("this runtime answers RuntimeConfig: no fallback to check");
    } else {
        assert!(
            log.contains("Falling back to using cgroupDriver from kubelet config"),
            "{log}"
        );
    }
}

/// Parallel-pull settings upstream refuses stop the start with upstream's message (no rig
/// needed: the agent exits while reading its config).
#[test]
fn parallel_pull_settings_upstream_refuses_stop_the_start() {
    for (config, want) in [
        (
            "serializeImagePulls: true\nmaxParallelImagePulls: 3\n",
            "invalid configuration: maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls (--serialize-image-pulls) is set to false",
        ),
        (
            "serializeImagePulls: false\nmaxParallelImagePulls: 0\n",
            "invalid configuration: maxParallelImagePulls 0 must be a positive number",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(
            &file,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{config}"
            ),
        )
        .unwrap();
        let out = std::process::Command::new("timeout")
            .arg("20")
            .arg(node_tests::bin("kubelet"))
            .arg(format!("--config={}", file.display()))
            .arg(format!("--root-dir={}", dir.path().join("root").display()))
            .env("NO_COLOR", "1")
            .output()
            .expect("run kubelet");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{config}: {stderr}");
        assert!(stderr.contains(want), "{config}: {stderr}");
    }
}

const VOLUMES: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: vols
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - {name: mem, emptyDir: {medium: Memory}}
  - {name: disk, emptyDir: {}}
  containers:
  - name: c
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    volumeMounts:
    - {name: mem, mountPath: /mem}
    - {name: disk, mountPath: /sub, subPath: part}
"#;

/// Starts pod `name` with a tmpfs and a subPath volume on `agent`, drops the agent with the
/// pod still running, and returns the mounts left at or below `root` (its temporary root).
fn mounts_left_after(
    agent: Kubelet,
    name: &str,
    root: &std::path::Path,
    manifests: &std::path::Path,
) -> Vec<String> {
    let manifest = VOLUMES.replace("name: vols", &format!("name: {name}"));
    std::fs::write(manifests.join(format!("{name}.yaml")), manifest).unwrap();
    wait_for(&format!("{name} Running"), Duration::from_secs(90), || {
        running(&agent, &format!("{name}-rig-node"))
    });
    let during = node_tests::mounts_below(root);
    // The root's shared bind mount, the tmpfs and the subPath bind mount at least.
    assert!(during.len() >= 3, "the pod's mounts are there: {during:?}");
    drop(agent);
    node_tests::mounts_below(root)
}

/// Issue 43.3: the agent leaves its root directory a shared bind mount of itself (as
/// upstream's kubelet does); the harness unmounts what the agent made under its temporary
/// roots, for a standalone agent and for one started with its own command line.
#[test]
fn the_harness_leaves_no_mount_under_its_temporary_roots() {
    require_rig!();
    let rig = Rig::up("e2e-mounts");
    let agent = Kubelet::builder(&rig).start();
    let (dir, manifests) = (agent.dir().to_path_buf(), agent.manifests());
    let left = mounts_left_after(agent, "vols", &dir, &manifests);
    assert!(
        left.is_empty(),
        "standalone: mounts left under {dir:?}: {left:?}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    std::fs::create_dir_all(d.join("manifests")).unwrap();
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\npodLogsDir: {}\ncgroupRoot: {}\nfileCheckFrequency: 20s\n\
         authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n{}",
        d.join("manifests").display(),
        d.join("logs").display(),
        rig.get("RIG_CGROUP_ROOT"),
        node_tests::TEST_EVICTION_HARD,
    );
    std::fs::write(d.join("config.yaml"), config).unwrap();
    let agent = Kubelet::builder(&rig)
        .args(vec![
            format!("--config={}", d.join("config.yaml").display()),
            format!("--container-runtime-endpoint={}", rig.get("CRI_ENDPOINT")),
            "--root-dir".into(),
            d.join("root").display().to_string(),
            "--hostname-override=rig-node".into(),
        ])
        .log(d.join("kubelet.log"))
        .start();
    wait_for("healthz", Duration::from_secs(60), || {
        (agent.curl("http://127.0.0.1:10248/healthz") == "ok").then_some(())
    });
    let left = mounts_left_after(agent, "vols-args", d, &d.join("manifests"));
    assert!(
        left.is_empty(),
        "command line: mounts left under {d:?}: {left:?}"
    );
}

/// klog's text header as log parsers match it.
const KLOG_HEADER: &str = r"^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{6}\s+\d+ [^:]+:\d+\] ";

/// The agent's log lines once it has written at least `n`.
fn log_lines(agent: &Kubelet, n: usize) -> Vec<String> {
    wait_for("log lines", Duration::from_secs(30), || {
        let lines: Vec<String> = agent.log_text().lines().map(str::to_string).collect();
        (lines.len() >= n).then_some(lines)
    })
}

#[test]
fn logging_format_json_from_the_config_file_and_klog_text_by_default() {
    require_rig!();
    let rig = Rig::up("e2e-logjson");
    let agent = Kubelet::builder(&rig)
        .config("logging:\n  format: json\n")
        .start();
    let lines = log_lines(&agent, 3);
    for l in &lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["ts"].is_f64(), "ts is float seconds: {l}");
        assert!(v["msg"].is_string(), "{l}");
        let caller = v["caller"].as_str().unwrap_or_default();
        assert!(
            caller
                .rsplit_once(':')
                .is_some_and(|(f, n)| f.ends_with(".rs") && n.parse::<u32>().is_ok()),
            "caller file:line: {l}"
        );
        assert!(v["v"].is_u64() || v.get("err").is_some(), "v or err: {l}");
    }
    drop(agent);
    drop(rig);
    let rig = Rig::up("e2e-logtext");
    let agent = Kubelet::builder(&rig).start();
    let header = regex::Regex::new(KLOG_HEADER).unwrap();
    for l in &log_lines(&agent, 3) {
        assert!(header.is_match(l), "not a klog line: {l}");
    }
}
