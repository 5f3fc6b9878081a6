//! `hostUsers: false` on containerd 1.6, which reports no user namespace support in its
//! Status: the pod gets upstream's refusal naming the runtime handler, and never runs in the
//! node's user namespace.

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
    command: ["sleep", "3600"]
"#;

#[test]
fn host_users_false_gets_upstreams_refusal_from_a_runtime_without_user_namespaces() {
    require_rig!();
    let rig = Rig::up("e2e-userns");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("userns.yaml", USERNS);
    let waiting = wait_for("userns refused", Duration::from_secs(60), || {
        let p = agent.pod("userns-")?;
        let w = container(&p, "app")["state"]["waiting"].clone();
        (w["reason"] == "CreateContainerConfigError").then_some(w)
    });
    assert_eq!(
        waiting["message"],
        "RuntimeClass handler \"\" does not support user namespaces"
    );
}
