//! The pod's required node affinity (upstream `component-helpers/scheduling/corev1/nodeaffinity`,
//! `GetRequiredNodeAffinity`): its `nodeSelector`, and the terms of
//! `requiredDuringSchedulingIgnoredDuringExecution`, one of which must match.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod};

/// Whether the node with `labels` (its name among them, as `kubernetes.io/hostname`) is one
/// `pod` may run on.
pub(super) fn required_affinity_matches(pod: &Pod, labels: &BTreeMap<String, String>) -> bool {
    let Some(spec) = pod.spec.as_ref() else { return true };
    if let Some(selector) = &spec.node_selector
        && selector.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    match required {
        None => true,
        Some(selector) => selector.node_selector_terms.iter().any(|term| term_matches(term, labels)),
    }
}

/// A term matches when it says something and all it says holds; an invalid requirement fails
/// its term only (upstream's lazy errors).
fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let name = labels.get("kubernetes.io/hostname").map(String::as_str).unwrap_or_default();
    expressions.iter().all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| r.key == "metadata.name" && field_matches(r, name))
}

/// One label requirement against the label's value (`None`: the node has no such label).
fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let integer = || -> Option<(i64, i64)> {
        let [bound] = values else { return None };
        Some((value?.parse().ok()?, bound.parse().ok()?))
    };
    match requirement.operator.as_str() {
        "In" => !values.is_empty() && value.is_some_and(|v| values.iter().any(|w| w == v)),
        "NotIn" => !values.is_empty() && value.is_none_or(|v| values.iter().all(|w| w != v)),
        "Exists" => values.is_empty() && value.is_some(),
        "DoesNotExist" => values.is_empty() && value.is_none(),
        "Gt" => integer().is_some_and(|(v, bound)| v > bound),
        "Lt" => integer().is_some_and(|(v, bound)| v < bound),
        _ => false,
    }
}

/// A `matchFields` requirement: `metadata.name` `In` or `NotIn` exactly one name.
fn field_matches(requirement: &NodeSelectorRequirement, name: &str) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let [wanted] = values else { return false };
    match requirement.operator.as_str() {
        "In" => wanted == name,
        "NotIn" => wanted != name,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, NodeSelector, PodSpec};

    use super::*;

    fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    fn pod_requiring(terms: Vec<NodeSelectorTerm>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                affinity: Some(Affinity {
                    node_affinity: Some(NodeAffinity {
                        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                            node_selector_terms: terms,
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn expressions(requirements: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
        NodeSelectorTerm { match_expressions: Some(requirements), match_fields: None }
    }

    #[test]
    fn required_node_affinity_is_upstreams() {
        let labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), "node-1".to_owned()),
            ("disk".to_owned(), "ssd".to_owned()),
            ("cores".to_owned(), "8".to_owned()),
        ]);
        let matches = |terms| required_affinity_matches(&pod_requiring(terms), &labels);
        assert!(matches(vec![expressions(vec![requirement("disk", "In", &["ssd", "nvme"])])]));
        assert!(!matches(vec![expressions(vec![requirement("disk", "NotIn", &["ssd"])])]));
        assert!(matches(vec![expressions(vec![requirement("gpu", "NotIn", &["a100"])])]), "absent is not in");
        assert!(matches(vec![expressions(vec![requirement("disk", "Exists", &[])])]));
        assert!(matches(vec![expressions(vec![requirement("gpu", "DoesNotExist", &[])])]));
        assert!(matches(vec![expressions(vec![
            requirement("cores", "Gt", &["4"]),
            requirement("cores", "Lt", &["16"])
        ])]));
        assert!(!matches(vec![expressions(vec![requirement("cores", "Gt", &["8"])])]));
        assert!(!matches(vec![expressions(vec![requirement("disk", "Gt", &["1"])])]), "not an integer");
        assert!(!matches(vec![expressions(vec![requirement("disk", "In", &[])])]), "In needs values");
        // Terms are alternatives; an empty term matches nothing; no terms match nothing.
        assert!(matches(vec![
            expressions(vec![requirement("disk", "In", &["hdd"])]),
            expressions(vec![requirement("disk", "In", &["ssd"])]),
        ]));
        assert!(!matches(vec![NodeSelectorTerm::default()]));
        assert!(!matches(vec![]));
        let by_name = |op: &str, name: &str| NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![requirement("metadata.name", op, &[name])]),
        };
        assert!(matches(vec![by_name("In", "node-1")]));
        assert!(!matches(vec![by_name("In", "node-2")]));
        assert!(matches(vec![by_name("NotIn", "node-2")]));
    }
}
