//! The `/etc/hosts` the agent writes for a pod's containers (upstream `makeHostsMount` in
//! `kubelet_pods.go`), kept at `<pods-dir>/<uid>/etc-hosts` and mounted at `/etc/hosts` into
//! every container that mounts nothing there itself.
//!
//! A pod on its own network gets the localhost lines, one line per pod IP with its hostname
//! (and its FQDN when it has a `subdomain`), and its `hostAliases`. A host-network pod gets the
//! node's own hosts file and its `hostAliases`.

use k8s_openapi::api::core::v1::{Container, HostAlias, Pod};

/// Where the file goes in a container.
pub const ETC_HOSTS: &str = "/etc/hosts";

/// The file's name in the pod's directory.
pub const FILE_NAME: &str = "etc-hosts";

const MANAGED_HEADER: &str = "# Kubernetes-managed hosts file.\n";
const HOST_NETWORK_HEADER: &str = "# Kubernetes-managed hosts file (host network).\n";

/// Whether `container` gets the managed file: it mounts nothing at `/etc/hosts` itself.
pub fn wanted_by(container: &Container) -> bool {
    !container.volume_mounts.iter().flatten().any(|m| m.mount_path == ETC_HOSTS)
}

/// The file of a pod on its own network with `ips`, named `hostname`, in `domain` (empty
/// without a `subdomain`).
pub fn managed(ips: &[String], hostname: &str, domain: &str, aliases: &[HostAlias]) -> String {
    let mut text = String::from(MANAGED_HEADER);
    text.push_str("127.0.0.1\tlocalhost\n");
    text.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    text.push_str("fe00::0\tip6-localnet\n");
    text.push_str("fe00::0\tip6-mcastprefix\n");
    text.push_str("fe00::1\tip6-allnodes\n");
    text.push_str("fe00::2\tip6-allrouters\n");
    for ip in ips {
        if domain.is_empty() {
            text.push_str(&format!("{ip}\t{hostname}\n"));
        } else {
            text.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n"));
        }
    }
    text.push_str(&alias_lines(aliases));
    text
}

/// The file of a host-network pod: the node's hosts file `node_hosts`, then the aliases.
pub fn host_network(node_hosts: &str, aliases: &[HostAlias]) -> String {
    format!("{HOST_NETWORK_HEADER}{node_hosts}{}", alias_lines(aliases))
}

/// One line per alias: its IP and all its hostnames.
fn alias_lines(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut text = String::from("\n# Entries added by HostAliases.\n");
    for alias in aliases {
        text.push_str(&format!(
            "{}\t{}\n",
            alias.ip,
            alias.hostnames.iter().flatten().cloned().collect::<Vec<_>>().join("\t")
        ));
    }
    text
}

/// The pod's domain: `<subdomain>.<namespace>.svc.<cluster domain>` when it has a `subdomain`
/// (upstream `GeneratePodHostNameAndDomain`), else empty.
pub fn domain(pod: &Pod, cluster_domain: &str) -> String {
    let subdomain = pod.spec.as_ref().and_then(|s| s.subdomain.as_deref()).unwrap_or_default();
    if subdomain.is_empty() {
        return String::new();
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    format!("{subdomain}.{namespace}.svc.{cluster_domain}")
}

/// The pod's `hostAliases`.
pub fn aliases(pod: &Pod) -> &[HostAlias] {
    pod.spec.as_ref().and_then(|s| s.host_aliases.as_deref()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alias(ip: &str, names: &[&str]) -> HostAlias {
        HostAlias { ip: ip.into(), hostnames: Some(names.iter().map(|n| (*n).to_owned()).collect()) }
    }

    #[test]
    fn a_pod_network_file_is_upstreams() {
        let aliases = [alias("10.1.2.3", &["foo.local", "bar.local"]), alias("10.1.2.4", &["baz"])];
        let ips = ["10.85.0.7".to_owned(), "fd00::7".to_owned()];
        let text = managed(&ips, "web-0", "web.shop.svc.cluster.local", &aliases);
        assert_eq!(
            text,
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
             10.85.0.7\tweb-0.web.shop.svc.cluster.local\tweb-0\nfd00::7\tweb-0.web.shop.svc.cluster.local\tweb-0\n\
             \n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n10.1.2.4\tbaz\n"
        );
        let plain = managed(&ips[..1], "web", "", &[]);
        assert!(plain.ends_with("fe00::2\tip6-allrouters\n10.85.0.7\tweb\n"), "{plain}");
    }

    #[test]
    fn a_host_network_file_is_the_nodes_with_the_aliases() {
        let text = host_network("127.0.0.1 localhost\n", &[alias("10.1.2.3", &["foo"])]);
        assert_eq!(
            text,
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo\n"
        );
    }

    #[test]
    fn the_domain_comes_from_the_subdomain() {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("shop".into());
        assert_eq!(domain(&pod, "cluster.local"), "");
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec { subdomain: Some("web".into()), ..Default::default() });
        assert_eq!(domain(&pod, "cluster.local"), "web.shop.svc.cluster.local");
    }
}
