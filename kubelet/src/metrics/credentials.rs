//! Image credential provider plugin metrics: `kubelet_credential_provider_plugin_errors`
//! (runs that failed or timed out) and `kubelet_credential_provider_plugin_duration` (every
//! run), by `plugin_name`, under upstream's names, help texts and buckets.
//!
//! Recorded with `metrics::credential_plugins().observe_run(plugin, elapsed, ok)`.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{CounterVec, HistogramVec};

use super::{DEF_BUCKETS, counter_vec, histogram_vec};

/// The credential provider plugin families of the process.
pub struct CredentialPlugins {
    pub errors: CounterVec,
    pub duration: HistogramVec,
}

static CREDENTIAL_PLUGINS: LazyLock<CredentialPlugins> = LazyLock::new(|| CredentialPlugins {
    errors: counter_vec(
        "kubelet_credential_provider_plugin_errors",
        "Number of errors from credential provider plugin",
        &["plugin_name"],
    ),
    duration: histogram_vec(
        "kubelet_credential_provider_plugin_duration",
        "Duration of execution in seconds for credential provider plugin",
        DEF_BUCKETS.to_vec(),
        &["plugin_name"],
    ),
});

/// The process's credential provider plugin families.
pub fn credential_plugins() -> &'static CredentialPlugins {
    &CREDENTIAL_PLUGINS
}

impl CredentialPlugins {
    /// One run of `plugin` took `elapsed`; `ok` is false when it exited non-zero, could not
    /// start or was killed at the timeout (a malformed answer is not a run error, as upstream).
    pub fn observe_run(&self, plugin: &str, elapsed: Duration, ok: bool) {
        self.duration
            .with_label_values(&[plugin])
            .observe(elapsed.as_secs_f64());
        if !ok {
            self.errors.with_label_values(&[plugin]).inc();
        }
    }

    fn all(&self) -> Vec<(Box<dyn Collector>, &'static str)> {
        vec![
            (Box::new(self.errors.clone()), "counter"),
            (Box::new(self.duration.clone()), "histogram"),
        ]
    }

    pub(super) fn collectors(&self) -> Vec<Box<dyn Collector>> {
        self.all().into_iter().map(|(c, _)| c).collect()
    }

    /// Every family here carries no samples until a plugin runs.
    pub(super) fn may_be_empty(&self) -> Vec<(Box<dyn Collector>, &'static str)> {
        self.all()
    }
}
