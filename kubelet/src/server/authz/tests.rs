use super::*;
use crate::server::auth_review::fake::FakeReview;
use http::{HeaderMap, HeaderValue, Method};
use rustls::pki_types::CertificateDer;

fn settings(anonymous: bool, mode: AuthzMode) -> AuthSettings {
    AuthSettings {
        anonymous,
        mode,
        ..AuthSettings::secure_defaults()
    }
}

fn with_fake(s: AuthSettings) -> (Auth, Arc<FakeReview>) {
    let fake = Arc::new(FakeReview::default());
    let auth = Auth::new(s, "node-a", Some(fake.clone() as Arc<dyn AuthReview>)).unwrap();
    (auth, fake)
}

fn bearer(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    h
}

async fn ask(a: &Auth, m: Method, path: &str, h: &HeaderMap) -> (u16, String) {
    ask_cert(a, m, path, h, None).await
}

async fn ask_cert(
    a: &Auth,
    m: Method,
    path: &str,
    h: &HeaderMap,
    certs: Option<&[CertificateDer<'static>]>,
) -> (u16, String) {
    let d = a
        .decide(RequestInfo {
            method: &m,
            path,
            headers: h,
            peer_certs: certs,
        })
        .await;
    match d {
        Decision::Allow { .. } => (200, String::new()),
        Decision::Deny { status, body } => (status.as_u16(), body),
    }
}

#[test]
fn attributes_follow_upstream_mapping() {
    let cases: &[(&str, &[&str])] = &[
        ("/pods", &["pods", "proxy"]),
        ("/pods/", &["pods", "proxy"]),
        ("/runningpods/", &["pods", "proxy"]),
        ("/healthz", &["healthz", "proxy"]),
        ("/healthz/ping", &["healthz", "proxy"]),
        ("/configz", &["configz", "proxy"]),
        ("/stats/summary", &["stats"]),
        ("/metrics", &["metrics"]),
        ("/metrics/cadvisor", &["metrics"]),
        ("/logs/syslog", &["log"]),
        ("/checkpoint/ns/p/c", &["checkpoint"]),
        ("/containerLogs/ns/p/c", &["proxy"]),
        ("/exec/ns/p/c", &["proxy"]),
        ("/podsx", &["proxy"]),
        ("/metricsfoo", &["proxy"]),
    ];
    for (path, want) in cases {
        assert_eq!(&subresources(path), want, "{path}");
    }
    let none = HeaderMap::new();
    let mut ws = HeaderMap::new();
    ws.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("Upgrade"),
    );
    ws.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
    assert_eq!(api_verb(&Method::GET, "/pods", &none), "get");
    assert_eq!(api_verb(&Method::POST, "/exec/n/p/c", &none), "create");
    assert_eq!(api_verb(&Method::GET, "/exec/n/p/c", &none), "get");
    assert_eq!(api_verb(&Method::GET, "/exec/n/p/c", &ws), "create");
    assert_eq!(api_verb(&Method::GET, "/attach/n/p/c", &ws), "create");
    assert_eq!(api_verb(&Method::GET, "/portForward/n/p", &ws), "create");
    assert_eq!(api_verb(&Method::GET, "/pods", &ws), "get");
    assert_eq!(api_verb(&Method::PUT, "/x", &none), "update");
    assert_eq!(api_verb(&Method::PATCH, "/x", &none), "patch");
    assert_eq!(api_verb(&Method::DELETE, "/x", &none), "delete");
}

#[tokio::test]
async fn authn_authz_table() {
    let (a, fake) = with_fake(settings(false, AuthzMode::Webhook));
    fake.token("good", "alice", &["devs"]);
    fake.grant("alice", "get", "pods");
    fake.grant("alice", "get", "metrics");
    let none = HeaderMap::new();
    // No credentials, anonymous off: 401.
    assert_eq!(
        ask(&a, Method::GET, "/pods", &none).await,
        (401, "Unauthorized".into())
    );
    // A token TokenReview rejects: 401.
    assert_eq!(ask(&a, Method::GET, "/pods", &bearer("bad")).await.0, 401);
    // A good token: per-subresource decisions.
    assert_eq!(ask(&a, Method::GET, "/pods", &bearer("good")).await.0, 200);
    assert_eq!(
        ask(&a, Method::GET, "/metrics", &bearer("good")).await.0,
        200
    );
    assert_eq!(
        ask(&a, Method::GET, "/configz", &bearer("good")).await,
        (
            403,
            "Forbidden (user=alice, verb=get, resource=nodes, subresource(s)=[configz proxy])"
                .into()
        )
    );
    assert_eq!(
        ask(&a, Method::POST, "/exec/n/p/c", &bearer("good"))
            .await
            .1,
        "Forbidden (user=alice, verb=create, resource=nodes, subresource(s)=[proxy])"
    );
    // `proxy` covers every path (the fallback attribute).
    fake.grant("alice", "get", "proxy");
    assert_eq!(
        ask(&a, Method::GET, "/configz", &bearer("good")).await.0,
        403,
        "the denial is cached for cacheUnauthorizedTTL"
    );
    // A fresh request for another verb is decided anew and `proxy` admits it.
    fake.grant("alice", "delete", "proxy");
    assert_eq!(
        ask(&a, Method::DELETE, "/healthz", &bearer("good")).await.0,
        200
    );
}

#[tokio::test]
async fn anonymous_only_without_credentials() {
    let (a, fake) = with_fake(settings(true, AuthzMode::Webhook));
    fake.grant("system:anonymous", "get", "healthz");
    let none = HeaderMap::new();
    assert_eq!(ask(&a, Method::GET, "/healthz", &none).await.0, 200);
    assert_eq!(
        ask(&a, Method::GET, "/pods", &none).await.1,
        "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[pods proxy])"
    );
    // A bad token is not downgraded to anonymous.
    assert_eq!(ask(&a, Method::GET, "/healthz", &bearer("x")).await.0, 401);
    // AlwaysAllow serves anonymous requests only when configured.
    let (a, _) = with_fake(settings(true, AuthzMode::AlwaysAllow));
    assert_eq!(ask(&a, Method::GET, "/configz", &none).await.0, 200);
    let (a, _) = with_fake(settings(false, AuthzMode::AlwaysAllow));
    assert_eq!(ask(&a, Method::GET, "/configz", &none).await.0, 401);
}

#[tokio::test]
async fn apiserver_down_fails_closed_and_errors_are_not_cached() {
    let (a, fake) = with_fake(settings(false, AuthzMode::Webhook));
    fake.token("t", "bob", &[]);
    fake.grant("bob", "get", "pods");
    assert_eq!(ask(&a, Method::GET, "/pods", &bearer("t")).await.0, 200);
    fake.set_down(true);
    // Cached identity and decision keep working.
    assert_eq!(ask(&a, Method::GET, "/pods", &bearer("t")).await.0, 200);
    // A fresh decision cannot be made: 500, never an allow.
    assert_eq!(
        ask(&a, Method::GET, "/metrics", &bearer("t")).await,
        (
            500,
            "Authorization error (user=bob, verb=get, resource=nodes, subresource=metrics)".into()
        )
    );
    // A fresh token cannot be reviewed: 401.
    fake.token("t2", "bob", &[]);
    assert_eq!(ask(&a, Method::GET, "/pods", &bearer("t2")).await.0, 401);
    fake.set_down(false);
    fake.grant("bob", "get", "metrics");
    assert_eq!(ask(&a, Method::GET, "/metrics", &bearer("t")).await.0, 200);
    assert_eq!(ask(&a, Method::GET, "/pods", &bearer("t2")).await.0, 200);
}

#[tokio::test]
async fn caches_spare_reviews_and_zero_ttl_disables_them() {
    use std::sync::atomic::Ordering::SeqCst;
    let (a, fake) = with_fake(settings(false, AuthzMode::Webhook));
    fake.token("t", "carol", &[]);
    fake.grant("carol", "get", "stats");
    for _ in 0..10 {
        assert_eq!(
            ask(&a, Method::GET, "/stats/summary", &bearer("t")).await.0,
            200
        );
    }
    assert_eq!(fake.token_calls.load(SeqCst), 1);
    assert_eq!(fake.access_calls.load(SeqCst), 1);
    let ((hits, misses), (thits, tmisses)) = a.cache_stats();
    assert_eq!((hits, misses, thits, tmisses), (9, 1, 9, 1));

    let mut s = settings(false, AuthzMode::Webhook);
    s.cache_ttl = Duration::ZERO;
    s.cache_authorized_ttl = Duration::ZERO;
    let (a, fake) = with_fake(s);
    fake.token("t", "carol", &[]);
    fake.grant("carol", "get", "stats");
    for _ in 0..3 {
        assert_eq!(ask(&a, Method::GET, "/stats", &bearer("t")).await.0, 200);
    }
    assert_eq!(fake.token_calls.load(SeqCst), 3);
    assert_eq!(fake.access_calls.load(SeqCst), 3);
}

#[test]
fn ttl_cache_expires() {
    let c: TtlCache<&str, bool> = TtlCache::default();
    c.put("a", true, Duration::from_millis(30));
    assert_eq!(c.get(&"a"), Some(true));
    std::thread::sleep(Duration::from_millis(40));
    assert_eq!(c.get(&"a"), None);
}

struct Ca {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pem: String,
}

fn ca() -> Ca {
    let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "test-ca");
    let key = rcgen::KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    Ca { params, key, pem }
}

fn client_cert(ca: &Ca, cn: &str, orgs: &[&str]) -> Vec<CertificateDer<'static>> {
    client_cert_cn(ca, Some(cn), orgs)
}

/// A client certificate of `ca`; `cn` None: the subject has no CommonName at all.
fn client_cert_cn(ca: &Ca, cn: Option<&str>, orgs: &[&str]) -> Vec<CertificateDer<'static>> {
    let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
    p.distinguished_name = rcgen::DistinguishedName::new();
    for o in orgs {
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, *o);
    }
    if let Some(cn) = cn {
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
    }
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().unwrap();
    let issuer = rcgen::Issuer::from_params(&ca.params, &ca.key);
    vec![p.signed_by(&key, &issuer).unwrap().der().clone()]
}

#[tokio::test]
async fn client_certificates_of_the_client_ca_authenticate() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = ca();
    let other = ca();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &cluster.pem).unwrap();
    let mut s = settings(true, AuthzMode::Webhook);
    s.client_ca_file = Some(ca_file.display().to_string());
    let (a, fake) = with_fake(s);
    fake.grant("admin", "get", "pods");
    let none = HeaderMap::new();
    let good = client_cert(&cluster, "admin", &["system:masters"]);
    assert_eq!(
        ask_cert(&a, Method::GET, "/pods", &none, Some(&good))
            .await
            .0,
        200
    );
    let x509 = super::super::authn::X509::from_pem(cluster.pem.as_bytes()).unwrap();
    let u = x509.authenticate(&good).unwrap().unwrap();
    assert_eq!(u.name, "admin");
    assert_eq!(u.groups, ["system:masters", "system:authenticated"]);
    // A certificate from another CA is a 401 even though anonymous is enabled.
    let stranger = client_cert(&other, "admin", &[]);
    assert_eq!(
        ask_cert(&a, Method::GET, "/pods", &none, Some(&stranger))
            .await
            .0,
        401
    );
    // A valid certificate without rights: 403.
    let nobody = client_cert(&cluster, "nobody", &[]);
    assert_eq!(
        ask_cert(&a, Method::GET, "/pods", &none, Some(&nobody))
            .await
            .1,
        "Forbidden (user=nobody, verb=get, resource=nodes, subresource(s)=[pods proxy])"
    );
}

/// Issue 24: a certificate of the client CA whose subject has no CommonName, or an empty one,
/// is not an identity (upstream's CommonNameUserConversion answers "not authenticated"): a 401
/// without anonymous, never user "" with the certificate's O groups.
#[tokio::test]
async fn a_client_certificate_without_a_common_name_does_not_authenticate() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = ca();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &cluster.pem).unwrap();
    let none = HeaderMap::new();
    let no_cn = client_cert_cn(&cluster, None, &["system:masters"]);
    let empty_cn = client_cert_cn(&cluster, Some(""), &["system:masters"]);
    let x509 = super::super::authn::X509::from_pem(cluster.pem.as_bytes()).unwrap();
    for (what, chain) in [("no CN", &no_cn), ("empty CN", &empty_cn)] {
        assert!(
            matches!(x509.authenticate(chain), Ok(None)),
            "{what}: not an identity"
        );
        // AlwaysAllow lets any identity through: only authentication stands in the way.
        for mode in [AuthzMode::AlwaysAllow, AuthzMode::Webhook] {
            let mut s = settings(false, mode);
            s.client_ca_file = Some(ca_file.display().to_string());
            let (a, fake) = with_fake(s);
            // The fake grants by user name: today's user "" would be let in.
            fake.grant("", "get", "configz");
            let (code, body) = ask_cert(&a, Method::GET, "/configz", &none, Some(chain)).await;
            assert_eq!(
                (code, body.as_str()),
                (401, "Unauthorized"),
                "{what} {mode:?}"
            );
        }
        // With anonymous enabled the request is anonymous, as upstream's union falls through.
        let mut s = settings(true, AuthzMode::Webhook);
        s.client_ca_file = Some(ca_file.display().to_string());
        let (a, fake) = with_fake(s);
        fake.grant("", "get", "configz");
        fake.grant("system:anonymous", "get", "healthz");
        assert_eq!(
            ask_cert(&a, Method::GET, "/healthz", &none, Some(chain))
                .await
                .0,
            200,
            "{what}: anonymous"
        );
        assert_eq!(
            ask_cert(&a, Method::GET, "/configz", &none, Some(chain))
                .await
                .1,
            "Forbidden (user=system:anonymous, verb=get, resource=nodes, subresource(s)=[configz proxy])",
            "{what}: anonymous, not the certificate's groups"
        );
    }
}

#[tokio::test]
async fn a_changed_client_ca_file_applies_and_a_broken_one_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (ca(), ca());
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &old.pem).unwrap();
    let x509 = super::super::authn::X509::from_file(ca_file.to_str().unwrap()).unwrap();
    let (by_old, by_new) = (client_cert(&old, "u", &[]), client_cert(&new, "u", &[]));
    assert!(x509.authenticate(&by_old).unwrap().is_some());
    assert!(x509.authenticate(&by_new).is_err());
    assert!(!x509.reload().await.unwrap(), "unchanged: nothing to do");
    std::fs::write(&ca_file, &new.pem).unwrap();
    assert!(x509.reload().await.unwrap());
    assert!(x509.authenticate(&by_new).is_ok(), "the rotated CA applies");
    assert!(
        x509.authenticate(&by_old).is_err(),
        "the old CA no longer does"
    );
    std::fs::write(&ca_file, "garbage").unwrap();
    let e = x509.reload().await.unwrap_err().to_string();
    assert!(e.contains("no CA certificate found"), "{e}");
    assert!(
        x509.authenticate(&by_new).is_ok(),
        "the bundle in use stays"
    );
}

#[test]
fn refusals_name_the_problem() {
    let err = |s: AuthSettings| Auth::new(s, "n", None).err().unwrap().to_string();
    let mut s = settings(true, AuthzMode::Webhook);
    assert_eq!(
        err(s.clone()),
        "no client provided, cannot use webhook authentication"
    );
    s.webhook = false;
    assert_eq!(
        err(s.clone()),
        "no client provided, cannot use webhook authorization"
    );
    s.mode = AuthzMode::AlwaysAllow;
    assert!(Auth::new(s.clone(), "n", None).is_ok());
    s.client_ca_file = Some("/nonexistent/ca.crt".into());
    assert!(err(s.clone()).contains("clientCAFile /nonexistent/ca.crt"));
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.crt");
    std::fs::write(&empty, "").unwrap();
    s.client_ca_file = Some(empty.display().to_string());
    assert!(err(s).contains("no CA certificate found"));
}
