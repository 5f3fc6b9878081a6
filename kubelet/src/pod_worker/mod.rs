//! One worker per pod UID. Each pass is level-triggered: observe the pod's sandboxes and
//! containers in the runtime, plan the difference to the spec ([`plan`], a pure function
//! giving a list of [`Action`]s), act on them (`act.rs`), then publish the pod's status. A pod
//! being removed is stopped with its grace period and every trace of it (containers, sandbox,
//! cgroup, directories) is removed. A worker reaches the node only through [`Deps`]: one
//! narrow trait per concern (runtime, pod cgroups, volumes, image puller, pod-environment
//! source), with fakes beside them.

use crate::events::{EventRecorder, EventType};
use crate::images;
use crate::node_settings::NodeSettings;
use crate::pod_dirs;
use crate::podspec::{self as pod, Qos};
use crate::runtime::*;
use crate::spec;
use crate::status::StatusManager;
use crate::status::{self, Observation, Waiting};
use futures::FutureExt;
use k8s_openapi::api::core::v1::{Container as K8sContainer, Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// CrashLoopBackOff: first restart at once, then 10 s doubling up to 5 min (upstream).
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
pub use crate::podspec::MIN_GRACE;
/// The pod's reason and message once `activeDeadlineSeconds` has passed (upstream).
pub const DEADLINE_REASON: &str = "DeadlineExceeded";
pub const DEADLINE_MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

pub use crate::podspec::Stopped;

/// Reasons of pods stopped for good that stay stopped across an agent restart.
const STOPPED_REASONS: [&str; 3] = [DEADLINE_REASON, "Terminated", "Evicted"];

/// Messages from the sync loop to a worker.
#[derive(Debug)]
pub enum Msg {
    /// The desired spec (same UID) changed.
    Update(Box<Pod>),
    /// Stop the pod and remove it, with this grace period (None: the one recorded on its
    /// containers, for a pod found only in the runtime). [`MIN_GRACE`] applies.
    Terminate { grace: Option<Duration> },
    /// Something changed in the runtime: sync now.
    Wake,
    /// A probe result changed.
    Probe(Box<::probes::ProbeUpdate>),
    /// Stop the pod's containers for good with at most `grace` (the pod keeps its worker and
    /// ends Failed as `stopped` says); `done` is sent once nothing of it runs.
    Stop {
        stopped: Stopped,
        grace: Duration,
        done: tokio::sync::oneshot::Sender<()>,
    },
}

mod act;
mod deps;
mod dra;
mod ephemeral;
mod errors;
mod exit_message;
#[cfg(any(test, feature = "test-util"))]
mod fake;
mod gather;
mod hooks;
mod image_volumes;
mod plan;
mod probes;
mod publish;
mod resize;
mod started;
mod sync;
mod terminate;

pub use act::observe;
pub use deps::{
    ContainerEvent, Deps, DeviceError, ImagePuller, NodeDevices, NodeImages, PodCgroups,
    PodDevices, PodEnvError, PodEnvironment, PodKeyrings, PodVolumes, TeardownError,
};
pub use errors::{SandboxError, StartError};
#[cfg(any(test, feature = "test-util"))]
pub use fake::{FakeImagePuller, FakePodCgroups, FakePodEnvironment, FakePodVolumes, test_probes};
use plan::pod_ref;
pub use plan::{Action, Backoff, Observed, Plan, Start, is_sidecar, plan, plan_stopped};

/// The state a worker keeps between passes.
pub struct Worker {
    env: Arc<Deps>,
    /// The pod at its allocated resources (what its containers run with); set from `desired`
    /// at the start of every pass.
    pod: Pod,
    /// The pod as its source last gave it (a resize there waits for admission to allocate it).
    desired: Pod,
    uid: String,
    /// Starting containers: back-offs, the last failures, the pass's pull cancellation.
    starts: Starts,
    /// What the pod's status is computed with besides the runtime's view.
    seen: Seen,
    /// The containers' probes.
    probing: Probing,
    /// The pod stopped for good, and who waits for it.
    stop: Stopping,
    /// In-place resize.
    resized: Resized,
}

/// A worker's state about starting containers.
struct Starts {
    /// CrashLoopBackOff per container.
    backoff: Backoff,
    /// Image pull back-off per image.
    pulls: images::PullBackoff,
    /// Errors from the last attempt to start each container.
    errors: BTreeMap<String, Waiting>,
    /// Cancelled when a termination or stop arrives during a pass: the pass's image pulls
    /// (which have no deadline) end then. A fresh token for every pass.
    pull_cancel: CancellationToken,
    /// What the current pass created (read back after it instead of listing the pod).
    created: started::Created,
}

/// What a worker remembers for the pod's status.
struct Seen {
    start_time: Option<Timestamp>,
    last_status: Option<PodStatus>,
    /// The sandbox's ID and IPs.
    sandbox_ips: (String, Vec<String>),
    /// When this worker first saw the pod, until every container has run once.
    first_seen: Option<std::time::Instant>,
    /// Container ID → its exit message (runtime message + termination message), read once.
    term_messages: HashMap<String, String>,
}

/// A worker's probe state.
#[derive(Default)]
struct Probing {
    /// Container name → the instance whose probes are running.
    probed: HashMap<String, String>,
    /// Containers to kill after a liveness/startup failure: (ID, name, probe kind, grace).
    kills: Vec<(String, String, ::probes::ProbeKind, Duration)>,
}

/// A pod stopped for good (`activeDeadlineSeconds` passed, node shutdown, eviction).
#[derive(Default)]
struct Stopping {
    /// Failed with this reason.
    stopped: Option<Stopped>,
    /// The grace a stop request asked for.
    grace: Option<Duration>,
    /// Who waits for the containers to be gone.
    waiters: Vec<tokio::sync::oneshot::Sender<()>>,
}

/// A worker's in-place resize state.
#[derive(Default)]
struct Resized {
    /// Container ID → the resources it runs with (those it was created with, or last
    /// resized to in place).
    actuated: HashMap<String, k8s_openapi::api::core::v1::ResourceRequirements>,
    /// The last in-place resize failed: why (`PodResizeInProgress` reason `Error`).
    error: Option<String>,
}

impl Worker {
    pub fn new(env: Arc<Deps>, pod: Pod, previous: Option<PodStatus>) -> Self {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let backoff_max = env.node.restart_backoff_max.0;
        let start_time = previous
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0);
        let stopped = previous.as_ref().and_then(|s| {
            let reason = s.reason.as_deref()?;
            (s.phase.as_deref() == Some("Failed") && STOPPED_REASONS.contains(&reason)).then(|| {
                Stopped {
                    reason: reason.into(),
                    message: s.message.clone().unwrap_or_default(),
                    disruption: false,
                }
            })
        });
        Self {
            env,
            desired: pod.clone(),
            pod,
            uid,
            starts: Starts {
                backoff: Backoff::new(backoff_max),
                pulls: images::PullBackoff::default(),
                errors: BTreeMap::new(),
                pull_cancel: CancellationToken::new(),
                created: started::Created::default(),
            },
            seen: Seen {
                start_time,
                last_status: previous,
                sandbox_ips: (String::new(), Vec::new()),
                first_seen: Some(std::time::Instant::now()),
                term_messages: HashMap::new(),
            },
            probing: Probing::default(),
            // A pod stopped for good before an agent restart stays stopped.
            stop: Stopping {
                stopped,
                ..Default::default()
            },
            resized: Resized::default(),
        }
    }

    /// Records an event about the pod, or about one of its containers.
    fn event(&self, container: Option<&str>, event_type: EventType, reason: &str, message: &str) {
        let object = match container {
            Some(c) => crate::events::container_ref(&self.pod, c),
            None => crate::events::pod_ref(&self.pod),
        };
        self.env.events.record(&object, event_type, reason, message);
    }

    fn qos(&self) -> Qos {
        let gate = self.env.node.pod_limits.pod_level_resources;
        pod::qos_class_with(&self.pod.spec.clone().unwrap_or_default(), gate)
    }

    fn sandbox_config(&self, attempt: u32) -> SandboxConfig {
        let parent = self.env.cgroups.pod_parent(self.qos(), &self.uid);
        let mut cfg = spec::sandbox_config(&self.env.node, &self.pod, attempt, parent);
        // Pulls and container creation name the handler the sandbox was created with; an
        // unknown class only matters (and fails) when the sandbox is created.
        cfg.runtime_handler = self.runtime_handler().unwrap_or_default();
        // The range taken when the sandbox was created (or recorded before a restart).
        cfg.userns = self.env.userns.as_ref().and_then(|u| u.mapping(&self.uid));
        cfg
    }

    /// The CRI runtime handler of the pod's RuntimeClass.
    fn runtime_handler(&self) -> Result<String, PodEnvError> {
        let class = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref());
        self.env.pod_env.runtime_handler(class)
    }

    /// Runs until terminated (then reports on `done`) or cancelled (agent shutdown leaves the
    /// pod running, as upstream does).
    pub async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Msg>,
        done: mpsc::UnboundedSender<String>,
        cancel: CancellationToken,
    ) {
        let span = tracing::info_span!(
            "pod",
            namespace = self.pod.metadata.namespace.as_deref().unwrap_or(""),
            name = self.pod.metadata.name.as_deref().unwrap_or(""),
            uid = %self.uid
        );
        async move {
            let mut panics = StepPanics::default();
            let mut terminating: Option<Option<Duration>> = None;
            let mut next = Instant::now();
            let mut op = "create"; // kubelet_pod_worker_duration_seconds{operation_type}
            // A resize admission takes later (or decides against) wakes the worker.
            let resized = self.env.allocations.subscribe(&self.uid);
            // Messages that arrived during the last pass, handled before waiting again.
            let mut held: Vec<Msg> = Vec::new();
            loop {
                if held.is_empty() {
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => return,
                        _ = resized.notified() => {}
                        msg = rx.recv() => {
                            let Some(msg) = msg else { return };
                            held.push(msg);
                            while let Ok(m) = rx.try_recv() {
                                held.push(m);
                            }
                        }
                        _ = tokio::time::sleep_until(next) => {}
                    }
                }
                for m in held.drain(..) {
                    match m {
                        Msg::Update(p) => {
                            self.desired = *p;
                            if op != "create" {
                                op = "update";
                            }
                        }
                        Msg::Terminate { grace } => {
                            terminating = Some(shortest_grace(terminating.flatten(), grace))
                        }
                        Msg::Wake => {}
                        Msg::Probe(u) => self.on_probe(*u),
                        Msg::Stop {
                            stopped,
                            grace,
                            done,
                        } => self.on_stop(stopped, grace, done),
                    }
                }
                // A panic in one step (a bug) is contained here: logged, and the step runs
                // again after a back-off. The step is level-triggered (it re-reads the
                // runtime), so whatever it left half done is seen and finished next time.
                if let Some(g) = terminating {
                    match AssertUnwindSafe(self.terminate(g)).catch_unwind().await {
                        Ok(true) => {
                            let _ = done.send(self.uid.clone());
                            return;
                        }
                        Ok(false) => next = Instant::now() + Duration::from_secs(1),
                        Err(p) => next = Instant::now() + panics.record("terminate", p.as_ref()),
                    }
                    continue;
                }
                let sync_started = std::time::Instant::now();
                self.starts.pull_cancel = CancellationToken::new();
                let pulls = self.starts.pull_cancel.clone();
                let step = AssertUnwindSafe(self.sync()).catch_unwind();
                let synced = reading_during(step, &mut rx, &mut held, &pulls).await;
                crate::metrics::observe_pod_worker(
                    std::mem::replace(&mut op, "sync"),
                    sync_started,
                );
                next = match synced {
                    Ok(after) => {
                        panics.reset();
                        Instant::now() + after
                    }
                    Err(p) => Instant::now() + panics.record("sync", p.as_ref()),
                };
            }
        }
        .instrument(span)
        .await
    }
}

/// Runs one pass while reading the worker's messages into `held` (handled after the pass);
/// a termination or stop cancels `pulls`: an image pull has no deadline, so the pod's
/// deletion (or eviction, node shutdown, ...) is what ends it, as upstream's cancelled
/// pod-sync context does.
async fn reading_during<F: std::future::Future>(
    step: F,
    rx: &mut mpsc::UnboundedReceiver<Msg>,
    held: &mut Vec<Msg>,
    pulls: &CancellationToken,
) -> F::Output {
    tokio::pin!(step);
    let mut open = true;
    loop {
        tokio::select! {
            out = &mut step => return out,
            msg = rx.recv(), if open => match msg {
                Some(m) => {
                    if matches!(m, Msg::Terminate { .. } | Msg::Stop { .. }) {
                        pulls.cancel();
                    }
                    held.push(m);
                }
                None => open = false,
            },
        }
    }
}

/// Of two termination requests, the shorter known grace wins.
fn shortest_grace(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, y) => x.or(y),
    }
}

/// Panics of a worker's steps in a row, and the wait before the next try: 1 s doubling to
/// 5 min (the crash-loop cap), back to 1 s after a step that completes.
#[derive(Debug)]
struct StepPanics {
    backoff: plumbing::Backoff,
}

/// The first retry of a panicked step, and the cap.
const PANIC_RETRY_INITIAL: Duration = Duration::from_secs(1);
const PANIC_RETRY_MAX: Duration = BACKOFF_MAX;

impl Default for StepPanics {
    fn default() -> Self {
        StepPanics {
            backoff: plumbing::Backoff::new(PANIC_RETRY_INITIAL, PANIC_RETRY_MAX),
        }
    }
}

impl StepPanics {
    fn record(&mut self, step: &str, payload: &(dyn std::any::Any + Send)) -> Duration {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        let wait = self.backoff.fail();
        tracing::error!(step, panic = %message, retry_in = ?wait, "pod worker step panicked; the pod stays managed and the step runs again");
        wait
    }

    fn reset(&mut self) {
        self.backoff.succeed();
    }
}

#[cfg(test)]
mod tests;
