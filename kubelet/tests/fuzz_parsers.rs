//! Property-based fuzzing of the kubelet's parsers of untrusted or operator-written text:
//! static pod manifests, resource quantities, Go durations, the KubeletConfiguration file, the
//! kubeconfig (and the PEM credentials it names) and `$(VAR)` expansion.
//!
//! Inputs are arbitrary strings, mutations of valid documents and valid documents with hostile
//! field values. The property is always: no panic, no hang (each call runs on a thread with
//! tokio's default 2 MiB stack and a deadline), output bounded by the input, and either `Ok` or
//! an error; plus, where there is one, a real invariant (round trips, reference computations,
//! monotonicity). Case counts keep each test to a few seconds in a debug build; no failure
//! files are written (`failure_persistence: None`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::LazyLock;
use std::sync::mpsc;
use std::time::Duration;

use kubelet::pod::static_pods::parse_manifest;
use kubelet::podspec::is_safe_uid;
use kubelet::spec::{ExpandBudget, MAX_EXPANSION_BYTES, expand};
use plumbing::quantity::{MAX_MILLI, QuantityError, parse_milli, parse_value};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config as ProptestConfig;

// ---------------------------------------------------------------------------------------------
// Harness

/// Cases per property: `n`, no failure files in the source tree.
fn cfg(n: u32) -> ProptestConfig {
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    }
}

/// How long one call may take in a debug build before it counts as a hang.
const DEADLINE: Duration = Duration::from_secs(10);

/// Runs `f` on a thread with tokio's default worker stack (2 MiB, where the kubelet parses
/// manifests and configs) and fails if it does not return within [`DEADLINE`]. A panic in
/// `f` is re-raised with its message.
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

/// Byte-level mutation: (kind, position, byte). Kind 0 inserts, 1 deletes, 2 replaces,
/// 3 duplicates a span, 4 truncates.
type Mutation = (u8, Index, u8);

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec((0u8..5, any::<Index>(), any::<u8>()), 1..8)
}

/// Interesting bytes for YAML/JSON: structure characters weigh more than random ones.
fn pick_byte(b: u8) -> u8 {
    const SPECIAL: &[u8] = b"{}[]:,-'\"\n \t#&*!|>%@`?\\0.9-e";
    if b < 128 {
        SPECIAL[b as usize % SPECIAL.len()]
    } else {
        b
    }
}

fn mutate(base: &str, muts: &[Mutation]) -> String {
    let mut b = base.as_bytes().to_vec();
    for (kind, at, byte) in muts {
        let pos = if b.is_empty() {
            0
        } else {
            at.index(b.len() + 1)
        };
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

/// Arbitrary text: printable unicode, control characters, YAML-ish tokens, deep nesting of
/// one opener (up to 64 KiB) and long lines.
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
        "%YAML 1.2\n",
        "<<: *a\n",
        "kind: Pod\n",
        "\t",
        "\\u0000",
        "~",
        "null",
        "1e999",
        "0x",
        "0o17",
        "-.inf",
        ".nan",
        "apiVersion: v1\n",
    ]);
    prop_oneof![
        4 => any::<String>(),
        2 => "\\PC{0,400}",
        3 => prop::collection::vec(token, 0..200).prop_map(|v| v.concat()),
        1 => (
            prop::sample::select(vec!["[", "{", "- ", "{\"a\":", "a:\n ", "[{", "&a [", "? "]),
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

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

// ---------------------------------------------------------------------------------------------
// Static pod manifests

const NODE: &str = "Worker-1";

const MANIFEST: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: kube-system
  labels: {app: web}
  annotations:
    a: b
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 30
  initContainers:
  - name: init
    image: busybox:1.35
    command: [\"true\"]
  containers:
  - name: httpd
    image: docker.io/library/busybox:1.35
    command: [\"httpd\", \"-f\", \"-p\", \"$(PORT)\"]
    env:
    - name: PORT
      value: \"8080\"
    - name: POD
      valueFrom:
        fieldRef: {fieldPath: metadata.name}
    ports:
    - containerPort: 8080
      protocol: TCP
    resources:
      requests: {cpu: 100m, memory: 64Mi}
      limits: {cpu: \"1\", memory: 128Mi}
    livenessProbe:
      httpGet: {path: /, port: 8080}
      periodSeconds: 10
";

/// What every accepted manifest must look like.
fn check_pod(pod: &k8s_openapi::api::core::v1::Pod, node: &str, text_len: usize) {
    let node_lc = node.to_lowercase();
    let name = pod.metadata.name.as_deref().expect("name");
    let base = name
        .strip_suffix(&format!("-{node_lc}"))
        .unwrap_or_else(|| panic!("pod name {name:?} is not <name>-{node_lc}"));
    assert!(!base.is_empty(), "accepted an empty manifest name");
    // Upstream validates the name as it runs (`<name>-<node>`), not the manifest's part.
    assert!(is_dns_subdomain(name), "accepted pod name {name:?}");
    let ns = pod.metadata.namespace.as_deref().expect("namespace");
    assert!(is_dns_label(ns), "namespace {ns:?} is not a DNS label");
    let uid = pod.metadata.uid.as_deref().expect("uid");
    assert!(is_safe_uid(uid), "uid {uid:?} is not safe");
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some(node_lc.as_str()));
    assert!(!spec.containers.is_empty());
    // Aliases must not amplify a small file into a huge pod (billion laughs).
    let size = serde_json::to_vec(pod).unwrap().len();
    assert!(
        size <= 64 * text_len + (64 << 10),
        "a {text_len}-byte manifest became a {size}-byte pod"
    );
}

fn run_manifest(text: String, node: &'static str) {
    bounded("parse_manifest", move || {
        match parse_manifest(Path::new("/etc/kubernetes/manifests/x.yaml"), &text, node) {
            Ok(pod) => check_pod(&pod, node, text.len()),
            Err(e) => assert!(!e.message.is_empty(), "an error says why"),
        }
    })
}

proptest! {
    #![proptest_config(cfg(384))]

    #[test]
    fn manifest_arbitrary_text(text in hostile_text()) {
        run_manifest(text, NODE);
    }

    #[test]
    fn manifest_mutations(muts in mutations(), json in any::<bool>()) {
        let base = if json {
            let v: serde_json::Value = serde_saphyr::from_str(MANIFEST).unwrap();
            serde_json::to_string_pretty(&v).unwrap()
        } else {
            MANIFEST.to_string()
        };
        run_manifest(mutate(&base, &muts), NODE);
    }
}

fn hostile_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?",
        2 => "[a-z0-9]{1,10}(\\.[a-z0-9]{1,10}){0,3}",
        1 => "[a-z]{63}\\.[a-z]{63}\\.[a-z]{63}\\.[a-z]{40,63}",
        1 => "[a-z]{64,300}",
        2 => "\\PC{0,80}",
        2 => prop::sample::select(vec![
            "", ".", "..", "../etc", "a/b", "/", "a\nb", "a\0b", "é", "Web", "-a", "a-",
            "a..b", "a b", "\"a\"", "$(A)", "a_b", "a\u{2028}b", "kube-system/web",
        ])
        .prop_map(str::to_string),
    ]
}

fn hostile_uid() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        2 => Just(None),
        2 => "[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}".prop_map(Some),
        1 => "[A-Za-z0-9_.-]{1,140}".prop_map(Some),
        2 => prop::sample::select(vec![
            "", ".", "..", "../..", "a/b", "/etc", ".hidden", "a\nb", "ü", "a b", "a..b",
        ])
        .prop_map(|s| Some(s.to_string())),
        1 => "\\PC{0,40}".prop_map(Some),
    ]
}

proptest! {
    #![proptest_config(cfg(512))]

    /// Valid manifests whose name, namespace and uid are hostile: accepted exactly when
    /// upstream's rules accept them, and then named and identified safely.
    #[test]
    fn manifest_hostile_fields(
        name in hostile_name(),
        ns in prop::option::of(hostile_name()),
        uid in hostile_uid(),
        node in "[A-Za-z0-9]([-A-Za-z0-9.]{0,30}[A-Za-z0-9])?",
        as_json in any::<bool>(),
    ) {
        let mut meta = serde_json::json!({ "name": name });
        if let Some(ns) = &ns {
            meta["namespace"] = ns.clone().into();
        }
        if let Some(uid) = &uid {
            meta["uid"] = uid.clone().into();
        }
        let doc = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        });
        let text = if as_json {
            doc.to_string()
        } else {
            // YAML with JSON-quoted scalars (a JSON string is a YAML double-quoted scalar).
            let q = |s: &str| serde_json::to_string(s).unwrap();
            let mut t = format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {}\n", q(&name));
            if let Some(ns) = &ns {
                t += &format!("  namespace: {}\n", q(ns));
            }
            if let Some(uid) = &uid {
                t += &format!("  uid: {}\n", q(uid));
            }
            t + "spec:\n  containers:\n  - name: c\n    image: busybox\n"
        };
        let node: &'static str = Box::leak(node.into_boxed_str());
        let text2 = text.clone();
        let res = bounded("parse_manifest", move || {
            parse_manifest(Path::new("/m/x.yaml"), &text2, node)
        });
        // Upstream validates the name as it will run: `<name>-<node lowercase>`.
        let should_accept = !name.is_empty()
            && is_dns_subdomain(&format!("{name}-{}", node.to_lowercase()))
            && ns.as_deref().is_none_or(|n| n.is_empty() || is_dns_label(n))
            && uid.as_deref().is_none_or(|u| u.is_empty() || is_safe_uid(u));
        match res {
            Ok(pod) => {
                prop_assert!(should_accept, "accepted {text:?}");
                check_pod(&pod, node, text.len());
                prop_assert_eq!(
                    pod.metadata.name.clone().unwrap(),
                    format!("{name}-{}", node.to_lowercase())
                );
                let want_ns = ns.filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into());
                prop_assert_eq!(pod.metadata.namespace.as_deref(), Some(want_ns.as_str()));
                if let Some(u) = uid.filter(|u| !u.is_empty()) {
                    prop_assert_eq!(pod.metadata.uid.as_deref(), Some(u.as_str()));
                }
            }
            Err(e) => prop_assert!(!should_accept, "rejected {text:?}: {e}"),
        }
    }
}

/// Upstream defaults the static pod's name to `<name>-<node>` and only then validates it
/// (`tryDecodeSinglePod`: `applyDefaults` before `ValidatePodCreate`), so the final name must
/// be a DNS subdomain of at most 253 characters: a 253-character name is refused once the
/// node suffix is added.
#[test]
fn manifest_final_name_fits_a_dns_subdomain() {
    // Four labels, 253 characters: the longest valid name, too long with `-worker-1`.
    let name = format!("{0}.{0}.{0}.{1}", "a".repeat(63), "b".repeat(61));
    assert_eq!(name.len(), 253);
    let text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: busybox\n"
    );
    let e = parse_manifest(Path::new("/m/x.yaml"), &text, "worker-1").unwrap_err();
    assert!(e.message.contains("metadata.name"), "{e}");
    let short = text.replace(&name, &name[..240]);
    let pod = parse_manifest(Path::new("/m/x.yaml"), &short, "worker-1").unwrap();
    assert!(is_dns_subdomain(&pod.metadata.name.unwrap()));
}

/// Upstream defaults an empty namespace to `default` before validating
/// (`applyDefaults` in `tryDecodeSinglePod`); here `validate` runs first and rejects an
/// explicit `namespace: ""`.
#[test]
fn manifest_empty_namespace_is_default() {
    let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: \"\"\nspec:\n  containers:\n  - name: c\n    image: busybox\n";
    let pod = parse_manifest(Path::new("/m/x.yaml"), text, "worker-1").unwrap();
    assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
}

/// A YAML alias bomb (each level doubles the previous one ten times): must fail or stay small,
/// fast.
#[test]
fn manifest_alias_bomb_is_bounded() {
    let mut text = String::from(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  annotations:\n    l0: &l0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 1..10 {
        let refs = vec![format!("*l{}", i - 1); 10].join(",");
        text += &format!("    l{i}: &l{i} [{refs}]\n");
    }
    text += "spec:\n  containers:\n  - name: c\n    image: busybox\n";
    run_manifest(text, "worker-1");
}

// ---------------------------------------------------------------------------------------------
// Quantities

/// The Kubernetes quantity grammar, checked by hand:
/// `^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$` narrowed to upstream's suffixes.
fn matches_grammar(q: &str) -> bool {
    let s = q.trim();
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let n = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(n);
    if num.matches('.').count() > 1 || !num.bytes().any(|b| b.is_ascii_digit()) {
        return false;
    }
    const SUFFIXES: &[&str] = &[
        "", "m", "u", "n", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    if SUFFIXES.contains(&suffix) {
        return true;
    }
    let Some(exp) = suffix.strip_prefix(['e', 'E']) else {
        return false;
    };
    let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
    !exp.is_empty() && exp.bytes().all(|b| b.is_ascii_digit())
}

fn check_quantity(q: &str) {
    let m = parse_milli(q);
    let v = parse_value(q);
    match &m {
        Ok(m) => {
            assert!(m.abs() <= MAX_MILLI, "{q:?} → {m} milli");
            assert!(matches_grammar(q), "{q:?} accepted outside the grammar");
            // parse_value is parse_milli rounded up to whole units.
            assert_eq!(
                v,
                Ok(m.div_euclid(1000) + i128::from(m.rem_euclid(1000) != 0))
            );
        }
        Err(QuantityError::Syntax(s) | QuantityError::TooLarge(s)) => {
            assert_eq!(s, q, "the error quotes the input");
            assert_eq!(v.as_ref().err(), m.as_ref().err());
        }
    }
}

/// Number-ish strings: signs, digits, dots, every suffix of the grammar and exponents up to
/// ±1000.
fn numberish() -> impl Strategy<Value = String> {
    let sign = prop::sample::select(vec!["", "", "+", "-", "--", "+-", " ", "\t"]);
    let int = prop_oneof!["[0-9]{0,4}", "[0-9]{15,45}", Just(String::new())];
    let frac = prop_oneof![
        Just(String::new()),
        "\\.[0-9]{0,4}",
        "\\.[0-9]{25,40}",
        Just("..".to_string())
    ];
    let suffix = prop_oneof![
        prop::sample::select(vec![
            "", "m", "u", "n", "k", "K", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi",
            "Ei", "e", "E", "i", "mi", "KiB", "e+", "e-", "µ", " ", "m ",
        ])
        .prop_map(str::to_string),
        (
            prop::sample::select(vec!["e", "E"]),
            prop::sample::select(vec!["", "+", "-"]),
            -1000i32..=1000
        )
            .prop_map(|(e, s, n)| format!("{e}{s}{}", n.unsigned_abs())),
        (-1000i32..=1000).prop_map(|n| format!("e{n}")),
    ];
    (sign, int, frac, suffix).prop_map(|(s, i, f, x)| format!("{s}{i}{f}{x}"))
}

/// Reference: `±(int.frac × num / den)` in thousandths, magnitude rounded up.
fn reference_milli(neg: bool, int: u64, frac: &str, num: i128, den: i128) -> Option<i128> {
    let frac_den = 10i128.pow(frac.len() as u32);
    let frac_v: i128 = if frac.is_empty() {
        0
    } else {
        frac.parse().unwrap()
    };
    let mantissa = i128::from(int) * frac_den + frac_v;
    let numer = mantissa.checked_mul(num)?.checked_mul(1000)?;
    let denom = frac_den * den;
    let v = (numer + denom - 1) / denom;
    (v <= MAX_MILLI).then_some(if neg { -v } else { v })
}

const MULTIPLIERS: &[(&str, i128, i128)] = &[
    ("", 1, 1),
    ("m", 1, 1000),
    ("u", 1, 1_000_000),
    ("n", 1, 1_000_000_000),
    ("k", 1000, 1),
    ("M", 1_000_000, 1),
    ("G", 1_000_000_000, 1),
    ("T", 1_000_000_000_000, 1),
    ("P", 1_000_000_000_000_000, 1),
    ("E", 1_000_000_000_000_000_000, 1),
    ("Ki", 1 << 10, 1),
    ("Mi", 1 << 20, 1),
    ("Gi", 1 << 30, 1),
    ("Ti", 1 << 40, 1),
    ("Pi", 1 << 50, 1),
    ("Ei", 1 << 60, 1),
    ("e0", 1, 1),
    ("e3", 1000, 1),
    ("e-2", 1, 100),
    ("E6", 1_000_000, 1),
    ("e-9", 1, 1_000_000_000),
];

proptest! {
    #![proptest_config(cfg(4096))]

    #[test]
    fn quantity_arbitrary(q in prop_oneof![any::<String>(), "\\PC{0,30}", hostile_text()]) {
        check_quantity(&q);
    }

    #[test]
    fn quantity_numberish(q in numberish()) {
        check_quantity(&q);
    }

    /// Small decimals against a direct computation, with every suffix.
    #[test]
    fn quantity_matches_reference(
        neg in any::<bool>(),
        int in 0u64..1_000_000,
        frac in "[0-9]{0,3}",
        m in 0..MULTIPLIERS.len(),
    ) {
        let (suffix, num, den) = MULTIPLIERS[m];
        let q = format!(
            "{}{int}{}{}{suffix}",
            if neg { "-" } else { "" },
            if frac.is_empty() { "" } else { "." },
            frac
        );
        let want = reference_milli(neg, int, &frac, num, den);
        match parse_milli(&q) {
            Ok(v) => prop_assert_eq!(Some(v), want, "{}", q),
            Err(QuantityError::TooLarge(_)) => prop_assert_eq!(want, None, "{}", q),
            Err(e) => prop_assert!(false, "{q:?}: {e}"),
        }
    }

    /// More is more: n ≤ n+1 with the same suffix, and `n Ki` is `n × 1024`.
    #[test]
    fn quantity_monotonic(n in 0u64..10_000_000_000, m in 0..MULTIPLIERS.len()) {
        let s = MULTIPLIERS[m].0;
        let (a, b) = (parse_milli(&format!("{n}{s}")), parse_milli(&format!("{}{s}", n + 1)));
        if let (Ok(a), Ok(b)) = (&a, &b) {
            prop_assert!(a <= b, "{n}{s} → {a} > {} → {b}", n + 1);
        }
        if a.is_err() {
            prop_assert!(b.is_err(), "{n}{s} too large but {}{s} is not", n + 1);
        }
        if let Ok(ki) = parse_milli(&format!("{n}Ki")) {
            prop_assert_eq!(Ok(ki), parse_milli(&(u128::from(n) * 1024).to_string()));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Go durations (KubeletConfiguration and flags)

proptest! {
    #![proptest_config(cfg(4096))]

    #[test]
    fn duration_arbitrary(s in prop_oneof![any::<String>(), "\\PC{0,30}"]) {
        let _ = plumbing::duration::parse(&s);
    }

    /// Go-shaped durations with bounded numbers: parse, and format → parse gives the same
    /// value to the millisecond (format prints milliseconds below one second).
    #[test]
    fn duration_go_forms(
        sign in prop::sample::select(vec!["", "+", "-"]),
        parts in prop::collection::vec(
            ("[0-9]{0,9}(\\.[0-9]{0,6})?", prop::sample::select(vec![
                "ns", "us", "µs", "μs", "ms", "s", "m", "h", "", "x", "S", "sec",
            ])),
            0..6,
        ),
    ) {
        let s = format!("{sign}{}", parts.iter().map(|(n, u)| format!("{n}{u}")).collect::<String>());
        if let Ok(d) = plumbing::duration::parse(&s) {
            let text = plumbing::duration::format(d);
            let back = plumbing::duration::parse(&text)
                .unwrap_or_else(|e| panic!("{s:?} → {d:?} → {text:?}: {e}"));
            let diff = back.abs_diff(d);
            prop_assert!(
                diff <= Duration::from_millis(1).max(d / 1_000_000),
                "{s:?} → {d:?} → {text:?} → {back:?}"
            );
        }
    }
}

/// Go's `time.ParseDuration` rejects durations past ~292 years ("invalid duration"); here the
/// f64 total is handed to `Duration::from_secs_f64`, which panics when it is out of range. A
/// KubeletConfiguration with `syncFrequency: 99999999999999999999h` (or the flag) crashes
/// the kubelet instead of being reported.
#[test]
fn duration_overflow_is_an_error() {
    let long = format!("{}s", "1".repeat(400));
    for s in ["99999999999999999999h", "6000000000000000h", long.as_str()] {
        let r = std::panic::catch_unwind(|| plumbing::duration::parse(s));
        assert!(matches!(r, Ok(Err(_))), "{s:?} panicked or was accepted");
    }
    let text = "kind: KubeletConfiguration\nsyncFrequency: 99999999999999999999h\n";
    let r = std::panic::catch_unwind(|| kubelet::config::parse_file("/k.yaml", text));
    assert!(
        matches!(r, Ok(Err(_))),
        "config file with an overflowing duration"
    );
}

/// Go prints `time.Duration(1)` as `1ns`; `format` prints every duration under a millisecond
/// as `0ms`, which reads back as zero (seen on /configz and in the config round trip).
#[test]
fn duration_format_keeps_sub_millisecond_values() {
    for d in [Duration::from_nanos(1), Duration::from_micros(500)] {
        let text = plumbing::duration::format(d);
        assert_eq!(plumbing::duration::parse(&text), Ok(d), "{d:?} → {text:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// KubeletConfiguration

const KUBELET_CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: /etc/kubernetes/manifests
syncFrequency: 1m0s
fileCheckFrequency: 20s
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzPort: 10248
healthzBindAddress: 127.0.0.1
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
cgroupDriver: systemd
cgroupRoot: /
maxPods: 110
runtimeRequestTimeout: 2m
nodeStatusUpdateFrequency: 10s
nodeLeaseDurationSeconds: 40
kubeAPIQPS: 50
kubeAPIBurst: 100
evictionHard:
  memory.available: 100Mi
  nodefs.available: 10%
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
authorization:
  mode: Webhook
registerWithTaints:
- key: node-role
  value: infra
  effect: NoSchedule
";

fn run_kubelet_config(text: String) {
    bounded("kubelet config", move || {
        let Ok(file) = kubelet::config::parse_file("/var/lib/kubelet/config.yaml", &text) else {
            return;
        };
        // What was parsed can be written and read back: once normalized (durations as
        // `format` prints them), a second round trip changes nothing.
        let round = |file: &kubelet::config::KubeletConfiguration| {
            let json = serde_json::to_string(file).expect("serialize");
            match kubelet::config::parse_file("/re.json", &json) {
                Ok(again) => again,
                Err(e) => panic!("{text:?} parsed, its JSON form {json:?} does not: {e}"),
            }
        };
        let once = round(&file);
        let twice = round(&once);
        assert_eq!(
            serde_json::to_value(&once).unwrap(),
            serde_json::to_value(&twice).unwrap(),
            "round trip of {text:?}"
        );
        let flags = kubelet::settings::cli::Flags::default();
        if let Ok(c) = kubelet::config::merge(&flags, file, "Node-1") {
            assert_eq!(c.node.node_name, "node-1");
            assert!(
                c.server.port > 0,
                "the server port is never 0 (healthzPort may be)"
            );
            assert!(c.cm.cgroup_root.starts_with('/'));
            assert!(!c.runtime.container_runtime_endpoint.is_empty());
            assert!(!c.sync_frequency.is_zero());
            assert!(c.node.node_lease_duration_seconds > 0);
            assert!(c.kube_api_qps > 0 && c.kube_api_burst > 0);
        }
    })
}

proptest! {
    #![proptest_config(cfg(384))]

    #[test]
    fn kubelet_config_arbitrary(text in hostile_text()) {
        run_kubelet_config(text);
    }

    #[test]
    fn kubelet_config_mutations(muts in mutations()) {
        run_kubelet_config(mutate(KUBELET_CONFIG, &muts));
    }

    /// Hostile values for the scalar fields of a valid document.
    #[test]
    fn kubelet_config_hostile_values(
        field in prop::sample::select(vec![
            "port", "readOnlyPort", "healthzPort", "maxPods", "syncFrequency",
            "fileCheckFrequency", "address", "healthzBindAddress", "cgroupDriver", "cgroupRoot",
            "clusterDNS", "containerRuntimeEndpoint", "nodeLeaseDurationSeconds", "kubeAPIQPS",
            "registerWithTaints", "evictionHard", "staticPodPath", "failSwapOn",
        ]),
        value in prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<i32>().prop_map(|n| n.to_string()),
            "[0-9]{1,9}(ns|us|ms|s|m|h)",
            prop::sample::select(vec![
                "~", "null", "[]", "{}", "\"\"", "-1", "65536", "0", "1e3", "0x1F", "017",
                "0o17", "yes", "on", "true", ".inf", ".nan", "\"::1\"", "\"1.2.3.4 \"",
                "[\"10.0.0.1\", \"garbage\"]", "[{key: \"\", effect: Bad}]", "relative/path",
                "\"a\\nb\"", "&x [*x]",
            ]).prop_map(str::to_string),
            "\\PC{0,20}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        ],
    ) {
        let text = format!("{KUBELET_CONFIG}{field}: {value}\n");
        // A duplicate key is a parse error; replace the line instead when there is one.
        let text = if KUBELET_CONFIG.contains(&format!("\n{field}:")) {
            KUBELET_CONFIG
                .lines()
                .map(|l| if l.starts_with(&format!("{field}:")) { format!("{field}: {value}") } else { l.to_string() })
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            text
        };
        run_kubelet_config(text);
    }
}

/// Upstream's v1beta1 JSON names are `kubeAPIBurst`, `cgroupsPerQOS`, `podCIDR` and
/// `serverTLSBootstrap`; `rename_all = "camelCase"` makes them `kubeApiBurst`,
/// `cgroupsPerQos`, `podCidr` and `serverTlsBootstrap`, so a real file's values are silently
/// ignored (unknown fields are tolerated). Found by the round trip above printing the names.
#[test]
fn kubelet_config_uses_upstream_field_names() {
    let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                kubeAPIBurst: 7\ncgroupsPerQOS: false\npodCIDR: 10.1.0.0/24\nserverTLSBootstrap: true\n";
    let file = kubelet::config::parse_file("/k.yaml", text).unwrap();
    assert_eq!(file.kube_api_burst, Some(7), "kubeAPIBurst");
    assert_eq!(file.cgroups_per_qos, Some(false), "cgroupsPerQOS");
    assert_eq!(file.pod_cidr.as_deref(), Some("10.1.0.0/24"), "podCIDR");
    assert_eq!(file.server_tls_bootstrap, Some(true), "serverTLSBootstrap");
}

// ---------------------------------------------------------------------------------------------
// Kubeconfig and PEM credentials

struct Pair {
    cert: String,
    key: String,
    other_key: String,
}

static PAIR: LazyLock<Pair> = LazyLock::new(|| {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["worker-1".into()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:node:worker-1");
    let cert = params.self_signed(&key).unwrap().pem();
    let other = rcgen::KeyPair::generate().unwrap();
    Pair {
        cert,
        key: key.serialize_pem(),
        other_key: other.serialize_pem(),
    }
});

fn b64(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Re-wraps a PEM block whose DER was mutated, so the PEM layer passes and the DER parser is
/// what is exercised.
fn mutate_der(pem: &str, muts: &[Mutation]) -> String {
    use base64::Engine as _;
    let label = pem
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("-----BEGIN "))
        .and_then(|l| l.strip_suffix("-----"))
        .unwrap_or("CERTIFICATE")
        .to_string();
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let mut der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap();
    for (kind, at, byte) in muts {
        let pos = at.index(der.len() + 1);
        match kind {
            0 => der.insert(pos, *byte),
            1 | 3 if pos < der.len() => {
                der.remove(pos);
            }
            2 if pos < der.len() => der[pos] = *byte,
            4 => der.truncate(pos),
            _ => {}
        }
    }
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        b64(&der)
    )
}

fn pem_strategy(base: fn() -> String) -> impl Strategy<Value = String> {
    prop_oneof![
        2 => mutations().prop_map(move |m| mutate(&base(), &m)),
        3 => mutations().prop_map(move |m| mutate_der(&base(), &m)),
        1 => any::<String>(),
        1 => prop::collection::vec(any::<u8>(), 0..600).prop_map(|b| format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            b64(&b)
        )),
        1 => Just(base()),
    ]
}

fn cert_pem() -> String {
    PAIR.cert.clone()
}
fn key_pem() -> String {
    PAIR.key.clone()
}

proptest! {
    #![proptest_config(cfg(512))]

    /// PEM and X.509 parsing of credentials: never panics; a key pair only matches when it is
    /// the real one.
    #[test]
    fn credentials_pem(cert in pem_strategy(cert_pem), key in pem_strategy(key_pem)) {
        use kubelet::certs::bootstrap::{cert_validity, check_client_pair, check_key_pair};
        let (c2, k2) = (cert.clone(), key.clone());
        let (validity, pair, client) = bounded("pem", move || {
            (
                cert_validity(c2.as_bytes()),
                check_key_pair(c2.as_bytes(), k2.as_bytes()),
                check_client_pair(c2.as_bytes(), "cert", k2.as_bytes(), "key", 1_700_000_000)
                    .map_err(|e| e.to_string()),
            )
        });
        if let Some((nb, na)) = validity {
            prop_assert!(nb <= na || cert != PAIR.cert);
        }
        if client.is_ok() {
            prop_assert!(pair.is_ok(), "client pair usable but keys do not match");
        }
        // A key other than the certificate's never matches it.
        let other = check_key_pair(cert.as_bytes(), PAIR.other_key.as_bytes());
        prop_assert!(other.is_err() || cert != PAIR.cert);
    }
}

fn kubeconfig_with(user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: Q0E=\n  name: c\ncontexts:\n- context:\n    cluster: c\n    user: u\n  name: ctx\ncurrent-context: ctx\nusers:\n- name: u\n  user:\n{user}"
    )
}

fn valid_kubeconfig() -> String {
    kubeconfig_with(&format!(
        "    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(PAIR.cert.as_bytes()),
        b64(PAIR.key.as_bytes())
    ))
}

fn run_kubeconfig(text: String, files: Vec<(String, String)>) -> Result<(), String> {
    bounded("check_kubeconfig", move || {
        let dir = tempfile::tempdir().unwrap();
        for (name, body) in &files {
            std::fs::write(dir.path().join(name), body).unwrap();
        }
        let text = text.replace("@DIR@", &dir.path().display().to_string());
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, &text).unwrap();
        let r = kubelet::certs::bootstrap::check_kubeconfig(&path).map_err(|e| e.to_string());
        assert_eq!(
            r.is_ok(),
            kubelet::certs::bootstrap::kubeconfig_usable(&path)
        );
        r
    })
}

/// One credential line of a kubeconfig user: inline data (valid, mutated or garbage), a file
/// in the test's directory, a missing file, a token.
fn user_line() -> impl Strategy<Value = String> {
    prop_oneof![
        pem_strategy(cert_pem)
            .prop_map(|p| format!("    client-certificate-data: {}\n", b64(p.as_bytes()))),
        pem_strategy(key_pem).prop_map(|p| format!("    client-key-data: {}\n", b64(p.as_bytes()))),
        Just(format!(
            "    client-certificate-data: {}\n",
            b64(PAIR.cert.as_bytes())
        )),
        Just(format!(
            "    client-key-data: {}\n",
            b64(PAIR.key.as_bytes())
        )),
        "\\PC{0,40}".prop_map(|s| format!(
            "    client-certificate-data: {}\n",
            serde_json::to_string(&s).unwrap()
        )),
        "\\PC{0,40}".prop_map(|s| format!(
            "    client-key-data: {}\n",
            serde_json::to_string(&s).unwrap()
        )),
        prop::sample::select(vec!["cert.pem", "key.pem", "junk", "missing", ""])
            .prop_map(|f| { format!("    client-certificate: @DIR@/{f}\n") }),
        prop::sample::select(vec!["cert.pem", "key.pem", "junk", "missing", ""])
            .prop_map(|f| { format!("    client-key: @DIR@/{f}\n") }),
        Just("    token: abc\n".to_string()),
        Just("    tokenFile: @DIR@/missing\n".to_string()),
        Just("    client-key-data: null\n".to_string()),
    ]
}

proptest! {
    #![proptest_config(cfg(256))]

    #[test]
    fn kubeconfig_arbitrary(text in hostile_text()) {
        let _ = run_kubeconfig(text, Vec::new());
    }

    #[test]
    fn kubeconfig_mutations(muts in mutations()) {
        let _ = run_kubeconfig(mutate(&valid_kubeconfig(), &muts), Vec::new());
    }

    /// Structured users: usable only with a matching, valid cert+key pair, or with a token and
    /// no client certificate at all.
    #[test]
    fn kubeconfig_users(
        lines in prop::collection::btree_map(0u8..4, user_line(), 0..4),
        junk in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let user: String = lines.values().cloned().collect();
        let set: String = lines.values().filter(|l| !l.ends_with(": null\n")).cloned().collect();
        let files = vec![
            ("cert.pem".to_string(), PAIR.cert.clone()),
            ("key.pem".to_string(), PAIR.key.clone()),
            ("junk".to_string(), String::from_utf8_lossy(&junk).into_owned()),
        ];
        let text = kubeconfig_with(&user);
        let r = run_kubeconfig(text.clone(), files);
        let has_cert = set.contains("client-certificate");
        let has_key = set.contains("client-key");
        if r.is_ok() {
            if has_cert || has_key {
                // The only valid pair there is.
                prop_assert!(has_cert && has_key, "{text}");
            } else {
                prop_assert!(user.contains("token"), "no credentials but usable: {text}");
            }
        }
    }
}

#[test]
fn kubeconfig_valid_is_usable() {
    assert_eq!(run_kubeconfig(valid_kubeconfig(), Vec::new()), Ok(()));
}

// ---------------------------------------------------------------------------------------------
// $(VAR) expansion

/// Upstream's expansion (third_party/forked/golang/expansion), written differently: `$$` is
/// `$`, `$(name)` is the variable's value when defined and itself otherwise, an unterminated
/// `$(` and any other `$x` stay as written.
fn reference_expand(input: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(next) = after.strip_prefix('$') {
            out.push('$');
            rest = next;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(close) = inner.find(')')
        {
            let name = &inner[..close];
            match vars.get(name) {
                Some(v) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn var_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["A", "B", "C", "", "$", "(", "A B", "é"])
            .prop_map(str::to_string),
        "[A-Z_]{1,3}",
    ]
}

/// Text built from references to the variables above, `$`, `$$`, parentheses and junk.
fn expand_input() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        var_name().prop_map(|n| format!("$({n})")),
        prop::sample::select(vec![
            "$", "$$", "$$$", "(", ")", "$(", "$)", "x", " ", "é", "$é"
        ])
        .prop_map(str::to_string),
        "\\PC{0,5}",
    ];
    prop_oneof![
        4 => prop::collection::vec(piece, 0..40).prop_map(|v| v.concat()),
        1 => any::<String>(),
    ]
}

proptest! {
    #![proptest_config(cfg(400))]

    /// Same result as upstream; the output grows by at most the budget.
    #[test]
    fn expand_matches_reference(
        input in expand_input(),
        vars in prop::collection::btree_map(var_name(), expand_input(), 0..6),
    ) {
        let mut budget = ExpandBudget::default();
        let out = expand(&input, &vars, &mut budget).expect("small inputs fit the budget");
        prop_assert_eq!(&out, &reference_expand(&input, &vars), "input {:?}", input);
        prop_assert!(out.len() <= input.len() + MAX_EXPANSION_BYTES);
    }

    /// Escaping every `$` as `$$` gives back the text, whatever the variables.
    #[test]
    fn expand_escape_round_trip(
        text in expand_input(),
        vars in prop::collection::btree_map(var_name(), expand_input(), 0..4),
    ) {
        let escaped = text.replace('$', "$$");
        let out = expand(&escaped, &vars, &mut ExpandBudget::default()).unwrap();
        prop_assert_eq!(out, text);
    }

    /// Variables defined in order from the ones before them (as the kubelet builds a
    /// container's env), each doubling the last: the shared budget stops the growth with an
    /// error, and nothing larger than the budget is ever produced.
    #[test]
    fn expand_self_referencing_chains(
        fan in 2usize..16,
        depth in 1usize..40,
        seed in "\\PC{1,64}",
        self_ref in any::<bool>(),
    ) {
        let mut vars = BTreeMap::new();
        let mut budget = ExpandBudget::default();
        let mut total_in = 0usize;
        let mut total_out = 0usize;
        vars.insert("V0".to_string(), seed.clone());
        for i in 1..=depth {
            let prev = if self_ref { format!("$(V{i})") } else { format!("$(V{})", i - 1) };
            let value = prev.repeat(fan) + "$$(V0)";
            total_in += value.len();
            let (r, left) = bounded("expand", {
                let (value, vars) = (value.clone(), vars.clone());
                move || {
                    let mut b = budget;
                    let r = expand(&value, &vars, &mut b);
                    (r, b)
                }
            });
            budget = left;
            match r {
                Ok(out) => {
                    total_out += out.len();
                    if self_ref {
                        // Not defined yet: stays as written; `$$` is unescaped.
                        prop_assert_eq!(&out, &(prev.repeat(fan) + "$(V0)"));
                    }
                    vars.insert(format!("V{i}"), out);
                }
                Err(e) => {
                    prop_assert!(e.0.contains("$(V"), "the error names the variable: {}", e.0);
                    break;
                }
            }
            prop_assert!(total_out <= total_in + MAX_EXPANSION_BYTES);
        }
    }
}

/// The budget is shared: doubling variables fail before 2 MiB of output, quickly.
#[test]
fn expand_doubling_hits_the_budget() {
    let mut vars = BTreeMap::new();
    vars.insert("A0".to_string(), "x".repeat(1024));
    let mut budget = ExpandBudget::default();
    let mut produced = 0usize;
    let mut err = None;
    for i in 1..40 {
        let input = format!("$(A{})$(A{})", i - 1, i - 1);
        match expand(&input, &vars, &mut budget) {
            Ok(v) => {
                produced += v.len();
                vars.insert(format!("A{i}"), v);
            }
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let err = err.expect("doubling must run out of budget");
    assert!(produced <= MAX_EXPANSION_BYTES, "{produced}");
    assert!(err.0.contains("$(A"), "{}", err.0);
}

// ---------------------------------------------------------------------------------------------
// CVE-2019-11253: YAML alias bombs ("billion laughs") in the files the kubelet parses

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

/// The KubeletConfiguration file (`--config`) with a bomb in a free-form field: refused
/// within the deadline, never expanded.
#[test]
fn cve_2019_11253_kubelet_config_alias_bomb_is_refused() {
    let text = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfeatureGates: {}\n",
        billion_laughs()
    );
    let r = bounded("kubelet config bomb", move || {
        kubelet::config::parse_file("/var/lib/kubelet/config.yaml", &text).map(|_| ())
    });
    let e = r.expect_err("a billion laughs is not a configuration");
    assert!(!e.to_string().is_empty());
}

/// The kubeconfig (`--kubeconfig`, `--bootstrap-kubeconfig`) with a bomb in an extension:
/// refused within the deadline.
#[test]
fn cve_2019_11253_kubeconfig_alias_bomb_is_refused() {
    let text = format!(
        "{}extensions:\n- name: x\n  extension: {}\n",
        valid_kubeconfig(),
        billion_laughs()
    );
    let r = bounded("kubeconfig bomb", move || {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, &text).unwrap();
        kubelet::certs::bootstrap::check_kubeconfig(&path).map_err(|e| e.to_string())
    });
    assert!(r.is_err(), "a billion laughs is not a kubeconfig");
}

/// A static pod manifest with the bomb in its annotations, and a JSON manifest nested deeper
/// than any pod (the JSON form has no aliases; its depth is what costs): both refused within
/// the deadline.
#[test]
fn cve_2019_11253_static_manifest_bombs_are_refused() {
    let text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  annotations: {}\nspec:\n  containers:\n  - name: c\n    image: busybox\n",
        billion_laughs()
    );
    let r = bounded("manifest bomb", move || {
        parse_manifest(Path::new("/etc/kubernetes/manifests/x.yaml"), &text, NODE).map(|_| ())
    });
    assert!(r.is_err(), "a billion laughs is not a pod");
    let deep = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"web\",\"annotations\":{}{}}}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let r = bounded("deep JSON manifest", move || {
        parse_manifest(Path::new("/etc/kubernetes/manifests/x.json"), &deep, NODE).map(|_| ())
    });
    assert!(r.is_err(), "100000 nested arrays are not a pod");
}
