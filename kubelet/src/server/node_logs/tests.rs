use super::*;

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
            assert!(html.contains("<a href=\"journal/\">journal/</a>"), "{html}");
            assert!(html.contains("<a href=\"syslog\">syslog</a>"), "{html}");
            assert!(html.contains("<a href=\"a&lt;b\">a&lt;b</a>"), "{html}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(resolve(&root, "/journal"), Resolved::Redirect(to) if to == "journal/"));
    assert!(matches!(resolve(&root, "/journal/"), Resolved::Listing(_)));
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
