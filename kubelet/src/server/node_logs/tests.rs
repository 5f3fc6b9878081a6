use super::*;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

fn rig() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("log");
    std::fs::create_dir_all(root.join("journal")).unwrap();
    std::fs::write(root.join("syslog"), "node log\n").unwrap();
    std::fs::write(root.join("a<b"), "").unwrap();
    std::fs::write(d.path().join("secret"), "outside\n").unwrap();
    std::os::unix::fs::symlink(d.path().join("secret"), root.join("escape")).unwrap();
    std::os::unix::fs::symlink(root.join("syslog"), root.join("inside")).unwrap();
    d
}

fn read(r: Resolved) -> String {
    match r {
        Resolved::File(mut f) => {
            let mut s = String::new();
            f.read_to_string(&mut s).unwrap();
            s
        }
        other => panic!("expected a file, got {other:?}"),
    }
}

#[test]
fn serves_files_and_listings_beneath_the_directory() {
    let d = rig();
    let root = d.path().join("log");
    assert_eq!(read(resolve(&root, "/syslog")), "node log\n");
    assert_eq!(read(resolve(&root, "/inside")), "node log\n");
    assert_eq!(read(resolve(&root, "/./syslog")), "node log\n");
    match resolve(&root, "/") {
        Resolved::Listing(html) => {
            assert!(
                html.contains("<a href=\"./journal/\">journal/</a>"),
                "{html}"
            );
            assert!(html.contains("<a href=\"./syslog\">syslog</a>"), "{html}");
            assert!(html.contains("<a href=\"./a%3Cb\">a&lt;b</a>"), "{html}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(resolve(&root, "/journal"), Resolved::Redirect(to) if to == "journal/"));
    assert!(matches!(resolve(&root, "/journal/"), Resolved::Listing(_)));
}

#[test]
fn crafted_file_names_in_a_listing_stay_relative_links_without_markup() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("log");
    std::fs::create_dir_all(&root).unwrap();
    for name in [
        "javascript:alert(1)",
        "\"><img src=x onerror=alert(1)>",
        "x?y#z",
        "a&b'c",
    ] {
        std::fs::write(root.join(name), "").unwrap();
    }
    let Resolved::Listing(html) = resolve(&root, "/") else {
        panic!("a listing");
    };
    let hrefs: Vec<&str> = html
        .split("href=\"")
        .skip(1)
        .map(|rest| &rest[..rest.find('"').unwrap()])
        .collect();
    assert_eq!(hrefs.len(), 4, "{html}");
    for h in &hrefs {
        assert!(h.starts_with("./"), "a link relative to the listing: {h}");
        assert!(
            !h[2..].contains([':', '<', '>', '"', '?', '#', '&', '\'']),
            "percent-encoded: {h}"
        );
    }
    assert!(
        html.contains("<a href=\"./javascript%3Aalert%281%29\">javascript:alert(1)</a>"),
        "{html}"
    );
    assert!(!html.contains("<img"), "{html}");
    assert!(
        html.contains("&#34;&gt;&lt;img src=x onerror=alert(1)&gt;</a>"),
        "the name is shown, escaped: {html}"
    );
    // The encoded link leads back to the file.
    assert!(matches!(
        resolve(&root, "/javascript%3Aalert%281%29"),
        Resolved::File(_)
    ));
}

#[test]
fn traversal_and_escapes_are_refused() {
    let d = rig();
    let root = d.path().join("log");
    for bad in [
        "/../secret",
        "/journal/../../secret",
        "/%2e%2e/secret",
        "/..",
        "/..\\secret",
    ] {
        assert!(matches!(resolve(&root, bad), Resolved::Invalid), "{bad}");
    }
    // A symlink out of the directory is as good as absent.
    assert!(matches!(resolve(&root, "/escape"), Resolved::NotFound));
    assert!(matches!(resolve(&root, "/missing"), Resolved::NotFound));
}

/// What `resolve` served for `url`, or None when it served no file.
fn served(root: &Path, url: &str) -> Option<String> {
    match resolve(root, url) {
        Resolved::File(mut f) => {
            let mut s = String::new();
            f.read_to_string(&mut s).ok()?;
            Some(s)
        }
        _ => None,
    }
}

/// A directory of the log directory swapped for a symlink out between the kubelet's check
/// and its open (a pod with a hostPath on /var/log can do it) never gets a file outside
/// served.
#[test]
fn a_directory_swapped_for_a_symlink_out_mid_request_serves_nothing_outside() {
    use crate::fs_at::race::{Swapper, race};
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("log");
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::write(root.join("d/f"), "inside").unwrap();
    std::fs::create_dir(d.path().join("outside")).unwrap();
    std::fs::write(d.path().join("outside/f"), "SECRET").unwrap();
    std::os::unix::fs::symlink(d.path().join("outside"), root.join("x")).unwrap();
    let swapper = Swapper::start(&root, "d", "x");
    let mut inside = 0;
    let leaked = race(200_000, Duration::from_secs(8), || {
        match served(&root, "/d/f").as_deref() {
            Some("inside") => inside += 1,
            Some(other) => return Some(other.to_string()),
            None => {}
        }
        None
    });
    let swaps = swapper.stop();
    assert_eq!(leaked, None, "a file outside the log directory was served");
    assert!(
        swaps > 0 && inside > 0,
        "the race did not run: {swaps} swaps, {inside} reads"
    );
}

/// A FIFO planted in the log directory: the request answers 404 at once instead of holding a
/// blocking-pool thread forever (nobody ever writes to it).
#[test]
fn a_fifo_in_the_log_directory_does_not_hang_the_request() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("log");
    std::fs::create_dir(&root).unwrap();
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let r2 = root.clone();
    std::thread::spawn(move || {
        let _ = tx.send(matches!(resolve(&r2, "/fifo"), Resolved::NotFound));
    });
    let answer = rx.recv_timeout(Duration::from_secs(5));
    if answer.is_err() {
        // Release the stuck reader before failing.
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(root.join("fifo"));
    }
    assert_eq!(
        answer,
        Ok(true),
        "the FIFO blocked the request or was served"
    );
}

/// A device node planted in the log directory (a container with CAP_MKNOD can make one) is
/// not opened, so not served: 404.
#[test]
fn a_device_node_in_the_log_directory_is_not_served() {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("log");
    std::fs::create_dir(&root).unwrap();
    let dev = root.join("null");
    if let Err(e) = mknod(
        &dev,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o644),
        makedev(1, 3),
    ) {
        eprintln!("skipped: cannot make a device node here ({e}); needs CAP_MKNOD");
        return;
    }
    assert!(matches!(resolve(&root, "/null"), Resolved::NotFound));
    // Listed (as Go's file server lists it), but not served.
    assert!(matches!(resolve(&root, "/"), Resolved::Listing(h) if h.contains("null")));
}

/// Symlinks that leave the directory, whatever their form, are as good as absent; symlinks
/// that stay inside are followed.
#[test]
fn symlinks_out_in_every_form_are_refused() {
    use std::os::unix::fs::symlink;
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("log");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/ok"), "ok").unwrap();
    std::fs::write(d.path().join("secret"), "SECRET").unwrap();
    symlink(d.path().join("secret"), root.join("abs")).unwrap();
    symlink("../secret", root.join("rel")).unwrap();
    symlink("../../secret", root.join("sub/deep")).unwrap();
    symlink(d.path(), root.join("outdir")).unwrap();
    symlink("..", root.join("up")).unwrap();
    symlink("/proc/self/root/etc/hostname", root.join("magic")).unwrap();
    symlink("sub/ok", root.join("in")).unwrap();
    for bad in [
        "/abs",
        "/rel",
        "/sub/deep",
        "/outdir/secret",
        "/up/secret",
        "/magic",
    ] {
        assert_eq!(served(&root, bad), None, "{bad}");
    }
    assert!(matches!(resolve(&root, "/outdir/"), Resolved::NotFound));
    assert_eq!(served(&root, "/in").as_deref(), Some("ok"));
    assert_eq!(served(&root, "/sub/ok").as_deref(), Some("ok"));
}
