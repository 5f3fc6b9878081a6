//! The stats provider behind `/stats/summary`, `/metrics/resource`, `/metrics/cadvisor` and the
//! eviction manager: node CPU and memory from the root cgroup, pods and containers from their
//! cgroups and one `ListPodSandboxStats`, fs from statvfs(2) and `ImageFsInfo`, volumes and
//! logs from walks on the blocking pool.
//!
//! A CRI call that fails costs only its own figures: the snapshot serves the rest and names
//! what it lacks ([`gaps`]); a failed `ListPodSandboxStats` (one bad sandbox fails the whole
//! list on some runtimes) is replaced by each ready sandbox's `PodSandboxStats`.
//!
//! A housekeeping task ([`Provider::run`]) refreshes every [`DEFAULT_HOUSEKEEPING`] (upstream's
//! cAdvisor housekeeping interval): requests only read the last snapshot, so a scrape never
//! waits for the runtime nor fans out into per-container calls. One refresh makes a fixed number
//! of CRI calls whatever the number of containers. The disk walks are the slow part of a
//! refresh on a busy node; like upstream's `volumeStatsAggPeriod` they run at most once per
//! [`DEFAULT_VOLUME_STATS_AGG_PERIOD`] per pod (a new pod is walked at once).

pub mod build;
pub mod cadvisor;
pub mod cgroups;
pub mod detail;
pub mod disk;
pub mod gaps;
pub mod live;
pub mod node;
pub mod procs;
mod refresh;
pub mod resource;
pub mod summary;
pub mod system;
#[cfg(test)]
mod tests;

use crate::runtime::{Runtime, RuntimeError, Sandbox, SandboxStats};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
pub use build::Unfinished;
use gaps::Source;
pub use gaps::{Gaps, Source as GapSource};

/// Pod UID → the parts of its disk usage whose walk could not finish, each with why.
pub type Unmeasured = HashMap<String, Vec<(Unfinished, String)>>;
use node::NodeSource;
pub use node::{FsInfo, LinuxNode};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
pub use summary::{FsStats, NodeStats, PodStats, PvcReference, StatTime, Summary, VolumeStats};
use tokio_util::sync::CancellationToken;

/// How often the housekeeping task refreshes (upstream's cAdvisor housekeeping interval, 10 s):
/// a snapshot served is at most this old (plus one refresh's duration).
pub const DEFAULT_HOUSEKEEPING: Duration = Duration::from_secs(10);

/// How often one pod's volumes and log directories are walked again (upstream's
/// `volumeStatsAggPeriod` default).
pub const DEFAULT_VOLUME_STATS_AGG_PERIOD: Duration = Duration::from_secs(60);

/// How many PodSandboxStats calls run at once when ListPodSandboxStats failed.
const PER_SANDBOX_CONCURRENCY: usize = 8;

/// Stats that could not be gathered.
#[derive(Debug, thiserror::Error, Clone)]
pub enum StatsError {
    #[error("stats refresh task failed: {0}")]
    Task(String),
}

/// Where the provider looks.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub node_name: String,
    /// The kubelet's root dir (node fs; pods' volumes under `pods/<uid>/volumes`).
    pub root_dir: PathBuf,
    /// `/var/log/pods`.
    pub pod_logs_dir: PathBuf,
    /// The housekeeping period ([`DEFAULT_HOUSEKEEPING`]).
    pub housekeeping: Duration,
    /// How long one pod's disk walk is reused ([`DEFAULT_VOLUME_STATS_AGG_PERIOD`]).
    pub volume_stats_agg_period: Duration,
    /// The cgroups of `node.systemContainers`.
    pub system: system::SystemCgroups,
}

impl ProviderConfig {
    /// Upstream's periods.
    pub fn new(node_name: String, root_dir: PathBuf, pod_logs_dir: PathBuf) -> Self {
        Self {
            node_name,
            root_dir,
            pod_logs_dir,
            housekeeping: DEFAULT_HOUSEKEEPING,
            volume_stats_agg_period: DEFAULT_VOLUME_STATS_AGG_PERIOD,
            system: system::SystemCgroups::default(),
        }
    }
}

/// What one refresh cost, by phase (the CRI calls run concurrently; the node reads, cgroup
/// lookups and disk walks run on the blocking pool).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefreshCost {
    pub cri: Duration,
    pub blocking: Duration,
    pub build: Duration,
    pub total: Duration,
    /// Pods whose directories were walked in this refresh.
    pub pods_walked: usize,
    /// The blocking part, by phase.
    pub phases: Phases,
}

/// The blocking part of one refresh, by phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    /// Root cgroup, statvfs, /proc figures of the node.
    pub node: Duration,
    /// Volume and log directory walks.
    pub disk: Duration,
    /// Finding and reading pods' and containers' cgroups (usage and pressure; the rest of
    /// what `/metrics/cadvisor` serves is read when it is scraped).
    pub cgroups: Duration,
    /// Sandboxes' `/proc/<pid>/net/dev`.
    pub network: Duration,
}

/// One refresh's result.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub taken: Instant,
    pub summary: summary::Summary,
    /// What `/metrics/cadvisor` needs beyond the Summary (images, cgroups, machine), without
    /// the cgroup details: [`Snapshot::cadvisor_meta`] adds them.
    pub cadvisor: cadvisor::Meta,
    pub cost: RefreshCost,
    /// What this refresh could not read (the rest is served).
    pub gaps: Gaps,
    /// Pod UID → the parts of its disk usage whose walk could not finish (their figures in
    /// the Summary are floors).
    pub unmeasured: Unmeasured,
    /// The Summary's JSON, made by the first request that needs it and shared by the rest.
    json: OnceLock<axum::body::Bytes>,
    /// Where the cgroups are, and the cgroups whose details `/metrics/cadvisor` serves.
    layout: Option<node::Layout>,
    detail_cgroups: Vec<String>,
    /// `/proc`, for the process figures of those cgroups.
    proc_root: PathBuf,
    /// `cadvisor` with the details, read by the first scrape of this snapshot.
    full: tokio::sync::OnceCell<Arc<cadvisor::Meta>>,
}

impl Snapshot {
    /// `/stats/summary`'s body.
    pub fn summary_json(&self) -> axum::body::Bytes {
        self.json
            .get_or_init(|| serde_json::to_vec(&self.summary).unwrap_or_default().into())
            .clone()
    }

    /// What `/metrics/cadvisor` renders: [`Snapshot::cadvisor`] with each cgroup's details
    /// (throttling, limits, memory details, OOM kills, block I/O, pressure). Only the
    /// scrapes need them, so the refresh does not read them (about 14 files per cgroup on
    /// cgroup v2, every housekeeping period): the first scrape of a snapshot reads them on the
    /// blocking pool and the later scrapes of the same snapshot share that reading.
    pub async fn cadvisor_meta(&self) -> Arc<cadvisor::Meta> {
        self.full
            .get_or_init(|| async {
                let (layout, cgroups) = (self.layout.clone(), self.detail_cgroups.clone());
                let proc_root = self.proc_root.clone();
                // Containers' cgroups: cAdvisor knows their process (ulimits).
                let containers: std::collections::HashSet<String> =
                    self.cadvisor.cgroups.containers.values().cloned().collect();
                let read = tokio::task::spawn_blocking(move || {
                    let now = unix_now_ns();
                    let details = layout
                        .map(|l| {
                            cgroups
                                .iter()
                                .map(|cg| {
                                    let mut d = detail::read_detail(&l, cg);
                                    d.processes = procs::read_processes(
                                        &l,
                                        &proc_root,
                                        cg,
                                        containers.contains(cg),
                                    );
                                    (cg.clone(), d)
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    (details, now)
                })
                .await;
                let (details, at) = read.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "reading the cgroup details failed");
                    (HashMap::new(), 0)
                });
                Arc::new(cadvisor::Meta {
                    details,
                    details_time: (at != 0).then_some(summary::StatTime(at)),
                    ..self.cadvisor.clone()
                })
            })
            .await
            .clone()
    }
}

type Outcome = Result<Arc<Snapshot>, StatsError>;

/// State one refresh carries to the next.
#[derive(Default)]
struct Carry {
    cpu: build::CpuHistory,
    /// Pod UID → (when walked, its disk usage).
    disk: HashMap<String, (Instant, build::PodDisk)>,
    cgroups: cgroups::Locator,
    /// The last `ListPodSandboxStats` (when, by sandbox ID).
    cri_stats: Option<(Instant, HashMap<String, SandboxStats>)>,
    /// What that last round of runtime stats could not read (kept until the next round).
    cri_gaps: Gaps,
}

/// The stats provider; see the module doc.
/// Volumes measured elsewhere (CSI volumes, by their driver's `NodeGetVolumeStats`), added
/// to their pod's `volume` list as they were last measured.
pub trait MeasuredVolumes: Send + Sync {
    fn pod_volumes(&self, pod_uid: &str) -> Vec<summary::VolumeStats>;
}

pub struct Provider {
    /// Volumes the disk walk does not measure (CSI).
    measured: OnceLock<Arc<dyn MeasuredVolumes>>,
    runtime: Arc<dyn Runtime>,
    node: Arc<dyn NodeSource>,
    cfg: ProviderConfig,
    /// Held for the whole of a refresh: one at a time.
    carry: tokio::sync::Mutex<Carry>,
    latest: tokio::sync::watch::Sender<Option<Outcome>>,
    machine: OnceLock<cadvisor::Machine>,
    /// When the provider (the agent) started, ns: the `kubelet` system container's start.
    started_ns: i64,
}

impl Provider {
    pub fn new(runtime: Arc<dyn Runtime>, node: Arc<dyn NodeSource>, cfg: ProviderConfig) -> Self {
        Self {
            measured: OnceLock::new(),
            runtime,
            node,
            cfg,
            carry: tokio::sync::Mutex::new(Carry::default()),
            latest: tokio::sync::watch::Sender::new(None),
            machine: OnceLock::new(),
            started_ns: unix_now_ns(),
        }
    }

    /// How long one measurement of a pod's volumes is reused (`volumeStatsAggPeriod`).
    pub fn volume_stats_agg_period(&self) -> Duration {
        self.cfg.volume_stats_agg_period
    }

    /// Adds the volumes `m` measures to each pod's stats (set once, at start).
    pub fn set_measured_volumes(&self, m: Arc<dyn MeasuredVolumes>) {
        let _ = self.measured.set(m);
    }

    /// The last refresh's result. Before the first refresh the caller waits for it (or makes
    /// it, when the housekeeping task has not started one).
    pub async fn snapshot(&self) -> Outcome {
        if let Some(r) = self.latest.borrow().clone() {
            return r;
        }
        let mut carry = self.carry.lock().await;
        if let Some(r) = self.latest.borrow().clone() {
            return r;
        }
        self.refresh_locked(&mut carry).await
    }

    /// One refresh now, published to every later [`Provider::snapshot`].
    pub async fn refresh(&self) -> Outcome {
        let mut carry = self.carry.lock().await;
        self.refresh_locked(&mut carry).await
    }

    /// The housekeeping loop: a refresh every `housekeeping` period until cancelled. A refresh
    /// slower than the period delays the next tick (never two at once).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.cfg.housekeeping);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            // A request may have made the first snapshot a moment ago: two samples too close
            // together would make a noisy CPU rate.
            let fresh = matches!(
                &*self.latest.borrow(),
                Some(Ok(s)) if s.taken.elapsed() < self.cfg.housekeeping / 2
            );
            if fresh {
                continue;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = self.refresh() => match r {
                    Ok(s) => {
                        let c = s.cost;
                        if c.total > self.cfg.housekeeping / 2 {
                            tracing::warn!(total_ms = c.total.as_millis() as u64, cri_ms = c.cri.as_millis() as u64, blocking_ms = c.blocking.as_millis() as u64, pods = s.summary.pods.len(), "stats refresh is slow");
                        } else {
                            tracing::debug!(total_ms = c.total.as_millis() as u64, cri_ms = c.cri.as_millis() as u64, blocking_ms = c.blocking.as_millis() as u64, build_ms = c.build.as_millis() as u64, walked = c.pods_walked, pods = s.summary.pods.len(), gaps = ?s.gaps, "stats refreshed");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "stats refresh failed"),
                },
            }
        }
    }

    async fn refresh_locked(&self, carry: &mut Carry) -> Outcome {
        let outcome = self.gather(carry).await.map(Arc::new);
        self.latest.send_replace(Some(outcome.clone()));
        outcome
    }
}

/// The provider as the :10250 server holds it: set once the runtime is connected (the server
/// starts first); until then stats requests get 503.
#[derive(Clone, Default)]
pub struct Handle(Arc<OnceLock<Arc<Provider>>>);

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Handle {
    pub fn set(&self, p: Arc<Provider>) {
        let _ = self.0.set(p);
    }

    pub fn get(&self) -> Option<&Arc<Provider>> {
        self.0.get()
    }

    async fn snapshot(&self) -> Result<Arc<Snapshot>, Response> {
        let Some(p) = self.get() else {
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                "stats provider not ready: the container runtime has not answered yet",
            )
                .into_response());
        };
        let s = p.snapshot().await.map_err(|e| {
            tracing::warn!(error = %e, "stats summary failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Internal Error: failed to get summary stats: {e}"),
            )
                .into_response()
        })?;
        // Without the pod list there is no summary to serve, as upstream's (whose node part
        // the eviction manager still reads from the snapshot).
        if let Some(why) = s.gaps.get(&Source::PodSandboxes) {
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "Internal Error: failed to get summary stats: failed to list pod stats: {why}"
                ),
            )
                .into_response());
        }
        Ok(s)
    }

    /// `GET /stats/summary`.
    pub async fn summary(&self) -> Response {
        match self.snapshot().await {
            Ok(s) => (
                [(header::CONTENT_TYPE, "application/json")],
                s.summary_json(),
            )
                .into_response(),
            Err(r) => r,
        }
    }

    /// `GET /metrics/resource`: on a failed refresh the node's figures are missing and
    /// `scrape_error` is 1, as upstream.
    pub async fn resource_metrics(&self) -> Response {
        let text = match self.snapshot().await {
            Ok(s) => resource::render(&s.summary, false),
            Err(_) => resource::render(&summary::Summary::default(), true),
        };
        ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], text).into_response()
    }

    /// `GET /metrics/cadvisor`: the documented subset of cAdvisor's series (see
    /// [`cadvisor`]); on a failed refresh only `container_scrape_error 1`.
    pub async fn cadvisor_metrics(&self) -> Response {
        let text = match self.snapshot().await {
            Ok(s) => cadvisor::render(&s.summary, &*s.cadvisor_meta().await, false),
            Err(_) => cadvisor::render(
                &summary::Summary::default(),
                &cadvisor::Meta::default(),
                true,
            ),
        };
        ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], text).into_response()
    }
}

fn unix_now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
