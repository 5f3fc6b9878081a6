//! IPVS generic netlink messages, byte for byte (checked by hand against linux/ip_vs.h and
//! linux/genetlink.h: nlmsghdr, genlmsghdr, attributes in host order, ports big-endian).

use super::*;

const FAM: u16 = 36;

fn vs_key() -> VsKey {
    VsKey {
        addr: "10.96.0.10".parse().unwrap(),
        protocol: Protocol::Udp,
        port: 53,
    }
}

/// The nested IPVS_CMD_ATTR_SERVICE with only the identity (36 bytes).
const SERVICE_ID: [u8; 36] = [
    36, 0, 0x01, 0x80, // IPVS_CMD_ATTR_SERVICE | NLA_F_NESTED
    6, 0, 1, 0, 2, 0, 0, 0, // AF: AF_INET (padded)
    6, 0, 2, 0, 17, 0, 0, 0, // PROTOCOL: udp
    8, 0, 3, 0, 10, 96, 0, 10, // ADDR
    6, 0, 4, 0, 0, 53, 0, 0, // PORT 53, big-endian
];

fn hdr(len: u8, ty: u16, flags: u16, seq: u8, cmd: u8, version: u8) -> Vec<u8> {
    let mut h = vec![len, 0, 0, 0];
    h.extend_from_slice(&ty.to_le_bytes());
    h.extend_from_slice(&flags.to_le_bytes());
    h.extend_from_slice(&[seq, 0, 0, 0, 0, 0, 0, 0, cmd, version, 0, 0]);
    h
}

#[cfg(target_endian = "little")]
#[test]
fn family_resolve_request_and_answer() {
    let mut want = hdr(32, 0x10, 0x1, 1, 3, 1);
    want.extend_from_slice(&[9, 0, 2, 0, b'I', b'P', b'V', b'S', 0, 0, 0, 0]);
    assert_eq!(get_family_request("IPVS", 1), want);

    // CTRL_CMD_NEWFAMILY: genl header, FAMILY_NAME, FAMILY_ID.
    let answer = [
        1, 2, 0, 0, 9, 0, 2, 0, b'I', b'P', b'V', b'S', 0, 0, 0, 0, 6, 0, 1, 0, 36, 0, 0, 0,
    ];
    assert_eq!(parse_family_id(&answer), Some(36));
    assert_eq!(parse_family_id(&answer[..16]), None);
}

#[cfg(target_endian = "little")]
#[test]
fn add_service_is_byte_exact() {
    let vs = VirtualServer {
        key: vs_key(),
        scheduler: "rr".into(),
        flags: 0,
        timeout: 0,
    };
    let mut want = hdr(92, FAM, 0x5, 5, 1, 1);
    want.extend_from_slice(&[72, 0, 0x01, 0x80]);
    want.extend_from_slice(&SERVICE_ID[4..]);
    want.extend_from_slice(&[
        7, 0, 6, 0, b'r', b'r', 0, 0, // SCHED_NAME "rr\0"
        12, 0, 7, 0, 0, 0, 0, 0, 255, 255, 255, 255, // FLAGS {0, mask all}
        8, 0, 8, 0, 0, 0, 0, 0, // TIMEOUT 0
        8, 0, 9, 0, 255, 255, 255, 255, // NETMASK /32
    ]);
    assert_eq!(new_service(FAM, &vs, 5), want);

    // SET_SERVICE is the same message with command 2; affinity sets the persistent flag
    // and the timeout.
    let sticky = VirtualServer {
        flags: FLAG_PERSISTENT,
        timeout: 10800,
        ..vs
    };
    let m = set_service(FAM, &sticky, 5);
    assert_eq!(m[16], 2);
    assert_eq!(&m[64..76], &[12, 0, 7, 0, 1, 0, 0, 0, 255, 255, 255, 255]);
    assert_eq!(&m[76..84], &[8, 0, 8, 0, 0x30, 0x2a, 0, 0], "10800 s");
}

#[cfg(target_endian = "little")]
#[test]
fn delete_service_names_only_the_identity() {
    let mut want = hdr(56, FAM, 0x5, 6, 3, 1);
    want.extend_from_slice(&SERVICE_ID);
    assert_eq!(del_service(FAM, &vs_key(), 6), want);
}

#[cfg(target_endian = "little")]
#[test]
fn ipv6_service_has_a_16_byte_address_and_netmask_128() {
    let vs = VirtualServer {
        key: VsKey {
            addr: "fd00::a".parse().unwrap(),
            protocol: Protocol::Tcp,
            port: 443,
        },
        scheduler: "lc".into(),
        flags: 0,
        timeout: 0,
    };
    let m = new_service(FAM, &vs, 1);
    assert_eq!(&m[24..32], &[6, 0, 1, 0, 10, 0, 0, 0], "AF_INET6");
    assert_eq!(&m[32..40], &[6, 0, 2, 0, 6, 0, 0, 0], "tcp");
    let mut addr = vec![20, 0, 3, 0, 0xfd];
    addr.extend_from_slice(&[0; 14]);
    addr.push(0x0a);
    assert_eq!(&m[40..60], &addr[..]);
    assert_eq!(&m[60..68], &[6, 0, 4, 0, 0x01, 0xbb, 0, 0], "443");
    assert_eq!(&m[m.len() - 8..], &[8, 0, 9, 0, 128, 0, 0, 0]);
}

#[cfg(target_endian = "little")]
#[test]
fn dest_add_set_delete_are_byte_exact() {
    let rs = RealServer::new("10.244.1.5".parse().unwrap(), 5353, 1);
    let dest = [
        60, 0, 0x02, 0x80, // IPVS_CMD_ATTR_DEST | NLA_F_NESTED
        8, 0, 1, 0, 10, 244, 1, 5, // ADDR
        6, 0, 2, 0, 0x14, 0xe9, 0, 0, // PORT 5353
        8, 0, 3, 0, 0, 0, 0, 0, // FWD_METHOD masq
        8, 0, 4, 0, 1, 0, 0, 0, // WEIGHT 1
        8, 0, 5, 0, 0, 0, 0, 0, // U_THRESH
        8, 0, 6, 0, 0, 0, 0, 0, // L_THRESH
        6, 0, 11, 0, 2, 0, 0, 0, // ADDR_FAMILY AF_INET
    ];
    let mut want = hdr(116, FAM, 0x5, 7, 5, 1);
    want.extend_from_slice(&SERVICE_ID);
    want.extend_from_slice(&dest);
    assert_eq!(new_dest(FAM, &vs_key(), &rs, 7), want);

    // Draining: SET_DEST with weight 0.
    let m = set_dest(FAM, &vs_key(), &RealServer { weight: 0, ..rs }, 7);
    assert_eq!(m[16], 6);
    assert_eq!(&m[84..92], &[8, 0, 4, 0, 0, 0, 0, 0]);

    let mut want = hdr(84, FAM, 0x5, 8, 7, 1);
    want.extend_from_slice(&SERVICE_ID);
    want.extend_from_slice(&[
        28, 0, 0x02, 0x80, 8, 0, 1, 0, 10, 244, 1, 5, 6, 0, 2, 0, 0x14, 0xe9, 0, 0, 6, 0, 11, 0, 2,
        0, 0, 0,
    ]);
    assert_eq!(del_dest(FAM, &vs_key(), &rs, 8), want);
}

#[cfg(target_endian = "little")]
#[test]
fn set_config_and_dumps_are_byte_exact() {
    let mut want = hdr(44, FAM, 0x5, 9, 12, 1);
    want.extend_from_slice(&[
        8, 0, 4, 0, 0x84, 0x03, 0, 0, // TIMEOUT_TCP 900
        8, 0, 5, 0, 120, 0, 0, 0, // TIMEOUT_TCP_FIN 120
        8, 0, 6, 0, 0x2c, 0x01, 0, 0, // TIMEOUT_UDP 300
    ]);
    assert_eq!(set_config(FAM, 900, 120, 300, 9), want);

    assert_eq!(get_services(FAM, 2), hdr(20, FAM, 0x301, 2, 4, 1));
    let mut want = hdr(56, FAM, 0x301, 3, 8, 1);
    want.extend_from_slice(&SERVICE_ID);
    assert_eq!(get_dests(FAM, &vs_key(), 3), want);
}

#[cfg(target_endian = "little")]
#[test]
fn parses_what_the_kernel_dumps() {
    // A GET_SERVICE answer: the kernel sends the address as 16 bytes and adds stats.
    let mut body = vec![4, 1, 0, 0];
    let mut svc = Vec::new();
    svc.extend_from_slice(&[6, 0, 1, 0, 2, 0, 0, 0]);
    svc.extend_from_slice(&[6, 0, 2, 0, 6, 0, 0, 0]);
    svc.extend_from_slice(&[20, 0, 3, 0, 172, 30, 0, 41]);
    svc.extend_from_slice(&[0; 12]);
    svc.extend_from_slice(&[6, 0, 4, 0, 0, 80, 0, 0]);
    svc.extend_from_slice(&[7, 0, 6, 0, b's', b'h', 0, 0]);
    svc.extend_from_slice(&[12, 0, 7, 0, 3, 0, 0, 0, 255, 255, 255, 255]);
    svc.extend_from_slice(&[8, 0, 8, 0, 0x58, 0x02, 0, 0]);
    svc.extend_from_slice(&[8, 0, 10, 0x80, 0, 0, 0, 0]); // STATS (nested, ignored)
    body.extend_from_slice(&((svc.len() + 4) as u16).to_le_bytes());
    body.extend_from_slice(&[1, 0x80]);
    body.extend_from_slice(&svc);
    let vs = parse_service(&body).unwrap();
    assert_eq!(vs.key.addr, "172.30.0.41".parse::<IpAddr>().unwrap());
    assert_eq!((vs.key.protocol, vs.key.port), (Protocol::Tcp, 80));
    assert_eq!(
        (vs.scheduler.as_str(), vs.flags, vs.timeout),
        ("sh", 3, 600)
    );
    let want = VirtualServer {
        flags: FLAG_PERSISTENT,
        ..vs.clone()
    };
    assert!(
        !want.differs(&vs),
        "the kernel's HASHED flag is not a difference"
    );

    // A GET_DEST answer with connection counts.
    let mut body = vec![8, 1, 0, 0];
    let mut d = Vec::new();
    d.extend_from_slice(&[20, 0, 1, 0, 10, 180, 0, 3]);
    d.extend_from_slice(&[0; 12]);
    d.extend_from_slice(&[6, 0, 2, 0, 0x1f, 0x90, 0, 0]);
    d.extend_from_slice(&[8, 0, 4, 0, 0, 0, 0, 0]);
    d.extend_from_slice(&[8, 0, 7, 0, 2, 0, 0, 0]);
    d.extend_from_slice(&[8, 0, 8, 0, 5, 0, 0, 0]);
    d.extend_from_slice(&[6, 0, 11, 0, 2, 0, 0, 0]);
    body.extend_from_slice(&((d.len() + 4) as u16).to_le_bytes());
    body.extend_from_slice(&[2, 0x80]);
    body.extend_from_slice(&d);
    let rs = parse_dest(&body).unwrap();
    assert_eq!(rs.addr, "10.180.0.3".parse::<IpAddr>().unwrap());
    assert_eq!(
        (rs.port, rs.weight, rs.active_conns, rs.inactive_conns),
        (8080, 0, 2, 5)
    );
}
