use super::*;
use crate::runtime::{Container, ContainerState};
use std::os::unix::fs::symlink;

const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn labels(pod: &str, ns: &str, container: &str) -> BTreeMap<String, String> {
    [
        (LABEL_POD_NAME, pod),
        (LABEL_POD_NAMESPACE, ns),
        (LABEL_CONTAINER_NAME, container),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn ctr(id: &str, state: ContainerState) -> Container {
    Container {
        id: id.into(),
        sandbox_id: "sb".into(),
        name: "app".into(),
        attempt: 0,
        image: String::new(),
        image_ref: String::new(),
        state,
        created_at: 0,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
    }
}

#[test]
fn the_name_is_upstreams_and_is_cut_to_255_bytes() {
    assert_eq!(
        link_name("web-node1", "kube-system", "app", ID).unwrap(),
        format!("web-node1_kube-system_app-{ID}.log")
    );
    let long_pod = "p".repeat(200);
    let name = link_name(&long_pod, "ns", "app", ID).unwrap();
    assert_eq!(name.len(), 255);
    let full = format!("{long_pod}_ns_app-{ID}");
    assert_eq!(name, format!("{}.log", &full[..251]));
    // The ID is read back as upstream does, whole or cut (at least 6 characters).
    assert_eq!(
        id_from_link_name(&link_name("web", "ns", "my-app", ID).unwrap()),
        Some(ID)
    );
    assert!(ID.starts_with(id_from_link_name(&name).unwrap()));
    assert_eq!(id_from_link_name("web_ns_app-abc12.log"), None);
    assert_eq!(id_from_link_name("web_ns_app-abcdef.txt"), None);
}

/// A static pod's name comes from a file: a name that is not a plain name (a path, `..`,
/// a NUL, a space, a non-ASCII letter, a `-` in the ID that would misplace the ID) makes
/// no link at all.
#[test]
fn names_that_are_not_plain_make_no_link() {
    for (pod, ns, c, id) in [
        ("../../etc/cron.d/x", "ns", "app", ID),
        ("web", "..", "app/../../x", ID),
        ("web", "ns", "app", "../../../etc/passwd"),
        ("web", "ns", "", ID),
        ("we b", "ns", "app", ID),
        ("web\0", "ns", "app", ID),
        ("wéb", "ns", "app", ID),
        ("web", "ns", "app", "abc-def0123"),
    ] {
        assert!(
            matches!(link_name(pod, ns, c, id), Err(LogError::LinkName { .. })),
            "{pod:?} {ns:?} {c:?} {id:?}"
        );
    }
}

#[tokio::test]
async fn created_on_start_and_removed_with_the_container() {
    let fs = Arc::new(FakeLinkDir::default());
    let links = Links::with("/links".into(), fs.clone());
    let log = PathBuf::from("/var/log/pods/ns_web_u1/app/0.log");
    let made = links
        .create("web", "ns", "app", ID, Some(log.clone()))
        .await
        .unwrap();
    let name = format!("web_ns_app-{ID}.log");
    assert_eq!(made, Some(PathBuf::from("/links").join(&name)));
    assert_eq!(fs.links.lock().unwrap()[&name], log);
    // No log path, or a log file that is not there: no link (it would only dangle).
    assert_eq!(
        links.create("web", "ns", "b", ID, None).await.unwrap(),
        None
    );
    let gone = PathBuf::from("/var/log/pods/ns_web_u1/c/0.log");
    fs.missing.lock().unwrap().insert(gone.clone());
    assert_eq!(
        links
            .create("web", "ns", "c", ID, Some(gone))
            .await
            .unwrap(),
        None
    );
    assert_eq!(fs.links.lock().unwrap().len(), 1);
    // Removal finds the name from the container's labels.
    links.remove(ID, &labels("web", "ns", "app")).await.unwrap();
    assert!(fs.links.lock().unwrap().is_empty());
    // Labels that make no name: nothing to remove, no error.
    links.remove(ID, &BTreeMap::new()).await.unwrap();
}

#[test]
fn dangling_links_go_unless_their_container_has_not_exited() {
    let dangling: Vec<String> = [
        "a_ns_app-aaaaaaaa1.log", // running: its log is being rotated
        "b_ns_app-bbbbbbbb2.log", // exited
        "c_ns_app-cccccccc3.log", // gone from the runtime
        "d_ns_app-dddd.log",      // no ID to read: goes, as upstream
        "e_ns_app-eeeeeee",       // cut ID of a created container
    ]
    .map(String::from)
    .into();
    let running = ctr("aaaaaaaa1", ContainerState::Running);
    let exited = ctr("bbbbbbbb2", ContainerState::Exited);
    let cut = ctr("eeeeeeeeeeeeeeee", ContainerState::Created);
    let mut cut_name = dangling.clone();
    cut_name[4] = "e_ns_app-eeeeeee.log".into();
    assert_eq!(
        links_to_remove(&cut_name, &[&running, &exited, &cut]),
        [
            "b_ns_app-bbbbbbbb2.log",
            "c_ns_app-cccccccc3.log",
            "d_ns_app-dddd.log"
        ]
    );
}

#[tokio::test]
async fn the_sweep_removes_dangling_links_but_not_those_of_live_containers() {
    let fs = Arc::new(FakeLinkDir::default());
    let links = Links::with("/links".into(), fs.clone());
    for (c, id) in [
        ("live", "aaaaaaaa1"),
        ("dead", "bbbbbbbb2"),
        ("ok", "cccccccc3"),
    ] {
        let log = PathBuf::from(format!("/logs/{c}/0.log"));
        links.create("p", "ns", c, id, Some(log)).await.unwrap();
    }
    for c in ["live", "dead"] {
        let log = PathBuf::from(format!("/logs/{c}/0.log"));
        fs.missing.lock().unwrap().insert(log);
    }
    let running = ctr("aaaaaaaa1", ContainerState::Running);
    let removed = links.sweep(&[&running]).await.unwrap();
    assert_eq!(removed, ["p_ns_dead-bbbbbbbb2.log"]);
    let left: Vec<String> = fs.links.lock().unwrap().keys().cloned().collect();
    assert_eq!(left, ["p_ns_live-aaaaaaaa1.log", "p_ns_ok-cccccccc3.log"]);
}

/// The real directory: a file or link planted at the name is replaced (a log shipper would
/// otherwise ship what it points at as the container's log), and the sweep removes only
/// dangling `*.log` symlinks.
#[tokio::test]
async fn on_disk_a_planted_entry_is_replaced_and_the_sweep_keeps_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("containers");
    let log = tmp.path().join("0.log");
    std::fs::write(&log, "hello\n").unwrap();
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, "s3cret\n").unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let name = format!("web_ns_app-{ID}.log");
    symlink(&secret, dir.join(&name)).unwrap();
    let links = Links::new(dir.clone());
    links
        .create("web", "ns", "app", ID, Some(log.clone()))
        .await
        .unwrap();
    assert_eq!(std::fs::read_link(dir.join(&name)).unwrap(), log);
    assert_eq!(std::fs::read_to_string(dir.join(&name)).unwrap(), "hello\n");

    std::fs::write(dir.join("plain_ns_app-aaaaaaaa1.log"), "a file").unwrap();
    symlink(
        tmp.path().join("nothing"),
        dir.join("gone_ns_app-bbbbbbbb2.log"),
    )
    .unwrap();
    symlink(tmp.path().join("nothing"), dir.join("other.txt")).unwrap();
    let removed = links.sweep(&[]).await.unwrap();
    assert_eq!(removed, ["gone_ns_app-bbbbbbbb2.log"]);
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["other.txt", "plain_ns_app-aaaaaaaa1.log", name.as_str()]
    );
    links.remove(ID, &labels("web", "ns", "app")).await.unwrap();
    assert!(!dir.join(&name).exists());
    assert!(secret.exists() && log.exists(), "only the link went");
}

/// The directory swapped for a symlink (a pod with a hostPath of /var/log could do it):
/// nothing is created, swept or removed where it points.
#[tokio::test]
async fn a_directory_swapped_for_a_symlink_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tmp.path().join("etc");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let dangling = elsewhere.join("x_ns_app-bbbbbbbb2.log");
    symlink(tmp.path().join("nothing"), &dangling).unwrap();
    let dir = tmp.path().join("containers");
    symlink(&elsewhere, &dir).unwrap();
    let log = tmp.path().join("0.log");
    std::fs::write(&log, "hello\n").unwrap();
    let links = Links::new(dir.clone());
    let err = links
        .create("web", "ns", "app", ID, Some(log))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("is a symlink: refused"), "{err}");
    assert!(links.sweep(&[]).await.is_err());
    assert!(links.remove(ID, &labels("web", "ns", "app")).await.is_err());
    let names: Vec<_> = std::fs::read_dir(&elsewhere)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [dangling.file_name().unwrap()], "untouched");
}
