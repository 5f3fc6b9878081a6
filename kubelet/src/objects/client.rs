//! The apiserver client: a `kube::Client` built from `--kubeconfig`, behind a client-side token
//! bucket (`kubeAPIQPS`/`kubeAPIBurst`, upstream's 50/100), and handed out through a
//! [`ClientHandle`] so that certificate rotation can swap in a client with the new certificate
//! and every long-running loop (watchers included) picks it up.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("building the apiserver client: {0}")]
    Build(#[from] kube::Error),
}

/// How long a connection attempt to the apiserver may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Server-side timeout for watches (the client notices a dead connection a little after it).
pub const WATCH_TIMEOUT_SECS: u32 = 60;
/// Upper bound for one ordinary (non-watch) request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A token bucket: `qps` tokens a second, at most `burst` stored.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: qps.max(0.001),
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Takes a token, or says how long until one is available.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

/// A tower layer limiting requests to a shared [`TokenBucket`] (client-go's `flowcontrol`
/// rate limiter, which the kubelet configures from kubeAPIQPS/kubeAPIBurst).
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<TokenBucket>>,
}

impl RateLimitLayer {
    pub fn new(qps: f64, burst: u32) -> Self {
        Self {
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, burst))),
        }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;
    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            sleep: None,
            reserved: false,
        }
    }
}

/// See [`RateLimitLayer`].
pub struct RateLimit<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
    sleep: Option<Pin<Box<Sleep>>>,
    reserved: bool,
}

impl<S, R> tower::Service<R> for RateLimit<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.reserved {
            if let Some(s) = self.sleep.as_mut() {
                if s.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            let taken = self
                .bucket
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .try_take(Instant::now());
            match taken {
                Ok(()) => self.reserved = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.reserved = false;
        self.inner.call(req)
    }
}

/// Reads a kubeconfig file into a `kube::Config` (client certificate files are read now).
pub async fn load_config(path: &Path) -> Result<kube::Config, ClientError> {
    let err = |message: String| ClientError::Kubeconfig {
        path: path.display().to_string(),
        message,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| err(e.to_string()))?;
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    Ok(config)
}

/// Builds a rate-limited client from a kubeconfig file. Requests are counted into
/// `rest_client_*` (inside the rate limiter, as client-go times them), and the expiry of the
/// kubeconfig's client certificate, when it has one, feeds
/// `kubelet_certificate_manager_client_ttl_seconds`.
pub async fn build(path: &Path, limiter: &RateLimitLayer) -> Result<kube::Client, ClientError> {
    let config = load_config(path).await?;
    if let Some(not_after) = client_cert_not_after(&config.auth_info).await {
        crate::metrics::certificates().set_client_expiry(Some(not_after));
    }
    let rest_metrics = plumbing::metrics::RestClientLayer::for_url(&config.cluster_url);
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&rest_metrics)
        .with_layer(limiter)
        .build())
}

/// The notAfter (unix seconds) of the kubeconfig user's client certificate, inline or in a file.
async fn client_cert_not_after(auth: &kube::config::AuthInfo) -> Option<i64> {
    use base64::Engine;
    let pem = match (&auth.client_certificate_data, &auth.client_certificate) {
        (Some(data), _) => base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .ok()?,
        (None, Some(file)) => tokio::fs::read(file).await.ok()?,
        (None, None) => return None,
    };
    x509_parser::pem::Pem::iter_from_buffer(&pem)
        .flatten()
        .find(|p| p.label == "CERTIFICATE")
        .and_then(|p| {
            p.parse_x509()
                .ok()
                .map(|c| c.validity().not_after.timestamp())
        })
}

/// The current apiserver client; replaced when the client certificate rotates.
#[derive(Clone)]
pub struct ClientHandle {
    rx: watch::Receiver<kube::Client>,
}

/// Publishes new clients to every [`ClientHandle`].
pub struct ClientPublisher {
    tx: watch::Sender<kube::Client>,
}

impl ClientHandle {
    pub fn new(client: kube::Client) -> (Self, ClientPublisher) {
        let (tx, rx) = watch::channel(client);
        (Self { rx }, ClientPublisher { tx })
    }

    /// The client to use for the next request.
    pub fn current(&self) -> kube::Client {
        self.rx.borrow().clone()
    }

    /// Resolves when a new client was published (watchers restart with it).
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            // The publisher is gone: the client never changes again.
            std::future::pending::<()>().await;
        }
    }

    /// Marks the current client as seen.
    pub fn mark_seen(&mut self) {
        self.rx.borrow_and_update();
    }
}

/// The kubelet's watches ([`plumbing::store::Reflector`]) start over on each new client.
impl plumbing::store::ClientSource for ClientHandle {
    fn client(&mut self) -> kube::Client {
        self.mark_seen();
        self.current()
    }
    fn replaced(&mut self) -> impl Future<Output = ()> + Send {
        self.changed()
    }
}

impl ClientPublisher {
    pub fn publish(&self, client: kube::Client) {
        self.tx.send_replace(client);
    }
}

/// Runs `f` with [`REQUEST_TIMEOUT`].
pub async fn timed<T>(f: impl Future<Output = Result<T, kube::Error>>) -> Result<T, kube::Error> {
    match tokio::time::timeout(REQUEST_TIMEOUT, f).await {
        Ok(r) => r,
        Err(_) => Err(kube::Error::Service("request timed out".into())),
    }
}

/// The HTTP status of an apiserver error answer, if it was one.
pub fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn client_certificate_expiry_is_read_inline_or_from_its_file() {
        use base64::Engine;
        let mut params = rcgen::CertificateParams::new(vec!["n".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2031, 3, 4);
        let cert = params
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let want = 1_930_348_800; // 2031-03-04T00:00:00Z
        let inline = kube::config::AuthInfo {
            client_certificate_data: Some(
                base64::engine::general_purpose::STANDARD.encode(cert.pem()),
            ),
            ..Default::default()
        };
        assert_eq!(client_cert_not_after(&inline).await, Some(want));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.pem");
        std::fs::write(&file, cert.pem()).unwrap();
        let from_file = kube::config::AuthInfo {
            client_certificate: Some(file.display().to_string()),
            ..Default::default()
        };
        assert_eq!(client_cert_not_after(&from_file).await, Some(want));
        // A token user has no certificate: the TTL gauge is left alone.
        let token = kube::config::AuthInfo {
            token: Some("t".to_string().into()),
            ..Default::default()
        };
        assert_eq!(client_cert_not_after(&token).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_burst_then_qps() {
        let mut b = TokenBucket::new(50.0, 100);
        let now = Instant::now();
        for _ in 0..100 {
            assert!(b.try_take(now).is_ok());
        }
        let wait = b.try_take(now).unwrap_err();
        assert!(
            wait <= Duration::from_millis(21) && wait >= Duration::from_millis(19),
            "{wait:?}"
        );
        assert!(b.try_take(now + Duration::from_millis(20)).is_ok());
        // After a long pause the bucket holds `burst`, not more.
        let later = now + Duration::from_secs(3600);
        for _ in 0..100 {
            assert!(b.try_take(later).is_ok());
        }
        assert!(b.try_take(later).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn layer_delays_requests_beyond_the_burst() {
        use tower::{Layer, Service, ServiceExt};
        let layer = RateLimitLayer::new(10.0, 2);
        let svc = tower::service_fn(|_: ()| async { Ok::<_, std::convert::Infallible>(()) });
        let mut svc = layer.layer(svc);
        let start = Instant::now();
        for _ in 0..4 {
            svc.ready().await.unwrap().call(()).await.unwrap();
        }
        // Two from the burst, then two at 10/s.
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(195) && took < Duration::from_millis(260),
            "{took:?}"
        );
    }
}
