//! `serverTLSBootstrap: true` on real containerd in cluster mode: the agent asks the test control
//! plane for a `kubernetes.io/kubelet-serving` certificate with the node's name and address,
//! :10250 completes no handshake until it is issued, then presents a certificate of the cluster CA
//! with those names, and a rotation swaps it while the same process keeps serving.

use node_tests::controlplane::Options;
use node_tests::joined::{JoinedNode, NODE, NODE_IP};
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, Rig, wait_for};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const CSRS: &str = "certificatesigningrequests.certificates.k8s.io";

/// The leaf :10250 presents, when the handshake succeeds and the chain verifies against `ca`
/// for the node's IP (`openssl s_client` inside the rig's netns).
fn served_leaf(rig: &Rig, ca: &Path) -> Option<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", rig.netns_path()))
        .args(["timeout", "10", "openssl", "s_client", "-connect"])
        .arg(format!("{NODE_IP}:10250"))
        .arg("-CAfile")
        .arg(ca)
        .args(["-verify_return_error", "-verify_ip", NODE_IP])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text.find("-----BEGIN CERTIFICATE-----")?;
    let end = text[start..].find("-----END CERTIFICATE-----")? + start + 25;
    (out.status.success()).then(|| text[start..end].to_string())
}

/// (serial, DNS SANs, IP SANs, issuer) of a PEM certificate.
fn describe(pem: &str) -> (String, Vec<String>, Vec<String>, String) {
    use x509_parser::extensions::GeneralName;
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let cert = p.parse_x509().unwrap();
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => dns.push(d.to_string()),
                GeneralName::IPAddress(b) if b.len() == 4 => {
                    ips.push(format!("{}.{}.{}.{}", b[0], b[1], b[2], b[3]))
                }
                _ => {}
            }
        }
    }
    (
        cert.raw_serial_as_string(),
        dns,
        ips,
        cert.issuer().to_string(),
    )
}

fn is_serving(c: &Value) -> bool {
    c["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
}

/// Approves every serving CSR still waiting (as an operator or an approver would).
fn approve_pending(cp: &NetnsControlPlane) -> usize {
    let mut n = 0;
    for c in cp.list(CSRS, None).into_iter().filter(is_serving) {
        if c["status"]["conditions"].is_null() {
            let name = c["metadata"]["name"].as_str().unwrap_or_default();
            if cp.approve_csr(name).is_ok() {
                n += 1;
            }
        }
    }
    n
}

/// The value of `kubelet_certificate_manager_server_ttl_seconds` on :10250/metrics.
fn server_ttl(kubelet: &Kubelet) -> Option<f64> {
    let (body, code) = kubelet.curl_code(&format!("https://{NODE_IP}:10250/metrics"));
    if code != "200" {
        return None;
    }
    body.lines()
        .find(|l| l.starts_with("kubelet_certificate_manager_server_ttl_seconds "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

#[test]
fn server_tls_bootstrap_serves_an_issued_certificate_and_rotates_it_in_place() {
    require_rig!();
    if Command::new("sh")
        .args(["-c", "command -v openssl"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        eprintln!("SKIPPED: openssl is not installed (it reads the served certificate)");
        return;
    }
    let rig = Rig::up("e2e-scert");
    let out = rig.sh(&format!("ip addr add {NODE_IP}/32 dev lo"));
    assert!(out.status.success());
    // 40 s certificates, not backdated: a rotation is due 28–36 s after issue.
    let cp = NetnsControlPlane::start(
        &rig,
        Options {
            cluster_signing_duration: Duration::from_secs(40),
            min_signing_duration: Duration::from_secs(1),
            cert_backdate: Duration::ZERO,
            ..Options::default()
        },
    );
    let node = JoinedNode::write_open(&cp, &rig);
    let config = node.p("var/lib/kubelet/config.yaml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("serverTLSBootstrap: true\n");
    std::fs::write(&config, text).unwrap();
    let ca = node.p("etc/kubernetes/pki/ca.crt");
    let mut kubelet = Kubelet::builder(&rig)
        .args(node.command_line())
        .log(node.p("kubelet.log"))
        .start();
    wait_for("healthz 200", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        (kubelet.curl_code("http://127.0.0.1:10248/healthz").1 == "200").then_some(())
    });
    let pid = kubelet.pid();

    // The CSR: the node's identity, serving usages, its hostname and address.
    let csr = wait_for("kubelet-serving CSR", Duration::from_secs(30), || {
        cp.list(CSRS, None).into_iter().find(is_serving)
    });
    assert_eq!(csr["spec"]["username"], format!("system:node:{NODE}"));
    assert_eq!(
        csr["spec"]["usages"],
        serde_json::json!(["digital signature", "server auth"])
    );
    use base64::Engine as _;
    let req = base64::engine::general_purpose::STANDARD
        .decode(csr["spec"]["request"].as_str().unwrap())
        .unwrap();
    let info =
        node_tests::controlplane::pki::inspect_csr(std::str::from_utf8(&req).unwrap()).unwrap();
    assert_eq!(info.common_name, format!("system:node:{NODE}"));
    assert_eq!(info.organizations, ["system:nodes"]);
    assert_eq!(info.dns_or_ip_sans, 2, "{NODE} and {NODE_IP}");

    // Not approved yet: no handshake completes on :10250 (upstream serves nothing either).
    let (_, code) = kubelet.curl_code(&format!("https://{NODE_IP}:10250/healthz"));
    assert_eq!(
        code, "000",
        "a handshake completed before the certificate was issued"
    );

    let name = csr["metadata"]["name"].as_str().unwrap().to_string();
    cp.approve_csr(&name).unwrap();
    let first = wait_for(
        "the issued certificate on :10250",
        Duration::from_secs(30),
        || served_leaf(&rig, &ca),
    );
    let (serial1, dns, ips, issuer) = describe(&first);
    assert_eq!(dns, [NODE]);
    assert_eq!(ips, [NODE_IP]);
    assert!(issuer.contains("CN=kubernetes"), "{issuer}");
    let ttl = wait_for("server TTL metric", Duration::from_secs(10), || {
        server_ttl(&kubelet)
    });
    assert!(
        ttl > 0.0 && ttl <= 40.0,
        "kubelet_certificate_manager_server_ttl_seconds {ttl}"
    );

    // Stored as upstream's file store does, private.
    let current = node.p("var/lib/kubelet/pki/kubelet-server-current.pem");
    let target = std::fs::read_link(&current).unwrap();
    assert!(
        target.to_string_lossy().contains("kubelet-server-2"),
        "{target:?}"
    );
    let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // Rotation at 70–90 % of 40 s: a second CSR, approved, then served by the same process.
    let second = wait_for(
        "a rotated certificate on :10250",
        Duration::from_secs(60),
        || {
            approve_pending(&cp);
            served_leaf(&rig, &ca).filter(|pem| describe(pem).0 != serial1)
        },
    );
    let (_, dns2, ips2, _) = describe(&second);
    assert_eq!(dns2, [NODE]);
    assert_eq!(ips2, [NODE_IP]);
    assert!(kubelet.exited().is_none(), "{}", kubelet.log_text());
    assert_eq!(kubelet.pid(), pid, "rotated without restarting the agent");
    let serving_csrs = cp.list(CSRS, None).into_iter().filter(is_serving).count();
    assert!(serving_csrs >= 2, "{serving_csrs} serving CSRs");
    kubelet.stop();
}

/// The leaf :10250 presents on 127.0.0.1, unverified (`openssl s_client` in the rig's netns).
fn served_leaf_loopback(rig: &Rig) -> Option<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", rig.netns_path()))
        .args([
            "timeout",
            "10",
            "openssl",
            "s_client",
            "-connect",
            "127.0.0.1:10250",
        ])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text.find("-----BEGIN CERTIFICATE-----")?;
    let end = text[start..].find("-----END CERTIFICATE-----")? + start + 25;
    Some(text[start..end].to_string())
}

/// A self-signed pair for `name`: (certificate PEM, key PEM).
fn pair(name: &str) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Replaces `path` in one step, as cert-manager's and Vault's writers do (write, rename).
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// `tlsCertFile`/`tlsPrivateKeyFile` rotated on disk (ReloadKubeletServerCertificateFile, on by
/// default as upstream): the same process serves the new pair within seconds; a broken pair
/// (a certificate whose key is not there) is not served, the previous one stays.
#[test]
fn configured_serving_files_are_reloaded_when_replaced() {
    require_rig!();
    if Command::new("sh")
        .args(["-c", "command -v openssl"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        eprintln!("SKIPPED: openssl is not installed (it reads the served certificate)");
        return;
    }
    let rig = Rig::up("e2e-certfile");
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let (c1, k1) = pair("first.example");
    replace(&crt, &c1);
    replace(&key, &k1);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut kubelet = Kubelet::builder(&rig)
        .config(&format!(
            "tlsCertFile: {}\ntlsPrivateKeyFile: {}\n",
            crt.display(),
            key.display()
        ))
        .start();
    let cn = |pem: &str| {
        let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let x = p.parse_x509().unwrap();
        x.subject().to_string()
    };
    let served = || {
        served_leaf_loopback(&rig)
            .map(|p| cn(&p))
            .unwrap_or_default()
    };
    wait_for("the first pair served", Duration::from_secs(20), || {
        (served() == "CN=first.example").then_some(())
    });
    // A new certificate without its key: a broken pair, not served.
    let (c2, k2) = pair("second.example");
    replace(&crt, &c2);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(served(), "CN=first.example", "{}", kubelet.log_text());
    assert!(
        kubelet
            .log_text()
            .contains("still serving the previous pair"),
        "the broken pair is logged"
    );
    // Its key arrives: the new pair is served by the same process.
    replace(&key, &k2);
    wait_for("the second pair served", Duration::from_secs(10), || {
        (served() == "CN=second.example").then_some(())
    });
    assert!(kubelet.exited().is_none());
}
