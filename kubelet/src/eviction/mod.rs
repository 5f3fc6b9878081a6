//! The eviction manager, as upstream's pkg/kubelet/eviction: every monitoring interval (10 s)
//! it reads the stats provider's snapshot, turns it into signals (`memory.available`,
//! `allocatableMemory.available`, `nodefs.*`, `imagefs.*`, `containerfs.*`, `pid.available`),
//! tracks the configured thresholds (grace periods, min reclaim, the pressure transition
//! period), reports the MemoryPressure / DiskPressure / PIDPressure node conditions, rejects
//! pods at admission under pressure, and when a threshold is met past its grace period first
//! reclaims node-level resources (dead containers, unused images) for disk signals, then
//! evicts one pod, ranked as upstream. Pods over their local storage limits (emptyDir
//! `sizeLimit`, `ephemeral-storage` limits) are evicted whatever the node's state.
//!
//! A stats source that fails (a CRI call, the pod list) costs only its own signals: the
//! manager acts on every signal the snapshot still carries, and says once when a source goes
//! blind and once when it is seen again.
//!
//! The edges are narrow traits ([`StatsSource`], [`PodKiller`], [`NodeReclaim`]) and time is a
//! parameter of [`Manager::synchronize`], so tests drive it with fakes.

pub mod rank;
pub mod signals;
#[cfg(test)]
mod tests;
pub mod tracker;

pub use rank::{Resource, is_critical};
pub use tracker::Condition;

use crate::cm::Eviction;
use crate::events::{EventRecorder, EventType};
use crate::podspec::Stopped;
use crate::stats::{GapSource as Source, Gaps, gaps};
use crate::stats::{PodStats, Summary, Unmeasured};
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Upstream's monitoring interval (the kubelet's `housekeeping` for eviction).
pub const MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// How long the manager waits for an evicted pod to be cleaned up (upstream's
/// podCleanupTimeout).
pub const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
/// The grace period of evictions that cannot wait (hard thresholds, local storage limits).
pub const IMMEDIATE_GRACE: Duration = Duration::from_secs(1);
/// Pod status reason of an evicted pod and of a pod rejected under pressure.
pub const REASON: &str = "Evicted";

/// Errors of one pass.
#[derive(Debug, thiserror::Error)]
pub enum EvictionError {
    #[error("failed to get summary stats: {0}")]
    Stats(String),
    #[error("reclaiming node-level resources: {0}")]
    Reclaim(String),
}

/// One stats snapshot as the manager reads it: the Summary and what it lacks.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub summary: Arc<Summary>,
    /// The sources the snapshot could not read (their signals are missing from `summary`).
    pub gaps: Gaps,
    /// Pod UID → the parts of its disk usage whose walk could not finish (counted as over
    /// its local storage limits).
    pub unmeasured: Unmeasured,
}

/// Where the manager reads stats (the stats provider).
#[async_trait::async_trait]
pub trait StatsSource: Send + Sync {
    /// The latest snapshot; `fresh` asks for a refresh now.
    async fn summary(&self, fresh: bool) -> Result<Observed, EvictionError>;
}

/// The pods the manager may evict and how it stops them.
#[async_trait::async_trait]
pub trait PodKiller: Send + Sync {
    async fn active_pods(&self) -> Vec<Pod>;
    /// Stops `pod` for good as `stopped` says, within `grace`; returns once it is gone (or
    /// after [`POD_CLEANUP_TIMEOUT`]). False when the pod was not found.
    async fn evict(&self, pod: &Pod, stopped: Stopped, grace: Duration) -> bool;
}

/// Node-level reclaim before evicting for disk (container GC, then image GC).
#[async_trait::async_trait]
pub trait NodeReclaim: Send + Sync {
    async fn delete_all_unused_containers(&self) -> Result<(), EvictionError>;
    async fn delete_unused_images(&self) -> Result<(), EvictionError>;
}

/// The conditions the manager reports now, shared with the node status and admission.
#[derive(Debug, Default)]
pub struct PressureState(Mutex<Vec<Condition>>);

impl PressureState {
    pub fn conditions(&self) -> Vec<Condition> {
        self.0.lock().map(|c| c.clone()).unwrap_or_default()
    }

    pub fn has(&self, c: Condition) -> bool {
        self.conditions().contains(&c)
    }

    pub fn set(&self, conditions: Vec<Condition>) {
        if let Ok(mut c) = self.0.lock() {
            *c = conditions;
        }
    }
}

/// Upstream's eviction admission handler: under MemoryPressure alone, only BestEffort pods
/// that do not tolerate the memory-pressure taint are rejected; under any other pressure every
/// pod is, except critical ones. `pod_level_gate`: the `PodLevelResources` gate (for the QoS
/// class). Returns `(reason, message)` of a rejection.
pub fn admit(state: &PressureState, pod: &Pod, pod_level_gate: bool) -> Option<(String, String)> {
    let conditions = state.conditions();
    if conditions.is_empty() || is_critical(pod) {
        return None;
    }
    if conditions == [Condition::MemoryPressure] {
        let spec = pod.spec.clone().unwrap_or_default();
        if crate::podspec::qos_class_with(&spec, pod_level_gate) != crate::podspec::Qos::BestEffort
        {
            return None;
        }
        let tolerates = spec.tolerations.iter().flatten().any(|t| {
            let key_ok = match t.key.as_deref() {
                None | Some("") => t.operator.as_deref() == Some("Exists"),
                Some(k) => k == "node.kubernetes.io/memory-pressure",
            };
            let effect_ok = matches!(t.effect.as_deref(), None | Some("") | Some("NoSchedule"));
            let value_ok = t.operator.as_deref() == Some("Exists")
                || t.value.as_deref().unwrap_or("").is_empty();
            key_ok && effect_ok && value_ok
        });
        if tolerates {
            return None;
        }
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.name()).collect();
    Some((
        REASON.into(),
        format!("The node had condition: [{}]. ", names.join(" ")),
    ))
}

/// What one pass did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// UIDs of evicted pods.
    pub evicted: Vec<String>,
    /// Node-level reclaim sufficed.
    pub reclaimed: bool,
    /// Stats sources that went blind in this pass (said once in the log).
    pub went_blind: Vec<Source>,
    /// Stats sources seen again in this pass.
    pub recovered: Vec<Source>,
}

/// Everything the manager needs around it.
pub struct Parts {
    pub stats: Arc<dyn StatsSource>,
    pub pods: Arc<dyn PodKiller>,
    pub reclaim: Arc<dyn NodeReclaim>,
    pub events: Arc<dyn EventRecorder>,
    pub state: Arc<PressureState>,
    pub node_name: String,
    /// The node's allocatable memory (for allocatableMemory.available), when known.
    pub allocatable_memory: Option<i128>,
    /// The `PodLevelResources` gate: pod-level requests and limits count.
    pub pod_level_resources: bool,
}

/// The eviction manager; see the module doc.
pub struct Manager {
    tracker: tracker::Tracker,
    parts: Parts,
    max_pod_grace: i64,
    /// Which stats sources were blind at the last pass.
    blind: gaps::Watch,
}

impl Manager {
    pub fn new(cfg: Eviction, parts: Parts) -> Self {
        Self {
            max_pod_grace: cfg.max_pod_grace_period,
            tracker: tracker::Tracker::new(cfg),
            parts,
            blind: gaps::Watch::default(),
        }
    }

    /// Notes what this pass's stats lack: one line per source going blind or seen again.
    fn see(&mut self, now: &Gaps, out: &mut Outcome) {
        for change in self.blind.update(now) {
            match change {
                gaps::Change::Blind(source, why) => {
                    tracing::warn!(error = %why, "eviction manager: cannot see {}: {}", source.what(), source.consequence());
                    out.went_blind.push(source);
                }
                gaps::Change::Recovered(source) => {
                    tracing::info!("eviction manager: sees {} again", source.what());
                    out.recovered.push(source);
                }
            }
        }
    }

    /// Runs a pass every [`MONITORING_INTERVAL`] until cancelled; a pass that evicted waits
    /// for the pod's cleanup first (inside [`PodKiller::evict`]).
    pub async fn run(mut self, cancel: CancellationToken) {
        tracing::info!(thresholds = ?self.tracker.thresholds(), "eviction manager: starting control loop");
        loop {
            match self.synchronize(Instant::now()).await {
                Ok(o) if !o.evicted.is_empty() => {
                    tracing::info!(pods = ?o.evicted, "eviction manager: evicted")
                }
                Ok(_) => {}
                // Said once by the pass (when stats go blind and when they return).
                Err(EvictionError::Stats(_)) => {}
                Err(e) => tracing::warn!(error = %e, "eviction manager: failed to synchronize"),
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(MONITORING_INTERVAL) => {}
            }
        }
    }

    /// Stops the pod for good after recording the `Evicted` Event (with upstream's
    /// annotations for threshold evictions; none for local storage limits, as upstream).
    async fn evict(
        &self,
        pod: &Pod,
        grace: Duration,
        message: String,
        annotations: &BTreeMap<String, String>,
        disruption: bool,
    ) -> bool {
        if is_critical(pod) {
            tracing::error!(pod = %crate::podspec::full_name(pod), "eviction manager: cannot evict a critical pod");
            return false;
        }
        self.parts.events.record_annotated(
            &crate::events::pod_ref(pod),
            EventType::Warning,
            REASON,
            &message,
            annotations,
        );
        tracing::info!(pod = %crate::podspec::full_name(pod), %message, "eviction manager: evicting pod");
        let stopped = Stopped {
            reason: REASON.into(),
            message,
            disruption,
        };
        self.parts.pods.evict(pod, stopped, grace).await
    }

    /// One pass at `now` (upstream's synchronize).
    pub async fn synchronize(&mut self, now: Instant) -> Result<Outcome, EvictionError> {
        let mut out = Outcome::default();
        let pods = self.parts.pods.active_pods().await;
        let observed = match self.parts.stats.summary(false).await {
            Ok(o) => o,
            Err(e) => {
                self.see(&[(Source::Refresh, e.to_string())].into(), &mut out);
                return Err(e);
            }
        };
        self.see(&observed.gaps, &mut out);
        let summary = observed.summary;
        let dedicated = signals::dedicated_image_fs(&summary.node);
        let obs = signals::observe(&summary, self.parts.allocatable_memory);
        let pass = self.tracker.observe(&obs, now);
        self.parts.state.set(pass.conditions.clone());
        let stats_of = |p: &Pod| -> Option<PodStats> {
            let uid = p.metadata.uid.as_deref()?;
            summary.pods.iter().find(|s| s.pod_ref.uid == uid).cloned()
        };
        let gate = self.parts.pod_level_resources;
        // Local storage limits first; such an eviction ends the pass.
        for pod in &pods {
            let Some(stats) = stats_of(pod) else { continue };
            let unmeasured = pod
                .metadata
                .uid
                .as_ref()
                .and_then(|uid| observed.unmeasured.get(uid))
                .map_or(&[][..], Vec::as_slice);
            let Some(v) = rank::storage_violation(pod, &stats, unmeasured, dedicated, gate) else {
                continue;
            };
            if self
                .evict(pod, IMMEDIATE_GRACE, v.message, &BTreeMap::new(), false)
                .await
            {
                crate::metrics::families()
                    .evictions
                    .with_label_values(&[v.signal])
                    .inc();
                out.evicted
                    .push(pod.metadata.uid.clone().unwrap_or_default());
            }
        }
        if !out.evicted.is_empty() {
            return Ok(out);
        }
        let Some(threshold) = pass.to_act.first().cloned() else {
            return Ok(out);
        };
        let resource = Resource::of(threshold.signal);
        tracing::info!(
            resource = resource.name(),
            "eviction manager: attempting to reclaim"
        );
        self.parts.events.record(
            &crate::events::node_ref(&self.parts.node_name),
            EventType::Warning,
            "EvictionThresholdMet",
            &format!("Attempting to reclaim {}", resource.name()),
        );
        if self.reclaim_node_level(threshold.signal, dedicated).await {
            tracing::info!(
                resource = resource.name(),
                "eviction manager: able to reduce resource pressure without evicting pods"
            );
            out.reclaimed = true;
            return Ok(out);
        }
        if pods.is_empty() {
            tracing::error!(
                "eviction manager: eviction thresholds have been met, but no pods are active to evict"
            );
            return Ok(out);
        }
        let mut ranked: Vec<(Pod, Option<PodStats>)> =
            pods.iter().map(|p| (p.clone(), stats_of(p))).collect();
        rank::rank(
            &mut ranked,
            rank::Ranking::for_signal(threshold.signal, dedicated),
            gate,
        );
        let age = crate::metrics::families();
        for t in &pass.to_act {
            if let Some(o) = obs.get(&t.signal) {
                let secs = (crate::clock::unix_now_ns() - o.time).max(0) as f64 / 1e9;
                age.eviction_stats_age
                    .with_label_values(&[t.signal.name()])
                    .observe(secs);
            }
        }
        for (pod, stats) in &ranked {
            // Soft thresholds: evictionMaxPodGracePeriod, or the pod's own shorter period.
            let grace = if threshold.is_hard() {
                IMMEDIATE_GRACE
            } else {
                let own = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds);
                let secs = own.map_or(self.max_pod_grace, |o| o.min(self.max_pod_grace));
                Duration::from_secs(secs.max(0) as u64)
            };
            let (message, annotations) =
                rank::eviction_message(resource, pod, stats.as_ref(), &pass.to_act, &obs);
            if self.evict(pod, grace, message, &annotations, true).await {
                crate::metrics::families()
                    .evictions
                    .with_label_values(&[threshold.signal.name()])
                    .inc();
                out.evicted
                    .push(pod.metadata.uid.clone().unwrap_or_default());
                return Ok(out);
            }
        }
        tracing::info!("eviction manager: unable to evict any pods from the node");
        Ok(out)
    }

    /// Upstream's reclaimNodeLevelResources: for disk signals, container GC then image GC,
    /// then a fresh snapshot; true when no threshold (with min reclaim) is met any more.
    async fn reclaim_node_level(&self, signal: crate::cm::Signal, dedicated: bool) -> bool {
        use crate::cm::Signal as S;
        let applies = match signal {
            S::ImageFsAvailable | S::ImageFsInodesFree => true,
            S::ContainerFsAvailable | S::ContainerFsInodesFree => true,
            S::NodeFsAvailable | S::NodeFsInodesFree => !dedicated,
            _ => false,
        };
        if !applies {
            return false;
        }
        if let Err(e) = self.parts.reclaim.delete_all_unused_containers().await {
            tracing::info!(error = %e, "eviction manager: unexpected error when attempting to reduce resource pressure");
        }
        if let Err(e) = self.parts.reclaim.delete_unused_images().await {
            tracing::info!(error = %e, "eviction manager: unexpected error when attempting to reduce resource pressure");
        }
        let summary = match self.parts.stats.summary(true).await {
            Ok(s) => s.summary,
            Err(e) => {
                tracing::error!(error = %e, "eviction manager: failed to get summary stats after resource reclaim");
                return false;
            }
        };
        let obs = signals::observe(&summary, self.parts.allocatable_memory);
        tracker::met(self.tracker.thresholds(), &obs, true).is_empty()
    }
}

/// The stats provider as the manager's [`StatsSource`].
pub struct ProviderStats(pub Arc<crate::stats::Provider>);

#[async_trait::async_trait]
impl StatsSource for ProviderStats {
    async fn summary(&self, fresh: bool) -> Result<Observed, EvictionError> {
        let snap = if fresh {
            self.0.refresh().await
        } else {
            self.0.snapshot().await
        };
        snap.map(|s| Observed {
            summary: Arc::new(s.summary.clone()),
            gaps: s.gaps.clone(),
            unmeasured: s.unmeasured.clone(),
        })
        .map_err(|e| EvictionError::Stats(e.to_string()))
    }
}
