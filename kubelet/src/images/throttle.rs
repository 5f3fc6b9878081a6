//! `registryPullQPS` / `registryBurst` (defaults 5 and 10): upstream's kubelet wraps its image
//! service in a token bucket holding `registryBurst` tokens and refilled at `registryPullQPS`
//! a second. A pull that finds the bucket empty is not queued: it fails at once with
//! [`QPS_EXCEEDED`], which then goes the way of any failed pull (a `Failed` event,
//! `ErrImagePull`, the image's back-off). `registryPullQPS: 0` turns the bucket off; a bucket
//! of 0 tokens with a QPS above 0 refuses every pull, as Go's `rate.Limiter` does.

use std::sync::Mutex;
use tokio::time::Instant;

/// Upstream's error for a pull refused by the bucket.
pub const QPS_EXCEEDED: &str = "pull QPS exceeded";

/// Upstream's defaults.
pub const DEFAULT_QPS: i32 = 5;
pub const DEFAULT_BURST: i32 = 10;

#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

/// The node's pull token bucket (`None` inside: no limit).
#[derive(Debug, Default)]
pub struct PullThrottle {
    bucket: Option<Mutex<Bucket>>,
}

impl PullThrottle {
    /// From validated (non-negative) settings; the bucket starts full.
    pub fn new(qps: i32, burst: i32) -> PullThrottle {
        if qps <= 0 {
            return PullThrottle::default();
        }
        let burst = f64::from(burst.max(0));
        PullThrottle {
            bucket: Some(Mutex::new(Bucket {
                qps: f64::from(qps),
                burst,
                tokens: burst,
                last: Instant::now(),
            })),
        }
    }

    /// Takes a token if one is there now; never waits.
    pub fn try_accept(&self) -> bool {
        let Some(bucket) = &self.bucket else {
            return true;
        };
        let mut b = bucket.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.last = now;
        b.tokens = (b.tokens + elapsed * b.qps).min(b.burst);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests;
