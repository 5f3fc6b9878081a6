//! Volume mount fields: mountPropagation (a mount made on the host after the container
//! started shows inside with HostToContainer, not with None), subPathExpr (two pods write to
//! their own directories of one hostPath), and recursiveReadOnly, which containerd 1.6 does
//! not report: Enabled is refused with upstream's message, IfPossible runs read-only.

use node_tests::require_rig;
use node_tests::{Kubelet, Rig, container, unmount_below, wait_for};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A container's output so far, from its CRI log under the agent's podLogsDir.
fn output(agent: &Kubelet, pod_prefix: &str, container: &str) -> String {
    let mut text = String::new();
    for dir in std::fs::read_dir(agent.dir().join("logs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if !dir
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("default_{pod_prefix}"))
        {
            continue;
        }
        let log = dir.path().join(container).join("0.log");
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

fn run(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd).args(args).status().unwrap();
    assert!(st.success(), "{cmd} {args:?} failed");
}

/// Unmounts what the test mounted, also when it fails.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        unmount_below(&self.0);
    }
}

const PROPAGATION: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: propagation
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: host
    hostPath: {path: HOSTDIR, type: Directory}
  containers:
  - name: h2c
    image: docker.io/library/busybox:1.35
    volumeMounts:
    - {name: host, mountPath: /mnt, mountPropagation: HostToContainer}
    command: ["sh", "-c", "while true; do if [ -e /mnt/sub/marker ]; then echo SEEN; else echo ABSENT; fi; sleep 1; done"]
  - name: none
    image: docker.io/library/busybox:1.35
    volumeMounts:
    - {name: host, mountPath: /mnt, mountPropagation: None}
    command: ["sh", "-c", "while true; do if [ -e /mnt/sub/marker ]; then echo SEEN; else echo ABSENT; fi; sleep 1; done"]
"#;

#[test]
fn host_to_container_propagation_shows_later_host_mounts_and_none_does_not() {
    require_rig!();
    let rig = Rig::up("e2e-propagation");
    let agent = Kubelet::builder(&rig).start();
    // The source must be a shared (or slave) mount for containerd to make it rslave: a bind
    // of the directory onto itself, made rshared (systemd hosts have / shared already).
    let host = agent.dir().join("shared");
    std::fs::create_dir_all(host.join("sub")).unwrap();
    let host_s = host.display().to_string();
    let _mounted = Mounted(host.clone());
    run("mount", &["--bind", &host_s, &host_s]);
    run("mount", &["--make-rshared", &host_s]);
    agent.write_manifest("propagation.yaml", &PROPAGATION.replace("HOSTDIR", &host_s));
    wait_for("both containers report", Duration::from_secs(60), || {
        let p = agent.pod("propagation-")?;
        let running = ["h2c", "none"]
            .iter()
            .all(|c| container(&p, c)["state"]["running"].is_object());
        (running
            && output(&agent, "propagation", "h2c").contains("ABSENT")
            && output(&agent, "propagation", "none").contains("ABSENT"))
        .then_some(())
    });
    // Now a mount on the host, after both containers started.
    let sub = host.join("sub");
    run(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            "size=1m",
            "tmpfs",
            &sub.display().to_string(),
        ],
    );
    std::fs::write(sub.join("marker"), b"x").unwrap();
    wait_for(
        "HostToContainer sees the host's new mount",
        Duration::from_secs(30),
        || {
            output(&agent, "propagation", "h2c")
                .contains("SEEN")
                .then_some(())
        },
    );
    // The private mount keeps the directory it got: three more looks, none sees it.
    let before = output(&agent, "propagation", "none").lines().count();
    wait_for(
        "the None container looked three more times",
        Duration::from_secs(30),
        || (output(&agent, "propagation", "none").lines().count() >= before + 3).then_some(()),
    );
    let none = output(&agent, "propagation", "none");
    assert!(!none.contains("SEEN"), "None saw the host's mount:\n{none}");
}

const SUBPATH_EXPR: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: WRITER
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: data
    hostPath: {path: HOSTDIR, type: Directory}
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    volumeMounts:
    - {name: data, mountPath: /data, subPathExpr: "logs/$(POD_NAME)"}
    command: ["sh", "-c", "echo $POD_NAME > /data/who; ls /data > /data/seen; echo DONE; exec sleep 3600"]
"#;

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[test]
fn sub_path_expr_gives_each_pod_its_own_directory_of_one_host_path() {
    require_rig!();
    let rig = Rig::up("e2e-subpathexpr");
    let agent = Kubelet::builder(&rig).start();
    let host = agent.dir().join("data");
    std::fs::create_dir_all(&host).unwrap();
    for name in ["writer-a", "writer-b"] {
        agent.write_manifest(
            &format!("{name}.yaml"),
            &SUBPATH_EXPR
                .replace("WRITER", name)
                .replace("HOSTDIR", &host.display().to_string()),
        );
    }
    let names: Vec<String> = ["writer-a", "writer-b"]
        .iter()
        .map(|prefix| {
            wait_for(&format!("{prefix} wrote"), Duration::from_secs(60), || {
                let p = agent.pod(&format!("{prefix}-"))?;
                output(&agent, prefix, "app")
                    .contains("DONE")
                    .then_some(())?;
                p["metadata"]["name"].as_str().map(str::to_string)
            })
        })
        .collect();
    for name in &names {
        let dir = host.join("logs").join(name);
        // Each pod wrote only into its own directory, and saw only its own files.
        assert_eq!(read(&dir.join("who")).trim(), name.as_str());
        assert_eq!(
            read(&dir.join("seen"))
                .split_whitespace()
                .collect::<Vec<_>>(),
            ["seen", "who"]
        );
    }
    let mut top: Vec<String> = std::fs::read_dir(host.join("logs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top, names);
    assert!(
        !host.join("who").exists(),
        "a pod wrote into the whole volume"
    );
}

const RRO: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: NAME
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: mnt
    emptyDir: {}
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    volumeMounts:
    - {name: mnt, mountPath: /mnt, readOnly: true, recursiveReadOnly: MODE}
    command: ["sh", "-c", "if touch /mnt/x 2>/dev/null; then echo WRITABLE; else echo READ-ONLY; fi; exec sleep 3600"]
"#;

#[test]
fn recursive_read_only_is_honoured_or_refused_as_the_runtime_reports() {
    require_rig!();
    let rig = Rig::up("e2e-rro");
    let features = rig.runtime_features().expect("CRI Status");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest(
        "rro-enabled.yaml",
        &RRO.replace("NAME", "rro-enabled")
            .replace("MODE", "Enabled"),
    );
    agent.write_manifest(
        "rro-if-possible.yaml",
        &RRO.replace("NAME", "rro-if-possible")
            .replace("MODE", "IfPossible"),
    );
    // IfPossible: read-only either way (recursively where the runtime can).
    wait_for("rro-if-possible ran", Duration::from_secs(60), || {
        output(&agent, "rro-if-possible", "app")
            .contains("READ-ONLY")
            .then_some(())
    });
    if features.recursive_read_only("") {
        // containerd 2.x: Enabled is honoured.
        wait_for("rro-enabled ran", Duration::from_secs(60), || {
            output(&agent, "rro-enabled", "app")
                .contains("READ-ONLY")
                .then_some(())
        });
        return;
    }
    eprintln!(
        "SKIPPED (an honoured recursiveReadOnly: Enabled): the runtime's Status reports no recursive read-only mounts for its default handler ({:?}); checking upstream's refusal instead",
        features.handlers
    );
    // containerd 1.6 lists no runtime handler features: Enabled cannot be honoured.
    let waiting = wait_for("rro-enabled refused", Duration::from_secs(60), || {
        let p = agent.pod("rro-enabled-")?;
        let w = container(&p, "app")["state"]["waiting"].clone();
        (w["reason"] == "CreateContainerConfigError").then_some(w)
    });
    assert_eq!(
        waiting["message"],
        "failed to resolve recursive read-only mode: volume \"mnt\" requested recursive read-only mode, but it is not supported by the runtime"
    );
}

const HUGE_PAGES: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: huge
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: hp
    emptyDir: {medium: HugePages}
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    resources:
      requests: {hugepages-2Mi: 2Mi, memory: 32Mi, cpu: 10m}
      limits: {hugepages-2Mi: 2Mi, memory: 32Mi, cpu: 10m}
    volumeMounts:
    - {name: hp, mountPath: /hp}
    command: ["sh", "-c", "grep ' /hp ' /proc/mounts; echo DONE; exec sleep 3600"]
"#;

#[test]
fn huge_page_empty_dir_is_a_hugetlbfs_mount_of_the_requested_size() {
    require_rig!();
    if !Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB").exists() {
        eprintln!("SKIPPED: the kernel has no 2 MiB huge pages");
        return;
    }
    let rig = Rig::up("e2e-hugepages");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("huge.yaml", HUGE_PAGES);
    let out = wait_for(
        "the container listed its mount",
        Duration::from_secs(60),
        || {
            let o = output(&agent, "huge", "app");
            o.contains("DONE").then_some(o)
        },
    );
    let line = out
        .lines()
        .find(|l| l.contains(" /hp "))
        .unwrap_or_else(|| panic!("no /hp mount:\n{out}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f[2], "hugetlbfs", "{line}");
    assert!(f[3].split(',').any(|o| o == "pagesize=2M"), "{line}");
}

/// Upstream's mount propagation e2e in one pod: a privileged container mounts a tmpfs inside
/// an emptyDir it holds with Bidirectional; its neighbour (HostToContainer) sees the mount,
/// and so does the host. It needs the kubelet's root dir on a shared mount, which the agent
/// makes at start as upstream does (this host's `/` is private).
const BIDIRECTIONAL: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: bidi
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: shared
    emptyDir: {}
  containers:
  - name: master
    image: docker.io/library/busybox:1.35
    securityContext: {privileged: true}
    volumeMounts:
    - {name: shared, mountPath: /shared, mountPropagation: Bidirectional}
    command: ["sh", "-c", "mkdir -p /shared/sub && mount -t tmpfs -o size=1m tmpfs /shared/sub && echo hi > /shared/sub/marker && echo MOUNTED; exec sleep 3600"]
  - name: slave
    image: docker.io/library/busybox:1.35
    volumeMounts:
    - {name: shared, mountPath: /shared, mountPropagation: HostToContainer}
    command: ["sh", "-c", "while true; do if [ -e /shared/sub/marker ]; then echo SEEN; else echo ABSENT; fi; sleep 1; done"]
"#;

#[test]
fn bidirectional_mounts_reach_the_host_and_a_host_to_container_neighbour() {
    require_rig!();
    let rig = Rig::up("e2e-bidirectional");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("bidi.yaml", BIDIRECTIONAL);
    wait_for(
        "the privileged container mounted",
        Duration::from_secs(60),
        || {
            output(&agent, "bidi", "master")
                .contains("MOUNTED")
                .then_some(())
        },
    );
    wait_for(
        "the HostToContainer neighbour sees it",
        Duration::from_secs(30),
        || {
            output(&agent, "bidi", "slave")
                .contains("SEEN")
                .then_some(())
        },
    );
    let p = agent.pod("bidi-").unwrap();
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let on_host = std::fs::read_dir(agent.dir())
        .unwrap()
        .flatten()
        .map(|e| {
            e.path().join(format!(
                "pods/{uid}/volumes/kubernetes.io~empty-dir/shared/sub/marker"
            ))
        })
        .find(|p| p.exists());
    assert!(
        on_host.is_some(),
        "the container's mount did not reach the host"
    );
}
