//! Metrics every Kubernetes component exposes, shared by kube-proxy and the kubelet (the
//! rest-client metrics layer and the common families):
//! `process_*` (the `prometheus` crate's process collector, Linux only), `rest_client_*`
//! from a tower layer on the apiserver client (client-go's names, labels and buckets), and
//! `tokio_alive_tasks`, our stand-in for Go's `go_goroutines`.
//!
//! The `rest_client_*` families are process-wide, as client-go's are: every client built with
//! [`RestClientLayer`] counts into the same families, and each registry that
//! [`register_common`] is called on exposes them.

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{CounterVec, HistogramOpts, HistogramVec, IntGauge, Opts, Registry};

/// client-go's request latency buckets (seconds).
pub const REST_CLIENT_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// The `rest_client_*` families of this process.
#[derive(Clone, Debug)]
pub struct RestClientMetrics {
    /// `rest_client_requests_total{code,method,host}`; `code` is `<error>` when no answer came.
    pub requests: CounterVec,
    /// `rest_client_request_duration_seconds{verb,host}`: until the response headers arrive.
    pub duration: HistogramVec,
}

static REST_CLIENT: LazyLock<RestClientMetrics> = LazyLock::new(|| RestClientMetrics {
    requests: CounterVec::new(
        Opts::new(
            "rest_client_requests_total",
            "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host.",
        ),
        &["code", "method", "host"],
    )
    .expect("valid metric"),
    duration: HistogramVec::new(
        HistogramOpts::new(
            "rest_client_request_duration_seconds",
            "[ALPHA] Request latency in seconds. Broken down by verb, and host.",
        )
        .buckets(REST_CLIENT_BUCKETS.to_vec()),
        &["verb", "host"],
    )
    .expect("valid metric"),
});

/// The process-wide `rest_client_*` families.
pub fn rest_client() -> &'static RestClientMetrics {
    &REST_CLIENT
}

/// Registers `process_*`, `rest_client_*` and `tokio_alive_tasks` in `registry`. Call it from
/// inside the tokio runtime whose tasks the gauge should count.
pub fn register_common(registry: &Registry) -> prometheus::Result<()> {
    #[cfg(target_os = "linux")]
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    let rc = rest_client();
    registry.register(Box::new(rc.requests.clone()))?;
    registry.register(Box::new(rc.duration.clone()))?;
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        registry.register(Box::new(TaskGauge::new(handle)?))?;
    }
    Ok(())
}

/// `tokio_alive_tasks`: the tasks alive in the process's tokio runtime when scraped. Go
/// components expose `go_goroutines`; this gauge answers the same question (is the agent
/// leaking concurrent work?) for a tokio program, under a name of our own.
struct TaskGauge {
    handle: tokio::runtime::Handle,
    gauge: IntGauge,
}

impl TaskGauge {
    fn new(handle: tokio::runtime::Handle) -> prometheus::Result<Self> {
        let gauge = IntGauge::new(
            "tokio_alive_tasks",
            "Number of tasks alive in the tokio runtime (this agent's stand-in for go_goroutines).",
        )?;
        Ok(Self { handle, gauge })
    }
}

impl Collector for TaskGauge {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let n = self.handle.metrics().num_alive_tasks();
        self.gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
        self.gauge.collect()
    }
}

/// A tower layer counting every apiserver request into [`rest_client`]. `host` is the
/// apiserver's `host:port` (the request URIs the layer sees are relative: kube adds the base
/// URI further in).
#[derive(Clone, Debug)]
pub struct RestClientLayer {
    host: String,
}

impl RestClientLayer {
    pub fn new(host: impl Into<String>) -> Self {
        Self { host: host.into() }
    }

    /// The layer for a cluster URL (`https://10.0.0.1:6443` → host `10.0.0.1:6443`).
    pub fn for_url(url: &http::Uri) -> Self {
        let host = url
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_default();
        Self::new(host)
    }
}

impl<S> tower::Layer<S> for RestClientLayer {
    type Service = RestClient<S>;
    fn layer(&self, inner: S) -> RestClient<S> {
        RestClient {
            inner,
            host: self.host.clone(),
        }
    }
}

/// See [`RestClientLayer`].
#[derive(Clone, Debug)]
pub struct RestClient<S> {
    inner: S,
    host: String,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, B, RB> tower::Service<http::Request<B>> for RestClient<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.method().as_str().to_string();
        let host = self.host.clone();
        let started = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            let m = rest_client();
            m.duration
                .with_label_values(&[method.as_str(), host.as_str()])
                .observe(started.elapsed().as_secs_f64());
            let code = match &res {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            m.requests
                .with_label_values(&[code.as_str(), method.as_str(), host.as_str()])
                .inc();
            res
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    fn count(code: &str, method: &str, host: &str) -> f64 {
        rest_client()
            .requests
            .with_label_values(&[code, method, host])
            .get()
    }

    #[tokio::test]
    async fn layer_counts_answers_and_errors_by_code_method_and_host() {
        let host = "layer-test.invalid:6443";
        let svc = tower::service_fn(|req: http::Request<()>| async move {
            if req.uri().path() == "/fail" {
                Err("connection refused")
            } else {
                Ok(http::Response::builder().status(201).body(()).unwrap())
            }
        });
        let mut svc = RestClientLayer::new(host).layer(svc);
        let (ok_before, err_before) = (count("201", "POST", host), count("<error>", "GET", host));
        let req = http::Request::post("/api/v1/pods").body(()).unwrap();
        svc.ready().await.unwrap().call(req).await.unwrap();
        let req = http::Request::get("/fail").body(()).unwrap();
        assert!(svc.ready().await.unwrap().call(req).await.is_err());
        assert_eq!(count("201", "POST", host), ok_before + 1.0);
        assert_eq!(count("<error>", "GET", host), err_before + 1.0);
        let h = rest_client().duration.with_label_values(&["POST", host]);
        assert!(h.get_sample_count() >= 1);
    }

    #[test]
    fn host_comes_from_the_cluster_url() {
        let l = RestClientLayer::for_url(&"https://10.0.0.1:6443".parse().unwrap());
        assert_eq!(l.host, "10.0.0.1:6443");
    }

    #[tokio::test]
    async fn common_families_are_exposed() {
        let r = Registry::new();
        register_common(&r).unwrap();
        rest_client()
            .requests
            .with_label_values(&["200", "GET", "exposed.invalid"])
            .inc();
        let names: Vec<String> = r.gather().iter().map(|f| f.name().to_string()).collect();
        for want in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
            "rest_client_requests_total",
            "tokio_alive_tasks",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
        }
    }
}
