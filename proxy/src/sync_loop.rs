//! The debounced sync loop every backend runs under (upstream's BoundedFrequencyRunner and
//! the proxier's SyncLoop): changes from the [`ProxyHandle`] batched into at most one sync
//! per `minSyncPeriod`, a periodic sync (with the canary check) every `syncPeriod`, failed
//! syncs retried after a backoff. What a sync does is the proxier's: see [`Syncer`].

use std::future::Future;
use std::time::Duration;

use plumbing::Backoff;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::metrics::Metrics;
use crate::model::IpFamily;
use crate::tracker::{ProxyHandle, unix_now};

/// What the loop drives: one family's proxier (`proxier::Proxier`, whatever its
/// mode).
pub trait Syncer {
    /// A failed sync; logged, and the sync retried after a backoff.
    type Error: std::fmt::Display;

    /// The handle whose changes wake the loop.
    fn handle(&self) -> &ProxyHandle;

    /// The IP family this proxier programs (the `ip_family` label of its metrics).
    fn family(&self) -> IpFamily;

    /// The metrics the loop sets (`last_queued_timestamp` when a change arrives).
    fn metrics(&self) -> &Metrics;

    /// Run before each periodic sync: checks that nobody flushed the proxier's rules behind
    /// its back (iptables: the canary chain), and if so makes the next sync a full one.
    fn check_canary(&mut self) -> impl Future<Output = ()> + Send;

    /// Renders and applies. `full` forces a full rewrite; otherwise only what changed since
    /// the last successful sync is written (full anyway when that state is unknown).
    fn sync(&mut self, full: bool)
    -> impl Future<Output = Result<SyncOutcome, Self::Error>> + Send;
}

/// Timing of the loop (upstream defaults: minSyncPeriod 1 s, syncPeriod 30 s, and a forced
/// full resync at least every hour).
#[derive(Clone, Copy, Debug)]
pub struct SyncConfig {
    /// No two syncs closer than this; changes arriving meanwhile are batched.
    pub min_sync_period: Duration,
    /// A sync runs at least this often; each periodic run also checks the canary
    /// ([`Syncer::check_canary`]) and does a full resync if someone flushed our rules.
    pub sync_period: Duration,
    /// Longest time between full resyncs (drift repair).
    pub full_sync_period: Duration,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig {
            min_sync_period: Duration::from_secs(1),
            sync_period: Duration::from_secs(30),
            full_sync_period: Duration::from_secs(3600),
        }
    }
}

/// What one `sync` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyncOutcome {
    /// Initial lists not received yet.
    NotInitialized,
    /// Partial sync with nothing to write.
    Unchanged,
    Applied {
        full: bool,
        changed_services: usize,
        bytes: usize,
    },
}

/// The first retry of a failed sync waits this long.
const RETRY_FIRST: Duration = Duration::from_secs(1);

/// Runs syncs until `shutdown`: at most one per `min_sync_period`, woken by changes from the
/// handle, and at least one per `sync_period` (which also checks the canary).
/// A failed sync is retried, fully, after a back-off: 1 s, doubling up to `sync_period`, back
/// to 1 s after a success.
/// Returns the proxier when `shutdown` fires.
pub async fn run<S: Syncer>(mut proxier: S, cfg: SyncConfig, shutdown: CancellationToken) -> S {
    let handle = proxier.handle().clone();
    let mut last_run: Option<Instant> = None;
    let mut next_periodic = Instant::now() + cfg.sync_period;
    let mut pending = true;
    let mut retry = Backoff::new(RETRY_FIRST, cfg.sync_period);
    let mut retry_at: Option<Instant> = None;
    loop {
        let wake = if pending {
            let earliest = last_run.map_or_else(Instant::now, |t| t + cfg.min_sync_period);
            earliest.min(next_periodic)
        } else {
            retry_at.map_or(next_periodic, |t| t.min(next_periodic))
        };
        tokio::select! {
            _ = shutdown.cancelled() => return proxier,
            _ = handle.notified() => {
                proxier
                    .metrics()
                    .last_queued_timestamp
                    .with_label_values(&[proxier.family().label()])
                    .set(unix_now());
                pending = true;
                continue;
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
        let now = Instant::now();
        if now >= next_periodic {
            proxier.check_canary().await;
        }
        match proxier.sync(false).await {
            // Nothing was written: the first real sync need not wait for minSyncPeriod.
            Ok(SyncOutcome::NotInitialized) => {}
            Ok(_) => {
                last_run = Some(now);
                retry.succeed();
                retry_at = None;
            }
            Err(e) => {
                let after = retry.fail();
                warn!(error = %e, retry_in = ?after, "sync failed");
                last_run = Some(now);
                retry_at = Some(Instant::now() + after);
            }
        }
        pending = false;
        next_periodic = now + cfg.sync_period;
    }
}
