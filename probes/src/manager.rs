//! The probe manager (upstream `prober_manager.go`): one worker task per (pod, container,
//! probe kind), results in a shared [`ResultsCache`], changes on one [`ProbeUpdate`] channel.
//!
//! The kubelet's pod worker drives it:
//! - [`ProbeManager::add_container`] when a container is running (again with the new container
//!   ID after a restart: the workers carry on and pick the new ID up),
//! - [`ProbeManager::container_exited`] when it stops,
//! - [`ProbeManager::stop_liveness_and_startup`] when the pod starts terminating,
//! - [`ProbeManager::remove_container`] / [`ProbeManager::remove_pod`] to tear down.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Container;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::exec::ExecRunner;
use crate::http::HttpProber;
use crate::metrics::ProberMetrics;
use crate::results::{ProbeStatus, ResultsCache};
use crate::spec::{ProbeKind, ProbeSpec, SpecError};
pub use crate::types::{PodRef, ProbeUpdate};
use crate::worker::{ContainerState, ProbeEvents, Shared, Worker};

/// A running container instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRef {
    pub name: String,
    /// Runtime container ID (as the CRI reports it, e.g. `containerd://…` or the bare ID;
    /// it is passed to [`ExecRunner::exec_sync`] unchanged).
    pub id: String,
    /// When the container started running; see [`instant_from_system_time`].
    pub started_at: Instant,
}

/// The probes configured for one container.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerProbes {
    pub liveness: Option<ProbeSpec>,
    pub readiness: Option<ProbeSpec>,
    pub startup: Option<ProbeSpec>,
}

impl ContainerProbes {
    /// Validates and resolves a container's three probes.
    pub fn from_container(c: &Container) -> Result<Self, SpecError> {
        let ports = c.ports.as_deref().unwrap_or_default();
        let build = |kind, p: &Option<k8s_openapi::api::core::v1::Probe>| {
            p.as_ref()
                .map(|p| ProbeSpec::from_k8s(kind, p, ports))
                .transpose()
        };
        Ok(ContainerProbes {
            liveness: build(ProbeKind::Liveness, &c.liveness_probe)?,
            readiness: build(ProbeKind::Readiness, &c.readiness_probe)?,
            startup: build(ProbeKind::Startup, &c.startup_probe)?,
        })
    }

    pub fn get(&self, kind: ProbeKind) -> Option<&ProbeSpec> {
        match kind {
            ProbeKind::Liveness => self.liveness.as_ref(),
            ProbeKind::Readiness => self.readiness.as_ref(),
            ProbeKind::Startup => self.startup.as_ref(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.liveness.is_none() && self.readiness.is_none() && self.startup.is_none()
    }
}

/// Converts a wall-clock start time (from the CRI) into the monotonic instant workers use.
pub fn instant_from_system_time(t: SystemTime) -> Instant {
    let now = Instant::now();
    match SystemTime::now().duration_since(t) {
        Ok(ago) => now.checked_sub(ago).unwrap_or(now),
        // Started "in the future" (clock skew): treat as now.
        Err(_) => now,
    }
}

/// Manager settings.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Capacity of the updates channel (upstream uses a small buffered channel; senders wait).
    pub updates_capacity: usize,
    /// Spread the first probe of each worker over one period when the manager started less
    /// than a period ago (upstream does this after a kubelet restart).
    pub jitter: bool,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            updates_capacity: 256,
            jitter: true,
        }
    }
}

struct ContainerEntry {
    pod: Arc<PodRef>,
    probes: ContainerProbes,
    state: watch::Sender<ContainerState>,
    workers: HashMap<ProbeKind, CancellationToken>,
}

#[derive(Default)]
struct Inner {
    /// Keyed by (pod UID, container name).
    containers: HashMap<(String, String), ContainerEntry>,
    tasks: JoinSet<()>,
}

/// Owns the probe workers. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct ProbeManager {
    config: ManagerConfig,
    shared: Arc<Shared>,
    metrics: ProberMetrics,
    start: Instant,
    root: CancellationToken,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for ProbeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeManager")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ProbeManager {
    /// Creates the manager and the receiving end of its updates channel.
    pub fn new(
        config: ManagerConfig,
        metrics: ProberMetrics,
    ) -> (Self, mpsc::Receiver<ProbeUpdate>) {
        let (tx, rx) = mpsc::channel(config.updates_capacity.max(1));
        let shared = Arc::new(Shared {
            results: ResultsCache::new(),
            updates: tx,
            http: HttpProber::new(),
            events: std::sync::OnceLock::new(),
        });
        let manager = ProbeManager {
            config,
            shared,
            metrics,
            start: Instant::now(),
            root: CancellationToken::new(),
            inner: Mutex::new(Inner::default()),
        };
        (manager, rx)
    }

    /// Where every failed probe and warning is reported (once; later calls are ignored).
    pub fn set_events(&self, events: Arc<dyn ProbeEvents>) {
        let _ = self.shared.events.set(events);
    }

    /// The results cache the workers write to.
    pub fn results(&self) -> &ResultsCache {
        &self.shared.results
    }

    /// Starts probing a running container, or, when its probes are already running, tells
    /// them about the (possibly new, after a restart) container instance. Must be called
    /// inside a tokio runtime. A container with no probes has nothing to do.
    pub fn add_container(
        &self,
        pod: &PodRef,
        container: ContainerRef,
        probes: ContainerProbes,
        pod_ip: &str,
        exec: Arc<dyn ExecRunner>,
    ) {
        let state = ContainerState {
            container_id: container.id.clone(),
            started_at: container.started_at,
            running: true,
            pod_ip: pod_ip.to_string(),
        };
        let key = (pod.uid.clone(), container.name.clone());
        let mut inner = self.lock();
        reap(&mut inner.tasks);
        if let Some(entry) = inner.containers.get(&key) {
            if entry.probes == probes && *entry.pod == *pod {
                entry.state.send_replace(state);
                return;
            }
            // Probe spec changed (upstream does not support this; we restart the workers).
            let entry = inner.containers.remove(&key).expect("present");
            self.stop_entry(&entry);
        }
        if probes.is_empty() {
            return;
        }
        let pod = Arc::new(pod.clone());
        let (state_tx, _) = watch::channel(state);
        let mut workers = HashMap::new();
        // Same order as upstream: startup, readiness, liveness.
        for kind in [
            ProbeKind::Startup,
            ProbeKind::Readiness,
            ProbeKind::Liveness,
        ] {
            let Some(spec) = probes.get(kind) else {
                continue;
            };
            let stop = self.root.child_token();
            let worker = Worker {
                pod: pod.clone(),
                container_name: container.name.clone(),
                spec: spec.clone(),
                has_startup_probe: probes.startup.is_some(),
                state: state_tx.subscribe(),
                exec: exec.clone(),
                shared: self.shared.clone(),
                metrics: self.metrics.labels(
                    kind,
                    &container.name,
                    &pod.name,
                    &pod.namespace,
                    &pod.uid,
                ),
                stop: stop.clone(),
                jitter: self.jitter(spec.period()),
                container_id: None,
                last_result: None,
                result_run: 0,
                on_hold: false,
            };
            inner.tasks.spawn(worker.run());
            workers.insert(kind, stop);
        }
        inner.containers.insert(
            key,
            ContainerEntry {
                pod,
                probes,
                state: state_tx,
                workers,
            },
        );
    }

    /// The container stopped running: its probes report failure and stop probing until it is
    /// added again with a new ID (upstream's "non-running container" path).
    pub fn container_exited(&self, pod_uid: &str, container_name: &str) {
        let inner = self.lock();
        if let Some(entry) = inner
            .containers
            .get(&(pod_uid.to_string(), container_name.to_string()))
        {
            entry.state.send_modify(|s| s.running = false);
        }
    }

    /// Stops a container's probe workers and forgets their results.
    pub fn remove_container(&self, pod_uid: &str, container_name: &str) {
        let mut inner = self.lock();
        if let Some(entry) = inner
            .containers
            .remove(&(pod_uid.to_string(), container_name.to_string()))
        {
            self.stop_entry(&entry);
        }
        reap(&mut inner.tasks);
    }

    /// Stops every probe worker of a pod and forgets their results.
    pub fn remove_pod(&self, pod_uid: &str) {
        let mut inner = self.lock();
        let keys: Vec<_> = inner
            .containers
            .keys()
            .filter(|(uid, _)| uid == pod_uid)
            .cloned()
            .collect();
        for key in keys {
            if let Some(entry) = inner.containers.remove(&key) {
                self.stop_entry(&entry);
            }
        }
        reap(&mut inner.tasks);
    }

    /// Stops liveness and startup probing for a terminating pod (readiness keeps running).
    pub fn stop_liveness_and_startup(&self, pod_uid: &str) {
        let mut inner = self.lock();
        for ((uid, _), entry) in inner.containers.iter_mut() {
            if uid != pod_uid {
                continue;
            }
            let id = entry.state.borrow().container_id.clone();
            for kind in [ProbeKind::Liveness, ProbeKind::Startup] {
                if let Some(stop) = entry.workers.remove(&kind) {
                    stop.cancel();
                    self.shared.results.remove(&id, kind);
                }
            }
        }
    }

    /// Upstream `UpdatePodStatus`'s `started`: the startup probe succeeded for this container
    /// instance, or the container has no startup probe worker.
    pub fn is_started(&self, pod_uid: &str, container_name: &str, container_id: &str) -> bool {
        match self.shared.results.get(container_id, ProbeKind::Startup) {
            Some(r) => r == ProbeStatus::Success,
            None => !self.has_worker(pod_uid, container_name, ProbeKind::Startup),
        }
    }

    /// Upstream `UpdatePodStatus`'s `ready` for a started, running container: the readiness
    /// probe succeeded, or there is no readiness probe worker.
    pub fn is_ready(&self, pod_uid: &str, container_name: &str, container_id: &str) -> bool {
        match self.shared.results.get(container_id, ProbeKind::Readiness) {
            Some(ProbeStatus::Success) => true,
            _ => !self.has_worker(pod_uid, container_name, ProbeKind::Readiness),
        }
    }

    /// Number of live workers.
    pub fn worker_count(&self) -> usize {
        self.lock()
            .containers
            .values()
            .map(|e| e.workers.len())
            .sum()
    }

    /// Stops all workers and waits for them to finish.
    pub async fn shutdown(&self) {
        self.root.cancel();
        let mut tasks = {
            let mut inner = self.lock();
            inner.containers.clear();
            std::mem::take(&mut inner.tasks)
        };
        while tasks.join_next().await.is_some() {}
    }

    fn has_worker(&self, pod_uid: &str, container_name: &str, kind: ProbeKind) -> bool {
        self.lock()
            .containers
            .get(&(pod_uid.to_string(), container_name.to_string()))
            .is_some_and(|e| e.workers.contains_key(&kind))
    }

    fn stop_entry(&self, entry: &ContainerEntry) {
        let id = entry.state.borrow().container_id.clone();
        for (kind, stop) in &entry.workers {
            // Cancel first: a stopped worker can no longer write to the cache.
            stop.cancel();
            self.shared.results.remove(&id, *kind);
        }
    }

    fn jitter(&self, period: Duration) -> Duration {
        if !self.config.jitter || period <= self.start.elapsed() {
            return Duration::ZERO;
        }
        period.mul_f64(random_fraction())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for ProbeManager {
    fn drop(&mut self) {
        self.root.cancel();
    }
}

/// Collects finished worker tasks so the set does not grow; reports panics.
fn reap(tasks: &mut JoinSet<()>) {
    while let Some(res) = tasks.try_join_next() {
        if let Err(e) = res
            && e.is_panic()
        {
            tracing::error!(error = %e, "probe worker panicked");
        }
    }
}

/// A number in [0, 1) from std's randomly keyed hasher (no RNG crate needed for jitter).
fn random_fraction() -> f64 {
    let bits =
        std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests;
