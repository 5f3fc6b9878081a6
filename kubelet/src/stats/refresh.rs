//! One refresh of the stats provider: the CRI calls, the blocking reads (node figures,
//! disk walks, cgroups) and the snapshot built from them.

use super::*;
use crate::runtime::{Container, ImageFsInfo};

impl Provider {
    pub(super) async fn gather(&self, carry: &mut Carry) -> Result<Snapshot, StatsError> {
        let started = Instant::now();
        let now = Instant::now();
        let layout = self.node.cgroup_layout();
        let mut cri = self.cri_round(carry, now, layout.is_none()).await;
        let cri_cost = started.elapsed();
        let input = self.blocking_input(carry, &cri, layout.clone(), now);
        let pods_walked = input.to_walk.len();
        let detail_proc_root = self.node.proc_root();
        let blocking_started = Instant::now();
        let b = tokio::task::spawn_blocking(move || input.read())
            .await
            .map_err(|e| StatsError::Task(e.to_string()))?;
        let blocking_cost = blocking_started.elapsed();
        carry.cgroups = b.locator;
        if let Some(m) = b.machine {
            let _ = self.machine.set(m);
        }
        let walked_at = Instant::now();
        for (uid, d) in b.walked {
            carry.disk.insert(uid, (walked_at, d));
        }
        let build_started = Instant::now();
        let now_ns = b.node.now_ns;
        let image_fs = cri.image_fs.take();
        let raw = self.raw(carry, &cri, image_fs, b.node, &b.ids, &b.live);
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
        add_psi(&mut summary, &b.ids, &b.psi, now_ns);
        let mut detail_cgroups: Vec<String> = b.psi.into_keys().collect();
        detail_cgroups.sort();
        let build = build_started.elapsed();
        Ok(Snapshot {
            taken: Instant::now(),
            summary,
            cadvisor: cadvisor::Meta {
                images: cri
                    .containers
                    .into_iter()
                    .map(|c| (c.id, c.image))
                    .collect(),
                cgroups: b.ids,
                details: HashMap::new(),
                details_time: None,
                network: b.net_counters,
                fs: b.fs_devices,
                time: summary::StatTime(now_ns),
                machine: self.machine.get().cloned().unwrap_or_default(),
            },
            json: OnceLock::new(),
            layout,
            detail_cgroups,
            proc_root: detail_proc_root,
            full: tokio::sync::OnceCell::new(),
            gaps: cri.gaps,
            unmeasured,
            cost: RefreshCost {
                cri: cri_cost,
                blocking: blocking_cost,
                build,
                total: started.elapsed(),
                pods_walked,
                phases: b.phases,
            },
        })
    }

    /// The runtime's calls of one refresh: a fixed set, none per container. CPU, memory and
    /// network come from the cgroups every refresh; the runtime's own stats (writable
    /// layers, process counts; everything when the cgroups cannot be read, `no_cgroups`)
    /// only once per aggregation period: at 110 pods one ListPodSandboxStats costs
    /// containerd seconds (it asks every shim).
    async fn cri_round(&self, carry: &mut Carry, now: Instant, no_cgroups: bool) -> CriRound {
        let rt = &self.runtime;
        let cri_due = no_cgroups
            || carry
                .cri_stats
                .as_ref()
                .is_none_or(|(at, _)| now.duration_since(*at) >= self.cfg.volume_stats_agg_period);
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
        let mut round = CriRound {
            listed,
            containers,
            image_fs,
            gaps,
            pods_known,
        };
        match stats {
            Some(Ok(list)) => {
                carry.cri_stats =
                    Some((now, list.into_iter().map(|s| (s.id.clone(), s)).collect()));
                carry.cri_gaps.clear();
            }
            // A runtime whose list fails on one bad sandbox (containerd 1.6 on a stopped one,
            // without the filter we send) still answers for each ready sandbox.
            Some(Err(e)) if pods_known => {
                let ids = round.ready().iter().map(|s| s.id.clone()).collect();
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
        round.gaps.extend(carry.cri_gaps.clone());
        round
    }

    /// What the blocking part of the refresh reads: the pods whose last walk is older than
    /// the aggregation period, and each ready pod's cgroups (its sandbox first, then its
    /// running containers).
    fn blocking_input(
        &self,
        carry: &mut Carry,
        cri: &CriRound,
        layout: Option<node::Layout>,
        now: Instant,
    ) -> BlockingInput {
        let ready = cri.ready();
        let period = self.cfg.volume_stats_agg_period;
        if cri.pods_known {
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
            .map(|s| self.pod_dirs(s))
            .collect();
        let wanted: Vec<(String, Vec<String>)> = ready
            .iter()
            .map(|s| {
                let mut ids = vec![s.id.clone()];
                ids.extend(
                    cri.containers
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
        BlockingInput {
            node: self.node.clone(),
            root_dir: self.cfg.root_dir.clone(),
            image_mount: cri
                .image_fs
                .as_ref()
                .and_then(|i| i.image_filesystems.first())
                .map(|f| PathBuf::from(&f.mountpoint)),
            to_walk,
            wanted,
            layout,
            locator: std::mem::take(&mut carry.cgroups),
            need_machine: self.machine.get().is_none(),
            system_cgroups: self.cfg.system.clone(),
        }
    }

    /// The directories of a pod the disk walk measures.
    fn pod_dirs(&self, s: &Sandbox) -> disk::PodDirs {
        let pod_dir = self.cfg.root_dir.join("pods").join(&s.pod_uid);
        disk::PodDirs {
            uid: s.pod_uid.clone(),
            volumes: pod_dir.join("volumes"),
            logs: self
                .cfg
                .pod_logs_dir
                .join(format!("{}_{}_{}", s.pod_namespace, s.pod_name, s.pod_uid)),
            etc_hosts: pod_dir.join("etc-hosts"),
        }
    }

    /// What the Summary is built from.
    fn raw(
        &self,
        carry: &Carry,
        cri: &CriRound,
        image_fs: Option<ImageFsInfo>,
        node: NodeReadings,
        ids: &cgroups::Ids,
        live: &live::Live,
    ) -> build::Raw {
        let empty = HashMap::new();
        let last = carry.cri_stats.as_ref().map(|(_, m)| m).unwrap_or(&empty);
        let sandboxes = live::sandboxes(&cri.listed, &cri.containers, last, ids, live);
        build::Raw {
            node_name: self.cfg.node_name.clone(),
            now_ns: node.now_ns,
            node: node.usage,
            boot_time: node.boot_time,
            root_fs: node.root_fs,
            image_fs_capacity: node.image_cap,
            image_fs,
            pids: node.pids,
            system: node.system,
            kubelet_start_ns: self.started_ns,
            sandboxes,
            sandbox_created: cri
                .listed
                .iter()
                .map(|s| (s.id.clone(), s.created_at))
                .collect(),
            container_created: cri
                .containers
                .iter()
                .map(|c| (c.id.clone(), c.created_at))
                .collect(),
            disk: carry
                .disk
                .iter()
                .map(|(uid, (_, d))| (uid.clone(), d.clone()))
                .collect(),
        }
    }
}

/// What the runtime answered in one refresh (each failure a gap, its figures missing).
struct CriRound {
    listed: Vec<Sandbox>,
    containers: Vec<Container>,
    image_fs: Option<ImageFsInfo>,
    gaps: Gaps,
    /// Whether the sandboxes could be listed.
    pods_known: bool,
}

impl CriRound {
    fn ready(&self) -> Vec<&Sandbox> {
        self.listed
            .iter()
            .filter(|s| s.state == crate::runtime::SandboxState::Ready)
            .collect()
    }
}

/// What the blocking part of a refresh reads from.
struct BlockingInput {
    node: Arc<dyn NodeSource>,
    root_dir: PathBuf,
    image_mount: Option<PathBuf>,
    to_walk: Vec<disk::PodDirs>,
    /// Pod UID → its sandbox's ID, then its running containers'.
    wanted: Vec<(String, Vec<String>)>,
    layout: Option<node::Layout>,
    locator: cgroups::Locator,
    need_machine: bool,
    system_cgroups: system::SystemCgroups,
}

/// Times the blocking phases one after another.
struct Lap(Instant);

impl Lap {
    fn lap(&mut self, d: &mut Duration) {
        *d = self.0.elapsed();
        self.0 = Instant::now();
    }
}

impl BlockingInput {
    /// The blocking reads (call on the blocking pool).
    fn read(mut self) -> Blocking {
        let mut phases = Phases::default();
        let mut lap = Lap(Instant::now());
        let node = self.node.clone();
        let now_ns = unix_now_ns();
        let usage = node.usage();
        let root_fs = node.fs_info(&self.root_dir);
        let image_cap = self.image_mount.as_ref().and_then(|m| node.fs_info(m));
        let boot_time = node.boot_time();
        let pids = node.pids();
        lap.lap(&mut phases.node);
        let walked: Vec<(String, build::PodDisk)> = self
            .to_walk
            .iter()
            .map(|p| (p.uid.clone(), disk::pod_disk(p)))
            .collect();
        lap.lap(&mut phases.disk);
        let cg = match self.layout.take() {
            Some(layout) => self.read_cgroups(&layout, now_ns, &mut lap, &mut phases),
            None => CgroupReadings {
                ids: cgroups::Ids::default(),
                live: live::Live {
                    ts: now_ns,
                    ..live::Live::default()
                },
                psi: HashMap::new(),
                net_counters: HashMap::new(),
                system: system::Readings::new(),
            },
        };
        let machine = self.need_machine.then(|| node.machine());
        let fs_devices = fs_devices(
            node.as_ref(),
            [
                (Some(&self.root_dir), root_fs),
                (self.image_mount.as_ref(), image_cap),
            ],
        );
        Blocking {
            node: NodeReadings {
                now_ns,
                system: cg.system,
                usage,
                boot_time,
                root_fs,
                image_cap,
                pids,
            },
            psi: cg.psi,
            net_counters: cg.net_counters,
            fs_devices,
            walked,
            ids: cg.ids,
            live: cg.live,
            locator: self.locator,
            machine,
            phases,
        }
    }

    /// The pods' and containers' usage and pressure, the root's pressure, the sandboxes'
    /// network and the system containers.
    fn read_cgroups(
        &mut self,
        layout: &node::Layout,
        now_ns: i64,
        lap: &mut Lap,
        phases: &mut Phases,
    ) -> CgroupReadings {
        let wanted = &self.wanted;
        let ids = self.locator.resolve(layout, wanted);
        let mut live = live::Live {
            ts: now_ns,
            ..live::Live::default()
        };
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
        // Their pressure (the Summary's PSI), and the root's. The rest of what cAdvisor
        // reads of them waits for a scrape (`Snapshot::cadvisor_meta`).
        let mut psi = HashMap::new();
        for cg in live.usage.keys() {
            psi.insert(cg.clone(), detail::read_psi(layout, cg));
        }
        psi.insert("/".into(), detail::read_psi(layout, "/"));
        lap.lap(&mut phases.cgroups);
        let proc_root = self.node.proc_root();
        let mut net_counters = HashMap::new();
        for (uid, members) in wanted {
            let sandbox_cg = members.first().and_then(|id| ids.containers.get(id));
            if let Some((n, full)) =
                sandbox_cg.and_then(|cg| cgroups::network(layout, cg, &proc_root, now_ns))
            {
                live.network.insert(uid.clone(), n);
                net_counters.insert(uid.clone(), full);
            }
        }
        lap.lap(&mut phases.network);
        let own = std::fs::read_to_string(proc_root.join("self/cgroup")).unwrap_or_default();
        let system = system::read(layout, &self.system_cgroups, &own);
        CgroupReadings {
            ids,
            live,
            psi,
            net_counters,
            system,
        }
    }
}

/// The devices of the node's and the image filesystem (the root cgroup's `container_fs_*`
/// series), each once.
fn fs_devices(
    node: &dyn NodeSource,
    filesystems: [(Option<&PathBuf>, Option<node::FsInfo>); 2],
) -> Vec<(String, node::FsInfo)> {
    let mountinfo =
        std::fs::read_to_string(node.proc_root().join("self/mountinfo")).unwrap_or_default();
    let mut fs_devices: Vec<(String, node::FsInfo)> = Vec::new();
    for (path, info) in filesystems {
        if let (Some(p), Some(i)) = (path, info)
            && let Some(dev) = node::mount_source(&mountinfo, p)
            && !fs_devices.iter().any(|(d, _)| *d == dev)
        {
            fs_devices.push((dev, i));
        }
    }
    fs_devices
}

/// What the cgroups told of one refresh's pods (nothing without a cgroup layout).
struct CgroupReadings {
    ids: cgroups::Ids,
    live: live::Live,
    /// Pressure of each cgroup read (`/` for the root).
    psi: HashMap<String, detail::Psi>,
    net_counters: HashMap<String, Vec<detail::IfaceCounters>>,
    /// The system containers' cgroups.
    system: system::Readings,
}

/// The node's own figures of one refresh.
struct NodeReadings {
    now_ns: i64,
    /// The system containers' cgroups.
    system: system::Readings,
    usage: node::NodeUsage,
    boot_time: Option<i64>,
    root_fs: Option<node::FsInfo>,
    image_cap: Option<node::FsInfo>,
    pids: (Option<i64>, Option<i64>),
}

/// What the blocking part of a refresh read.
struct Blocking {
    node: NodeReadings,
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
