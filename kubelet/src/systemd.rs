//! What the kubelet tells systemd: `READY=1` once its servers listen and the sync loop runs,
//! `WATCHDOG=1` at half of `WATCHDOG_USEC` while the sync loop turns (a stuck loop stops the
//! pings, so systemd restarts the service), `STATUS=` lines an operator sees in `systemctl
//! status`, and `STOPPING=1` on shutdown. Without `NOTIFY_SOCKET` this task does nothing.

use crate::sync_loop::SyncLoopHealth;
use node_systemd::Notifier;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The loop counts as stuck after this long without a turn when the watchdog period is shorter
/// (it turns every second; a few seconds absorb a busy machine).
const MIN_STUCK_AFTER: Duration = Duration::from_secs(3);

/// Sends READY, then pings the watchdog until cancelled, then STOPPING.
pub async fn run(
    notifier: Notifier,
    watchdog: Option<Duration>,
    sync_loop: Arc<SyncLoopHealth>,
    status: String,
    cancel: CancellationToken,
) {
    if !notifier.enabled() {
        return;
    }
    send(&notifier, &format!("READY=1\nSTATUS={status}"));
    if let Some(period) = watchdog {
        tracing::info!(
            period_ms = period.as_millis() as u64,
            "systemd watchdog enabled: pinging while the sync loop turns"
        );
        watchdog_loop(&notifier, period, &sync_loop, &status, &cancel).await;
    } else {
        cancel.cancelled().await;
    }
    send(&notifier, "STOPPING=1\nSTATUS=shutting down");
}

async fn watchdog_loop(
    notifier: &Notifier,
    period: Duration,
    sync_loop: &SyncLoopHealth,
    status: &str,
    cancel: &CancellationToken,
) {
    let stuck_after = period.max(MIN_STUCK_AFTER);
    let mut stuck = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        let idle = sync_loop.since_last_turn();
        if idle <= stuck_after {
            if stuck {
                tracing::info!("the sync loop turns again; watchdog pings resume");
                send(notifier, &format!("STATUS={status}"));
                stuck = false;
            }
            send(notifier, "WATCHDOG=1");
        } else if !stuck {
            stuck = true;
            tracing::error!(
                idle_secs = idle.as_secs(),
                "the sync loop has not turned; withholding systemd watchdog pings"
            );
            send(
                notifier,
                &format!("STATUS=sync loop stuck for {}s", idle.as_secs()),
            );
        }
    }
}

fn send(notifier: &Notifier, msg: &str) {
    if let Err(e) = notifier.notify(msg) {
        tracing::warn!(error = %e, "systemd notification failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixDatagram;

    fn listener() -> (tempfile::TempDir, UnixDatagram, Notifier) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_nonblocking(true).unwrap();
        let n = Notifier::new(Some(path.to_string_lossy().into_owned()));
        (dir, sock, n)
    }

    fn drain(sock: &UnixDatagram) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 512];
        while let Ok(n) = sock.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn pings_while_the_loop_turns_and_stops_when_it_is_stuck() {
        let (_dir, sock, n) = listener();
        let health = Arc::new(SyncLoopHealth::default());
        health.beat();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(
            n,
            Some(Duration::from_secs(1)),
            health.clone(),
            "serving".into(),
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(drain(&sock), vec!["READY=1\nSTATUS=serving"]);
        // The paused clock does not move Instant-based heartbeats, so the loop looks healthy.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(drain(&sock), vec!["WATCHDOG=1", "WATCHDOG=1"]);
        cancel.cancel();
        task.await.unwrap();
        assert_eq!(drain(&sock), vec!["STOPPING=1\nSTATUS=shutting down"]);
    }

    #[tokio::test]
    async fn a_stuck_loop_gets_no_pings() {
        let (_dir, sock, n) = listener();
        let health = Arc::new(SyncLoopHealth::created_ago(
            MIN_STUCK_AFTER + Duration::from_secs(1),
        ));
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(
            n,
            Some(Duration::from_millis(50)),
            health,
            "serving".into(),
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
        task.await.unwrap();
        let got = drain(&sock);
        assert!(!got.iter().any(|m| m == "WATCHDOG=1"), "{got:?}");
        assert!(
            got.iter()
                .any(|m| m.starts_with("STATUS=sync loop stuck for")),
            "{got:?}"
        );
    }

    #[tokio::test]
    async fn without_notify_socket_it_returns_at_once() {
        let cancel = CancellationToken::new();
        run(
            Notifier::new(None),
            Some(Duration::from_millis(1)),
            Arc::default(),
            "x".into(),
            cancel,
        )
        .await;
    }
}
