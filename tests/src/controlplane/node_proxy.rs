//! `nodes/{name}/proxy/{path}`: the apiserver's proxy to a node's kubelet, as upstream's
//! node REST proxy does it. The kubelet is reached at the Node's first address of kubeadm's
//! `--kubelet-preferred-address-types` order (InternalIP, ExternalIP, Hostname) on
//! `status.daemonEndpoints.kubeletEndpoint.Port`, over HTTPS with the control plane's kubelet
//! client certificate (kubeadm's `apiserver-kubelet-client`: CN `kube-apiserver-kubelet-client`,
//! O `kubeadm:cluster-admins`). The kubelet's serving certificate is not verified, as upstream
//! without `--kubelet-certificate-authority`. The caller's credentials are not passed on; the
//! path below `proxy`, the query, the body and its Content-Type / Accept are. The answer is
//! read whole (bounded in size and time) and handed back with its status and Content-Type
//! (the server boxes it).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use serde_json::Value;
use tokio_rustls::TlsConnector;

use super::pki::Authority;
use super::status::ApiError;

/// The whole exchange with the kubelet (connect, TLS, request, answer) ends within this.
const TIMEOUT: Duration = Duration::from_secs(40);
/// Largest answer passed back.
const MAX_ANSWER: usize = 16 << 20;
/// Largest request body passed on.
const MAX_REQUEST: usize = 1 << 20;

/// User name and groups of the control plane's kubelet client certificate.
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";
pub const KUBELET_CLIENT_GROUP: &str = "kubeadm:cluster-admins";

/// `(node name, path below proxy with its leading slash)` when `path` is a node proxy path.
pub fn parse(path: &str) -> Option<(String, String)> {
    let rest = path.strip_prefix("/api/v1/nodes/")?;
    let (name, rest) = rest.split_once('/')?;
    let below = rest.strip_prefix("proxy")?;
    if !(below.is_empty() || below.starts_with('/')) || name.is_empty() {
        return None;
    }
    let below = if below.is_empty() { "/" } else { below };
    Some((name.to_string(), below.to_string()))
}

/// The RBAC verb of a proxy request (upstream maps the HTTP method as for other requests).
pub fn verb(method: &Method) -> Option<&'static str> {
    Some(match *method {
        Method::GET | Method::HEAD => "get",
        Method::PUT => "update",
        Method::POST => "create",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => return None,
    })
}

/// `host:port` of the node's kubelet, or upstream's 503 message.
pub fn kubelet_address(node: &Value) -> Result<String, ApiError> {
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .filter(|p| (1..=65535).contains(p))
        .unwrap_or(10250);
    let addrs: Vec<(&str, &str)> = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| Some((x["type"].as_str()?, x["address"].as_str()?)))
                .collect()
        })
        .unwrap_or_default();
    for ty in ["InternalIP", "ExternalIP", "Hostname"] {
        if let Some((_, a)) = addrs.iter().find(|(t, _)| *t == ty) {
            let host = if a.contains(':') {
                format!("[{a}]")
            } else {
                a.to_string()
            };
            return Ok(format!("{host}:{port}"));
        }
    }
    let known: Vec<String> = addrs.iter().map(|(t, a)| format!("{{{t} {a}}}")).collect();
    Err(ApiError::new(
        503,
        "ServiceUnavailable",
        format!(
            "no preferred addresses found; known addresses: [{}]",
            known.join(" ")
        ),
    ))
}

#[derive(Debug)]
struct AnyServerCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
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
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn client_config(ca: &Authority) -> Result<rustls::ClientConfig, String> {
    let issued = ca
        .client_cert(
            KUBELET_CLIENT_USER,
            &[KUBELET_CLIENT_GROUP],
            Duration::from_secs(3600),
        )
        .map_err(|e| format!("kubelet client certificate: {e}"))?;
    let cert = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes())
        .map_err(|e| format!("kubelet client certificate: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes())
        .map_err(|e| format!("kubelet client key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServerCert(provider)))
        .with_client_auth_cert(vec![cert], key)
        .map_err(|e| format!("kubelet client certificate: {e}"))
}

fn unreachable(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        503,
        "ServiceUnavailable",
        format!("error trying to reach service: {e}"),
    )
}

async fn exchange(
    ca: &Authority,
    addr: &str,
    method: Method,
    path_and_query: &str,
    headers: Vec<(header::HeaderName, HeaderValue)>,
    body: Bytes,
) -> Result<Response<Bytes>, ApiError> {
    let config = client_config(ca).map_err(ApiError::internal)?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| unreachable(format!("dial tcp {addr}: {e}")))?;
    let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr);
    let sni = ServerName::try_from(host.trim_matches(['[', ']']).to_string())
        .map_err(|e| unreachable(format!("server name {host}: {e}")))?;
    let tls = TlsConnector::from(Arc::new(config))
        .connect(sni, tcp)
        .await
        .map_err(|e| unreachable(format!("tls: {e}")))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(unreachable)?;
    let driver = tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path_and_query)
        .header(header::HOST, addr);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let resp = send.send_request(req).await.map_err(unreachable)?;
    let (parts, incoming) = resp.into_parts();
    let bytes = Limited::new(incoming, MAX_ANSWER)
        .collect()
        .await
        .map_err(unreachable)?
        .to_bytes();
    driver.abort();
    let mut out = Response::new(bytes);
    *out.status_mut() = parts.status;
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
        out.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
    }
    Ok(out)
}

/// Proxies `req` (already authenticated and authorized) to node `node`'s kubelet at `below`.
pub async fn proxy(
    ca: Arc<Authority>,
    node: &Value,
    below: &str,
    query_raw: &str,
    req: Request<Incoming>,
) -> Result<Response<Bytes>, ApiError> {
    let addr = kubelet_address(node)?;
    let method = req.method().clone();
    let mut headers = Vec::new();
    for h in [header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = req.headers().get(&h) {
            headers.push((h, v.clone()));
        }
    }
    let body = Limited::new(req.into_body(), MAX_REQUEST)
        .collect()
        .await
        .map_err(|e| ApiError::bad_request(format!("reading request body: {e}")))?
        .to_bytes();
    let pq = if query_raw.is_empty() {
        below.to_string()
    } else {
        format!("{below}?{query_raw}")
    };
    tokio::time::timeout(TIMEOUT, exchange(&ca, &addr, method, &pq, headers, body))
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::new(
                504,
                "Timeout",
                format!("the kubelet at {addr} did not answer within {TIMEOUT:?}"),
            ))
        })
}

#[cfg(test)]
mod tests;
