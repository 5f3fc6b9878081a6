//! Pods as a real apiserver hands them over, on real containerd: ServiceAccount admission's
//! `kube-api-access-*` volume (token, kube-root-ca.crt, namespace), ConfigMap/Secret/downward
//! API volumes and env, a ConfigMap edit reaching a running container, and a missing ConfigMap
//! holding a pod in ContainerCreating with a FailedMount event until it appears. Everything is
//! checked from inside the containers (their logs) or from the apiserver's view.

use node_tests::controlplane::Options;
use node_tests::joined::NODE;
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, wait_for};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;

const BUSYBOX: &str = "docker.io/library/busybox:1.35";
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn log_value(log: &str, key: &str) -> Option<String> {
    log.lines()
        .rev()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
}

fn running(cp: &NetnsControlPlane, name: &str, kubelet: &mut Kubelet) -> Value {
    wait_for(
        &format!("pod {name} Running"),
        Duration::from_secs(60),
        || {
            if let Some(st) = kubelet.exited() {
                panic!("kubelet exited: {st}\n{}", kubelet.log_text());
            }
            cp.get("pods", "default", name)
                .filter(|p| p["status"]["phase"] == "Running")
        },
    )
}

#[test]
fn pods_with_service_account_config_map_secret_and_downward_api() {
    require_rig!();
    let (_rig, cp, node, mut kubelet) =
        node_tests::joined::up("e2e-cluster-pods", Options::default(), false);
    wait_for("node registered", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("nodes", "", NODE)
    });

    cp.create(
        "configmaps",
        json!({"metadata": {"name": "app", "namespace": "default"},
               "data": {"greeting": "hello", "MODE": "prod", "bad=name": "x"}}),
    )
    .unwrap();
    cp.create(
        "secrets",
        json!({"metadata": {"name": "db", "namespace": "default"},
               "data": {"password": "aHVudGVyMg=="}}),
    )
    .unwrap();
    let script = format!(
        r#"d={SA_DIR}
echo "files=$(ls $d | tr '\n' ' ')"
echo "ns=$(cat $d/namespace)"
echo "ca=$(head -1 $d/ca.crt)"
echo "tokenmode=$(stat -L -c %a $d/token)"
echo "samount=$(grep " $d " /proc/mounts | cut -d' ' -f3)"
echo "secretmode=$(stat -L -c %a /etc/db/pw)"
echo "env=$GREETING|$MODE|$PASSWORD|${{OPT-unset}}|$POD_NAME|$POD_IP|$MEM_MI"
echo "confgroup=$(stat -L -c %g /etc/conf/greeting)"
while true; do
  echo "conf=$(cat /etc/conf/greeting)"
  echo "labels=$(cat /etc/podinfo/labels | tr '\n' ' ')"
  sleep 1
done"#
    );
    cp.create(
        "pods",
        json!({"metadata": {"name": "api", "namespace": "default", "labels": {"app": "api"}},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                "securityContext": {"fsGroup": 2000},
                "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c", script],
                    "resources": {"limits": {"memory": "64Mi"}},
                    "envFrom": [{"configMapRef": {"name": "app"}}],
                    "env": [
                        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "greeting"}}},
                        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                        {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "nope", "optional": true}}},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}}],
                    "volumeMounts": [
                        {"name": "conf", "mountPath": "/etc/conf"},
                        {"name": "db", "mountPath": "/etc/db"},
                        {"name": "podinfo", "mountPath": "/etc/podinfo"}]}],
                "volumes": [
                    {"name": "conf", "configMap": {"name": "app"}},
                    {"name": "db", "secret": {"secretName": "db", "items": [{"key": "password", "path": "pw", "mode": 0o400}]}},
                    {"name": "podinfo", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}}),
    )
    .unwrap();
    let pod = running(&cp, "api", &mut kubelet);
    let volume = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| {
            v["name"]
                .as_str()
                .filter(|n| n.starts_with("kube-api-access-"))
        })
        .expect("admission added the kube-api-access volume")
        .to_string();
    let log = wait_for("the container's report", Duration::from_secs(30), || {
        let l = node.container_log(&pod, "main");
        l.contains("conf=").then_some(l)
    });
    let v = |k: &str| log_value(&log, k).unwrap_or_else(|| panic!("no {k}= in:\n{log}"));
    assert_eq!(v("files"), "ca.crt namespace token ");
    assert_eq!(v("ns"), "default");
    assert_eq!(v("ca"), "-----BEGIN CERTIFICATE-----");
    // fsGroup: the token is 0600 plus group read, as upstream leaves it.
    assert_eq!(v("tokenmode"), "640");
    assert_eq!(v("samount"), "tmpfs");
    assert_eq!(
        v("secretmode"),
        "440",
        "the item's 0400 plus group read for fsGroup"
    );
    let pod_ip = pod["status"]["podIP"].as_str().unwrap_or("");
    assert!(!pod_ip.is_empty(), "{pod:#}");
    assert_eq!(
        v("env"),
        format!("hello|prod|hunter2|unset|api|{pod_ip}|64")
    );
    assert_eq!(v("labels"), "app=\"api\" ");
    assert_eq!(v("conf"), "hello");
    assert_eq!(v("confgroup"), "2000", "fsGroup owns the volume's files");

    // The token is the apiserver's, bound to this pod.
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    let token_file: PathBuf = node
        .p("var/lib/kubelet/pods")
        .join(uid)
        .join("volumes/kubernetes.io~projected")
        .join(&volume)
        .join("token");
    let token = std::fs::read_to_string(&token_file).unwrap();
    let claims = cp
        .verify_service_account_token(&token)
        .expect("a valid token");
    assert_eq!(claims["kubernetes.io"]["pod"]["name"], "api");
    assert_eq!(claims["kubernetes.io"]["pod"]["uid"], uid);
    assert_eq!(claims["sub"], "system:serviceaccount:default:default");
    assert_eq!(cp.token_requests().len(), 1, "one TokenRequest per pod");

    // The invalid envFrom key was reported as upstream does.
    let events = cp.list("events", Some("default"));
    assert!(
        events.iter().any(|e| e["reason"] == "InvalidEnvironmentVariableNames"
            && e["message"]
                == "Keys [bad=name] from the EnvFrom configMap default/app were skipped since they are considered invalid environment variable names."),
        "{events:#?}"
    );

    // A ConfigMap edit reaches the running container without a restart.
    let mut cm = cp.get("configmaps", "default", "app").unwrap();
    cm["data"]["greeting"] = json!("bonjour");
    cp.update("configmaps", cm).unwrap();
    wait_for(
        "the edited ConfigMap in the container",
        Duration::from_secs(30),
        || {
            (log_value(&node.container_log(&pod, "main"), "conf").as_deref() == Some("bonjour"))
                .then_some(())
        },
    );
    // New labels reach the downward API file without a restart.
    let mut p = cp.get("pods", "default", "api").unwrap();
    p["metadata"]["labels"]["tier"] = json!("front");
    cp.update("pods", p).unwrap();
    wait_for(
        "the new label in the container",
        Duration::from_secs(30),
        || {
            (log_value(&node.container_log(&pod, "main"), "labels").as_deref()
                == Some("app=\"api\" tier=\"front\" "))
            .then_some(())
        },
    );
    let now = cp.get("pods", "default", "api").unwrap();
    assert_eq!(now["status"]["containerStatuses"][0]["restartCount"], 0);

    // A pod whose ConfigMap does not exist yet waits in ContainerCreating with FailedMount.
    cp.create(
        "pods",
        json!({"metadata": {"name": "late", "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c", "echo \"k=$(cat /etc/late/k)\"; sleep 3600"],
                    "volumeMounts": [{"name": "late", "mountPath": "/etc/late"}]}],
                "volumes": [{"name": "late", "configMap": {"name": "late"}}]}}),
    )
    .unwrap();
    let ev = wait_for("FailedMount", Duration::from_secs(30), || {
        cp.list("events", Some("default"))
            .into_iter()
            .find(|e| e["reason"] == "FailedMount" && e["involvedObject"]["name"] == "late")
    });
    assert_eq!(
        ev["message"],
        "MountVolume.SetUp failed for volume \"late\" : configmap \"late\" not found"
    );
    assert_eq!(ev["type"], "Warning");
    let waiting = wait_for("ContainerCreating", Duration::from_secs(30), || {
        cp.get("pods", "default", "late").filter(|p| {
            p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
        })
    });
    assert_eq!(waiting["status"]["phase"], "Pending");
    cp.create(
        "configmaps",
        json!({"metadata": {"name": "late", "namespace": "default"}, "data": {"k": "arrived"}}),
    )
    .unwrap();
    let late = running(&cp, "late", &mut kubelet);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !node.container_log(&late, "main").contains("arrived") {
        assert!(
            std::time::Instant::now() < deadline,
            "the late ConfigMap never reached the container: log {:?}, pod {:#}",
            node.container_log(&late, "main"),
            cp.get("pods", "default", "late").unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Deleting the pods unmounts their tmpfs volumes and removes their directories.
    for name in ["api", "late"] {
        let _ = cp.delete("pods", "default", name, None);
    }
    let pods_dir = node.p("var/lib/kubelet/pods");
    wait_for("pod directories removed", Duration::from_secs(60), || {
        let left = std::fs::read_dir(&pods_dir).map(|d| d.count()).unwrap_or(0);
        (left == 0).then_some(())
    });
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*pods_dir.to_string_lossy()),
        "tmpfs mounts left behind"
    );
    kubelet.stop();
}
