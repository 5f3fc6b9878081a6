//! kube-proxy starved of file descriptors from a pod (issue 37.2): the real `kube-proxy`
//! binary in iptables mode, in a network namespace this test creates and deletes, started
//! with RLIMIT_NOFILE 1024 for both limits (`prlimit`: systemd's default soft limit, and no
//! room to raise it, so only the servers' connection caps can help). 2,000 idle connections
//! to :10256 from 40 loopback addresses (50 each, as pods on one node would come), then a new
//! Service in `--static-services-dir`: its rules must be in the kernel within 10 s. Before the
//! caps, the accepted connections took every descriptor and each sync failed to start
//! `iptables-restore` ("Too many open files").
//!
//! Prints how many connections the proxy kept open and how long the Service took.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CONNECTIONS: usize = 2000;
const SOURCES: u8 = 40;
const BOUND: Duration = Duration::from_secs(10);

fn service(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  \
         type: ClusterIP\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n  ipFamilies: [IPv4]\n  \
         ports: [{{name: http, port: 80, protocol: TCP}}]\n"
    )
}

fn skip_reason() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root: cannot create network namespaces".into());
    }
    for bin in ["ip", "iptables-nft-save", "prlimit", "ss"] {
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

/// The namespace and the proxy in it; both gone on drop.
struct Node {
    ns: String,
    proxy: Option<Child>,
    log: std::path::PathBuf,
}

impl Node {
    fn start(ns: &str, dir: &Path, log: std::path::PathBuf) -> Node {
        let ok = |args: &[&str]| {
            let st = Command::new(args[0]).args(&args[1..]).status().unwrap();
            assert!(st.success(), "{args:?}");
        };
        ok(&["ip", "netns", "add", ns]);
        let mut node = Node {
            ns: ns.to_string(),
            proxy: None,
            log,
        };
        ok(&["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]);
        let file = std::fs::File::create(&node.log).unwrap();
        node.proxy = Some(
            Command::new("ip")
                .args(["netns", "exec", ns, "prlimit", "--nofile=1024:1024", "--"])
                .arg(node_tests::bin("kube-proxy"))
                .arg("--proxy-mode=iptables")
                .arg(format!("--static-services-dir={}", dir.display()))
                .arg("--hostname-override=fd-node")
                .arg("--healthz-bind-address=0.0.0.0:10256")
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

    fn programmed(&self, comment: &str) -> bool {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, "iptables-nft-save"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).contains(comment)
    }

    /// Connections the proxy holds open (its TCP sockets in the namespace to :10256).
    fn established(&self) -> usize {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns,
                "ss",
                "-Htn",
                "state",
                "established",
                "( sport = :10256 )",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut c) = self.proxy.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.ns])
            .status();
    }
}

/// Opens `n` connections to `to` from `from` inside namespace `ns` (this thread enters it;
/// the caller runs this on a thread of its own). Refused ones are kept too: each is a
/// descriptor on our side only.
fn flood(ns: &str, to: SocketAddr) -> Vec<std::net::TcpStream> {
    let f = std::fs::File::open(format!("/var/run/netns/{ns}")).expect("netns file");
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
    let mut held = Vec::with_capacity(CONNECTIONS);
    let per_source = CONNECTIONS / SOURCES as usize;
    for s in 0..SOURCES {
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 1, s + 1));
        for _ in 0..per_source {
            let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                .expect("socket");
            sock.bind(&SocketAddr::new(from, 0).into()).expect("bind");
            if sock
                .connect_timeout(&to.into(), Duration::from_secs(2))
                .is_ok()
            {
                held.push(TcpStream::from(sock));
            }
        }
    }
    held
}

#[test]
fn idle_connections_to_healthz_do_not_stop_a_new_service_from_being_programmed() {
    if let Some(reason) = skip_reason() {
        println!(
            "SKIP idle_connections_to_healthz_do_not_stop_a_new_service_from_being_programmed: {reason}"
        );
        return;
    }
    // Our side holds 2,000 sockets too.
    let _ = Command::new("prlimit")
        .args(["--pid", &std::process::id().to_string(), "--nofile=8192:"])
        .status();
    let dir = tempfile::tempdir().unwrap();
    let services = dir.path().join("services");
    std::fs::create_dir(&services).unwrap();
    std::fs::write(services.join("first.yaml"), service("first", "10.96.0.10")).unwrap();
    let ns = format!("kpfd-{}", std::process::id());
    let node = Node::start(&ns, &services, dir.path().join("kube-proxy.log"));
    let started = Instant::now();
    while !node.programmed("default/first:http") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the first Service was never programmed\n---- kube-proxy log ----\n{}",
            node.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let healthz: SocketAddr = "127.0.0.1:10256".parse().unwrap();
    let ns2 = ns.clone();
    let held = std::thread::spawn(move || flood(&ns2, healthz))
        .join()
        .expect("flood thread");
    std::thread::sleep(Duration::from_millis(500));
    let kept = node.established();
    std::fs::write(
        services.join("second.yaml"),
        service("second", "10.96.0.11"),
    )
    .unwrap();
    let added = Instant::now();
    let mut programmed = false;
    while added.elapsed() < BOUND {
        if node.programmed("default/second:http") {
            programmed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let took = added.elapsed();
    let log = node.log_text();
    println!(
        "{CONNECTIONS} connections to :10256 from {SOURCES} addresses: {} connected, {kept} held \
         open by kube-proxy; new Service programmed: {programmed} after {took:?}",
        held.len()
    );
    assert!(
        programmed,
        "a new Service was not programmed within {BOUND:?} while {} connections were open\n---- kube-proxy log (tail) ----\n{}",
        held.len(),
        log.lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        !log.contains("Too many open files"),
        "kube-proxy ran out of descriptors\n{log}"
    );
    drop(held);
}
