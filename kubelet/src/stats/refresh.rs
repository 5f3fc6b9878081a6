//! One refresh of the stats provider: the CRI calls, the blocking reads (node figures,
//! disk walks, cgroups) and the snapshot built from them.

use super::*;

impl Provider {
    pub(super) async fn gather(&self, carry: &mut Carry) -> Result<Snapshot, StatsError> {
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
