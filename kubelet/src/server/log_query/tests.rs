use super::*;

fn p(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn query(pairs: &[(&str, &str)]) -> Query {
    parse(&p(pairs)).unwrap().unwrap()
}

#[test]
fn parsing_sorts_services_files_and_options_as_upstream() {
    assert_eq!(parse(&p(&[])), Ok(None));
    assert_eq!(parse(&p(&[("other", "x")])), Ok(None));
    let q = query(&[
        ("query", "kubelet"),
        ("query", "/syslog"),
        ("query", "  "),
        ("tailLines", "5"),
    ]);
    assert_eq!(q.services, ["kubelet"]);
    assert_eq!(q.files, ["/syslog"]);
    assert_eq!(q.tail_lines, Some(5));
    assert_eq!(
        parse(&p(&[("query", "  ")])).unwrap_err(),
        r#"query: Invalid value: []string{"  "}: query cannot be empty"#
    );
    assert_eq!(
        parse(&p(&[("sinceTime", "yesterday"), ("tailLines", "x")])).unwrap_err(),
        r#"[sinceTime: Invalid value: "yesterday": invalid time format, tailLines: Invalid value: "x": strconv.Atoi: parsing "x": invalid syntax]"#
    );
    // Options alone parse; validation then refuses them.
    assert_eq!(query(&[("boot", "-1")]).boot, Some(-1));
}

#[test]
fn validation_refuses_what_upstream_refuses() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("syslog"), "x").unwrap();
    let v = |pairs: &[(&str, &str)]| validate(&query(pairs), d.path());
    assert_eq!(v(&[("query", "kubelet")]), Ok(()));
    assert_eq!(v(&[("query", "/syslog")]), Ok(()));
    assert_eq!(
        v(&[("tailLines", "3")]).unwrap_err(),
        "query: Required value: cannot be empty with options"
    );
    assert_eq!(
        v(&[("query", "a"), ("query", "b/c")]).unwrap_err(),
        r#"query: Invalid value: "[b/c], [a]": cannot specify a file and service"#
    );
    assert_eq!(
        v(&[("query", "/syslog"), ("tailLines", "1")]).unwrap_err(),
        r#"query: Invalid value: []string{"/syslog"}: cannot specify file with options"#
    );
    assert!(
        v(&[("query", "/missing")])
            .unwrap_err()
            .contains("no such file or directory")
    );
    assert_eq!(
        v(&[("query", "kubelet"), ("boot", "1")]).unwrap_err(),
        "boot: Invalid value: 1: must be less than 1"
    );
    assert_eq!(
        v(&[("query", "kubelet"), ("tailLines", "100001")]).unwrap_err(),
        "tailLines: Invalid value: 100001: must be between 0 and 100000, inclusive"
    );
    assert!(
        v(&[("query", "kubelet"), ("pattern", "(unclosed")])
            .unwrap_err()
            .starts_with(r#"pattern: Invalid value: "(unclosed": error parsing regexp"#)
    );
    assert_eq!(
        v(&[
            ("query", "kubelet"),
            ("sinceTime", "2026-01-02T00:00:00Z"),
            ("untilTime", "2026-01-01T00:00:00Z")
        ])
        .unwrap_err(),
        "untilTime: Invalid value: 2026-01-01 00:00:00 +0000 UTC: must be after `sinceTime`"
    );
    let five: Vec<(&str, &str)> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|s| ("query", *s))
        .collect();
    assert_eq!(
        v(&five).unwrap_err(),
        "query: Too many: 5: must have at most 4 items"
    );
}

/// Hostile service names never reach journalctl: shell syntax, option injection, paths,
/// unit globs and oversize names are refused by validation.
#[test]
fn hostile_service_names_are_refused() {
    let d = tempfile::tempdir().unwrap();
    for bad in [
        "kubelet;id",
        "$(id)",
        "--output=json",
        "kubelet.service",
        "*",
        "a b",
        "kub\u{e9}let",
        "x\n--unit=ssh",
    ] {
        let e = validate(&query(&[("query", bad)]), d.path())
            .err()
            .unwrap_or_else(|| panic!("{bad:?} passed"));
        assert!(
            e.ends_with("input contains unsupported characters"),
            "{bad:?}: {e}"
        );
    }
    // A leading dash is a legal name upstream; it stays inside one `--unit=` argument.
    let q = query(&[("query", "-o")]);
    assert_eq!(validate(&q, d.path()), Ok(()));
    assert!(journal_args(&q, &q.services).contains(&"--unit=-o".to_string()));
    let long = "a".repeat(MAX_SERVICE_LENGTH + 1);
    let e = validate(&query(&[("query", &long)]), d.path()).unwrap_err();
    assert!(e.ends_with("length must be less than 100"), "{e}");
}

#[test]
fn journal_arguments_as_upstream() {
    let q = query(&[
        ("query", "kubelet"),
        ("sinceTime", "2026-09-24T03:02:03+02:00"),
        ("untilTime", "2026-09-24T11:00:00Z"),
        ("tailLines", "5"),
        ("pattern", "E[0-9]+ -x"),
        ("boot", "-1"),
    ]);
    assert_eq!(
        journal_args(&q, &q.services),
        [
            "--utc",
            "--no-pager",
            "--since=2026-9-24 1:2:3",
            "--until=2026-9-24 11:0:0",
            "--pager-end",
            "--lines=5",
            "--unit=kubelet",
            "--grep=E[0-9]+ -x",
            "--boot",
            "-1",
            "--output=short-precise",
        ]
    );
}

#[test]
fn queried_files_stay_beneath_the_directory() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("log");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(d.path().join("secret"), "s").unwrap();
    std::os::unix::fs::symlink(d.path().join("secret"), root.join("escape")).unwrap();
    std::fs::write(root.join("ok"), "x").unwrap();
    assert!(file_beneath(&root, "/ok").is_ok());
    assert!(file_beneath(&root, "/escape").is_err());
    // `..` elements are dropped: they cannot climb out.
    assert!(file_beneath(&root, "/../secret").is_err());
    assert_eq!(service_files("crio"), ["crio", "crio.log", "crio/crio.log"]);
}

/// Everything `copy_service_files` sent for `service`, as text.
fn service_output(root: &Path, service: &str) -> String {
    let (tx, mut rx) = mpsc::channel(64);
    copy_service_files(root, service, &tx, Instant::now() + DEADLINE);
    drop(tx);
    let mut out = Vec::new();
    while let Ok(b) = rx.try_recv() {
        out.extend_from_slice(&b);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The file fallback for a service (`<svc>/<svc>.log`) with `<svc>` swapped for a symlink
/// out between the check and the open never sends a file from outside the directory.
#[test]
fn a_service_directory_swapped_for_a_symlink_out_sends_nothing_outside() {
    use crate::fs_at::race::{Swapper, race};
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("log");
    std::fs::create_dir_all(root.join("svc")).unwrap();
    std::fs::write(root.join("svc/svc.log"), "inside").unwrap();
    std::fs::create_dir(d.path().join("outside")).unwrap();
    std::fs::write(d.path().join("outside/svc.log"), "SECRET").unwrap();
    std::os::unix::fs::symlink(d.path().join("outside"), root.join("x")).unwrap();
    let swapper = Swapper::start(&root, "svc", "x");
    let mut inside = 0;
    let leaked = race(100_000, Duration::from_secs(8), || {
        let out = service_output(&root, "svc");
        if out.contains("SECRET") {
            return Some(out);
        }
        inside += usize::from(out == "inside");
        None
    });
    let swaps = swapper.stop();
    assert_eq!(leaked, None, "a file outside the log directory was sent");
    assert!(
        swaps > 0 && inside > 0,
        "the race did not run: {swaps} swaps, {inside} reads"
    );
}

/// A FIFO named like a service's log answers "log not found" at once rather than holding a
/// blocking thread (and the whole answer) until the deadline or forever.
#[test]
fn a_fifo_named_like_a_service_log_does_not_hang_the_query() {
    use std::os::unix::fs::OpenOptionsExt;
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("log");
    std::fs::create_dir(&root).unwrap();
    nix::unistd::mkfifo(
        &root.join("svc"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let r2 = root.clone();
    std::thread::spawn(move || {
        let _ = tx.send(service_output(&r2, "svc"));
    });
    let answer = rx.recv_timeout(Duration::from_secs(5));
    if answer.is_err() {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(root.join("svc"));
    }
    assert_eq!(answer.as_deref(), Ok("\nlog not found for svc\n"));
}

/// The queried file is checked the same race-free way: symlinks out in every form are "no
/// such file", with upstream's message shape.
#[test]
fn queried_files_through_symlinks_out_are_refused() {
    use std::os::unix::fs::symlink;
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("log");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(d.path().join("secret"), "s").unwrap();
    symlink("../secret", root.join("rel")).unwrap();
    symlink("../../secret", root.join("sub/deep")).unwrap();
    symlink(d.path(), root.join("outdir")).unwrap();
    for bad in ["/rel", "/sub/deep", "/outdir/secret"] {
        let e = file_beneath(&root, bad).unwrap_err();
        assert!(e.ends_with("no such file or directory"), "{bad}: {e}");
    }
}

/// Upstream gzips a services answer when `Accept-Encoding` is exactly `gzip` (fastest
/// level, `Content-Encoding: gzip`); anything else gets plain text.
#[tokio::test]
async fn a_services_answer_is_gzipped_when_asked_exactly_as_upstream() {
    use axum::http::{HeaderMap, HeaderValue};
    use http_body_util::BodyExt;
    let d = tempfile::tempdir().unwrap();
    let journal = || -> Arc<dyn Journal> {
        Arc::new(crate::server::journal::fake::FakeJournal {
            units: Some("kubelet.service\n".into()),
            output: "journal line\n".repeat(1000),
            ..Default::default()
        })
    };
    let mut h = HeaderMap::new();
    assert!(!wants_gzip(&h));
    for (v, want) in [("gzip", true), ("gzip, deflate", false), ("br", false)] {
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static(v));
        assert_eq!(wants_gzip(&h), want, "{v}");
    }
    let q = query(&[("query", "kubelet")]);
    let r = serve_services(q.clone(), d.path().into(), journal(), true);
    assert_eq!(r.headers()[header::CONTENT_ENCODING], "gzip");
    assert_eq!(
        r.headers()[header::CONTENT_TYPE],
        "text/plain;charset=UTF-8"
    );
    let body = r.into_body().collect().await.unwrap().to_bytes();
    let mut text = String::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_string(&mut text)
        .unwrap();
    assert_eq!(text, "journal line\n".repeat(1000));
    assert!(body.len() < text.len() / 10, "{} bytes", body.len());
    let r = serve_services(q, d.path().into(), journal(), false);
    assert!(r.headers().get(header::CONTENT_ENCODING).is_none());
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "journal line\n".repeat(1000).as_bytes());
}
