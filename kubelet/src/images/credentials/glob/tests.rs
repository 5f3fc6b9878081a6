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
