//! The kubelet's iptables chains through proxy's fake runner, and (root only, in a network
//! namespace this test creates) through the real binaries.

use std::time::Duration;

use plumbing::cidr::IpFamily;
use plumbing::iptables::fake::{Call, FakeRunner};
use plumbing::iptables::{ExecRunner, IptablesRunner, Position, TableName};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::*;

/// A fake where iptables works (nat POSTROUTING lists), calls cleared.
async fn working(family: IpFamily) -> FakeRunner {
    let f = FakeRunner::new(family);
    f.ensure_chain(TableName::Nat, "POSTROUTING").await.unwrap();
    f.clear_calls();
    f
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[tokio::test]
async fn ipv4_gets_the_hint_chain_and_the_localnet_firewall_as_upstream() {
    let f = working(IpFamily::V4).await;
    assert!(sync_rules(&f).await);
    assert_eq!(
        f.calls(),
        vec![
            Call::EnsureChain(TableName::Mangle, "KUBE-IPTABLES-HINT".into()),
            Call::EnsureChain(TableName::Filter, "KUBE-FIREWALL".into()),
            Call::EnsureRule(
                Position::Prepend,
                TableName::Filter,
                "OUTPUT".into(),
                s(&["-j", "KUBE-FIREWALL"])
            ),
            Call::EnsureRule(
                Position::Prepend,
                TableName::Filter,
                "INPUT".into(),
                s(&["-j", "KUBE-FIREWALL"])
            ),
            Call::EnsureRule(
                Position::Append,
                TableName::Filter,
                "KUBE-FIREWALL".into(),
                s(&[
                    "-m",
                    "comment",
                    "--comment",
                    "block incoming localnet connections",
                    "--dst",
                    "127.0.0.0/8",
                    "!",
                    "--src",
                    "127.0.0.0/8",
                    "-m",
                    "conntrack",
                    "!",
                    "--ctstate",
                    "RELATED,ESTABLISHED,DNAT",
                    "-j",
                    "DROP"
                ])
            ),
        ]
    );
}

#[tokio::test]
async fn ipv6_gets_only_the_hint_chain() {
    let f = working(IpFamily::V6).await;
    assert!(sync_rules(&f).await);
    assert_eq!(
        f.calls(),
        vec![Call::EnsureChain(
            TableName::Mangle,
            "KUBE-IPTABLES-HINT".into()
        )]
    );
}

#[tokio::test]
async fn a_family_without_iptables_is_left_alone() {
    let missing = FakeRunner::new(IpFamily::V6);
    let ok = working(IpFamily::V4).await;
    let cancel = CancellationToken::new();
    let mut tasks = JoinSet::new();
    start(
        vec![ok.clone(), missing.clone()],
        MONITOR_INTERVAL,
        &mut tasks,
        &cancel,
    )
    .await;
    assert!(
        missing
            .calls()
            .iter()
            .all(|c| matches!(c, Call::ChainExists(..))),
        "only probed: {:?}",
        missing.calls()
    );
    assert!(
        ok.chain_exists(TableName::Mangle, HINT_CHAIN)
            .await
            .unwrap()
    );
    assert_eq!(tasks.len(), 1, "one monitor, for the working family");
    cancel.cancel();
    while tasks.join_next().await.is_some() {}
}

#[tokio::test(start_paused = true)]
async fn a_flush_is_noticed_by_the_canary_and_the_chains_come_back() {
    let f = working(IpFamily::V4).await;
    let cancel = CancellationToken::new();
    let mut tasks = JoinSet::new();
    start(vec![f.clone()], MONITOR_INTERVAL, &mut tasks, &cancel).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for t in CANARY_TABLES {
        assert!(f.chain_exists(t, CANARY_CHAIN).await.unwrap(), "{t:?}");
    }
    // Someone flushes every table.
    for t in CANARY_TABLES {
        f.remove_chain(t, CANARY_CHAIN);
    }
    f.remove_chain(TableName::Mangle, HINT_CHAIN);
    f.remove_chain(TableName::Filter, FIREWALL_CHAIN);
    assert!(!f.chain_exists(TableName::Mangle, HINT_CHAIN).await.unwrap());
    // Within one interval (plus the flush poll) everything is back.
    tokio::time::sleep(MONITOR_INTERVAL + Duration::from_secs(1)).await;
    assert!(f.chain_exists(TableName::Mangle, HINT_CHAIN).await.unwrap());
    assert!(
        f.chain_exists(TableName::Filter, FIREWALL_CHAIN)
            .await
            .unwrap()
    );
    for t in CANARY_TABLES {
        assert!(f.chain_exists(t, CANARY_CHAIN).await.unwrap(), "{t:?}");
    }
    cancel.cancel();
    while tasks.join_next().await.is_some() {}
}

#[tokio::test(start_paused = true)]
async fn the_canary_left_in_place_means_no_resync() {
    let f = working(IpFamily::V6).await;
    let cancel = CancellationToken::new();
    let mut tasks = JoinSet::new();
    start(vec![f.clone()], MONITOR_INTERVAL, &mut tasks, &cancel).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    f.clear_calls();
    tokio::time::sleep(MONITOR_INTERVAL * 3).await;
    let calls = f.calls();
    assert!(
        calls
            .iter()
            .all(|c| *c == Call::ChainExists(TableName::Mangle, CANARY_CHAIN.into())),
        "{calls:?}"
    );
    assert_eq!(calls.len(), 3, "one check a minute");
    cancel.cancel();
    while tasks.join_next().await.is_some() {}
}

fn save(cmd: &str) -> String {
    let out = std::process::Command::new(cmd).output().expect(cmd);
    assert!(out.status.success(), "{cmd}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn sh(script: &str) {
    let out = std::process::Command::new("sh")
        .args(["-c", script])
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The real binaries, in a namespace of this test's own: both families get the hint chain
/// and the canaries, IPv4 the localnet rule; a flush brings them back on the next check.
#[test]
fn real_iptables_in_a_fresh_netns_get_the_chains_and_they_survive_a_flush() {
    node_tests::netns::in_new_netns("kubelet iptables chains", "ip link set lo up", || async {
        let interval = Duration::from_millis(300);
        let runners = vec![ExecRunner::new(IpFamily::V4), ExecRunner::new(IpFamily::V6)];
        let cancel = CancellationToken::new();
        let mut tasks = JoinSet::new();
        start(runners, interval, &mut tasks, &cancel).await;
        let check = |what: &str| {
            let v4 = save("iptables-save");
            let v6 = save("ip6tables-save");
            for (family, text) in [("v4", &v4), ("v6", &v6)] {
                assert!(
                    text.contains("*mangle") && text.contains(":KUBE-IPTABLES-HINT - [0:0]"),
                    "{what} {family}: {text}"
                );
                assert_eq!(
                    text.matches(":KUBE-KUBELET-CANARY - [0:0]").count(),
                    3,
                    "{what} {family}: a canary in mangle, nat and filter: {text}"
                );
            }
            assert!(v4.contains("-A INPUT -j KUBE-FIREWALL"), "{what}: {v4}");
            assert!(v4.contains("-A OUTPUT -j KUBE-FIREWALL"), "{what}: {v4}");
            assert!(
                v4.contains(
                    "-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"
                ),
                "{what}: {v4}"
            );
            assert!(!v6.contains("KUBE-FIREWALL"), "{what}: {v6}");
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        check("at start");
        // A flush of every table of both families, as `iptables -F; iptables -X` scripts do.
        sh(
            "for c in iptables ip6tables; do for t in mangle nat filter; do \
            $c -t $t -F && $c -t $t -X; done; done",
        );
        assert!(!save("iptables-save").contains("KUBE-IPTABLES-HINT"));
        tokio::time::sleep(Duration::from_secs(2)).await;
        check("after a flush");
        cancel.cancel();
        while tasks.join_next().await.is_some() {}
    });
}
