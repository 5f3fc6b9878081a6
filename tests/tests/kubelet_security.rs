//! securityContext on real containerd (standalone static pods): what the container sees from
//! inside (capabilities, no_new_privs, seccomp, user and groups, read-only root, a safe
//! sysctl), runAsNonRoot refused for an image that runs as root, a pod with a forbidden
//! sysctl rejected at admission, and restarted containers keeping their UID (CVE-2019-11245).

use node_tests::require_rig;
use node_tests::{Kubelet, Rig, container, wait_for};
use std::time::Duration;

const SECURE: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: secure
spec:
  terminationGracePeriodSeconds: 1
  securityContext:
    runAsUser: 1234
    runAsGroup: 2345
    runAsNonRoot: true
    supplementalGroups: [3456]
    fsGroup: 4567
    seccompProfile: {type: RuntimeDefault}
    sysctls: [{name: net.ipv4.ping_group_range, value: "7 4242"}]
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; echo ID $(id); if touch /probe 2>/dev/null; then echo ROOTFS writable; else echo ROOTFS read-only; fi; echo PING $(cat /proc/sys/net/ipv4/ping_group_range); echo DONE; exec sleep 3600"]
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}
"#;

/// The image runs as root (its config names no user): runAsNonRoot must refuse it.
const NONROOT: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: nonroot
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {runAsNonRoot: true}
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sleep", "3600"]
"#;

const SYSCTL: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: unsafe-sysctl
spec:
  securityContext:
    sysctls: [{name: net.core.somaxconn, value: "1024"}]
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sleep", "3600"]
"#;

/// CVE-2017-1002102: a container tries to plant a link to a host directory in its
/// downwardAPI volume (as `..data`, for the kubelet's next re-render to delete). The volume,
/// and a subPath of it, are read-only whatever the mount says, even to root in the container
/// (the stronger case of the report's `runAsUser: 65534`).
const DATA_LINK: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: data-link
  labels: {app: data-link}
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: info
    downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    volumeMounts:
    - {name: info, mountPath: /info, readOnly: false}
    - {name: info, mountPath: /one, subPath: labels}
    command: ["sh", "-c", "echo TOUCH $(touch /info/probe 2>&1 || true); echo LINK $(ln -s ../../../../../../../../../../../..VICTIM /info/..planted 2>&1 || true); echo RM $(rm /info/..data 2>&1 || true); echo SUBPATH $(sh -c 'echo x >> /one' 2>&1 || true); echo DONE; exec sleep 3600"]
"#;

/// The container's output so far, from its CRI log under the agent's podLogsDir.
fn container_output(agent: &Kubelet, pod_prefix: &str) -> String {
    let logs = agent.dir().join("logs");
    let mut text = String::new();
    for dir in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
        if !dir
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("default_{pod_prefix}"))
        {
            continue;
        }
        let log = dir.path().join("app/0.log");
        for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
            // CRI format: `<time> <stream> <P|F> <text>`.
            if let Some(t) = line.splitn(4, ' ').nth(3) {
                text.push_str(t);
                text.push('\n');
            }
        }
    }
    text
}

fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {key} in the container's output:\n{out}"))
}

#[test]
fn security_context_is_what_the_container_sees() {
    require_rig!();
    let rig = Rig::up("e2e-security");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("secure.yaml", SECURE);
    agent.write_manifest("nonroot.yaml", NONROOT);
    agent.write_manifest("sysctl.yaml", SYSCTL);
    let victim = agent.dir().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("precious"), b"keep").unwrap();
    agent.write_manifest(
        "data-link.yaml",
        &DATA_LINK.replace("VICTIM", &victim.display().to_string()),
    );

    let pod = wait_for("secure pod Running", Duration::from_secs(60), || {
        agent
            .pod("secure-")
            .filter(|p| p["status"]["phase"] == "Running")
    });
    assert_eq!(container(&pod, "app")["restartCount"], 0);
    let out = wait_for("the container's report", Duration::from_secs(20), || {
        let o = container_output(&agent, "secure-");
        o.contains("DONE").then_some(o)
    });
    // drop ALL + add NET_BIND_SERVICE: the bounding set holds only bit 10; a non-root user
    // has no effective capabilities.
    assert_eq!(field(&out, "CapBnd:"), "0000000000000400", "{out}");
    assert_eq!(field(&out, "CapEff:"), "0000000000000000", "{out}");
    assert_eq!(field(&out, "NoNewPrivs:"), "1", "{out}");
    // 2 = SECCOMP_MODE_FILTER: the runtime's default profile is loaded.
    assert_eq!(field(&out, "Seccomp:"), "2", "{out}");
    let id = field(&out, "ID");
    assert!(
        id.contains("uid=1234") && id.contains("gid=2345"),
        "runAsUser/runAsGroup: {id}"
    );
    let groups = id.split("groups=").nth(1).unwrap_or("");
    assert!(
        groups.contains("3456") && groups.contains("4567"),
        "supplementalGroups and fsGroup are supplementary groups: {id}"
    );
    assert_eq!(field(&out, "ROOTFS"), "read-only", "{out}");
    assert_eq!(field(&out, "PING"), "7 4242", "the safe sysctl is applied");

    // runAsNonRoot with an image that runs as root: CreateContainerConfigError, never started.
    let pod = wait_for(
        "nonroot pod waiting with CreateContainerConfigError",
        Duration::from_secs(60),
        || {
            agent.pod("nonroot-").filter(|p| {
                container(p, "app")["state"]["waiting"]["reason"] == "CreateContainerConfigError"
            })
        },
    );
    let message = container(&pod, "app")["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        message.contains("container has runAsNonRoot and image will run as root"),
        "{message}"
    );
    assert!(container(&pod, "app")["containerID"].is_null());

    // A sysctl neither safe nor allowed: the pod fails at admission, nothing is started.
    let pod = wait_for("unsafe-sysctl pod Failed", Duration::from_secs(60), || {
        agent
            .pod("unsafe-sysctl-")
            .filter(|p| p["status"]["phase"] == "Failed")
    });
    assert_eq!(pod["status"]["reason"], "SysctlForbidden");
    assert_eq!(
        pod["status"]["message"],
        "Pod was rejected: forbidden sysctl: \"net.core.somaxconn\" not allowlisted"
    );
    let sandboxes = std::process::Command::new(node_tests::bin("cri"))
        .args(["--endpoint", rig.get("CRI_ENDPOINT"), "pods"])
        .output()
        .unwrap();
    let sandboxes = String::from_utf8_lossy(&sandboxes.stdout);
    assert!(
        sandboxes.contains("default/secure-rig-node") && !sandboxes.contains("unsafe-sysctl"),
        "no sandbox for the rejected pod:\n{sandboxes}"
    );

    // The ..data attack: every write into the API-data volume sees a read-only file system,
    // and the volume's ..data still names one of its own version directories.
    let out = wait_for(
        "the data-link container's report",
        Duration::from_secs(60),
        || {
            let o = container_output(&agent, "data-link-");
            o.contains("DONE").then_some(o)
        },
    );
    for key in ["TOUCH", "LINK", "RM", "SUBPATH"] {
        assert!(
            field(&out, key).contains("Read-only file system"),
            "{key}: {out}"
        );
    }
    let pod = agent.pod("data-link-").unwrap();
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    let vol = agent
        .dir()
        .join("root/pods")
        .join(uid)
        .join("volumes/kubernetes.io~downward-api/info");
    let data = std::fs::read_link(vol.join("..data")).unwrap();
    assert!(data.to_string_lossy().starts_with("..20"), "{data:?}");
    assert_eq!(
        std::fs::read_to_string(vol.join("labels")).unwrap(),
        "app=\"data-link\"\n"
    );
    assert_eq!(std::fs::read(victim.join("precious")).unwrap(), b"keep");
}

/// An image whose config says `User: 1000:1000` (busybox, `app` in its /etc/passwd), built
/// with the rig's mkimage.sh and imported into this rig's containerd.
fn import_user_image(rig: &Rig, dir: &std::path::Path) -> &'static str {
    const IMAGE: &str = "registry.local/busybox-user:1";
    let root = dir.join("rootfs");
    for d in ["bin", "etc", "tmp", "proc", "sys", "dev"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    for applet in ["sh", "id", "echo", "sleep", "cat"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/:/bin/sh\napp:x:1000:1000:app:/tmp:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\napp:x:1000:\n").unwrap();
    let tar = dir.join("busybox-user.tar");
    let rig_dir = node_tests::repo_root().join("tests/rig");
    let out = std::process::Command::new(rig_dir.join("mkimage.sh"))
        .arg(&root)
        .arg(IMAGE)
        .arg(&tar)
        .args(["", "[\"sh\"]", "1000:1000"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkimage.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(rig_dir.join("build-test-images.sh"))
        .arg("import")
        .arg(&tar)
        .arg(rig.get("CONTAINERD_SOCK"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    IMAGE
}

/// The UIDs each run of the `app` container reported, in run order (its CRI log files
/// `0.log`, `1.log`, …).
fn uids_per_run(agent: &Kubelet, pod_prefix: &str) -> Vec<String> {
    let logs = agent.dir().join("logs");
    let mut out = Vec::new();
    for dir in std::fs::read_dir(&logs).into_iter().flatten().flatten() {
        if !dir
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("default_{pod_prefix}"))
        {
            continue;
        }
        for run in 0..5 {
            let Ok(text) = std::fs::read_to_string(dir.path().join(format!("app/{run}.log")))
            else {
                break;
            };
            if let Some(uid) = text.lines().find_map(|l| l.split(" UID ").nth(1)) {
                out.push(uid.trim().to_string());
            }
        }
    }
    out
}

/// CVE-2019-11245 on real containerd: a pod that names no runAsUser, of an image whose
/// USER is 1000 and that is on the node before the pod: the first run and the restarted
/// run both run as 1000 (the CVE ran the restart as root); a second pod's runAsUser 2345
/// wins over the image's user on every run.
#[test]
fn cve_2019_11245_restarted_containers_keep_their_uid() {
    require_rig!();
    let rig = Rig::up("e2e-uid-restart");
    let dir = tempfile::tempdir().unwrap();
    let image = import_user_image(&rig, dir.path());
    let agent = Kubelet::builder(&rig).start();
    for (name, sc) in [
        ("image-user", ""),
        ("pod-user", "  securityContext: {runAsUser: 2345}\n"),
    ] {
        agent.write_manifest(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n{sc}  containers:\n  - name: app\n    image: {image}\n    command: [\"sh\", \"-c\", \"echo UID $(id -u); exit 1\"]\n"
            ),
        );
    }
    for (name, want) in [("image-user", "1000"), ("pod-user", "2345")] {
        let uids = wait_for(
            &format!("{name}: two runs of app"),
            Duration::from_secs(90),
            || {
                let u = uids_per_run(&agent, &format!("{name}-"));
                (u.len() >= 2).then_some(u)
            },
        );
        assert!(
            uids.iter().all(|u| u == want),
            "{name}: every run as {want}, got {uids:?}"
        );
        let pod = agent.pod(&format!("{name}-")).unwrap();
        assert!(
            container(&pod, "app")["restartCount"].as_i64().unwrap_or(0) >= 1,
            "{pod}"
        );
    }
}
