//! `/exec`, `/portForward` and `/run` on :10250 against real containerd, with a small
//! websocket client speaking the channel protocols kubectl and the apiserver use
//! (`v4.channel.k8s.io` / `v5.channel.k8s.io` for exec, `v4.channel.k8s.io` for port-forward):
//! the command's output, stdin, the exit code in the status channel, bytes through a
//! port-forward to busybox httpd, a SPDY/3.1 upgrade answered with the negotiated protocol,
//! `/run`, and upstream's 404/400 answers. An ignored bench compares an exec round trip
//! through the kubelet with the same exec straight on the runtime's streaming URL.

use node_tests::require_rig;
use node_tests::{Kubelet, Rig, wait_for};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A shell that also serves a page with busybox httpd on :8080.
const SHELL: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: shell
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: docker.io/library/busybox:1.35
    command: ["sh", "-c", "mkdir -p /tmp/www && echo hello-from-httpd > /tmp/www/index.html && httpd -p 8080 -h /tmp/www && exec sleep 3600"]
"#;

const POD: &str = "shell-rig-node";

// ---- a minimal TLS + websocket client ---------------------------------------------------

/// Accepts any server certificate (the agent's is self-signed).
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A connection to the agent's :10250 (TLS) or to a plain `host:port`.
async fn connect(addr: &str, tls: bool) -> Box<dyn Io> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).unwrap();
    if !tls {
        return Box::new(tcp);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let s = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    Box::new(s)
}

/// A response head: status, lower-cased headers, bytes read past it.
struct Head {
    status: u16,
    headers: Vec<(String, String)>,
    rest: Vec<u8>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn read_head(s: &mut Box<dyn Io>) -> Head {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        let n = tokio::time::timeout(Duration::from_secs(20), s.read(&mut chunk))
            .await
            .expect("response head in time")
            .expect("read head");
        assert!(n > 0, "closed before a response head");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
    };
    let text = String::from_utf8_lossy(&buf[..end]).to_string();
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Head {
        status,
        headers,
        rest: buf[end + 4..].to_vec(),
    }
}

fn refused(h: Head) -> Ws {
    panic!(
        "upgrade refused: {} {:?} {}",
        h.status,
        h.headers,
        String::from_utf8_lossy(&h.rest)
    )
}

/// An upgraded websocket connection (client side: frames are masked).
struct Ws {
    s: Box<dyn Io>,
    buf: Vec<u8>,
    protocol: String,
}

/// Opens a websocket on `path` offering `protocols`; the 101's head, or the refusal's.
async fn ws_open(addr: &str, tls: bool, path: &str, protocols: &str) -> Result<Ws, Head> {
    let mut s = connect(addr, tls).await;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: {protocols}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let head = read_head(&mut s).await;
    if head.status != 101 {
        return Err(head);
    }
    Ok(Ws {
        protocol: head
            .header("sec-websocket-protocol")
            .unwrap_or_default()
            .to_string(),
        buf: head.rest,
        s,
    })
}

impl Ws {
    /// Sends one binary message: `channel` then `data`.
    async fn send(&mut self, channel: u8, data: &[u8]) {
        let mut payload = vec![channel];
        payload.extend_from_slice(data);
        let mut frame = vec![0x82u8];
        let n = payload.len();
        if n < 126 {
            frame.push(0x80 | n as u8);
        } else {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        let mask = [0x11u8, 0x22, 0x33, 0x44];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.s.write_all(&frame).await.unwrap();
        self.s.flush().await.unwrap();
    }

    async fn fill(&mut self, n: usize) -> bool {
        let mut chunk = [0u8; 8192];
        while self.buf.len() < n {
            match self.s.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
            }
        }
        true
    }

    /// The next data message as (channel, payload); `None` once the connection closes.
    async fn recv(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if !self.fill(2).await {
                return None;
            }
            let opcode = self.buf[0] & 0x0f;
            let mut len = (self.buf[1] & 0x7f) as usize;
            let mut at = 2;
            if len == 126 {
                self.fill(4).await;
                len = u16::from_be_bytes([self.buf[2], self.buf[3]]) as usize;
                at = 4;
            } else if len == 127 {
                self.fill(10).await;
                len = u64::from_be_bytes(self.buf[2..10].try_into().unwrap()) as usize;
                at = 10;
            }
            if !self.fill(at + len).await {
                return None;
            }
            let payload: Vec<u8> = self.buf[at..at + len].to_vec();
            self.buf.drain(..at + len);
            match opcode {
                8 => return None,
                1 | 2 if !payload.is_empty() => return Some((payload[0], payload[1..].to_vec())),
                _ => {}
            }
        }
    }
}

/// What an exec session produced.
#[derive(Debug, Default)]
struct ExecOut {
    stdout: String,
    stderr: String,
    status: String,
}

/// Reads an exec session to its end (within `limit`).
async fn drain(ws: &mut Ws, limit: Duration) -> ExecOut {
    let mut out = ExecOut::default();
    let _ = tokio::time::timeout(limit, async {
        while let Some((ch, data)) = ws.recv().await {
            let text = String::from_utf8_lossy(&data).to_string();
            match ch {
                1 => out.stdout.push_str(&text),
                2 => out.stderr.push_str(&text),
                3 => out.status.push_str(&text),
                _ => {}
            }
        }
    })
    .await;
    out
}

/// The exit code a channel-3 status carries (0 for Success).
fn exit_code(status: &str) -> Option<i64> {
    let v: serde_json::Value = serde_json::from_str(status).ok()?;
    if v["status"] == "Success" {
        return Some(0);
    }
    v["details"]["causes"]
        .as_array()?
        .iter()
        .find(|c| c["reason"] == "ExitCode")?["message"]
        .as_str()?
        .parse()
        .ok()
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn exec_path(cmd: &[&str], stdin: bool) -> String {
    let mut p = format!("/exec/default/{POD}/app?output=1&error=1");
    if stdin {
        p.push_str("&input=1");
    }
    for c in cmd {
        p.push_str("&command=");
        p.push_str(&encode(c));
    }
    p
}

/// A tokio runtime whose workers live in the rig's network namespace (where the agent and
/// containerd's streaming server listen on 127.0.0.1).
fn netns_runtime(netns: &str) -> tokio::runtime::Runtime {
    let netns = netns.to_string();
    std::thread::spawn(move || {
        node_tests::enter_netns(&netns);
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
    .join()
    .unwrap()
}

fn run_in<T: Send + 'static>(
    rt: &tokio::runtime::Runtime,
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    rt.block_on(async { tokio::spawn(f).await.expect("task") })
}

fn curl(agent: &Kubelet, method: &str, path: &str) -> (u16, String) {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", agent.netns()))
        .args([
            "curl",
            "-sk",
            "--max-time",
            "10",
            "-X",
            method,
            "-w",
            "\n%{http_code}",
        ])
        .arg(format!("https://127.0.0.1:10250{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

const KUBELET: &str = "127.0.0.1:10250";

fn start() -> (Rig, Kubelet, tokio::runtime::Runtime) {
    let rig = Rig::up("e2e-exec");
    let agent = Kubelet::builder(&rig).start();
    agent.write_manifest("shell.yaml", SHELL);
    wait_for("the shell pod running", Duration::from_secs(90), || {
        let p = agent.pod("shell-")?;
        (p["status"]["phase"] == "Running").then_some(())
    });
    let rt = netns_runtime(rig.netns_path());
    (rig, agent, rt)
}

#[test]
fn exec_port_forward_run_and_refusals() {
    require_rig!();
    let (_rig, agent, rt) = start();

    // v4 websocket exec: stdout carries the pod's hostname, channel 3 a Success status.
    let out = run_in(&rt, async {
        let mut ws = ws_open(
            KUBELET,
            true,
            &exec_path(&["sh", "-c", "echo $HOSTNAME"], false),
            "v4.channel.k8s.io",
        )
        .await
        .unwrap_or_else(refused);
        assert_eq!(ws.protocol, "v4.channel.k8s.io");
        drain(&mut ws, Duration::from_secs(20)).await
    });
    assert_eq!(out.stdout.trim(), POD, "{out:?}");
    assert_eq!(exit_code(&out.status), Some(0), "{out:?}");

    // The exit code comes back in the status channel.
    let out = run_in(&rt, async {
        let mut ws = ws_open(
            KUBELET,
            true,
            &exec_path(&["sh", "-c", "echo oops >&2; exit 7"], false),
            "v4.channel.k8s.io",
        )
        .await
        .unwrap_or_else(refused);
        drain(&mut ws, Duration::from_secs(20)).await
    });
    assert_eq!(exit_code(&out.status), Some(7), "{out:?}");
    assert!(out.status.contains("NonZeroExitCode"), "{out:?}");
    assert_eq!(out.stderr.trim(), "oops", "{out:?}");

    // v4 cannot close stdin: the command reads a fixed count.
    let out = run_in(&rt, async {
        let mut ws = ws_open(
            KUBELET,
            true,
            &exec_path(&["head", "-c", "12"], true),
            "v4.channel.k8s.io",
        )
        .await
        .unwrap_or_else(refused);
        ws.send(0, b"from-stdin!\n").await;
        drain(&mut ws, Duration::from_secs(20)).await
    });
    assert_eq!(out.stdout, "from-stdin!\n", "{out:?}");
    assert_eq!(exit_code(&out.status), Some(0), "{out:?}");

    // v5 (the kubelet translates it to SPDY for the runtime): `[255, 0]` closes stdin, so
    // `cat` sees the end of its input and exits.
    let out = run_in(&rt, async {
        let mut ws = ws_open(
            KUBELET,
            true,
            &exec_path(&["cat"], true),
            "v5.channel.k8s.io, v4.channel.k8s.io",
        )
        .await
        .unwrap_or_else(refused);
        assert_eq!(ws.protocol, "v5.channel.k8s.io");
        ws.send(0, b"from-stdin!\n").await;
        ws.send(0, b"and more\n").await;
        ws.send(255, &[0]).await;
        drain(&mut ws, Duration::from_secs(20)).await
    });
    assert_eq!(out.stdout, "from-stdin!\nand more\n", "{out:?}");
    assert_eq!(exit_code(&out.status), Some(0), "{out:?}");

    // v5: output and the exit code.
    let out = run_in(&rt, async {
        let mut ws = ws_open(
            KUBELET,
            true,
            &exec_path(
                &["sh", "-c", "echo $HOSTNAME; echo oops >&2; exit 7"],
                false,
            ),
            "v5.channel.k8s.io",
        )
        .await
        .unwrap_or_else(refused);
        assert_eq!(ws.protocol, "v5.channel.k8s.io");
        drain(&mut ws, Duration::from_secs(20)).await
    });
    assert_eq!(out.stdout.trim(), POD, "{out:?}");
    assert_eq!(out.stderr.trim(), "oops", "{out:?}");
    assert_eq!(exit_code(&out.status), Some(7), "{out:?}");

    // Port-forward over websocket: per port a data and an error channel, each opening with
    // the port number; the request goes to httpd in the pod and its answer comes back.
    let page = run_in(&rt, async {
        let mut ws = ws_open(
            KUBELET,
            true,
            &format!("/portForward/default/{POD}?port=8080"),
            "v4.channel.k8s.io",
        )
        .await
        .unwrap_or_else(refused);
        let mut firsts = Vec::new();
        while firsts.len() < 2 {
            let (ch, data) = ws.recv().await.expect("port frames");
            assert_eq!(
                data,
                8080u16.to_le_bytes(),
                "channel {ch} opens with the port"
            );
            firsts.push(ch);
        }
        firsts.sort();
        assert_eq!(firsts, vec![0, 1]);
        ws.send(0, b"GET /index.html HTTP/1.0\r\n\r\n").await;
        let mut page = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some((ch, data)) = ws.recv().await {
                if ch == 0 {
                    page.push_str(&String::from_utf8_lossy(&data));
                    if page.contains("hello-from-httpd") {
                        break;
                    }
                }
            }
        })
        .await;
        page
    });
    assert!(
        page.starts_with("HTTP/1.") && page.lines().next().unwrap().contains(" 200 "),
        "{page}"
    );
    assert!(page.contains("hello-from-httpd"), "{page}");

    // A SPDY/3.1 upgrade is switched through with the negotiated protocol header.
    let head = run_in(&rt, async {
        let mut s = connect(KUBELET, true).await;
        let req = format!(
            "POST {} HTTP/1.1\r\nHost: {KUBELET}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nX-Stream-Protocol-Version: v3.channel.k8s.io\r\nContent-Length: 0\r\n\r\n",
            exec_path(&["true"], false)
        );
        s.write_all(req.as_bytes()).await.unwrap();
        read_head(&mut s).await
    });
    assert_eq!(head.status, 101);
    assert_eq!(head.header("upgrade"), Some("SPDY/3.1"));
    assert_eq!(
        head.header("x-stream-protocol-version"),
        Some("v4.channel.k8s.io")
    );

    // /run: ExecSync's output.
    assert_eq!(
        curl(
            &agent,
            "POST",
            &format!("/run/default/{POD}/app?cmd=hostname")
        ),
        (200, format!("{POD}\n"))
    );

    // Upstream's refusals.
    assert_eq!(
        curl(&agent, "POST", "/exec/default/nope/app?command=ls&output=1"),
        (404, "pod does not exist".into())
    );
    assert_eq!(
        curl(
            &agent,
            "POST",
            &format!("/exec/default/{POD}/app?command=ls")
        ),
        (
            400,
            "you must specify at least 1 of stdin, stdout, stderr".into()
        )
    );
    assert_eq!(
        curl(
            &agent,
            "POST",
            &format!("/exec/default/{POD}/app?command=ls&output=1")
        ),
        (500, "Upgrade request required\n".into())
    );
}

/// Exec round trips (`echo hi`, to the exit status) through the kubelet against the same exec
/// straight on the runtime: CRI Exec, then the upgrade on its URL. Prints p50s and the ratio.
#[test]
#[ignore = "bench: prints figures"]
fn exec_round_trip_bench() {
    require_rig!();
    let (rig, _agent, rt) = start();
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let endpoint = rig.get("CRI_ENDPOINT").to_string();
    let (kubelet_ms, v5_ms, direct_ms) = run_in(&rt, async move {
        let ch = cri_proto::connect_lazy(&endpoint, Duration::from_secs(5)).expect("CRI");
        let cri = kubelet::runtime::cri::CriRuntime::new(ch.clone(), ch, Duration::from_secs(30));
        use kubelet::runtime::Runtime;
        let id = cri
            .list_containers()
            .await
            .unwrap()
            .into_iter()
            .find(|c| c.name == "app" && c.state == kubelet::runtime::ContainerState::Running)
            .expect("the shell container")
            .id;
        let flags = kubelet::runtime::StreamFlags {
            stdout: true,
            stderr: true,
            ..Default::default()
        };
        let cmd = vec!["echo".to_string(), "hi".to_string()];
        let mut k = Vec::new();
        let mut v5 = Vec::new();
        let mut d = Vec::new();
        for _ in 0..runs {
            let t = Instant::now();
            let mut ws = ws_open(
                KUBELET,
                true,
                &exec_path(&["echo", "hi"], false),
                "v4.channel.k8s.io",
            )
            .await
            .unwrap_or_else(refused);
            let out = drain(&mut ws, Duration::from_secs(20)).await;
            assert_eq!(out.stdout, "hi\n");
            k.push(t.elapsed().as_secs_f64() * 1000.0);

            let t = Instant::now();
            let mut ws = ws_open(
                KUBELET,
                true,
                &exec_path(&["echo", "hi"], false),
                "v5.channel.k8s.io",
            )
            .await
            .unwrap_or_else(refused);
            let out = drain(&mut ws, Duration::from_secs(20)).await;
            assert_eq!(out.stdout, "hi\n");
            v5.push(t.elapsed().as_secs_f64() * 1000.0);

            let t = Instant::now();
            let url = cri.exec(&id, &cmd, flags).await.expect("CRI Exec");
            let rest = url.strip_prefix("http://").expect("http URL");
            let (host, path) = rest.split_at(rest.find('/').unwrap());
            let mut ws = ws_open(host, false, path, "v4.channel.k8s.io")
                .await
                .unwrap_or_else(refused);
            let out = drain(&mut ws, Duration::from_secs(20)).await;
            assert_eq!(out.stdout, "hi\n");
            d.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        (k, v5, d)
    });
    let p50 = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let (k, v, d) = (p50(kubelet_ms), p50(v5_ms), p50(direct_ms));
    println!(
        "exec round trip (echo hi, {runs} runs, p50): direct CRI Exec + v4 websocket on the streaming URL {d:.1} ms; through the kubelet (new TLS connection each) v4 proxied {k:.1} ms (ratio {:.2}), v5 translated to SPDY {v:.1} ms (ratio {:.2})",
        k / d,
        v / d
    );
}
