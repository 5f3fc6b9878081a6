use super::*;
use std::net::Ipv4Addr;

#[test]
fn csr_names_the_node_and_its_addresses() {
    use x509_parser::prelude::*;
    let kc = new_serving_key_and_csr(
        "worker-1",
        &["worker-1.example".into()],
        &[IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7))],
    )
    .unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(kc.csr_pem.as_bytes()).unwrap();
    let (_, csr) = X509CertificationRequest::from_der(&pem.contents).unwrap();
    let subject = csr.certification_request_info.subject.to_string();
    assert!(
        subject.contains("CN=system:node:worker-1") && subject.contains("O=system:nodes"),
        "{subject}"
    );
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for n in &san.general_names {
                match n {
                    GeneralName::DNSName(d) => dns.push(d.to_string()),
                    GeneralName::IPAddress(b) => ips.push(b.to_vec()),
                    _ => {}
                }
            }
        }
    }
    assert_eq!(dns, ["worker-1.example"]);
    assert_eq!(ips, [vec![10, 0, 0, 7]]);
    assert_eq!(SERVING.signer, "kubernetes.io/kubelet-serving");
    assert_eq!(SERVING.usages, ["digital signature", "server auth"]);
}

#[test]
fn renewal_waits_for_70_to_90_percent_of_the_lifetime() {
    // A certificate valid 1000..2000, seen at 1200 (fake clock): due at 1700..1900.
    assert_eq!(renew_in(1000, 2000, 0.0, 1200), Duration::from_secs(500));
    assert_eq!(renew_in(1000, 2000, 1.0, 1200), Duration::from_secs(700));
    // Past the deadline (or expired): renew at once.
    assert_eq!(renew_in(1000, 2000, 0.5, 1850), Duration::ZERO);
    assert_eq!(renew_in(1000, 2000, 0.5, 5000), Duration::ZERO);
}

struct Ca {
    cert: rcgen::Certificate,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

fn ca() -> Ca {
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let key = rcgen::KeyPair::generate().unwrap();
    Ca {
        cert: p.self_signed(&key).unwrap(),
        issuer: rcgen::Issuer::new(p, key),
    }
}

/// A leaf for `name` signed by `ca`: (cert PEM, key PEM).
fn leaf(ca: &Ca, name: &str) -> (String, String) {
    let p = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// One TLS handshake against `cfg` over an in-memory pipe; the leaf the server presented
/// (`None`: the handshake failed).
async fn presented(cfg: Arc<rustls::ServerConfig>, ca: &Ca, name: &str) -> Option<Vec<u8>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert.der().clone()).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let (a, b) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move { tokio_rustls::TlsAcceptor::from(cfg).accept(b).await });
    let sni = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    let res = tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(sni, a)
        .await;
    let _ = server.await;
    res.ok()
        .and_then(|s| s.get_ref().1.peer_certificates().map(|c| c[0].to_vec()))
}

fn der(pem: &str) -> Vec<u8> {
    rustls_pemfile::certs(&mut pem.as_bytes())
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

#[tokio::test]
async fn listener_serves_nothing_until_issued_then_swaps_without_restart() {
    let ca = ca();
    let resolver = Arc::new(ServingCertResolver::new());
    let policy = crate::server::tls_policy(None, &[]).unwrap();
    let cfg =
        Arc::new(crate::server::serving_tls_resolver(&policy, resolver.clone(), false).unwrap());
    // No certificate yet: the handshake fails, as upstream's GetCertificate error.
    assert!(!resolver.has_cert());
    assert_eq!(presented(cfg.clone(), &ca, "node-a").await, None);

    let (c1, k1) = leaf(&ca, "node-a");
    resolver
        .install(c1.as_bytes(), k1.as_bytes(), "first")
        .unwrap();
    assert_eq!(presented(cfg.clone(), &ca, "node-a").await, Some(der(&c1)));

    // A rotation: the same config (listener) presents the new leaf on the next handshake.
    let (c2, k2) = leaf(&ca, "node-a");
    resolver
        .install(c2.as_bytes(), k2.as_bytes(), "second")
        .unwrap();
    assert_eq!(presented(cfg, &ca, "node-a").await, Some(der(&c2)));
}

#[test]
fn a_key_of_another_certificate_is_refused_and_the_old_pair_stays() {
    let ca = ca();
    let (c1, k1) = leaf(&ca, "n");
    let (c2, _) = leaf(&ca, "n");
    let resolver = ServingCertResolver::new();
    resolver
        .install(c1.as_bytes(), k1.as_bytes(), "one")
        .unwrap();
    let e = resolver
        .install(c2.as_bytes(), k1.as_bytes(), "mixed")
        .unwrap_err();
    assert!(e.to_string().contains("mixed"), "{e}");
    assert!(resolver.has_cert());
}

#[test]
fn stored_pair_is_read_back_as_kubelet_server_current() {
    use std::os::unix::fs::PermissionsExt;
    let ca = ca();
    let (c, k) = leaf(&ca, "n");
    let dir = tempfile::tempdir().unwrap();
    let path = bootstrap::store_pair_as(dir.path(), PREFIX, &c, &k).unwrap();
    assert_eq!(path, dir.path().join("kubelet-server-current.pem"));
    let target = std::fs::read_link(&path).unwrap();
    assert!(
        target
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("kubelet-server-2"),
        "{target:?}"
    );
    let mode = std::fs::metadata(&target).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let (pem, nb, na) = read_current(dir.path()).unwrap();
    assert!(na > nb);
    assert_eq!(der(std::str::from_utf8(&pem).unwrap()), der(&c));
    // A broken file is not served.
    std::fs::write(dir.path().join("junk.pem"), "junk").unwrap();
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink(dir.path().join("junk.pem"), &path).unwrap();
    assert!(read_current(dir.path()).is_none());
}

#[test]
fn an_expired_certificate_is_not_presented() {
    let ca = ca();
    let (c, k) = leaf(&ca, "n");
    let resolver = ServingCertResolver::new();
    resolver.install(c.as_bytes(), k.as_bytes(), "n").unwrap();
    let (_, not_after) = bootstrap::cert_validity(c.as_bytes()).unwrap();
    assert!(resolver.current_at(not_after - 1).is_some());
    assert!(resolver.current_at(not_after).is_none());
}
