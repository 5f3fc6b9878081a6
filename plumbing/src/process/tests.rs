use std::time::{Duration, Instant};

use super::*;

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

const LONG: Duration = Duration::from_secs(20);

#[tokio::test]
async fn output_and_status_come_back() {
    let out = Command::new(sh("echo out; echo err >&2; exit 3"), LONG)
        .run()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stdout_lossy(), "out\n");
    assert_eq!(out.stderr_lossy(), "err\n");
    assert!(!out.stderr_truncated);
}

#[tokio::test]
async fn a_child_past_its_timeout_is_killed() {
    let t0 = Instant::now();
    let err = Command::new(sh("sleep 30"), Duration::from_millis(200))
        .run()
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Timeout { after } if after == Duration::from_millis(200)));
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[tokio::test]
async fn a_missing_program_is_a_spawn_error() {
    let err = Command::prefixed(&[], "/nonexistent/plumbing-test", &["x"], LONG)
        .run()
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::Spawn { .. }), "{err:?}");
}

#[tokio::test]
async fn stdin_is_written_while_stdout_is_read() {
    // 4 MiB through `cat`: far more than a pipe holds, so writing all input before reading
    // any output would stall until the timeout.
    let input: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let out = Command::new(vec!["cat".into()], LONG)
        .stdin(&input)
        .run()
        .await
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), input.len());
    assert!(out.stdout == input);
}

#[tokio::test]
async fn stdout_over_its_cap_is_an_error_and_stderr_is_cut() {
    let big = "head -c 100000 /dev/zero";
    let err = Command::new(sh(big), LONG)
        .stdout_cap(1000)
        .run()
        .await
        .unwrap_err();
    assert!(
        matches!(err, RunError::TooMuchOutput { cap: 1000 }),
        "{err:?}"
    );
    let out = Command::new(sh(&format!("{big} >&2")), LONG)
        .stderr_cap(1000)
        .run()
        .await
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stderr.len(), 1000);
    assert!(out.stderr_truncated);
}

#[tokio::test]
async fn a_prefix_runs_first() {
    let out = Command::prefixed(&["env".to_string()], "echo", &["a", "b"], LONG)
        .run()
        .await
        .unwrap();
    assert_eq!(out.stdout_lossy(), "a b\n");
}
