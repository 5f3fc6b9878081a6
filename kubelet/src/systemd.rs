//! What the kubelet tells systemd: `READY=1` as soon as it starts ([`Startup`]: a
//! `Type=notify` unit with `TimeoutStartSec=infinity`, restarted by `kubeadm join` without
//! `--no-block`, would otherwise hang with no message while the agent waits for its TLS
//! bootstrap or the runtime), `STATUS=` lines naming what it waits for and then what it does,
//! `WATCHDOG=1` at half of `WATCHDOG_USEC` (while it waits, then while the sync loop turns: a
//! stuck loop stops the pings, so systemd restarts the service), and `STOPPING=1` on
//! shutdown. Without `NOTIFY_SOCKET` this does nothing.

use crate::sync_loop::SyncLoopHealth;
use node_systemd::Notifier;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The loop counts as stuck after this long without a turn when the watchdog period is shorter
/// (it turns every second; a few seconds absorb a busy machine).
const MIN_STUCK_AFTER: Duration = Duration::from_secs(3);

/// The notifications of the start, before the sync loop runs: `READY=1` at once, a `STATUS=`
/// line for each wait, watchdog pings while waiting (systemd times the watchdog from
/// `READY=1`), and `STOPPING=1` when dropped before [`Startup::into_running`] (the agent
/// stopped, or failed, while it waited).
pub struct Startup {
    notifier: Notifier,
    watchdog: Option<Duration>,
    pings: CancellationToken,
    running: bool,
}

impl Startup {
    /// Sends `READY=1` with `status`; pings the watchdog every `watchdog` until handed over.
    /// Must be called inside a tokio runtime.
    pub fn begin(notifier: Notifier, watchdog: Option<Duration>, status: &str) -> Startup {
        let pings = CancellationToken::new();
        if notifier.enabled() {
            send(&notifier, &format!("READY=1\nSTATUS={status}"));
            if let Some(period) = watchdog {
                tokio::spawn(waiting_pings(notifier.clone(), period, pings.clone()));
            }
        }
        Startup {
            notifier,
            watchdog,
            pings,
            running: false,
        }
    }

    /// What the agent is doing or waiting for now (`systemctl status` shows it).
    pub fn status(&self, status: &str) {
        if self.notifier.enabled() {
            send(&self.notifier, &format!("STATUS={status}"));
        }
    }

    /// The sync loop runs: [`run`] takes over the notifier and the watchdog period.
    pub fn into_running(mut self) -> (Notifier, Option<Duration>) {
        self.running = true;
        self.pings.cancel();
        (self.notifier.clone(), self.watchdog)
    }
}

impl Drop for Startup {
    fn drop(&mut self) {
        self.pings.cancel();
        if !self.running && self.notifier.enabled() {
            send(&self.notifier, "STOPPING=1\nSTATUS=shutting down");
        }
    }
}

/// Watchdog pings while the agent waits (for its bootstrap, the runtime) before its loops run.
async fn waiting_pings(notifier: Notifier, period: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => send(&notifier, "WATCHDOG=1"),
        }
    }
}

/// Once the sync loop runs (after [`Startup::into_running`]): says `status`, pings the
/// watchdog while the loop turns until cancelled, then STOPPING.
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
    send(&notifier, &format!("STATUS={status}"));
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
        assert_eq!(drain(&sock), vec!["STATUS=serving"]);
        // The paused clock does not move Instant-based heartbeats, so the loop looks healthy.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(drain(&sock), vec!["WATCHDOG=1", "WATCHDOG=1"]);
        cancel.cancel();
        task.await.unwrap();
        assert_eq!(drain(&sock), vec!["STOPPING=1\nSTATUS=shutting down"]);
    }

    #[tokio::test(start_paused = true)]
    async fn ready_at_once_then_status_and_pings_while_waiting_then_stopping() {
        let (_dir, sock, n) = listener();
        let startup = Startup::begin(n.clone(), Some(Duration::from_secs(1)), "starting");
        assert_eq!(drain(&sock), vec!["READY=1\nSTATUS=starting"]);
        startup.status("waiting for the container runtime at unix:///x.sock");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(
            drain(&sock),
            vec![
                "STATUS=waiting for the container runtime at unix:///x.sock",
                "WATCHDOG=1",
                "WATCHDOG=1"
            ]
        );
        // Stopped while waiting: STOPPING, and no more pings.
        drop(startup);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(drain(&sock), vec!["STOPPING=1\nSTATUS=shutting down"]);

        // Handed over to the running loop: the waiting pings end, nothing else is said.
        let startup = Startup::begin(n, Some(Duration::from_secs(1)), "starting");
        let (n, period) = startup.into_running();
        assert!(n.enabled());
        assert_eq!(period, Some(Duration::from_secs(1)));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(drain(&sock), vec!["READY=1\nSTATUS=starting"]);
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
