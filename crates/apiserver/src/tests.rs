//! The Node and its status as upstream's setters make them.

use std::time::Duration;

use super::*;

fn facts() -> Facts {
    let mut facts = Facts::new("node-1", Version::new("containerd", "1.6.20", "v1"));
    facts.ip = Some(IpAddr::from([192, 0, 2, 10]));
    facts.cpu_milli = 2000;
    facts.memory_bytes = 4 << 30;
    facts.ephemeral_storage_bytes = Some(10 << 30);
    facts.reserved = (500, 1 << 30);
    facts.boot_id = "boot-a".into();
    facts.labels = BTreeMap::from([("role".to_owned(), "edge".to_owned())]);
    facts.taints = parse_taints("dedicated=edge:NoSchedule").unwrap();
    facts
}

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + seconds).unwrap()
}

fn condition<'a>(node: &'a Node, kind: &str) -> &'a NodeCondition {
    node.status.as_ref().unwrap().conditions.iter().flatten().find(|c| c.type_ == kind).unwrap()
}

fn reasons(events: &[NodeEvent]) -> Vec<&str> {
    events.iter().map(|e| e.reason).collect()
}

#[test]
fn registration_carries_the_default_labels_the_extra_ones_over_them_the_taints_and_annotations() {
    let mut facts = facts();
    facts.labels.insert(labels::HOSTNAME.to_owned(), "edge-1.example".to_owned());
    facts.provider_id = Some("aws:///eu-west-1a/i-0abc".to_owned());
    let node = registration(&facts);
    let labels = node.metadata.labels.unwrap();
    assert_eq!(labels[labels::HOSTNAME], "edge-1.example", "--node-labels over the defaults, as upstream");
    assert_eq!((labels[labels::OS].as_str(), labels[labels::BETA_OS].as_str()), ("linux", "linux"));
    assert_eq!((labels[labels::ARCH].as_str(), labels[labels::BETA_ARCH].as_str()), (go_arch(), go_arch()));
    assert_eq!(labels["role"], "edge");
    let annotations = node.metadata.annotations.unwrap();
    assert_eq!(annotations[labels::CONTROLLER_MANAGED_ATTACH], "true");
    assert!(!annotations.contains_key(labels::PROVIDED_NODE_IP), "no external cloud provider");
    let spec = node.spec.unwrap();
    assert_eq!(spec.provider_id.as_deref(), Some("aws:///eu-west-1a/i-0abc"));
    let taints = spec.taints.unwrap();
    assert_eq!(taints.len(), 1);
    assert_eq!(
        (taints[0].key.as_str(), taints[0].value.as_deref(), taints[0].effect.as_str()),
        ("dedicated", Some("edge"), "NoSchedule")
    );
}

#[test]
fn an_external_cloud_provider_gets_the_uninitialized_taint_the_given_ip_and_its_own_addresses() {
    let mut facts = facts();
    facts.external_cloud_provider = true;
    let mut node = registration(&facts);
    let taint = node.spec.as_ref().unwrap().taints.as_ref().unwrap().last().cloned().unwrap();
    assert_eq!(
        (taint.key.as_str(), taint.value.as_deref(), taint.effect.as_str()),
        (labels::UNINITIALIZED_TAINT, Some("true"), "NoSchedule")
    );
    assert_eq!(node.metadata.annotations.as_ref().unwrap()[labels::PROVIDED_NODE_IP], "192.0.2.10");
    let mut dual = facts.clone();
    dual.secondary_ip = Some("2001:db8::10".parse().unwrap());
    assert_eq!(node_annotations(&dual)[labels::PROVIDED_NODE_IP], "192.0.2.10,2001:db8::10");
    let found_only = Facts { ip: None, ..facts.clone() };
    assert!(!node_annotations(&found_only).contains_key(labels::PROVIDED_NODE_IP), "no --node-ip, none named");
    // The first status names the node's addresses; those the cloud's controller set then stay.
    set_status(&mut node, &facts, &Health::default(), at(0));
    let cloud = vec![NodeAddress { type_: "InternalIP".into(), address: "10.1.2.3".into() }];
    node.status.as_mut().unwrap().addresses = Some(cloud.clone());
    set_status(&mut node, &facts, &Health::default(), at(10));
    assert_eq!(node.status.unwrap().addresses, Some(cloud));
}

#[test]
fn a_dual_stack_node_reports_both_internal_ips_in_the_order_given() {
    let mut facts = facts();
    facts.secondary_ip = Some("2001:db8::10".parse().unwrap());
    let mut node = registration(&facts);
    set_status(&mut node, &facts, &Health::default(), at(0));
    let addresses: Vec<(String, String)> =
        node.status.unwrap().addresses.unwrap().into_iter().map(|a| (a.type_, a.address)).collect();
    let expected = [("InternalIP", "192.0.2.10"), ("InternalIP", "2001:db8::10"), ("Hostname", "node-1")];
    assert_eq!(addresses, expected.map(|(kind, address)| (kind.to_owned(), address.to_owned())));
}

#[test]
fn the_first_status_is_ready_with_capacity_allocatable_and_info() {
    let facts = facts();
    let mut node = registration(&facts);
    let events = set_status(&mut node, &facts, &Health::default(), at(0));
    assert_eq!(
        reasons(&events),
        ["NodeHasSufficientMemory", "NodeHasNoDiskPressure", "NodeHasSufficientPID", "NodeReady"]
    );
    assert_eq!(events[3].message, "Node node-1 status is now: NodeReady");
    let status = node.status.as_ref().unwrap();
    let kinds: Vec<&str> = status.conditions.iter().flatten().map(|c| c.type_.as_str()).collect();
    assert_eq!(kinds, ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"], "Ready last");
    let ready = condition(&node, "Ready");
    assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("True", Some("KubeletReady")));
    assert_eq!(ready.message.as_deref(), Some("kubelet is posting ready status"));
    let capacity = status.capacity.as_ref().unwrap();
    assert_eq!(capacity["cpu"], Quantity("2".into()));
    assert_eq!(capacity["memory"], Quantity("4194304Ki".into()));
    assert_eq!(capacity["pods"], Quantity("110".into()));
    assert_eq!(capacity["ephemeral-storage"], Quantity("10485760Ki".into()));
    let allocatable = status.allocatable.as_ref().unwrap();
    assert_eq!(allocatable["cpu"], Quantity("1500m".into()));
    assert_eq!(allocatable["memory"], Quantity((3_i64 << 30).to_string()));
    let addresses: Vec<(&str, &str)> =
        status.addresses.iter().flatten().map(|a| (a.type_.as_str(), a.address.as_str())).collect();
    assert_eq!(addresses, [("InternalIP", "192.0.2.10"), ("Hostname", "node-1")]);
    let info = status.node_info.as_ref().unwrap();
    assert_eq!(info.container_runtime_version, "containerd://1.6.20");
    assert_eq!((info.operating_system.as_str(), info.architecture.as_str()), ("linux", go_arch()));
}

#[test]
fn huge_pages_are_capacity_of_their_own_and_leave_allocatable_memory() {
    let mut facts = facts();
    facts.hugepages = BTreeMap::from([(2 << 20, 64 << 20), (1 << 30, 0)]);
    let mut node = registration(&facts);
    set_status(&mut node, &facts, &Health::default(), at(0));
    let status = node.status.as_ref().unwrap();
    let capacity = status.capacity.as_ref().unwrap();
    assert_eq!(capacity["hugepages-2Mi"], Quantity("64Mi".into()));
    assert_eq!(capacity["hugepages-1Gi"], Quantity("0".into()));
    assert_eq!(capacity["memory"], Quantity("4194304Ki".into()), "capacity keeps all the memory");
    let allocatable = status.allocatable.as_ref().unwrap();
    assert_eq!(allocatable["hugepages-2Mi"], Quantity("64Mi".into()));
    assert_eq!(allocatable["memory"], Quantity(((3_i64 << 30) - (64 << 20)).to_string()));
}

#[test]
fn ready_follows_the_runtime_and_keeps_its_transition_time_while_it_holds() {
    let facts = facts();
    let mut node = registration(&facts);
    set_status(&mut node, &facts, &Health::default(), at(0));
    // Still ready ten seconds later: a heartbeat, no transition, no event.
    let events = set_status(&mut node, &facts, &Health::default(), at(10));
    assert!(events.is_empty(), "{events:?}");
    let ready = condition(&node, "Ready");
    assert_eq!(
        (ready.last_heartbeat_time.clone(), ready.last_transition_time.clone()),
        (Some(Time(at(10))), Some(Time(at(0))))
    );
    // The runtime goes: not ready, with every error in upstream's words.
    let down = Health {
        runtime_errors: vec![
            "container runtime is down".into(),
            "PLEG is not healthy: pleg was last seen active 3m0s ago".into(),
        ],
        network_errors: vec!["container runtime network not ready: NetworkReady=false".into()],
        ..Health::default()
    };
    let events = set_status(&mut node, &facts, &down, at(20));
    assert_eq!(reasons(&events), ["NodeNotReady"]);
    let ready = condition(&node, "Ready");
    assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("False", Some("KubeletNotReady")));
    assert_eq!(
        ready.message.as_deref(),
        Some(
            "container runtime is down,PLEG is not healthy: pleg was last seen active 3m0s ago,container runtime network not ready: NetworkReady=false"
        )
    );
    assert_eq!(ready.last_transition_time, Some(Time(at(20))));
    assert_eq!(condition(&node, "MemoryPressure").last_transition_time, Some(Time(at(0))), "the others hold");
    // Back: ready again, one event.
    assert_eq!(reasons(&set_status(&mut node, &facts, &Health::default(), at(30))), ["NodeReady"]);
}

#[test]
fn a_new_boot_id_is_a_reboot() {
    let facts = facts();
    let mut node = registration(&facts);
    set_status(&mut node, &facts, &Health::default(), at(0));
    let mut rebooted = facts.clone();
    rebooted.boot_id = "boot-b".into();
    let events = set_status(&mut node, &rebooted, &Health::default(), at(10));
    assert_eq!(reasons(&events), ["Rebooted"]);
    assert_eq!(events[0].message, "Node node-1 has been rebooted, boot id: boot-b");
    assert_eq!(events[0].kind, "Warning");
}

#[test]
fn taints_parse_as_upstreams_flag() {
    let taints = parse_taints("a=b:NoSchedule, c:NoExecute").unwrap();
    assert_eq!(taints.len(), 2);
    assert_eq!(
        (taints[1].key.as_str(), taints[1].value.as_deref(), taints[1].effect.as_str()),
        ("c", None, "NoExecute")
    );
    assert!(parse_taints("").unwrap().is_empty());
    for bad in ["a=b", "a=b:Sometimes", "=b:NoSchedule"] {
        assert!(parse_taints(bad).is_err(), "{bad}");
    }
}

#[test]
fn the_status_is_reported_on_change_or_every_report_period() {
    let facts = facts();
    let mut node = registration(&facts);
    set_status(&mut node, &facts, &Health::default(), at(0));
    let reported = node.status.clone().unwrap();
    set_status(&mut node, &facts, &Health::default(), at(10));
    let five_minutes = Duration::from_secs(300);
    let heartbeat_only = node.status.clone().unwrap();
    assert!(!should_report(&reported, &heartbeat_only, Duration::from_secs(10), five_minutes));
    assert!(should_report(&reported, &heartbeat_only, five_minutes, five_minutes));
    let down = Health { runtime_errors: vec!["container runtime is down".into()], ..Health::default() };
    set_status(&mut node, &facts, &down, at(20));
    assert!(should_report(&reported, node.status.as_ref().unwrap(), Duration::from_secs(20), five_minutes));
}

#[test]
fn pressure_conditions_carry_upstreams_reasons_and_events() {
    let facts = facts();
    let mut node = registration(&facts);
    set_status(&mut node, &facts, &Health::default(), at(0));
    let pressed = Health { pressure: vec![kubelet_core::eviction::Pressure::Disk], ..Health::default() };
    let events = set_status(&mut node, &facts, &pressed, at(10));
    assert_eq!(reasons(&events), ["NodeHasDiskPressure"]);
    let conditions = node.status.as_ref().unwrap().conditions.as_ref().unwrap();
    let disk = conditions.iter().find(|c| c.type_ == "DiskPressure").unwrap();
    assert_eq!((disk.status.as_str(), disk.reason.as_deref()), ("True", Some("KubeletHasDiskPressure")));
    assert_eq!(disk.message.as_deref(), Some("kubelet has disk pressure"));
    let memory = conditions.iter().find(|c| c.type_ == "MemoryPressure").unwrap();
    assert_eq!(memory.status, "False");
    assert_eq!(reasons(&set_status(&mut node, &facts, &Health::default(), at(20))), ["NodeHasNoDiskPressure"]);
}

#[test]
fn hard_eviction_thresholds_come_off_allocatable() {
    let mut facts = facts();
    let defaults: std::collections::BTreeMap<String, String> =
        kubelet_core::eviction::DEFAULT_EVICTION_HARD.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let none = std::collections::BTreeMap::new();
    facts.eviction = kubelet_core::eviction::Thresholds::parse(&defaults, &none, &none, &none, true).unwrap();
    let mut node = registration(&facts);
    set_status(&mut node, &facts, &Health::default(), at(0));
    let allocatable = node.status.as_ref().unwrap().allocatable.clone().unwrap();
    assert_eq!(allocatable["memory"], Quantity(((3_i64 << 30) - (100 << 20)).to_string()), "less memory.available");
    // 10 % of 10Gi through a float32, as upstream's percentage: 9663676416 less rounding.
    let storage = kubelet_core::resources::parse_quantity(&allocatable["ephemeral-storage"].0).unwrap();
    assert!((storage - 0.9 * 10_737_418_240.0).abs() < 1024.0, "less nodefs.available: {storage}");
}

#[test]
fn the_largest_images_are_listed_with_at_most_five_names() {
    let mut facts = facts();
    facts.max_images = Some(2);
    let image = |id: &str, size: u64, tags: usize| {
        let mut image = kubelet_core::runtime::Image::default();
        image.id = id.to_owned();
        image.size = size;
        image.repo_digests = vec![format!("registry/{id}@sha256:0")];
        image.repo_tags = (0..tags).map(|n| format!("registry/{id}:{n}")).collect();
        image
    };
    let health =
        Health { images: vec![image("small", 10, 1), image("big", 300, 9), image("mid", 200, 0)], ..Health::default() };
    let mut node = registration(&facts);
    set_status(&mut node, &facts, &health, at(0));
    let images = node.status.as_ref().unwrap().images.clone().unwrap();
    let sizes: Vec<Option<i64>> = images.iter().map(|i| i.size_bytes).collect();
    assert_eq!(sizes, [Some(300), Some(200)], "the two largest");
    let names = images[0].names.clone().unwrap();
    assert_eq!(names.len(), 5, "at most five names");
    assert_eq!(names[0], "registry/big@sha256:0", "digests first");
    set_status(&mut node, &facts, &Health::default(), at(10));
    assert!(node.status.as_ref().unwrap().images.is_none(), "nothing listed, nothing reported");
}
