//! A configured serving pair (`tlsCertFile` / `tlsPrivateKeyFile`) reloaded when its files
//! change, as upstream's `ReloadKubeletServerCertificateFile` gate (beta, on by default) does
//! with a dynamic serving-content controller: cert-manager, Vault or an operator replaces the
//! files and the next handshakes get the new pair, with no restart. A pair that does not load
//! (half written, key not matching the certificate, not PEM) is logged and the previous pair
//! stays served; it is tried again when the files change again.

use crate::certs::serving::{ServingError, certified_key};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Upstream's gate.
pub const RELOAD_GATE: &str = "ReloadKubeletServerCertificateFile";
/// How often the files are read and compared (upstream watches them with inotify and
/// re-reads them every minute; a one-second poll of two small files is as prompt).
pub const POLL: Duration = Duration::from_secs(1);

/// The pair read from the files; every handshake gets the last one that loaded (expired or
/// not, as a static pair would be served).
#[derive(Debug)]
pub struct FileCertResolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for FileCertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

/// The two files' contents, as last read.
type Contents = (Vec<u8>, Vec<u8>);

/// Watches `cert` and `key`, swapping the pair under the listener when they change.
#[derive(Debug)]
pub struct FileCertReloader {
    cert: PathBuf,
    key: PathBuf,
    resolver: Arc<FileCertResolver>,
    /// What the files held at the last look (loaded or not).
    seen: Contents,
}

impl FileCertReloader {
    /// Loads the pair now (a broken pair fails the start, as a static one does) and returns the
    /// resolver to serve from and the reloader to run.
    pub fn load(
        cert: PathBuf,
        key: PathBuf,
    ) -> Result<(Arc<FileCertResolver>, FileCertReloader), ServingError> {
        let seen = read_pair(&cert, &key)?;
        let ck = certified_key(&seen.0, &seen.1, &cert.display().to_string())?;
        record_expiry(&seen.0);
        let resolver = Arc::new(FileCertResolver {
            current: RwLock::new(Arc::new(ck)),
        });
        let reloader = FileCertReloader {
            cert,
            key,
            resolver: resolver.clone(),
            seen,
        };
        Ok((resolver, reloader))
    }

    /// Polls the files every `period` until cancelled; the reads run on the blocking pool.
    pub async fn run(mut self, period: Duration, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            let (cert, key) = (self.cert.clone(), self.key.clone());
            let read = tokio::task::spawn_blocking(move || read_pair(&cert, &key)).await;
            match read {
                Ok(Ok(now)) => self.consider(now),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "serving certificate files not readable; keeping the served pair")
                }
                Err(e) => tracing::warn!(error = %e, "serving certificate reload task failed"),
            }
        }
    }

    /// Installs `now` when it differs from what was seen and loads; a broken pair is logged
    /// once per change and the served pair stays.
    fn consider(&mut self, now: Contents) {
        if now == self.seen {
            return;
        }
        let what = self.cert.display().to_string();
        match certified_key(&now.0, &now.1, &what) {
            Ok(ck) => {
                *self
                    .resolver
                    .current
                    .write()
                    .unwrap_or_else(|p| p.into_inner()) = Arc::new(ck);
                record_expiry(&now.0);
                tracing::info!(cert = %what, key = %self.key.display(), "Loaded a new cert/key pair");
            }
            Err(e) => tracing::error!(
                error = %e,
                "Failed to load the changed serving certificate files; still serving the previous pair"
            ),
        }
        self.seen = now;
    }
}

fn read_pair(cert: &std::path::Path, key: &std::path::Path) -> Result<Contents, ServingError> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| ServingError::Pair {
            path: p.display().to_string(),
            message: e.to_string(),
        })
    };
    Ok((read(cert)?, read(key)?))
}

/// `kubelet_certificate_manager_server_ttl_seconds` counts down to the served leaf's notAfter.
fn record_expiry(cert_pem: &[u8]) {
    let not_after = crate::certs::bootstrap::cert_validity(cert_pem).map(|(_, na)| na);
    crate::metrics::certificates().set_server_expiry(not_after);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn served(r: &FileCertResolver) -> Vec<u8> {
        r.current.read().unwrap().cert[0].as_ref().to_vec()
    }

    fn der(pem: &str) -> Vec<u8> {
        rustls_pemfile::certs(&mut pem.as_bytes())
            .next()
            .unwrap()
            .unwrap()
            .as_ref()
            .to_vec()
    }

    #[test]
    fn a_changed_pair_is_served_and_a_broken_one_keeps_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (c1, k1) = pair("one");
        std::fs::write(&c, &c1).unwrap();
        std::fs::write(&k, &k1).unwrap();
        let (resolver, mut reloader) = FileCertReloader::load(c.clone(), k.clone()).unwrap();
        assert_eq!(served(&resolver), der(&c1));
        // Unchanged files: nothing happens.
        reloader.consider(read_pair(&c, &k).unwrap());
        assert_eq!(served(&resolver), der(&c1));
        // A new certificate with the old key: refused, the old pair stays.
        let (c2, k2) = pair("two");
        std::fs::write(&c, &c2).unwrap();
        reloader.consider(read_pair(&c, &k).unwrap());
        assert_eq!(served(&resolver), der(&c1));
        // Its key arrives: the new pair is served.
        std::fs::write(&k, &k2).unwrap();
        reloader.consider(read_pair(&c, &k).unwrap());
        assert_eq!(served(&resolver), der(&c2));
    }

    #[test]
    fn a_broken_pair_at_start_fails_it() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (c1, _) = pair("one");
        let (_, k2) = pair("two");
        std::fs::write(&c, &c1).unwrap();
        std::fs::write(&k, &k2).unwrap();
        assert!(FileCertReloader::load(c, k).is_err());
    }
}
