//! TLS bootstrap and client certificate rotation (upstream's `pkg/kubelet/certificate/bootstrap`
//! and client-go's certificate manager).
//!
//! Bootstrap: with `--bootstrap-kubeconfig` and no usable `--kubeconfig`, make an ECDSA P-256
//! key, send a `certificates.k8s.io/v1` CSR (signer `kubernetes.io/kube-apiserver-client-kubelet`,
//! `CN=system:node:<node>`, `O=system:nodes`), wait for the signed certificate, store cert + key in
//! `<cert-dir>/kubelet-client-<timestamp>.pem` (mode 0600) behind the symlink
//! `kubelet-client-current.pem`, and write `--kubeconfig` pointing at the symlink.
//!
//! Rotation: at a random point in 70–90 % of the certificate's lifetime, send a new CSR with the
//! current credentials, store the new pair the same way and publish a rebuilt client.

use super::client::{self, ClientPublisher, RateLimitLayer};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{Api, PostParams};
use sha2::Digest;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
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
    #[error("no usable kubeconfig at {0} and no --bootstrap-kubeconfig to get one")]
    NoCredentials(String),
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

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Whether the kubeconfig at `path` can be used as is: it parses, and a client certificate it
/// names (file or inline) has not expired. Token credentials are taken on trust.
pub fn kubeconfig_usable(path: &Path) -> bool {
    let Ok(kc) = kube::config::Kubeconfig::read_from(path) else {
        return false;
    };
    let ctx_name = kc.current_context.clone().unwrap_or_default();
    let user = kc
        .contexts
        .iter()
        .find(|c| c.name == ctx_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.user.clone().unwrap_or_default());
    let Some(auth) = kc
        .auth_infos
        .iter()
        .find(|a| Some(&a.name) == user.as_ref())
        .and_then(|a| a.auth_info.as_ref())
    else {
        return false;
    };
    let pem = if let Some(file) = &auth.client_certificate {
        match std::fs::read(file) {
            Ok(b) => b,
            Err(_) => return false,
        }
    } else if let Some(data) = &auth.client_certificate_data {
        use base64::Engine as _;
        match base64::engine::general_purpose::STANDARD.decode(data.trim()) {
            Ok(b) => b,
            Err(_) => return false,
        }
    } else {
        return auth.token.is_some() || auth.token_file.is_some();
    };
    cert_validity(&pem).is_some_and(|(_, not_after)| not_after > now_unix())
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
    name: Option<String>,
    csr_pem: &str,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<String, BootstrapError> {
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let mut obj = CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.as_bytes().to_vec()),
            signer_name: SIGNER_KUBELET_CLIENT.into(),
            usages: Some(USAGES.iter().map(|s| s.to_string()).collect()),
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
    tracing::info!(csr = %csr_name, signer = SIGNER_KUBELET_CLIENT, "certificate signing request sent; waiting for approval");
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
    std::fs::create_dir_all(cert_dir).map_err(io_err("creating", cert_dir))?;
    let ts = jiff::Timestamp::now()
        .strftime("%Y-%m-%d-%H-%M-%S")
        .to_string();
    let mut file = cert_dir.join(format!("kubelet-client-{ts}.pem"));
    // Two rotations within one second must not overwrite the pair in use.
    let mut n = 1;
    while file.exists() {
        file = cert_dir.join(format!("kubelet-client-{ts}-{n}.pem"));
        n += 1;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&file)
        .map_err(io_err("creating", &file))?;
    let mut body = cert_pem.trim_end().to_string();
    body.push('\n');
    body.push_str(key_pem.trim_end());
    body.push('\n');
    f.write_all(body.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(io_err("writing", &file))?;
    let current = cert_dir.join(CURRENT_PEM);
    let tmp = cert_dir.join(format!(".{CURRENT_PEM}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&file, &tmp).map_err(io_err("linking", &tmp))?;
    std::fs::rename(&tmp, &current).map_err(io_err("renaming", &current))?;
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

fn write_private(path: &Path, text: &str) -> Result<(), BootstrapError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
    }
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err("creating", &tmp))?;
    f.write_all(text.as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(io_err("writing", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err("renaming", path))
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
    if kubeconfig_usable(&s.kubeconfig) {
        tracing::info!(kubeconfig = %s.kubeconfig.display(), "using existing kubeconfig");
        return Ok(());
    }
    let Some(bootstrap) = &s.bootstrap_kubeconfig else {
        return Err(BootstrapError::NoCredentials(
            s.kubeconfig.display().to_string(),
        ));
    };
    let cluster = bootstrap_cluster(bootstrap)?;
    // A still-valid pair from an earlier bootstrap is reused without a new CSR.
    let current = s.cert_dir.join(CURRENT_PEM);
    if std::fs::read(&current)
        .ok()
        .and_then(|b| cert_validity(&b))
        .is_some_and(|(_, na)| na > now_unix())
    {
        tracing::info!(cert = %current.display(), "reusing the existing client certificate");
        return write_private(&s.kubeconfig, &kubeconfig_text(&cluster, &current));
    }
    tracing::info!(bootstrap = %bootstrap.display(), "no usable kubeconfig; requesting a client certificate (TLS bootstrap)");
    let config = client::load_config(bootstrap).await?;
    let bclient = kube::Client::try_from(config)?;
    let kc = new_key_and_csr(&s.node_name)?;
    let name = digested_name(
        &kc.spki_der,
        &format!("system:node:{}", s.node_name),
        &["system:nodes"],
        &USAGES,
    );
    let mut backoff = Duration::from_secs(1);
    let cert = loop {
        match request_certificate(
            bclient.clone(),
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
                tracing::warn!(error = %e, retry_in = ?backoff, "TLS bootstrap failed; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return Err(BootstrapError::Cancelled),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    };
    if cert_validity(cert.as_bytes()).is_none() {
        return Err(BootstrapError::BadCertificate(
            "no certificate in status.certificate".into(),
        ));
    }
    let current = store_pair(&s.cert_dir, &cert, &kc.key_pem)?;
    write_private(&s.kubeconfig, &kubeconfig_text(&cluster, &current))?;
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
        let mut backoff = Duration::from_secs(2);
        loop {
            let Some((nb, na)) = std::fs::read(&current).ok().and_then(|b| cert_validity(&b))
            else {
                tracing::warn!(cert = %current.display(), "cannot read the client certificate; rotation stopped");
                return;
            };
            let deadline = rotation_deadline(nb, na, fastrand::f64());
            let wait = Duration::from_secs((deadline - now_unix()).max(0) as u64);
            tracing::info!(expires_unix = na, rotate_in = ?wait, "client certificate rotation scheduled");
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match self.rotate(&cancel).await {
                Ok(()) => backoff = Duration::from_secs(2),
                Err(BootstrapError::Cancelled) => return,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "client certificate rotation failed");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(300));
                }
            }
        }
    }

    async fn rotate(&self, cancel: &CancellationToken) -> Result<(), BootstrapError> {
        let kc = new_key_and_csr(&self.node_name)?;
        let cert = request_certificate(
            self.handle.current(),
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
mod tests {
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
}
