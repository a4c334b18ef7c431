//! Eviction thresholds and node pressure (upstream `pkg/kubelet/eviction/api` and the parsing
//! of `ParseThresholdConfig`): what an eviction manager watches, what admission and the node's
//! status read from it.
//!
//! [`Thresholds::parse`] reads `evictionHard`, `evictionSoft`, `evictionSoftGracePeriod` and
//! `evictionMinimumReclaim` with upstream's rules and messages; [`NodePressure`] holds the
//! pressure conditions the manager last reported.

use std::{
    collections::BTreeMap,
    fmt,
    sync::atomic::{AtomicU8, Ordering},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;

use crate::resources::nano_units;

/// An eviction signal: an amount of something the node must not run out of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Signal {
    /// `memory.available`: memory capacity minus the node's working set.
    MemoryAvailable,
    /// `allocatableMemory.available`: allocatable memory minus the pods' working set.
    AllocatableMemoryAvailable,
    /// `nodefs.available`: free bytes on the filesystem of the root directory.
    NodeFsAvailable,
    /// `nodefs.inodesFree`: free inodes there.
    NodeFsInodesFree,
    /// `imagefs.available`: free bytes on the runtime's image filesystem.
    ImageFsAvailable,
    /// `imagefs.inodesFree`: free inodes there.
    ImageFsInodesFree,
    /// `pid.available`: process IDs left.
    PidAvailable,
}

/// What a signal measures, as upstream names it in eviction messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Resource {
    /// `memory`.
    Memory,
    /// `ephemeral-storage`.
    EphemeralStorage,
    /// `inodes`.
    Inodes,
    /// `pids`.
    Pids,
}

impl Resource {
    /// Upstream's resource name.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::EphemeralStorage => "ephemeral-storage",
            Resource::Inodes => "inodes",
            Resource::Pids => "pids",
        }
    }

    /// Whether amounts of it are bytes (printed with binary suffixes) rather than counts.
    pub fn is_bytes(self) -> bool {
        matches!(self, Resource::Memory | Resource::EphemeralStorage)
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Signal {
    /// Every signal.
    pub const ALL: [Signal; 7] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::PidAvailable,
    ];

    /// Upstream's name (`memory.available`).
    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// The signal named `name`.
    pub fn from_name(name: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The node condition it drives.
    pub fn condition(self) -> Pressure {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Pressure::Memory,
            Signal::PidAvailable => Pressure::Pid,
            _ => Pressure::Disk,
        }
    }

    /// What it measures.
    pub fn resource(self) -> Resource {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable => Resource::EphemeralStorage,
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A threshold's amount: absolute, or a share of the capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum ThresholdValue {
    /// Bytes, or a count for inodes and PIDs.
    Quantity(u64),
    /// A share of the capacity, 0 to 1.
    Percentage(f32),
}

impl ThresholdValue {
    /// The amount against `capacity` (upstream `GetThresholdQuantity`: a percentage is
    /// truncated to a whole unit).
    pub fn amount(self, capacity: u64) -> u64 {
        match self {
            ThresholdValue::Quantity(amount) => amount,
            // Reason: upstream converts through float64 and truncates, as here.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            ThresholdValue::Percentage(share) => (capacity as f64 * f64::from(share)) as u64,
        }
    }
}

/// One threshold: the signal is below `value` (upstream's only operator, `LessThan`).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Threshold {
    /// The signal.
    pub signal: Signal,
    /// The amount the signal must not go below.
    pub value: ThresholdValue,
    /// How long it must be crossed before pods are evicted; zero for a hard threshold.
    pub grace_period: Duration,
    /// How much beyond `value` must be free again before the threshold counts as resolved.
    pub min_reclaim: Option<ThresholdValue>,
}

impl Threshold {
    /// A hard threshold on `signal`.
    pub fn hard(signal: Signal, value: ThresholdValue) -> Self {
        Threshold { signal, value, grace_period: Duration::ZERO, min_reclaim: None }
    }

    /// Whether it is hard (no grace period): pods go without their own grace period.
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }
}

/// Upstream's default `evictionHard` on Linux.
pub const DEFAULT_EVICTION_HARD: [(&str, &str); 4] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
];

/// A threshold setting upstream refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
#[non_exhaustive]
pub struct ThresholdError {
    /// Upstream's message.
    pub message: String,
}

fn refuse(message: String) -> ThresholdError {
    ThresholdError { message }
}

/// The thresholds of one configuration.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Thresholds {
    /// Hard thresholds first, then soft ones, then the allocatable copies.
    pub thresholds: Vec<Threshold>,
}

impl Thresholds {
    /// Parses the configuration's maps as upstream's `ParseThresholdConfig`: every signal is
    /// known, a soft threshold has a grace period, `0%` and `100%` thresholds are ignored, and
    /// with `enforce_allocatable` (`enforceNodeAllocatable` holds `pods`) each hard
    /// `memory.available` threshold is copied to `allocatableMemory.available`.
    pub fn parse(
        hard: &BTreeMap<String, String>,
        soft: &BTreeMap<String, String>,
        soft_grace_periods: &BTreeMap<String, String>,
        minimum_reclaims: &BTreeMap<String, String>,
        enforce_allocatable: bool,
    ) -> Result<Thresholds, ThresholdError> {
        let mut thresholds = parse_statements(hard)?;
        let grace_periods = parse_grace_periods(soft_grace_periods)?;
        for mut threshold in parse_statements(soft)? {
            let Some(period) = grace_periods.get(&threshold.signal) else {
                return Err(refuse(format!(
                    "grace period must be specified for the soft eviction threshold {}",
                    threshold.signal
                )));
            };
            threshold.grace_period = *period;
            thresholds.push(threshold);
        }
        let reclaims = parse_minimum_reclaims(minimum_reclaims)?;
        for threshold in &mut thresholds {
            threshold.min_reclaim = reclaims.get(&threshold.signal).copied();
        }
        if enforce_allocatable {
            let copies: Vec<Threshold> = thresholds
                .iter()
                .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
                .map(|t| Threshold { signal: Signal::AllocatableMemoryAvailable, ..*t })
                .collect();
            thresholds.extend(copies);
        }
        Ok(Thresholds { thresholds })
    }

    /// What the hard thresholds hold back from pods (upstream `hardEvictionReservation`): in
    /// bytes, `memory.available`'s amount of `memory_capacity` and `nodefs.available`'s of
    /// `storage_capacity`. Node allocatable is capacity less the reserved resources less these.
    pub fn hard_reservation(&self, memory_capacity: u64, storage_capacity: u64) -> (u64, u64) {
        let amount = |signal, capacity| self.hard(signal).map_or(0, |t| t.value.amount(capacity));
        (amount(Signal::MemoryAvailable, memory_capacity), amount(Signal::NodeFsAvailable, storage_capacity))
    }

    /// The hard threshold on `signal`, if any.
    pub fn hard(&self, signal: Signal) -> Option<&Threshold> {
        self.thresholds.iter().find(|t| t.signal == signal && t.is_hard())
    }
}

fn known_signal(name: &str) -> Result<Signal, ThresholdError> {
    Signal::from_name(name).ok_or_else(|| refuse(format!("unsupported eviction signal {name}")))
}

fn parse_statements(statements: &BTreeMap<String, String>) -> Result<Vec<Threshold>, ThresholdError> {
    let mut thresholds = Vec::new();
    for (name, value) in statements {
        let signal = known_signal(name)?;
        if let Some(text) = value.strip_suffix('%') {
            if value == "0%" || value == "100%" {
                continue;
            }
            let share = parse_percentage(value, text)?;
            if share < 0.0 {
                return Err(refuse(format!("eviction percentage threshold {signal} must be >= 0%: {value}")));
            }
            if share > 1.0 {
                return Err(refuse(format!("eviction percentage threshold {signal} must be <= 100%: {value}")));
            }
            thresholds.push(Threshold::hard(signal, ThresholdValue::Percentage(share)));
            continue;
        }
        let amount = parse_amount(value)?;
        if amount <= 0 {
            return Err(refuse(format!("eviction threshold {signal} must be positive: {value}")));
        }
        thresholds.push(Threshold::hard(signal, ThresholdValue::Quantity(amount.unsigned_abs())));
    }
    Ok(thresholds)
}

fn parse_percentage(value: &str, number: &str) -> Result<f32, ThresholdError> {
    let percent: f32 = number.trim().parse().map_err(|_| refuse(format!("invalid percentage {value:?}")))?;
    Ok(percent / 100.0)
}

/// A quantity in whole units, rounded up as upstream's `Value()`.
fn parse_amount(value: &str) -> Result<i64, ThresholdError> {
    let nanos =
        nano_units(value).ok_or_else(|| refuse(format!("quantities must match the regular expression: {value:?}")))?;
    let units = nanos.div_euclid(1_000_000_000) + i128::from(nanos.rem_euclid(1_000_000_000) != 0);
    i64::try_from(units).map_err(|_| refuse(format!("quantity {value:?} is too large")))
}

fn parse_grace_periods(statements: &BTreeMap<String, String>) -> Result<BTreeMap<Signal, Duration>, ThresholdError> {
    let mut periods = BTreeMap::new();
    for (name, value) in statements {
        let signal = known_signal(name)?;
        let period = crate::clock::parse_duration(value).map_err(|_| {
            refuse(format!("invalid eviction grace period specified: {value}, must be a positive value"))
        })?;
        periods.insert(signal, period);
    }
    Ok(periods)
}

fn parse_minimum_reclaims(
    statements: &BTreeMap<String, String>,
) -> Result<BTreeMap<Signal, ThresholdValue>, ThresholdError> {
    let mut reclaims = BTreeMap::new();
    for (name, value) in statements {
        let signal = known_signal(name)?;
        if let Some(text) = value.strip_suffix('%') {
            let share = parse_percentage(value, text)?;
            if share <= 0.0 {
                return Err(refuse(format!("eviction percentage minimum reclaim {signal} must be positive: {value}")));
            }
            reclaims.insert(signal, ThresholdValue::Percentage(share));
            continue;
        }
        let amount = parse_amount(value)?;
        if amount < 0 {
            return Err(refuse(format!("negative eviction minimum reclaim specified for {signal}")));
        }
        reclaims.insert(signal, ThresholdValue::Quantity(amount.unsigned_abs()));
    }
    Ok(reclaims)
}

/// A pressure condition of the node: upstream's three, a closed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pressure {
    /// `MemoryPressure`.
    Memory,
    /// `DiskPressure`.
    Disk,
    /// `PIDPressure`.
    Pid,
}

impl Pressure {
    /// Every condition, in upstream's order.
    pub const ALL: [Pressure; 3] = [Pressure::Memory, Pressure::Disk, Pressure::Pid];

    /// The node condition's type.
    pub fn condition_type(self) -> &'static str {
        match self {
            Pressure::Memory => "MemoryPressure",
            Pressure::Disk => "DiskPressure",
            Pressure::Pid => "PIDPressure",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Pressure::Memory => 1,
            Pressure::Disk => 2,
            Pressure::Pid => 4,
        }
    }
}

impl fmt::Display for Pressure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.condition_type())
    }
}

/// The pressure conditions the eviction manager last reported; admission and the node's
/// status read them. None is set until a manager sets them.
#[derive(Debug, Default)]
pub struct NodePressure {
    bits: AtomicU8,
}

impl NodePressure {
    /// No pressure.
    pub fn new() -> Self {
        NodePressure::default()
    }

    /// Replaces the conditions with `conditions`.
    pub fn set(&self, conditions: &[Pressure]) {
        let bits = conditions.iter().fold(0, |bits, c| bits | c.bit());
        self.bits.store(bits, Ordering::Relaxed);
    }

    /// The conditions now, in upstream's order.
    pub fn conditions(&self) -> Vec<Pressure> {
        let bits = self.bits.load(Ordering::Relaxed);
        Pressure::ALL.into_iter().filter(|c| bits & c.bit() != 0).collect()
    }

    /// Whether `condition` holds.
    pub fn has(&self, condition: Pressure) -> bool {
        self.bits.load(Ordering::Relaxed) & condition.bit() != 0
    }
}

/// Upstream's admission under pressure (the eviction manager's `Admit`): with no pressure every
/// pod; a critical pod always; under memory pressure alone, every pod but a BestEffort one that
/// does not tolerate the memory-pressure taint; under any other, none. A refusal is reason
/// `Evicted` with upstream's message.
pub fn admit(pod: &Pod, pressure: &NodePressure) -> Result<(), String> {
    let conditions = pressure.conditions();
    if conditions.is_empty() || crate::types::is_critical_pod(pod) {
        return Ok(());
    }
    if conditions == [Pressure::Memory] {
        let best_effort = crate::resources::qos_class(pod) == "BestEffort";
        if !best_effort || tolerates_memory_pressure(pod) {
            return Ok(());
        }
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.condition_type()).collect();
    Err(format!("The node had condition: [{}]. ", names.join(" ")))
}

/// Whether the pod tolerates `node.kubernetes.io/memory-pressure:NoSchedule`.
fn tolerates_memory_pressure(pod: &Pod) -> bool {
    const KEY: &str = "node.kubernetes.io/memory-pressure";
    pod.spec.iter().flat_map(|s| s.tolerations.iter().flatten()).any(|t| {
        let effect = t.effect.as_deref().unwrap_or_default();
        let effect_matches = effect.is_empty() || effect == "NoSchedule";
        let key_matches = t.key.as_deref().is_none_or(|k| k.is_empty() || k == KEY);
        let operator = t.operator.as_deref().unwrap_or("Equal");
        let value_matches = operator == "Exists" || t.value.as_deref().unwrap_or_default().is_empty();
        // An empty key with `Exists` tolerates every taint; an empty key otherwise none.
        let key_ok = if t.key.as_deref().unwrap_or_default().is_empty() { operator == "Exists" } else { key_matches };
        effect_matches && key_ok && value_matches
    })
}

/// A quantity as upstream prints it: bytes with the largest exact binary suffix (`100Mi`,
/// `3276801`), counts with the largest exact decimal one (`5k`).
pub fn format_amount(amount: u64, resource: Resource) -> String {
    let (base, suffixes): (u64, &[&str]) = if resource.is_bytes() {
        (1024, &["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
    } else {
        (1000, &["", "k", "M", "G", "T", "P", "E"])
    };
    let mut value = amount;
    let mut suffix = 0;
    while value != 0 && value.is_multiple_of(base) && suffix + 1 < suffixes.len() {
        value /= base;
        suffix += 1;
    }
    format!("{value}{}", suffixes[suffix])
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn parse(
        hard: &[(&str, &str)],
        soft: &[(&str, &str)],
        grace: &[(&str, &str)],
    ) -> Result<Thresholds, ThresholdError> {
        Thresholds::parse(&map(hard), &map(soft), &map(grace), &BTreeMap::new(), false)
    }

    #[test]
    fn upstream_defaults_parse_to_four_hard_thresholds() {
        let thresholds = parse(&DEFAULT_EVICTION_HARD, &[], &[]).unwrap();
        assert_eq!(thresholds.thresholds.len(), 4);
        let memory = thresholds.hard(Signal::MemoryAvailable).unwrap();
        assert_eq!(memory.value, ThresholdValue::Quantity(100 * 1024 * 1024));
        let nodefs = thresholds.hard(Signal::NodeFsAvailable).unwrap();
        assert_eq!(nodefs.value.amount(1000), 100);
    }

    #[test]
    fn bad_settings_get_upstream_messages() {
        type Pairs = &'static [(&'static str, &'static str)];
        let cases: [(Pairs, Pairs, Pairs, &str); 6] = [
            (&[("memory.free", "1Mi")], &[], &[], "unsupported eviction signal memory.free"),
            (
                &[("nodefs.available", "150%")],
                &[],
                &[],
                "eviction percentage threshold nodefs.available must be <= 100%: 150%",
            ),
            (
                &[("nodefs.available", "-5%")],
                &[],
                &[],
                "eviction percentage threshold nodefs.available must be >= 0%: -5%",
            ),
            (&[("memory.available", "0")], &[], &[], "eviction threshold memory.available must be positive: 0"),
            (
                &[],
                &[("memory.available", "1Gi")],
                &[],
                "grace period must be specified for the soft eviction threshold memory.available",
            ),
            (
                &[],
                &[("memory.available", "1Gi")],
                &[("memory.available", "soon")],
                "invalid eviction grace period specified: soon, must be a positive value",
            ),
        ];
        for (hard, soft, grace, message) in cases {
            assert_eq!(parse(hard, soft, grace).unwrap_err().message, message);
        }
    }

    #[test]
    fn soft_thresholds_take_their_grace_period_and_min_reclaim_applies_to_both() {
        let thresholds = Thresholds::parse(
            &map(&[("memory.available", "100Mi")]),
            &map(&[("memory.available", "1Gi")]),
            &map(&[("memory.available", "1m30s")]),
            &map(&[("memory.available", "500Mi")]),
            true,
        )
        .unwrap();
        let [hard, soft, allocatable] = thresholds.thresholds.as_slice() else { panic!("{thresholds:?}") };
        assert!(hard.is_hard());
        assert_eq!(soft.grace_period, Duration::from_secs(90));
        assert_eq!(allocatable.signal, Signal::AllocatableMemoryAvailable, "only the hard one is copied");
        for t in [hard, soft, allocatable] {
            assert_eq!(t.min_reclaim, Some(ThresholdValue::Quantity(500 * 1024 * 1024)));
        }
    }

    #[test]
    fn hard_thresholds_reserve_memory_and_node_storage() {
        let thresholds =
            parse(&DEFAULT_EVICTION_HARD, &[("memory.available", "1Gi")], &[("memory.available", "1m")]).unwrap();
        assert_eq!(thresholds.hard_reservation(8 << 30, 1000), (100 << 20, 100), "soft thresholds reserve nothing");
        assert_eq!(Thresholds::default().hard_reservation(8 << 30, 1000), (0, 0));
    }

    #[test]
    fn zero_and_full_percentages_are_ignored() {
        let thresholds = parse(&[("nodefs.available", "0%"), ("imagefs.available", "100%")], &[], &[]).unwrap();
        assert!(thresholds.thresholds.is_empty());
    }

    #[test]
    fn amounts_print_as_upstream_quantities() {
        assert_eq!(format_amount(100 * 1024 * 1024, Resource::Memory), "100Mi");
        assert_eq!(format_amount(3_276_801, Resource::EphemeralStorage), "3276801");
        assert_eq!(format_amount(0, Resource::Memory), "0");
        assert_eq!(format_amount(5000, Resource::Inodes), "5k");
    }

    fn guaranteed_pod() -> Arc<Pod> {
        use k8s_openapi::{api::core::v1::ResourceRequirements, apimachinery::pkg::api::resource::Quantity};
        let mut pod = crate::testing::pod("g", &["c"]);
        let both = [("memory".to_owned(), Quantity("64Mi".into())), ("cpu".to_owned(), Quantity("100m".into()))];
        pod.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            requests: Some(both.clone().into()),
            limits: Some(both.into()),
            ..Default::default()
        });
        Arc::new(pod)
    }

    #[test]
    fn admission_under_pressure_is_upstreams() {
        let pressure = NodePressure::new();
        let best_effort = Arc::new(crate::testing::pod("be", &["c"]));
        let guaranteed = guaranteed_pod();
        assert!(admit(&best_effort, &pressure).is_ok());
        pressure.set(&[Pressure::Memory]);
        assert_eq!(admit(&best_effort, &pressure).unwrap_err(), "The node had condition: [MemoryPressure]. ");
        assert!(admit(&guaranteed, &pressure).is_ok());
        let mut tolerant = (*best_effort).clone();
        tolerant.spec.as_mut().unwrap().tolerations = Some(vec![k8s_openapi::api::core::v1::Toleration {
            key: Some("node.kubernetes.io/memory-pressure".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
        assert!(admit(&tolerant, &pressure).is_ok());
        pressure.set(&[Pressure::Memory, Pressure::Disk]);
        assert_eq!(
            admit(&guaranteed, &pressure).unwrap_err(),
            "The node had condition: [MemoryPressure DiskPressure]. "
        );
        let mut static_pod = (*best_effort).clone();
        static_pod.metadata.annotations =
            Some([("kubernetes.io/config.source".to_owned(), "file".to_owned())].into_iter().collect());
        assert!(admit(&static_pod, &pressure).is_ok(), "critical pods are admitted");
    }

    #[test]
    fn pressure_flags_round_trip() {
        let pressure = NodePressure::new();
        pressure.set(&[Pressure::Pid, Pressure::Memory]);
        assert_eq!(pressure.conditions(), [Pressure::Memory, Pressure::Pid]);
        assert!(!pressure.has(Pressure::Disk));
    }
}
