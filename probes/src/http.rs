//! The httpGet probe (upstream `pkg/probe/http`), on a hyper 1 HTTP/1.1 client.
//!
//! Upstream behaviour kept here:
//! - `GET scheme://host:port/path`, `User-Agent: kube-probe/<major>.<minor>` and `Accept: */*`
//!   unless the probe sets them (an empty `Accept` removes the header), a `Host` header from
//!   `httpHeaders` overrides the request host, no keep-alive, no compression, no proxy.
//! - HTTPS does not verify the server certificate.
//! - Redirects: followed while the target hostname equals the original one, at most 10 requests;
//!   a redirect to another hostname is not followed and the 3xx response becomes a
//!   `Warning` ("Probe terminated redirects"), which the prober counts as success.
//! - 200 <= status < 400 is success; the body (capped at 10 KiB) is the output.
//! - `timeout` bounds the whole exchange, redirects and body included.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, CONNECTION, HOST, HeaderName, HeaderValue, LOCATION, USER_AGENT};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::outcome::ProbeOutcome;
use crate::tcp::{dial, join_host_port};

/// Upstream `maxRespBodyLength`: at most 10 KiB of the body is read.
pub const MAX_BODY: usize = 10 * 1024;
/// Upstream stops after this many requests in one redirect chain.
pub const MAX_REDIRECTS: usize = 10;

/// `HTTPGetAction.scheme`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Scheme {
    #[default]
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

/// A resolved httpGet probe target: the host is already defaulted to the pod IP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGetRequest {
    pub scheme: Scheme,
    pub host: String,
    pub port: u16,
    /// Path, possibly with a `?query`.
    pub path: String,
    /// `httpHeaders` in order; repeated names send repeated headers.
    pub headers: Vec<(String, String)>,
}

impl HttpGetRequest {
    /// The URL as upstream formats it (`scheme://host:port/path?query`).
    pub fn url(&self) -> String {
        Url {
            scheme: self.scheme,
            host: strip_brackets(&self.host).to_string(),
            port: self.port,
            path_and_query: path_and_query(&self.path),
        }
        .to_string()
    }
}

/// A reusable httpGet prober (holds the TLS configuration).
#[derive(Clone)]
pub struct HttpProber {
    tls: Arc<rustls::ClientConfig>,
}

impl fmt::Debug for HttpProber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpProber").finish_non_exhaustive()
    }
}

impl Default for HttpProber {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpProber {
    pub fn new() -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring provider supports the default protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoCertVerification(provider)))
            .with_no_client_auth();
        HttpProber { tls: Arc::new(tls) }
    }

    /// Runs one httpGet probe.
    pub async fn probe(&self, req: &HttpGetRequest, timeout: Duration) -> ProbeOutcome {
        let url = req.url();
        match tokio::time::timeout(timeout, self.run(req)).await {
            Ok(outcome) => outcome,
            Err(_) => ProbeOutcome::failure(format!(
                "Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            )),
        }
    }

    async fn run(&self, req: &HttpGetRequest) -> ProbeOutcome {
        let first = Url {
            scheme: req.scheme,
            host: strip_brackets(&req.host).to_string(),
            port: req.port,
            path_and_query: path_and_query(&req.path),
        };
        let headers = match build_headers(&req.headers) {
            Ok(h) => h,
            Err(e) => return ProbeOutcome::failure(format!("Get \"{first}\": {e}")),
        };
        let custom_host = req
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("host"))
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty());

        let mut url = first.clone();
        let mut host_header = custom_host;
        let mut requests = 0usize;
        loop {
            requests += 1;
            let resp = match self.send(&url, host_header.as_deref(), &headers).await {
                Ok(r) => r,
                Err(e) => return ProbeOutcome::failure(format!("Get \"{url}\": {e}")),
            };
            let status = resp.status();
            if is_redirect(status)
                && let Some(loc) = resp.headers().get(LOCATION)
            {
                let loc = String::from_utf8_lossy(loc.as_bytes()).into_owned();
                let next = match url.resolve(&loc) {
                    Ok(n) => n,
                    Err(e) => {
                        return ProbeOutcome::failure(format!(
                            "Get \"{url}\": failed to parse Location header {loc:?}: {e}"
                        ));
                    }
                };
                if !next.host.eq_ignore_ascii_case(&first.host) {
                    // Upstream's redirect checker returns the redirect itself for another host.
                    tracing::debug!(from = %url, to = %next, "probe not following redirect to another host");
                    return finish(status, resp).await;
                }
                if requests >= MAX_REDIRECTS {
                    return ProbeOutcome::failure(format!(
                        "Get \"{next}\": stopped after {MAX_REDIRECTS} redirects"
                    ));
                }
                // A custom Host header survives only a relative redirect (Go's net/http rule).
                if has_scheme(&loc) {
                    host_header = None;
                }
                url = next;
                continue;
            }
            return finish(status, resp).await;
        }
    }

    async fn send(
        &self,
        url: &Url,
        host_header: Option<&str>,
        headers: &[(HeaderName, HeaderValue)],
    ) -> Result<hyper::Response<Incoming>, String> {
        let addr = join_host_port(&url.host, url.port);
        // The outer timeout bounds the dial as well; the inner one only has to be long enough.
        let tcp = dial(&addr, Duration::from_secs(24 * 3600)).await?;
        let authority = host_header
            .map(str::to_string)
            .unwrap_or_else(|| url.authority());
        let mut builder = Request::get(url.path_and_query.as_str());
        builder = builder.header(HOST, authority);
        for (k, v) in headers {
            if k == HOST {
                continue;
            }
            builder = builder.header(k, v);
        }
        builder = builder.header(CONNECTION, "close");
        let request = builder
            .body(Empty::<Bytes>::new())
            .map_err(|e| format!("invalid request: {e}"))?;

        match url.scheme {
            Scheme::Http => send_on(TokioIo::new(tcp), request).await,
            Scheme::Https => {
                let name = ServerName::try_from(url.host.clone())
                    .map_err(|e| format!("invalid TLS server name {:?}: {e}", url.host))?;
                let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("tls: {e}"))?;
                send_on(TokioIo::new(tls), request).await
            }
        }
    }
}

async fn send_on<T>(
    io: TokioIo<T>,
    request: Request<Empty<Bytes>>,
) -> Result<hyper::Response<Incoming>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    // The connection task ends by itself once the response body is consumed or dropped
    // (and the sender is gone); `Connection: close` makes the server end it too.
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::trace!(error = %e, "probe connection ended");
        }
    });
    sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())
}

async fn finish(status: StatusCode, resp: hyper::Response<Incoming>) -> ProbeOutcome {
    let body = match read_capped(resp.into_body(), MAX_BODY).await {
        Ok(b) => b,
        // Upstream returns an error here, which the prober retries and then discards.
        Err(e) => return ProbeOutcome::unknown(format!("failed to read probe response body: {e}")),
    };
    let body = String::from_utf8_lossy(&body).into_owned();
    let code = status.as_u16();
    if (200..400).contains(&code) {
        if code >= 300 {
            return ProbeOutcome::warning(format!(
                "Probe terminated redirects, Response body: {body}"
            ));
        }
        return ProbeOutcome::success(body);
    }
    ProbeOutcome::failure(format!("HTTP probe failed with statuscode: {code}"))
}

async fn read_capped(mut body: Incoming, cap: usize) -> Result<Vec<u8>, hyper::Error> {
    let mut out = Vec::new();
    while out.len() < cap {
        match body.frame().await {
            None => break,
            Some(frame) => {
                if let Ok(data) = frame?.into_data() {
                    out.extend_from_slice(&data);
                }
            }
        }
    }
    if out.len() > cap {
        tracing::debug!(cap, "non fatal body truncation");
        out.truncate(cap);
    }
    Ok(out)
}

fn is_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

fn build_headers(input: &[(String, String)]) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut out = Vec::with_capacity(input.len() + 2);
    for (k, v) in input {
        let name = HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("net/http: invalid header field name {k:?}"))?;
        let value = HeaderValue::from_str(v)
            .map_err(|_| format!("net/http: invalid header field value for {k:?}"))?;
        out.push((name, value));
    }
    if !out.iter().any(|(k, _)| k == USER_AGENT) {
        out.push((
            USER_AGENT,
            HeaderValue::from_str(&crate::probe_user_agent()).expect("static user agent"),
        ));
    }
    match out.iter().find(|(k, _)| k == ACCEPT) {
        None => out.push((ACCEPT, HeaderValue::from_static("*/*"))),
        // Upstream: an Accept header overridden to empty is removed.
        Some((_, v)) if v.is_empty() => out.retain(|(k, _)| k != ACCEPT),
        Some(_) => {}
    }
    Ok(out)
}

fn strip_brackets(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// Path (escaped like Go's `url.URL.EscapedPath`) plus the raw query.
fn path_and_query(path: &str) -> String {
    let (p, q) = match path.find('?') {
        Some(i) => (&path[..i], Some(&path[i + 1..])),
        None => (path, None),
    };
    let mut out = String::with_capacity(path.len() + 1);
    if !p.starts_with('/') {
        out.push('/');
    }
    for b in p.bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-_.~$&+,/:;=@".contains(&b);
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if let Some(q) = q {
        out.push('?');
        out.push_str(q);
    }
    out
}

fn has_scheme(loc: &str) -> bool {
    match loc.find(':') {
        Some(i) => {
            let s = &loc[..i];
            !s.is_empty()
                && s.as_bytes()[0].is_ascii_alphabetic()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-' || b == b'.')
                && !loc[..i].contains('/')
        }
        None => false,
    }
}

/// The small URL model the redirect logic needs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Url {
    scheme: Scheme,
    /// Hostname without brackets.
    host: String,
    port: u16,
    path_and_query: String,
}

impl Url {
    fn authority(&self) -> String {
        join_host_port(&self.host, self.port)
    }

    /// Resolves a `Location` value against this URL (RFC 3986 §5.2, fragments dropped).
    fn resolve(&self, loc: &str) -> Result<Url, String> {
        let loc = loc.split('#').next().unwrap_or("");
        if has_scheme(loc) {
            let i = loc.find(':').expect("has_scheme checked");
            let scheme = match loc[..i].to_ascii_lowercase().as_str() {
                "http" => Scheme::Http,
                "https" => Scheme::Https,
                other => return Err(format!("unsupported protocol scheme {other:?}")),
            };
            let rest = loc[i + 1..]
                .strip_prefix("//")
                .ok_or_else(|| "missing authority".to_string())?;
            return Self::from_authority_and_rest(scheme, rest);
        }
        if let Some(rest) = loc.strip_prefix("//") {
            return Self::from_authority_and_rest(self.scheme, rest);
        }
        let (base_path, _) = split_query(&self.path_and_query);
        let path_and_query = if loc.is_empty() {
            self.path_and_query.clone()
        } else if loc.starts_with('/') {
            let (p, q) = split_query(loc);
            join_query(&remove_dot_segments(p), q)
        } else if let Some(q) = loc.strip_prefix('?') {
            format!("{base_path}?{q}")
        } else {
            let dir = match base_path.rfind('/') {
                Some(i) => &base_path[..=i],
                None => "/",
            };
            let (p, q) = split_query(loc);
            join_query(&remove_dot_segments(&format!("{dir}{p}")), q)
        };
        Ok(Url {
            scheme: self.scheme,
            host: self.host.clone(),
            port: self.port,
            path_and_query,
        })
    }

    fn from_authority_and_rest(scheme: Scheme, rest: &str) -> Result<Url, String> {
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let authority = authority.rsplit('@').next().unwrap_or(authority);
        let (host, port) = if let Some(r) = authority.strip_prefix('[') {
            let close = r.find(']').ok_or("missing ']' in host")?;
            let host = &r[..close];
            let port = r[close + 1..].strip_prefix(':');
            (host, port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err("empty host".into());
        }
        let port = match port {
            None | Some("") => scheme.default_port(),
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| format!("invalid port {p:?}"))?,
        };
        let path_and_query = if tail.is_empty() {
            "/".to_string()
        } else if tail.starts_with('?') {
            format!("/{tail}")
        } else {
            let (p, q) = split_query(tail);
            join_query(&remove_dot_segments(p), q)
        };
        Ok(Url {
            scheme,
            host: host.to_string(),
            port,
            path_and_query,
        })
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.scheme.as_str(),
            self.authority(),
            self.path_and_query
        )
    }
}

fn split_query(s: &str) -> (&str, Option<&str>) {
    match s.find('?') {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    }
}

fn join_query(path: &str, q: Option<&str>) -> String {
    match q {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    }
}

fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segs: Vec<&str> = path.split('/').collect();
    let n = segs.len();
    for (i, seg) in segs.iter().enumerate() {
        match *seg {
            "." => {
                if i == n - 1 {
                    out.push("");
                }
            }
            ".." => {
                if out.len() > 1 {
                    out.pop();
                }
                if i == n - 1 {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    let joined = out.join("/");
    if joined.starts_with('/') {
        joined
    } else {
        format!("/{joined}")
    }
}

/// Accepts any server certificate (upstream uses `InsecureSkipVerify: true`), while still
/// checking the handshake signatures with the provider's algorithms.
#[derive(Debug)]
struct NoCertVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoCertVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
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
            &self.0.signature_verification_algorithms,
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
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Url {
        Url {
            scheme: Scheme::Http,
            host: "10.0.0.1".into(),
            port: 8080,
            path_and_query: "/a/b?x=1".into(),
        }
    }

    #[test]
    fn resolves_locations() {
        let b = base();
        assert_eq!(
            b.resolve("/c").unwrap().to_string(),
            "http://10.0.0.1:8080/c"
        );
        assert_eq!(
            b.resolve("c?y").unwrap().to_string(),
            "http://10.0.0.1:8080/a/c?y"
        );
        assert_eq!(
            b.resolve("../d").unwrap().to_string(),
            "http://10.0.0.1:8080/d"
        );
        assert_eq!(
            b.resolve("?z").unwrap().to_string(),
            "http://10.0.0.1:8080/a/b?z"
        );
        assert_eq!(
            b.resolve("https://example.com/x#frag").unwrap().to_string(),
            "https://example.com:443/x"
        );
        assert_eq!(
            b.resolve("//[fd00::1]:81").unwrap().to_string(),
            "http://[fd00::1]:81/"
        );
        assert!(b.resolve("ftp://x/").is_err());
    }

    #[test]
    fn formats_url_like_upstream() {
        let r = HttpGetRequest {
            scheme: Scheme::Https,
            host: "fd00::1".into(),
            port: 443,
            path: "healthz x?verbose=1".into(),
            headers: vec![],
        };
        assert_eq!(r.url(), "https://[fd00::1]:443/healthz%20x?verbose=1");
    }

    #[test]
    fn default_headers() {
        let h = build_headers(&[]).unwrap();
        assert!(h.contains(&(USER_AGENT, HeaderValue::from_static("kube-probe/1.36"))));
        assert!(h.contains(&(ACCEPT, HeaderValue::from_static("*/*"))));

        let h = build_headers(&[
            ("user-agent".into(), "mine".into()),
            ("Accept".into(), "".into()),
        ])
        .unwrap();
        assert_eq!(h, vec![(USER_AGENT, HeaderValue::from_static("mine"))]);
    }
}
