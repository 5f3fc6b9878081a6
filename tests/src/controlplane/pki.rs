//! The control plane's certificate authority: serving cert, client certs, CSR signing.

use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, anyhow};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, ParsedExtension, X509Certificate};

use super::random::random_u64;

/// A test CA (ECDSA P-256) that also signs the apiserver's serving certificate.
pub struct Authority {
    params: CertificateParams,
    key: KeyPair,
    cert_pem: String,
    not_after: SystemTime,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: String,
}

fn odt(t: SystemTime) -> OffsetDateTime {
    OffsetDateTime::from(t)
}

fn random_serial() -> SerialNumber {
    let a = random_u64().to_be_bytes();
    let b = random_u64().to_be_bytes();
    let mut bytes = [a, b].concat();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

impl Authority {
    pub fn new(common_name: &str) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = SystemTime::now();
        let not_after = now + Duration::from_secs(10 * 365 * 24 * 3600);
        params.not_before = odt(now - Duration::from_secs(3600));
        params.not_after = odt(not_after);
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            params,
            key,
            not_after,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    fn issuer(&self) -> Issuer<'_, &KeyPair> {
        Issuer::from_params(&self.params, &self.key)
    }

    /// The apiserver's serving certificate (127.0.0.1, ::1, localhost, kubernetes...).
    pub fn serving_cert(&self) -> Result<IssuedCert> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![
            "127.0.0.1".to_string(),
            "::1".to_string(),
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default".to_string(),
            "kubernetes.default.svc".to_string(),
        ])?;
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = SystemTime::now();
        params.not_before = odt(now - Duration::from_secs(3600));
        params.not_after = odt(now + Duration::from_secs(365 * 24 * 3600));
        params.serial_number = Some(random_serial());
        let cert = params.signed_by(&key, &self.issuer())?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A client certificate for user `cn` in `groups` (the O attributes).
    pub fn client_cert(&self, cn: &str, groups: &[&str], lifetime: Duration) -> Result<IssuedCert> {
        let now = SystemTime::now();
        self.client_cert_between(cn, groups, now - Duration::from_secs(60), now + lifetime)
    }

    /// A client certificate with explicit validity (for expired/not-yet-valid cases).
    pub fn client_cert_between(
        &self,
        cn: &str,
        groups: &[&str],
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<IssuedCert> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        // An empty `cn`: a subject without a CommonName at all.
        if !cn.is_empty() {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = odt(not_before);
        params.not_after = odt(not_after);
        params.serial_number = Some(random_serial());
        let cert = params.signed_by(&key, &self.issuer())?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Sign a PEM CSR the way kube-controller-manager's signer does: subject and SANs
    /// from the request, usages from `spec.usages`, `NotBefore = now - backdate`,
    /// `NotAfter = now + ttl` (short-lived, < 8h) or `now + ttl - backdate`, capped at
    /// the CA's own expiry.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        usages: &[String],
        ttl: Duration,
        backdate: Duration,
    ) -> Result<String> {
        let mut req = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| anyhow!("unable to parse certificate request: {e}"))?;
        let now = SystemTime::now();
        let not_before = now - backdate;
        let mut not_after = if ttl < Duration::from_secs(8 * 3600) {
            now + ttl
        } else {
            now + ttl - backdate
        };
        if not_after > self.not_after {
            not_after = self.not_after;
        }
        let p = &mut req.params;
        p.not_before = odt(not_before);
        p.not_after = odt(not_after);
        p.is_ca = IsCa::ExplicitNoCa;
        p.serial_number = Some(random_serial());
        p.key_usages.clear();
        p.extended_key_usages.clear();
        for u in usages {
            match u.as_str() {
                "signing" | "digital signature" => {
                    p.key_usages.push(KeyUsagePurpose::DigitalSignature)
                }
                "content commitment" => p.key_usages.push(KeyUsagePurpose::ContentCommitment),
                "key encipherment" => p.key_usages.push(KeyUsagePurpose::KeyEncipherment),
                "key agreement" => p.key_usages.push(KeyUsagePurpose::KeyAgreement),
                "data encipherment" => p.key_usages.push(KeyUsagePurpose::DataEncipherment),
                "cert sign" => p.key_usages.push(KeyUsagePurpose::KeyCertSign),
                "crl sign" => p.key_usages.push(KeyUsagePurpose::CrlSign),
                "encipher only" => p.key_usages.push(KeyUsagePurpose::EncipherOnly),
                "decipher only" => p.key_usages.push(KeyUsagePurpose::DecipherOnly),
                "any" => p.extended_key_usages.push(ExtendedKeyUsagePurpose::Any),
                "server auth" => p
                    .extended_key_usages
                    .push(ExtendedKeyUsagePurpose::ServerAuth),
                "client auth" => p
                    .extended_key_usages
                    .push(ExtendedKeyUsagePurpose::ClientAuth),
                "code signing" => p
                    .extended_key_usages
                    .push(ExtendedKeyUsagePurpose::CodeSigning),
                "email protection" | "s/mime" => p
                    .extended_key_usages
                    .push(ExtendedKeyUsagePurpose::EmailProtection),
                "timestamping" => p
                    .extended_key_usages
                    .push(ExtendedKeyUsagePurpose::TimeStamping),
                "ocsp signing" => p
                    .extended_key_usages
                    .push(ExtendedKeyUsagePurpose::OcspSigning),
                other => return Err(anyhow!("unrecognized usage values: [{other:?}]")),
            }
        }
        let cert = req
            .signed_by(&self.issuer())
            .context("failed to sign certificate")?;
        Ok(cert.pem())
    }
}

/// What the approver and signer need to know about a PEM CSR.
#[derive(Debug, Clone, Default)]
pub struct CsrInfo {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub has_sans: bool,
    /// DNS and IP subject alternative names (a kubelet-serving CSR needs one).
    pub dns_or_ip_sans: usize,
    /// Email or URI subject alternative names (a kubelet-serving CSR may have none).
    pub email_or_uri_sans: bool,
}

/// Parse a PEM CSR (verifying its self-signature).
pub fn inspect_csr(pem: &str) -> Result<CsrInfo> {
    let req = CertificateSigningRequestParams::from_pem(pem).map_err(|e| anyhow!("{e}"))?;
    let mut info = CsrInfo::default();
    for (ty, val) in req.params.distinguished_name.iter() {
        let s = match val {
            rcgen::DnValue::Utf8String(s) => s.clone(),
            rcgen::DnValue::PrintableString(s) => s.as_str().to_string(),
            rcgen::DnValue::Ia5String(s) => s.as_str().to_string(),
            other => format!("{other:?}"),
        };
        match ty {
            DnType::CommonName => info.common_name = s,
            DnType::OrganizationName => info.organizations.push(s),
            _ => {}
        }
    }
    info.has_sans = req.params.subject_alt_names.iter().any(|s| {
        matches!(
            s,
            SanType::DnsName(_) | SanType::IpAddress(_) | SanType::Rfc822Name(_) | SanType::URI(_)
        )
    });
    info.dns_or_ip_sans = req
        .params
        .subject_alt_names
        .iter()
        .filter(|s| matches!(s, SanType::DnsName(_) | SanType::IpAddress(_)))
        .count();
    info.email_or_uri_sans = req
        .params
        .subject_alt_names
        .iter()
        .any(|s| matches!(s, SanType::Rfc822Name(_) | SanType::URI(_)));
    Ok(info)
}

/// Why a CSR is not a kubelet serving certificate request (upstream's
/// `ValidateKubeletServingCSR`, which the `kubernetes.io/kubelet-serving` signer applies):
/// `None` when it is one.
pub fn kubelet_serving_problem(info: &CsrInfo, usages: &[String]) -> Option<String> {
    if info.organizations != ["system:nodes"] {
        return Some("subject organization is not system:nodes".into());
    }
    if info.dns_or_ip_sans == 0 {
        return Some("DNS or IP subjectAltName is required".into());
    }
    if info.email_or_uri_sans {
        return Some("Email and URI subjectAltNames are not allowed".into());
    }
    let mut u: Vec<&str> = usages.iter().map(String::as_str).collect();
    u.sort_unstable();
    u.dedup();
    if u != ["digital signature", "server auth"]
        && u != ["digital signature", "key encipherment", "server auth"]
    {
        return Some(
            "usages did not match [digital signature key encipherment server auth]".into(),
        );
    }
    if !info.common_name.starts_with("system:node:") {
        return Some("subject common name does not begin with system:node:".into());
    }
    None
}

/// User name (CN) and groups (O) of a DER client certificate.
pub fn identity_of(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or("")
        .to_string();
    let orgs = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok())
        .map(str::to_string)
        .collect();
    Some((cn, orgs))
}

/// `NotBefore` / `NotAfter` of a PEM certificate (for tests).
pub fn validity_of_pem(pem: &str) -> Option<(SystemTime, SystemTime)> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = p.parse_x509().ok()?;
    let v = cert.validity();
    let conv = |t: x509_parser::time::ASN1Time| {
        SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or(0))
    };
    Some((conv(v.not_before), conv(v.not_after)))
}

/// Subject CN/O and whether the certificate allows client auth (for tests).
pub fn subject_of_pem(pem: &str) -> Option<(String, Vec<String>, bool)> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = p.parse_x509().ok()?;
    let (cn, orgs) = identity_of(&p.contents)?;
    let client_auth = cert
        .extensions()
        .iter()
        .any(|e| match e.parsed_extension() {
            ParsedExtension::ExtendedKeyUsage(eku) => eku.client_auth,
            _ => false,
        });
    Some((cn, orgs, client_auth))
}
