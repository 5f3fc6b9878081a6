//! The threshold bookkeeping of upstream's synchronize: which thresholds are met (with min
//! reclaim while one stays unresolved), since when (grace periods), which node conditions
//! they raise and how long those stay (`evictionPressureTransitionPeriod`). Pure: time comes
//! in as an argument.

use super::signals::Observations;
use crate::cm::{Eviction, Signal, Threshold};
use std::collections::BTreeMap;
use std::time::Instant;

/// A node condition the eviction manager reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Condition {
    MemoryPressure,
    DiskPressure,
    PidPressure,
}

impl Condition {
    pub const ALL: [Condition; 3] = [
        Condition::MemoryPressure,
        Condition::DiskPressure,
        Condition::PidPressure,
    ];

    /// The Node condition type.
    pub fn name(self) -> &'static str {
        match self {
            Condition::MemoryPressure => "MemoryPressure",
            Condition::DiskPressure => "DiskPressure",
            Condition::PidPressure => "PIDPressure",
        }
    }

    /// Upstream's signalToNodeCondition.
    pub fn of(signal: Signal) -> Condition {
        match signal {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => {
                Condition::MemoryPressure
            }
            Signal::PidAvailable => Condition::PidPressure,
            _ => Condition::DiskPressure,
        }
    }
}

/// Whether `t` is met by `obs` (upstream's thresholdsMet): what is available is below the
/// threshold, plus its min reclaim when `with_min_reclaim`.
pub fn is_met(t: &Threshold, obs: &Observations, with_min_reclaim: bool) -> bool {
    let Some(o) = obs.get(&t.signal) else {
        return false;
    };
    let mut quantity = t.value.of_capacity(o.capacity);
    if with_min_reclaim && let Some(m) = t.min_reclaim {
        quantity += m.of_capacity(o.capacity);
    }
    quantity > o.available
}

/// The thresholds of `list` that `obs` meets.
pub fn met(list: &[Threshold], obs: &Observations, with_min_reclaim: bool) -> Vec<Threshold> {
    list.iter()
        .filter(|t| is_met(t, obs, with_min_reclaim))
        .cloned()
        .collect()
}

/// What one pass decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pass {
    /// Thresholds met past their grace period whose stats changed since the last pass,
    /// memory ones first (upstream's byEvictionPriority).
    pub to_act: Vec<Threshold>,
    /// The node conditions to report now.
    pub conditions: Vec<Condition>,
}

/// The state upstream's manager keeps between passes.
#[derive(Debug)]
pub struct Tracker {
    cfg: Eviction,
    first_observed: Vec<(Threshold, Instant)>,
    condition_last_observed: BTreeMap<Condition, Instant>,
    met: Vec<Threshold>,
    last_observations: Observations,
}

impl Tracker {
    pub fn new(cfg: Eviction) -> Self {
        Self {
            cfg,
            first_observed: Vec::new(),
            condition_last_observed: BTreeMap::new(),
            met: Vec::new(),
            last_observations: Observations::new(),
        }
    }

    pub fn thresholds(&self) -> &[Threshold] {
        &self.cfg.thresholds
    }

    /// One pass over fresh observations at `now`.
    pub fn observe(&mut self, obs: &Observations, now: Instant) -> Pass {
        // Met now, ignoring grace periods; plus those met before whose min reclaim is not
        // reached yet.
        let mut thresholds = met(&self.cfg.thresholds, obs, false);
        for t in met(&self.met, obs, true) {
            if !thresholds.contains(&t) {
                thresholds.push(t);
            }
        }
        let first_observed: Vec<(Threshold, Instant)> = thresholds
            .iter()
            .map(|t| {
                let since = self
                    .first_observed
                    .iter()
                    .find(|(p, _)| p == t)
                    .map_or(now, |(_, at)| *at);
                (t.clone(), since)
            })
            .collect();
        for t in &thresholds {
            self.condition_last_observed
                .insert(Condition::of(t.signal), now);
        }
        // A condition holds while it was observed within the transition period (upstream's
        // nodeConditionsObservedSince: a zero period reports none).
        let period = self.cfg.pressure_transition_period;
        self.condition_last_observed
            .retain(|_, at| now.saturating_duration_since(*at) < period);
        let conditions: Vec<Condition> = self.condition_last_observed.keys().copied().collect();
        let past_grace: Vec<Threshold> = first_observed
            .iter()
            .filter(|(t, at)| now.saturating_duration_since(*at) >= t.grace_period)
            .map(|(t, _)| t.clone())
            .collect();
        self.first_observed = first_observed;
        self.met = past_grace.clone();
        // Only thresholds whose observation is newer than the last pass's drive evictions.
        let mut to_act: Vec<Threshold> = past_grace
            .into_iter()
            .filter(|t| {
                let Some(o) = obs.get(&t.signal) else {
                    return false;
                };
                self.last_observations
                    .get(&t.signal)
                    .is_none_or(|last| o.time > last.time)
            })
            .collect();
        to_act.sort_by_key(|t| Condition::of(t.signal) != Condition::MemoryPressure);
        self.last_observations = obs.clone();
        Pass { to_act, conditions }
    }
}
