//! Property-based fuzzing of what kube-proxy turns into kernel rules: Services and
//! EndpointSlices with generated, often hostile, values go through `ServiceState` and the
//! renderer; the rendered `iptables-restore` text must stay well-formed whatever they hold.
//! Also the `--static-services-dir` parser and the KubeProxyConfiguration resolver.
//!
//! The property is always: no panic, no hang, and either `Ok` or an error; for the rules,
//! every line is one `iptables-restore` accepts and none carries anything the values could
//! have injected (see [`check_restore_text`]). Case counts keep each test to a few seconds in
//! a debug build; no failure files are written (`failure_persistence: None`).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config as ProptestConfig;
use proxy::iptables::render::{self, Rendered};
use proxy::model::{Cidr, IpFamily, SERVICE_NAME_LABEL, ServiceState};
use proxy::render_config::RenderConfig;

const NODE: &str = "node1";

// ---------------------------------------------------------------------------------------------
// Harness

fn cfg(n: u32) -> ProptestConfig {
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    }
}

const DEADLINE: Duration = Duration::from_secs(10);

/// Runs `f` on a thread with tokio's default worker stack (2 MiB) and fails if it does not
/// return within [`DEADLINE`]; a panic in `f` is re-raised.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let r = f();
            let _ = tx.send(());
            r
        })
        .expect("spawn");
    match rx.recv_timeout(DEADLINE) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: no answer within {DEADLINE:?}"),
    }
}

type Mutation = (u8, Index, u8);

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec((0u8..5, any::<Index>(), any::<u8>()), 1..8)
}

fn pick_byte(b: u8) -> u8 {
    const SPECIAL: &[u8] = b"{}[]:,-'\"\n \t#&*!|>%@`?\\0.9-e";
    if b < 128 {
        SPECIAL[b as usize % SPECIAL.len()]
    } else {
        b
    }
}

/// Byte-level mutation: insert, delete, replace, duplicate a span, truncate.
fn mutate(base: &str, muts: &[Mutation]) -> String {
    let mut b = base.as_bytes().to_vec();
    for (kind, at, byte) in muts {
        let pos = at.index(b.len() + 1);
        match kind {
            0 => b.insert(pos, pick_byte(*byte)),
            1 if pos < b.len() => {
                b.remove(pos);
            }
            2 if pos < b.len() => b[pos] = pick_byte(*byte),
            3 if pos < b.len() => {
                let end = (pos + 1 + *byte as usize).min(b.len());
                let span = b[pos..end].to_vec();
                b.splice(pos..pos, span);
            }
            4 => b.truncate(pos),
            _ => {}
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

fn hostile_text() -> impl Strategy<Value = String> {
    let token = prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        ": ",
        ", ",
        "- ",
        "\n",
        "  ",
        "'",
        "\"",
        "&a ",
        "*a ",
        "!!str ",
        "? ",
        "|",
        ">",
        "---\n",
        "...\n",
        "#",
        "<<: *a\n",
        "kind: Service\n",
        "kind: List\n",
        "items:\n",
        "kind: EndpointSlice\n",
        "\t",
        "~",
        "null",
        "1e999",
        "-.inf",
        ".nan",
        "apiVersion: v1\n",
        "metadata: {name: a}\n",
        "spec: {clusterIP: 10.0.0.1}\n",
    ]);
    prop_oneof![
        4 => any::<String>(),
        2 => "\\PC{0,400}",
        3 => prop::collection::vec(token, 0..200).prop_map(|v| v.concat()),
        1 => (
            prop::sample::select(vec!["[", "{", "- ", "{\"a\":", "a:\n ", "[{", "&a [", "items: ["]),
            1usize..16_384
        )
            .prop_map(|(open, n)| {
                let mut s = open.repeat(n);
                s.truncate(64 << 10);
                s
            }),
        1 => ("[ -~]", 1usize..65_536).prop_map(|(c, n)| c.repeat(n)),
    ]
}

// ---------------------------------------------------------------------------------------------
// Checking iptables-restore text

/// Targets and chains that exist without being declared in the text.
const BUILTIN_TARGETS: &[&str] = &[
    "ACCEPT",
    "DROP",
    "RETURN",
    "REJECT",
    "MARK",
    "MASQUERADE",
    "DNAT",
    "SNAT",
];

/// Every option the renderer writes; anything else on a rule line was injected.
const OPTIONS: &[&str] = &[
    "-m",
    "-p",
    "-d",
    "-s",
    "-j",
    "-i",
    "-o",
    "--comment",
    "--dport",
    "--ctstate",
    "--src-type",
    "--dst-type",
    "--mark",
    "--xor-mark",
    "--or-mark",
    "--set-xmark",
    "--to-destination",
    "--random-fully",
    "--set",
    "--rcheck",
    "--seconds",
    "--reap",
    "--name",
    "--mask",
    "--rsource",
    "--mode",
    "--probability",
    "--reject-with",
    "--limit-iface-in",
    "--limit-iface-out",
];

const MODULES: &[&str] = &[
    "comment",
    "tcp",
    "udp",
    "sctp",
    "conntrack",
    "addrtype",
    "mark",
    "recent",
    "statistic",
    "multiport",
];

/// Splits a rule's arguments like iptables-restore does: on spaces, `"…"` being one token.
/// None when a quote is not closed.
fn tokenize(args: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut in_token = false;
    for c in args.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                in_token = true;
            }
            ' ' if !quoted => {
                if in_token {
                    out.push(std::mem::take(&mut cur));
                    in_token = false;
                }
            }
            c => {
                cur.push(c);
                in_token = true;
            }
        }
    }
    if quoted {
        return None;
    }
    if in_token {
        out.push(cur);
    }
    Some(out)
}

fn valid_chain_name(c: &str) -> bool {
    !c.is_empty()
        && c.len() <= 28
        && c.bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-')
}

fn parses_as_ip_or_cidr(s: &str) -> bool {
    s.parse::<IpAddr>().is_ok()
        || s.split_once('/').is_some_and(|(a, p)| {
            a.parse::<IpAddr>().is_ok() && p.parse::<u8>().is_ok_and(|p| p <= 128)
        })
}

/// Checks one `iptables-restore` input. `known_chains`: chains that exist in the kernel
/// without being declared in this text (a delta's top-level chains).
fn check_restore_text(text: &str, known_chains: &BTreeSet<String>) {
    let mut table: Option<String> = None;
    let mut declared: BTreeSet<String> = BTreeSet::new();
    for (n, line) in text.split('\n').enumerate() {
        let ctx = || format!("line {} {line:?} of\n{text}", n + 1);
        assert!(!line.contains('\r') && !line.contains('\0'), "{}", ctx());
        if line.is_empty() {
            continue;
        }
        if let Some(t) = line.strip_prefix('*') {
            assert!(table.is_none(), "table inside a table: {}", ctx());
            assert!(matches!(t, "filter" | "nat" | "mangle"), "{}", ctx());
            table = Some(t.to_string());
            declared.clear();
            continue;
        }
        assert!(table.is_some(), "rule outside a table: {}", ctx());
        if line == "COMMIT" {
            table = None;
            continue;
        }
        if let Some(rest) = line.strip_prefix(':') {
            let chain = rest
                .strip_suffix(" - [0:0]")
                .unwrap_or_else(|| panic!("bad declaration: {}", ctx()));
            assert!(valid_chain_name(chain), "chain name: {}", ctx());
            declared.insert(chain.to_string());
            continue;
        }
        let (op, rest) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("unknown line: {}", ctx()));
        match op {
            "-X" => {
                assert!(valid_chain_name(rest), "{}", ctx());
                continue;
            }
            "-A" | "-I" | "-D" => {}
            _ => panic!("unknown line: {}", ctx()),
        }
        let quotes = line.matches('"').count();
        assert!(quotes % 2 == 0, "unbalanced quotes: {}", ctx());
        let toks = tokenize(rest).unwrap_or_else(|| panic!("unclosed quote: {}", ctx()));
        let chain = &toks[0];
        assert!(
            declared.contains(chain)
                || known_chains.contains(chain)
                || chain.starts_with("KUBE-") && valid_chain_name(chain),
            "rule for an unknown chain: {}",
            ctx()
        );
        let mut i = 1;
        // `-I CHAIN N` may carry a position.
        if op == "-I" && toks.get(1).is_some_and(|t| t.parse::<u32>().is_ok()) {
            i = 2;
        }
        while i < toks.len() {
            let t = toks[i].as_str();
            if t == "!" {
                i += 1;
                continue;
            }
            assert!(OPTIONS.contains(&t), "unknown option {t:?}: {}", ctx());
            let flag_only = matches!(
                t,
                "--random-fully" | "--set" | "--rcheck" | "--reap" | "--rsource"
            );
            if flag_only {
                i += 1;
                continue;
            }
            let v = toks
                .get(i + 1)
                .unwrap_or_else(|| panic!("{t} without a value: {}", ctx()))
                .as_str();
            match t {
                "-m" => assert!(MODULES.contains(&v), "module {v:?}: {}", ctx()),
                "-p" => assert!(matches!(v, "tcp" | "udp" | "sctp"), "{}", ctx()),
                "-d" | "-s" => assert!(parses_as_ip_or_cidr(v), "address {v:?}: {}", ctx()),
                "--dport" => assert!(
                    v.parse::<u16>().is_ok_and(|p| p > 0),
                    "port {v:?}: {}",
                    ctx()
                ),
                "--to-destination" => assert!(
                    v.parse::<SocketAddr>().is_ok_and(|a| a.port() > 0),
                    "destination {v:?}: {}",
                    ctx()
                ),
                "--probability" => {
                    let p: f64 = v
                        .parse()
                        .unwrap_or_else(|_| panic!("probability: {}", ctx()));
                    assert!(p > 0.0 && p <= 1.0, "probability {p}: {}", ctx());
                }
                "--seconds" => assert!(v.parse::<u32>().is_ok(), "{}", ctx()),
                "--comment" => assert!(
                    !v.contains('"') && !v.is_empty(),
                    "comment {v:?}: {}",
                    ctx()
                ),
                "-j" => assert!(
                    BUILTIN_TARGETS.contains(&v)
                        || declared.contains(v)
                        || known_chains.contains(v),
                    "jump to {v:?}, neither built in nor declared: {}",
                    ctx()
                ),
                _ => assert!(!v.starts_with('-'), "{t} {v:?}: {}", ctx()),
            }
            i += 2;
        }
    }
    assert!(table.is_none(), "missing COMMIT:\n{text}");
}

// ---------------------------------------------------------------------------------------------
// Generated Services and EndpointSlices

fn hostile_name() -> BoxedStrategy<String> {
    prop_oneof![
        4 => "[a-z]([-a-z0-9]{0,8}[a-z0-9])?",
        2 => prop::sample::select(vec![
            "", "a\"b", "a\nb", "a b", "-j ACCEPT", "x\" -j ACCEPT \"", "a\n-A KUBE-SERVICES -j ACCEPT",
            "A", "a.b", "a/b", "é", "-a", "a-", "$(x)", "a\tb", "a\rb", "a'b", "a;b",
            "kube-system",
        ])
        .prop_map(str::to_string),
        1 => "[a-z]{64,70}",
        1 => "\\PC{0,12}",
    ]
    .boxed()
}

fn hostile_port() -> BoxedStrategy<i32> {
    prop_oneof![
        12 => 1i32..=65535,
        1 => Just(0),
        1 => Just(-1),
        1 => Just(65536),
        1 => Just(i32::MIN),
        1 => Just(i32::MAX),
        1 => any::<i32>(),
    ]
    .boxed()
}

fn hostile_protocol() -> BoxedStrategy<Option<String>> {
    prop_oneof![
        4 => Just(None),
        6 => Just(Some("TCP".to_string())),
        1 => Just(Some("UDP".to_string())),
        1 => Just(Some("SCTP".to_string())),
        1 => prop::sample::select(vec!["tcp", "ICMP", "", "TCP -j ACCEPT", "TCP\n", "\"TCP\""])
            .prop_map(|s| Some(s.to_string())),
        1 => "\\PC{0,6}".prop_map(Some),
    ]
    .boxed()
}

fn hostile_ip() -> BoxedStrategy<String> {
    prop_oneof![
        4 => any::<Ipv4Addr>().prop_map(|ip| ip.to_string()),
        3 => any::<Ipv6Addr>().prop_map(|ip| ip.to_string()),
        2 => prop::sample::select(vec![
            "", "None", "1.2.3.4/24", "1.2.3.4 -j ACCEPT", " 10.0.0.1 ", "::ffff:1.2.3.4",
            "1.2.3", "999.1.1.1", "fe80::1%eth0", "10.0.0.1\n-A KUBE-SERVICES -j ACCEPT",
            "0.0.0.0", "::", "127.0.0.1", "255.255.255.255", "[::1]", "10.0.0.1:80", "\"10.0.0.1\"",
        ])
        .prop_map(str::to_string),
        1 => "\\PC{0,15}",
    ]
    .boxed()
}

fn hostile_cidr() -> BoxedStrategy<String> {
    prop_oneof![
        3 => (any::<Ipv4Addr>(), 0u8..=32).prop_map(|(ip, p)| format!("{ip}/{p}")),
        2 => (any::<Ipv6Addr>(), 0u8..=128).prop_map(|(ip, p)| format!("{ip}/{p}")),
        2 => prop::sample::select(vec![
            "10.0.0.0/33", "1.2.3.4/", "0.0.0.0/0", "::/0", "1.2.3.4/-1", "1.2.3.4/8 -j ACCEPT",
            "", " 10.0.0.0/8 ", "10.0.0.0/8\n",
        ])
        .prop_map(str::to_string),
        1 => hostile_ip(),
    ]
    .boxed()
}

fn pick<T: Clone + std::fmt::Debug + 'static>(
    common: T,
    hostile: BoxedStrategy<T>,
) -> BoxedStrategy<T> {
    prop_oneof![8 => Just(common), 1 => hostile].boxed()
}

prop_compose! {
    fn service_port()(
        name in prop::option::weighted(0.9, pick("p".to_string(), hostile_name())),
        protocol in hostile_protocol(),
        port in hostile_port(),
        node_port in prop::option::of(hostile_port()),
        target in prop::option::of(hostile_port()),
    ) -> serde_json::Value {
        let mut p = serde_json::json!({ "port": port });
        if let Some(n) = name { p["name"] = n.into(); }
        if let Some(pr) = protocol { p["protocol"] = pr.into(); }
        if let Some(np) = node_port { p["nodePort"] = np.into(); }
        if let Some(t) = target { p["targetPort"] = t.into(); }
        p
    }
}

prop_compose! {
    /// One Service: `svc` picks one of a few names so that slices and deletes meet it.
    fn service()(
        svc in prop_oneof![5 => Just(0usize), 1 => Just(1usize)],
        ns in pick("default".to_string(), hostile_name()),
        name in prop::option::weighted(0.1, hostile_name()),
        ty in prop::sample::select(vec![
            None, Some("ClusterIP"), Some("NodePort"), Some("LoadBalancer"), Some("ExternalName"),
            Some("Bogus"), Some(""),
        ]),
        cluster_ips in prop_oneof![
            6 => (0u8..4, any::<bool>()).prop_map(|(i, v6_first)| {
                let (a, b) = (format!("10.96.0.{}", 10 + i), format!("fd01::{:x}", 10 + i));
                if v6_first { vec![b, a] } else { vec![a, b] }
            }),
            1 => prop::collection::vec(hostile_ip(), 0..3),
        ],
        ports in prop::collection::vec(service_port(), 1..4),
        external_ips in prop::collection::vec(hostile_ip(), 0..3),
        ingress in prop::collection::vec(
            (hostile_ip(), prop::sample::select(vec![None, Some("VIP"), Some("Proxy"), Some("x")])),
            0..3,
        ),
        source_ranges in prop::collection::vec(hostile_cidr(), 0..3),
        affinity in prop::sample::select(vec![None, Some("ClientIP"), Some("None"), Some("clientip")]),
        timeout in prop::option::of(prop_oneof![1i32..86400, any::<i32>(), Just(0), Just(i32::MAX)]),
        etp in prop::sample::select(vec![None, Some("Local"), Some("Cluster"), Some("local")]),
        itp in prop::sample::select(vec![None, Some("Local"), Some("Cluster"), Some("x")]),
        hc_port in prop::option::of(hostile_port()),
    ) -> Service {
        let name = name.unwrap_or_else(|| format!("svc{svc}"));
        let mut spec = serde_json::json!({
            "ports": ports,
            "externalIPs": external_ips,
            "loadBalancerSourceRanges": source_ranges,
        });
        if let Some(first) = cluster_ips.first() {
            spec["clusterIP"] = first.clone().into();
            spec["clusterIPs"] = cluster_ips.clone().into();
        }
        if let Some(t) = ty { spec["type"] = t.into(); }
        if let Some(a) = affinity { spec["sessionAffinity"] = a.into(); }
        if let Some(t) = timeout {
            spec["sessionAffinityConfig"] = serde_json::json!({"clientIP": {"timeoutSeconds": t}});
        }
        if let Some(p) = etp { spec["externalTrafficPolicy"] = p.into(); }
        if let Some(p) = itp { spec["internalTrafficPolicy"] = p.into(); }
        if let Some(p) = hc_port { spec["healthCheckNodePort"] = p.into(); }
        let ingress: Vec<serde_json::Value> = ingress
            .into_iter()
            .map(|(ip, mode)| {
                let mut i = serde_json::json!({ "ip": ip });
                if let Some(m) = mode { i["ipMode"] = m.into(); }
                i
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": { "namespace": ns, "name": name },
            "spec": spec,
            "status": { "loadBalancer": { "ingress": ingress } },
        }))
        .expect("a Service")
    }
}

prop_compose! {
    fn endpoint()(
        addresses in prop_oneof![
            6 => (0u8..40).prop_map(|i| vec![format!("10.1.0.{}", i + 1), format!("fd00::{:x}", i + 1)]),
            1 => prop::collection::vec(hostile_ip(), 0..3),
        ],
        ready in prop::option::of(any::<bool>()),
        serving in prop::option::of(any::<bool>()),
        terminating in prop::option::of(any::<bool>()),
        node in prop::option::of(pick(NODE.to_string(), hostile_name())),
        zone in prop::option::of(pick("z1".to_string(), hostile_name())),
        zone_hints in prop::option::of(prop::collection::vec(pick("z1".to_string(), hostile_name()), 0..3)),
        node_hints in prop::option::of(prop::collection::vec(pick(NODE.to_string(), hostile_name()), 0..3)),
    ) -> serde_json::Value {
        let mut e = serde_json::json!({ "addresses": addresses });
        let mut cond = serde_json::Map::new();
        if let Some(v) = ready { cond.insert("ready".into(), v.into()); }
        if let Some(v) = serving { cond.insert("serving".into(), v.into()); }
        if let Some(v) = terminating { cond.insert("terminating".into(), v.into()); }
        e["conditions"] = cond.into();
        if let Some(n) = node { e["nodeName"] = n.into(); }
        if let Some(z) = zone { e["zone"] = z.into(); }
        if zone_hints.is_some() || node_hints.is_some() {
            let names = |v: Option<Vec<String>>| -> serde_json::Value {
                v.map(|v| v.into_iter().map(|n| serde_json::json!({"name": n})).collect::<Vec<_>>()).into()
            };
            e["hints"] = serde_json::json!({
                "forZones": names(zone_hints),
                "forNodes": names(node_hints),
            });
        }
        e
    }
}

prop_compose! {
    fn slice()(
        svc in prop_oneof![5 => Just(0usize), 1 => Just(1usize)],
        idx in 0usize..2,
        ns in pick("default".to_string(), hostile_name()),
        label in prop::option::weighted(0.1, hostile_name()),
        no_label in prop::bool::weighted(0.05),
        address_type in prop::sample::select(vec!["IPv4", "IPv4", "IPv4", "IPv6", "IPv6", "FQDN", "bogus"]),
        ports in prop::collection::vec(
            (
                prop::option::weighted(0.9, pick("p".to_string(), hostile_name())),
                hostile_protocol(),
                prop::option::of(prop_oneof![4 => Just(8080), 1 => hostile_port()]),
            ),
            1..3,
        ),
        endpoints in prop::collection::vec(endpoint(), 0..20),
        trigger in prop::option::of(prop::sample::select(vec![
            "2030-01-01T00:00:00Z", "1970-01-01T00:00:00Z", "garbage", "",
        ])),
    ) -> EndpointSlice {
        let svc_name = label.unwrap_or_else(|| format!("svc{svc}"));
        // Valid endpoints list both families; the slice's family goes first.
        let endpoints: Vec<serde_json::Value> = endpoints
            .into_iter()
            .map(|mut e| {
                if address_type == "IPv6"
                    && let Some(a) = e["addresses"].as_array_mut()
                {
                    a.reverse();
                }
                e
            })
            .collect();
        let ports: Vec<serde_json::Value> = ports
            .into_iter()
            .map(|(name, proto, port)| {
                let mut p = serde_json::Map::new();
                if let Some(n) = name { p.insert("name".into(), n.into()); }
                if let Some(pr) = proto { p.insert("protocol".into(), pr.into()); }
                if let Some(n) = port { p.insert("port".into(), n.into()); }
                p.into()
            })
            .collect();
        let mut meta = serde_json::json!({
            "namespace": ns,
            "name": format!("svc{svc}-{idx}"),
        });
        if !no_label {
            meta["labels"] = serde_json::json!({ SERVICE_NAME_LABEL: svc_name });
        }
        if let Some(t) = trigger {
            meta["annotations"] = serde_json::json!({ proxy::model::LAST_CHANGE_TRIGGER_TIME: t });
        }
        serde_json::from_value(serde_json::json!({
            "metadata": meta,
            "addressType": address_type,
            "ports": ports,
            "endpoints": endpoints,
        }))
        .expect("an EndpointSlice")
    }
}

#[derive(Clone, Debug)]
enum Op {
    UpsertService(Box<Service>),
    DeleteService(usize),
    UpsertSlice(Box<EndpointSlice>),
    DeleteSlice(Box<EndpointSlice>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => service().prop_map(|s| Op::UpsertService(Box::new(s))),
        1 => (0usize..2).prop_map(Op::DeleteService),
        5 => slice().prop_map(|s| Op::UpsertSlice(Box::new(s))),
        1 => slice().prop_map(|s| Op::DeleteSlice(Box::new(s))),
    ]
}

prop_compose! {
    fn render_config()(
        v6 in prop::bool::weighted(0.3),
        masquerade_bit in 0u8..=31,
        masquerade_all in any::<bool>(),
        cluster_cidr in any::<bool>(),
        node_ips in any::<bool>(),
        node_port_addresses in prop::collection::vec(
            prop_oneof![
                Just("primary".to_string()),
                Just("127.0.0.0/8".to_string()),
                Just("::1/128".to_string()),
                hostile_cidr(),
            ],
            0..3,
        ),
        localhost_node_ports in any::<bool>(),
        random_fully in any::<bool>(),
        conntrack_tcp_liberal in any::<bool>(),
        zone in prop::option::of(pick("z1".to_string(), hostile_name())),
    ) -> RenderConfig {
        let family = if v6 { IpFamily::V6 } else { IpFamily::V4 };
        let mut c = RenderConfig::new(family, NODE);
        c.masquerade_bit = masquerade_bit;
        c.masquerade_all = masquerade_all;
        if cluster_cidr {
            c.cluster_cidr = Some(if v6 { "fd00::/48" } else { "10.0.0.0/8" }.parse::<Cidr>().unwrap());
        }
        if node_ips {
            c.node_ips = vec![if v6 { "fd00::1" } else { "192.168.0.10" }.parse().unwrap()];
        }
        c.node_port_addresses = node_port_addresses;
        c.localhost_node_ports = localhost_node_ports;
        c.random_fully = random_fully;
        c.conntrack_tcp_liberal = conntrack_tcp_liberal;
        c.zone = zone;
        c
    }
}

/// Chains of a rendered state: in the kernel before the next delta is applied.
fn all_chains(r: &Rendered) -> BTreeSet<String> {
    let rs = r.to_ruleset();
    rs.filter
        .chains()
        .iter()
        .chain(rs.nat.chains())
        .map(|c| c.name.to_string())
        .collect()
}

fn apply(st: &mut ServiceState, op: &Op) {
    match op {
        Op::UpsertService(s) => {
            st.upsert_service(s);
        }
        Op::DeleteService(i) => {
            st.delete_service("default", &format!("svc{i}"));
        }
        Op::UpsertSlice(s) => {
            st.upsert_endpoint_slice(s);
        }
        Op::DeleteSlice(s) => {
            st.delete_endpoint_slice(s);
        }
    }
}

fn run_ops(ops: Vec<Op>, rc: RenderConfig) {
    bounded("render", move || {
        let mut st = ServiceState::new(rc.family, NODE);
        let mut rendered = Rendered::build(st.service_port_map(), st.endpoints_map(), &rc);
        check_restore_text(&rendered.full_text(&[]), &BTreeSet::new());
        for (n, op) in ops.iter().enumerate() {
            apply(&mut st, op);
            if !st.has_changes() {
                continue;
            }
            let known = all_chains(&rendered);
            let changed = st.take_changes();
            let desired = render::render(st.service_port_map(), st.endpoints_map(), &rc);
            let oracle = render::delta(&rendered.to_ruleset(), &desired);
            let delta = rendered.update(st.service_port_map(), st.endpoints_map(), &changed, &rc);
            assert_eq!(
                delta, oracle,
                "step {n}: incremental delta ≠ whole-render delta"
            );
            check_restore_text(&delta, &known);
            let full = rendered.full_text(&[]);
            assert_eq!(full, desired.full_text(&[]), "step {n}: full text");
            check_restore_text(&full, &BTreeSet::new());
            // Rendering is a function of the state: the same again.
            let again = Rendered::build(st.service_port_map(), st.endpoints_map(), &rc);
            assert_eq!(again.full_text(&[]), full, "step {n}: not deterministic");
            // Chains left over from before are declared, flushed and deleted.
            let stale = vec!["KUBE-SVC-AAAAAAAAAAAAAAAA".to_string()];
            check_restore_text(&rendered.full_text(&stale), &BTreeSet::new());
        }
    })
}

proptest! {
    #![proptest_config(cfg(640))]

    /// Sequences of upserts and deletes of generated objects: every rendered text (full and
    /// incremental) is well-formed, and the incremental delta is the whole-render one.
    #[test]
    fn render_generated_objects(
        ops in prop::collection::vec(op(), 1..16),
        rc in render_config(),
    ) {
        run_ops(ops, rc);
    }
}

proptest! {
    #![proptest_config(cfg(64))]

    /// One valid service with many endpoints (up to 20 per slice, two slices): the
    /// probabilities of the statistic rules are all in (0, 1].
    #[test]
    fn render_many_endpoints(
        n in 0usize..20,
        m in 0usize..20,
        affinity in prop::option::of(any::<i32>()),
        v6 in any::<bool>(),
    ) {
        let ip = |i: usize| if v6 { format!("fd00::{:x}", i + 1) } else { format!("10.1.{}.{}", i / 200, i % 200 + 1) };
        let mut spec = serde_json::json!({
            "clusterIP": if v6 { "fd01::10" } else { "172.30.0.10" },
            "ports": [{"name": "p", "port": 80, "protocol": "TCP"}],
            "type": "NodePort",
        });
        if let Some(t) = affinity {
            spec["sessionAffinity"] = "ClientIP".into();
            spec["sessionAffinityConfig"] = serde_json::json!({"clientIP": {"timeoutSeconds": t}});
        }
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "default", "name": "svc0"}, "spec": spec,
        })).unwrap();
        let slice = |k: usize, count: usize, off: usize| -> EndpointSlice {
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": "default", "name": format!("svc0-{k}"),
                             "labels": {SERVICE_NAME_LABEL: "svc0"}},
                "addressType": if v6 { "IPv6" } else { "IPv4" },
                "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}],
                "endpoints": (0..count).map(|i| serde_json::json!({"addresses": [ip(off + i)], "nodeName": if i % 3 == 0 { NODE } else { "other" }})).collect::<Vec<_>>(),
            })).unwrap()
        };
        let rc = RenderConfig::new(if v6 { IpFamily::V6 } else { IpFamily::V4 }, NODE);
        let ops = vec![
            Op::UpsertService(Box::new(svc)),
            Op::UpsertSlice(Box::new(slice(0, n, 0))),
            Op::UpsertSlice(Box::new(slice(1, m, 100))),
        ];
        let mut st = ServiceState::new(rc.family, NODE);
        for o in &ops {
            apply(&mut st, o);
        }
        run_ops(ops, rc.clone());
        // KUBE-SVC picks among the k = n + m endpoints with probabilities 1/k, 1/(k-1), …,
        // 1/2; the last one takes what is left.
        let text = Rendered::build(st.service_port_map(), st.endpoints_map(), &rc).full_text(&[]);
        let probs: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("-A KUBE-SVC-") && l.contains("--probability"))
            .map(|l| l.split("--probability ").nth(1).unwrap().split(' ').next().unwrap().to_string())
            .collect();
        let k = n + m;
        let want: Vec<String> = (2..=k).rev().map(render::probability).collect();
        prop_assert_eq!(probs, want);
    }
}

/// The renderer's own checks catch what the checker is for: a hand-made injected line fails.
#[test]
fn checker_rejects_injected_lines() {
    let known = BTreeSet::new();
    for bad in [
        "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m comment --comment \"a\" -j ACCEPT\n-A INPUT -j ACCEPT\nCOMMIT\n",
        "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m comment --comment \"a -j ACCEPT\nCOMMIT\n",
        "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m comment --comment a -j ACCEPT -i eth0 --foo\nCOMMIT\n",
        "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m statistic --mode random --probability 1.5 -j KUBE-SERVICES\nCOMMIT\n",
        "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j KUBE-SVC-UNDECLARED\nCOMMIT\n",
        "*nat\nfoo\nCOMMIT\n",
    ] {
        let r = std::panic::catch_unwind(|| check_restore_text(bad, &known));
        assert!(r.is_err(), "accepted {bad:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// --static-services-dir files

const OBJECTS: &str = "apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  type: NodePort
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: 8080
    nodePort: 30080
  sessionAffinity: ClientIP
  sessionAffinityConfig:
    clientIP: {timeoutSeconds: 300}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: default
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  port: 8080
  protocol: TCP
endpoints:
- addresses: [10.1.0.5]
  conditions: {ready: true}
  nodeName: node1
- addresses: [10.1.0.6]
  nodeName: node2
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: dns, namespace: kube-system}
  spec:
    clusterIP: 10.96.0.10
    ports: [{name: dns, port: 53, protocol: UDP}]
";

/// Whatever `parse_text` returns is something the state and renderer take without a panic.
fn run_parse(text: String) {
    bounded("parse_text", move || {
        let mut objs = proxy::source::Objects::default();
        if proxy::source::parse_text(
            &text,
            Path::new("/etc/kube-proxy/services/x.yaml"),
            &mut objs,
        )
        .is_err()
        {
            return;
        }
        let mut st = ServiceState::new(IpFamily::V4, NODE);
        for s in objs.services.values() {
            st.upsert_service(s);
        }
        for s in objs.slices.values() {
            st.upsert_endpoint_slice(s);
        }
        let rc = RenderConfig::new(IpFamily::V4, NODE);
        let text = Rendered::build(st.service_port_map(), st.endpoints_map(), &rc).full_text(&[]);
        check_restore_text(&text, &BTreeSet::new());
    })
}

proptest! {
    #![proptest_config(cfg(384))]

    #[test]
    fn source_arbitrary_text(text in hostile_text()) {
        run_parse(text);
    }

    #[test]
    fn source_mutations(muts in mutations()) {
        run_parse(mutate(OBJECTS, &muts));
    }
}

#[test]
fn source_valid_objects_parse() {
    let mut objs = proxy::source::Objects::default();
    proxy::source::parse_text(OBJECTS, Path::new("/x.yaml"), &mut objs).unwrap();
    assert_eq!((objs.services.len(), objs.slices.len()), (2, 1));
}

// ---------------------------------------------------------------------------------------------
// KubeProxyConfiguration

const PROXY_CONFIG: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
hostnameOverride: Node-1
mode: iptables
clusterCIDR: 10.244.0.0/16,fd00::/48
nodePortAddresses: [primary, 10.0.0.0/8]
detectLocalMode: ClusterCIDR
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 5
  burst: 10
  contentType: application/vnd.kubernetes.protobuf
iptables:
  masqueradeBit: 14
  masqueradeAll: false
  localhostNodePorts: true
  syncPeriod: 30s
  minSyncPeriod: 1s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpEstablishedTimeout: 24h0m0s
  tcpCloseWaitTimeout: 1h0m0s
";

fn run_proxy_config(text: String) {
    bounded("resolve", move || {
        let flags = proxy::config::Flags::default();
        if let Ok(c) = proxy::config::resolve(&flags, Some(&text), "host-1") {
            assert!(!c.node_name.is_empty());
            assert_eq!(c.node_name, c.node_name.to_lowercase());
            assert!(c.masquerade_bit <= 31);
            assert!(!c.sync_period.is_zero());
            assert!(c.conntrack.min >= 0 && c.conntrack.max_per_core >= 0);
            assert!(c.burst > 0);
            assert!(c.cluster_cidrs.len() <= 2);
            // What the config feeds: the mark, the client rate limit.
            let rc = RenderConfig {
                masquerade_bit: c.masquerade_bit,
                ..RenderConfig::new(c.primary_family(), &c.node_name)
            };
            let _ = rc.masquerade_mark();
            let (n, per) = proxy::apiserver::rate_window(c.qps, c.burst);
            assert!(n >= 1 && per >= Duration::from_millis(1));
        }
    })
}

proptest! {
    #![proptest_config(cfg(384))]

    #[test]
    fn proxy_config_arbitrary(text in hostile_text()) {
        run_proxy_config(text);
    }

    #[test]
    fn proxy_config_mutations(muts in mutations()) {
        run_proxy_config(mutate(PROXY_CONFIG, &muts));
    }

    /// Hostile values for single fields of a valid document.
    #[test]
    fn proxy_config_hostile_values(
        line in prop::sample::select(vec![
            "bindAddress", "healthzBindAddress", "metricsBindAddress", "hostnameOverride",
            "mode", "clusterCIDR", "detectLocalMode", "  qps", "  burst", "  masqueradeBit",
            "  syncPeriod", "  minSyncPeriod", "  maxPerCore", "  min", "  tcpEstablishedTimeout",
            "nodePortAddresses",
        ]),
        value in prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<i32>().prop_map(|n| n.to_string()),
            any::<f32>().prop_map(|f| format!("{f:e}")),
            "[0-9]{1,9}(ns|us|ms|s|m|h)",
            prop::sample::select(vec![
                "~", "null", "[]", "{}", "\"\"", "-1", "32", "0", "1e-30", "1e30", ".nan", ".inf",
                "-.inf", "0x1F", "017", "yes", "[::1]:80", "::1", "1.2.3.4:99999", "[garbage]",
                "\"a\\nb\"", "&x [*x]", "10.0.0.0/8,10.1.0.0/16", "all", "localhost", "primary",
            ]).prop_map(str::to_string),
            "\\PC{0,20}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        ],
    ) {
        let key = line.trim_start();
        let text = PROXY_CONFIG
            .lines()
            .map(|l| {
                if l.trim_start().starts_with(&format!("{key}:")) && l.starts_with(line) {
                    format!("{line}: {value}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        run_proxy_config(text);
    }
}

/// Go's `time.ParseDuration` rejects durations past ~292 years; `parse_go_duration` hands the
/// f64 total to `Duration::from_secs_f64`, which panics when it is out of range. Reached from
/// the config file (`iptables.syncPeriod`) and flags.
#[test]
fn proxy_duration_overflow_is_an_error() {
    let r = std::panic::catch_unwind(|| proxy::config::parse_go_duration("99999999999999999999h"));
    assert!(matches!(r, Ok(None)), "panicked or accepted");
    let text = PROXY_CONFIG.replace("syncPeriod: 30s", "syncPeriod: 99999999999999999999h");
    let r = std::panic::catch_unwind(|| {
        proxy::config::resolve(&proxy::config::Flags::default(), Some(&text), "h")
    });
    assert!(
        matches!(r, Ok(Err(_))),
        "config file with an overflowing duration"
    );
}

/// `resolve` accepts any positive `clientConnection.qps`; `rate_window` then computes
/// `burst / qps` seconds with `Duration::from_secs_f64`, which panics past u64 seconds
/// (qps 1e-30, burst 10 → 1e31 s).
#[test]
fn proxy_tiny_qps_does_not_panic() {
    let text = PROXY_CONFIG.replace("qps: 5", "qps: 1e-30");
    let c = proxy::config::resolve(&proxy::config::Flags::default(), Some(&text), "h").unwrap();
    let r = std::panic::catch_unwind(|| proxy::apiserver::rate_window(c.qps, c.burst));
    assert!(r.is_ok(), "rate_window({}, {}) panicked", c.qps, c.burst);
}

proptest! {
    #![proptest_config(cfg(2048))]

    /// Bounded Go durations: parsed or refused, and `0`/unit-less numbers refused except `0`.
    #[test]
    fn proxy_duration_forms(
        sign in prop::sample::select(vec!["", "+", "-", " "]),
        parts in prop::collection::vec(
            ("[0-9]{0,9}(\\.[0-9]{0,6})?", prop::sample::select(vec![
                "ns", "us", "µs", "μs", "ms", "s", "m", "h", "", "x", "S",
            ])),
            0..6,
        ),
    ) {
        let s = format!("{sign}{}", parts.iter().map(|(n, u)| format!("{n}{u}")).collect::<String>());
        if let Some(d) = proxy::config::parse_go_duration(&s) {
            prop_assert!(!s.trim().starts_with('-') || d.is_zero(), "{s:?} → {d:?}");
        }
    }

    #[test]
    fn proxy_duration_arbitrary(s in prop_oneof![any::<String>(), "\\PC{0,30}"]) {
        let _ = proxy::config::parse_go_duration(&s);
    }
}

// ---------------------------------------------------------------------------------------------
// CVE-2019-11253: YAML alias bombs ("billion laughs") in the files kube-proxy parses

/// A flow mapping whose ten anchors each repeat the previous one ten times: 10^10 strings
/// once expanded, from a few hundred bytes.
fn billion_laughs() -> String {
    let mut levels = vec!["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]".to_string()];
    for i in 1..10 {
        levels.push(format!(
            "l{i}: &l{i} [{}]",
            vec![format!("*l{}", i - 1); 10].join(", ")
        ));
    }
    format!("{{{}}}", levels.join(", "))
}

/// The KubeProxyConfiguration file (`--config`, free-form `logging`) and a file of the
/// static services directory (an annotation of a Service): each refused within the deadline,
/// never expanded.
#[test]
fn cve_2019_11253_config_and_static_service_alias_bombs_are_refused() {
    let config = format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging: {}\n",
        billion_laughs()
    );
    let r = bounded("kube-proxy config bomb", move || {
        proxy::config::KubeProxyConfiguration::parse(&config).map(|_| ())
    });
    assert!(r.is_err(), "a billion laughs is not a configuration");
    let service = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\n  namespace: default\n  annotations: {}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{{port: 53}}]\n",
        billion_laughs()
    );
    let r = bounded("static service bomb", move || {
        let mut out = proxy::source::Objects::default();
        proxy::source::parse_text(
            &service,
            Path::new("/etc/kube-proxy/services/s.yaml"),
            &mut out,
        )
        .map(|_| out.services.len())
    });
    assert!(r.is_err(), "a billion laughs is not a Service");
}
