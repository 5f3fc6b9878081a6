use super::*;
use crate::cluster::bootstrap::check_key_pair;
use std::os::unix::fs::PermissionsExt;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn tls_versions_and_suites() {
    use rustls::ProtocolVersion::{TLSv1_2, TLSv1_3};
    let v = |p: TlsPolicy| p.versions.iter().map(|v| v.version).collect::<Vec<_>>();
    assert_eq!(v(tls_policy(None, &[]).unwrap()), [TLSv1_3, TLSv1_2]);
    assert_eq!(
        v(tls_policy(Some("VersionTLS12"), &[]).unwrap()),
        [TLSv1_3, TLSv1_2]
    );
    assert_eq!(v(tls_policy(Some("VersionTLS13"), &[]).unwrap()), [TLSv1_3]);
    for old in ["VersionTLS10", "VersionTLS11"] {
        let e = tls_policy(Some(old), &[]).unwrap_err();
        assert!(e.contains(old) && e.contains("rustls"), "{e}");
    }
    assert!(
        tls_policy(Some("TLS1.2"), &[])
            .unwrap_err()
            .contains("unknown tls version")
    );
    let p = tls_policy(
        None,
        &[
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into(),
            "TLS_AES_128_GCM_SHA256".into(),
        ],
    )
    .unwrap();
    let suites = p.suites.unwrap();
    let tls12: Vec<_> = suites
        .iter()
        .filter(|s| !is_tls13(s))
        .map(|s| s.suite())
        .collect();
    assert_eq!(
        tls12,
        [rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
    );
    assert_eq!(
        suites.iter().filter(|s| is_tls13(s)).count(),
        3,
        "TLS 1.3 suites stay"
    );
    let e = tls_policy(None, &["TLS_RSA_WITH_AES_128_CBC_SHA".into()]).unwrap_err();
    assert!(
        e.contains("TLS_RSA_WITH_AES_128_CBC_SHA") && e.contains("not supported"),
        "{e}"
    );
    let e = tls_policy(None, &["TLS_NOPE".into()]).unwrap_err();
    assert!(e.contains("unknown cipher suite"), "{e}");
    // A restricted policy still builds a server config.
    let dir = tempfile::tempdir().unwrap();
    let p = tls_policy(Some("VersionTLS13"), &["TLS_AES_256_GCM_SHA384".into()]).unwrap();
    serving_tls(&p, None, None, dir.path(), "n", &[], false).unwrap();
}

fn serve(dir: &Path) -> Result<rustls::ServerConfig, ServerError> {
    serving_tls(
        &tls_policy(None, &[]).unwrap(),
        None,
        None,
        dir,
        "worker-1",
        &["10.0.0.5".parse().unwrap()],
        true,
    )
}

#[test]
fn self_signed_pair_is_written_privately_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    serve(&pki).unwrap();
    let (crt, key) = (pki.join("kubelet.crt"), pki.join("kubelet.key"));
    assert_eq!(mode(&key), 0o600);
    assert_eq!(mode(&crt), 0o644);
    assert_eq!(
        names(&pki),
        ["kubelet.crt", "kubelet.key"],
        "no temp file left"
    );
    let (c1, k1) = (std::fs::read(&crt).unwrap(), std::fs::read(&key).unwrap());
    check_key_pair(&c1, &k1).unwrap();
    // A usable pair is served again, not replaced.
    serve(&pki).unwrap();
    assert_eq!(std::fs::read(&crt).unwrap(), c1);
    assert_eq!(std::fs::read(&key).unwrap(), k1);
}

#[test]
fn half_present_or_mismatched_self_signed_pair_is_regenerated() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path();
    let (crt, key) = (pki.join("kubelet.crt"), pki.join("kubelet.key"));
    serve(pki).unwrap();
    let old_cert = std::fs::read(&crt).unwrap();

    // Only the certificate is left (say, a crash after the key was removed).
    std::fs::remove_file(&key).unwrap();
    serve(pki).unwrap();
    let (c, k) = (std::fs::read(&crt).unwrap(), std::fs::read(&key).unwrap());
    assert_ne!(c, old_cert);
    check_key_pair(&c, &k).unwrap();
    assert_eq!(mode(&key), 0o600);

    // The key belongs to another certificate: both are replaced, nothing fails.
    let other = rcgen::KeyPair::generate().unwrap();
    std::fs::write(&key, other.serialize_pem()).unwrap();
    assert!(check_key_pair(&c, &std::fs::read(&key).unwrap()).is_err());
    serve(pki).unwrap();
    let (c2, k2) = (std::fs::read(&crt).unwrap(), std::fs::read(&key).unwrap());
    assert_ne!(c2, c);
    check_key_pair(&c2, &k2).unwrap();
    assert_eq!(mode(&key), 0o600);
    assert_eq!(names(pki), ["kubelet.crt", "kubelet.key"]);
}

#[test]
fn configured_mismatched_pair_is_an_error_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    serve(dir.path()).unwrap();
    let crt = dir.path().join("kubelet.crt");
    let key = dir.path().join("other.key");
    std::fs::write(&key, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let before = std::fs::read(&crt).unwrap();
    let r = serving_tls(
        &tls_policy(None, &[]).unwrap(),
        Some(&crt),
        Some(&key),
        &dir.path().join("unused"),
        "worker-1",
        &[],
        false,
    );
    assert!(matches!(r, Err(ServerError::Tls { .. })));
    assert_eq!(std::fs::read(&crt).unwrap(), before);
}
