//! Container config tests: expansion, environment, resources, security context.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{
        EnvVar, EnvVarSource, ObjectFieldSelector, PodSecurityContext, PodSpec, ResourceFieldSelector,
        ResourceRequirements, SecurityContext,
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
};

use kubelet_core::volume::PodVolumes;

use super::*;

#[test]
fn expansion_follows_upstream() {
    let vars = HashMap::from([("A", "1"), ("B", "two")]);
    let lookup = |name: &str| vars.get(name).map(|v| (*v).to_owned());
    for (input, want) in [
        ("$(A)-$(B)", "1-two"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("cost: $5", "cost: $5"),
        ("$(A", "$(A"),
        ("$", "$"),
        ("no refs", "no refs"),
    ] {
        assert_eq!(expand(input, &lookup), want, "{input}");
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..EnvVar::default() }
}

fn field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.into(), ..Default::default() }),
            ..Default::default()
        }),
        ..EnvVar::default()
    }
}

fn pod_with(container: Container) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("ns".into()),
            uid: Some("u1".into()),
            labels: Some(BTreeMap::from([("app".into(), "web".into())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec { containers: vec![container], ..PodSpec::default() }),
        ..Pod::default()
    }
}

#[test]
fn environment_resolves_values_references_and_downward_fields() {
    let mut c = Container { name: "c".into(), ..Container::default() };
    c.env = Some(vec![
        env("BASE", "/srv"),
        env("DATA", "$(BASE)/data"),
        field("POD", "metadata.name"),
        field("NS", "metadata.namespace"),
        field("IP", "status.podIP"),
        field("NODE", "spec.nodeName"),
        field("APP", "metadata.labels['app']"),
        EnvVar {
            name: "CPU".into(),
            value_from: Some(EnvVarSource {
                resource_field_ref: Some(ResourceFieldSelector {
                    resource: "limits.memory".into(),
                    divisor: Some(Quantity("1Mi".into())),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..EnvVar::default()
        },
    ]);
    c.resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([("memory".into(), Quantity("64Mi".into()))])),
        ..Default::default()
    });
    let pod = pod_with(c.clone());
    let ips = ["10.85.0.7".to_owned()];
    let got = environment(&pod, &c, &Downward { pod_ips: &ips, node_name: "node-1", host_ip: "192.0.2.2" }).unwrap();
    let got: HashMap<_, _> = got.into_iter().collect();
    assert_eq!(got["DATA"], "/srv/data");
    assert_eq!(
        (got["POD"].as_str(), got["NS"].as_str(), got["IP"].as_str(), got["NODE"].as_str()),
        ("web", "ns", "10.85.0.7", "node-1")
    );
    assert_eq!(got["APP"], "web");
    assert_eq!(got["CPU"], "64");
}

#[test]
fn api_sourced_environment_is_a_config_error() {
    let mut c = Container { name: "c".into(), ..Container::default() };
    c.env = Some(vec![EnvVar {
        name: "PASSWORD".into(),
        value_from: Some(EnvVarSource { secret_key_ref: Some(Default::default()), ..Default::default() }),
        ..EnvVar::default()
    }]);
    let err = environment(&pod_with(c.clone()), &c, &Downward::default()).unwrap_err();
    assert!(err.contains("PASSWORD"), "{err}");
}

#[test]
fn resources_become_shares_quota_limit_and_oom_score() {
    let mut c = Container { name: "c".into(), ..Container::default() };
    c.resources = Some(ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".into(), Quantity("250m".into())),
            ("memory".into(), Quantity("64Mi".into())),
        ])),
        limits: Some(BTreeMap::from([
            ("cpu".into(), Quantity("500m".into())),
            ("memory".into(), Quantity("128Mi".into())),
        ])),
        ..Default::default()
    });
    let pod = pod_with(c.clone());
    let r = linux_resources(&pod, &c, 1 << 30);
    assert_eq!((r.cpu_shares, r.cpu_period, r.cpu_quota, r.memory_limit_in_bytes), (256, 100_000, 50_000, 128 << 20));
    assert_eq!(r.oom_score_adj, 1000 - 1000 * (64 << 20) / (1 << 30), "burstable");
    let best_effort = Container { name: "c".into(), ..Container::default() };
    let r = linux_resources(&pod_with(best_effort.clone()), &best_effort, 1 << 30);
    assert_eq!((r.cpu_shares, r.cpu_quota, r.oom_score_adj), (2, 0, 1000));
}

#[test]
fn run_as_non_root_is_checked_against_the_effective_user() {
    let mut c = Container { name: "c".into(), ..Container::default() };
    c.security_context = Some(SecurityContext { run_as_non_root: Some(true), ..SecurityContext::default() });
    let pod = pod_with(c.clone());
    let root = ImageUser { uid: Some(0), username: String::new() };
    assert_eq!(security_context(&pod, &c, &root).unwrap_err(), "container has runAsNonRoot and image will run as root");
    let named = ImageUser { uid: None, username: "app".into() };
    assert!(security_context(&pod, &c, &named).unwrap_err().contains("non-numeric user (app)"));
    let mut ok = pod.clone();
    ok.spec.as_mut().unwrap().security_context =
        Some(PodSecurityContext { run_as_user: Some(1000), ..PodSecurityContext::default() });
    let sc = security_context(&ok, &c, &root).unwrap();
    assert_eq!(sc.run_as_user.unwrap().value, 1000, "the pod's runAsUser applies");
}

#[test]
fn container_config_has_log_path_attempt_labels_and_expanded_command() {
    let c = Container {
        name: "app".into(),
        image: Some("busybox:1.35".into()),
        command: Some(vec!["sh".into(), "-c".into()]),
        args: Some(vec!["echo $(GREETING)".into()]),
        env: Some(vec![env("GREETING", "hello")]),
        ..Container::default()
    };
    let pod = pod_with(c.clone());
    let user = ImageUser::default();
    let input = ConfigInput {
        pod: &pod,
        container: &c,
        restart_count: 3,
        image_ref: "sha256:abc",
        image_user: &user,
        downward: Downward::default(),
        memory_capacity: 1 << 30,
        volumes: &PodVolumes::new(),
        sub_paths: &SubPathMounts::new(),
    };
    let config = container_config(&input).unwrap();
    assert_eq!(config.log_path, "app/3.log");
    assert_eq!(config.metadata.unwrap().attempt, 3);
    assert_eq!(config.args, ["echo hello"]);
    assert_eq!(config.image.unwrap().image, "sha256:abc");
    assert_eq!(config.labels[labels::CONTAINER_NAME], "app");
    assert_eq!(labels::restart_count_of(&config.annotations), 3);
    assert_eq!(labels::hash_of(&config.annotations), crate::actions::hash(&c));
}

#[test]
fn volume_mounts_become_cri_mounts_with_sub_paths_and_propagation() {
    use k8s_openapi::api::core::v1::VolumeMount;
    let mount = |name: &str, path: &str, sub: Option<&str>, propagation: Option<&str>| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        sub_path: sub.map(Into::into),
        mount_propagation: propagation.map(Into::into),
        read_only: Some(path == "/ro"),
        ..VolumeMount::default()
    };
    let mut volumes = PodVolumes::new();
    volumes.insert("cache", "/pods/u/volumes/kubernetes.io~empty-dir/cache");
    volumes.insert_read_only("cfg", "/pods/u/volumes/kubernetes.io~configmap/cfg");
    let c = Container {
        name: "app".into(),
        volume_mounts: Some(vec![
            mount("cache", "/cache", None, None),
            mount("cache", "/ro", Some("a/b"), Some("HostToContainer")),
            // The container asks to write the config map's volume: it still may not.
            mount("cfg", "/etc/app", None, None),
        ]),
        ..Container::default()
    };
    // The subPath's host path is the bind mount prepared for mount 1, never the volume's path
    // joined with the subPath.
    let prepared = SubPathMounts::from([(1, "/pods/u/volume-subpaths/cache/app/1".into())]);
    let found = mounts(&c, &volumes, &prepared).unwrap();
    assert_eq!(found.len(), 3);
    assert_eq!((found[0].container_path.as_str(), found[0].readonly), ("/cache", false));
    assert_eq!(found[0].host_path, "/pods/u/volumes/kubernetes.io~empty-dir/cache");
    assert_eq!(found[0].propagation, pb::MountPropagation::PropagationPrivate as i32);
    assert_eq!(found[1].host_path, "/pods/u/volume-subpaths/cache/app/1");
    assert!(found[1].readonly);
    assert_eq!(found[1].propagation, pb::MountPropagation::PropagationHostToContainer as i32);
    assert_eq!(found[2].host_path, "/pods/u/volumes/kubernetes.io~configmap/cfg");
    assert!(found[2].readonly, "a volume the agent writes is mounted read-only");

    let with = |m: VolumeMount| Container { name: "app".into(), volume_mounts: Some(vec![m]), ..Container::default() };
    let none = SubPathMounts::new();
    let err = mounts(&with(mount("gone", "/x", None, None)), &volumes, &none).unwrap_err();
    assert_eq!(err, "cannot find volume \"gone\" to mount into container \"app\"");
    let err = mounts(&with(mount("cache", "/x", Some("a/b"), None)), &volumes, &none).unwrap_err();
    assert_eq!(err, "subPath \"a/b\" of volumeMount \"cache\" has not been prepared");
    let bidirectional = mount("cache", "/x", None, Some("Bidirectional"));
    assert!(mounts(&with(bidirectional), &volumes, &none).unwrap_err().contains("privileged"));
}
