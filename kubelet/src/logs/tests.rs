use super::*;
use crate::runtime::fake::FakeRuntime;
use crate::runtime::raw;
use std::io::Read;

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn plan_keeps_max_files_minus_two_and_compresses_them() {
    let rotated = names(&[
        "/l/0.log.20240103-000000",
        "/l/0.log.20240101-000000.gz",
        "/l/0.log.20240102-000000.gz",
        "/l/0.log.20240104-000000",
    ]);
    // 5 files: current + the one about to be rotated + 3 older.
    let p = plan(&rotated, 5);
    assert_eq!(p.remove, names(&["/l/0.log.20240101-000000.gz"]));
    assert_eq!(
        p.compress,
        names(&["/l/0.log.20240103-000000", "/l/0.log.20240104-000000"])
    );
    // 2 files: no rotated file stays.
    let p = plan(&rotated, 2);
    assert_eq!(p.remove.len(), 4);
    assert!(p.compress.is_empty());
}

#[test]
fn plan_removes_leftovers_of_an_interrupted_rotation() {
    let rotated = names(&[
        "/l/0.log.20240101-000000",
        "/l/0.log.20240101-000000.gz",
        "/l/0.log.20240102-000000.tmp",
    ]);
    let p = plan(&rotated, 5);
    assert_eq!(
        p.remove,
        names(&["/l/0.log.20240101-000000", "/l/0.log.20240102-000000.tmp"])
    );
    assert!(p.compress.is_empty());
}

#[test]
fn settings_default_and_validate_as_upstream() {
    let d = Settings::new(None, None, None, None).unwrap();
    assert_eq!(d, Settings::default());
    assert_eq!(d.max_size, 10 * 1024 * 1024);
    assert_eq!((d.max_files, d.max_workers), (5, 1));
    let s = Settings::new(Some("1Mi"), Some(3), Some(2), Some(Duration::from_secs(3))).unwrap();
    assert_eq!((s.max_size, s.max_files, s.max_workers), (1 << 20, 3, 2));
    assert!(
        !Settings::new(Some("-1"), None, None, None)
            .unwrap()
            .enabled()
    );
    assert_eq!(
        Settings::new(None, Some(1), None, None).unwrap_err(),
        "invalid MaxFiles 1, must be > 1"
    );
    assert!(
        Settings::new(Some("ten megs"), None, None, None)
            .unwrap_err()
            .starts_with("failed to parse container log max size \"ten megs\"")
    );
    assert_eq!(
        Settings::new(None, None, Some(0), None).unwrap_err(),
        "containerLogMaxWorkers must be greater than or equal to 1"
    );
    assert!(
        Settings::new(None, None, None, Some(Duration::from_secs(2)))
            .unwrap_err()
            .contains("greater than or equal to 3s")
    );
}

#[test]
fn rotated_name_uses_upstreams_format() {
    let t: jiff::Timestamp = "2024-03-05T07:08:09Z".parse().unwrap();
    let p = rotate::rotated_name(Path::new("/l/0.log"), t, &jiff::tz::TimeZone::UTC);
    assert_eq!(p, PathBuf::from("/l/0.log.20240305-070809"));
}

/// A fake runtime with one running container whose log is `<tmp>/<uid>/app/0.log`.
async fn rig(tmp: &Path) -> (Arc<FakeRuntime>, String, PathBuf) {
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image(raw::IMAGE);
    let sb = raw::sandbox(0, "logs", tmp, "/kubelet");
    let sid = rt.run_sandbox(&sb).await.unwrap();
    let id = rt
        .create_container(&sid, &raw::container(&sb), &sb)
        .await
        .unwrap();
    rt.start_container(&id).await.unwrap();
    let log = PathBuf::from(rt.container_status(&id).await.unwrap().log_path);
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    (rt, id, log)
}

fn manager(rt: &Arc<FakeRuntime>, max_size: i64, max_files: usize) -> Manager {
    Manager::new(
        rt.clone(),
        Settings {
            max_size,
            max_files,
            ..Settings::default()
        },
    )
}

fn rotated_files(log: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(log.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "0.log")
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn a_big_log_is_renamed_and_reopened_a_small_one_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let (rt, id, log) = rig(tmp.path()).await;
    let m = manager(&rt, 1024, 5);
    let utc = jiff::tz::TimeZone::UTC;
    std::fs::write(&log, vec![b'x'; 1023]).unwrap();
    assert_eq!(m.rotate_one(&id, &utc).await.unwrap(), Outcome::Small);
    assert_eq!(rt.count("ReopenContainerLog"), 0);

    std::fs::write(&log, vec![b'x'; 1024]).unwrap();
    let Outcome::Rotated { path, rotated } = m.rotate_one(&id, &utc).await.unwrap() else {
        panic!("not rotated");
    };
    assert_eq!(path, log);
    assert_eq!(std::fs::read(&rotated).unwrap().len(), 1024);
    // The runtime made a new, empty file at the same path.
    assert_eq!(rt.count("ReopenContainerLog"), 1);
    assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
    let name = rotated.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("0.log.") && name.len() == "0.log.20240305-070809".len());
}

#[tokio::test]
async fn rotations_keep_max_files_and_gzip_all_but_the_newest_rotated() {
    let tmp = tempfile::tempdir().unwrap();
    let (rt, id, log) = rig(tmp.path()).await;
    let m = manager(&rt, 10, 4);
    let utc = jiff::tz::TimeZone::UTC;
    let mut t: jiff::Timestamp = "2024-03-05T07:08:09Z".parse().unwrap();
    for i in 0..6u8 {
        // Distinct names without waiting for the clock: rotate by hand as rotate_one does.
        std::fs::write(&log, vec![b'a' + i; 20]).unwrap();
        let rotated = rotate::rotated_name(&log, t, &utc);
        rotate::prepare_and_rename(&log, &rotated, 4).unwrap();
        rt.reopen_container_log(&id).await.unwrap();
        t += jiff::SignedDuration::from_secs(60);
    }
    // 4 files: the current one, the newest rotated one, two older ones compressed.
    assert_eq!(
        rotated_files(&log),
        names(&[
            "0.log.20240305-071109.gz",
            "0.log.20240305-071209.gz",
            "0.log.20240305-071309",
        ])
    );
    let mut gz = flate2::read::GzDecoder::new(
        std::fs::File::open(log.with_file_name("0.log.20240305-071209.gz")).unwrap(),
    );
    let mut text = Vec::new();
    gz.read_to_end(&mut text).unwrap();
    assert_eq!(text, vec![b'e'; 20]);
    // The next rotation through the manager keeps the bound.
    std::fs::write(&log, vec![b'z'; 20]).unwrap();
    assert!(matches!(
        m.rotate_one(&id, &utc).await.unwrap(),
        Outcome::Rotated { .. }
    ));
    let files = rotated_files(&log);
    assert_eq!(files.len(), 3, "{files:?}");
    assert_eq!(files.iter().filter(|f| f.ends_with(".gz")).count(), 2);
    assert!(log.exists());
    assert_eq!(
        rotate::all_logs(&log).unwrap().last().unwrap(),
        &log.to_string_lossy()
    );
}

#[tokio::test]
async fn a_failed_reopen_renames_the_log_back() {
    let tmp = tempfile::tempdir().unwrap();
    let (rt, id, log) = rig(tmp.path()).await;
    let m = manager(&rt, 10, 5);
    std::fs::write(&log, b"0123456789abc").unwrap();
    rt.fail_next(
        "ReopenContainerLog",
        RuntimeError::Call {
            op: "ReopenContainerLog",
            message: "boom".into(),
        },
    );
    let err = m
        .rotate_one(&id, &jiff::tz::TimeZone::UTC)
        .await
        .unwrap_err();
    assert!(matches!(err, LogError::Reopen { .. }), "{err}");
    assert_eq!(std::fs::read(&log).unwrap(), b"0123456789abc");
    assert!(rotated_files(&log).is_empty());
    // The next round rotates it.
    assert!(matches!(
        m.rotate_one(&id, &jiff::tz::TimeZone::UTC).await.unwrap(),
        Outcome::Rotated { .. }
    ));
}

#[tokio::test]
async fn a_missing_log_is_reopened_first() {
    let tmp = tempfile::tempdir().unwrap();
    let (rt, id, log) = rig(tmp.path()).await;
    let m = manager(&rt, 10, 5);
    assert!(!log.exists());
    assert_eq!(
        m.rotate_one(&id, &jiff::tz::TimeZone::UTC).await.unwrap(),
        Outcome::Small
    );
    assert_eq!(rt.count("ReopenContainerLog"), 1);
    assert!(log.exists());
}

#[tokio::test]
async fn only_running_containers_are_looked_at() {
    let tmp = tempfile::tempdir().unwrap();
    let (rt, id, log) = rig(tmp.path()).await;
    let m = manager(&rt, 10, 5);
    std::fs::write(&log, vec![b'x'; 100]).unwrap();
    rt.exit_container(&id, 0);
    m.rotate_all(&jiff::tz::TimeZone::UTC).await;
    assert_eq!(rt.count("ContainerStatus"), 1, "only the rig's own call");
    assert!(rotated_files(&log).is_empty());
}

#[tokio::test]
async fn the_loop_rotates_and_stops_on_cancel() {
    let tmp = tempfile::tempdir().unwrap();
    let (rt, _id, log) = rig(tmp.path()).await;
    std::fs::write(&log, vec![b'x'; 100]).unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager(&rt, 10, 5).run(cancel.clone()));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while rotated_files(&log).is_empty() {
        assert!(std::time::Instant::now() < deadline, "no rotation");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the loop ends on cancel")
        .unwrap();
}

#[tokio::test]
async fn clean_removes_the_current_and_rotated_files_only() {
    let tmp = tempfile::tempdir().unwrap();
    let (rt, id, log) = rig(tmp.path()).await;
    let dir = log.parent().unwrap();
    for f in [
        "0.log",
        "0.log.20240101-000000",
        "0.log.20240100-000000.gz",
        "1.log",
    ] {
        std::fs::write(dir.join(f), b"x").unwrap();
    }
    clean(rt.as_ref(), &id).await.unwrap();
    assert_eq!(
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect::<Vec<_>>(),
        vec!["1.log".to_string()]
    );
    // No directory at all is fine.
    std::fs::remove_dir_all(dir).unwrap();
    clean(rt.as_ref(), &id).await.unwrap();
}

#[tokio::test]
async fn container_status_is_asked_once_per_container() {
    let tmp = tempfile::tempdir().unwrap();
    let (rt, id, log) = rig(tmp.path()).await;
    std::fs::write(&log, b"x").unwrap();
    let m = manager(&rt, 1024, 5);
    rt.clear_calls();
    for _ in 0..3 {
        m.rotate_all(&jiff::tz::TimeZone::UTC).await;
    }
    assert_eq!(rt.count("ContainerStatus"), 1);
    assert_eq!(rt.count("ListContainers"), 3);
    // A container that stopped is forgotten.
    rt.exit_container(&id, 0);
    m.rotate_all(&jiff::tz::TimeZone::UTC).await;
    assert!(m.paths().is_empty());
}

/// A container log directory with a current log, and a secret file outside it.
fn planted_rig() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pods/ns_p_uid/c");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("0.log"), "current").unwrap();
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, "SECRET").unwrap();
    (tmp, dir, secret)
}

fn gunzip(p: &Path) -> String {
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(p).unwrap())
        .read_to_string(&mut s)
        .unwrap();
    s
}

/// A pod with a hostPath on /var/log plants a symlink to a host file under a rotated log's
/// name: the rotation never reads the target into a `.gz` the pod can read.
#[test]
fn a_rotated_log_planted_as_a_symlink_is_removed_never_compressed() {
    let (_tmp, dir, secret) = planted_rig();
    std::os::unix::fs::symlink(&secret, dir.join("0.log.20200101-000000")).unwrap();
    std::fs::write(dir.join("0.log.20200101-000001"), "old").unwrap();
    let log = dir.join("0.log");
    rotate::prepare_and_rename(&log, &dir.join("0.log.20240101-000000"), 5).unwrap();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "gz") {
            assert!(!gunzip(&p).contains("SECRET"), "{p:?} holds the host file");
        }
    }
    assert_eq!(gunzip(&dir.join("0.log.20200101-000001.gz")), "old");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "SECRET");
}

/// A symlink planted as the compression's `.tmp` (after the leftovers were removed) is not
/// written through: the host file it names is untouched.
#[test]
fn a_tmp_link_planted_before_compression_is_not_written_through() {
    let (_tmp, dir, victim) = planted_rig();
    let old = dir.join("0.log.20200101-000000");
    std::fs::write(&old, "old").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("0.log.20200101-000000.tmp")).unwrap();
    let r = rotate::compress(&old);
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        b"SECRET",
        "the host file was written"
    );
    r.unwrap();
    assert_eq!(gunzip(&dir.join("0.log.20200101-000000.gz")), "old");
}

/// A FIFO planted under a rotated log's name does not hang the rotation worker.
#[test]
fn a_fifo_planted_as_a_rotated_log_does_not_hang_rotation() {
    use std::os::unix::fs::OpenOptionsExt;
    let (_tmp, dir, _) = planted_rig();
    let fifo = dir.join("0.log.20200101-000000");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let d2 = dir.clone();
    std::thread::spawn(move || {
        let r = rotate::prepare_and_rename(&d2.join("0.log"), &d2.join("0.log.20240101-000000"), 5);
        let _ = tx.send(r.is_ok());
    });
    let answer = rx.recv_timeout(std::time::Duration::from_secs(5));
    if answer.is_err() {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo);
    }
    assert_eq!(answer, Ok(true));
    assert!(
        std::fs::symlink_metadata(&fifo).is_err(),
        "the FIFO is removed"
    );
}

/// Container GC removes a dead container's log files (the current and rotated ones) with its
/// link before the container, as upstream's removeContainerLog: without it a crash-looping
/// container's `<n>.log` files piled up until the pod went.
#[tokio::test]
async fn gc_removes_the_containers_log_files_with_its_link() {
    use crate::runtime::LogLinks;
    let tmp = tempfile::tempdir().unwrap();
    let (rt, id, log) = rig(tmp.path()).await;
    let dir = log.parent().unwrap();
    for f in ["0.log", "0.log.20240101-000000", "1.log"] {
        std::fs::write(dir.join(f), b"x").unwrap();
    }
    let c = rt
        .list_containers()
        .await
        .unwrap()
        .into_iter()
        .find(|c| c.id == id)
        .unwrap();
    let links = links::Links::new(tmp.path().join("links"));
    std::fs::create_dir(tmp.path().join("links")).unwrap();
    links.remove_logs(rt.as_ref(), &c).await.unwrap();
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["1.log"], "another container's file stays");
}
