//! `hostUsers: false`. The test asks the runtime first (CRI Status): where its default
//! handler reports user namespaces, the pod runs in a range of its own (a uid map that is not
//! the node's), its root writes to its emptyDir, and it keeps the range across an agent
//! restart; where it does not (containerd 1.6 never does), the pod gets upstream's refusal
//! before any sandbox exists, and the running part is skipped with that reason printed.

use node_tests::require_rig;
use node_tests::{Kubelet, Rig, container, wait_for};
use std::time::Duration;

const USERNS: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: userns
spec:
  terminationGracePeriodSeconds: 1
  hostUsers: false
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "echo map $(cat /proc/self/uid_map); echo hi > /data/f && echo wrote $(cat /data/f); sleep 3600"]
    volumeMounts:
    - {name: data, mountPath: /data}
  volumes:
  - {name: data, emptyDir: {}}
"#;

#[test]
fn host_users_false_runs_in_its_own_range_or_is_refused_before_the_sandbox() {
    require_rig!();
    let rig = Rig::up("e2e-userns");
    let features = rig.runtime_features().expect("CRI Status");
    let mut agent = Kubelet::builder(&rig).start();
    agent.write_manifest("userns.yaml", USERNS);
    if !features.user_namespaces("") {
        eprintln!(
            "SKIPPED (running a user-namespaced pod): the runtime's Status reports no user namespace support for its default handler ({:?}); checking upstream's refusal instead",
            features.handlers
        );
        let waiting = wait_for("userns refused", Duration::from_secs(60), || {
            let p = agent.pod("userns-")?;
            let w = container(&p, "app")["state"]["waiting"].clone();
            w["message"].as_str()?.contains("hostUsers").then_some(w)
        });
        assert_eq!(waiting["reason"], "ContainerCreating");
        assert_eq!(
            waiting["message"],
            "Failed to create pod sandbox: can't set `spec.hostUsers: false`, runtime does not support user namespaces"
        );
        let out = rig.sh(&format!(
            "ctr --address {} -n k8s.io containers ls -q | wc -l",
            rig.get("CONTAINERD_SOCK")
        ));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "0",
            "no sandbox was created for the refused pod"
        );
        return;
    }
    let log = |agent: &Kubelet| {
        wait_for("the pod's log", Duration::from_secs(60), || {
            let dir = agent.log_links_dir();
            let f = std::fs::read_dir(dir)
                .ok()?
                .flatten()
                .find(|e| e.file_name().to_string_lossy().starts_with("userns-"))?;
            let text = std::fs::read_to_string(f.path()).ok()?;
            text.contains("wrote").then_some(text)
        })
    };
    let text = log(&agent);
    let map_line = text
        .lines()
        .find_map(|l| l.split_once("map ").map(|(_, m)| m.to_string()))
        .expect("uid map");
    let fields: Vec<&str> = map_line.split_whitespace().collect();
    assert_eq!(fields[0], "0", "{map_line}");
    assert_ne!(
        fields[1], "0",
        "the pod's root is not the node's: {map_line}"
    );
    assert_eq!(fields[2], "65536", "{map_line}");
    assert!(
        text.contains("wrote hi"),
        "the pod's root writes its emptyDir: {text}"
    );
    let record = std::fs::read_dir(agent.dir().join("root").join("pods"))
        .unwrap()
        .flatten()
        .map(|d| d.path().join("userns"))
        .find(|p| p.exists())
        .expect("the pod's record");
    let before = std::fs::read_to_string(&record).unwrap();
    agent.restart();
    let p = wait_for("running after restart", Duration::from_secs(60), || {
        let p = agent.pod("userns-")?;
        container(&p, "app")["state"]["running"]
            .is_object()
            .then_some(p)
    });
    assert_eq!(container(&p, "app")["restartCount"], 0);
    assert_eq!(
        std::fs::read_to_string(&record).unwrap(),
        before,
        "the range is kept"
    );
}
