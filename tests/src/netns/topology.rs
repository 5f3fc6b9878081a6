//! The network-namespace topology of the proxy's traffic tests (`proxy/tests/netns_traffic.rs`,
//! `proxy/tests/netns_ipvs.rs`, `tests/tests/proxy_apiserver.rs`).
//!
//! Topology: `client` —veth— `node` —veth— `pod0` … `podN`, all namespaces named after a
//! prefix the test picks and deleted on drop; every link has an IPv4 address and, where the
//! kernel has IPv6, an IPv6 one (`Topology::ipv6`); the root namespace's rules, routes and links are
//! never touched. Backends and the client are the test binary re-executed inside their
//! namespace: each test file has a `#[test] fn helper()` that calls [`helper_main`] with the
//! environment variable it passed to [`Topology::build`].

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use super::{have, sh};

pub const NODE_IP: &str = "10.100.0.1";
pub const CLIENT_IP: &str = "10.100.0.2";
pub const NODE_IP6: &str = "fd00:100::1";
pub const CLIENT_IP6: &str = "fd00:100::2";

/// Pod `i`'s addresses: `10.244.<i>.2` and `fd00:244:<i>::2`.
pub fn pod_ip(i: usize) -> String {
    format!("10.244.{i}.2")
}

pub fn pod_ip6(i: usize) -> String {
    format!("fd00:244:{i}::2")
}
/// Every backend answers its name on this TCP port and on [`UDP_PORT`].
pub const TCP_PORT: u16 = 8080;
pub const UDP_PORT: u16 = 8081;

// ---------------------------------------------------------------------------------------
// Helper processes (run inside a namespace).

/// The body of a test file's `helper` test: does nothing unless `var` is set.
pub fn helper_main(var: &str) {
    let Ok(spec) = std::env::var(var) else {
        return;
    };
    let args: Vec<&str> = spec.split_whitespace().collect();
    match args.as_slice() {
        ["server", name] => run_server(name),
        ["client", proto, addr, count, sport] => {
            run_client(proto, addr, count.parse().unwrap(), sport.parse().unwrap())
        }
        _ => panic!("bad {var} {spec:?}"),
    }
}

/// Answers its name on TCP and UDP (one dual-stack socket each where the kernel has IPv6);
/// exits by itself after 180 s at the latest.
fn run_server(name: &str) {
    let tcp = TcpListener::bind(("::", TCP_PORT))
        .or_else(|_| TcpListener::bind(("0.0.0.0", TCP_PORT)))
        .unwrap();
    let udp = UdpSocket::bind(("::", UDP_PORT))
        .or_else(|_| UdpSocket::bind(("0.0.0.0", UDP_PORT)))
        .unwrap();
    let reply = format!("{name}\n");
    let r2 = reply.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((_, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(r2.as_bytes(), from);
        }
    });
    std::thread::spawn(move || {
        for mut s in tcp.incoming().flatten() {
            let _ = s.write_all(reply.as_bytes());
        }
    });
    println!("\nREADY");
    std::thread::sleep(Duration::from_secs(180));
}

/// Makes `count` requests and prints one `R <answer>` line each (`R ERR <kind>` on failure).
fn run_client(proto: &str, addr: &str, count: usize, sport: u16) {
    // libtest may have written "test helper ... " without a newline.
    println!();
    for _ in 0..count {
        let answer = match proto {
            "tcp" => tcp_once(addr),
            _ => udp_once(addr, sport),
        };
        println!("R {answer}");
    }
}

fn tcp_once(addr: &str) -> String {
    let sa: std::net::SocketAddr = addr.parse().unwrap();
    // An IPv6 connect ignores the ICMPv6 error answering its first SYN (seen on 6.x kernels)
    // and fails on the one answering the retransmission, 1 s later: wait past that.
    let timeout = Duration::from_secs(if sa.is_ipv6() { 3 } else { 1 });
    match TcpStream::connect_timeout(&sa, timeout) {
        Ok(mut s) => {
            let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
            let mut out = String::new();
            match s.read_to_string(&mut out) {
                Ok(_) if !out.trim().is_empty() => out.trim().to_string(),
                _ => "ERR empty".into(),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => "ERR refused".into(),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => "ERR timeout".into(),
        Err(e) => format!("ERR {:?}", e.kind()),
    }
}

fn udp_once(addr: &str, sport: u16) -> String {
    let any = if addr.starts_with('[') {
        "::"
    } else {
        "0.0.0.0"
    };
    let s = UdpSocket::bind((any, sport)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    s.send_to(b"hi", addr).unwrap();
    let mut buf = [0u8; 512];
    match s.recv_from(&mut buf) {
        Ok((n, _)) => String::from_utf8_lossy(&buf[..n]).trim().to_string(),
        Err(_) => "ERR timeout".into(),
    }
}

/// The answers in a client helper's output.
pub fn answers(stdout: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("R "))
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Commands.

/// `KUBE-` lines in the root namespace's iptables and ip6tables, both backends (read only).
pub fn root_kube_rules() -> usize {
    [
        "iptables-save",
        "iptables-legacy-save",
        "ip6tables-save",
        "ip6tables-legacy-save",
    ]
    .iter()
    .filter(|b| have(b))
    .filter_map(|b| Command::new(b).output().ok())
    .map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.contains("KUBE-"))
            .count()
    })
    .sum()
}

// ---------------------------------------------------------------------------------------
// Topology.

/// Owns the namespaces and helper processes; tears everything down on drop.
pub struct Topology {
    pub node: String,
    pub client: String,
    pub pods: Vec<String>,
    /// The IPv6 addresses and routes are in place.
    pub ipv6: bool,
    children: Vec<Child>,
    helper_var: &'static str,
}

impl Drop for Topology {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.pods.iter().chain([&self.client, &self.node]) {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

impl Topology {
    /// Creates `<prefix>-node`, `<prefix>-client` and `<prefix>-pod<i>`; helpers run with
    /// `helper_var` set.
    pub fn build(prefix: &str, pods: usize, helper_var: &'static str) -> Result<Topology, String> {
        let mut t = Topology {
            node: format!("{prefix}-node"),
            client: format!("{prefix}-client"),
            pods: Vec::new(),
            ipv6: false,
            children: Vec::new(),
            helper_var,
        };
        sh(&["ip", "netns", "add", &t.node])?;
        sh(&["ip", "netns", "add", &t.client])?;
        for i in 0..pods {
            let p = format!("{prefix}-pod{i}");
            sh(&["ip", "netns", "add", &p])?;
            t.pods.push(p);
        }
        let node = t.node.clone();
        let client = t.client.clone();
        for ns in t.pods.iter().chain([&t.client, &t.node]) {
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        // Links are created inside the node namespace and the peer moved straight on.
        let veth = |dev: &str, peer_ns: &str| {
            sh(&[
                "ip", "-n", &node, "link", "add", dev, "type", "veth", "peer", "name", "eth0",
                "netns", peer_ns,
            ])
        };
        let addr = |ns: &str, cidr: &str, dev: &str| {
            sh(&["ip", "-n", ns, "addr", "add", cidr, "dev", dev])?;
            sh(&["ip", "-n", ns, "link", "set", dev, "up"])
        };
        veth("c0", &client)?;
        addr(&node, &format!("{NODE_IP}/24"), "c0")?;
        addr(&client, &format!("{CLIENT_IP}/24"), "eth0")?;
        sh(&[
            "ip", "-n", &client, "route", "add", "default", "via", NODE_IP,
        ])?;
        // A node has an uplink; without any route, packets to a service IP without endpoints
        // would fail routing (net unreachable) before reaching the REJECT rule.
        sh(&[
            "ip", "-n", &node, "route", "add", "default", "via", CLIENT_IP,
        ])?;
        for (i, p) in t.pods.iter().enumerate() {
            let dev = format!("p{i}");
            veth(&dev, p)?;
            addr(&node, &format!("10.244.{i}.1/24"), &dev)?;
            addr(p, &format!("{}/24", pod_ip(i)), "eth0")?;
            sh(&[
                "ip",
                "-n",
                p,
                "route",
                "add",
                "default",
                "via",
                &format!("10.244.{i}.1"),
            ])?;
        }
        // Forwarding on; redirects off (the default route leaves by the interface the client
        // is on, and a redirect would use up the ICMP rate limit the REJECT answer needs).
        sh(&[
            "ip",
            "netns",
            "exec",
            &node,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.c0.send_redirects=0",
        ])?;
        t.ipv6 = match t.add_ipv6() {
            Ok(()) => true,
            Err(e) => {
                println!("topology {prefix}: no IPv6 ({e}); IPv6 checks will skip");
                false
            }
        };
        Ok(t)
    }

    /// The IPv6 twin of the IPv4 addressing (no duplicate address detection, so the
    /// addresses are usable at once).
    fn add_ipv6(&self) -> Result<(), String> {
        let node = &self.node;
        let addr6 = |ns: &str, cidr: &str, dev: &str| {
            sh(&[
                "ip", "-n", ns, "-6", "addr", "add", cidr, "dev", dev, "nodad",
            ])
        };
        let route6 = |ns: &str, via: &str| {
            sh(&["ip", "-n", ns, "-6", "route", "add", "default", "via", via])
        };
        addr6(node, &format!("{NODE_IP6}/64"), "c0")?;
        addr6(&self.client, &format!("{CLIENT_IP6}/64"), "eth0")?;
        route6(&self.client, NODE_IP6)?;
        for (i, p) in self.pods.iter().enumerate() {
            addr6(node, &format!("fd00:244:{i}::1/64"), &format!("p{i}"))?;
            addr6(p, &format!("{}/64", pod_ip6(i)), "eth0")?;
            route6(p, &format!("fd00:244:{i}::1"))?;
        }
        // The node's IPv6 uplink is pod0's link, not the client's: IPv6 has no sysctl to turn
        // redirects off, and a redirect to the client draws on the same per-peer ICMP rate
        // limit as the REJECT answer.
        if !self.pods.is_empty() {
            route6(node, &pod_ip6(0))?;
        }
        sh(&[
            "ip",
            "netns",
            "exec",
            node,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.forwarding=1",
        ])
    }

    /// The command prefix that runs something in the node namespace.
    pub fn prefix(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.node]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn helper_cmd(&self, ns: &str, spec: &str) -> Command {
        let exe = std::env::current_exe().unwrap();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .arg(exe)
            .args(["helper", "--exact", "--nocapture", "--test-threads=1"])
            .env(self.helper_var, spec);
        c
    }

    /// Starts one backend per pod namespace (`pod<i>` answering its name) and waits for each.
    pub fn start_backends(&mut self) -> Result<(), String> {
        for (i, p) in self.pods.clone().iter().enumerate() {
            self.start_server(p, &format!("pod{i}"))?;
        }
        Ok(())
    }

    /// Starts a server answering `node` in the node namespace itself (on every address,
    /// 127.0.0.0/8 included) and waits for it.
    pub fn start_node_server(&mut self) -> Result<(), String> {
        let node = self.node.clone();
        self.start_server(&node, "node")
    }

    fn start_server(&mut self, ns: &str, name: &str) -> Result<(), String> {
        let mut child = self
            .helper_cmd(ns, &format!("server {name}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut out = child.stdout.take().unwrap();
        self.children.push(child);
        // Wait for READY (bounded by the helper's own startup).
        let mut seen = String::new();
        let mut buf = [0u8; 256];
        let deadline = Instant::now() + Duration::from_secs(10);
        while !seen.contains("READY") && Instant::now() < deadline {
            match out.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
        if !seen.contains("READY") {
            return Err(format!("server {name} did not start: {seen:?}"));
        }
        Ok(())
    }

    /// The client helper making `count` `proto` ("tcp"/"udp") requests to `addr` from source
    /// port `sport` (UDP; 0 = any); its output goes through [`answers`].
    pub fn client_cmd(&self, proto: &str, addr: &str, count: usize, sport: u16) -> Command {
        let mut c = self.helper_cmd(
            &self.client,
            &format!("client {proto} {addr} {count} {sport}"),
        );
        c.stderr(Stdio::null());
        c
    }

    /// Runs the client helper; returns its answers.
    pub fn client(&self, proto: &str, addr: &str, count: usize, sport: u16) -> Vec<String> {
        let out = self.client_cmd(proto, addr, count, sport).output().unwrap();
        answers(&out.stdout)
    }

    /// The node namespace's nat and filter tables, whichever iptables backend holds them.
    pub fn node_rules(&self) -> String {
        self.node_save(&["iptables-nft-save", "iptables-legacy-save", "iptables-save"])
    }

    /// The same for ip6tables.
    pub fn node_rules6(&self) -> String {
        self.node_save(&[
            "ip6tables-nft-save",
            "ip6tables-legacy-save",
            "ip6tables-save",
        ])
    }

    fn node_save(&self, bins: &[&str]) -> String {
        let mut all = String::new();
        for &bin in bins {
            if !have(bin) {
                continue;
            }
            if let Ok(o) = Command::new("ip")
                .args(["netns", "exec", &self.node, bin])
                .output()
            {
                all.push_str(&String::from_utf8_lossy(&o.stdout));
            }
        }
        all
    }
}
