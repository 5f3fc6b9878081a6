use super::*;
use http_body_util::BodyExt;
use std::io::Write;
use std::sync::Mutex;

fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn refusal(pairs: &[(&str, &str)]) -> (u16, String) {
    let r = parse_options(&q(pairs)).unwrap_err();
    (r.status.as_u16(), r.body)
}

const UNDECODABLE: &str = r#"{"message": "Unable to decode query."}"#;
const INVALID: &str = r#"{"message": "Invalid request."}"#;

#[test]
fn query_validation_matches_upstream() {
    for bad in [
        &[("sinceTime", "yesterday")][..],
        &[("sinceTime", "2024-13-01T00:00:00Z")],
        &[("tailLines", "ten")],
        &[("follow", "maybe")],
        &[("limitBytes", "1.5")],
        &[("tail", "x")],
    ] {
        assert_eq!(refusal(bad), (400, UNDECODABLE.into()), "{bad:?}");
    }
    for bad in [
        &[("tailLines", "-1")][..],
        &[("limitBytes", "0")],
        &[("sinceSeconds", "0")],
        &[("sinceSeconds", "5"), ("sinceTime", "2024-01-01T00:00:00Z")],
        &[("stream", "Both")],
        &[("stream", "Stdout"), ("tailLines", "3")],
    ] {
        assert_eq!(refusal(bad), (422, INVALID.into()), "{bad:?}");
    }
    let o = parse_options(&q(&[
        ("follow", "true"),
        ("tailLines", "9223372036854775807"),
        ("timestamps", "1"),
    ]))
    .unwrap();
    assert!(o.follow && o.timestamps && !o.previous);
    assert_eq!(o.tail_lines, Some(i64::MAX));
    // The old `tail` parameter: a number, or "all" for everything.
    let o = parse_options(&q(&[("tailLines", "3"), ("tail", "all")])).unwrap();
    assert_eq!(o.tail_lines, None);
    let o = parse_options(&q(&[("tail", "7")])).unwrap();
    assert_eq!(o.tail_lines, Some(7));
}

#[test]
fn rfc3339_times() {
    assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(
        parse_rfc3339("2016-10-06T00:17:09.669794202Z"),
        Some(1_475_713_029_669_794_202)
    );
    assert_eq!(
        parse_rfc3339("2016-10-06T02:17:09.5+02:00"),
        Some(1_475_713_029_500_000_000)
    );
    assert_eq!(parse_rfc3339("2016-10-06 00:17:09Z"), None);
    assert_eq!(parse_rfc3339("2016-10-06T00:17:09"), None);
}

/// A multi-byte character where the offset is read must be a 400 (undecodable), never a panic
/// of the request task (issue 24: `sinceTime` sliced a &str in the middle of a character).
#[test]
fn since_time_with_multibyte_characters_is_a_400_not_a_panic() {
    for bad in [
        // 'é' (2 bytes) straddles the `:` of the offset.
        "2024-01-01T00:00:00+0\u{e9}00",
        "2024-01-01T00:00:00-\u{e9}\u{e9}",
        // A 3- and a 4-byte character in the offset and the fraction.
        "2024-01-01T00:00:00+\u{20ac}00",
        "2024-01-01T00:00:00.5\u{1f600}",
        "2024-01-01T00:00:0\u{e9}Z",
        "\u{e9}024-01-01T00:00:00Z",
    ] {
        let got = std::panic::catch_unwind(|| parse_options(&q(&[("sinceTime", bad)])));
        let r = got.unwrap_or_else(|_| panic!("sinceTime {bad:?} panicked"));
        let e = r
            .err()
            .unwrap_or_else(|| panic!("sinceTime {bad:?} was accepted"));
        assert_eq!(
            (e.status.as_u16(), e.body.as_str()),
            (400, UNDECODABLE),
            "{bad:?}"
        );
    }
}

fn render(opts: &[(&str, &str)], lines: &[&str], now: i128) -> String {
    let o = parse_options(&q(opts)).unwrap();
    let mut w = Writer::new(&o, now);
    let mut out = Vec::new();
    for l in lines {
        w.line(l.as_bytes(), &mut out);
    }
    String::from_utf8(out).unwrap()
}

const LINES: [&str; 5] = [
    "2024-01-01T00:00:01.5Z stdout F one",
    "2024-01-01T00:00:02Z stderr F two",
    "2024-01-01T00:00:03Z stdout P thr",
    "2024-01-01T00:00:03.1Z stdout F ee",
    "garbage",
];

#[test]
fn writer_applies_options() {
    let t = |s| parse_rfc3339(s).unwrap();
    // Partial records join into one line; lines not in the format are skipped.
    assert_eq!(render(&[], &LINES, 0), "one\ntwo\nthree\n");
    assert_eq!(
        render(&[("timestamps", "true")], &LINES[..2], 0),
        "2024-01-01T00:00:01.5Z one\n2024-01-01T00:00:02Z two\n"
    );
    assert_eq!(render(&[("stream", "Stderr")], &LINES, 0), "two\n");
    assert_eq!(render(&[("stream", "Stdout")], &LINES, 0), "one\nthree\n");
    assert_eq!(
        render(&[("sinceTime", "2024-01-01T00:00:02Z")], &LINES, 0),
        "two\nthree\n"
    );
    // sinceSeconds counts back from now.
    let now = t("2024-01-01T00:00:04Z");
    assert_eq!(
        render(&[("sinceSeconds", "2")], &LINES, now),
        "two\nthree\n"
    );
    assert_eq!(render(&[("limitBytes", "6")], &LINES, 0), "one\ntw");
}

fn file_with(content: &str) -> (tempfile::TempDir, std::fs::File) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("0.log");
    std::fs::write(&p, content).unwrap();
    let f = std::fs::File::open(&p).unwrap();
    (d, f)
}

#[test]
fn tail_start_counts_lines_from_the_end() {
    let (_d, mut f) = file_with("a\nbb\nccc\n");
    assert_eq!(tail_start(&mut f, 0).unwrap(), 9);
    assert_eq!(tail_start(&mut f, 1).unwrap(), 5);
    assert_eq!(tail_start(&mut f, 2).unwrap(), 2);
    assert_eq!(tail_start(&mut f, 3).unwrap(), 0);
    assert_eq!(tail_start(&mut f, u64::MAX).unwrap(), 0);
    let (_d, mut f) = file_with("a\nbb");
    assert_eq!(tail_start(&mut f, 1).unwrap(), 2);
    // Longer than one read block.
    let big: String = (0..5000).map(|i| format!("line {i}\n")).collect();
    let (_d, mut f) = file_with(&big);
    let start = tail_start(&mut f, 3).unwrap() as usize;
    assert_eq!(&big[start..], "line 4997\nline 4998\nline 4999\n");
}

/// A runtime whose containers the test sets.
#[derive(Default)]
struct FakeLookup(Mutex<std::collections::BTreeMap<String, LogContainer>>);

impl FakeLookup {
    fn set(&self, id: &str, c: Option<LogContainer>) {
        let mut m = self.0.lock().unwrap();
        match c {
            Some(c) => m.insert(id.into(), c),
            None => m.remove(id),
        };
    }
}

#[async_trait::async_trait]
impl ContainerLookup for FakeLookup {
    async fn lookup(&self, id: &str) -> Option<LogContainer> {
        self.0.lock().unwrap().get(id).copied()
    }
}

fn pod(restarts: i32, last: Option<&str>) -> Pod {
    let mut cs = serde_json::json!({
        "name": "app", "image": "busybox", "imageID": "", "ready": true,
        "restartCount": restarts, "containerID": "containerd://cur",
        "state": {"running": {}},
    });
    if let Some(id) = last {
        cs["lastState"] = serde_json::json!({"terminated": {"exitCode": 1, "containerID": id}});
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": [{"name": "app"}], "initContainers": [{"name": "init"}]},
        "status": {"containerStatuses": [cs]},
    }))
    .unwrap()
}

struct Rig {
    dir: tempfile::TempDir,
    lookup: Arc<FakeLookup>,
    logs: Logs,
}

impl Rig {
    fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let lookup = Arc::new(FakeLookup::default());
        let logs = Logs {
            pod_logs_dir: dir.path().to_path_buf(),
            node_log_dir: None,
            containers: lookup.clone(),
        };
        std::fs::create_dir_all(dir.path().join("ns_web_u1/app")).unwrap();
        Rig { dir, lookup, logs }
    }

    fn log(&self, restart: u32) -> PathBuf {
        self.dir.path().join(format!("ns_web_u1/app/{restart}.log"))
    }

    fn append(&self, restart: u32, lines: &[&str]) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(restart))
            .unwrap();
        for l in lines {
            writeln!(f, "2024-01-01T00:00:00Z stdout F {l}").unwrap();
        }
    }

    async fn get(
        &self,
        p: &Pod,
        path: (&str, &str, &str),
        query: &[(&str, &str)],
    ) -> Result<String, (u16, String)> {
        let body = serve(
            &self.logs,
            std::slice::from_ref(p),
            path.0,
            path.1,
            path.2,
            &q(query),
        )
        .await
        .map_err(|r| (r.status.as_u16(), r.body))?;
        let bytes = body.collect().await.unwrap().to_bytes();
        Ok(String::from_utf8(bytes.to_vec()).unwrap())
    }
}

#[tokio::test]
async fn missing_pod_or_container_is_404_with_upstreams_body() {
    let rig = Rig::new();
    let p = pod(0, None);
    assert_eq!(
        rig.get(&p, ("ns", "nope", "app"), &[]).await.unwrap_err(),
        (404, "pod \"nope\" does not exist".into())
    );
    assert_eq!(
        rig.get(&p, ("other", "web", "app"), &[]).await.unwrap_err(),
        (404, "pod \"web\" does not exist".into())
    );
    assert_eq!(
        rig.get(&p, ("ns", "web", "db"), &[]).await.unwrap_err(),
        (404, "container \"db\" not found in pod \"web\"".into())
    );
    // In the spec but never started.
    assert_eq!(
        rig.get(&p, ("ns", "web", "init"), &[]).await.unwrap_err().0,
        400
    );
    // A bad query is refused before the pod is looked up.
    assert_eq!(
        rig.get(&p, ("ns", "nope", "app"), &[("sinceTime", "now")])
            .await
            .unwrap_err(),
        (400, UNDECODABLE.into())
    );
}

#[tokio::test]
async fn reads_current_tail_and_previous() {
    let rig = Rig::new();
    rig.append(0, &["first run"]);
    rig.append(1, &["a", "b", "c"]);
    let p = pod(1, Some("containerd://old"));
    assert_eq!(
        rig.get(&p, ("ns", "web", "app"), &[]).await.unwrap(),
        "a\nb\nc\n"
    );
    assert_eq!(
        rig.get(&p, ("ns", "web", "app"), &[("tailLines", "2")])
            .await
            .unwrap(),
        "b\nc\n"
    );
    assert_eq!(
        rig.get(
            &p,
            ("ns", "web", "app"),
            &[("tailLines", "9223372036854775807")]
        )
        .await
        .unwrap(),
        "a\nb\nc\n"
    );
    assert_eq!(
        rig.get(&p, ("ns", "web", "app"), &[("previous", "true")])
            .await
            .unwrap(),
        "first run\n"
    );
    // The runtime's restart number wins over the pod status's.
    rig.lookup.set(
        "cur",
        Some(LogContainer {
            running: true,
            restart: 0,
        }),
    );
    assert_eq!(
        rig.get(&p, ("ns", "web", "app"), &[]).await.unwrap(),
        "first run\n"
    );
    // No earlier run: upstream's 400.
    assert_eq!(
        rig.get(&pod(0, None), ("ns", "web", "app"), &[("previous", "true")])
            .await
            .unwrap_err(),
        (
            400,
            "previous terminated container \"app\" in pod \"web\" not found".into()
        )
    );
}

async fn next_chunk(body: &mut Body) -> Option<String> {
    let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("no log output within 5 s")?;
    Some(String::from_utf8(frame.unwrap().into_data().unwrap().to_vec()).unwrap())
}

#[tokio::test]
async fn follow_sees_new_lines_and_ends_when_the_container_is_gone() {
    let rig = Rig::new();
    rig.append(0, &["old"]);
    rig.lookup.set(
        "cur",
        Some(LogContainer {
            running: true,
            restart: 0,
        }),
    );
    let p = pod(0, None);
    let mut body = serve(
        &rig.logs,
        &[p],
        "ns",
        "web",
        "app",
        &q(&[("follow", "true")]),
    )
    .await
    .unwrap();
    assert_eq!(next_chunk(&mut body).await.unwrap(), "old\n");
    rig.append(0, &["new"]);
    assert_eq!(next_chunk(&mut body).await.unwrap(), "new\n");
    // Rotation: the runtime renames the file and starts a new one.
    std::fs::rename(
        rig.log(0),
        rig.dir.path().join("ns_web_u1/app/0.log.20240101-000000"),
    )
    .unwrap();
    rig.append(0, &["rotated"]);
    assert_eq!(next_chunk(&mut body).await.unwrap(), "rotated\n");
    // Lines written just before a rotation are not lost: the old file is read to its end
    // before the stream moves to the new one.
    rig.append(0, &["before"]);
    std::fs::rename(
        rig.log(0),
        rig.dir.path().join("ns_web_u1/app/0.log.20240101-000001"),
    )
    .unwrap();
    rig.append(0, &["after"]);
    let mut got = String::new();
    while got.len() < "before\nafter\n".len() {
        got.push_str(&next_chunk(&mut body).await.unwrap());
    }
    assert_eq!(got, "before\nafter\n");
    // The container is removed: the rest of the file, then the end of the stream.
    rig.append(0, &["last words"]);
    rig.lookup.set("cur", None);
    let mut rest = String::new();
    while let Some(c) = next_chunk(&mut body).await {
        rest.push_str(&c);
    }
    assert_eq!(rest, "last words\n");
}

#[tokio::test]
async fn follow_of_a_stopped_container_ends_at_the_end_of_its_log() {
    let rig = Rig::new();
    rig.append(0, &["x", "y"]);
    rig.lookup.set(
        "cur",
        Some(LogContainer {
            running: false,
            restart: 0,
        }),
    );
    let got = rig
        .get(
            &pod(0, None),
            ("ns", "web", "app"),
            &[("follow", "true"), ("tailLines", "1")],
        )
        .await
        .unwrap();
    assert_eq!(got, "y\n");
}

#[tokio::test]
async fn follow_stops_reading_when_the_client_goes_away() {
    let rig = Rig::new();
    rig.append(0, &["hello"]);
    rig.lookup.set(
        "cur",
        Some(LogContainer {
            running: true,
            restart: 0,
        }),
    );
    let mut body = serve(
        &rig.logs,
        &[pod(0, None)],
        "ns",
        "web",
        "app",
        &q(&[("follow", "1")]),
    )
    .await
    .unwrap();
    assert_eq!(next_chunk(&mut body).await.unwrap(), "hello\n");
    // While following, the reader holds the runtime handle; once the client is gone it ends
    // and lets go of it.
    let baseline = 2; // the rig's and `Logs`'s
    assert!(Arc::strong_count(&rig.lookup) > baseline);
    drop(body);
    let mut released = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if Arc::strong_count(&rig.lookup) == baseline {
            released = true;
            break;
        }
    }
    assert!(
        released,
        "the follow stream kept reading after the client left"
    );
}

/// A pod with a hostPath on /var/log replaces its container's log with a symlink to a host
/// file (or the container's directory with one out): `kubectl logs` never shows that file.
#[tokio::test]
async fn a_log_replaced_by_a_symlink_out_never_shows_the_host_file() {
    let rig = Rig::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("1.log"),
        "2024-01-01T00:00:00Z stdout F SECRET\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path().join("1.log"), rig.log(1)).unwrap();
    let p = pod(1, None);
    let got = rig.get(&p, ("ns", "web", "app"), &[]).await;
    assert!(!format!("{got:?}").contains("SECRET"), "{got:?}");
    // The container's directory swapped for a symlink out: the same.
    let app = rig.dir.path().join("ns_web_u1/app");
    std::fs::remove_file(rig.log(1)).unwrap();
    std::fs::remove_dir(&app).unwrap();
    std::os::unix::fs::symlink(outside.path(), &app).unwrap();
    let got = rig.get(&p, ("ns", "web", "app"), &[]).await;
    assert!(!format!("{got:?}").contains("SECRET"), "{got:?}");
    // A log inside is still read.
    std::fs::remove_file(&app).unwrap();
    std::fs::create_dir(&app).unwrap();
    rig.append(1, &["fine"]);
    assert_eq!(
        rig.get(&p, ("ns", "web", "app"), &[]).await.unwrap(),
        "fine\n"
    );
}
