//! A fresh node's first sync: the real `kube-proxy` binary, default dual-stack iptables mode,
//! started 20 times, each time in a new network namespace this test creates and deletes, with
//! one IPv4 and one IPv6 Service from `--static-services-dir`. Both families' rules must be
//! in the kernel within 2 s every time (the IPv4 and IPv6 restores used to race, leaving one
//! family unprogrammed until the next periodic sync, 30 s later). Every other run, another
//! process commits nf_tables rules into the namespace meanwhile, as a CNI plugin might.
//!
//! Prints start-to-programmed times (p50/max); asserts only the bounded wait.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RUNS: usize = 20;
const BOUND: Duration = Duration::from_secs(2);

const SERVICES: &str = "\
apiVersion: v1
kind: Service
metadata: {name: web4, namespace: default}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ipFamilies: [IPv4]
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: web6, namespace: default}
spec:
  type: ClusterIP
  clusterIP: fd00:96::10
  clusterIPs: [\"fd00:96::10\"]
  ipFamilies: [IPv6]
  ports: [{name: http, port: 80, protocol: TCP}]
";

fn skip_reason() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root: cannot create network namespaces".into());
    }
    for bin in [
        "ip",
        "iptables-nft-save",
        "ip6tables-nft-save",
        "iptables-nft",
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {bin}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!("{bin} not installed"));
        }
    }
    None
}

/// The namespace, the proxy and the other committer; all gone on drop.
struct Node {
    ns: String,
    proxy: Option<Child>,
    other: Option<Child>,
    log: std::path::PathBuf,
}

impl Node {
    fn start(ns: &str, dir: &Path, log: std::path::PathBuf, other_committer: bool) -> Node {
        let ok = |args: &[&str]| {
            let st = Command::new(args[0]).args(&args[1..]).status().unwrap();
            assert!(st.success(), "{args:?}");
        };
        ok(&["ip", "netns", "add", ns]);
        let mut node = Node {
            ns: ns.to_string(),
            proxy: None,
            other: None,
            log,
        };
        ok(&["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]);
        if other_committer {
            // 40 commits, bounded: chain creations in the nat table, no lock taken.
            let script = format!(
                "for i in $(seq 1 40); do ip netns exec {ns} iptables-nft -t nat -N OTHER-$i; done"
            );
            node.other = Some(
                Command::new("sh")
                    .args(["-c", &script])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
        let file = std::fs::File::create(&node.log).unwrap();
        node.proxy = Some(
            Command::new("ip")
                .args(["netns", "exec", ns])
                .arg(node_tests::bin("kube-proxy"))
                .arg("--proxy-mode=iptables")
                .arg(format!("--static-services-dir={}", dir.display()))
                .arg("--hostname-override=fresh-node")
                .arg("--healthz-bind-address=127.0.0.1:10256")
                .arg("--metrics-bind-address=127.0.0.1:10249")
                .env("RUST_LOG", "info")
                .env("NO_COLOR", "1")
                .stdout(Stdio::null())
                .stderr(file)
                .spawn()
                .expect("start kube-proxy"),
        );
        node
    }

    fn save(&self, bin: &str) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, bin])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Both Services' rules are in the kernel (their comment on the reject rule, since
    /// neither has endpoints).
    fn programmed(&self) -> (bool, bool) {
        (
            self.save("iptables-nft-save").contains("default/web4:http"),
            self.save("ip6tables-nft-save")
                .contains("default/web6:http"),
        )
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for c in [self.proxy.take(), self.other.take()].into_iter().flatten() {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.ns])
            .status();
    }
}

#[test]
fn both_families_programmed_on_a_fresh_node() {
    if let Some(reason) = skip_reason() {
        println!("SKIP both_families_programmed_on_a_fresh_node: {reason}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("services.yaml"), SERVICES).unwrap();
    let mut times = Vec::new();
    let mut lost_races = 0;
    for run in 0..RUNS {
        let ns = format!("kpfresh-{}-{run}", std::process::id());
        let log = dir.path().join(format!("kube-proxy-{run}.log"));
        let started = Instant::now();
        let node = Node::start(&ns, dir.path(), log, run % 2 == 1);
        let mut seen = (false, false);
        while started.elapsed() < BOUND {
            seen = node.programmed();
            if seen == (true, true) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let took = started.elapsed();
        let log = node.log_text();
        assert_eq!(
            seen,
            (true, true),
            "run {run}: (IPv4, IPv6) Services programmed within {BOUND:?}?\n---- kube-proxy log ----\n{log}"
        );
        // Our own two families never race now; another process's commits may still make a
        // restore lose (retried at once, then with back-off), so only quiet runs assert this.
        if run % 2 == 0 {
            assert!(
                !log.contains("sync failed") && !log.contains("lost a commit race"),
                "run {run}: a restore failed with no other committer\n{log}"
            );
        }
        lost_races += log.matches("lost a commit race").count();
        times.push(took);
    }
    times.sort();
    println!(
        "fresh node, start -> both families programmed over {RUNS} runs: p50 {:?}, max {:?}; \
         restores that lost a commit race to the other process and were retried: {lost_races}",
        times[RUNS / 2],
        times[RUNS - 1]
    );
}
