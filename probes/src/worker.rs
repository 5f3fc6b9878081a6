//! One probe worker: probes one container for one [`ProbeKind`] on a period, applying
//! upstream's `worker.go` rules (initial delay, thresholds, startup gating, hold after a
//! liveness/startup failure until the container ID changes).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::exec::{self, ExecRunner};
use crate::http::HttpProber;
use crate::metrics::{RESULT_FAILED, RESULT_SUCCESSFUL, WorkerMetrics};
use crate::outcome::{ProbeOutcome, ProbeResult};
use crate::results::{ProbeStatus, ResultsCache};
use crate::spec::{Handler, ProbeKind, ProbeSpec};
use crate::types::{PodRef, ProbeUpdate};
use crate::{grpc, tcp};

/// Upstream `maxProbeRetries`: a probe that errors is retried this many times in a row.
const MAX_PROBE_RETRIES: usize = 3;

/// What the worker knows about its container; the manager updates it through a watch channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContainerState {
    pub container_id: String,
    pub started_at: Instant,
    pub running: bool,
    pub pod_ip: String,
}

/// Told about every failed probe and every warning, below the thresholds too (upstream records
/// an `Unhealthy` / `ProbeWarning` event each time).
pub trait ProbeEvents: Send + Sync {
    fn probe_failed(&self, pod: &PodRef, container: &str, kind: ProbeKind, output: &str);
    fn probe_warning(&self, pod: &PodRef, container: &str, kind: ProbeKind, output: &str);
}

/// Things every worker shares with the manager.
pub(crate) struct Shared {
    pub results: ResultsCache,
    pub updates: mpsc::Sender<ProbeUpdate>,
    pub http: HttpProber,
    pub events: std::sync::OnceLock<Arc<dyn ProbeEvents>>,
}

pub(crate) struct Worker {
    pub pod: Arc<PodRef>,
    pub container_name: String,
    pub spec: ProbeSpec,
    /// Whether the container has a startup probe (which gates liveness and readiness).
    pub has_startup_probe: bool,
    pub state: watch::Receiver<ContainerState>,
    pub exec: Arc<dyn ExecRunner>,
    pub shared: Arc<Shared>,
    pub metrics: WorkerMetrics,
    pub stop: CancellationToken,
    /// Random delay before the first probe (upstream only jitters right after kubelet start).
    pub jitter: Duration,

    // Loop state, as in upstream's worker struct.
    pub container_id: Option<String>,
    pub last_result: Option<ProbeStatus>,
    pub result_run: u32,
    pub on_hold: bool,
}

impl Worker {
    fn initial_value(&self) -> ProbeStatus {
        match self.spec.kind {
            ProbeKind::Readiness => ProbeStatus::Failure,
            ProbeKind::Liveness => ProbeStatus::Success,
            ProbeKind::Startup => ProbeStatus::Unknown,
        }
    }

    pub(crate) async fn run(mut self) {
        tracing::debug!(pod_uid = %self.pod.uid, container = %self.container_name, kind = %self.spec.kind, "probe worker started");
        if !self.jitter.is_zero() {
            tokio::select! {
                _ = self.stop.cancelled() => return self.exit(),
                _ = tokio::time::sleep(self.jitter) => {}
            }
        }
        let period = self.spec.period();
        let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        loop {
            let stop = self.stop.clone();
            let keep_going = tokio::select! {
                _ = stop.cancelled() => false,
                keep = self.do_probe() => keep,
            };
            if !keep_going {
                break;
            }
            tokio::select! {
                _ = self.stop.cancelled() => break,
                _ = ticker.tick() => {}
            }
        }
        self.exit();
    }

    fn exit(&self) {
        self.metrics.delete();
        tracing::debug!(pod_uid = %self.pod.uid, container = %self.container_name, kind = %self.spec.kind, "probe worker stopped");
    }

    /// Probes once and records the result. Returns whether the worker should continue.
    async fn do_probe(&mut self) -> bool {
        let start = Instant::now();
        let state = self.state.borrow_and_update().clone();
        let kind = self.spec.kind;

        if self.container_id.as_deref() != Some(state.container_id.as_str()) {
            if let Some(old) = self.container_id.take() {
                self.shared.results.remove(&old, kind);
            }
            self.container_id = Some(state.container_id.clone());
            self.set_result(&state.container_id, self.initial_value(), String::new())
                .await;
            // A new container: resume probing.
            self.on_hold = false;
        }
        if self.on_hold {
            return true;
        }
        if !state.running {
            tracing::trace!(pod_uid = %self.pod.uid, container = %self.container_name, %kind, "non-running container probed");
            self.set_result(&state.container_id, ProbeStatus::Failure, String::new())
                .await;
            return true;
        }
        // Probing is disabled for initialDelaySeconds (whole seconds, as upstream truncates).
        if start.saturating_duration_since(state.started_at).as_secs()
            < u64::from(self.spec.initial_delay_seconds)
        {
            return true;
        }
        let started = !self.has_startup_probe
            || self
                .shared
                .results
                .get(&state.container_id, ProbeKind::Startup)
                == Some(ProbeStatus::Success);
        match (started, kind) {
            // Startup probing stops once the container has started.
            (true, ProbeKind::Startup) => return true,
            // Other probes wait for the startup probe to succeed.
            (false, ProbeKind::Liveness | ProbeKind::Readiness) => return true,
            _ => {}
        }

        let Some(outcome) = self.probe_with_retries(&state).await else {
            return true;
        };
        let result = match outcome.result {
            ProbeResult::Success => ProbeStatus::Success,
            ProbeResult::Warning => {
                tracing::warn!(pod_uid = %self.pod.uid, container = %self.container_name, %kind, output = %outcome.output, "probe warning");
                if let Some(e) = self.shared.events.get() {
                    e.probe_warning(&self.pod, &self.container_name, kind, &outcome.output);
                }
                ProbeStatus::Success
            }
            ProbeResult::Failure | ProbeResult::Unknown => {
                tracing::info!(pod_uid = %self.pod.uid, pod = %self.pod.name, container = %self.container_name, %kind, output = %outcome.output, "probe failed");
                if let Some(e) = self.shared.events.get() {
                    e.probe_failed(&self.pod, &self.container_name, kind, &outcome.output);
                }
                ProbeStatus::Failure
            }
        };
        let label = if result == ProbeStatus::Success {
            RESULT_SUCCESSFUL
        } else {
            RESULT_FAILED
        };
        self.metrics.record(label, start.elapsed().as_secs_f64());

        if self.last_result == Some(result) {
            self.result_run += 1;
        } else {
            self.last_result = Some(result);
            self.result_run = 1;
        }
        if (result == ProbeStatus::Failure && self.result_run < self.spec.failure_threshold)
            || (result == ProbeStatus::Success && self.result_run < self.spec.success_threshold)
        {
            // Below the threshold: leave the probe state unchanged.
            return true;
        }
        self.set_result(&state.container_id, result, outcome.output)
            .await;
        if matches!(kind, ProbeKind::Liveness | ProbeKind::Startup)
            && result == ProbeStatus::Failure
        {
            // The container will be restarted: stop probing until a new container ID shows up.
            self.on_hold = true;
            self.result_run = 0;
        }
        true
    }

    /// Runs the handler; an `Unknown` outcome (an error on our side) is retried, and if it
    /// persists the result is thrown away (`None`), as upstream does.
    async fn probe_with_retries(&self, state: &ContainerState) -> Option<ProbeOutcome> {
        let mut last = None;
        for _ in 0..MAX_PROBE_RETRIES {
            let outcome = self.run_handler(state).await;
            if outcome.result != ProbeResult::Unknown {
                return Some(outcome);
            }
            last = Some(outcome);
        }
        if let Some(o) = last {
            tracing::warn!(pod_uid = %self.pod.uid, container = %self.container_name, kind = %self.spec.kind, error = %o.output, "probe errored; result discarded");
        }
        None
    }

    async fn run_handler(&self, state: &ContainerState) -> ProbeOutcome {
        let timeout = self.spec.timeout();
        match &self.spec.handler {
            Handler::Exec { command } => {
                exec::probe(&*self.exec, &state.container_id, command, timeout).await
            }
            Handler::HttpGet(h) => {
                self.shared
                    .http
                    .probe(&h.request(&state.pod_ip), timeout)
                    .await
            }
            Handler::TcpSocket { host, port } => {
                tcp::probe(host.as_deref().unwrap_or(&state.pod_ip), *port, timeout).await
            }
            Handler::Grpc { port, service } => {
                grpc::probe(&state.pod_ip, *port, service, timeout).await
            }
        }
    }

    /// Stores a result and, when it changed, sends an update (upstream `results.Manager.Set`).
    async fn set_result(&self, container_id: &str, result: ProbeStatus, message: String) {
        let kind = self.spec.kind;
        if !self
            .shared
            .results
            .set_unless_stopped(container_id, kind, result, &self.stop)
        {
            return;
        }
        let termination_grace_period_seconds = match (kind, result) {
            (ProbeKind::Liveness | ProbeKind::Startup, ProbeStatus::Failure) => {
                self.spec.termination_grace_period_seconds
            }
            _ => None,
        };
        let update = ProbeUpdate {
            pod_uid: self.pod.uid.clone(),
            container_name: self.container_name.clone(),
            container_id: container_id.to_string(),
            kind,
            result,
            message,
            termination_grace_period_seconds,
        };
        tokio::select! {
            _ = self.stop.cancelled() => {}
            sent = self.shared.updates.send(update) => {
                if sent.is_err() {
                    tracing::debug!("probe updates receiver dropped");
                }
            }
        }
    }
}
