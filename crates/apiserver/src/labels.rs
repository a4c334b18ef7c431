//! The labels a kubelet sets on its Node, and which labels `--node-labels` may give it
//! (upstream `pkg/kubelet/apis/well_known_labels.go` and `ValidateKubeletFlags`).
//!
//! A node must not label itself into a role the control plane trusts: the `kubernetes.io` and
//! `k8s.io` namespaces are refused but for the labels upstream's kubelet may set, which the
//! NodeRestriction admission plugin also lets a node set.

use std::collections::BTreeMap;

/// `kubernetes.io/hostname`.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// `kubernetes.io/os`.
pub const OS: &str = "kubernetes.io/os";
/// `kubernetes.io/arch`.
pub const ARCH: &str = "kubernetes.io/arch";
/// `beta.kubernetes.io/os`, which upstream's kubelet still sets beside the stable label.
pub const BETA_OS: &str = "beta.kubernetes.io/os";
/// `beta.kubernetes.io/arch`, likewise.
pub const BETA_ARCH: &str = "beta.kubernetes.io/arch";
/// The labels the kubelet owns: set at registration and put back on a Node it adopts
/// (upstream's `updateDefaultLabels`, of those it sets without a cloud provider).
pub const KUBELET: [&str; 5] = [HOSTNAME, OS, ARCH, BETA_OS, BETA_ARCH];

/// The annotation that leaves attaching volumes to the attach/detach controller (upstream's
/// `enableControllerAttachDetach`, true by default and the only mode here).
pub const CONTROLLER_MANAGED_ATTACH: &str = "volumes.kubernetes.io/controller-managed-attach-detach";

/// The annotation that gives an external cloud provider the node IP `--node-ip` named.
pub const PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";

/// The taint a node registers with under `--cloud-provider=external`, until the cloud's
/// controller has initialized it.
pub const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// The `kubernetes.io` labels `--node-labels` may set (upstream `kubeletLabels`), in upstream's
/// sorted order.
pub const ALLOWED: [&str; 11] = [
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// The label namespaces `--node-labels` may use, with their subdomains (upstream
/// `kubeletLabelNamespaces`).
pub const ALLOWED_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];

/// The part of `key` before its `/`, if any.
fn namespace(key: &str) -> &str {
    key.split_once('/').map_or("", |(prefix, _)| prefix)
}

fn in_namespace(namespace: &str, domain: &str) -> bool {
    namespace == domain || namespace.strip_suffix(domain).is_some_and(|rest| rest.ends_with('.'))
}

/// Whether `key` is in the `kubernetes.io` or `k8s.io` namespace, or a subdomain of either.
pub fn is_kubernetes_label(key: &str) -> bool {
    let namespace = namespace(key);
    in_namespace(namespace, "kubernetes.io") || in_namespace(namespace, "k8s.io")
}

/// Whether a kubelet may set label `key` on its own Node (upstream `IsKubeletLabel`).
pub fn is_kubelet_label(key: &str) -> bool {
    ALLOWED.contains(&key) || ALLOWED_NAMESPACES.iter().any(|allowed| in_namespace(namespace(key), allowed))
}

/// Checks `--node-labels` as upstream's kubelet does at start-up: no `kubernetes.io` or
/// `k8s.io` label outside the allowed ones, every key a qualified name and every value a
/// label value. The error is upstream's text.
pub fn check_node_labels(labels: &BTreeMap<String, String>) -> Result<(), String> {
    let refused: Vec<&str> =
        labels.keys().map(String::as_str).filter(|k| is_kubernetes_label(k) && !is_kubelet_label(k)).collect();
    if !refused.is_empty() {
        return Err(format!(
            "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [{}]\n--node-labels in the \
             'kubernetes.io' namespace must begin with an allowed prefix ({}) or be in the specifically allowed set ({})",
            refused.join(" "),
            ALLOWED_NAMESPACES.join(", "),
            ALLOWED.join(", ")
        ));
    }
    let mut invalid = Vec::new();
    for (key, value) in labels {
        if let Err(why) = qualified_name(key) {
            invalid.push(format!("'{key}' - {why}"));
        }
        if let Err(why) = label_value(value) {
            invalid.push(format!("'{value}' - {why}"));
        }
    }
    if invalid.is_empty() { Ok(()) } else { Err(format!("invalid node labels: {}", invalid.join("; "))) }
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name of at most 63
/// characters (upstream `IsQualifiedName`).
fn qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Err("prefix part must be a lowercase RFC 1123 subdomain of at most 253 characters".to_owned());
        }
    }
    if name.is_empty() {
        return Err("name part must be non-empty".to_owned());
    }
    label_value(name).map_err(|_| {
        "name part must consist of at most 63 alphanumeric characters, '-', '_' or '.', and must start and end \
         with an alphanumeric character"
            .to_owned()
    })
}

/// A label value: empty, or at most 63 alphanumeric characters, `-`, `_` or `.`, starting and
/// ending with an alphanumeric one (upstream `IsValidLabelValue`).
fn label_value(value: &str) -> Result<(), String> {
    let inner_ok = value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let ends_ok = value.is_empty()
        || (value.as_bytes()[0].is_ascii_alphanumeric() && value.as_bytes()[value.len() - 1].is_ascii_alphanumeric());
    if value.len() <= 63 && inner_ok && ends_ok {
        Ok(())
    } else {
        Err("a valid label must be an empty string or consist of at most 63 alphanumeric characters, '-', '_' or \
             '.', and must start and end with an alphanumeric character"
            .to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn a_node_cannot_label_itself_into_a_role() {
        for role in [
            "node-role.kubernetes.io/control-plane",
            "kubernetes.io/role",
            "k8s.io/anything",
            "example.k8s.io/x",
            "node-restriction.kubernetes.io/x",
        ] {
            let err = check_node_labels(&labels(&[(role, "")])).unwrap_err();
            assert!(
                err.starts_with(&format!(
                    "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [{role}]\n"
                )),
                "{err}"
            );
            assert!(err.contains("allowed prefix (kubelet.kubernetes.io, node.kubernetes.io)"), "{err}");
        }
        let allowed = labels(&[
            ("role", "edge"),
            ("topology.kubernetes.io/zone", "z1"),
            ("node.kubernetes.io/instance-type", "m5"),
            ("example.node.kubernetes.io/pool", "a"),
            ("kubelet.kubernetes.io/x", ""),
            ("example.com/team", "infra"),
            ("notkubernetes.io/x", "y"),
        ]);
        assert_eq!(check_node_labels(&allowed), Ok(()));
    }

    #[test]
    fn label_keys_and_values_must_be_well_formed() {
        for (key, value) in
            [("-bad", "x"), ("Bad.Example.com/x", "x"), ("a/", "x"), ("ok", "-no"), ("ok", &"v".repeat(64))]
        {
            let err = check_node_labels(&labels(&[(key, value)])).unwrap_err();
            assert!(err.starts_with("invalid node labels: '"), "{key}={value}: {err}");
        }
        assert_eq!(check_node_labels(&labels(&[("a.b-c/d_e.f", "G-h_i.9")])), Ok(()));
    }
}
