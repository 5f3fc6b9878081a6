//! The shutdown settings (`shutdownGracePeriod`, `shutdownGracePeriodCriticalPods`,
//! `shutdownGracePeriodByPodPriority`) as upstream validates and migrates them, and the
//! sorting of pods into priority groups. A leaf: the config module reads it.

use k8s_openapi::api::core::v1::Pod;
use std::time::Duration;

/// `scheduling.SystemCriticalPriority` and the priority of pods without a class.
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
const DEFAULT_PRIORITY: i32 = 0;

pub use crate::settings::file::PriorityGrace;

/// The validated shutdown settings: the groups sorted by priority (empty: disabled).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Settings {
    pub groups: Vec<PriorityGrace>,
}

impl Settings {
    /// Upstream's validation and its migration of the two-period form into two groups.
    pub fn new(
        grace: Duration,
        critical: Duration,
        by_priority: Vec<PriorityGrace>,
    ) -> Result<Settings, String> {
        if critical > grace {
            return Err(format!(
                "shutdownGracePeriodCriticalPods {critical:?} must be <= shutdownGracePeriod {grace:?}"
            ));
        }
        for (name, d) in [
            ("shutdownGracePeriod", grace),
            ("shutdownGracePeriodCriticalPods", critical),
        ] {
            if !d.is_zero() && d < Duration::from_secs(1) {
                return Err(format!(
                    "{name} {d:?} must be either zero or otherwise >= 1 sec"
                ));
            }
        }
        if !grace.is_zero() && !by_priority.is_empty() {
            return Err(
                "Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the same time"
                    .into(),
            );
        }
        if let Some(g) = by_priority
            .iter()
            .find(|g| g.shutdown_grace_period_seconds < 0)
        {
            return Err(format!(
                "shutdownGracePeriodByPodPriority: priority {} has a negative shutdownGracePeriodSeconds",
                g.priority
            ));
        }
        let mut groups = if by_priority.is_empty() {
            if grace.is_zero() {
                Vec::new()
            } else {
                vec![
                    PriorityGrace {
                        priority: DEFAULT_PRIORITY,
                        shutdown_grace_period_seconds: (grace - critical).as_secs() as i64,
                    },
                    PriorityGrace {
                        priority: SYSTEM_CRITICAL_PRIORITY,
                        shutdown_grace_period_seconds: critical.as_secs() as i64,
                    },
                ]
            }
        } else {
            by_priority
        };
        groups.sort_by_key(|g| g.priority);
        Ok(Settings { groups })
    }

    pub fn enabled(&self) -> bool {
        !self.groups.is_empty()
    }

    /// The delay logind must allow: the sum of the groups' periods.
    pub fn period_requested(&self) -> Duration {
        Duration::from_secs(
            self.groups
                .iter()
                .map(|g| g.shutdown_grace_period_seconds.max(0) as u64)
                .sum(),
        )
    }
}

/// Pods sorted into the groups (same order as `groups`): a pod goes to the highest group whose
/// priority is not above its own; pods below every group go to the lowest, as upstream.
pub fn group_pods<'a>(groups: &[PriorityGrace], pods: &'a [Pod]) -> Vec<Vec<&'a Pod>> {
    let mut out = vec![Vec::new(); groups.len()];
    if groups.is_empty() {
        return out;
    }
    for pod in pods {
        let prio = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let i = groups.iter().rposition(|g| g.priority <= prio).unwrap_or(0);
        out[i].push(pod);
    }
    out
}
