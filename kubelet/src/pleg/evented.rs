//! Evented PLEG (upstream's `EventedPLEG` feature gate, alpha and off by default in v1.36):
//! the runtime's `GetContainerEvents` stream wakes the PLEG, and the relist becomes the
//! safety net, every [`EVENTED_RELIST_PERIOD`] instead of every second, with a PLEG health
//! threshold of [`EVENTED_RELIST_THRESHOLD`]. An event makes the PLEG relist at once (the
//! relist's diff stays the one source of which pods changed; bursts of events make one
//! relist). A stream that cannot be opened or that ends counts as a failure and forces a
//! relist, as upstream; after [`MAX_STREAM_RETRIES`] failures the PLEG falls back to relisting
//! every second for good, with one info line (containerd 1.6 has no `GetContainerEvents`: a
//! node there relists as without the gate).

use crate::runtime::{Runtime, RuntimeEvent};
use std::time::Duration;
use tokio::sync::mpsc;

/// The feature gate.
pub const EVENTED_PLEG_GATE: &str = "EventedPLEG";

/// The relist period without events (upstream's `genericPlegRelistPeriod`).
pub const GENERIC_RELIST_PERIOD: Duration = Duration::from_secs(1);

/// The relist period while events flow (upstream's `eventedPlegRelistPeriod`).
pub const EVENTED_RELIST_PERIOD: Duration = Duration::from_secs(300);

/// The PLEG health threshold while events flow (upstream's `eventedPlegRelistThreshold`).
pub const EVENTED_RELIST_THRESHOLD: Duration = Duration::from_secs(600);

/// Stream failures before the fallback (upstream's `eventedPlegMaxStreamRetries`).
pub const MAX_STREAM_RETRIES: u32 = 5;

/// The event stream and what became of it.
#[derive(Debug, Default)]
pub struct Events {
    rx: Option<mpsc::Receiver<RuntimeEvent>>,
    failures: u32,
    fallen_back: bool,
}

impl Events {
    /// The relist period now.
    pub fn period(&self) -> Duration {
        if self.fallen_back {
            GENERIC_RELIST_PERIOD
        } else {
            EVENTED_RELIST_PERIOD
        }
    }

    /// The PLEG health threshold now.
    pub fn threshold(&self) -> Duration {
        if self.fallen_back {
            super::GENERIC_RELIST_THRESHOLD
        } else {
            EVENTED_RELIST_THRESHOLD
        }
    }

    /// Whether the PLEG relists every second again.
    pub fn fallen_back(&self) -> bool {
        self.fallen_back
    }

    /// Returns when the PLEG should relist at once: an event came (every event queued with
    /// it is taken too), or the stream could not be opened or ended. Never returns after the
    /// fallback. Cancel safe: dropped while it waits, the stream stays open.
    pub async fn next(&mut self, rt: &dyn Runtime) {
        loop {
            if self.fallen_back {
                return std::future::pending().await;
            }
            match &mut self.rx {
                Some(rx) => match rx.recv().await {
                    Some(ev) => {
                        let mut n = 1;
                        while rx.try_recv().is_ok() {
                            n += 1;
                        }
                        tracing::debug!(container = %ev.container_id, kind = ?ev.kind, events = n, "container event: relisting");
                        return;
                    }
                    None => {
                        self.rx = None;
                        self.failed("the container event stream ended");
                        return;
                    }
                },
                None => match rt.container_events().await {
                    Ok(rx) => self.rx = Some(rx),
                    Err(e) => {
                        self.failed(&e.to_string());
                        return;
                    }
                },
            }
        }
    }

    fn failed(&mut self, why: &str) {
        self.failures += 1;
        tracing::debug!(
            error = why,
            failures = self.failures,
            "evented PLEG: failed to get container events, retrying"
        );
        if self.failures >= MAX_STREAM_RETRIES {
            self.fallen_back = true;
            self.rx = None;
            tracing::info!(
                error = why,
                "falling back to relisting every second: the container runtime's event stream (GetContainerEvents) is not working"
            );
        }
    }
}

#[cfg(test)]
mod tests;
