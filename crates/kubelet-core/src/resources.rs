//! Resource quantities and QoS classes, as the kubelet reads them from pod specs.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Container, Pod},
    apimachinery::pkg::api::resource::Quantity,
};

/// Parses a Kubernetes quantity (`100m`, `1.5`, `64Mi`, `1G`, `2e3`) into its value in base units
/// (cores for CPU, bytes for memory). `None` when it does not parse.
pub fn parse_quantity(quantity: &str) -> Option<f64> {
    let q = quantity.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let value: f64 = number.parse().ok()?;
    let multiplier = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent if exponent.starts_with(['e', 'E']) => 10f64.powi(exponent[1..].parse().ok()?),
        _ => return None,
    };
    Some(value * multiplier)
}

/// A quantity in nano-units, exact as upstream's `resource.Quantity` keeps it (`1.1` is
/// 1,100,000,000, where a float makes it 1,100,000,000.0000002); what is left below one
/// nano-unit rounds up. `None` when it does not parse or does not fit.
pub fn nano_units(quantity: &str) -> Option<i128> {
    let q = quantity.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let (negative, number) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || !(whole.chars().chain(fraction.chars()).all(|c| c.is_ascii_digit())) {
        return None;
    }
    let digits: i128 = format!("{whole}{fraction}").parse().ok()?;
    // The value is `digits * 10^exponent * 2^binary` units, kept in nano-units.
    let (mut exponent, binary): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        exponent if exponent.starts_with(['e', 'E']) => (exponent[1..].parse().ok()?, 0),
        _ => return None,
    };
    exponent += 9 - i32::try_from(fraction.len()).ok()?;
    let mut value = digits.checked_mul(1i128.checked_shl(binary)?)?;
    if exponent >= 0 {
        value = value.checked_mul(10i128.checked_pow(u32::try_from(exponent).ok()?)?)?;
    } else {
        let scale = 10i128.checked_pow(exponent.unsigned_abs())?;
        value = value.div_euclid(scale) + i128::from(value.rem_euclid(scale) != 0);
    }
    Some(if negative { -value } else { value })
}

/// `nano` nano-units in units of `per` nano-units, rounded up, if it fits in an `i64`.
fn scaled_up(nano: i128, per: i128) -> Option<i64> {
    i64::try_from(nano.div_euclid(per) + i128::from(nano.rem_euclid(per) != 0)).ok()
}

/// A quantity in milli-units, rounded up (CPU in millicores; upstream `MilliValue`).
pub fn milli(quantity: &Quantity) -> Option<i64> {
    scaled_up(nano_units(&quantity.0)?, 1_000_000)
}

/// A quantity in whole units, rounded up (memory in bytes; upstream `Value`).
pub fn units(quantity: &Quantity) -> Option<i64> {
    scaled_up(nano_units(&quantity.0)?, 1_000_000_000)
}

/// The value of a `resourceFieldRef` to `resource` (`limits.cpu`, `requests.memory`, ...) of
/// `container`, in units of `divisor` and rounded up, as upstream's
/// `ExtractContainerResourceValue` after `defaultPodLimitsForDownwardAPI`: a CPU, memory or
/// ephemeral-storage limit the container does not set (or sets to zero) is the node's
/// `allocatable` one. A limit the node's allocatable does not name either is an error here,
/// where upstream would write zero for a resource it does not track.
pub fn resource_field_value(
    container: &Container,
    resource: &str,
    divisor: Option<&Quantity>,
    allocatable: &BTreeMap<String, Quantity>,
) -> Result<String, String> {
    let unsupported = || format!("unsupported container resource : {resource}");
    let (limit, name) = match resource.split_once('.') {
        Some(("limits", name)) => (true, name),
        Some(("requests", name)) => (false, name),
        _ => return Err(unsupported()),
    };
    if !matches!(name, "cpu" | "memory" | "ephemeral-storage") && !name.starts_with("hugepages-") {
        return Err(unsupported());
    }
    let set = container_resource(container, name, limit).filter(|q| nano_units(&q.0).is_some_and(|v| v != 0));
    let value = match set {
        Some(quantity) => Some(quantity),
        None if limit && matches!(name, "cpu" | "memory" | "ephemeral-storage") => {
            Some(allocatable.get(name).ok_or_else(|| format!("the node's allocatable {name} is not known"))?)
        }
        None => None,
    };
    let value = value.map_or(Some(0), |q| nano_units(&q.0)).ok_or_else(|| format!("{resource}: not a quantity"))?;
    let divisor = divisor.and_then(|d| nano_units(&d.0)).filter(|d| *d != 0).unwrap_or(1_000_000_000);
    // CPU counts in millicores, everything else in whole units, each rounded up first.
    let per: i128 = if name == "cpu" { 1_000_000 } else { 1_000_000_000 };
    let (value, divisor) = (scaled_up(value, per).unwrap_or(i64::MAX), scaled_up(divisor, per).unwrap_or(1).max(1));
    Ok(scaled_up(i128::from(value), i128::from(divisor)).unwrap_or(i64::MAX).to_string())
}

/// A container's request (or, with `limit`, limit) of `resource`, if set.
pub fn container_resource<'a>(container: &'a Container, resource: &str, limit: bool) -> Option<&'a Quantity> {
    let resources = container.resources.as_ref()?;
    let map = if limit { resources.limits.as_ref() } else { resources.requests.as_ref() };
    map?.get(resource)
}

/// A pod's requests of `resource` (upstream's `PodRequests`): its containers' sum, raised to
/// any init container's (plus the sidecars started before it), with the sidecars' requests
/// added, and the pod's `overhead` on top. `scaled` reads one quantity (millicores for CPU,
/// units otherwise).
pub fn pod_request(pod: &Pod, resource: &str, scaled: fn(&Quantity) -> Option<i64>) -> i64 {
    pod_request_without_overhead(pod, resource, scaled) + overhead(pod, resource, scaled)
}

/// [`pod_request`] without the pod's `overhead` (upstream's `PodRequests` with
/// `ExcludeOverhead`), as the sandbox's resources are given to the runtime.
pub fn pod_request_without_overhead(pod: &Pod, resource: &str, scaled: fn(&Quantity) -> Option<i64>) -> i64 {
    let Some(spec) = pod.spec.as_ref() else { return 0 };
    let request = |c: &k8s_openapi::api::core::v1::Container| {
        container_resource(c, resource, false).and_then(scaled).unwrap_or(0)
    };
    let mut total: i64 = spec.containers.iter().map(request).sum();
    let (mut sidecars, mut init_peak) = (0i64, 0i64);
    for init in spec.init_containers.iter().flatten() {
        if init.restart_policy.as_deref() == Some("Always") {
            total += request(init);
            sidecars += request(init);
            init_peak = init_peak.max(sidecars);
        } else {
            init_peak = init_peak.max(request(init) + sidecars);
        }
    }
    total.max(init_peak)
}

/// The pod's `overhead` of `resource`, zero when it names none.
fn overhead(pod: &Pod, resource: &str, scaled: fn(&Quantity) -> Option<i64>) -> i64 {
    let overhead = pod.spec.as_ref().and_then(|spec| spec.overhead.as_ref());
    overhead.and_then(|o| o.get(resource)).and_then(scaled).unwrap_or(0)
}

/// Whether any container of the pod, init containers included, requests `resource`: upstream's
/// `PodRequests` then names it, even at zero.
pub fn pod_requests_resource(pod: &Pod, resource: &str) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return false };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| container_resource(c, resource, false).is_some())
}

/// A pod's effective CPU (millicores) and memory (bytes) requests (upstream's `PodRequests`:
/// init containers, sidecars and the pod overhead counted as upstream counts them).
pub fn pod_requests(pod: &Pod) -> (i64, i64) {
    (pod_request(pod, "cpu", milli), pod_request(pod, "memory", units))
}

/// A pod's limit of `resource` (upstream's `PodLimits`), when any container limits it: its
/// containers' and sidecars' sum, raised to any init container's (plus the sidecars started
/// before it), with the pod's `overhead` added. `scaled` reads one quantity (millicores for CPU,
/// units otherwise).
pub fn pod_limit(pod: &Pod, resource: &str, scaled: fn(&Quantity) -> Option<i64>) -> Option<i64> {
    pod_limit_without_overhead(pod, resource, scaled).map(|limit| limit + overhead(pod, resource, scaled))
}

/// [`pod_limit`] without the pod's `overhead` (upstream's `PodLimits` with `ExcludeOverhead`),
/// as the sandbox's resources are given to the runtime.
pub fn pod_limit_without_overhead(pod: &Pod, resource: &str, scaled: fn(&Quantity) -> Option<i64>) -> Option<i64> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &Container| container_resource(c, resource, true).and_then(scaled);
    let mut total = sum_set(spec.containers.iter().map(limit));
    let mut sidecars = None;
    let mut init_peak = None;
    for init in spec.init_containers.iter().flatten() {
        if init.restart_policy.as_deref() == Some("Always") {
            total = sum_set([total, limit(init)]);
            sidecars = sum_set([sidecars, limit(init)]);
            init_peak = init_peak.max(sidecars);
        } else {
            init_peak = init_peak.max(sum_set([limit(init), sidecars]));
        }
    }
    total.max(init_peak)
}

/// The sum of the amounts that are set, or `None` when none is.
fn sum_set(amounts: impl IntoIterator<Item = Option<i64>>) -> Option<i64> {
    amounts.into_iter().flatten().reduce(|a, b| a + b)
}

/// A pod's CPU and memory limits (upstream's `PodLimits`, see [`pod_limit`]), in millicores and
/// bytes, and whether every container (each init container counted with the sidecars before it)
/// limits CPU, and memory: upstream's `cpuLimitsDeclared` and `memoryLimitsDeclared`, which decide
/// whether a Burstable pod's cgroup is capped.
pub fn pod_limits(pod: &Pod) -> PodLimits {
    PodLimits {
        cpu_milli: pod_limit(pod, "cpu", milli),
        memory_bytes: pod_limit(pod, "memory", units),
        cpu_declared: limits_declared(pod, "cpu", milli),
        memory_declared: limits_declared(pod, "memory", units),
    }
}

/// Whether every container limits `resource` to more than zero, an init container counting the
/// limits of the sidecars started before it.
fn limits_declared(pod: &Pod, resource: &str, scaled: fn(&Quantity) -> Option<i64>) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return true };
    let limit = |c: &Container| container_resource(c, resource, true).and_then(scaled);
    let declared = |amount: Option<i64>| amount.is_some_and(|v| v != 0);
    let mut all = spec.containers.iter().all(|c| declared(limit(c)));
    let mut sidecars = None;
    for init in spec.init_containers.iter().flatten() {
        if init.restart_policy.as_deref() == Some("Always") {
            sidecars = sum_set([sidecars, limit(init)]);
            all &= declared(sidecars);
        } else {
            all &= declared(sum_set([limit(init), sidecars]));
        }
    }
    all
}

/// A pod's CPU and memory limits, from [`pod_limits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodLimits {
    /// The CPU limit in millicores, when any container has one.
    pub cpu_milli: Option<i64>,
    /// The memory limit in bytes, when any container has one.
    pub memory_bytes: Option<i64>,
    /// Every container limits CPU (upstream's `cpuLimitsDeclared`).
    pub cpu_declared: bool,
    /// Every container limits memory (upstream's `memoryLimitsDeclared`).
    pub memory_declared: bool,
}

/// The resource name of huge pages of `page_size` bytes (upstream's `HugePageResourceName`):
/// `hugepages-2Mi` for 2 MiB pages.
pub fn hugepage_resource(page_size: u64) -> String {
    format!("hugepages-{}", crate::eviction::format_amount(page_size, crate::eviction::Resource::Memory))
}

/// The page size in bytes of a `hugepages-<size>` resource, when `resource` is one.
pub fn hugepage_page_size(resource: &str) -> Option<u64> {
    let size = resource.strip_prefix("hugepages-")?;
    units(&Quantity(size.to_owned())).and_then(|bytes| u64::try_from(bytes).ok()).filter(|bytes| *bytes > 0)
}

/// runc's and the CRI's name of a page size (upstream's `HugePageUnitSizeFromByteSize`): `2MB`
/// for 2 MiB, `1GB` for 1 GiB; `None` for a size that has none.
pub fn hugepage_unit_size(page_size: u64) -> Option<String> {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut size = page_size;
    let mut unit = 0;
    while size >= 1024 && unit + 1 < UNITS.len() {
        size /= 1024;
        unit += 1;
    }
    (size <= 1024).then(|| format!("{size}{}", UNITS[unit]))
}

/// Huge page limits for each of the node's `page_sizes` (runc's size names and bytes): what
/// `limited` gives a `hugepages-<size>` resource, and zero for every size it does not name, as
/// upstream's `GetHugepageLimitsFromResources` and `maybeSetHugetlb` do.
pub fn hugepage_limits(page_sizes: &[u64], limited: &BTreeMap<String, Quantity>) -> Vec<(String, u64)> {
    let limit_of = |page_size: u64| {
        limited
            .iter()
            .filter(|(name, _)| hugepage_page_size(name) == Some(page_size))
            .find_map(|(_, quantity)| units(quantity))
            .map_or(0, |bytes| bytes.max(0).unsigned_abs())
    };
    page_sizes.iter().filter_map(|size| Some((hugepage_unit_size(*size)?, limit_of(*size)))).collect()
}

/// The `hugepages-<size>` resources `pod` requests (upstream's `PodRequests` of each), in bytes.
pub fn pod_hugepage_requests(pod: &Pod) -> BTreeMap<String, Quantity> {
    let Some(spec) = pod.spec.as_ref() else { return BTreeMap::new() };
    let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    let names: std::collections::BTreeSet<&String> = containers
        .filter_map(|c| c.resources.as_ref()?.requests.as_ref())
        .flat_map(BTreeMap::keys)
        .filter(|name| hugepage_page_size(name).is_some())
        .collect();
    names.into_iter().map(|name| (name.clone(), Quantity(pod_request(pod, name, units).to_string()))).collect()
}

/// A pod's QoS class (upstream `GetPodQOS`): `Guaranteed`, `Burstable` or `BestEffort`.
pub fn qos_class(pod: &Pod) -> &'static str {
    let Some(spec) = pod.spec.as_ref() else { return "BestEffort" };
    let containers: Vec<&Container> = spec.init_containers.iter().flatten().chain(spec.containers.iter()).collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &containers {
        for resource in ["cpu", "memory"] {
            let request = container_resource(c, resource, false).and_then(milli);
            let limit = container_resource(c, resource, true).and_then(milli);
            if request.is_some_and(|v| v > 0) || limit.is_some_and(|v| v > 0) {
                any = true;
            }
            match (request, limit) {
                (_, None) => guaranteed = false,
                (Some(r), Some(l)) if r != l => guaranteed = false,
                _ => {}
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};

    use super::*;

    #[test]
    fn huge_page_names_and_limits_are_upstreams() {
        const MI2: u64 = 2 << 20;
        const GI1: u64 = 1 << 30;
        assert_eq!(hugepage_resource(MI2), "hugepages-2Mi");
        assert_eq!(hugepage_resource(GI1), "hugepages-1Gi");
        assert_eq!(hugepage_page_size("hugepages-2Mi"), Some(MI2));
        assert_eq!(hugepage_page_size("hugepages-1Gi"), Some(GI1));
        assert_eq!(hugepage_page_size("memory"), None);
        assert_eq!(hugepage_unit_size(MI2).as_deref(), Some("2MB"));
        assert_eq!(hugepage_unit_size(GI1).as_deref(), Some("1GB"));
        assert_eq!(hugepage_unit_size(64 << 10).as_deref(), Some("64KB"));
        // Every size the node has gets a limit: zero unless the resources name it.
        let limited = BTreeMap::from([("hugepages-2Mi".to_owned(), Quantity("4Mi".into()))]);
        assert_eq!(hugepage_limits(&[MI2, GI1], &limited), [("2MB".to_owned(), 4 << 20), ("1GB".to_owned(), 0)]);
        assert_eq!(hugepage_limits(&[], &limited), []);
        // A pod's requests: its containers' sum, raised to an init container's.
        let container = |name: &str, amount: &str| Container {
            name: name.to_owned(),
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([("hugepages-2Mi".to_owned(), Quantity(amount.into()))])),
                ..Default::default()
            }),
            ..Container::default()
        };
        let spec = PodSpec {
            containers: vec![container("a", "2Mi"), container("b", "4Mi")],
            init_containers: Some(vec![container("init", "8Mi")]),
            ..PodSpec::default()
        };
        let pod = Pod { spec: Some(spec), ..Pod::default() };
        let requests = pod_hugepage_requests(&pod);
        assert_eq!(requests, BTreeMap::from([("hugepages-2Mi".to_owned(), Quantity((8u64 << 20).to_string()))]));
    }

    #[test]
    fn quantities_are_exact() {
        assert_eq!(nano_units("1.1"), Some(1_100_000_000));
        assert_eq!(milli(&Quantity("1.1".into())), Some(1100), "a float makes it 1101");
        assert_eq!(milli(&Quantity("100m".into())), Some(100));
        assert_eq!(milli(&Quantity("0.0001".into())), Some(1), "rounded up");
        assert_eq!(units(&Quantity("1.5Gi".into())), Some(1_610_612_736));
        assert_eq!(units(&Quantity("128974848".into())), Some(128_974_848));
        assert_eq!(units(&Quantity("129e6".into())), Some(129_000_000));
        assert_eq!(units(&Quantity("123Mi".into())), Some(128_974_848));
        assert_eq!(units(&Quantity("1Ei".into())), Some(1 << 60));
        assert_eq!(nano_units("1n"), Some(1));
        assert_eq!(nano_units("0.5n"), Some(1), "below a nano-unit rounds up");
        assert_eq!(nano_units("-2"), Some(-2_000_000_000));
        for bad in ["", "m", "1.2.3", "1x", "1Ki2", ".", "abc"] {
            assert_eq!(nano_units(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn every_millicore_up_to_ten_cores_reads_back_exactly() {
        for n in 1..=10_000i64 {
            assert_eq!(milli(&Quantity(format!("{n}m"))), Some(n), "{n}m");
            let cores = format!("{}.{:03}", n / 1000, n % 1000);
            assert_eq!(milli(&Quantity(cores.clone())), Some(n), "{cores}");
            assert_eq!(units(&Quantity(format!("{n}Mi"))), Some(n << 20), "{n}Mi");
        }
    }

    #[test]
    fn resource_field_values_are_upstreams() {
        let container = Container {
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([
                    ("cpu".into(), Quantity("1.1".into())),
                    ("memory".into(), Quantity("1.5Mi".into())),
                ])),
                limits: Some(BTreeMap::from([("memory".into(), Quantity("0".into()))])),
                ..Default::default()
            }),
            ..Container::default()
        };
        let allocatable = BTreeMap::from([
            ("cpu".to_owned(), Quantity("1900m".into())),
            ("memory".to_owned(), Quantity("7Gi".into())),
        ]);
        let value = |resource: &str, divisor: Option<&str>| {
            resource_field_value(&container, resource, divisor.map(|d| Quantity(d.into())).as_ref(), &allocatable)
        };
        assert_eq!(value("requests.cpu", None).unwrap(), "2", "1.1 cores in cores, rounded up");
        assert_eq!(value("requests.cpu", Some("1m")).unwrap(), "1100");
        assert_eq!(value("requests.memory", Some("1Ki")).unwrap(), "1536");
        assert_eq!(value("requests.memory", Some("1Mi")).unwrap(), "2");
        assert_eq!(value("limits.cpu", Some("1m")).unwrap(), "1900", "no CPU limit: the node's allocatable");
        assert_eq!(value("limits.memory", Some("1Gi")).unwrap(), "7", "a zero limit: the node's allocatable");
        assert_eq!(value("requests.ephemeral-storage", None).unwrap(), "0");
        assert!(value("limits.ephemeral-storage", None).is_err(), "an allocatable the node does not know");
        assert_eq!(
            value("limits.nvidia.com/gpu", None).unwrap_err(),
            "unsupported container resource : limits.nvidia.com/gpu"
        );
    }

    #[test]
    fn quantities() {
        for (q, want) in [
            ("100m", 0.1),
            ("1.5", 1.5),
            ("64Mi", 67_108_864.0),
            ("1G", 1e9),
            ("2e3", 2000.0),
            ("1Ki", 1024.0),
            ("0", 0.0),
        ] {
            assert!((parse_quantity(q).unwrap() - want).abs() < 1e-9, "{q}");
        }
        assert_eq!(parse_quantity("12x"), None);
        assert_eq!(parse_quantity("Mi"), None);
        assert_eq!(milli(&Quantity("250m".into())), Some(250));
        assert_eq!(milli(&Quantity("0.0001".into())), Some(1), "rounded up");
        assert_eq!(units(&Quantity("1Mi".into())), Some(1_048_576));
    }

    /// (cpu, memory) of a container's requests or limits.
    type Pair<'a> = Option<(&'a str, &'a str)>;

    fn pod(resources: Vec<(Pair<'_>, Pair<'_>)>) -> Pod {
        let containers = resources
            .into_iter()
            .enumerate()
            .map(|(i, (requests, limits))| {
                let map = |v: Pair<'_>| {
                    v.map(|(cpu, mem)| {
                        BTreeMap::from([
                            ("cpu".to_owned(), Quantity(cpu.into())),
                            ("memory".to_owned(), Quantity(mem.into())),
                        ])
                    })
                };
                Container {
                    name: format!("c{i}"),
                    resources: Some(ResourceRequirements {
                        requests: map(requests),
                        limits: map(limits),
                        ..Default::default()
                    }),
                    ..Container::default()
                }
            })
            .collect();
        Pod { spec: Some(PodSpec { containers, ..PodSpec::default() }), ..Pod::default() }
    }

    #[test]
    fn qos_classes() {
        assert_eq!(qos_class(&pod(vec![(None, None)])), "BestEffort");
        assert_eq!(qos_class(&pod(vec![(Some(("1", "1Gi")), Some(("1", "1Gi")))])), "Guaranteed");
        assert_eq!(qos_class(&pod(vec![(None, Some(("1", "1Gi")))])), "Guaranteed", "requests default to limits");
        assert_eq!(qos_class(&pod(vec![(Some(("100m", "1Gi")), Some(("1", "1Gi")))])), "Burstable");
        assert_eq!(qos_class(&pod(vec![(Some(("1", "1Gi")), Some(("1", "1Gi"))), (None, None)])), "Burstable");
    }

    #[test]
    fn pod_limits_as_upstreams_pod_limits() {
        let both = pod(vec![(None, Some(("500m", "64Mi"))), (None, Some(("250m", "32Mi")))]);
        let limits = pod_limits(&both);
        assert_eq!((limits.cpu_milli, limits.memory_bytes), (Some(750), Some(96 << 20)));
        assert!(limits.cpu_declared && limits.memory_declared);
        let one_open = pod(vec![(None, Some(("500m", "64Mi"))), (None, None)]);
        let limits = pod_limits(&one_open);
        assert_eq!(limits.cpu_milli, Some(500));
        assert!(!limits.cpu_declared && !limits.memory_declared);
        let none = pod_limits(&pod(vec![(None, None)]));
        assert_eq!((none.cpu_milli, none.memory_bytes), (None, None));

        // An init container's limit raises the pod's when larger; a sidecar's adds to it; the
        // overhead is added where there is a limit.
        let mut with_init = pod(vec![(None, Some(("500m", "64Mi")))]);
        let spec = with_init.spec.as_mut().unwrap();
        let mut init = spec.containers[0].clone();
        init.name = "init".into();
        init.resources.as_mut().unwrap().limits.as_mut().unwrap().insert("cpu".into(), Quantity("2".into()));
        let mut sidecar = spec.containers[0].clone();
        sidecar.name = "sidecar".into();
        sidecar.restart_policy = Some("Always".into());
        spec.init_containers = Some(vec![sidecar, init]);
        spec.overhead = Some(BTreeMap::from([("cpu".to_owned(), Quantity("100m".into()))]));
        let limits = pod_limits(&with_init);
        assert_eq!(limits.cpu_milli, Some(2600), "the init container (2) with the sidecar before it, plus overhead");
        assert_eq!(limits.memory_bytes, Some(128 << 20), "the container and the sidecar");
    }
}
