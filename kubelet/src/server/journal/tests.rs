use super::*;
use futures::StreamExt;

async fn collect(j: &Journalctl, args: &[&str], within: Duration) -> Vec<Chunk> {
    let deadline = Instant::now() + within;
    j.run(args.iter().map(|s| s.to_string()).collect(), deadline)
        .collect()
        .await
}

#[tokio::test]
async fn runs_stream_the_output_and_end_at_the_deadline() {
    let echo = Journalctl {
        program: "echo".into(),
    };
    assert_eq!(
        collect(&echo, &["--unit=kubelet", "$(id)"], Duration::from_secs(10)).await,
        [Chunk::Data(Bytes::from_static(b"--unit=kubelet $(id)\n"))],
        "arguments reach the program as they are, no shell"
    );
    let missing = Journalctl {
        program: "/nonexistent/journalctl".into(),
    };
    let out = collect(&missing, &[], Duration::from_secs(10)).await;
    assert!(matches!(out.as_slice(), [Chunk::Failed(_)]), "{out:?}");
    // A run that would hang is cut at the deadline (and the child killed with the stream).
    let hang = Journalctl {
        program: "sleep".into(),
    };
    let started = std::time::Instant::now();
    let out = collect(&hang, &["30"], Duration::from_millis(300)).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(out, [Chunk::Failed("deadline exceeded".into())]);
    assert_eq!(
        hang.units(Instant::now() + Duration::from_millis(300))
            .await,
        None
    );
}
