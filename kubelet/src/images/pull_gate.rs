//! How many image pulls run at once: `serializeImagePulls` (default true) and
//! `maxParallelImagePulls` (GA), as upstream. Serialized: one pull at a time, the others
//! wait in order. Not serialized: at most `maxParallelImagePulls` at once, or no limit when
//! it is unset. Upstream's defaulting applies: `serializeImagePulls` unset becomes false when
//! `maxParallelImagePulls` is 2 or more (so setting that one alone is enough), and its
//! validation refuses `maxParallelImagePulls` < 1, or > 1 with serialized pulls.

use serde::Serialize;
use tokio::sync::{Semaphore, SemaphorePermit};

/// The validated pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PullSettings {
    pub serialize_image_pulls: bool,
    pub max_parallel_image_pulls: Option<u32>,
}

impl Default for PullSettings {
    fn default() -> Self {
        PullSettings {
            serialize_image_pulls: true,
            max_parallel_image_pulls: None,
        }
    }
}

impl PullSettings {
    /// From `--serialize-image-pulls` (wins), the file's `serializeImagePulls` and its
    /// `maxParallelImagePulls`; the error is upstream's text without its "invalid
    /// configuration: " prefix.
    pub fn parse(
        flag: Option<bool>,
        file: Option<bool>,
        max: Option<&serde_json::Value>,
    ) -> Result<PullSettings, String> {
        let max = match max {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(
                v.as_i64()
                    .filter(|n| i32::try_from(*n).is_ok())
                    .ok_or_else(|| format!("maxParallelImagePulls: {v} is not a 32-bit integer"))?,
            ),
        };
        // Upstream's defaulting of the file, then the flag over it.
        let file = file.unwrap_or(max.is_none_or(|m| m < 2));
        let serialize = flag.unwrap_or(file);
        if let Some(m) = max
            && m < 1
        {
            return Err(format!(
                "maxParallelImagePulls {m} must be a positive number"
            ));
        }
        if serialize && max.is_some_and(|m| m > 1) {
            return Err("maxParallelImagePulls cannot be larger than 1 unless SerializeImagePulls (--serialize-image-pulls) is set to false".into());
        }
        Ok(PullSettings {
            serialize_image_pulls: serialize,
            max_parallel_image_pulls: max.map(|m| m as u32),
        })
    }

    /// Pulls allowed at once (`None`: no limit).
    pub fn limit(&self) -> Option<u32> {
        if self.serialize_image_pulls {
            Some(1)
        } else {
            self.max_parallel_image_pulls
        }
    }
}

/// The node's pulls pass through here: [`PullGate::enter`] waits for a slot (fairly, in
/// arrival order) and the permit holds it for the pull; then the pull needs a token of the
/// registry bucket ([`PullGate::try_accept`], `registryPullQPS`/`registryBurst`), taken
/// once the slot is held, as upstream's puller calls its throttled image service.
#[derive(Debug)]
pub struct PullGate {
    slots: Option<Semaphore>,
    throttle: super::throttle::PullThrottle,
}

impl PullGate {
    /// Without a registry bucket (see [`PullGate::with_registry_limit`]).
    pub fn new(s: &PullSettings) -> PullGate {
        PullGate {
            slots: s.limit().map(|n| Semaphore::new(n as usize)),
            throttle: Default::default(),
        }
    }

    /// Adds the `registryPullQPS` / `registryBurst` bucket (0 QPS: none).
    pub fn with_registry_limit(mut self, qps: i32, burst: i32) -> PullGate {
        self.throttle = super::throttle::PullThrottle::new(qps, burst);
        self
    }

    /// Whether a pull may go to the registry now (a token taken), never waiting.
    pub fn try_accept(&self) -> bool {
        self.throttle.try_accept()
    }

    /// One pull at a time (upstream's default).
    pub fn serial() -> PullGate {
        PullGate::new(&PullSettings::default())
    }

    /// Waits for a slot; `None` when pulls are unlimited.
    pub async fn enter(&self) -> Option<SemaphorePermit<'_>> {
        match &self.slots {
            // The semaphore is never closed.
            Some(s) => s.acquire().await.ok(),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests;
