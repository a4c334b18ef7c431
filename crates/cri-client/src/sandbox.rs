//! The pod sandbox config (upstream `kuberuntime_sandbox.go` `generatePodSandboxConfig`).

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;

use kubelet_core::resources::{
    milli, pod_limit_without_overhead, pod_request_without_overhead, pod_requests_resource, units,
};

use crate::{container::cpu_and_memory, labels, pb};

pub use kubelet_core::types::pod_log_dir;

/// The pod's cgroup parent under the cgroupfs driver: `<root>/pod<uid>` for Guaranteed pods,
/// `<root>/burstable/pod<uid>` and `<root>/besteffort/pod<uid>` for the others.
pub fn cgroup_parent(cgroup_root: &str, pod: &Pod) -> String {
    kubelet_core::cgroups::pod_cgroup_name(cgroup_root, pod)
}

/// The DNS settings of a `resolv.conf`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvConf {
    /// `nameserver` lines.
    pub servers: Vec<String>,
    /// `search` domains.
    pub searches: Vec<String>,
    /// `options`.
    pub options: Vec<String>,
}

/// Parses a `resolv.conf`.
pub fn parse_resolv_conf(text: &str) -> ResolvConf {
    let mut conf = ResolvConf::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => conf.servers.extend(words.next().map(str::to_owned)),
            Some("search" | "domain") => conf.searches = words.map(str::to_owned).collect(),
            Some("options") => conf.options.extend(words.map(str::to_owned)),
            _ => {}
        }
    }
    conf
}

/// What pods' DNS is built from: the node's resolver and the cluster's DNS settings
/// (`resolvConf`, `clusterDNS`, `clusterDomain`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dns {
    /// The node's resolver; `None` when `resolvConf` is empty, which gives `Default` pods the
    /// local machine's resolver (`127.0.0.1`) and no searches.
    pub host: Option<ResolvConf>,
    /// The cluster's DNS servers; without any, `ClusterFirst` pods fall back to `Default`.
    pub cluster_dns: Vec<String>,
    /// The cluster's domain (`cluster.local`), searched by `ClusterFirst` pods.
    pub cluster_domain: String,
}

/// Upstream's `ndots` for `ClusterFirst` pods.
const CLUSTER_OPTIONS: &[&str] = &["ndots:5"];

/// Whether `pod` asks for the cluster's DNS (`ClusterFirst` off the host network, or
/// `ClusterFirstWithHostNet`), whatever the node has.
pub fn wants_cluster_dns(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    match spec.and_then(|s| s.dns_policy.as_deref()).unwrap_or("ClusterFirst") {
        "ClusterFirstWithHostNet" => true,
        "ClusterFirst" => !host_network,
        _ => false,
    }
}

/// The DNS config of the sandbox (upstream `GetPodDNS`): the cluster's servers with the
/// namespace's search path and `ndots:5` for `ClusterFirst` pods (the node's resolver when the
/// node has no `clusterDNS`, or for host-network pods), the node's resolver for `Default`,
/// nothing for `None`; the pod's `dnsConfig` merged in.
pub fn dns_config(pod: &Pod, dns: &Dns) -> pb::DnsConfig {
    let spec = pod.spec.as_ref();
    let policy = spec.and_then(|s| s.dns_policy.as_deref()).unwrap_or("ClusterFirst");
    let host = || match &dns.host {
        Some(host) => pb::DnsConfig {
            servers: host.servers.clone(),
            searches: host.searches.clone(),
            options: host.options.clone(),
        },
        None => {
            pb::DnsConfig { servers: vec!["127.0.0.1".to_owned()], searches: vec![".".to_owned()], options: vec![] }
        }
    };
    let mut dns = if policy == "None" {
        pb::DnsConfig::default()
    } else if wants_cluster_dns(pod) && !dns.cluster_dns.is_empty() {
        let domain = dns.cluster_domain.as_str();
        let mut searches = Vec::new();
        if !domain.is_empty() {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            searches = vec![format!("{namespace}.svc.{domain}"), format!("svc.{domain}"), domain.to_owned()];
        }
        searches.extend(dns.host.iter().flat_map(|h| h.searches.iter().cloned()));
        let options = CLUSTER_OPTIONS.iter().map(|o| (*o).to_owned()).collect();
        pb::DnsConfig { servers: dns.cluster_dns.clone(), searches, options }
    } else {
        host()
    };
    if let Some(extra) = spec.and_then(|s| s.dns_config.as_ref()) {
        for server in extra.nameservers.iter().flatten() {
            if !dns.servers.contains(server) {
                dns.servers.push(server.clone());
            }
        }
        for search in extra.searches.iter().flatten() {
            if !dns.searches.contains(search) {
                dns.searches.push(search.clone());
            }
        }
        for option in extra.options.iter().flatten() {
            let text = match &option.value {
                Some(value) => format!("{}:{value}", option.name.as_deref().unwrap_or_default()),
                None => option.name.clone().unwrap_or_default(),
            };
            dns.options.push(text);
        }
    }
    dns
}

/// The pod's hostname: `spec.hostname` or the pod name, at most 63 characters, with no trailing
/// `-` or `.`; empty for host-network pods, which keep the node's.
pub fn hostname(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        return String::new();
    }
    let name = spec.and_then(|s| s.hostname.clone()).unwrap_or_else(|| pod.metadata.name.clone().unwrap_or_default());
    let truncated: String = name.chars().take(63).collect();
    truncated.trim_end_matches(['-', '.']).to_owned()
}

/// The longest hostname the kernel keeps (upstream's `fqdnMaxLen`).
const KERNEL_HOSTNAME_MAX: usize = 64;

/// The hostname the sandbox gets (upstream's `GetNodenameForKernel`): [`hostname`], or with
/// `setHostnameAsFQDN` and a `subdomain` the pod's FQDN, which must fit the kernel's 64
/// characters; `Err` is upstream's message.
pub fn kernel_hostname(pod: &Pod, cluster_domain: &str) -> Result<String, String> {
    let hostname = hostname(pod);
    let as_fqdn = pod.spec.as_ref().and_then(|s| s.set_hostname_as_fqdn).unwrap_or(false);
    let domain = crate::hosts::domain(pod, cluster_domain);
    if hostname.is_empty() || !as_fqdn || domain.is_empty() {
        return Ok(hostname);
    }
    let fqdn = format!("{hostname}.{domain}");
    if fqdn.len() > KERNEL_HOSTNAME_MAX {
        return Err(format!(
            "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long \
             ({KERNEL_HOSTNAME_MAX} characters is the max, {} characters requested)",
            fqdn.len()
        ));
    }
    Ok(fqdn)
}

fn protocol(p: Option<&str>) -> i32 {
    match p {
        Some("UDP") => pb::Protocol::Udp as i32,
        Some("SCTP") => pb::Protocol::Sctp as i32,
        _ => pb::Protocol::Tcp as i32,
    }
}

/// The sandbox config of `pod` at `attempt`; `Err` when its FQDN cannot be its hostname
/// ([`kernel_hostname`]).
pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    log_dir: &Path,
    cgroup_root: &str,
    dns: &Dns,
) -> Result<pb::PodSandboxConfig, String> {
    let spec = pod.spec.as_ref();
    let port_mappings = spec
        .map(|s| s.containers.iter().flat_map(|c| c.ports.iter().flatten()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| pb::PortMapping {
            protocol: protocol(p.protocol.as_deref()),
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or_default(),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    let namespace_options = namespace_options(spec);
    let pod_security = spec.and_then(|s| s.security_context.as_ref());
    let security_context = pb::LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options),
        run_as_user: pod_security.and_then(|s| s.run_as_user).map(|value| pb::Int64Value { value }),
        run_as_group: pod_security.and_then(|s| s.run_as_group).map(|value| pb::Int64Value { value }),
        // As a container's: upstream's sandbox puts volumes' groups before the supplemental
        // ones, and no volume here adds any.
        supplemental_groups: crate::container::supplemental_groups(pod_security),
        privileged: spec.is_some_and(has_privileged_container),
        selinux_options: pod_security.and_then(|s| s.se_linux_options.as_ref()).map(crate::container::selinux_option),
        // Upstream runs every sandbox under the runtime's default seccomp profile, whatever its
        // containers run under.
        seccomp: Some(pb::SecurityProfile {
            profile_type: pb::security_profile::ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        }),
        ..pb::LinuxSandboxSecurityContext::default()
    };
    let sysctls = pod_security
        .and_then(|s| s.sysctls.as_ref())
        .map(|list| list.iter().map(|s| (s.name.clone(), s.value.clone())).collect())
        .unwrap_or_default();
    Ok(pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            attempt,
        }),
        hostname: kernel_hostname(pod, &dns.cluster_domain)?,
        log_directory: log_dir.display().to_string(),
        dns_config: Some(dns_config(pod, dns)),
        port_mappings,
        labels: labels::sandbox_labels(pod),
        annotations: labels::sandbox_annotations(pod),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent(cgroup_root, pod),
            security_context: Some(security_context),
            sysctls,
            resources: Some(sandbox_resources(pod)),
            overhead: Some(overhead_resources(pod)),
        }),
        ..pb::PodSandboxConfig::default()
    })
}

/// The resources of the whole pod for the runtime (upstream `calculateSandboxResources`): its
/// containers' CPU requests and CPU and memory limits as upstream sums them, without the pod's
/// `overhead`. A runtime that sizes a sandbox (a VM's) reads them; containerd gives them to its
/// runtime as annotations of the sandbox.
pub fn sandbox_resources(pod: &Pod) -> pb::LinuxContainerResources {
    let cpu_request = pod_requests_resource(pod, "cpu").then(|| pod_request_without_overhead(pod, "cpu", milli));
    let cpu_limit = pod_limit_without_overhead(pod, "cpu", milli).unwrap_or(0);
    let memory_limit = pod_limit_without_overhead(pod, "memory", units).unwrap_or(0);
    cpu_and_memory(cpu_request, cpu_limit, memory_limit)
}

/// The pod's `overhead` as resources (upstream `convertOverheadToLinuxResources`), its CPU as
/// both request and limit; empty when the pod names no overhead.
pub fn overhead_resources(pod: &Pod) -> pb::LinuxContainerResources {
    let Some(overhead) = pod.spec.as_ref().and_then(|spec| spec.overhead.as_ref()) else {
        return pb::LinuxContainerResources::default();
    };
    let cpu = overhead.get("cpu").and_then(milli).unwrap_or(0);
    let memory = overhead.get("memory").and_then(units).unwrap_or(0);
    cpu_and_memory(Some(cpu), cpu, memory)
}

/// Whether any container of the pod, init and ephemeral ones included, is privileged (upstream
/// `HasPrivilegedContainer`): the runtime runs a privileged container only in a privileged sandbox.
fn has_privileged_container(spec: &k8s_openapi::api::core::v1::PodSpec) -> bool {
    let privileged =
        |sc: Option<&k8s_openapi::api::core::v1::SecurityContext>| sc.and_then(|sc| sc.privileged).unwrap_or(false);
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(|c| privileged(c.security_context.as_ref()))
        || spec.ephemeral_containers.iter().flatten().any(|c| privileged(c.security_context.as_ref()))
}

/// The pod's Linux namespaces (upstream `namespacesForPod`): the node's where the spec asks for
/// host namespaces, a shared PID namespace with `shareProcessNamespace`.
pub(crate) fn namespace_options(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> pb::NamespaceOption {
    let flag = |f: fn(&k8s_openapi::api::core::v1::PodSpec) -> Option<bool>| spec.and_then(f).unwrap_or(false);
    let node_or_pod = |host: bool| if host { pb::NamespaceMode::Node } else { pb::NamespaceMode::Pod } as i32;
    pb::NamespaceOption {
        network: node_or_pod(flag(|s| s.host_network)),
        pid: if flag(|s| s.host_pid) {
            pb::NamespaceMode::Node
        } else if flag(|s| s.share_process_namespace) {
            pb::NamespaceMode::Pod
        } else {
            pb::NamespaceMode::Container
        } as i32,
        ipc: node_or_pod(flag(|s| s.host_ipc)),
        ..pb::NamespaceOption::default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{Container, ContainerPort, PodDNSConfig, PodSpec},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    use super::*;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    ports: Some(vec![
                        ContainerPort {
                            container_port: 80,
                            host_port: Some(8080),
                            protocol: Some("TCP".into()),
                            ..ContainerPort::default()
                        },
                        ContainerPort { container_port: 53, protocol: Some("UDP".into()), ..ContainerPort::default() },
                    ]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn sandbox_config_carries_identity_ports_cgroup_and_namespaces() {
        let host = parse_resolv_conf("# comment\nnameserver 192.0.2.53\nsearch example.test\noptions ndots:2\n");
        let dns = Dns { host: Some(host), ..Dns::default() };
        let config = sandbox_config(&pod(), 2, Path::new("/var/log/pods/ns_web-_u1"), "/kubepods", &dns).unwrap();
        let meta = config.metadata.unwrap();
        assert_eq!((meta.name.as_str(), meta.uid.as_str(), meta.attempt), ("web-", "u1", 2));
        assert_eq!(config.hostname, "web", "trailing dash trimmed");
        assert_eq!(config.port_mappings.len(), 1, "only ports with a hostPort");
        assert_eq!((config.port_mappings[0].container_port, config.port_mappings[0].host_port), (80, 8080));
        assert_eq!(config.labels[labels::POD_UID], "u1");
        let linux = config.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/kubepods/besteffort/podu1");
        let security = linux.security_context.unwrap();
        let seccomp = security.seccomp.unwrap();
        assert_eq!(seccomp.profile_type, pb::security_profile::ProfileType::RuntimeDefault as i32, "as upstream");
        assert!(!security.privileged);
        let ns = security.namespace_options.unwrap();
        assert_eq!(
            (ns.network, ns.pid, ns.ipc),
            (pb::NamespaceMode::Pod as i32, pb::NamespaceMode::Container as i32, pb::NamespaceMode::Pod as i32)
        );
        let dns = config.dns_config.unwrap();
        assert_eq!(
            (dns.servers, dns.searches, dns.options),
            (vec!["192.0.2.53".to_owned()], vec!["example.test".to_owned()], vec!["ndots:2".to_owned()])
        );
    }

    #[test]
    fn a_privileged_container_of_any_kind_makes_the_sandbox_privileged() {
        use k8s_openapi::api::core::v1::{EphemeralContainer, SecurityContext};
        let privileged = Some(SecurityContext { privileged: Some(true), ..SecurityContext::default() });
        let mut pod = pod();
        let spec = pod.spec.as_mut().unwrap();
        spec.ephemeral_containers =
            Some(vec![EphemeralContainer { name: "debug".into(), security_context: privileged, ..Default::default() }]);
        let config = sandbox_config(&pod, 0, Path::new("/var/log/pods/x"), "/kubepods", &Dns::default()).unwrap();
        assert!(config.linux.unwrap().security_context.unwrap().privileged);
    }

    #[test]
    fn dns_policy_none_uses_only_the_pod_config() {
        let mut p = pod();
        let spec = p.spec.as_mut().unwrap();
        spec.dns_policy = Some("None".into());
        spec.dns_config =
            Some(PodDNSConfig { nameservers: Some(vec!["198.51.100.1".into()]), ..PodDNSConfig::default() });
        let dns = dns_config(&p, &Dns { host: Some(parse_resolv_conf("nameserver 192.0.2.53\n")), ..Dns::default() });
        assert_eq!(dns.servers, ["198.51.100.1"]);
        assert!(dns.searches.is_empty());
    }

    #[test]
    fn set_hostname_as_fqdn_makes_the_fqdn_the_hostname_when_it_fits() {
        let mut p = pod();
        let spec = p.spec.as_mut().unwrap();
        spec.hostname = Some("web-0".into());
        spec.subdomain = Some("web".into());
        assert_eq!(kernel_hostname(&p, "cluster.local").unwrap(), "web-0", "not asked for");
        p.spec.as_mut().unwrap().set_hostname_as_fqdn = Some(true);
        assert_eq!(kernel_hostname(&p, "cluster.local").unwrap(), "web-0.web.ns.svc.cluster.local");
        let dns = Dns { cluster_domain: "cluster.local".into(), ..Dns::default() };
        let config = sandbox_config(&p, 0, Path::new("/l"), "/kubepods", &dns).unwrap();
        assert_eq!(config.hostname, "web-0.web.ns.svc.cluster.local");
        p.spec.as_mut().unwrap().subdomain = None;
        assert_eq!(kernel_hostname(&p, "cluster.local").unwrap(), "web-0", "no subdomain, no domain");
        let spec = p.spec.as_mut().unwrap();
        spec.hostname = Some("a".repeat(40));
        spec.subdomain = Some("b".repeat(10));
        let fqdn = format!("{}.{}.ns.svc.cluster.local", "a".repeat(40), "b".repeat(10));
        let expected = format!(
            "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long \
             (64 characters is the max, {} characters requested)",
            fqdn.len()
        );
        assert_eq!(kernel_hostname(&p, "cluster.local").unwrap_err(), expected);
        assert!(sandbox_config(&p, 0, Path::new("/l"), "/kubepods", &dns).is_err());
    }

    #[test]
    fn host_network_pods_use_the_node_namespace_and_hostname() {
        let mut p = pod();
        p.spec.as_mut().unwrap().host_network = Some(true);
        let config = sandbox_config(&p, 0, Path::new("/l"), "/kubepods", &Dns::default()).unwrap();
        assert_eq!(config.hostname, "");
        let ns = config.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.network, pb::NamespaceMode::Node as i32);
    }

    #[test]
    fn cluster_first_pods_use_the_cluster_dns_and_the_namespace_search_path() {
        let host = parse_resolv_conf("nameserver 192.0.2.53\nsearch example.test\n");
        let dns = Dns {
            host: Some(host.clone()),
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
        };
        let mut p = pod();
        p.metadata.namespace = Some("shop".into());
        let got = dns_config(&p, &dns);
        assert_eq!(got.servers, ["10.96.0.10"]);
        assert_eq!(got.searches, ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "example.test"]);
        assert_eq!(got.options, ["ndots:5"]);

        // On the host network, ClusterFirst is Default; ClusterFirstWithHostNet is the cluster's.
        p.spec.as_mut().unwrap().host_network = Some(true);
        assert_eq!(dns_config(&p, &dns).servers, ["192.0.2.53"]);
        p.spec.as_mut().unwrap().dns_policy = Some("ClusterFirstWithHostNet".into());
        assert_eq!(dns_config(&p, &dns).servers, ["10.96.0.10"]);

        // No clusterDNS: the node's resolver; an empty resolvConf: the local machine's, no search.
        let node_only = Dns { host: Some(host), ..Dns::default() };
        assert!(wants_cluster_dns(&p));
        assert_eq!(dns_config(&p, &node_only).servers, ["192.0.2.53"]);
        let got = dns_config(&pod(), &Dns::default());
        assert_eq!((got.servers, got.searches), (vec!["127.0.0.1".to_owned()], vec![".".to_owned()]));
    }

    fn with_resources(container: &mut Container, requests: &[(&str, &str)], limits: &[(&str, &str)]) {
        use k8s_openapi::{api::core::v1::ResourceRequirements, apimachinery::pkg::api::resource::Quantity};
        let list = |pairs: &[(&str, &str)]| {
            (!pairs.is_empty())
                .then(|| pairs.iter().map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned()))).collect())
        };
        container.resources =
            Some(ResourceRequirements { requests: list(requests), limits: list(limits), ..Default::default() });
    }

    #[test]
    fn the_sandbox_gets_the_pods_resources_and_its_overhead_apart() {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let mut pod = pod();
        let spec = pod.spec.as_mut().unwrap();
        with_resources(&mut spec.containers[0], &[("cpu", "250m")], &[("cpu", "500m"), ("memory", "64Mi")]);
        let mut second = Container { name: "d".into(), ..Container::default() };
        with_resources(&mut second, &[("cpu", "250m")], &[("cpu", "1"), ("memory", "64Mi")]);
        spec.containers.push(second);
        // An init container asking for more than the containers together sets the pod's figure.
        let mut init = Container { name: "init".into(), ..Container::default() };
        with_resources(&mut init, &[("cpu", "1")], &[("cpu", "2")]);
        spec.init_containers = Some(vec![init]);
        spec.overhead =
            Some([("cpu", "100m"), ("memory", "32Mi")].map(|(k, v)| (k.to_owned(), Quantity(v.to_owned()))).into());

        let config = sandbox_config(&pod, 0, Path::new("/var/log/pods/x"), "/kubepods", &Dns::default()).unwrap();
        let linux = config.linux.unwrap();
        let resources = linux.resources.unwrap();
        assert_eq!(resources.cpu_shares, 1024, "the init container's 1 CPU, above the containers' 500m");
        assert_eq!((resources.cpu_period, resources.cpu_quota), (100_000, 200_000), "the init container's limit of 2");
        assert_eq!(resources.memory_limit_in_bytes, 128 << 20, "without the overhead");
        let overhead = linux.overhead.unwrap();
        assert_eq!((overhead.cpu_shares, overhead.cpu_quota), (102, 10_000), "100m as request and limit");
        assert_eq!(overhead.memory_limit_in_bytes, 32 << 20);
    }

    #[test]
    fn a_pod_without_resources_gets_the_least_shares_no_quota_and_an_empty_overhead() {
        let config = sandbox_config(&pod(), 0, Path::new("/var/log/pods/x"), "/kubepods", &Dns::default()).unwrap();
        let linux = config.linux.unwrap();
        let resources = linux.resources.unwrap();
        assert_eq!(
            (resources.cpu_shares, resources.cpu_period, resources.cpu_quota, resources.memory_limit_in_bytes),
            (2, 100_000, 0, 0)
        );
        assert_eq!(linux.overhead, Some(pb::LinuxContainerResources::default()), "as upstream: set, and empty");
    }

    #[test]
    fn cpu_shares_come_from_the_limit_where_no_container_requests_cpu() {
        let mut pod = pod();
        with_resources(&mut pod.spec.as_mut().unwrap().containers[0], &[], &[("cpu", "500m")]);
        let resources = sandbox_resources(&pod);
        assert_eq!((resources.cpu_shares, resources.cpu_quota), (512, 50_000));
    }
}
