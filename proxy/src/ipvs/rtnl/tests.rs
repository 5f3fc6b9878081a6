//! The dummy interface's requests (built, and as they go on the wire) and each operation's
//! logic (as `kernel::route_op` runs it) against [`FakeLinks`]. The real side needs the `dummy` module (and `ip_vs` for the
//! proxier around it): `tests/netns_ipvs.rs`, skipped where the kernel lacks them.

use std::net::IpAddr;

use plumbing::rtnl::RtnlError;
use plumbing::rtnl::rtnetlink::packet_core::{Emitable, Parseable};
use plumbing::rtnl::rtnetlink::packet_route::address::AddressMessage;

use super::fake::{Call, FakeLinks, Request};
use super::*;
use crate::ipvs::kernel::{Answer, Op, route_op as run};
use crate::netlink::{EADDRNOTAVAIL, EEXIST, ENODEV};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn bytes(m: &impl Emitable) -> Vec<u8> {
    let mut b = vec![0; m.buffer_len()];
    m.emit(&mut b);
    b
}

fn listed(index: u32, s: &str) -> AddressMessage {
    address(index, ip(s))
}

/// The bodies the kernel gets carry what the hand-encoded messages this replaced sent
/// (`ip link add kube-ipvs0 type dummy`, `ip addr add 10.96.0.10/32 dev <7>`), attribute for
/// attribute (the address's two attributes now in the other order).
#[cfg(target_endian = "little")]
#[test]
fn requests_on_the_wire() {
    let mut want = vec![
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // ifinfomsg: all zero
        15, 0, 3, 0, // IFLA_IFNAME
    ];
    want.extend_from_slice(b"kube-ipvs0\0\0");
    // IFLA_LINKINFO { IFLA_INFO_KIND. The hand-encoded message set NLA_F_NESTED on
    // IFLA_LINKINFO (as iproute2 does); netlink-packet-route does not, and the kernel parses
    // IFLA_LINKINFO with or without it (nla_parse_nested_deprecated).
    want.extend_from_slice(&[16, 0, 18, 0, 10, 0, 1, 0]);
    want.extend_from_slice(b"dummy\0\0\0");
    let got = bytes(&dummy_link(DUMMY_DEVICE));
    assert_eq!(got, want);

    let got = bytes(&address(7, ip("10.96.0.10")));
    let want = vec![
        2, 32, 0, 0, 7, 0, 0, 0, // ifaddrmsg: AF_INET /32, index 7
        8, 0, 1, 0, 10, 96, 0, 10, // IFA_ADDRESS
        8, 0, 2, 0, 10, 96, 0, 10, // IFA_LOCAL
    ];
    assert_eq!(got, want);
    let got = bytes(&address(7, ip("fd00::a")));
    assert_eq!(&got[..8], &[10, 128, 0, 0, 7, 0, 0, 0], "AF_INET6 /128");
    assert_eq!(got.len(), 8 + 2 * 20);

    // A dump answer: index and address back.
    let body = [
        10, 128, 0, 0, 9, 0, 0, 0, 20, 0, 1, 0, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
    ];
    let m = AddressMessage::parse(&body[..]).unwrap();
    assert_eq!(listed_address(&m), Some((9, ip("fd00::1"))));
}

#[test]
fn a_listed_address_is_its_local_one() {
    let mut m = address(3, ip("10.0.0.1"));
    m.attributes = vec![
        AddressAttribute::Address(ip("10.0.0.2")),
        AddressAttribute::Local(ip("10.0.0.1")),
    ];
    assert_eq!(listed_address(&m), Some((3, ip("10.0.0.1"))), "local wins");
    m.attributes = vec![AddressAttribute::Address(ip("10.0.0.2"))];
    assert_eq!(listed_address(&m), Some((3, ip("10.0.0.2"))));
    m.attributes.clear();
    assert_eq!(listed_address(&m), None);
}

#[tokio::test]
async fn ensure_dummy_creates_it_once() {
    let links = FakeLinks::new();
    assert_eq!(run(&links, &Op::EnsureDummy).await.unwrap(), Answer::Done);
    let calls = links.calls();
    assert_eq!(
        calls,
        [
            Call::LinkIndex(DUMMY_DEVICE.into()),
            Call::AddLink(dummy_link(DUMMY_DEVICE))
        ]
    );
    assert_eq!(run(&links, &Op::EnsureDummy).await.unwrap(), Answer::Done);
    assert_eq!(
        links.calls(),
        [Call::LinkIndex(DUMMY_DEVICE.into())],
        "there already"
    );
}

#[tokio::test]
async fn ensure_dummy_races_and_missing_module() {
    // Made by someone else between the look and the add: fine.
    let links = FakeLinks::new();
    links.fail(Request::AddLink, EEXIST);
    assert_eq!(run(&links, &Op::EnsureDummy).await.unwrap(), Answer::Done);

    // No dummy module: a clear word on what to load.
    let links = FakeLinks::new();
    links.fail(Request::AddLink, EOPNOTSUPP);
    let e = run(&links, &Op::EnsureDummy).await.unwrap_err();
    assert!(e.to_string().contains("modprobe dummy"), "{e}");
    assert!(
        e.to_string()
            .starts_with("create dummy interface kube-ipvs0"),
        "{e}"
    );

    let links = FakeLinks::new();
    links.fail(Request::AddLink, 1);
    let e = run(&links, &Op::EnsureDummy).await.unwrap_err();
    assert_eq!(e.errno(), Some(1), "other refusals pass through: {e}");
}

#[tokio::test]
async fn addresses_of_the_dummy_and_of_the_node() {
    let links = FakeLinks::new()
        .with_link("eth0", 2)
        .with_link(DUMMY_DEVICE, 5)
        .with_listed(listed(2, "192.168.0.2"))
        .with_listed(listed(2, "fd00::2"))
        .with_listed(listed(1, "127.0.0.1"))
        .with_listed(listed(5, "10.96.0.10"))
        .with_listed(listed(5, "fd00:96::10"));
    let v4 = |s: &[&str]| Answer::Addrs(Some(s.iter().map(|a| ip(a)).collect()));
    assert_eq!(
        run(&links, &Op::DummyAddrs(IpFamily::V4)).await.unwrap(),
        v4(&["10.96.0.10"])
    );
    assert_eq!(
        run(&links, &Op::LocalAddrs(IpFamily::V4)).await.unwrap(),
        v4(&["127.0.0.1", "192.168.0.2"]),
        "every link's but kube-ipvs0's, of the family only"
    );
    assert_eq!(
        run(&links, &Op::DummyAddrs(IpFamily::V6)).await.unwrap(),
        v4(&["fd00:96::10"])
    );
    assert!(
        links.calls().contains(&Call::Addresses(IpFamily::V6)),
        "the dump asks for the family"
    );

    // No kube-ipvs0: nothing bound, and all addresses are the node's.
    let links = FakeLinks::new().with_listed(listed(2, "192.168.0.2"));
    assert_eq!(
        run(&links, &Op::DummyAddrs(IpFamily::V4)).await.unwrap(),
        Answer::Addrs(None)
    );
    assert_eq!(
        run(&links, &Op::LocalAddrs(IpFamily::V4)).await.unwrap(),
        v4(&["192.168.0.2"])
    );
}

#[tokio::test]
async fn bind_and_unbind_service_ips() {
    let links = FakeLinks::new().with_link(DUMMY_DEVICE, 5);
    for s in ["10.96.0.10", "fd00:96::10"] {
        let op = Op::AddAddr(ip(s));
        assert_eq!(run(&links, &op).await.unwrap(), Answer::Done);
        // Bound already (a restart): fine.
        assert_eq!(run(&links, &op).await.unwrap(), Answer::Done);
    }
    assert_eq!(links.addresses_on(5), [ip("10.96.0.10"), ip("fd00:96::10")]);
    let calls = links.calls();
    assert!(calls.contains(&Call::AddAddress(address(5, ip("fd00:96::10")))));

    let op = Op::DelAddr(ip("10.96.0.10"));
    assert_eq!(run(&links, &op).await.unwrap(), Answer::Done);
    // Gone already: fine.
    assert_eq!(run(&links, &op).await.unwrap(), Answer::Done);
    assert_eq!(links.addresses_on(5), [ip("fd00:96::10")]);

    // Other refusals are errors, each naming what it did.
    links.fail(Request::AddAddress, EADDRNOTAVAIL);
    let e = run(&links, &Op::AddAddr(ip("10.96.0.11")))
        .await
        .unwrap_err();
    assert!(
        e.to_string().starts_with("bind 10.96.0.11 to kube-ipvs0"),
        "{e}"
    );
    links.fail(Request::DeleteAddress, EEXIST);
    assert!(run(&links, &Op::DelAddr(ip("fd00:96::10"))).await.is_err());

    // Without kube-ipvs0 there is nothing to bind to.
    let links = FakeLinks::new();
    let e = run(&links, &Op::AddAddr(ip("10.96.0.10")))
        .await
        .unwrap_err();
    assert_eq!(e.errno(), Some(ENODEV), "{e}");
}

#[tokio::test]
async fn delete_dummy_says_whether_it_existed() {
    let links = FakeLinks::new()
        .with_link("eth0", 2)
        .with_link(DUMMY_DEVICE, 5)
        .with_listed(listed(5, "10.96.0.10"));
    assert_eq!(
        run(&links, &Op::DeleteDummy).await.unwrap(),
        Answer::Existed(true)
    );
    assert!(links.calls().contains(&Call::DeleteLink(5)), "by its index");
    assert_eq!(
        run(&links, &Op::DeleteDummy).await.unwrap(),
        Answer::Existed(false)
    );
    assert!(links.addresses_on(5).is_empty());
}

#[tokio::test]
async fn an_ipvs_operation_is_refused_here() {
    let links = FakeLinks::new();
    assert!(run(&links, &Op::ListServices).await.is_err());
    assert!(links.calls().is_empty());
}

#[test]
fn wrapper_errors_keep_errno_and_timeouts_reopen() {
    let e = nl_error(
        "x",
        RtnlError::TimedOut {
            after: std::time::Duration::from_secs(10),
        },
    );
    assert!(matches!(e, NlError::Io { .. }), "{e:?}");
    assert!(e.to_string().starts_with("x: "), "{e}");
}
