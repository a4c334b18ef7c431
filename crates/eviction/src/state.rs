//! The eviction manager's rules over time, as pure functions (upstream `synchronize`'s first
//! half): which thresholds are met, which have waited out their grace period, and which
//! pressure conditions the node reports through the transition period.

use std::{collections::BTreeMap, time::Duration};

use kubelet_core::eviction::{Pressure, Signal, Threshold};
use tokio::time::Instant;

/// What the node measured of one signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Observation {
    /// How much is left (bytes, inodes or process IDs).
    pub available: u64,
    /// How much there is in all.
    pub capacity: u64,
}

impl Observation {
    /// `available` of `capacity`.
    pub fn new(available: u64, capacity: u64) -> Self {
        Observation { available, capacity }
    }
}

/// The signals measured in one round; a signal the node could not measure is absent.
pub type Observations = BTreeMap<Signal, Observation>;

/// The thresholds of `thresholds` that `observations` cross (upstream `thresholdsMet`): the
/// signal is below the threshold's amount, or, with `enforce_min_reclaim`, below that amount
/// plus the minimum reclaim (a threshold once met stays met until that much is free).
pub fn thresholds_met(
    thresholds: &[Threshold],
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|threshold| {
            let Some(observed) = observations.get(&threshold.signal) else { return false };
            let mut amount = threshold.value.amount(observed.capacity);
            if enforce_min_reclaim {
                amount += threshold.min_reclaim.map_or(0, |reclaim| reclaim.amount(observed.capacity));
            }
            amount > observed.available
        })
        .copied()
        .collect()
}

/// The conditions `thresholds` drive, each once, in the thresholds' order.
pub fn node_conditions(thresholds: &[Threshold]) -> Vec<Pressure> {
    let mut conditions = Vec::new();
    for threshold in thresholds {
        let condition = threshold.signal.condition();
        if !conditions.contains(&condition) {
            conditions.push(condition);
        }
    }
    conditions
}

/// Sorts thresholds so that memory comes first (upstream `byEvictionPriority`); the order
/// among the others is kept.
pub fn by_eviction_priority(thresholds: &mut [Threshold]) {
    thresholds.sort_by_key(|t| !matches!(t.signal, Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable));
}

/// What one round decided.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Round {
    /// The conditions the node reports now.
    pub conditions: Vec<Pressure>,
    /// The thresholds met whose grace periods are over: the ones to act on, memory first.
    pub to_act_on: Vec<Threshold>,
}

/// What the manager remembers between rounds.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// When each threshold met now was first seen met.
    first_observed: Vec<(Threshold, Instant)>,
    /// When each condition was last seen.
    conditions_last_observed: BTreeMap<Pressure, Instant>,
    /// The thresholds acted on last round, kept until their minimum reclaim is free.
    met: Vec<Threshold>,
}

impl State {
    /// A manager's state before its first round.
    pub fn new() -> Self {
        State::default()
    }

    /// One round at `now` over `observations` (upstream `synchronize` up to the ranking).
    pub fn observe(
        &mut self,
        thresholds: &[Threshold],
        observations: &Observations,
        transition_period: Duration,
        now: Instant,
    ) -> Round {
        let mut met = thresholds_met(thresholds, observations, false);
        // Those met before stay until their minimum reclaim is free as well.
        for threshold in thresholds_met(&self.met, observations, true) {
            if !met.contains(&threshold) {
                met.push(threshold);
            }
        }
        self.first_observed = met
            .iter()
            .map(|threshold| {
                let since = self.first_observed.iter().find(|(t, _)| t == threshold).map_or(now, |(_, at)| *at);
                (*threshold, since)
            })
            .collect();
        for condition in node_conditions(&met) {
            self.conditions_last_observed.insert(condition, now);
        }
        // A condition holds until it has not been seen for the transition period.
        self.conditions_last_observed.retain(|_, seen| now.duration_since(*seen) < transition_period);
        let conditions = self.conditions_last_observed.keys().copied().collect();
        let mut to_act_on: Vec<Threshold> = self
            .first_observed
            .iter()
            .filter(|(threshold, since)| now.duration_since(*since) >= threshold.grace_period)
            .map(|(threshold, _)| *threshold)
            .collect();
        self.met.clone_from(&to_act_on);
        by_eviction_priority(&mut to_act_on);
        Round { conditions, to_act_on }
    }
}

#[cfg(test)]
mod tests {
    use kubelet_core::eviction::ThresholdValue;

    use super::*;

    const MI: u64 = 1024 * 1024;

    fn memory(available_mi: u64) -> Observations {
        Observations::from([(Signal::MemoryAvailable, Observation::new(available_mi * MI, 1024 * MI))])
    }

    fn hard_memory(mi: u64) -> Threshold {
        Threshold::hard(Signal::MemoryAvailable, ThresholdValue::Quantity(mi * MI))
    }

    #[tokio::test(start_paused = true)]
    async fn a_hard_threshold_acts_at_once_and_its_condition_outlasts_it_by_the_transition_period() {
        let thresholds = [hard_memory(100)];
        let period = Duration::from_secs(300);
        let mut state = State::new();
        let round = state.observe(&thresholds, &memory(50), period, Instant::now());
        assert_eq!(round.conditions, [Pressure::Memory]);
        assert_eq!(round.to_act_on, thresholds);
        tokio::time::advance(Duration::from_secs(10)).await;
        let round = state.observe(&thresholds, &memory(500), period, Instant::now());
        assert_eq!(round.conditions, [Pressure::Memory], "still within the transition period");
        assert!(round.to_act_on.is_empty());
        tokio::time::advance(Duration::from_secs(300)).await;
        let round = state.observe(&thresholds, &memory(500), period, Instant::now());
        assert!(round.conditions.is_empty(), "five minutes without pressure");
    }

    #[tokio::test(start_paused = true)]
    async fn a_soft_threshold_waits_for_its_grace_period_and_forgets_a_dip() {
        let mut soft = hard_memory(300);
        soft.grace_period = Duration::from_secs(60);
        let thresholds = [soft];
        let mut state = State::new();
        let round = state.observe(&thresholds, &memory(200), Duration::from_secs(1), Instant::now());
        assert!(round.to_act_on.is_empty(), "met, grace period not over");
        assert_eq!(round.conditions, [Pressure::Memory], "the condition does not wait");
        tokio::time::advance(Duration::from_secs(30)).await;
        state.observe(&thresholds, &memory(400), Duration::from_secs(1), Instant::now());
        tokio::time::advance(Duration::from_secs(40)).await;
        let round = state.observe(&thresholds, &memory(200), Duration::from_secs(1), Instant::now());
        assert!(round.to_act_on.is_empty(), "the clock restarted after the dip");
        tokio::time::advance(Duration::from_secs(60)).await;
        let round = state.observe(&thresholds, &memory(200), Duration::from_secs(1), Instant::now());
        assert_eq!(round.to_act_on, thresholds);
    }

    #[tokio::test(start_paused = true)]
    async fn a_threshold_acted_on_stays_until_its_minimum_reclaim_is_free() {
        let mut threshold = hard_memory(100);
        threshold.min_reclaim = Some(ThresholdValue::Quantity(200 * MI));
        let thresholds = [threshold];
        let mut state = State::new();
        assert_eq!(state.observe(&thresholds, &memory(50), Duration::ZERO, Instant::now()).to_act_on, thresholds);
        let round = state.observe(&thresholds, &memory(250), Duration::ZERO, Instant::now());
        assert_eq!(round.to_act_on, thresholds, "250Mi free is below 100Mi + 200Mi");
        let round = state.observe(&thresholds, &memory(350), Duration::ZERO, Instant::now());
        assert!(round.to_act_on.is_empty());
    }

    #[test]
    fn percentages_are_of_the_capacity_and_missing_signals_are_not_met() {
        let threshold = Threshold::hard(Signal::NodeFsAvailable, ThresholdValue::Percentage(0.1));
        let observed = |available| Observations::from([(Signal::NodeFsAvailable, Observation::new(available, 1000))]);
        assert!(thresholds_met(&[threshold], &observed(99), false).len() == 1);
        assert!(thresholds_met(&[threshold], &observed(100), false).is_empty(), "not below");
        assert!(thresholds_met(&[threshold], &Observations::new(), false).is_empty());
    }

    #[test]
    fn memory_thresholds_come_first_and_conditions_once_each() {
        let disk = Threshold::hard(Signal::NodeFsAvailable, ThresholdValue::Percentage(0.1));
        let inodes = Threshold::hard(Signal::NodeFsInodesFree, ThresholdValue::Percentage(0.05));
        let mut thresholds = [disk, hard_memory(100), inodes];
        by_eviction_priority(&mut thresholds);
        assert_eq!(
            thresholds.map(|t| t.signal),
            [Signal::MemoryAvailable, Signal::NodeFsAvailable, Signal::NodeFsInodesFree]
        );
        assert_eq!(node_conditions(&thresholds), [Pressure::Memory, Pressure::Disk]);
    }
}
