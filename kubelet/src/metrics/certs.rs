//! Certificate manager metrics: the TTL of the client and serving certificates (computed
//! when scraped from the expiry recorded here; `+Inf` while none is known, as upstream) and
//! the renewal error counters.

use std::sync::{LazyLock, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Gauge};

use super::{counter, gauge};

/// A gauge whose value is `expiry - now` in seconds at scrape time.
struct TtlGauge {
    gauge: Gauge,
    expiry_unix: Mutex<Option<f64>>,
}

impl TtlGauge {
    fn new(name: &str, text: &str) -> Self {
        Self {
            gauge: gauge(name, text),
            expiry_unix: Mutex::new(None),
        }
    }

    fn set_expiry(&self, unix: Option<i64>) {
        *self.expiry_unix.lock().unwrap_or_else(|p| p.into_inner()) = unix.map(|u| u as f64);
    }

    fn ttl(&self) -> f64 {
        let expiry = *self.expiry_unix.lock().unwrap_or_else(|p| p.into_inner());
        match expiry {
            Some(e) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                e - now
            }
            None => f64::INFINITY,
        }
    }
}

/// Registers the TTL gauge through a shared handle.
#[derive(Clone)]
struct TtlCollector(&'static TtlGauge);

impl Collector for TtlCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.0.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.0.gauge.set(self.0.ttl());
        self.0.gauge.collect()
    }
}

/// The certificate families of the process.
pub struct Certificates {
    client_ttl: TtlGauge,
    server_ttl: TtlGauge,
    /// `kubelet_certificate_manager_client_expiration_renew_errors`.
    pub client_renew_errors: Counter,
    /// `kubelet_server_expiration_renew_errors`.
    pub server_renew_errors: Counter,
}

static CERTS: LazyLock<Certificates> = LazyLock::new(|| Certificates {
    client_ttl: TtlGauge::new(
        "kubelet_certificate_manager_client_ttl_seconds",
        "Gauge of the TTL (time-to-live) of the Kubelet's client certificate. The value is in seconds until certificate expiry (negative if already expired). If client certificate is invalid or unused, the value will be +INF.",
    ),
    server_ttl: TtlGauge::new(
        "kubelet_certificate_manager_server_ttl_seconds",
        "Gauge of the shortest TTL (time-to-live) of the Kubelet's serving certificate. The value is in seconds until certificate expiry (negative if already expired). If serving certificate is invalid or unused, the value will be +INF.",
    ),
    client_renew_errors: counter(
        "kubelet_certificate_manager_client_expiration_renew_errors",
        "Counter of certificate renewal errors.",
    ),
    server_renew_errors: counter(
        "kubelet_server_expiration_renew_errors",
        "Counter of certificate renewal errors.",
    ),
});

/// The process's certificate metrics.
pub fn certificates() -> &'static Certificates {
    &CERTS
}

impl Certificates {
    /// Records the client certificate's notAfter (unix seconds), or that none is in use.
    pub fn set_client_expiry(&self, not_after_unix: Option<i64>) {
        self.client_ttl.set_expiry(not_after_unix);
    }

    /// Records the serving certificate's notAfter (unix seconds), or that none is in use.
    pub fn set_server_expiry(&self, not_after_unix: Option<i64>) {
        self.server_ttl.set_expiry(not_after_unix);
    }

    /// The client certificate's TTL as a scrape would read it now.
    pub fn client_ttl(&self) -> f64 {
        self.client_ttl.ttl()
    }

    pub(super) fn collectors(&'static self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(TtlCollector(&self.client_ttl)),
            Box::new(TtlCollector(&self.server_ttl)),
            Box::new(self.client_renew_errors.clone()),
            Box::new(self.server_renew_errors.clone()),
        ]
    }
}
