use super::*;

#[test]
fn csr_has_node_subject_and_pem_forms() {
    use x509_parser::prelude::FromDer;
    let kc = new_key_and_csr("worker-1").unwrap();
    assert!(
        kc.csr_pem
            .starts_with("-----BEGIN CERTIFICATE REQUEST-----")
    );
    assert!(kc.key_pem.contains("PRIVATE KEY"));
    let (_, pem) = x509_parser::pem::parse_x509_pem(kc.csr_pem.as_bytes()).unwrap();
    let (_, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
            .unwrap();
    let subject = csr.certification_request_info.subject.to_string();
    assert!(
        subject.contains("CN=system:node:worker-1") && subject.contains("O=system:nodes"),
        "{subject}"
    );
}

#[test]
fn digested_name_is_stable_and_distinguishes_inputs() {
    let a = digested_name(b"key", "system:node:a", &["system:nodes"], &USAGES);
    assert_eq!(
        a,
        digested_name(b"key", "system:node:a", &["system:nodes"], &USAGES)
    );
    assert!(a.starts_with("node-csr-"));
    // 32 bytes of sha512/256 in unpadded base64url: 43 characters.
    assert_eq!(a.len(), "node-csr-".len() + 43);
    assert_ne!(
        a,
        digested_name(b"key", "system:node:b", &["system:nodes"], &USAGES)
    );
}

#[test]
fn deadline_lies_between_70_and_90_percent() {
    assert_eq!(rotation_deadline(1000, 2000, 0.0), 1700);
    assert_eq!(rotation_deadline(1000, 2000, 1.0), 1900);
    let d = rotation_deadline(0, 100, 0.5);
    assert_eq!(d, 80);
}

#[test]
fn stored_pair_is_private_and_current_follows_rotation() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let cur = store_pair(dir.path(), "CERT1", "KEY1").unwrap();
    assert_eq!(std::fs::read_to_string(&cur).unwrap(), "CERT1\nKEY1\n");
    let target = std::fs::read_link(&cur).unwrap();
    assert!(
        target
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("kubelet-client-2")
    );
    assert_eq!(
        std::fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let cur2 = store_pair(dir.path(), "CERT2", "KEY2").unwrap();
    assert_eq!(cur, cur2);
    assert_eq!(std::fs::read_to_string(&cur).unwrap(), "CERT2\nKEY2\n");
    assert!(target.exists(), "the previous pair is kept");
}

#[test]
fn missing_or_broken_kubeconfig_is_unusable() {
    let dir = tempfile::tempdir().unwrap();
    assert!(!kubeconfig_usable(&dir.path().join("none")));
    std::fs::write(dir.path().join("bad"), "not: [a kubeconfig").unwrap();
    assert!(!kubeconfig_usable(&dir.path().join("bad")));
    let cluster = BootstrapCluster {
        server: "https://127.0.0.1:6443".into(),
        ca_data: Some("Q0E=".into()),
        ca_file: None,
    };
    // Points at a certificate file that does not exist.
    let text = kubeconfig_text(&cluster, &dir.path().join(CURRENT_PEM));
    std::fs::write(dir.path().join("kc"), &text).unwrap();
    assert!(!kubeconfig_usable(&dir.path().join("kc")));
    assert!(text.contains("client-key: ") && text.contains("certificate-authority-data: Q0E="));
}

/// An ECDSA pair valid from `nb` to `na` (unix seconds), PEM.
fn pair_between(nb: i64, na: i64) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:node:worker-1");
    // Whole days (UTC) are precise enough for these tests.
    let day_of = |t: i64| {
        let d = jiff::Timestamp::from_second(t)
            .unwrap()
            .to_zoned(jiff::tz::TimeZone::UTC)
            .date();
        rcgen::date_time_ymd(d.year().into(), d.month() as u8, d.day() as u8)
    };
    params.not_before = day_of(nb);
    params.not_after = day_of(na);
    (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
}

fn kubeconfig_with(user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: https://127.0.0.1:6443\n  name: c\ncontexts:\n- context:\n    cluster: c\n    user: u\n  name: ctx\ncurrent-context: ctx\nusers:\n- name: u\n  user:\n{user}"
    )
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

const DAY: i64 = 86400;

/// Expired: unusable. Not valid yet: usable, as upstream (only expiry is checked).
#[test]
fn expired_certificate_is_unusable() {
    let dir = tempfile::tempdir().unwrap();
    let now = crate::clock::unix_now();
    for (name, nb, na) in [
        ("expired", now - 30 * DAY, now - 2 * DAY),
        ("future", now + 2 * DAY, now + 30 * DAY),
    ] {
        let (cert, key) = pair_between(nb, na);
        let pem = dir.path().join(format!("{name}.pem"));
        std::fs::write(&pem, format!("{cert}{key}")).unwrap();
        let kc = dir.path().join(format!("{name}.conf"));
        let p = pem.display();
        std::fs::write(
            &kc,
            kubeconfig_with(&format!(
                "    client-certificate: {p}\n    client-key: {p}\n"
            )),
        )
        .unwrap();
        if name == "future" {
            assert!(
                kubeconfig_usable(&kc),
                "only expiry makes a certificate unusable"
            );
            continue;
        }
        let why = check_kubeconfig(&kc).unwrap_err();
        assert!(matches!(why, Unusable::Expired { .. }), "{why}");
        assert!(why.to_string().contains(&p.to_string()), "{why}");
        assert!(!kubeconfig_usable(&kc));
    }
}

#[test]
fn mismatched_pair_is_unusable_and_matching_pair_is_usable() {
    let dir = tempfile::tempdir().unwrap();
    let now = crate::clock::unix_now();
    let (cert_a, key_a) = pair_between(now - DAY, now + 300 * DAY);
    let (_, key_b) = pair_between(now - DAY, now + 300 * DAY);
    let (crt, good, bad) = (
        dir.path().join("a.crt"),
        dir.path().join("a.key"),
        dir.path().join("b.key"),
    );
    std::fs::write(&crt, &cert_a).unwrap();
    std::fs::write(&good, &key_a).unwrap();
    std::fs::write(&bad, &key_b).unwrap();
    let kc = dir.path().join("kubelet.conf");

    // Files: the pair matches.
    let files = |key: &Path| {
        kubeconfig_with(&format!(
            "    client-certificate: {}\n    client-key: {}\n",
            crt.display(),
            key.display()
        ))
    };
    std::fs::write(&kc, files(&good)).unwrap();
    check_kubeconfig(&kc).unwrap();
    // Files: another key. The answer names both files.
    std::fs::write(&kc, files(&bad)).unwrap();
    let why = check_kubeconfig(&kc).unwrap_err();
    assert!(matches!(why, Unusable::KeyMismatch { .. }), "{why}");
    let msg = why.to_string();
    assert!(
        msg.contains(&crt.display().to_string()) && msg.contains(&bad.display().to_string()),
        "{msg}"
    );

    // Inline data, as `kubeadm init` writes it.
    let inline = |key: &str| {
        kubeconfig_with(&format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(&cert_a),
            b64(key)
        ))
    };
    std::fs::write(&kc, inline(&key_a)).unwrap();
    check_kubeconfig(&kc).unwrap();
    std::fs::write(&kc, inline(&key_b)).unwrap();
    let why = check_kubeconfig(&kc).unwrap_err();
    assert!(matches!(why, Unusable::KeyMismatch { .. }), "{why}");
    assert!(why.to_string().contains("client-key-data in "), "{why}");

    // A certificate without a key, and a token user.
    std::fs::write(
        &kc,
        kubeconfig_with(&format!("    client-certificate: {}\n", crt.display())),
    )
    .unwrap();
    assert!(!kubeconfig_usable(&kc));
    std::fs::write(&kc, kubeconfig_with("    token: abc\n")).unwrap();
    assert!(kubeconfig_usable(&kc));

    // The key-pair check on its own.
    assert_eq!(check_key_pair(cert_a.as_bytes(), key_a.as_bytes()), Ok(()));
    assert_eq!(
        check_key_pair(cert_a.as_bytes(), key_b.as_bytes()),
        Err(PairError::Mismatch)
    );
    assert_eq!(
        check_key_pair(cert_a.as_bytes(), b""),
        Err(PairError::NoKey)
    );
}

/// An apiserver serving only the CSR API over plain HTTP: it accepts the bootstrap token
/// (`Bearer boot-token`) and nothing else, signs each CSR at once with its own CA, and
/// records (Authorization, CSR name) of every create.
#[derive(Clone)]
struct FakeApi {
    ca_key: std::sync::Arc<rcgen::KeyPair>,
    csrs: std::sync::Arc<
        std::sync::Mutex<std::collections::HashMap<String, CertificateSigningRequest>>,
    >,
    created: std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>,
}

const CSR_PATH: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

struct CsrPublicKey(Vec<u8>);

impl rcgen::PublicKeyData for CsrPublicKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }
    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

impl FakeApi {
    async fn start() -> (String, FakeApi) {
        use axum::routing::{get, post};
        let api = FakeApi {
            ca_key: std::sync::Arc::new(rcgen::KeyPair::generate().unwrap()),
            csrs: Default::default(),
            created: Default::default(),
        };
        let app = axum::Router::new()
            .route(CSR_PATH, post(Self::create))
            .route(&format!("{CSR_PATH}/{{name}}"), get(Self::get))
            .with_state(api.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}"), api)
    }

    fn authorized(h: &http::HeaderMap) -> bool {
        h.get(http::header::AUTHORIZATION)
            .is_some_and(|v| v == "Bearer boot-token")
    }

    fn unauthorized() -> axum::response::Response {
        use axum::response::IntoResponse as _;
        let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": "Unauthorized", "reason": "Unauthorized", "code": 401});
        (http::StatusCode::UNAUTHORIZED, axum::Json(status)).into_response()
    }

    fn sign(&self, csr_pem: &[u8]) -> String {
        use x509_parser::prelude::FromDer;
        let (_, pem) = x509_parser::pem::parse_x509_pem(csr_pem).unwrap();
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
                .unwrap();
        let public = CsrPublicKey(
            csr.certification_request_info
                .subject_pki
                .subject_public_key
                .data
                .to_vec(),
        );
        let mut ca = rcgen::CertificateParams::new(vec![]).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let issuer = rcgen::Issuer::new(ca, &*self.ca_key);
        let mut leaf = rcgen::CertificateParams::new(vec![]).unwrap();
        leaf.distinguished_name.push(
            rcgen::DnType::CommonName,
            csr.certification_request_info.subject.to_string(),
        );
        leaf.signed_by(&public, &issuer).unwrap().pem()
    }

    async fn create(
        axum::extract::State(api): axum::extract::State<FakeApi>,
        headers: http::HeaderMap,
        axum::Json(mut csr): axum::Json<CertificateSigningRequest>,
    ) -> axum::response::Response {
        use axum::response::IntoResponse as _;
        let auth = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("<none>")
            .to_string();
        let name = csr.metadata.name.clone().unwrap_or_else(|| {
            let prefix = csr.metadata.generate_name.clone().unwrap_or_default();
            format!("{prefix}{}", api.csrs.lock().unwrap().len())
        });
        api.created.lock().unwrap().push((auth, name.clone()));
        if !Self::authorized(&headers) {
            return Self::unauthorized();
        }
        csr.metadata.name = Some(name.clone());
        let cert = api.sign(&csr.spec.request.0);
        csr.status = Some(
            k8s_openapi::api::certificates::v1::CertificateSigningRequestStatus {
                certificate: Some(ByteString(cert.into_bytes())),
                ..Default::default()
            },
        );
        api.csrs.lock().unwrap().insert(name, csr.clone());
        (http::StatusCode::CREATED, axum::Json(csr)).into_response()
    }

    async fn get(
        axum::extract::State(api): axum::extract::State<FakeApi>,
        axum::extract::Path(name): axum::extract::Path<String>,
        headers: http::HeaderMap,
    ) -> axum::response::Response {
        use axum::response::IntoResponse as _;
        if !Self::authorized(&headers) {
            return Self::unauthorized();
        }
        match api.csrs.lock().unwrap().get(&name) {
            Some(csr) => axum::Json(csr.clone()).into_response(),
            None => http::StatusCode::NOT_FOUND.into_response(),
        }
    }

    fn created(&self) -> Vec<(String, String)> {
        self.created.lock().unwrap().clone()
    }
}

/// `<dir>/bootstrap.conf` for `server` with the bootstrap token, and the settings using it.
fn bootstrap_settings(dir: &Path, server: &str) -> BootstrapSettings {
    let boot = dir.join("bootstrap.conf");
    std::fs::write(
            &boot,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: {server}\n  name: c\ncontexts:\n- context:\n    cluster: c\n    user: boot\n  name: boot\ncurrent-context: boot\nusers:\n- name: boot\n  user:\n    token: boot-token\n"
            ),
        )
        .unwrap();
    BootstrapSettings {
        node_name: "worker-1".into(),
        kubeconfig: dir.join("kubelet.conf"),
        bootstrap_kubeconfig: Some(boot),
        cert_dir: dir.join("pki"),
    }
}

async fn ensure(s: &BootstrapSettings) -> Result<(), BootstrapError> {
    let cancel = CancellationToken::new();
    tokio::time::timeout(Duration::from_secs(60), ensure_kubeconfig(s, &cancel))
        .await
        .expect("bootstrap hung")
}

#[tokio::test]
async fn expired_kubeconfig_is_replaced_through_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    let (server, api) = FakeApi::start().await;
    let s = bootstrap_settings(dir.path(), &server);
    let now = crate::clock::unix_now();
    let (old_cert, old_key) = pair_between(now - 60 * DAY, now - DAY);
    let current = store_pair(&s.cert_dir, &old_cert, &old_key).unwrap();
    let cluster = bootstrap_cluster(s.bootstrap_kubeconfig.as_ref().unwrap()).unwrap();
    write_kubeconfig(&s.kubeconfig, &kubeconfig_text(&cluster, &current)).unwrap();
    assert!(matches!(
        check_kubeconfig(&s.kubeconfig),
        Err(Unusable::Expired { .. })
    ));

    ensure(&s).await.unwrap();

    // One bootstrap CSR (the digested name), sent with the bootstrap token.
    let created = api.created();
    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(created[0].0, "Bearer boot-token");
    assert!(created[0].1.starts_with("node-csr-"), "{created:?}");
    // The kubeconfig now holds a valid, matching pair that is not the old one.
    check_kubeconfig(&s.kubeconfig).unwrap();
    let pem = std::fs::read_to_string(&current).unwrap();
    assert!(!pem.contains(old_cert.trim()));
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&s.kubeconfig), 0o600);
    assert_eq!(mode(&current), 0o600);
    // Nothing left to do on the next start.
    ensure(&s).await.unwrap();
    assert_eq!(api.created().len(), 1);
}

#[tokio::test]
async fn mismatched_kubeconfig_and_stored_pair_are_replaced_through_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    let (server, api) = FakeApi::start().await;
    let s = bootstrap_settings(dir.path(), &server);
    let now = crate::clock::unix_now();
    let (cert_a, _) = pair_between(now - DAY, now + 300 * DAY);
    let (_, key_b) = pair_between(now - DAY, now + 300 * DAY);
    // Both the kubeconfig and the stored pair hold a certificate with someone else's key
    // (which a plain validity check would take for usable).
    let current = store_pair(&s.cert_dir, &cert_a, &key_b).unwrap();
    let cluster = bootstrap_cluster(s.bootstrap_kubeconfig.as_ref().unwrap()).unwrap();
    write_kubeconfig(&s.kubeconfig, &kubeconfig_text(&cluster, &current)).unwrap();
    assert!(matches!(
        check_kubeconfig(&s.kubeconfig),
        Err(Unusable::KeyMismatch { .. })
    ));
    assert!(matches!(
        check_current_pair(&s.cert_dir),
        Err(Unusable::KeyMismatch { .. })
    ));

    ensure(&s).await.unwrap();

    let created = api.created();
    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(created[0].0, "Bearer boot-token");
    check_kubeconfig(&s.kubeconfig).unwrap();
    check_current_pair(&s.cert_dir).unwrap();
}

#[tokio::test]
async fn expired_certificate_is_rotated_with_the_bootstrap_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let (server, api) = FakeApi::start().await;
    let s = bootstrap_settings(dir.path(), &server);
    let now = crate::clock::unix_now();
    // The agent ran on while the certificate expired (rotation kept failing, or the
    // machine slept): the apiserver refuses it, so the renewal must use the bootstrap token.
    let (old_cert, old_key) = pair_between(now - 60 * DAY, now - DAY);
    let current = store_pair(&s.cert_dir, &old_cert, &old_key).unwrap();
    let cluster = bootstrap_cluster(s.bootstrap_kubeconfig.as_ref().unwrap()).unwrap();
    write_kubeconfig(&s.kubeconfig, &kubeconfig_text(&cluster, &current)).unwrap();
    let limiter = RateLimitLayer::new(50.0, 100);
    let (handle, publisher) =
        client::ClientHandle::new(client::build(&s.kubeconfig, &limiter).await.unwrap());
    let rotator = Rotator {
        node_name: s.node_name.clone(),
        kubeconfig: s.kubeconfig.clone(),
        bootstrap_kubeconfig: s.bootstrap_kubeconfig.clone(),
        cert_dir: s.cert_dir.clone(),
        limiter,
        publisher,
        handle,
    };
    let cancel = CancellationToken::new();
    tokio::time::timeout(Duration::from_secs(60), rotator.rotate(&cancel))
        .await
        .expect("rotation hung")
        .unwrap();

    // A rotation CSR (generateName), sent with the bootstrap token.
    let created = api.created();
    assert_eq!(created.len(), 1, "{created:?}");
    assert_eq!(created[0].0, "Bearer boot-token");
    assert!(created[0].1.starts_with("csr-"), "{created:?}");
    check_current_pair(&s.cert_dir).unwrap();
    check_kubeconfig(&s.kubeconfig).unwrap();
}
