//! :10250 authentication, as upstream's delegating authenticator: x509 client certificates
//! (against `authentication.x509.clientCAFile`), then bearer tokens through TokenReview
//! (`authentication.webhook.enabled`, answers cached for `cacheTTL`), and anonymous only when
//! `authentication.anonymous.enabled` and the request carried no credentials at all.
//!
//! The TLS layer asks every client for a certificate and accepts any (it only checks that the
//! client holds the key); the chain is verified here, so an unknown CA is a 401, not a failed
//! handshake, as upstream.

use super::cache::TtlCache;
use crate::server::auth_review::{AuthReview, TokenOutcome, UserInfo};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use std::sync::Arc;
use std::time::Duration;

/// Upstream's anonymous identity.
pub const ANONYMOUS_USER: &str = "system:anonymous";
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// Added to every authenticated (non-anonymous) user.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// Why a request was not authenticated (every variant is a 401).
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthnError {
    #[error("no credentials and anonymous authentication is disabled")]
    NoCredentials,
    #[error("x509: {0}")]
    Certificate(String),
    #[error("invalid bearer token{}", if .0.is_empty() { String::new() } else { format!(": {}", .0) })]
    InvalidToken(String),
    #[error("{0}")]
    Review(String),
    #[error("bearer tokens are not accepted: authentication.webhook.enabled is false")]
    TokenWebhookDisabled,
}

/// Why a client CA bundle makes no verifier.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CaBundleError {
    /// A PEM block does not parse.
    #[error("{0}")]
    Pem(String),
    /// A certificate is not a usable trust anchor.
    #[error("{0}")]
    Certificate(String),
    #[error("no CA certificate found")]
    Empty,
    #[error("{0}")]
    Verifier(String),
}

/// Loading the client CA bundle failed (the agent refuses to start).
#[derive(Debug, thiserror::Error)]
#[error("authentication.x509.clientCAFile {path}: {message}")]
pub struct ClientCaError {
    pub path: String,
    pub message: String,
}

/// The x509 authenticator: a webpki verifier over the client CA bundle. A bundle read from a
/// file is re-read by [`X509::reload`] (the server polls it), so a rotated cluster CA applies
/// without a restart, as upstream's dynamic CA file content does; a broken new bundle is
/// refused and the one in use kept.
pub struct X509 {
    verifier: std::sync::RwLock<Arc<dyn ClientCertVerifier>>,
    file: Option<CaFile>,
}

struct CaFile {
    path: String,
    /// The bundle the verifier was built from.
    pem: std::sync::Mutex<Vec<u8>>,
}

impl X509 {
    /// Reads the PEM bundle at `path`.
    pub fn from_file(path: &str) -> Result<X509, ClientCaError> {
        let err = |message: String| ClientCaError {
            path: path.into(),
            message,
        };
        let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let verifier = verifier(&pem).map_err(|e| err(e.to_string()))?;
        Ok(X509 {
            verifier: std::sync::RwLock::new(verifier),
            file: Some(CaFile {
                path: path.into(),
                pem: std::sync::Mutex::new(pem),
            }),
        })
    }

    pub fn from_pem(pem: &[u8]) -> Result<X509, CaBundleError> {
        Ok(X509 {
            verifier: std::sync::RwLock::new(verifier(pem)?),
            file: None,
        })
    }

    /// Re-reads the bundle file: Ok(true) when it changed and now applies, Ok(false) when it
    /// is unchanged (or not from a file), Err when the new content is unusable (the bundle in
    /// use stays).
    pub async fn reload(&self) -> Result<bool, ClientCaError> {
        let Some(file) = &self.file else {
            return Ok(false);
        };
        let err = |message: String| ClientCaError {
            path: file.path.clone(),
            message,
        };
        let path = file.path.clone();
        let pem = tokio::task::spawn_blocking(move || std::fs::read(path))
            .await
            .map_err(|e| err(e.to_string()))?
            .map_err(|e| err(e.to_string()))?;
        if *file.pem.lock().unwrap_or_else(|e| e.into_inner()) == pem {
            return Ok(false);
        }
        let v = verifier(&pem).map_err(|e| err(e.to_string()))?;
        *self.verifier.write().unwrap_or_else(|e| e.into_inner()) = v;
        *file.pem.lock().unwrap_or_else(|e| e.into_inner()) = pem;
        Ok(true)
    }

    /// Verifies the presented chain (leaf first): `CN` is the user name, each `O` a group.
    /// Ok(None) for a verified certificate whose subject has no CommonName or an empty one: as
    /// upstream's CommonNameUserConversion, it names no user, so it does not authenticate (and
    /// is no error either: the other authenticators, then anonymous, still apply).
    pub fn authenticate(
        &self,
        chain: &[CertificateDer<'static>],
    ) -> Result<Option<UserInfo>, AuthnError> {
        let (leaf, rest) = chain
            .split_first()
            .ok_or_else(|| AuthnError::Certificate("empty chain".into()))?;
        let verifier = self
            .verifier
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        verifier
            .verify_client_cert(leaf, rest, UnixTime::now())
            .map_err(|e| AuthnError::Certificate(e.to_string()))?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| AuthnError::Certificate(e.to_string()))?;
        let subject = cert.subject();
        // Go's pkix.Name keeps the last CommonName of the subject; one that is not a string
        // type names no one.
        let name = match subject.iter_common_name().last().map(|cn| cn.as_str()) {
            Some(Ok(n)) if !n.is_empty() => n.to_string(),
            _ => return Ok(None),
        };
        let mut groups: Vec<String> = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_string))
            .collect();
        groups.push(AUTHENTICATED_GROUP.into());
        Ok(Some(UserInfo {
            name,
            groups,
            ..Default::default()
        }))
    }
}

/// A webpki client verifier over the CA certificates in `pem`.
fn verifier(pem: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, CaBundleError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &pem[..]) {
        let cert = cert.map_err(|e| CaBundleError::Pem(e.to_string()))?;
        roots
            .add(cert)
            .map_err(|e| CaBundleError::Certificate(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(CaBundleError::Empty);
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| CaBundleError::Verifier(e.to_string()))
}

/// The authentication settings in force.
pub struct Authenticator {
    pub anonymous: bool,
    pub x509: Option<X509>,
    /// TokenReview client when `authentication.webhook.enabled`.
    pub tokens: Option<Arc<dyn AuthReview>>,
    /// Answers by token hash; a rejection as its [`AuthnError::InvalidToken`].
    cache: TtlCache<String, Result<UserInfo, AuthnError>>,
    cache_ttl: Duration,
}

impl Authenticator {
    pub fn new(
        anonymous: bool,
        x509: Option<X509>,
        tokens: Option<Arc<dyn AuthReview>>,
        cache_ttl: Duration,
    ) -> Authenticator {
        Authenticator {
            anonymous,
            x509,
            tokens,
            cache: TtlCache::default(),
            cache_ttl,
        }
    }

    /// (hits, misses) of the token cache.
    pub fn cache_stats(&self) -> (u64, u64) {
        self.cache.stats()
    }

    /// Upstream's union: certificate, then token; anonymous only when neither failed (a bad
    /// certificate or token is a 401 even when anonymous is enabled; a good certificate
    /// without a CommonName is no credential).
    pub async fn authenticate(
        &self,
        headers: &http::HeaderMap,
        peer_certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<UserInfo, AuthnError> {
        let mut errors = Vec::new();
        if let (Some(x509), Some(chain)) = (&self.x509, peer_certs.filter(|c| !c.is_empty())) {
            match x509.authenticate(chain) {
                Ok(Some(u)) => return Ok(u),
                Ok(None) => tracing::debug!("client certificate without a CommonName: no user"),
                Err(e) => errors.push(e),
            }
        }
        if let Some(token) = bearer_token(headers) {
            match &self.tokens {
                Some(review) => match self.review_token(review.as_ref(), token).await {
                    Ok(u) => return Ok(u),
                    Err(e) => errors.push(e),
                },
                None => tracing::debug!("{}", AuthnError::TokenWebhookDisabled),
            }
        }
        if let Some(e) = errors.into_iter().next() {
            return Err(e);
        }
        if self.anonymous {
            return Ok(UserInfo {
                name: ANONYMOUS_USER.into(),
                groups: vec![UNAUTHENTICATED_GROUP.into()],
                ..Default::default()
            });
        }
        Err(AuthnError::NoCredentials)
    }

    async fn review_token(
        &self,
        review: &dyn AuthReview,
        token: &str,
    ) -> Result<UserInfo, AuthnError> {
        let key = token_key(token);
        if let Some(hit) = self.cache.get(&key) {
            return hit;
        }
        // Errors (no answer) are not cached; answers, good or bad, are kept for cacheTTL.
        let answer = match review.review_token(token.to_string()).await {
            Ok(TokenOutcome::Authenticated(mut u)) => {
                if !u.groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
                    u.groups.push(AUTHENTICATED_GROUP.into());
                }
                Ok(u)
            }
            Ok(TokenOutcome::Rejected(why)) => Err(AuthnError::InvalidToken(why)),
            Err(e) => return Err(AuthnError::Review(e.to_string())),
        };
        self.cache.put(key, answer.clone(), self.cache_ttl);
        answer
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive, as
/// upstream); anything else carries no token.
pub fn bearer_token(headers: &http::HeaderMap) -> Option<&str> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Tokens are cached under their SHA-256, never in the clear.
fn token_key(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// The TLS-level client verifier: asks for a certificate, accepts any chain (verified later by
/// [`X509`]) but still checks the handshake signature, so a client must hold the key.
#[derive(Debug)]
pub struct RequestClientCert {
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl RequestClientCert {
    pub fn verifier() -> Arc<dyn ClientCertVerifier> {
        Arc::new(RequestClientCert {
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        })
    }
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
