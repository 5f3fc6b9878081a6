//! cAdvisor's process figures of a cgroup (its ProcessMetrics set, which the kubelet
//! enables): the processes listed in the cgroup's own `cgroup.procs` (not its children's, so
//! a pod's cgroup counts none), their open file descriptors and sockets from
//! `/proc/<pid>/fd`, the threads and their limit from the pids controller (`pids.current`,
//! `pids.max`; `max` is 0, unlimited), and for a container the soft `Max open files` limit
//! of its first process. A file that cannot be read counts 0, as cAdvisor's figures do.
//! Blocking: call on the blocking pool.

use super::node::{Layout, v1_cpu_dir};
use std::path::{Path, PathBuf};

/// What [`read`] found for one cgroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Processes {
    pub processes: u64,
    pub fds: u64,
    pub sockets: u64,
    pub threads: u64,
    /// 0: unlimited.
    pub threads_max: u64,
    /// The soft `Max open files` limit of the container's process (-1: unlimited); `None`
    /// for pods and the root, which have no process of their own to cAdvisor.
    pub max_open_files: Option<i64>,
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// The directories holding `cgroup.procs` (the CPU controller's, as cAdvisor reads it) and
/// the pids controller's files of the cgroup at `rel`.
fn dirs(layout: &Layout, rel: &str) -> (PathBuf, PathBuf) {
    let rel = rel.trim_start_matches('/');
    match layout {
        Layout::V1 { memory, cpuacct } => {
            let pids = memory
                .parent()
                .map(|p| p.join("pids").join(rel))
                .unwrap_or_default();
            (v1_cpu_dir(cpuacct, rel), pids)
        }
        Layout::V2 { root } => (root.join(rel), root.join(rel)),
    }
}

/// The process figures of the cgroup at `rel`; `proc_root` is `/proc`; `ulimits`: read the
/// first process's limits (containers).
pub fn read_processes(layout: &Layout, proc_root: &Path, rel: &str, ulimits: bool) -> Processes {
    let (cpu, pids_dir) = dirs(layout, rel);
    let pids: Vec<u32> = read(&cpu.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default();
    let mut out = Processes {
        processes: pids.len() as u64,
        ..Processes::default()
    };
    for pid in &pids {
        let fd_dir = proc_root.join(pid.to_string()).join("fd");
        let Ok(entries) = std::fs::read_dir(&fd_dir) else {
            continue;
        };
        for e in entries.flatten() {
            out.fds += 1;
            if std::fs::read_link(e.path())
                .is_ok_and(|t| t.as_os_str().as_encoded_bytes().starts_with(b"socket"))
            {
                out.sockets += 1;
            }
        }
    }
    out.threads = read(&pids_dir.join("pids.current"))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    out.threads_max = read(&pids_dir.join("pids.max"))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if ulimits && let Some(first) = pids.iter().min() {
        out.max_open_files = read(&proc_root.join(first.to_string()).join("limits"))
            .and_then(|s| max_open_files(&s));
    }
    out
}

/// `/proc/<pid>/limits` → the soft `Max open files` limit (`unlimited` is -1).
pub fn max_open_files(text: &str) -> Option<i64> {
    let rest = text
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    if f.len() != 3 {
        return None;
    }
    // Both limits must parse, as cAdvisor reads them.
    let limit = |v: &str| -> Option<i64> {
        if v.eq_ignore_ascii_case("unlimited") {
            Some(-1)
        } else {
            v.parse().ok()
        }
    };
    limit(f[1])?;
    limit(f[0])
}

#[cfg(test)]
mod tests;
