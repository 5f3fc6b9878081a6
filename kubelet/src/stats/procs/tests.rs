use super::*;

fn write(dir: &Path, files: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \n\
Max cpu time              unlimited            unlimited            seconds   \n\
Max open files            1024                 524288               files     \n\
Max processes             unlimited            unlimited            processes \n";

/// A fake `/proc/<pid>` with `fds` descriptors, `sockets` of them sockets.
fn proc_with(proc_root: &Path, pid: u32, fds: usize, sockets: usize, limits: &str) {
    let fd = proc_root.join(pid.to_string()).join("fd");
    std::fs::create_dir_all(&fd).unwrap();
    for i in 0..fds {
        let target = if i < sockets {
            format!("socket:[{}]", 1000 + i)
        } else {
            format!("/var/log/file{i}")
        };
        std::os::unix::fs::symlink(target, fd.join(i.to_string())).unwrap();
    }
    std::fs::write(proc_root.join(pid.to_string()).join("limits"), limits).unwrap();
}

#[test]
fn cgroup_v2_counts_the_cgroups_own_processes_their_fds_sockets_threads_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cg");
    let proc_root = dir.path().join("proc");
    let rel = "kubepods/burstable/podu1/abc";
    write(
        &root.join(rel),
        &[
            ("cgroup.procs", "4242\n4250\n"),
            ("pids.current", "7\n"),
            ("pids.max", "512\n"),
        ],
    );
    // The pod's cgroup lists no process of its own (they are in its children).
    write(
        &root.join("kubepods/burstable/podu1"),
        &[
            ("cgroup.procs", ""),
            ("pids.current", "9\n"),
            ("pids.max", "max\n"),
        ],
    );
    proc_with(&proc_root, 4242, 5, 2, LIMITS);
    proc_with(
        &proc_root,
        4250,
        3,
        1,
        "Max open files            unlimited unlimited files\n",
    );
    let layout = Layout::V2 { root: root.clone() };

    let c = read_processes(&layout, &proc_root, &format!("/{rel}"), true);
    assert_eq!(
        c,
        Processes {
            processes: 2,
            fds: 8,
            sockets: 3,
            threads: 7,
            threads_max: 512,
            // The first process's soft limit.
            max_open_files: Some(1024),
        }
    );
    let p = read_processes(&layout, &proc_root, "/kubepods/burstable/podu1", false);
    assert_eq!(
        p,
        Processes {
            threads: 9,
            // `max`: unlimited, served as 0.
            threads_max: 0,
            ..Processes::default()
        }
    );
}

#[test]
fn cgroup_v1_reads_procs_from_the_cpu_hierarchy_and_threads_from_pids() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("cg");
    let proc_root = dir.path().join("proc");
    let rel = "kubepods/podu1/abc";
    write(
        &base.join("cpu").join(rel),
        &[("cgroup.procs", "77\n"), ("cpu.cfs_period_us", "100000\n")],
    );
    write(&base.join("cpuacct").join(rel), &[]);
    write(
        &base.join("pids").join(rel),
        &[("pids.current", "3\n"), ("pids.max", "max\n")],
    );
    proc_with(&proc_root, 77, 4, 0, LIMITS);
    let layout = Layout::V1 {
        memory: base.join("memory"),
        cpuacct: base.join("cpuacct"),
    };
    let c = read_processes(&layout, &proc_root, &format!("/{rel}"), true);
    assert_eq!(
        c,
        Processes {
            processes: 1,
            fds: 4,
            sockets: 0,
            threads: 3,
            threads_max: 0,
            max_open_files: Some(1024),
        }
    );
}

#[test]
fn a_vanished_cgroup_or_process_counts_zero_and_hostile_limits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::V2 {
        root: dir.path().join("nothing"),
    };
    assert_eq!(
        read_processes(&layout, &dir.path().join("proc"), "/gone", true),
        Processes::default()
    );
    // A process that exited between the listing and the fd walk counts as a process only.
    let root = dir.path().join("cg");
    write(&root.join("c"), &[("cgroup.procs", "99\n")]);
    let c = read_processes(&Layout::V2 { root }, &dir.path().join("proc"), "/c", true);
    assert_eq!((c.processes, c.fds, c.max_open_files), (1, 0, None));

    assert_eq!(max_open_files(LIMITS), Some(1024));
    assert_eq!(
        max_open_files("Max open files  unlimited  unlimited  files\n"),
        Some(-1)
    );
    for bad in [
        "Max open files  lots  4096  files\n",
        "Max open files  1024  many  files\n",
        "Max open files  1024  4096\n",
        "Max open files  1024  4096  files  extra\n",
        "Max processes  1024  4096  processes\n",
        "",
    ] {
        assert_eq!(max_open_files(bad), None, "{bad:?}");
    }
}
