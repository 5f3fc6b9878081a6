//! The serving certificate manager (upstream's `NewKubeletServerCertificateManager`): with
//! `serverTLSBootstrap: true` the kubelet asks the apiserver for a `kubernetes.io/kubelet-serving`
//! certificate for `system:node:<name>` with the node's hostnames and IPs, stores it as
//! `<cert-dir>/kubelet-server-<timestamp>.pem` + `kubelet-server-current.pem`, serves it, and
//! renews it at a random point in 70–90 % of its lifetime. The :10250 listener reads the current
//! pair through [`ServingCertResolver`] on every handshake, so a rotation never drops it. Until
//! a certificate is issued, handshakes fail (upstream's `GetCertificate` returns an error).

use crate::certs::bootstrap::{self, BootstrapError, CsrKind};
use crate::objects::ClientHandle;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The signer of kubelet serving certificates.
pub const SIGNER_KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
/// The usages asked for with an ECDSA key (RSA keys would add key encipherment).
pub const SERVING_USAGES: [&str; 2] = ["digital signature", "server auth"];
/// The serving CSR.
pub const SERVING: CsrKind = CsrKind {
    signer: SIGNER_KUBELET_SERVING,
    usages: &SERVING_USAGES,
};
/// The file-store prefix: `kubelet-server-current.pem`.
pub const PREFIX: &str = "kubelet-server";
/// How long one CSR may wait for approval before it is retried with a fresh key.
const CSR_WAIT: Duration = Duration::from_secs(900);

#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    #[error("serving certificate {path}: {message}")]
    Pair { path: String, message: String },
    #[error("serving certificate request: {0}")]
    Request(#[from] BootstrapError),
    #[error("creating the serving key and CSR: {0}")]
    Key(#[from] rcgen::Error),
    #[error("serving certificate: blocking task failed: {0}")]
    Join(String),
}

/// The certificate :10250 presents, swappable at runtime. None yet, or only an expired one:
/// the handshake fails (client-go's certificate manager returns no certificate then).
#[derive(Debug, Default)]
pub struct ServingCertResolver {
    current: RwLock<Option<Served>>,
}

#[derive(Debug, Clone)]
struct Served {
    key: Arc<CertifiedKey>,
    not_after: Option<i64>,
}

impl ServingCertResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a certificate is being served.
    pub fn has_cert(&self) -> bool {
        self.current_at(crate::clock::unix_now()).is_some()
    }

    /// The pair a handshake at unix time `now` gets: none once it has expired.
    pub fn current_at(&self, now: i64) -> Option<Arc<CertifiedKey>> {
        let cur = self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        match cur.not_after {
            Some(na) if na <= now => None,
            _ => Some(cur.key),
        }
    }

    /// Serves `cert_pem` (the leaf first, then any chain) with `key_pem` from the next
    /// handshake on, and records its expiry for `kubelet_certificate_manager_server_ttl_seconds`.
    pub fn install(&self, cert_pem: &[u8], key_pem: &[u8], what: &str) -> Result<(), ServingError> {
        let ck = certified_key(cert_pem, key_pem, what)?;
        let not_after = bootstrap::cert_validity(cert_pem).map(|(_, na)| na);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(Served {
            key: Arc::new(ck),
            not_after,
        });
        crate::metrics::certificates().set_server_expiry(not_after);
        Ok(())
    }
}

impl ResolvesServerCert for ServingCertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let cur = self.current_at(crate::clock::unix_now());
        if cur.is_none() {
            tracing::debug!("TLS handshake refused: no valid serving certificate available");
        }
        cur
    }
}

/// Parses a PEM pair into what rustls serves; the key must belong to the certificate.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    what: &str,
) -> Result<CertifiedKey, ServingError> {
    let err = |message: String| ServingError::Pair {
        path: what.to_string(),
        message,
    };
    bootstrap::check_key_pair(cert_pem, key_pem).map_err(|e| err(e.to_string()))?;
    let certs = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no certificate found".into()));
    }
    let key = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|e| err(e.to_string()))?
        .ok_or_else(|| err("no private key found".into()))?;
    let signing =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| err(e.to_string()))?;
    Ok(CertifiedKey::new(certs, signing))
}

/// A fresh ECDSA P-256 key and its CSR: subject `CN=system:node:<node>, O=system:nodes`,
/// subject alternative names the node's hostnames and IPs (upstream's serving template).
pub fn new_serving_key_and_csr(
    node: &str,
    hostnames: &[String],
    ips: &[IpAddr],
) -> Result<bootstrap::KeyAndCsr, rcgen::Error> {
    use rcgen::PublicKeyData as _;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "system:nodes");
    dn.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.distinguished_name = dn;
    for h in hostnames {
        params
            .subject_alt_names
            .push(rcgen::SanType::DnsName(h.as_str().try_into()?));
    }
    for ip in ips {
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(*ip));
    }
    let csr = params.serialize_request(&key)?;
    Ok(bootstrap::KeyAndCsr {
        key_pem: key.serialize_pem(),
        csr_pem: csr.pem()?,
        spki_der: key.subject_public_key_info(),
    })
}

/// How long to wait before renewing a certificate valid `[not_before, not_after]` at `now`
/// (`jitter` in 0..1 picks the point in 70–90 % of the lifetime; past it: at once).
pub fn renew_in(not_before: i64, not_after: i64, jitter: f64, now: i64) -> Duration {
    let deadline = bootstrap::rotation_deadline(not_before, not_after, jitter);
    Duration::from_secs((deadline - now).max(0) as u64)
}

/// The node's names for the serving certificate (the Node's Hostname and InternalIP
/// addresses, as this kubelet reports them).
#[derive(Debug, Clone)]
pub struct ServingSettings {
    pub node_name: String,
    pub hostnames: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub cert_dir: PathBuf,
}

/// Requests, stores and rotates the serving certificate.
pub struct ServingManager {
    pub settings: ServingSettings,
    pub client: ClientHandle,
    pub resolver: Arc<ServingCertResolver>,
}

/// Reads `kubelet-server-current.pem` (cert + key in one file): `(pem, not_before, not_after)`
/// when it holds a usable pair.
fn read_current(cert_dir: &Path) -> Option<(Vec<u8>, i64, i64)> {
    let path = cert_dir.join(format!("{PREFIX}-current.pem"));
    let pem = std::fs::read(&path).ok()?;
    if let Err(e) = bootstrap::check_key_pair(&pem, &pem) {
        tracing::warn!(cert = %path.display(), error = %e, "the stored serving certificate is unusable; requesting a new one");
        return None;
    }
    let (nb, na) = bootstrap::cert_validity(&pem)?;
    Some((pem, nb, na))
}

impl ServingManager {
    /// Serves the stored certificate if there is one, then renews it whenever due.
    pub async fn run(self, cancel: CancellationToken) {
        let mut backoff = plumbing::Backoff::new(Duration::from_secs(2), Duration::from_secs(300));
        // A pair just stored that cannot be read back must not make a CSR per loop.
        let mut renewed = false;
        loop {
            let dir = self.settings.cert_dir.clone();
            let current = tokio::task::spawn_blocking(move || read_current(&dir))
                .await
                .ok()
                .flatten();
            let wait = match current {
                Some((pem, nb, na)) if na > crate::clock::unix_now() => {
                    renewed = false;
                    let what = self.settings.cert_dir.join(format!("{PREFIX}-current.pem"));
                    match self
                        .resolver
                        .install(&pem, &pem, &what.display().to_string())
                    {
                        Ok(()) => renew_in(nb, na, fastrand::f64(), crate::clock::unix_now()),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot serve the stored serving certificate");
                            Duration::ZERO
                        }
                    }
                }
                _ if renewed => {
                    tracing::warn!(dir = %self.settings.cert_dir.display(), "the serving certificate just stored cannot be read back");
                    backoff.fail()
                }
                _ => Duration::ZERO,
            };
            if !wait.is_zero() {
                tracing::info!(rotate_in = ?wait, "serving certificate rotation scheduled");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match self.renew(&cancel).await {
                Ok(path) => {
                    renewed = true;
                    backoff.succeed();
                    tracing::info!(cert = %path.display(), "serving certificate issued and installed");
                }
                Err(ServingError::Request(BootstrapError::Cancelled)) => return,
                Err(e) => {
                    crate::metrics::certificates().server_renew_errors.inc();
                    let wait = backoff.fail();
                    tracing::warn!(error = %e, retry_in = ?wait, "serving certificate request failed");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// One CSR round: new key, CSR, wait for the certificate, store it, serve it.
    async fn renew(&self, cancel: &CancellationToken) -> Result<PathBuf, ServingError> {
        let s = self.settings.clone();
        let kc = tokio::task::spawn_blocking(move || {
            new_serving_key_and_csr(&s.node_name, &s.hostnames, &s.ips)
        })
        .await
        .map_err(|e| ServingError::Join(e.to_string()))??;
        let cert = bootstrap::request_certificate(
            self.client.current(),
            SERVING,
            None,
            &kc.csr_pem,
            CSR_WAIT,
            cancel,
        )
        .await?;
        let dir = self.settings.cert_dir.clone();
        let key = kc.key_pem.clone();
        let cert2 = cert.clone();
        let path = tokio::task::spawn_blocking(move || {
            bootstrap::store_pair_as(&dir, PREFIX, &cert2, &key)
        })
        .await
        .map_err(|e| ServingError::Join(e.to_string()))??;
        self.resolver.install(
            cert.as_bytes(),
            kc.key_pem.as_bytes(),
            &path.display().to_string(),
        )?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests;
