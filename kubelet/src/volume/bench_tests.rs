//! The cost of re-rendering API-data volumes at 110 pods (ignored by default):
//!
//! `cargo test -p kubelet --lib bench_volume_rerender -- --ignored --nocapture`
//!
//! Each pod has the two volumes every API pod carries in practice: a `kube-api-access`
//! projected volume (token, ca.crt, namespace) and a downwardAPI volume (labels,
//! annotations). One pass writes every pod's volumes through the atomic writer, as the
//! volume manager's resync does: unchanged passes (the 60 s resync, tokens still valid) and
//! changed passes (a label edit on every pod). The floor next to them, in the same run, is a
//! plain `std::fs::write` of the same bytes over the same files.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::atomic_writer::{FileProjection, Payload, write};

const PODS: usize = 110;
const PASSES: usize = 20;

fn file(data: &str, mode: u32) -> FileProjection {
    FileProjection {
        data: data.as_bytes().to_vec(),
        mode,
    }
}

fn payloads(generation: usize) -> (Payload, Payload) {
    let token = "t".repeat(900);
    let ca = "c".repeat(1100);
    let access: Payload = [
        ("token".to_string(), file(&token, 0o644)),
        ("ca.crt".to_string(), file(&ca, 0o644)),
        ("namespace".to_string(), file("default", 0o644)),
    ]
    .into_iter()
    .collect();
    let info: Payload = [
        (
            "labels".to_string(),
            file(
                &format!("app=\"web\"\ngeneration=\"{generation}\"\n"),
                0o644,
            ),
        ),
        (
            "annotations".to_string(),
            file("kubernetes.io/config.seen=\"2026-11-27\"\n", 0o644),
        ),
    ]
    .into_iter()
    .collect();
    (access, info)
}

fn dirs(root: &Path) -> Vec<(PathBuf, PathBuf)> {
    (0..PODS)
        .map(|i| {
            let pod = root.join(format!("pods/uid-{i}/volumes"));
            let a = pod.join("kubernetes.io~projected/kube-api-access");
            let b = pod.join("kubernetes.io~downward-api/info");
            std::fs::create_dir_all(&a).unwrap();
            std::fs::create_dir_all(&b).unwrap();
            (a, b)
        })
        .collect()
}

/// Median and worst of `PASSES` passes of `pass`.
fn measure(mut pass: impl FnMut(usize)) -> (Duration, Duration) {
    let mut t: Vec<Duration> = (0..PASSES)
        .map(|n| {
            let s = Instant::now();
            pass(n);
            s.elapsed()
        })
        .collect();
    t.sort();
    (t[PASSES / 2], t[PASSES - 1])
}

#[test]
#[ignore = "benchmark: prints figures"]
fn bench_volume_rerender() {
    let tmp = tempfile::tempdir().unwrap();
    let vols = dirs(tmp.path());
    for (a, b) in &vols {
        let (pa, pb) = payloads(0);
        write(a, &pa).unwrap();
        write(b, &pb).unwrap();
    }
    let (pa, pb) = payloads(0);
    let unchanged = measure(|_| {
        for (a, b) in &vols {
            write(a, &pa).unwrap();
            write(b, &pb).unwrap();
        }
    });
    let changed = measure(|n| {
        let (pa, pb) = payloads(n + 1);
        for (a, b) in &vols {
            write(a, &pa).unwrap();
            write(b, &pb).unwrap();
        }
    });
    let raw = measure(|n| {
        let (pa, pb) = payloads(n + 1);
        for (a, b) in &vols {
            for (dir, p) in [(a, &pa), (b, &pb)] {
                for (name, f) in p {
                    std::fs::write(dir.join(format!("raw-{name}")), &f.data).unwrap();
                }
            }
        }
    });
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "volume re-render, {PODS} pods x 2 volumes, {PASSES} passes each (median / worst):\n  \
         unchanged (resync): {:.2} / {:.2} ms\n  \
         changed (label edit): {:.2} / {:.2} ms\n  \
         raw std::fs::write of the same files: {:.2} / {:.2} ms\n  \
         changed / raw: {:.2}x",
        ms(unchanged.0),
        ms(unchanged.1),
        ms(changed.0),
        ms(changed.1),
        ms(raw.0),
        ms(raw.1),
        changed.0.as_secs_f64() / raw.0.as_secs_f64()
    );
}
