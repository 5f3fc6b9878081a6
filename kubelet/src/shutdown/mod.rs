//! Graceful node shutdown, as upstream's node shutdown manager: with `shutdownGracePeriod` (and
//! `shutdownGracePeriodCriticalPods`) or `shutdownGracePeriodByPodPriority` set, the kubelet
//! holds a logind *delay* inhibitor; when logind announces `PrepareForShutdown(true)` it marks
//! the node NotReady ("node is shutting down"), rejects new pods, and stops running pods group
//! by group from the lowest priority up, each within its group's budget (a pod's own shorter
//! `terminationGracePeriodSeconds` wins). Stopped pods end Failed with reason `Terminated` and a
//! `DisruptionTarget` condition. Then the inhibitor is released so the shutdown proceeds.
//! `PrepareForShutdown(false)` (a cancelled shutdown) takes the inhibitor again.
//!
//! Where logind is unreachable the kubelet logs why and runs without it, as upstream does.

pub mod logind;
pub mod settings;

pub use settings::{PriorityGrace, Settings, group_pods};

use crate::events::{EventRecorder, EventType};
use crate::podspec::Stopped;
use k8s_openapi::api::core::v1::Pod;
use logind::Logind;
pub use logind::{DbusLogind, LOGIND_CONF_DIR};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Upstream's pod status reason and message for a pod stopped by a node shutdown.
pub const SHUTDOWN_REASON: &str = "Terminated";
pub const SHUTDOWN_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// Upstream's admission rejection while the node shuts down.
pub const NOT_ADMITTED_REASON: &str = "NodeShutdown";
pub const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// The NotReady message while shutting down.
pub const SHUTTING_DOWN: &str = "node is shutting down";
/// Whether the node is shutting down now (read by the node status and pod admission).
#[derive(Debug, Default)]
pub struct ShutdownState(AtomicBool);

impl ShutdownState {
    pub fn shutting_down(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, v: bool) {
        self.0.store(v, Ordering::Relaxed);
    }
}

/// What the manager asks of whoever runs the pods (the sync loop implements it).
#[async_trait::async_trait]
pub trait PodStopper: Send + Sync {
    /// The pods that have a worker and are not being removed.
    async fn active_pods(&self) -> Vec<Pod>;
    /// Asks that one pod be stopped for good with `grace`; the receiver fires once nothing of
    /// it runs. None: the request could not be made (the pods' owner is gone).
    async fn stop(
        &self,
        uid: String,
        stopped: Stopped,
        grace: Duration,
    ) -> Option<oneshot::Receiver<()>>;
}

/// What the manager needs around it.
pub struct Parts {
    pub logind: Arc<dyn Logind>,
    pub pods: Arc<dyn PodStopper>,
    pub state: Arc<ShutdownState>,
    pub events: Arc<dyn EventRecorder>,
    pub node_name: String,
}

/// Why the manager cannot watch for shutdowns.
#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    #[error(transparent)]
    Logind(#[from] logind::LogindError),
    #[error(
        "node shutdown manager was unable to update logind InhibitDelayMaxSec to {want:?} (ShutdownGracePeriod), current value of InhibitDelayMaxSec ({have:?}) is less than requested ShutdownGracePeriod"
    )]
    DelayTooShort { want: Duration, have: Duration },
}

/// Runs the manager until cancelled. Errors at start are logged and the kubelet goes on
/// without graceful shutdown (upstream: "not critical for kubelet").
pub async fn run(settings: Settings, parts: Parts, cancel: CancellationToken) {
    if !settings.enabled() {
        tracing::info!(
            "no graceful shutdown configured (shutdownGracePeriod is 0): node shutdown will be immediate"
        );
        return;
    }
    tracing::info!(groups = ?settings.groups, "starting the node shutdown manager");
    let mut events = match start(&settings, &parts).await {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "Failed to start node shutdown manager: pods will not be stopped gracefully when the node shuts down");
            return;
        }
    };
    let node = crate::events::node_ref(&parts.node_name);
    loop {
        let shutting_down = tokio::select! {
            _ = cancel.cancelled() => return,
            e = events.recv() => match e {
                Some(v) => v,
                None => {
                    tracing::error!("lost the logind PrepareForShutdown signal stream; graceful node shutdown is off");
                    return;
                }
            },
        };
        tracing::info!(shutting_down, "logind PrepareForShutdown");
        parts.events.record(
            &node,
            EventType::Normal,
            "NodeShutdown",
            if shutting_down {
                "Shutdown manager detected shutdown event"
            } else {
                "Shutdown manager detected shutdown cancellation"
            },
        );
        parts.state.set(shutting_down);
        if shutting_down {
            process_shutdown(&settings, &parts).await;
        } else if let Err(e) = parts.logind.inhibit().await {
            tracing::error!(error = %e, "could not take the shutdown inhibitor again");
        }
    }
}

/// Raises logind's InhibitDelayMaxSec when needed, takes the inhibitor, subscribes.
async fn start(settings: &Settings, parts: &Parts) -> Result<mpsc::Receiver<bool>, ShutdownError> {
    let logind = &parts.logind;
    let want = settings.period_requested();
    let have = logind.current_inhibit_delay().await?;
    if want > have {
        logind.override_inhibit_delay(want).await?;
        logind.reload_logind_conf().await?;
        let have = logind.current_inhibit_delay().await?;
        if want > have {
            return Err(ShutdownError::DelayTooShort { want, have });
        }
    }
    let events = logind.monitor_shutdown().await?;
    logind.inhibit().await?;
    Ok(events)
}

/// Stops the active pods group by group, then releases the inhibitor.
async fn process_shutdown(settings: &Settings, parts: &Parts) {
    let started = crate::clock::unix_now();
    let m = crate::metrics::families();
    m.graceful_shutdown_start_time.set(started as f64);
    m.graceful_shutdown_end_time.set(0.0);
    let pods = parts.pods.active_pods().await;
    for (group, members) in settings
        .groups
        .iter()
        .zip(group_pods(&settings.groups, &pods))
    {
        if members.is_empty() {
            continue;
        }
        let budget = Duration::from_secs(group.shutdown_grace_period_seconds.max(0) as u64);
        let mut waits = Vec::new();
        for pod in members {
            let grace = pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .filter(|g| *g <= group.shutdown_grace_period_seconds)
                .unwrap_or(group.shutdown_grace_period_seconds)
                .max(0) as u64;
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            tracing::info!(pod = %crate::podspec::full_name(pod), grace_secs = grace, priority = group.priority, "shutdown manager killing pod");
            let stopped = Stopped {
                reason: SHUTDOWN_REASON.into(),
                message: SHUTDOWN_MESSAGE.into(),
                disruption: true,
            };
            if let Some(rx) = parts
                .pods
                .stop(uid, stopped, Duration::from_secs(grace))
                .await
            {
                waits.push(rx);
            }
        }
        let all = futures::future::join_all(waits);
        if tokio::time::timeout(budget, all).await.is_err() {
            tracing::warn!(
                priority = group.priority,
                budget_secs = budget.as_secs(),
                "shutdown manager: pods of this priority group did not stop within its period"
            );
        }
    }
    m.graceful_shutdown_end_time
        .set(crate::clock::unix_now() as f64);
    if let Err(e) = parts.logind.release().await {
        tracing::warn!(error = %e, "releasing the shutdown inhibitor failed");
    }
    tracing::info!("shutdown manager finished stopping pods; the node will shut down shortly");
}

#[cfg(test)]
mod tests;
