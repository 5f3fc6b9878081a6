//! TLS bootstrap and client certificate rotation (upstream's `pkg/kubelet/certificate/bootstrap`
//! and client-go's certificate manager).
//!
//! Bootstrap: with `--bootstrap-kubeconfig` and no usable `--kubeconfig`, make an ECDSA P-256
//! key, send a `certificates.k8s.io/v1` CSR (signer `kubernetes.io/kube-apiserver-client-kubelet`,
//! `CN=system:node:<node>`, `O=system:nodes`), wait for the signed certificate, store cert + key in
//! `<cert-dir>/kubelet-client-<timestamp>.pem` (mode 0600) behind the symlink
//! `kubelet-client-current.pem`, and write `--kubeconfig` pointing at the symlink.
//!
//! An existing `--kubeconfig` is used only if its credentials work (upstream's
//! `isClientConfigStillValid`): it parses, every client certificate in it is within its validity
//! period, and the client key belongs to the certificate. Otherwise bootstrap runs again.
//!
//! Rotation: at a random point in 70–90 % of the certificate's lifetime, send a new CSR with the
//! current credentials, store the new pair the same way and publish a rebuilt client. Once the
//! current certificate has expired (rotation failed for long, the machine slept) the CSR is sent
//! with the bootstrap kubeconfig's credentials instead, as upstream's certificate manager does.

use crate::atomic_file;
use crate::objects::{ClientPublisher, RateLimitLayer, client};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{Api, PostParams};
use sha2::Digest;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The signer kubelet client certificates are requested from.
pub const SIGNER_KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The symlink to the current cert+key pair.
pub const CURRENT_PEM: &str = "kubelet-client-current.pem";
/// How long to wait for a CSR to be approved and signed (upstream waits up to an hour).
pub const CSR_WAIT: Duration = Duration::from_secs(3600);

/// Why bootstrap or rotation failed.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("no usable kubeconfig at {path} ({reason}) and no --bootstrap-kubeconfig to get one")]
    NoCredentials { path: String, reason: Unusable },
    #[error("bootstrap kubeconfig {path}: {message}")]
    BootstrapConfig { path: String, message: String },
    #[error("generating the key or CSR: {0}")]
    Crypto(#[from] rcgen::Error),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Client(#[from] client::ClientError),
    #[error("apiserver: {0}")]
    Api(#[from] kube::Error),
    #[error("certificate signing request {name} was {reason}: {message}")]
    Refused {
        name: String,
        reason: String,
        message: String,
    },
    #[error("timed out waiting for certificate signing request {0}")]
    Timeout(String),
    #[error("the signed certificate is unusable: {0}")]
    BadCertificate(String),
    #[error("cancelled")]
    Cancelled,
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BootstrapError {
    let path = path.display().to_string();
    move |source| BootstrapError::Io { op, path, source }
}

/// Validity of the first certificate in a PEM text, as unix seconds.
pub fn cert_validity(pem: &[u8]) -> Option<(i64, i64)> {
    for p in x509_parser::pem::Pem::iter_from_buffer(pem).flatten() {
        if p.label != "CERTIFICATE" {
            continue;
        }
        let cert = p.parse_x509().ok()?;
        let v = cert.validity();
        return Some((v.not_before.timestamp(), v.not_after.timestamp()));
    }
    None
}

/// Why a certificate and a private key cannot serve as one TLS identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    #[error("no certificate found")]
    NoCertificate,
    #[error("no private key found")]
    NoKey,
    #[error("unreadable PEM: {0}")]
    Pem(String),
    #[error("unsupported private key: {0}")]
    UnsupportedKey(String),
    #[error("the certificate cannot be parsed: {0}")]
    BadCertificate(String),
    #[error("the certificate's public key does not belong to the private key")]
    Mismatch,
}

/// Whether `key_pem` holds the private key of the first certificate in `cert_pem` (the check
/// Go's `tls.X509KeyPair` makes): the certificate's SubjectPublicKeyInfo is compared with the
/// one derived from the private key. RSA, ECDSA and Ed25519 keys in PKCS#1, SEC1 or PKCS#8.
pub fn check_key_pair(cert_pem: &[u8], key_pem: &[u8]) -> Result<(), PairError> {
    let certs = rustls_pemfile::certs(&mut &*cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PairError::Pem(e.to_string()))?;
    let leaf = certs.into_iter().next().ok_or(PairError::NoCertificate)?;
    let key = rustls_pemfile::private_key(&mut &*key_pem)
        .map_err(|e| PairError::Pem(e.to_string()))?
        .ok_or(PairError::NoKey)?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| PairError::UnsupportedKey(e.to_string()))?;
    match rustls::sign::CertifiedKey::new(vec![leaf], signing).keys_match() {
        Ok(()) => Ok(()),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(PairError::Mismatch)
        }
        // ring derives the public key of every key type it loads; "unknown" does not occur.
        Err(rustls::Error::InconsistentKeys(_)) => Ok(()),
        Err(e) => Err(PairError::BadCertificate(e.to_string())),
    }
}

/// Why a kubeconfig (or a stored cert+key pair) cannot be used as client credentials.
#[derive(Debug, thiserror::Error)]
pub enum Unusable {
    #[error("{0} does not exist")]
    Missing(String),
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    #[error("client certificate {cert} expired at {not_after}")]
    Expired { cert: String, not_after: String },
    #[error("client certificate {cert} does not match client key {key}")]
    KeyMismatch { cert: String, key: String },
}

fn unix_to_string(t: i64) -> String {
    jiff::Timestamp::from_second(t)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| t.to_string())
}

/// Checks a client cert+key pair: every certificate in `cert_pem` is valid at `now` (unix
/// seconds) and the key belongs to the first one. `cert_name`/`key_name` name the sources in
/// the answer (a file, or a kubeconfig field).
pub fn check_client_pair(
    cert_pem: &[u8],
    cert_name: &str,
    key_pem: &[u8],
    key_name: &str,
    now: i64,
) -> Result<(), Unusable> {
    let invalid = |path: &str, message: String| Unusable::Invalid {
        path: path.to_string(),
        message,
    };
    let mut seen = false;
    for p in x509_parser::pem::Pem::iter_from_buffer(cert_pem) {
        let p = p.map_err(|e| invalid(cert_name, format!("unreadable PEM: {e}")))?;
        if p.label != "CERTIFICATE" {
            continue;
        }
        let cert = p
            .parse_x509()
            .map_err(|e| invalid(cert_name, format!("unparsable certificate: {e}")))?;
        let v = cert.validity();
        let (nb, na) = (v.not_before.timestamp(), v.not_after.timestamp());
        // Not yet valid: upstream checks expiry only (a node clock a little behind the CA's
        // must not throw away a certificate it was just issued); said, not acted on.
        if nb > now {
            tracing::warn!(
                cert = %cert_name,
                not_before = %unix_to_string(nb),
                "client certificate is not valid yet: is this node's clock behind?"
            );
        }
        if na <= now {
            return Err(Unusable::Expired {
                cert: cert_name.to_string(),
                not_after: unix_to_string(na),
            });
        }
        seen = true;
    }
    if !seen {
        return Err(invalid(cert_name, "no certificate found".into()));
    }
    match check_key_pair(cert_pem, key_pem) {
        Ok(()) => Ok(()),
        Err(PairError::Mismatch) => Err(Unusable::KeyMismatch {
            cert: cert_name.to_string(),
            key: key_name.to_string(),
        }),
        Err(e @ (PairError::NoKey | PairError::UnsupportedKey(_))) => {
            Err(invalid(key_name, e.to_string()))
        }
        Err(e) => Err(invalid(cert_name, e.to_string())),
    }
}

/// Reads one credential of a kubeconfig user: inline base64 data (preferred, as client-go and
/// kube do) or a file. `None`: neither is set. The name says where it came from.
fn load_credential(
    kubeconfig: &Path,
    data: Option<&str>,
    data_field: &str,
    file: Option<&str>,
) -> Option<Result<(Vec<u8>, String), Unusable>> {
    use base64::Engine as _;
    if let Some(data) = data {
        let name = format!("{data_field} in {}", kubeconfig.display());
        let compact: String = data.split_whitespace().collect();
        return Some(
            base64::engine::general_purpose::STANDARD
                .decode(compact)
                .map(|b| (b, name.clone()))
                .map_err(|e| Unusable::Invalid {
                    path: name,
                    message: format!("bad base64: {e}"),
                }),
        );
    }
    let file = file?;
    Some(
        std::fs::read(file)
            .map(|b| (b, file.to_string()))
            .map_err(|e| Unusable::Invalid {
                path: file.to_string(),
                message: e.to_string(),
            }),
    )
}

/// Whether the kubeconfig at `path` can be used as is (upstream's `isClientConfigStillValid`):
/// it parses, and a client certificate it names (file or inline) is within its validity period
/// and matches the client key. Token credentials are taken on trust.
pub fn check_kubeconfig(path: &Path) -> Result<(), Unusable> {
    let invalid = |message: String| Unusable::Invalid {
        path: path.display().to_string(),
        message,
    };
    if !path.exists() {
        return Err(Unusable::Missing(path.display().to_string()));
    }
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| invalid(e.to_string()))?;
    let ctx_name = kc.current_context.clone().unwrap_or_default();
    let user = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone())
        .ok_or_else(|| invalid(format!("current context {ctx_name:?} names no user")))?;
    let auth = kc
        .auth_infos
        .iter()
        .find(|a| a.name == user)
        .and_then(|a| a.auth_info.as_ref())
        .ok_or_else(|| invalid(format!("user {user:?} not found")))?;
    // `client-key-data` is a secret string in kube's types; its serialized form is the value.
    let key_data = serde_json::to_value(auth)
        .ok()
        .and_then(|v| v.get("client-key-data")?.as_str().map(str::to_string));
    let cert = load_credential(
        path,
        auth.client_certificate_data.as_deref(),
        "client-certificate-data",
        auth.client_certificate.as_deref(),
    );
    let key = load_credential(
        path,
        key_data.as_deref(),
        "client-key-data",
        auth.client_key.as_deref(),
    );
    match (cert, key) {
        (Some(cert), Some(key)) => {
            let ((cert, cert_name), (key, key_name)) = (cert?, key?);
            check_client_pair(&cert, &cert_name, &key, &key_name, crate::clock::unix_now())
        }
        (Some(_), None) => Err(invalid("client certificate without a client key".into())),
        (None, Some(_)) => Err(invalid("client key without a client certificate".into())),
        (None, None) if auth.token.is_some() || auth.token_file.is_some() => Ok(()),
        (None, None) => Err(invalid(format!("user {user:?} has no credentials"))),
    }
}

/// Whether [`check_kubeconfig`] finds nothing wrong.
pub fn kubeconfig_usable(path: &Path) -> bool {
    check_kubeconfig(path).is_ok()
}

/// Checks the stored `kubelet-client-current.pem` (cert and key in one file).
pub fn check_current_pair(cert_dir: &Path) -> Result<(), Unusable> {
    let current = cert_dir.join(CURRENT_PEM);
    let name = current.display().to_string();
    match std::fs::read(&current) {
        Ok(pem) => check_client_pair(&pem, &name, &pem, &name, crate::clock::unix_now()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Unusable::Missing(name)),
        Err(e) => Err(Unusable::Invalid {
            path: name,
            message: e.to_string(),
        }),
    }
}

/// The upstream bootstrap CSR name: `node-csr-` + base64url(sha512/256 over the public key,
/// subject and usages, each base64url-encoded and `|`-terminated).
pub fn digested_name(spki_der: &[u8], cn: &str, orgs: &[&str], usages: &[&str]) -> String {
    use base64::Engine as _;
    let enc = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let mut h = sha2::Sha512_256::new();
    let mut write = |b: &[u8]| {
        h.update(enc(b).as_bytes());
        h.update(b"|");
    };
    write(spki_der);
    write(cn.as_bytes());
    for o in orgs {
        write(o.as_bytes());
    }
    for u in usages {
        write(u.as_bytes());
    }
    format!("node-csr-{}", enc(&h.finalize()))
}

/// A fresh key and its CSR for `system:node:<node>`.
pub struct KeyAndCsr {
    pub key_pem: String,
    pub csr_pem: String,
    pub spki_der: Vec<u8>,
}

pub const USAGES: [&str; 2] = ["digital signature", "client auth"];

/// What a CSR asks for: the signer and the key usages (ECDSA keys: no key encipherment, as
/// client-go's certificate manager).
#[derive(Debug, Clone, Copy)]
pub struct CsrKind {
    pub signer: &'static str,
    pub usages: &'static [&'static str],
}

/// The kubelet's client certificate.
pub const CLIENT: CsrKind = CsrKind {
    signer: SIGNER_KUBELET_CLIENT,
    usages: &USAGES,
};

pub fn new_key_and_csr(node: &str) -> Result<KeyAndCsr, rcgen::Error> {
    use rcgen::PublicKeyData as _;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "system:nodes");
    dn.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.distinguished_name = dn;
    let csr = params.serialize_request(&key)?;
    Ok(KeyAndCsr {
        key_pem: key.serialize_pem(),
        csr_pem: csr.pem()?,
        spki_der: key.subject_public_key_info(),
    })
}

/// Sends a CSR (`name` set: bootstrap's digested name; `None`: `generateName: csr-`, as the
/// rotating certificate manager does) and waits until it is signed. Returns the certificate PEM.
pub async fn request_certificate(
    client: kube::Client,
    kind: CsrKind,
    name: Option<String>,
    csr_pem: &str,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<String, BootstrapError> {
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let mut obj = CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.as_bytes().to_vec()),
            signer_name: kind.signer.into(),
            usages: Some(kind.usages.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        },
        ..Default::default()
    };
    match &name {
        Some(n) => obj.metadata.name = Some(n.clone()),
        None => obj.metadata.generate_name = Some("csr-".into()),
    }
    let created = match client::timed(api.create(&PostParams::default(), &obj)).await {
        Ok(c) => c,
        // The same key was submitted before (a restart during bootstrap): reuse that CSR.
        Err(e) if client::status_code(&e) == Some(409) && name.is_some() => {
            client::timed(api.get(name.as_deref().unwrap_or_default())).await?
        }
        Err(e) => return Err(e.into()),
    };
    let csr_name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %csr_name, signer = kind.signer, "certificate signing request sent; waiting for approval");
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match client::timed(api.get(&csr_name)).await {
            Ok(c) => {
                let status = c.status.unwrap_or_default();
                for cond in status.conditions.iter().flatten() {
                    if (cond.type_ == "Denied" || cond.type_ == "Failed") && cond.status != "False"
                    {
                        return Err(BootstrapError::Refused {
                            name: csr_name,
                            reason: cond.type_.to_lowercase(),
                            message: cond.message.clone().unwrap_or_default(),
                        });
                    }
                }
                if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
                    tracing::info!(csr = %csr_name, "certificate signed");
                    return String::from_utf8(cert.0)
                        .map_err(|e| BootstrapError::BadCertificate(e.to_string()));
                }
            }
            Err(e) => {
                tracing::warn!(csr = %csr_name, error = %e, "reading the certificate signing request; retrying")
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(BootstrapError::Timeout(csr_name));
        }
        tokio::select! {
            _ = cancel.cancelled() => return Err(BootstrapError::Cancelled),
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// Stores cert + key as `kubelet-client-<timestamp>.pem` (0600) and points
/// `kubelet-client-current.pem` at it atomically. Returns the symlink's path.
pub fn store_pair(
    cert_dir: &Path,
    cert_pem: &str,
    key_pem: &str,
) -> Result<PathBuf, BootstrapError> {
    store_pair_as(cert_dir, "kubelet-client", cert_pem, key_pem)
}

/// Stores cert + key as `<prefix>-<timestamp>.pem` (0600) and points `<prefix>-current.pem`
/// at it atomically (client-go's file store). Returns the symlink's path.
pub fn store_pair_as(
    cert_dir: &Path,
    prefix: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<PathBuf, BootstrapError> {
    std::fs::create_dir_all(cert_dir).map_err(io_err("creating", cert_dir))?;
    let ts = jiff::Timestamp::now()
        .strftime("%Y-%m-%d-%H-%M-%S")
        .to_string();
    let mut file = cert_dir.join(format!("{prefix}-{ts}.pem"));
    // Two rotations within one second must not overwrite the pair in use.
    let mut n = 1;
    while file.exists() {
        file = cert_dir.join(format!("{prefix}-{ts}-{n}.pem"));
        n += 1;
    }
    let mut body = cert_pem.trim_end().to_string();
    body.push('\n');
    body.push_str(key_pem.trim_end());
    body.push('\n');
    atomic_file::write_private_atomic(&file, body.as_bytes()).map_err(io_err("writing", &file))?;
    let current_name = format!("{prefix}-current.pem");
    let current = cert_dir.join(&current_name);
    let tmp = cert_dir.join(format!(".{current_name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&file, &tmp).map_err(io_err("linking", &tmp))?;
    std::fs::rename(&tmp, &current).map_err(io_err("renaming", &current))?;
    atomic_file::sync_dir(cert_dir).map_err(io_err("syncing", cert_dir))?;
    Ok(current)
}

/// Cluster address and CA taken from the bootstrap kubeconfig.
struct BootstrapCluster {
    server: String,
    ca_data: Option<String>,
    ca_file: Option<String>,
}

fn bootstrap_cluster(path: &Path) -> Result<BootstrapCluster, BootstrapError> {
    let err = |message: String| BootstrapError::BootstrapConfig {
        path: path.display().to_string(),
        message,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    let ctx_name = kc.current_context.clone().unwrap_or_default();
    let cluster_name = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .ok_or_else(|| err(format!("current context {ctx_name:?} not found")))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| err(format!("cluster {cluster_name:?} not found")))?;
    Ok(BootstrapCluster {
        server: cluster
            .server
            .ok_or_else(|| err("cluster has no server".into()))?,
        ca_data: cluster.certificate_authority_data,
        ca_file: cluster.certificate_authority,
    })
}

/// The kubeconfig upstream writes after bootstrap: client cert and key both from the
/// `kubelet-client-current.pem` symlink, so rotation needs no kubeconfig rewrite.
fn kubeconfig_text(c: &BootstrapCluster, pem: &Path) -> String {
    let ca = match (&c.ca_data, &c.ca_file) {
        (Some(d), _) => format!("    certificate-authority-data: {d}\n"),
        (None, Some(f)) => format!("    certificate-authority: {f}\n"),
        (None, None) => String::new(),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n{ca}    server: {server}\n  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n    namespace: default\n    user: default-auth\n  name: default-context\ncurrent-context: default-context\npreferences: {{}}\nusers:\n- name: default-auth\n  user:\n    client-certificate: {pem}\n    client-key: {pem}\n",
        server = c.server,
        pem = pem.display()
    )
}

/// Writes the kubeconfig: atomically and 0600, like every file with credentials.
fn write_kubeconfig(path: &Path, text: &str) -> Result<(), BootstrapError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
    }
    atomic_file::write_private_atomic(path, text.as_bytes()).map_err(io_err("writing", path))
}

/// What bootstrap needs to know.
#[derive(Debug, Clone)]
pub struct BootstrapSettings {
    pub node_name: String,
    pub kubeconfig: PathBuf,
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub cert_dir: PathBuf,
}

/// Makes sure `--kubeconfig` is usable, bootstrapping a client certificate if needed.
pub async fn ensure_kubeconfig(
    s: &BootstrapSettings,
    cancel: &CancellationToken,
) -> Result<(), BootstrapError> {
    let reason = match check_kubeconfig(&s.kubeconfig) {
        Ok(()) => {
            tracing::info!(kubeconfig = %s.kubeconfig.display(), "using existing kubeconfig");
            return Ok(());
        }
        Err(why @ Unusable::Missing(_)) => why,
        Err(why) => {
            tracing::warn!(kubeconfig = %s.kubeconfig.display(), reason = %why, "the existing kubeconfig is unusable");
            why
        }
    };
    let Some(bootstrap) = &s.bootstrap_kubeconfig else {
        return Err(BootstrapError::NoCredentials {
            path: s.kubeconfig.display().to_string(),
            reason,
        });
    };
    let cluster = bootstrap_cluster(bootstrap)?;
    // A still-valid pair from an earlier bootstrap is reused without a new CSR.
    let current = s.cert_dir.join(CURRENT_PEM);
    match check_current_pair(&s.cert_dir) {
        Ok(()) => {
            tracing::info!(cert = %current.display(), "reusing the existing client certificate");
            return write_kubeconfig(&s.kubeconfig, &kubeconfig_text(&cluster, &current));
        }
        Err(Unusable::Missing(_)) => {}
        Err(why) => {
            tracing::warn!(reason = %why, "the stored client certificate is unusable; requesting a new one")
        }
    }
    tracing::info!(bootstrap = %bootstrap.display(), "requesting a client certificate with the bootstrap kubeconfig (TLS bootstrap)");
    let config = client::load_config(bootstrap).await?;
    let bclient = kube::Client::try_from(config)?;
    let kc = new_key_and_csr(&s.node_name)?;
    let name = digested_name(
        &kc.spki_der,
        &format!("system:node:{}", s.node_name),
        &["system:nodes"],
        &USAGES,
    );
    let mut backoff = plumbing::Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    let cert = loop {
        match request_certificate(
            bclient.clone(),
            CLIENT,
            Some(name.clone()),
            &kc.csr_pem,
            CSR_WAIT,
            cancel,
        )
        .await
        {
            Ok(c) => break c,
            Err(e @ (BootstrapError::Refused { .. } | BootstrapError::Cancelled)) => return Err(e),
            Err(e) => {
                let wait = backoff.fail();
                tracing::warn!(error = %e, retry_in = ?wait, "TLS bootstrap failed; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return Err(BootstrapError::Cancelled),
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    };
    if cert_validity(cert.as_bytes()).is_none() {
        return Err(BootstrapError::BadCertificate(
            "no certificate in status.certificate".into(),
        ));
    }
    let current = store_pair(&s.cert_dir, &cert, &kc.key_pem)?;
    write_kubeconfig(&s.kubeconfig, &kubeconfig_text(&cluster, &current))?;
    tracing::info!(kubeconfig = %s.kubeconfig.display(), cert = %current.display(), "TLS bootstrap done");
    Ok(())
}

/// When to renew a certificate valid from `not_before` to `not_after`: at a uniformly random
/// point in 70–90 % of its lifetime (client-go's `nextRotationDeadline`).
pub fn rotation_deadline(not_before: i64, not_after: i64, jitter: f64) -> i64 {
    let total = (not_after - not_before).max(0) as f64;
    not_before + (total * (0.7 + 0.2 * jitter.clamp(0.0, 1.0))).round() as i64
}

/// Rotates the client certificate behind `kubelet-client-current.pem` and publishes new clients.
pub struct Rotator {
    pub node_name: String,
    pub kubeconfig: PathBuf,
    /// Credentials for the CSR once the current certificate has expired.
    pub bootstrap_kubeconfig: Option<PathBuf>,
    pub cert_dir: PathBuf,
    pub limiter: RateLimitLayer,
    pub publisher: ClientPublisher,
    pub handle: client::ClientHandle,
}

impl Rotator {
    /// Whether the kubeconfig's certificate is one this rotator manages.
    pub fn manages(kubeconfig: &Path, cert_dir: &Path) -> bool {
        std::fs::read_to_string(kubeconfig)
            .map(|t| t.contains(&cert_dir.join(CURRENT_PEM).display().to_string()))
            .unwrap_or(false)
    }

    pub async fn run(self, cancel: CancellationToken) {
        let current = self.cert_dir.join(CURRENT_PEM);
        let mut backoff = plumbing::Backoff::new(Duration::from_secs(2), Duration::from_secs(300));
        loop {
            let Some((nb, na)) = std::fs::read(&current).ok().and_then(|b| cert_validity(&b))
            else {
                tracing::warn!(cert = %current.display(), "cannot read the client certificate; rotation stopped");
                return;
            };
            let deadline = rotation_deadline(nb, na, fastrand::f64());
            let wait = Duration::from_secs((deadline - crate::clock::unix_now()).max(0) as u64);
            tracing::info!(expires_unix = na, rotate_in = ?wait, "client certificate rotation scheduled");
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match self.rotate(&cancel).await {
                Ok(()) => backoff.succeed(),
                Err(BootstrapError::Cancelled) => return,
                Err(e) => {
                    crate::metrics::certificates().client_renew_errors.inc();
                    let wait = backoff.fail();
                    tracing::warn!(error = %e, retry_in = ?wait, "client certificate rotation failed");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    /// The client to send the CSR with: the current one while its certificate is valid, the
    /// bootstrap kubeconfig's once it has expired (client-go's certificate manager falls back to
    /// its bootstrap client the same way); an expired certificate is refused by the apiserver.
    async fn csr_client(&self) -> Result<kube::Client, BootstrapError> {
        let current = self.cert_dir.join(CURRENT_PEM);
        let expired = std::fs::read(&current)
            .ok()
            .and_then(|b| cert_validity(&b))
            .is_some_and(|(_, not_after)| not_after <= crate::clock::unix_now());
        if !expired {
            return Ok(self.handle.current());
        }
        match &self.bootstrap_kubeconfig {
            Some(bootstrap) => {
                tracing::warn!(cert = %current.display(), bootstrap = %bootstrap.display(), "the client certificate has expired; requesting a new one with the bootstrap kubeconfig's credentials");
                Ok(client::build(bootstrap, &self.limiter).await?)
            }
            None => {
                tracing::warn!(cert = %current.display(), "the client certificate has expired and there is no --bootstrap-kubeconfig; the apiserver will likely refuse the renewal");
                Ok(self.handle.current())
            }
        }
    }

    async fn rotate(&self, cancel: &CancellationToken) -> Result<(), BootstrapError> {
        let kc = new_key_and_csr(&self.node_name)?;
        let cert = request_certificate(
            self.csr_client().await?,
            CLIENT,
            None,
            &kc.csr_pem,
            Duration::from_secs(900),
            cancel,
        )
        .await?;
        if cert_validity(cert.as_bytes()).is_none() {
            return Err(BootstrapError::BadCertificate(
                "no certificate in status.certificate".into(),
            ));
        }
        let path = store_pair(&self.cert_dir, &cert, &kc.key_pem)?;
        let client = client::build(&self.kubeconfig, &self.limiter).await?;
        self.publisher.publish(client);
        tracing::info!(cert = %path.display(), "client certificate rotated; apiserver client rebuilt");
        Ok(())
    }
}

#[cfg(test)]
mod tests;
