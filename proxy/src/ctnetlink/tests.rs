use std::process::Command;
use std::time::Instant;

use super::*;
use crate::conntrack::{UdpTarget, clean_stale_entries};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn flow(src: &str, dst: &str, sport: u16, dport: u16, reply_src: &str) -> Flow {
    Flow {
        orig: Tuple {
            src: ip(src),
            dst: ip(dst),
            proto: IPPROTO_UDP,
            sport,
            dport,
        },
        reply: Tuple {
            src: ip(reply_src),
            dst: ip(src),
            proto: IPPROTO_UDP,
            sport: dport,
            dport: sport,
        },
        zone: None,
    }
}

#[cfg(target_endian = "little")]
#[test]
fn dump_request_is_byte_exact() {
    assert_eq!(
        dump_request(IpFamily::V4, 7),
        vec![
            20, 0, 0, 0, // length
            0x01, 0x01, // NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_GET
            0x01, 0x03, // NLM_F_REQUEST | NLM_F_DUMP
            7, 0, 0, 0, // seq
            0, 0, 0, 0, // pid
            2, 0, 0, 0, // nfgenmsg: AF_INET, NFNETLINK_V0, res_id 0
        ]
    );
    assert_eq!(dump_request(IpFamily::V6, 7)[16], 10, "AF_INET6");
}

#[cfg(target_endian = "little")]
#[test]
fn delete_request_is_byte_exact() {
    let f = flow("10.0.0.1", "10.96.0.10", 40000, 53, "10.244.0.9");
    let want: Vec<u8> = [
        &[72, 0, 0, 0, 0x02, 0x01, 0x05, 0x00, 9, 0, 0, 0, 0, 0, 0, 0][..],
        &[2, 0, 0, 0],                   // nfgenmsg
        &[52, 0, 0x01, 0x80],            // CTA_TUPLE_ORIG | NLA_F_NESTED
        &[20, 0, 0x01, 0x80],            // CTA_TUPLE_IP | NLA_F_NESTED
        &[8, 0, 1, 0, 10, 0, 0, 1],      // CTA_IP_V4_SRC
        &[8, 0, 2, 0, 10, 96, 0, 10],    // CTA_IP_V4_DST
        &[28, 0, 0x02, 0x80],            // CTA_TUPLE_PROTO | NLA_F_NESTED
        &[5, 0, 1, 0, 17, 0, 0, 0],      // CTA_PROTO_NUM udp (padded)
        &[6, 0, 2, 0, 0x9c, 0x40, 0, 0], // CTA_PROTO_SRC_PORT 40000 (big endian)
        &[6, 0, 3, 0, 0, 53, 0, 0],      // CTA_PROTO_DST_PORT 53
    ]
    .concat();
    assert_eq!(delete_request(&f, 9), want);

    // A zone is echoed; IPv6 uses the 16-byte address attributes.
    let mut z = flow("fd00::1", "fd00:96::10", 1, 53, "fd00:244::9");
    z.zone = Some(3);
    let m = delete_request(&z, 1);
    assert_eq!(m[16], 10);
    assert!(m.ends_with(&[6, 0, 18, 0, 0, 3, 0, 0]), "{m:?}");
    assert_eq!(m.len(), 20 + 4 + (4 + 20 + 20) + 28 + 8);
}

/// A kernel-style dump message: CT_NEW with both tuples, a status and a zone.
fn dump_message(f: &Flow, seq: u32) -> Vec<u8> {
    let mut attrs = Vec::new();
    put_tuple(&mut attrs, CTA_TUPLE_ORIG, &f.orig);
    put_tuple(&mut attrs, CTA_TUPLE_REPLY, &f.reply);
    put_attr(&mut attrs, 3, &8u32.to_be_bytes()); // CTA_STATUS
    if let Some(z) = f.zone {
        put_attr(&mut attrs, CTA_ZONE, &z.to_be_bytes());
    }
    message(0, 0x2, seq, AF_INET, &attrs)
}

#[test]
fn a_dump_datagram_parses_into_flows_acks_and_done() {
    let mut a = flow("10.0.0.1", "10.96.0.10", 40000, 53, "10.244.0.9");
    a.zone = Some(7);
    let b = flow("10.0.0.2", "10.96.0.11", 40001, 5353, "10.96.0.11");
    let mut buf = dump_message(&a, 5);
    buf.extend(dump_message(&b, 5));
    // NLMSG_ERROR carrying -ENOENT for request 6, then NLMSG_DONE.
    let mut err = vec![36, 0, 0, 0];
    err.extend(NLMSG_ERROR.to_ne_bytes());
    err.extend([0, 0]);
    err.extend(6u32.to_ne_bytes());
    err.extend([0; 4]);
    err.extend((-2i32).to_ne_bytes());
    err.extend([0; 16]);
    buf.extend(&err);
    let mut done = vec![20, 0, 0, 0];
    done.extend(NLMSG_DONE.to_ne_bytes());
    done.extend([0; 14]);
    buf.extend(&done);
    assert_eq!(
        parse_replies(&buf),
        vec![
            Reply::Flow(a),
            Reply::Flow(b),
            Reply::Ack { seq: 6, errno: -2 },
            Reply::Done
        ]
    );
    assert_eq!(
        a.entry(),
        FlowEntry {
            orig_dst: ip("10.96.0.10"),
            orig_dst_port: 53,
            reply_src: ip("10.244.0.9")
        }
    );
    // Truncated input yields what is whole, never a panic.
    assert_eq!(parse_replies(&buf[..buf.len() / 2 + 3]).len(), 1);
}

#[test]
fn flows_match_filters_as_conntrack_d_does() {
    let f = flow("10.0.0.1", "10.96.0.10", 40000, 53, "10.244.0.9");
    let filter = |d: Option<&str>, p: u16, r: &str| Filter {
        orig_dst: d.map(ip),
        orig_dst_port: p,
        reply_src: ip(r),
    };
    assert!(f.matches(&filter(Some("10.96.0.10"), 53, "10.244.0.9")));
    assert!(
        f.matches(&filter(None, 53, "10.244.0.9")),
        "node port filter"
    );
    assert!(!f.matches(&filter(Some("10.96.0.11"), 53, "10.244.0.9")));
    assert!(!f.matches(&filter(Some("10.96.0.10"), 54, "10.244.0.9")));
    assert!(!f.matches(&filter(Some("10.96.0.10"), 53, "10.244.0.5")));
    let mut tcp = f;
    tcp.orig.proto = 6;
    assert!(!tcp.matches(&filter(Some("10.96.0.10"), 53, "10.244.0.9")));
}

#[tokio::test]
async fn a_failing_netlink_falls_back_to_the_binary_with_one_warning() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // Stands in for the conntrack binary (the prefix runs it with `conntrack -L ...`).
    let fake = dir.path().join("fake-conntrack");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'udp 17 28 src=10.0.0.1 dst=10.96.0.10 sport=4 dport=53 src=10.244.0.9 dst=10.0.0.1 sport=53 dport=4 mark=0 use=1'\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ct = NodeConntrack {
        // A netlink that cannot answer in time.
        netlink: Some(NetlinkConntrack {
            timeout: Duration::ZERO,
        }),
        exec: ExecConntrack::new().with_prefix(vec![fake.display().to_string()]),
        warned: Arc::new(AtomicBool::new(false)),
    };
    assert!(!ct.fell_back_once());
    let want = vec![FlowEntry {
        orig_dst: ip("10.96.0.10"),
        orig_dst_port: 53,
        reply_src: ip("10.244.0.9"),
    }];
    assert_eq!(ct.list_udp(IpFamily::V4).await.unwrap(), want);
    assert!(ct.fell_back_once());
    assert_eq!(ct.list_udp(IpFamily::V4).await.unwrap(), want);

    // Through a command prefix there is no netlink at all: the binary only.
    assert!(
        NodeConntrack::for_prefix(&["ip".into(), "netns".into()])
            .netlink
            .is_none()
    );
    assert!(NodeConntrack::for_prefix(&[]).netlink.is_some());
}

// ---- real kernel, inside a network namespace this test creates ----

const IN_NETNS: &str = "PROXY_CTNETLINK_TEST_IN_NETNS";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn my_netns() -> String {
    std::fs::read_link("/proc/self/ns/net")
        .unwrap()
        .display()
        .to_string()
}

/// Runs the ignored test `name` in a child under `unshare -n`; returns its stdout.
fn in_new_netns(name: &str) -> Option<String> {
    if !is_root() {
        println!("SKIPPED: needs root to create a network namespace");
        return None;
    }
    if Command::new("conntrack").arg("--version").output().is_err() {
        println!("SKIPPED: the conntrack binary (conntrack-tools) is not installed");
        return None;
    }
    let out = Command::new("timeout")
        .args(["300", "unshare", "-n"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--ignored", "--nocapture"])
        .env(IN_NETNS, my_netns())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
    Some(stdout)
}

/// Asserts this process runs in a namespace other than its parent's.
fn guard() {
    let parent = std::env::var(IN_NETNS).expect("started by in_new_netns");
    assert_ne!(my_netns(), parent, "not in a new network namespace");
}

/// `conntrack -I` of a UDP flow `client:sport → dst:dport` answered by `reply_src`.
fn insert(client: &str, sport: u16, dst: &str, dport: u16, reply_src: &str) {
    let out = Command::new("timeout")
        .args(["10", "conntrack", "-I", "-p", "udp", "-t", "120"])
        .args(["-s", client, "-d", dst, "-r", reply_src, "-q", client])
        .args(["--sport", &sport.to_string(), "--dport", &dport.to_string()])
        .args(["--reply-port-src", &dport.to_string()])
        .args(["--reply-port-dst", &sport.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn ctnetlink_deletes_udp_flows_by_destination_in_a_netns() {
    if let Some(out) = in_new_netns("ctnetlink::tests::in_netns_delete_by_destination") {
        assert!(out.contains("NETNS-CHECKED"), "{out}");
    }
}

#[tokio::test]
#[ignore = "run by ctnetlink_deletes_udp_flows_by_destination_in_a_netns inside unshare -n"]
async fn in_netns_delete_by_destination() {
    guard();
    println!("NETNS-CHECKED");
    insert("10.0.0.1", 40000, "10.96.0.10", 53, "10.244.0.9"); // stale: endpoint removed
    insert("10.0.0.2", 40000, "10.96.0.10", 53, "10.244.0.9"); // stale too
    insert("10.0.0.1", 40001, "10.96.0.10", 53, "10.244.0.5"); // answered by a live endpoint
    insert("10.0.0.1", 40002, "10.96.0.11", 53, "10.244.0.9"); // another service
    let ct = NetlinkConntrack::new();
    let before = ct.list_udp(IpFamily::V4).await.unwrap();
    assert_eq!(before.len(), 4, "{before:?}");

    // The proxier's cleanup: service 10.96.0.10:53 is now served by 10.244.0.5 only.
    let target = UdpTarget {
        ips: vec![ip("10.96.0.10")],
        port: 53,
        node_port: 0,
        serving: [ip("10.244.0.5")].into(),
    };
    let node = NodeConntrack::for_prefix(&[]);
    assert_eq!(clean_stale_entries(&node, IpFamily::V4, &[target]).await, 2);
    let mut after = ct.list_udp(IpFamily::V4).await.unwrap();
    after.sort();
    let e = |d: &str, r: &str| FlowEntry {
        orig_dst: ip(d),
        orig_dst_port: 53,
        reply_src: ip(r),
    };
    assert_eq!(
        after,
        vec![e("10.96.0.10", "10.244.0.5"), e("10.96.0.11", "10.244.0.9")]
    );
    // The binary agrees: the kernel's table, not a cache.
    let listed = Command::new("conntrack")
        .args(["-L", "-p", "udp"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(text.lines().count(), 2, "{text}");
    // Deleting what is gone deletes nothing and is no error.
    let f = Filter {
        orig_dst: Some(ip("10.96.0.10")),
        orig_dst_port: 53,
        reply_src: ip("10.244.0.9"),
    };
    assert_eq!(ct.delete_udp(IpFamily::V4, &f).await.unwrap(), 0);

    // IPv6: the 16-byte address attributes, and the family keeps the v4 flows apart.
    insert("fd00::1", 40000, "fd00:96::10", 53, "fd00:244::9");
    insert("fd00::1", 40001, "fd00:96::10", 53, "fd00:244::5");
    let f6 = Filter {
        orig_dst: Some(ip("fd00:96::10")),
        orig_dst_port: 53,
        reply_src: ip("fd00:244::9"),
    };
    assert_eq!(ct.delete_udp(IpFamily::V6, &f6).await.unwrap(), 1);
    let left = ct.list_udp(IpFamily::V6).await.unwrap();
    assert_eq!(
        left,
        vec![FlowEntry {
            orig_dst: ip("fd00:96::10"),
            orig_dst_port: 53,
            reply_src: ip("fd00:244::5")
        }]
    );
    assert_eq!(ct.list_udp(IpFamily::V4).await.unwrap().len(), 2);
}

/// 1,000 stale UDP flows, each to its own service (so one filter each): the proxier's
/// cleanup over ctnetlink next to the `conntrack` binary, in one run.
#[test]
#[ignore = "benchmark: cargo test -p proxy --lib bench_conntrack_cleanup -- --ignored --nocapture"]
fn bench_conntrack_cleanup_netlink_vs_binary() {
    if let Some(out) = in_new_netns("ctnetlink::tests::in_netns_bench_cleanup") {
        for l in out.lines().filter(|l| l.starts_with("BENCH")) {
            println!("{l}");
        }
    }
}

const FLOWS: usize = 1000;

fn bench_targets() -> Vec<UdpTarget> {
    (0..FLOWS)
        .map(|i| UdpTarget {
            ips: vec![ip(&format!("10.96.{}.{}", i / 250, i % 250 + 1))],
            port: 53,
            node_port: 0,
            serving: [ip("10.244.0.5")].into(),
        })
        .collect()
}

fn insert_bench_flows() {
    // Distinct client ports: the kernel refuses two flows with one reply tuple.
    for (i, t) in bench_targets().iter().enumerate() {
        insert(
            "10.0.0.1",
            20000 + i as u16,
            &t.ips[0].to_string(),
            53,
            "10.244.0.9",
        );
    }
}

#[tokio::test]
#[ignore = "run by bench_conntrack_cleanup_netlink_vs_binary inside unshare -n"]
async fn in_netns_bench_cleanup() {
    guard();
    let targets = bench_targets();
    let netlink = NodeConntrack::for_prefix(&[]);
    let binary = ExecConntrack::new();

    insert_bench_flows();
    let t = Instant::now();
    let n = clean_stale_entries(&netlink, IpFamily::V4, &targets).await;
    let nl = t.elapsed();
    assert_eq!(n, FLOWS);

    insert_bench_flows();
    let t = Instant::now();
    let m = clean_stale_entries(&binary, IpFamily::V4, &targets).await;
    let bin = t.elapsed();
    assert_eq!(m, FLOWS);

    println!(
        "BENCH conntrack cleanup of {FLOWS} stale UDP flows ({FLOWS} filters): netlink {:.1} ms, conntrack binary {:.1} ms, binary/netlink {:.1}x",
        nl.as_secs_f64() * 1e3,
        bin.as_secs_f64() * 1e3,
        bin.as_secs_f64() / nl.as_secs_f64()
    );
}
