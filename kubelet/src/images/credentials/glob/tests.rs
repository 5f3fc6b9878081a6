use super::*;

// Go's documented `filepath.Match` behaviour on Linux (the cases of its own tests): pattern,
// text, match; a malformed pattern matches nothing.
#[test]
fn matches_as_go_filepath_match() {
    let cases = [
        ("abc", "abc", true),
        ("*", "abc", true),
        ("*c", "abc", true),
        ("a*", "a", true),
        ("a*", "abc", true),
        ("a*", "ab/c", false),
        ("a*/b", "abc/b", true),
        ("a*/b", "a/c/b", false),
        ("a*b*c*d*e*/f", "axbxcxdxe/f", true),
        ("a*b*c*d*e*/f", "axbxcxdxexxx/f", true),
        ("a*b*c*d*e*/f", "axbxcxdxe/xxx/f", false),
        ("a*b*c*d*e*/f", "axbxcxdxexxx/fff", false),
        ("a*b?c*x", "abxbbxdbxebxczzx", true),
        ("a*b?c*x", "abxbbxdbxebxczzy", false),
        ("ab[c]", "abc", true),
        ("ab[b-d]", "abc", true),
        ("ab[e-g]", "abc", false),
        ("ab[^c]", "abc", false),
        ("ab[^b-d]", "abc", false),
        ("ab[^e-g]", "abc", true),
        ("a\\*b", "a*b", true),
        ("a\\*b", "ab", false),
        ("a?b", "a☺b", true),
        ("a[^a]b", "a☺b", true),
        ("a???b", "a☺b", false),
        ("a[^a][^a][^a]b", "a☺b", false),
        ("[a-ζ]*", "α", true),
        ("*[a-ζ]", "A", false),
        ("a?b", "a/b", false),
        ("a*b", "a/b", false),
        ("[\\]a]", "]", true),
        ("[\\-]", "-", true),
        ("[x\\-]", "x", true),
        ("[x\\-]", "-", true),
        ("[x\\-]", "z", false),
        ("[\\-x]", "x", true),
        ("[\\-x]", "-", true),
        ("[\\-x]", "a", false),
        ("*x", "xxx", true),
        ("[*]", "*", true),
        ("a*[*]", "ab*", true),
        ("", "", true),
        ("", "a", false),
        ("**c", "abc", true),
        ("a**", "a", true),
    ];
    for (pattern, text, want) in cases {
        assert!(Glob::new(pattern).is_ok(), "{pattern:?} is a valid pattern");
        assert_eq!(matches(pattern, text), want, "{pattern:?} vs {text:?}");
    }
}

#[test]
fn malformed_patterns_match_nothing() {
    let cases = [
        ("[]a]", "]"),
        ("[-]", "-"),
        ("[x-]", "x"),
        ("[x-]", "-"),
        ("[-x]", "x"),
        ("\\", "a"),
        ("[a-b-c]", "a"),
        ("[", "a"),
        ("[^", "a"),
        ("[^bc", "a"),
        ("a[", "a"),
        ("a[", "ab"),
        ("a[", "x"),
        ("a/b[", "x"),
        // Go checks the rest of the pattern even after the text decided the answer.
        ("*[", "x"),
        ("x*[", "xy"),
        ("y*[", "xy"),
    ];
    for (pattern, text) in cases {
        assert_eq!(Glob::new(pattern), Err(BadPattern), "{pattern:?}");
        assert!(!matches(pattern, text), "{pattern:?} vs {text:?}");
    }
}

/// Runs `f` on a thread and fails when it has not returned within `limit` (a matcher that
/// backtracks over every split of a star run never returns).
fn within<T: Send + 'static>(
    limit: std::time::Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("the match did not return within {limit:?}"))
}

// Issue 37.1: a pull secret key of 2,000 stars then `x.io` froze the worker thread that
// matched it against `docker.io`; runs of stars count as one.
#[test]
fn a_run_of_two_thousand_stars_returns_at_once() {
    let limit = std::time::Duration::from_secs(2);
    let stars = "*".repeat(2000);
    let label = format!("{stars}x");
    assert!(!within(limit, move || matches(&label, "docker")));
    let label = format!("{stars}r");
    assert!(within(limit, move || matches(&label, "docker")));
    let key = format!("{stars}x.io");
    assert!(!within(limit, move || {
        crate::images::credentials::urls_match(&key, "docker.io/library/busybox")
    }));
    // Stars between literals, each run far longer than the text.
    let label = format!("{stars}a{stars}b{stars}c{stars}z");
    let text = "ab".repeat(30) + "c";
    assert!(!within(limit, move || matches(&label, &text)));
}

/// The matcher before issue 37.1 (recursive, every split of every star), kept for the bench.
fn recursive(pattern: &[char], text: &[char]) -> bool {
    match pattern.first() {
        None => text.is_empty(),
        Some('*') => (0..=text.len()).any(|i| recursive(&pattern[1..], &text[i..])),
        Some('?') => !text.is_empty() && recursive(&pattern[1..], &text[1..]),
        Some(p) => text.first() == Some(p) && recursive(&pattern[1..], &text[1..]),
    }
}

/// What an ordinary key costs to match, per host label pair, before and after: run with
/// `cargo test -p kubelet --lib glob::tests::bench -- --ignored --nocapture` (add
/// `--release` for release figures).
#[test]
#[ignore = "bench: prints ns per match"]
fn bench_ordinary_label_matches() {
    let pairs = [
        ("*", "prefix"),
        ("docker", "docker"),
        ("registry-1", "registry-1"),
        ("*-good", "prefix-good"),
        ("gcr", "quay"),
        ("*", "123456789012"),
    ];
    let rounds = 200_000;
    let time = |f: &dyn Fn(&str, &str) -> bool| {
        let t = std::time::Instant::now();
        let mut hits = 0;
        for _ in 0..rounds {
            for (p, s) in pairs {
                hits += usize::from(f(std::hint::black_box(p), std::hint::black_box(s)));
            }
        }
        (
            t.elapsed().as_nanos() as f64 / (rounds * pairs.len()) as f64,
            hits,
        )
    };
    let (old, old_hits) = time(&|p, s| {
        let p: Vec<char> = p.chars().collect();
        let s: Vec<char> = s.chars().collect();
        recursive(&p, &s)
    });
    let (new, new_hits) = time(&|p, s| matches(p, s));
    assert_eq!(old_hits, new_hits);
    println!("ordinary label match: before {old:.0} ns, after {new:.0} ns");
    let key = "*.dkr.ecr.*.amazonaws.com";
    let target = "123456789012.dkr.ecr.us-east-1.amazonaws.com/app";
    let t = std::time::Instant::now();
    for _ in 0..rounds {
        assert!(crate::images::credentials::urls_match(
            std::hint::black_box(key),
            std::hint::black_box(target)
        ));
    }
    println!(
        "urls_match({key:?}, {target:?}): {:.0} ns",
        t.elapsed().as_nanos() as f64 / rounds as f64
    );
    // A keyring of ordinary keys, looked up as a pull does (keys compiled once).
    let mut k = crate::images::credentials::Keyring::default();
    let config = [
        "*.docker.io",
        "gcr.io",
        "quay.io/team",
        key,
        "registry.example.com:5000",
    ]
    .map(|l| crate::images::credentials::ConfigEntry {
        location: l.to_string(),
        auth: crate::runtime::ImageAuth::default(),
        hash: String::new(),
    })
    .to_vec();
    k.add(config);
    // Before: each key and the target parsed, and each label matched recursively, per key.
    let keys = [
        "registry.example.com:5000",
        "quay.io/team",
        "gcr.io",
        key,
        "*.docker.io",
    ];
    let old_lookup = |target: &str| {
        keys.iter()
            .filter(|g| {
                let (Some(g), Some(t)) = (
                    crate::images::credentials::parse_location(g),
                    crate::images::credentials::parse_location(target),
                ) else {
                    return false;
                };
                g.port == t.port
                    && g.host_parts.len() == t.host_parts.len()
                    && t.path.starts_with(&g.path)
                    && g.host_parts.iter().zip(&t.host_parts).all(|(gp, tp)| {
                        let gp: Vec<char> = gp.chars().collect();
                        let tp: Vec<char> = tp.chars().collect();
                        recursive(&gp, &tp)
                    })
            })
            .count()
    };
    let t = std::time::Instant::now();
    for _ in 0..rounds / 10 {
        assert_eq!(old_lookup(std::hint::black_box(target)), 1);
    }
    println!(
        "keyring lookup before, 5 ordinary keys: {:.0} ns",
        t.elapsed().as_nanos() as f64 / (rounds / 10) as f64
    );
    let t = std::time::Instant::now();
    for _ in 0..rounds / 10 {
        assert_eq!(k.lookup_tracked(std::hint::black_box(target)).len(), 1);
    }
    println!(
        "keyring lookup after, 5 ordinary keys: {:.0} ns",
        t.elapsed().as_nanos() as f64 / (rounds / 10) as f64
    );
}
