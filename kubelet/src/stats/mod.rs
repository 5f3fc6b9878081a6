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
pub mod resource;
pub mod settings;
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

    async fn gather(&self, carry: &mut Carry) -> Result<Snapshot, StatsError> {
        let started = Instant::now();
        let now = Instant::now();
        let rt = &self.runtime;
        // CPU, memory and network come from the cgroups every refresh; the runtime's own
        // stats (writable layers, process counts; everything when the cgroups cannot be
        // read) only once per aggregation period: at 110 pods one ListPodSandboxStats costs
        // containerd seconds (it asks every shim).
        let layout = self.node.cgroup_layout();
        let cri_due = layout.is_none()
            || carry
                .cri_stats
                .as_ref()
                .is_none_or(|(at, _)| now.duration_since(*at) >= self.cfg.volume_stats_agg_period);
        // A fixed set of calls per refresh, none per container.
        let (listed, containers, image_fs, stats) = tokio::join!(
            rt.list_sandboxes(),
            rt.list_containers(),
            rt.image_fs_info(),
            async {
                if cri_due {
                    Some(rt.list_sandbox_stats().await)
                } else {
                    None
                }
            }
        );
        // One source failing costs only its own figures: the rest is served, and the
        // snapshot says what is missing (the eviction manager reports it once).
        let mut gaps = Gaps::new();
        let pods_known = listed.is_ok();
        let listed = listed.unwrap_or_else(|e| {
            gaps.insert(Source::PodSandboxes, e.to_string());
            Vec::new()
        });
        let image_fs = image_fs
            .map_err(|e| gaps.insert(Source::ImageFs, e.to_string()))
            .ok();
        let containers = containers.unwrap_or_else(|e| {
            gaps.insert(Source::Containers, e.to_string());
            Vec::new()
        });
        let ready: Vec<&Sandbox> = listed
            .iter()
            .filter(|s| s.state == crate::runtime::SandboxState::Ready)
            .collect();
        match stats {
            Some(Ok(list)) => {
                carry.cri_stats =
                    Some((now, list.into_iter().map(|s| (s.id.clone(), s)).collect()));
                carry.cri_gaps.clear();
            }
            // A runtime whose list fails on one bad sandbox (containerd 1.6 on a stopped one,
            // without the filter we send) still answers for each ready sandbox.
            Some(Err(e)) if pods_known => {
                let ids = ready.iter().map(|s| s.id.clone()).collect();
                let (by_id, cri_gaps) = each_sandbox(rt.clone(), ids, e).await;
                carry.cri_stats = Some((now, by_id));
                carry.cri_gaps = cri_gaps;
            }
            // No pod known: asked again at the next refresh.
            Some(Err(e)) => {
                carry.cri_gaps = [(Source::SandboxStatsList, e.to_string())].into();
            }
            None => {}
        }
        gaps.extend(carry.cri_gaps.clone());
        let cri = started.elapsed();

        // Walk only the pods whose last walk is older than the aggregation period.
        let period = self.cfg.volume_stats_agg_period;
        if pods_known {
            carry
                .disk
                .retain(|uid, _| ready.iter().any(|s| &s.pod_uid == uid));
        }
        let to_walk: Vec<disk::PodDirs> = ready
            .iter()
            .filter(|s| {
                carry
                    .disk
                    .get(&s.pod_uid)
                    .is_none_or(|(at, _)| now.duration_since(*at) >= period)
            })
            .map(|s| disk::PodDirs {
                uid: s.pod_uid.clone(),
                volumes: self
                    .cfg
                    .root_dir
                    .join("pods")
                    .join(&s.pod_uid)
                    .join("volumes"),
                logs: self
                    .cfg
                    .pod_logs_dir
                    .join(format!("{}_{}_{}", s.pod_namespace, s.pod_name, s.pod_uid)),
                etc_hosts: self
                    .cfg
                    .root_dir
                    .join("pods")
                    .join(&s.pod_uid)
                    .join("etc-hosts"),
            })
            .collect();
        let pods_walked = to_walk.len();
        // Per pod: its sandbox first, then its running containers.
        let wanted: Vec<(String, Vec<String>)> = ready
            .iter()
            .map(|s| {
                let mut ids = vec![s.id.clone()];
                ids.extend(
                    containers
                        .iter()
                        .filter(|c| {
                            c.sandbox_id == s.id
                                && c.state == crate::runtime::ContainerState::Running
                        })
                        .map(|c| c.id.clone()),
                );
                (s.pod_uid.clone(), ids)
            })
            .collect();
        let node = self.node.clone();
        let root_dir = self.cfg.root_dir.clone();
        let image_mount = image_fs
            .as_ref()
            .and_then(|i| i.image_filesystems.first())
            .map(|f| PathBuf::from(&f.mountpoint));
        let mut locator = std::mem::take(&mut carry.cgroups);
        let need_machine = self.machine.get().is_none();
        let blocking_started = Instant::now();
        let detail_layout = layout.clone();
        let detail_proc_root = self.node.proc_root();
        let system_cgroups = self.cfg.system.clone();
        let blocking = tokio::task::spawn_blocking(move || {
            let mut phases = Phases::default();
            let mut at = Instant::now();
            let mut lap = |d: &mut Duration| {
                *d = at.elapsed();
                at = Instant::now();
            };
            let now_ns = unix_now_ns();
            let usage = node.usage();
            let root_fs = node.fs_info(&root_dir);
            let image_cap = image_mount.as_ref().and_then(|m| node.fs_info(m));
            let boot_time = node.boot_time();
            let pids = node.pids();
            lap(&mut phases.node);
            let walked: Vec<(String, build::PodDisk)> = to_walk
                .iter()
                .map(|p| (p.uid.clone(), disk::pod_disk(p)))
                .collect();
            lap(&mut phases.disk);
            let mut live = live::Live {
                ts: now_ns,
                ..live::Live::default()
            };
            let mut ids = cgroups::Ids::default();
            let mut psi = HashMap::new();
            let mut net_counters = HashMap::new();
            let mut system = system::Readings::new();
            if let Some(layout) = &layout {
                ids = locator.resolve(layout, &wanted);
                // Pods and their containers; the pause containers' own figures are not served.
                let sandboxes: std::collections::HashSet<&String> =
                    wanted.iter().filter_map(|(_, m)| m.first()).collect();
                let app = ids
                    .containers
                    .iter()
                    .filter(|(id, _)| !sandboxes.contains(id))
                    .map(|(_, cg)| cg);
                for cg in ids.pods.values().chain(app) {
                    if let Some(u) = cgroups::usage(layout, cg) {
                        live.usage.insert(cg.clone(), u);
                    }
                }
                // Their pressure (the Summary's PSI), and the root's. The rest of what
                // cAdvisor reads of them waits for a scrape (`Snapshot::cadvisor_meta`).
                for cg in live.usage.keys() {
                    psi.insert(cg.clone(), detail::read_psi(layout, cg));
                }
                psi.insert("/".into(), detail::read_psi(layout, "/"));
                lap(&mut phases.cgroups);
                let proc_root = node.proc_root();
                for (uid, members) in &wanted {
                    let sandbox_cg = members.first().and_then(|id| ids.containers.get(id));
                    if let Some((n, full)) =
                        sandbox_cg.and_then(|cg| cgroups::network(layout, cg, &proc_root, now_ns))
                    {
                        live.network.insert(uid.clone(), n);
                        net_counters.insert(uid.clone(), full);
                    }
                }
                lap(&mut phases.network);
                let own =
                    std::fs::read_to_string(proc_root.join("self/cgroup")).unwrap_or_default();
                system = system::read(layout, &system_cgroups, &own);
            }
            let machine = need_machine.then(|| node.machine());
            // The devices of the node's and the image filesystem (the root cgroup's
            // `container_fs_*` series).
            let mountinfo = std::fs::read_to_string(node.proc_root().join("self/mountinfo"))
                .unwrap_or_default();
            let mut fs_devices: Vec<(String, node::FsInfo)> = Vec::new();
            for (path, info) in [
                (Some(&root_dir), root_fs),
                (image_mount.as_ref(), image_cap),
            ] {
                if let (Some(p), Some(i)) = (path, info)
                    && let Some(dev) = node::mount_source(&mountinfo, p)
                    && !fs_devices.iter().any(|(d, _)| *d == dev)
                {
                    fs_devices.push((dev, i));
                }
            }
            Blocking {
                system,
                psi,
                net_counters,
                fs_devices,
                now_ns,
                usage,
                boot_time,
                root_fs,
                image_cap,
                pids,
                walked,
                ids,
                live,
                locator,
                machine,
                phases,
            }
        })
        .await
        .map_err(|e| StatsError::Task(e.to_string()))?;
        let blocking_cost = blocking_started.elapsed();
        carry.cgroups = blocking.locator;
        if let Some(m) = blocking.machine {
            let _ = self.machine.set(m);
        }
        let walked_at = Instant::now();
        for (uid, d) in blocking.walked {
            carry.disk.insert(uid, (walked_at, d));
        }
        let build_started = Instant::now();
        let empty = HashMap::new();
        let last = carry.cri_stats.as_ref().map(|(_, m)| m).unwrap_or(&empty);
        let sandboxes = live::sandboxes(&listed, &containers, last, &blocking.ids, &blocking.live);
        let raw = build::Raw {
            node_name: self.cfg.node_name.clone(),
            now_ns: blocking.now_ns,
            node: blocking.usage,
            boot_time: blocking.boot_time,
            root_fs: blocking.root_fs,
            image_fs_capacity: blocking.image_cap,
            image_fs,
            pids: blocking.pids,
            system: blocking.system,
            kubelet_start_ns: self.started_ns,
            sandboxes,
            sandbox_created: listed
                .iter()
                .map(|s| (s.id.clone(), s.created_at))
                .collect(),
            container_created: containers
                .iter()
                .map(|c| (c.id.clone(), c.created_at))
                .collect(),
            disk: carry
                .disk
                .iter()
                .map(|(uid, (_, d))| (uid.clone(), d.clone()))
                .collect(),
        };
        let unmeasured: Unmeasured = carry
            .disk
            .iter()
            .filter(|(_, (_, d))| !d.unfinished.is_empty())
            .map(|(uid, (_, d))| (uid.clone(), d.unfinished.clone()))
            .collect();
        let mut summary = build::summary(&raw, &mut carry.cpu);
        if let Some(m) = self.measured.get() {
            for p in &mut summary.pods {
                p.volume.extend(m.pod_volumes(&p.pod_ref.uid));
            }
        }
        add_psi(&mut summary, &blocking.ids, &blocking.psi, blocking.now_ns);
        let mut detail_cgroups: Vec<String> = blocking.psi.into_keys().collect();
        detail_cgroups.sort();
        let build = build_started.elapsed();
        Ok(Snapshot {
            taken: Instant::now(),
            summary,
            cadvisor: cadvisor::Meta {
                images: containers.into_iter().map(|c| (c.id, c.image)).collect(),
                cgroups: blocking.ids,
                details: HashMap::new(),
                details_time: None,
                network: blocking.net_counters,
                fs: blocking.fs_devices,
                time: summary::StatTime(blocking.now_ns),
                machine: self.machine.get().cloned().unwrap_or_default(),
            },
            json: OnceLock::new(),
            layout: detail_layout,
            detail_cgroups,
            proc_root: detail_proc_root,
            full: tokio::sync::OnceCell::new(),
            gaps,
            unmeasured,
            cost: RefreshCost {
                cri,
                blocking: blocking_cost,
                build,
                total: started.elapsed(),
                pods_walked,
                phases: blocking.phases,
            },
        })
    }
}

/// PSI of the node (root cgroup), pods and containers into the Summary, where the cgroup
/// offers it (cgroup v2): `cpu.psi`, `memory.psi` and `io`.
fn add_psi(
    s: &mut summary::Summary,
    ids: &cgroups::Ids,
    psi: &HashMap<String, detail::Psi>,
    now_ns: i64,
) {
    let t = summary::StatTime(now_ns);
    let apply = |d: Option<&detail::Psi>,
                 cpu: &mut Option<summary::CpuStats>,
                 mem: &mut Option<summary::MemoryStats>,
                 io: &mut Option<summary::IoStats>| {
        let Some(d) = d else { return };
        if let (Some(c), Some(p)) = (cpu.as_mut(), &d.cpu) {
            c.psi = Some(p.clone());
        }
        if let (Some(m), Some(p)) = (mem.as_mut(), &d.memory) {
            m.psi = Some(p.clone());
        }
        if let Some(p) = &d.io {
            *io = Some(summary::IoStats {
                time: t,
                psi: Some(p.clone()),
            });
        }
    };
    let n = &mut s.node;
    apply(psi.get("/"), &mut n.cpu, &mut n.memory, &mut n.io);
    for p in &mut s.pods {
        let d = ids.pods.get(&p.pod_ref.uid).and_then(|cg| psi.get(cg));
        apply(d, &mut p.cpu, &mut p.memory, &mut p.io);
        for c in &mut p.containers {
            let d = ids.containers.get(&c.id).and_then(|cg| psi.get(cg));
            apply(d, &mut c.cpu, &mut c.memory, &mut c.io);
        }
    }
}

/// Each ready sandbox's own PodSandboxStats, a few at a time, after ListPodSandboxStats
/// failed with `list_err`; the gaps name the list's failure and the sandboxes that failed too.
async fn each_sandbox(
    rt: Arc<dyn Runtime>,
    ready: Vec<String>,
    list_err: RuntimeError,
) -> (HashMap<String, SandboxStats>, Gaps) {
    use futures::StreamExt;
    let total = ready.len();
    let asks = ready.into_iter().map(move |id| {
        let rt = rt.clone();
        async move {
            let r = rt.sandbox_stats(&id).await;
            (id, r)
        }
    });
    let answers: Vec<(String, crate::runtime::Result<SandboxStats>)> = futures::stream::iter(asks)
        .buffer_unordered(PER_SANDBOX_CONCURRENCY)
        .collect()
        .await;
    let mut gaps: Gaps = [(Source::SandboxStatsList, list_err.to_string())].into();
    let mut by_id = HashMap::new();
    let mut failed = Vec::new();
    for (id, r) in answers {
        match r {
            Ok(s) => {
                by_id.insert(id, s);
            }
            Err(e) => failed.push(e),
        }
    }
    if let Some(first) = failed.first() {
        gaps.insert(
            Source::SandboxStats,
            format!("{} of {total} ready sandboxes: {first}", failed.len()),
        );
    }
    (by_id, gaps)
}

/// What the blocking part of a refresh read.
struct Blocking {
    now_ns: i64,
    /// The system containers' cgroups.
    system: system::Readings,
    usage: node::NodeUsage,
    boot_time: Option<i64>,
    root_fs: Option<node::FsInfo>,
    image_cap: Option<node::FsInfo>,
    pids: (Option<i64>, Option<i64>),
    walked: Vec<(String, build::PodDisk)>,
    ids: cgroups::Ids,
    live: live::Live,
    locator: cgroups::Locator,
    machine: Option<cadvisor::Machine>,
    phases: Phases,
    /// Pressure of each cgroup read (`/` for the root).
    psi: HashMap<String, detail::Psi>,
    net_counters: HashMap<String, Vec<detail::IfaceCounters>>,
    fs_devices: Vec<(String, node::FsInfo)>,
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
