//! A node as `kubeadm join` leaves it (bootstrap kubeconfig, CA, KubeletConfiguration from the
//! kubelet-config ConfigMap, kubeadm-flags.env, /etc/default/kubelet), under a temporary root,
//! and the command line systemd builds from it.

use crate::controlplane::{NetnsControlPlane, Options};
use crate::kubelet::{Kubelet, TEST_EVICTION_HARD};
use crate::rig::Rig;
use crate::util::{kubeadm_command_line, parse_env_file, unmount_below, wait_for};
use std::collections::BTreeMap;
use std::time::Duration;

/// The node's name.
pub const NODE: &str = "rig-node";
/// The node's address (kubeadm passes the advertise address as --node-ip).
pub const NODE_IP: &str = "10.250.0.5";

/// What kubeadm leaves on a joining node, under `root` instead of `/`.
pub struct JoinedNode {
    pub root: tempfile::TempDir,
}

impl JoinedNode {
    pub fn p(&self, rel: &str) -> std::path::PathBuf {
        self.root.path().join(rel)
    }

    pub fn write(cp: &NetnsControlPlane, rig: &Rig) -> JoinedNode {
        Self::write_with(cp, rig, false)
    }

    /// As [`JoinedNode::write`], but :10250 is open to anonymous requests (AlwaysAllow), for
    /// tests that scrape it.
    pub fn write_open(cp: &NetnsControlPlane, rig: &Rig) -> JoinedNode {
        Self::write_with(cp, rig, true)
    }

    fn write_with(cp: &NetnsControlPlane, rig: &Rig, open_10250: bool) -> JoinedNode {
        let n = JoinedNode {
            root: tempfile::tempdir().unwrap(),
        };
        for d in [
            "etc/kubernetes/pki",
            "etc/kubernetes/manifests",
            "etc/default",
            "var/lib/kubelet/pki",
            "var/lib/kube-proxy",
            "var/log/pods",
        ] {
            std::fs::create_dir_all(n.p(d)).unwrap();
        }
        cp.bootstrap_kubeconfig(n.p("etc/kubernetes/bootstrap-kubelet.conf"))
            .unwrap();
        cp.write_ca(n.p("etc/kubernetes/pki/ca.crt")).unwrap();
        // kubeadm's KubeletConfiguration (from the kubelet-config ConfigMap), plus the rig's
        // log dir and cgroup root so that the test stays inside its sandbox.
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
{auth}cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: ""
cpuManagerReconcilePeriod: 0s
evictionPressureTransitionPeriod: 0s
{eviction}fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {{}}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: {manifests}
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
podLogsDir: {logs}
cgroupRoot: {cgroot}
"#,
            auth = if open_10250 {
                "authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\nauthorization:\n  mode: AlwaysAllow\n".to_string()
            } else {
                format!(
                    "authentication:\n  anonymous:\n    enabled: false\n  webhook:\n    cacheTTL: 0s\n    enabled: true\n  x509:\n    clientCAFile: {}\nauthorization:\n  mode: Webhook\n  webhook:\n    cacheAuthorizedTTL: 0s\n    cacheUnauthorizedTTL: 0s\n",
                    n.p("etc/kubernetes/pki/ca.crt").display()
                )
            },
            eviction = TEST_EVICTION_HARD,
            manifests = n.p("etc/kubernetes/manifests").display(),
            logs = n.p("var/log/pods").display(),
            cgroot = rig.get("RIG_CGROUP_ROOT"),
        );
        std::fs::write(n.p("var/lib/kubelet/config.yaml"), config).unwrap();
        std::fs::write(
            n.p("var/lib/kubelet/kubeadm-flags.env"),
            format!(
                "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint={} --node-ip={NODE_IP} --hostname-override={NODE} --node-labels=node.example.com/pool=e2e --register-with-taints=example.com/dedicated=e2e:PreferNoSchedule --pod-infra-container-image=registry.k8s.io/pause:3.10\"\n",
                rig.get("CRI_ENDPOINT")
            ),
        )
        .unwrap();
        // The kube-proxy role hosted in the agent (our --proxy-config) with kube-proxy's
        // credentials on a kubeadm cluster (the kube-system/kube-proxy ServiceAccount).
        cp.kube_proxy_kubeconfig(n.p("var/lib/kube-proxy/kubeconfig.conf"))
            .unwrap();
        std::fs::write(
            n.p("var/lib/kube-proxy/config.conf"),
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\nclusterCIDR: 10.88.0.0/16\nhealthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\nclientConnection:\n  kubeconfig: {}\n",
                n.p("var/lib/kube-proxy/kubeconfig.conf").display()
            ),
        )
        .unwrap();
        std::fs::write(
            n.p("etc/default/kubelet"),
            format!(
                "KUBELET_EXTRA_ARGS=\"--root-dir={} --cgroup-driver=cgroupfs --proxy-config={}\"\n",
                n.p("var/lib/kubelet").display(),
                n.p("var/lib/kube-proxy/config.conf").display()
            ),
        )
        .unwrap();
        n
    }

    /// The command line systemd builds from 10-kubeadm.conf and the environment files.
    pub fn command_line(&self) -> Vec<String> {
        let mut env = BTreeMap::new();
        env.insert(
            "KUBELET_KUBECONFIG_ARGS".to_string(),
            format!(
                "--bootstrap-kubeconfig={} --kubeconfig={}",
                self.p("etc/kubernetes/bootstrap-kubelet.conf").display(),
                self.p("etc/kubernetes/kubelet.conf").display()
            ),
        );
        env.insert(
            "KUBELET_CONFIG_ARGS".to_string(),
            format!(
                "--config={}",
                self.p("var/lib/kubelet/config.yaml").display()
            ),
        );
        for f in ["var/lib/kubelet/kubeadm-flags.env", "etc/default/kubelet"] {
            env.extend(parse_env_file(
                &std::fs::read_to_string(self.p(f)).unwrap_or_default(),
            ));
        }
        kubeadm_command_line(&env)
    }
}

impl JoinedNode {
    /// What a container of a `default`-namespace pod wrote to stdout so far (first run; the
    /// CRI log's text column).
    pub fn container_log(&self, pod: &serde_json::Value, container: &str) -> String {
        let dir = self.p("var/log/pods").join(format!(
            "{}_{}_{}",
            pod["metadata"]["namespace"].as_str().unwrap_or("default"),
            pod["metadata"]["name"].as_str().unwrap_or(""),
            pod["metadata"]["uid"].as_str().unwrap_or("")
        ));
        let text = std::fs::read_to_string(dir.join(container).join("0.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3))
            .map(|l| format!("{l}\n"))
            .collect()
    }
}

impl Drop for JoinedNode {
    /// tmpfs volumes of pods still running when a test ends live under the root.
    fn drop(&mut self) {
        unmount_below(self.root.path());
    }
}

/// A rig named `rig_name` with the node's address, the control plane in its netns, the joined
/// node's files (:10250 open when `open_10250`) and the agent started from them, healthy.
pub fn up(
    rig_name: &str,
    opts: Options,
    open_10250: bool,
) -> (Rig, NetnsControlPlane, JoinedNode, Kubelet) {
    up_with_env(rig_name, opts, open_10250, &[])
}

/// [`up`] with extra environment for the agent (test hooks), kept across its restarts.
pub fn up_with_env(
    rig_name: &str,
    opts: Options,
    open_10250: bool,
    env: &[(&str, &str)],
) -> (Rig, NetnsControlPlane, JoinedNode, Kubelet) {
    up_configured(rig_name, opts, open_10250, env, "")
}

/// [`up_with_env`] with `extra_config` (top-level KubeletConfiguration YAML lines) appended to
/// the node's config.yaml before the agent starts.
pub fn up_configured(
    rig_name: &str,
    opts: Options,
    open_10250: bool,
    env: &[(&str, &str)],
    extra_config: &str,
) -> (Rig, NetnsControlPlane, JoinedNode, Kubelet) {
    let rig = Rig::up(rig_name);
    let out = rig.sh(&format!("ip addr add {NODE_IP}/32 dev lo"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cp = NetnsControlPlane::start(&rig, opts);
    let node = JoinedNode::write_with(&cp, &rig, open_10250);
    if !extra_config.is_empty() {
        let path = node.p("var/lib/kubelet/config.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        // A top-level key of the extra config replaces kubeadm's block of that key.
        let keys: Vec<&str> = extra_config
            .lines()
            .filter(|l| !l.starts_with([' ', '-']))
            .filter_map(|l| l.split_once(':').map(|(k, _)| k))
            .collect();
        let mut kept = String::new();
        let mut skipping = false;
        for line in text.lines() {
            if !line.starts_with([' ', '-']) {
                skipping = line.split_once(':').is_some_and(|(k, _)| keys.contains(&k));
            }
            if !skipping {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        let mut text = kept;
        text.push_str(extra_config);
        std::fs::write(&path, text).unwrap();
    }
    let mut kubelet = Kubelet::builder(&rig)
        .args(node.command_line())
        .log(node.p("kubelet.log"))
        .env(env)
        .start();
    wait_for("healthz 200", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        let (body, code) = kubelet.curl_code("http://127.0.0.1:10248/healthz");
        (code == "200" && body == "ok").then_some(())
    });
    (rig, cp, node, kubelet)
}
