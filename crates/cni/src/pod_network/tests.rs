//! `CniNetworkPlugin`'s pure parts: capability arguments, CNI arguments, refused UIDs, readiness.

use kubelet_core::k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec};

use super::*;

fn pod_with_ports(ports: Vec<ContainerPort>) -> Pod {
    let container = Container { name: "web".into(), ports: Some(ports), ..Container::default() };
    let mut pod = Pod { spec: Some(PodSpec { containers: vec![container], ..PodSpec::default() }), ..Pod::default() };
    pod.metadata.name = Some("web".into());
    pod.metadata.namespace = Some("default".into());
    pod
}

fn annotated(pairs: &[(&str, &str)]) -> Pod {
    let mut pod = pod_with_ports(Vec::new());
    pod.metadata.annotations = Some(pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
    pod
}

#[test]
fn host_ports_become_port_mappings_as_upstream_passes_them() {
    let pod = pod_with_ports(vec![
        ContainerPort { container_port: 80, host_port: Some(8080), ..ContainerPort::default() },
        ContainerPort {
            container_port: 53,
            host_port: Some(5353),
            protocol: Some("UDP".into()),
            host_ip: Some("127.0.0.1".into()),
            ..ContainerPort::default()
        },
        ContainerPort { container_port: 9090, ..ContainerPort::default() },
    ]);
    assert_eq!(
        port_mappings(&pod),
        [
            json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}),
            json!({"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "127.0.0.1"}),
        ]
    );
}

#[test]
fn bandwidth_annotations_become_rates_in_bits() {
    let pod = annotated(&[(INGRESS_BANDWIDTH, "1M"), (EGRESS_BANDWIDTH, "10k")]);
    let limits = bandwidth(&pod).unwrap().unwrap();
    assert_eq!(
        limits,
        json!({"ingressRate": 1_000_000, "ingressBurst": i32::MAX, "egressRate": 10_000, "egressBurst": i32::MAX})
    );
    assert_eq!(bandwidth(&annotated(&[(EGRESS_BANDWIDTH, "2Mi")])).unwrap().unwrap()["egressRate"], 2_097_152);
    assert_eq!(bandwidth(&annotated(&[])).unwrap(), None);
}

#[test]
fn bandwidth_out_of_upstreams_bounds_is_refused() {
    for (value, why) in [("500", "small"), ("2P", "large"), ("fast", "not a quantity")] {
        let error = bandwidth(&annotated(&[(INGRESS_BANDWIDTH, value)])).unwrap_err().to_string();
        assert!(error.contains(why) && error.contains("default/web"), "{value}: {error}");
    }
}

#[test]
fn runtime_conf_carries_upstreams_cni_args() {
    let pod =
        pod_with_ports(vec![ContainerPort { container_port: 80, host_port: Some(8080), ..ContainerPort::default() }]);
    let conf = runtime_conf(&pod, &PodUid::new("u-1"), Path::new("/run/netns/network-u-1")).unwrap();
    assert_eq!(
        (conf.container_id.as_str(), conf.netns.as_str(), conf.ifname.as_str()),
        ("network-u-1", "/run/netns/network-u-1", "eth0")
    );
    let args: Vec<(&str, &str)> = conf.args.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        args,
        [
            ("IgnoreUnknown", "1"),
            ("K8S_POD_NAMESPACE", "default"),
            ("K8S_POD_NAME", "web"),
            ("K8S_POD_INFRA_CONTAINER_ID", "network-u-1"),
            ("K8S_POD_UID", "u-1"),
        ]
    );
    assert!(conf.capability_args.contains_key("portMappings"));
    assert!(!conf.capability_args.contains_key("bandwidth"));
}

#[tokio::test]
async fn a_uid_that_is_not_one_file_name_gets_no_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let cni = Cni::new(Vec::new()).with_cache(crate::Cache::new(dir.path().join("cache")));
    let plugin = CniNetworkPlugin::open(cni, dir.path().join("net.d"), dir.path().join("netns")).await.unwrap();
    let mut pod = pod_with_ports(Vec::new());
    for uid in ["../../etc", "a/b", ".hidden", ""] {
        pod.metadata.uid = Some(uid.into());
        let error = plugin.namespace_path(&pod, &PodUid::of(&pod)).unwrap_err().to_string();
        assert!(error.contains("cannot name a network namespace"), "{uid}: {error}");
    }
    pod.metadata.uid = Some("0b3c-11".into());
    assert_eq!(plugin.namespace_path(&pod, &PodUid::of(&pod)).unwrap(), dir.path().join("netns/network-0b3c-11"));
}

#[tokio::test]
async fn no_network_configuration_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let cni = Cni::new(Vec::new()).with_cache(crate::Cache::new(dir.path().join("cache")));
    let plugin = CniNetworkPlugin::open(cni, dir.path().join("net.d"), dir.path().join("netns")).await.unwrap();
    let error = plugin.status().await.unwrap_err().to_string();
    assert!(error.contains("no network configurations found"), "{error}");
}

#[tokio::test]
async fn host_ports_on_a_network_without_portmap_are_refused_before_anything_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let net_d = dir.path().join("net.d");
    std::fs::create_dir_all(&net_d).unwrap();
    let list = json!({"cniVersion": "1.0.0", "name": "plain", "plugins": [{"type": "bridge"}]});
    std::fs::write(net_d.join("10-plain.conflist"), list.to_string()).unwrap();
    let cni = Cni::new(Vec::new()).with_cache(crate::Cache::new(dir.path().join("cache")));
    let plugin = CniNetworkPlugin::open(cni, &net_d, dir.path().join("netns")).await.unwrap();
    let mut pod =
        pod_with_ports(vec![ContainerPort { container_port: 80, host_port: Some(8080), ..ContainerPort::default() }]);
    pod.metadata.uid = Some("u1".into());
    let error = plugin.set_up_pod(&pod).await.unwrap_err().to_string();
    assert!(error.contains("host ports") && error.contains("portMappings") && error.contains("\"plain\""), "{error}");
    assert!(!dir.path().join("netns").exists(), "no namespace was made");

    let mut shaped = annotated(&[(INGRESS_BANDWIDTH, "1M")]);
    shaped.metadata.uid = Some("u2".into());
    let error = plugin.set_up_pod(&shaped).await.unwrap_err().to_string();
    assert!(error.contains("bandwidth annotations"), "{error}");
}
