use super::*;
use crate::events::FakeRecorder;

const CGROUP_OOM: &[&str] = &[
    "6,101,5000,-;tail invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=1000",
    "6,102,5001,-;CPU: 1 UID: 0 PID: 4242 Comm: tail Not tainted 6.18.0 #1",
    "6,103,5002,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=abc,mems_allowed=0,oom_memcg=/kubepods/besteffort/pod1/abc,task_memcg=/kubepods/besteffort/pod1/abc,task=tail,pid=4242,uid=0",
    "3,104,5003,-;Memory cgroup out of memory: Killed process 4242 (tail) total-vm:30000kB, anon-rss:20000kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:60kB oom_score_adj:1000",
];

const SYSTEM_OOM: &[&str] = &[
    "4,201,9000,-;stress invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0, oom_score_adj=0",
    "6,202,9001,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/user.slice,task=stress,pid=777,uid=0",
    "3,203,9002,-;Out of memory: Killed process 777 (stress) total-vm:2000000kB, anon-rss:1900000kB, file-rss:4kB, shmem-rss:0kB, UID:0 pgtables:3800kB oom_score_adj:0",
];

fn parse_all(records: &[&str]) -> Vec<OomInstance> {
    let mut p = Parser::default();
    records
        .iter()
        .filter_map(|r| p.feed(kmsg_message(r)?))
        .collect()
}

#[test]
fn a_container_past_its_limit_is_a_cgroup_oom_not_a_system_oom() {
    let got = parse_all(CGROUP_OOM);
    assert_eq!(
        got,
        vec![OomInstance {
            pid: 4242,
            process_name: "tail".into(),
            container_name: "/kubepods/besteffort/pod1/abc".into(),
            victim_container_name: "/kubepods/besteffort/pod1/abc".into(),
            constraint: "CONSTRAINT_MEMCG".into(),
        }]
    );
    assert_eq!(got[0].system_oom_message(), None);
}

#[test]
fn a_global_oom_is_a_system_oom_with_upstreams_message() {
    let got = parse_all(SYSTEM_OOM);
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].system_oom_message().as_deref(),
        Some("System OOM encountered, victim process: stress, pid: 777")
    );
}

#[test]
fn older_kernels_task_in_line_names_the_limit() {
    let got = parse_all(&[
        "6,1,1,-;foo invoked oom-killer: gfp_mask=0x24000c0, order=0, oom_score_adj=0",
        "6,2,2,-;Task in /kubepods/pod1/c1 killed as a result of limit of /kubepods/pod1",
        "3,3,3,-;Memory cgroup out of memory: Killed process 55 (foo) total-vm:1kB",
    ]);
    assert_eq!(got[0].victim_container_name, "/kubepods/pod1");
    assert_eq!(got[0].container_name, "/kubepods/pod1/c1");
    assert_eq!((got[0].pid, got[0].process_name.as_str()), (55, "foo"));
    assert_eq!(got[0].system_oom_message(), None);
}

#[test]
fn unrelated_lines_and_continuations_are_ignored() {
    assert!(parse_all(&["6,1,1,-;eth0: link up", "junk without a separator"]).is_empty());
    assert_eq!(
        kmsg_message("6,1,1,-;hello\n SUBSYSTEM=net\n"),
        Some("hello")
    );
}

#[tokio::test]
async fn the_watch_records_system_ooms_on_the_node_and_stops_on_cancel() {
    let log = fake::FakeKernelLog::default();
    for r in CGROUP_OOM.iter().chain(SYSTEM_OOM) {
        log.push(r);
    }
    let rec = Arc::new(FakeRecorder::default());
    let cancel = CancellationToken::new();
    let l = log.clone();
    let task = tokio::spawn(run(
        move || Ok(l),
        rec.clone(),
        "node-1".into(),
        cancel.clone(),
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while rec.events().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no event");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        rec.events(),
        vec!["Warning SystemOOM System OOM encountered, victim process: stress, pid: 777"]
    );
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn an_unreadable_kernel_log_skips_the_watch() {
    let rec = Arc::new(FakeRecorder::default());
    let open = || -> std::io::Result<fake::FakeKernelLog> {
        Err(std::io::ErrorKind::PermissionDenied.into())
    };
    tokio::time::timeout(
        Duration::from_secs(5),
        run(open, rec.clone(), "n".into(), CancellationToken::new()),
    )
    .await
    .expect("returns at once");
    assert!(rec.events().is_empty());
}
