//! Resource quantities and QoS classes, as the kubelet reads them from pod specs.

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

/// A quantity in milli-units, rounded up (CPU in millicores).
pub fn milli(quantity: &Quantity) -> Option<i64> {
    #[allow(clippy::cast_possible_truncation)] // Reason: resource values are far below 2^63 milli-units.
    parse_quantity(&quantity.0).map(|v| (v * 1000.0).ceil() as i64)
}

/// A quantity in whole units, rounded up (memory in bytes).
pub fn units(quantity: &Quantity) -> Option<i64> {
    #[allow(clippy::cast_possible_truncation)] // Reason: resource values are far below 2^63.
    parse_quantity(&quantity.0).map(|v| v.ceil() as i64)
}

/// A container's request (or, with `limit`, limit) of `resource`, if set.
pub fn container_resource<'a>(container: &'a Container, resource: &str, limit: bool) -> Option<&'a Quantity> {
    let resources = container.resources.as_ref()?;
    let map = if limit { resources.limits.as_ref() } else { resources.requests.as_ref() };
    map?.get(resource)
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
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};

    use super::*;

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
}
