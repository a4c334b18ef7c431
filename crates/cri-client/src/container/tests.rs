//! Container config tests: expansion, environment, resources, security context.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::{
    api::core::v1::{
        ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVar, EnvVarSource, ObjectFieldSelector,
        PodSecurityContext, PodSpec, ResourceFieldSelector, ResourceRequirements, SecretEnvSource, SecretKeySelector,
        SecurityContext,
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
        field("HOST_IP", "status.hostIP"),
        field("HOST_IPS", "status.hostIPs"),
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
        EnvVar {
            name: "CPU_LIMIT".into(),
            value_from: Some(EnvVarSource {
                resource_field_ref: Some(ResourceFieldSelector {
                    resource: "limits.cpu".into(),
                    divisor: Some(Quantity("1m".into())),
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
    let allocatable = BTreeMap::from([("cpu".to_owned(), Quantity("1900m".into()))]);
    let host_ips = ["192.0.2.2".to_owned(), "fd00::2".to_owned()];
    let downward = Downward { pod_ips: &ips, node_name: "node-1", host_ips: &host_ips, allocatable: &allocatable };
    let got = environment(&pod, &c, &downward, &EnvObjects::default()).unwrap();
    let got: HashMap<_, _> = got.vars.into_iter().collect();
    assert_eq!(got["DATA"], "/srv/data");
    assert_eq!(
        (got["POD"].as_str(), got["NS"].as_str(), got["IP"].as_str(), got["NODE"].as_str()),
        ("web", "ns", "10.85.0.7", "node-1")
    );
    assert_eq!(got["APP"], "web");
    assert_eq!((got["HOST_IP"].as_str(), got["HOST_IPS"].as_str()), ("192.0.2.2", "192.0.2.2,fd00::2"));
    assert_eq!(got["CPU"], "64");
    assert_eq!(got["CPU_LIMIT"], "1900", "an unset limit is the node's allocatable");
}

fn config_map_key(name: &str, map: &str, key: &str, optional: bool) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: map.into(),
                key: key.into(),
                optional: Some(optional),
            }),
            ..Default::default()
        }),
        ..EnvVar::default()
    }
}

fn secret_key(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector { name: secret.into(), key: key.into(), optional: None }),
            ..Default::default()
        }),
        ..EnvVar::default()
    }
}

/// A config map `app` and a secret `db` as an API server holds them.
fn objects() -> EnvObjects {
    let mut objects = EnvObjects::default();
    let app = BTreeMap::from([
        ("MODE".to_owned(), "fast".to_owned()),
        ("LEVEL".to_owned(), "3".to_owned()),
        ("1BAD".to_owned(), "x".to_owned()),
        ("has space".to_owned(), "y".to_owned()),
    ]);
    objects.config_maps.insert("app".into(), Some(app));
    objects.config_maps.insert("gone".into(), None);
    objects.secrets.insert("db".into(), Some(BTreeMap::from([("password".to_owned(), b"hunter2".to_vec())])));
    objects
}

#[test]
fn env_from_and_key_references_read_config_maps_and_secrets() {
    let mut c = Container { name: "c".into(), ..Container::default() };
    c.env_from = Some(vec![
        EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource { name: "app".into(), optional: None }),
            prefix: Some("APP_".into()),
            ..Default::default()
        },
        EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource { name: "gone".into(), optional: Some(true) }),
            ..Default::default()
        },
        EnvFromSource { secret_ref: Some(SecretEnvSource { name: "db".into(), optional: None }), ..Default::default() },
    ]);
    c.env = Some(vec![
        env("URL", "db://$(APP_MODE):$(password)"),
        config_map_key("LEVEL", "app", "LEVEL", false),
        config_map_key("OPTIONAL_MISSING_KEY", "app", "nope", true),
        config_map_key("OPTIONAL_MISSING_MAP", "gone", "x", true),
        secret_key("PASSWORD", "db", "password"),
        env("APP_MODE", "overridden"),
    ]);
    let pod = pod_with(c.clone());
    let got = environment(&pod, &c, &Downward::default(), &objects()).unwrap();
    let vars: HashMap<_, _> = got.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(vars["APP_LEVEL"], "3");
    assert_eq!(vars["password"], "hunter2", "a secret's keys, unprefixed");
    assert_eq!(vars["URL"], "db://fast:hunter2", "env expands against what envFrom defined");
    assert_eq!(vars["LEVEL"], "3");
    assert_eq!(vars["PASSWORD"], "hunter2");
    assert_eq!(vars["APP_MODE"], "overridden", "env wins over envFrom");
    assert!(!vars.contains_key("OPTIONAL_MISSING_KEY") && !vars.contains_key("OPTIONAL_MISSING_MAP"));
    assert_eq!(
        got.invalid_names,
        [
            "Keys [APP_has space] from the EnvFrom configMap ns/app were skipped since they are considered invalid environment variable names."
        ],
        "APP_1BAD is a valid name once prefixed; `has space` is not"
    );
}

#[test]
fn what_the_environment_cannot_resolve_is_a_config_error_in_upstreams_words() {
    let c = |var: EnvVar| Container { name: "c".into(), env: Some(vec![var]), ..Container::default() };
    let fails = |container: Container, objects: &EnvObjects| {
        environment(&pod_with(container.clone()), &container, &Downward::default(), objects).unwrap_err()
    };
    let none = EnvObjects::default();
    assert_eq!(fails(c(secret_key("P", "db", "password")), &none), "couldn't get secret ns/db, no kubeClient defined");
    assert_eq!(
        fails(c(config_map_key("L", "app", "LEVEL", false)), &none),
        "couldn't get configMap ns/app, no kubeClient defined"
    );
    assert_eq!(fails(c(config_map_key("L", "gone", "x", false)), &objects()), "configmap \"gone\" not found");
    assert_eq!(
        fails(c(config_map_key("L", "app", "nope", false)), &objects()),
        "couldn't find key nope in ConfigMap ns/app"
    );
    assert_eq!(fails(c(secret_key("P", "db", "user")), &objects()), "couldn't find key user in Secret ns/db");
}

#[test]
fn references_name_every_object_of_the_environment() {
    let mut c = Container { name: "c".into(), ..Container::default() };
    c.env_from = Some(vec![
        EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource { name: "a".into(), optional: None }),
            ..Default::default()
        },
        EnvFromSource { secret_ref: Some(SecretEnvSource { name: "s1".into(), optional: None }), ..Default::default() },
    ]);
    c.env = Some(vec![config_map_key("X", "b", "k", false), secret_key("Y", "s2", "k"), env("Z", "z")]);
    let (config_maps, secrets) = EnvObjects::references(&c);
    assert_eq!(config_maps.into_iter().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(secrets.into_iter().collect::<Vec<_>>(), ["s1", "s2"]);
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
    let r = linux_resources(&pod, &c, 1 << 30, &[]);
    assert_eq!((r.cpu_shares, r.cpu_period, r.cpu_quota, r.memory_limit_in_bytes), (256, 100_000, 50_000, 128 << 20));
    assert_eq!(r.oom_score_adj, 1000 - 1000 * (64 << 20) / (1 << 30), "burstable");
    // A huge page limit for each of the node's sizes: what the container asks, else zero.
    let mut huge = c.clone();
    let limits = huge.resources.as_mut().unwrap().limits.as_mut().unwrap();
    limits.insert("hugepages-2Mi".into(), Quantity("4Mi".into()));
    let r = linux_resources(&pod_with(huge.clone()), &huge, 1 << 30, &[2 << 20, 1 << 30]);
    let hugepages: Vec<(&str, u64)> = r.hugepage_limits.iter().map(|h| (h.page_size.as_str(), h.limit)).collect();
    assert_eq!(hugepages, [("2MB", 4 << 20), ("1GB", 0)]);
    let best_effort = Container { name: "c".into(), ..Container::default() };
    let r = linux_resources(&pod_with(best_effort.clone()), &best_effort, 1 << 30, &[]);
    assert_eq!((r.cpu_shares, r.cpu_quota, r.oom_score_adj), (2, 0, 1000));
    assert_eq!(r.cpu_period, 100_000, "upstream names the period with or without a limit");
    // The quota of 102m is 10200, not a float's 10300.
    let mut small = Container { name: "c".into(), ..Container::default() };
    small.resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([("cpu".into(), Quantity("102m".into()))])),
        ..Default::default()
    });
    let r = linux_resources(&pod_with(small.clone()), &small, 1 << 30, &[]);
    assert_eq!(r.cpu_quota, 10_200);
    assert_eq!(r.cpu_shares, 104, "from the limit, where no request is named");

    // A node-critical pod (system-node-critical and static, mirror or of critical priority)
    // is the last to go, whatever its QoS.
    let mut critical = pod_with(best_effort.clone());
    critical.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
    assert_eq!(linux_resources(&critical, &best_effort, 1 << 30, &[]).oom_score_adj, 1000, "not critical yet");
    critical.spec.as_mut().unwrap().priority = Some(2_000_001_000);
    assert_eq!(linux_resources(&critical, &best_effort, 1 << 30, &[]).oom_score_adj, -997);
}

#[test]
fn run_as_non_root_is_checked_against_the_effective_user() {
    let mut c = Container { name: "c".into(), ..Container::default() };
    c.security_context = Some(SecurityContext { run_as_non_root: Some(true), ..SecurityContext::default() });
    let pod = pod_with(c.clone());
    let root = ImageUser { uid: Some(0), username: String::new() };
    assert_eq!(
        security_context(&pod, &c, &root, profiles()).unwrap_err(),
        "container has runAsNonRoot and image will run as root"
    );
    let named = ImageUser { uid: None, username: "app".into() };
    assert!(security_context(&pod, &c, &named, profiles()).unwrap_err().contains("non-numeric user (app)"));
    let mut ok = pod.clone();
    ok.spec.as_mut().unwrap().security_context =
        Some(PodSecurityContext { run_as_user: Some(1000), ..PodSecurityContext::default() });
    let sc = security_context(&ok, &c, &root, profiles()).unwrap();
    assert_eq!(sc.run_as_user.unwrap().value, 1000, "the pod's runAsUser applies");
}

#[test]
fn a_sub_path_expr_expands_with_the_containers_environment() {
    use k8s_openapi::api::core::v1::VolumeMount;
    let mount = |sub_path: Option<&str>, expression: Option<&str>| VolumeMount {
        name: "v".into(),
        mount_path: "/v".into(),
        sub_path: sub_path.map(Into::into),
        sub_path_expr: expression.map(Into::into),
        ..VolumeMount::default()
    };
    let env: Vec<(String, String)> =
        [("POD", "web-0"), ("EMPTY", ""), ("POD", "web-1")].iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    assert_eq!(sub_path_of(&mount(None, Some("logs/$(POD)")), &env), Ok(Some("logs/web-1".into())), "the last wins");
    assert_eq!(sub_path_of(&mount(Some("fixed"), Some("$(POD)")), &env), Ok(Some("web-1".into())), "the expression");
    assert_eq!(sub_path_of(&mount(Some("fixed"), None), &env), Ok(Some("fixed".into())));
    assert_eq!(sub_path_of(&mount(None, Some("$$(POD)")), &env), Ok(Some("$(POD)".into())), "$$ is a $");
    assert_eq!(sub_path_of(&mount(None, None), &env), Ok(None));
    assert_eq!(
        sub_path_of(&mount(None, Some("$(NONE)/$(EMPTY)/$(ALSO_NONE)")), &env),
        Err("missing value for ALSO_NONE, EMPTY, NONE".into())
    );
}

#[test]
fn the_fs_group_comes_first_among_the_supplemental_groups() {
    let c = Container { name: "c".into(), ..Container::default() };
    let mut pod = pod_with(c.clone());
    pod.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
        fs_group: Some(2000),
        supplemental_groups: Some(vec![4000, 2000, 5000]),
        ..PodSecurityContext::default()
    });
    let sc = security_context(&pod, &c, &ImageUser::default(), profiles()).unwrap();
    assert_eq!(sc.supplemental_groups, [2000, 4000, 2000, 5000], "upstream's order, a repeat passed on as it is");
    let log_dir = std::path::Path::new("/var/log/pods/x");
    let sandbox =
        crate::sandbox::sandbox_config(&pod, 0, log_dir, "/kubepods", &crate::sandbox::Dns::default()).unwrap();
    let groups = sandbox.linux.unwrap().security_context.unwrap().supplemental_groups;
    assert_eq!(groups, [2000, 4000, 2000, 5000]);
}

#[test]
fn containers_get_upstreams_masked_and_read_only_proc_paths() {
    let mut c = Container { name: "c".into(), ..Container::default() };
    let sc = security_context(&pod_with(c.clone()), &c, &ImageUser::default(), profiles()).unwrap();
    assert!(sc.readonly_paths.contains(&"/proc/sys".to_owned()), "{:?}", sc.readonly_paths);
    assert!(sc.masked_paths.contains(&"/proc/kcore".to_owned()), "{:?}", sc.masked_paths);
    assert_eq!((sc.masked_paths.len(), sc.readonly_paths.len()), (MASKED_PATHS.len(), READONLY_PATHS.len()));

    // Privileged: sent all the same, as upstream does (the runtime drops them).
    c.security_context = Some(SecurityContext { privileged: Some(true), ..SecurityContext::default() });
    let sc = security_context(&pod_with(c.clone()), &c, &ImageUser::default(), profiles()).unwrap();
    assert_eq!(sc.readonly_paths.len(), READONLY_PATHS.len());

    c.security_context = Some(SecurityContext { proc_mount: Some("Unmasked".into()), ..SecurityContext::default() });
    let sc = security_context(&pod_with(c.clone()), &c, &ImageUser::default(), profiles()).unwrap();
    assert!(sc.masked_paths.is_empty() && sc.readonly_paths.is_empty(), "Unmasked hides nothing");
}

fn profiles() -> &'static std::path::Path {
    std::path::Path::new("/var/lib/kubelet/seccomp")
}

#[test]
fn localhost_seccomp_profiles_live_under_the_root_directory() {
    use k8s_openapi::api::core::v1::SeccompProfile;
    let with_profile = |path: Option<&str>| {
        let mut c = Container { name: "c".into(), ..Container::default() };
        c.security_context = Some(SecurityContext {
            seccomp_profile: Some(SeccompProfile {
                type_: "Localhost".into(),
                localhost_profile: path.map(Into::into),
            }),
            ..SecurityContext::default()
        });
        let pod = pod_with(c.clone());
        security_context(&pod, &c, &ImageUser::default(), profiles()).map(|sc| sc.seccomp.unwrap().localhost_ref)
    };
    assert_eq!(with_profile(Some("profiles/audit.json")).unwrap(), "/var/lib/kubelet/seccomp/profiles/audit.json");
    assert!(with_profile(Some("../../etc/x.json")).is_err(), "nothing outside the profiles' directory");
    assert!(with_profile(Some("/etc/x.json")).is_err());
    assert!(with_profile(None).is_err());
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
        env: &[("GREETING".to_owned(), "hello".to_owned())],
        memory_capacity: 1 << 30,
        hugepage_sizes: &[2 << 20, 1 << 30],
        volumes: &PodVolumes::new(),
        sub_paths: &SubPathMounts::new(),
        seccomp_profiles: std::path::Path::new("/var/lib/kubelet/seccomp"),
        pid_target: None,
    };
    let config = container_config(&input).unwrap();
    let hugepages = &config.linux.as_ref().unwrap().resources.as_ref().unwrap().hugepage_limits;
    let hugepages: Vec<(&str, u64)> = hugepages.iter().map(|h| (h.page_size.as_str(), h.limit)).collect();
    assert_eq!(hugepages, [("2MB", 0), ("1GB", 0)], "no huge pages asked for: none of either size");
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
    assert_eq!(err, "the subPath of volumeMount \"cache\" has not been prepared");
    let bidirectional = mount("cache", "/x", None, Some("Bidirectional"));
    assert!(mounts(&with(bidirectional), &volumes, &none).unwrap_err().contains("privileged"));
}

/// Service `namespace/name` with cluster IP `ip` and `ports` (name, port, protocol).
fn service(namespace: &str, name: &str, ip: &str, ports: &[(&str, i32, &str)]) -> k8s_openapi::api::core::v1::Service {
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
    let ports = ports
        .iter()
        .map(|(port_name, port, protocol)| ServicePort {
            name: (!port_name.is_empty()).then(|| (*port_name).to_owned()),
            port: *port,
            protocol: (!protocol.is_empty()).then(|| (*protocol).to_owned()),
            ..ServicePort::default()
        })
        .collect();
    Service {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(namespace.into()), ..ObjectMeta::default() },
        spec: Some(ServiceSpec { cluster_ip: Some(ip.into()), ports: Some(ports), ..ServiceSpec::default() }),
        ..Default::default()
    }
}

/// The API server's service, one of the pod's namespace with two ports, a headless one, and
/// one of another namespace.
fn services() -> Vec<k8s_openapi::api::core::v1::Service> {
    vec![
        service("default", "kubernetes", "10.96.0.1", &[("https", 443, "TCP")]),
        service("ns", "redis-master", "10.96.0.20", &[("", 6379, ""), ("metrics-port", 9121, "TCP")]),
        service("ns", "dns", "10.96.0.10", &[("dns", 53, "UDP")]),
        service("ns", "headless", "None", &[("", 80, "TCP")]),
        service("other", "elsewhere", "10.96.0.30", &[("", 80, "TCP")]),
    ]
}

#[test]
fn service_variables_are_upstreams() {
    let vars = service_environment(&services(), "ns", true);
    let kubernetes = [
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("KUBERNETES_SERVICE_PORT", "443"),
        ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
        ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
        ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
        ("KUBERNETES_PORT_443_TCP_PORT", "443"),
        ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
    ];
    for (name, value) in kubernetes {
        assert_eq!(vars.get(name).map(String::as_str), Some(value), "{name}");
    }
    for (name, value) in [
        ("REDIS_MASTER_SERVICE_HOST", "10.96.0.20"),
        ("REDIS_MASTER_SERVICE_PORT", "6379"),
        ("REDIS_MASTER_SERVICE_PORT_METRICS_PORT", "9121"),
        ("REDIS_MASTER_PORT", "tcp://10.96.0.20:6379"),
        ("REDIS_MASTER_PORT_9121_TCP", "tcp://10.96.0.20:9121"),
        ("DNS_PORT", "udp://10.96.0.10:53"),
        ("DNS_PORT_53_UDP_PROTO", "udp"),
    ] {
        assert_eq!(vars.get(name).map(String::as_str), Some(value), "{name}");
    }
    assert_eq!(vars.len(), 8 + 12 + 8, "nothing of the headless service or another namespace: {vars:?}");

    let without_links = service_environment(&services(), "ns", false);
    let expected: BTreeMap<String, String> = kubernetes.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    assert_eq!(without_links, expected, "only the API server's service without enableServiceLinks");

    let ipv6 = service("default", "kubernetes", "fd00::1", &[("https", 443, "TCP")]);
    assert_eq!(service_environment(&[ipv6], "ns", true)["KUBERNETES_PORT"], "tcp://[fd00::1]:443");
}

#[test]
fn service_variables_come_last_and_give_way_to_the_containers_own() {
    let mut c = Container { name: "c".into(), ..Container::default() };
    c.env = Some(vec![
        env("REDIS", "$(REDIS_MASTER_SERVICE_HOST):$(REDIS_MASTER_SERVICE_PORT)"),
        env("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc"),
    ]);
    let pod = pod_with(c.clone());
    let objects = EnvObjects { services: services(), ..EnvObjects::default() };
    let got = environment(&pod, &c, &Downward::default(), &objects).unwrap();
    assert_eq!(got.vars[0], ("REDIS".to_owned(), "10.96.0.20:6379".to_owned()), "expanded from the services");
    assert_eq!(got.vars[1].1, "kubernetes.default.svc");
    assert_eq!(got.vars.iter().filter(|(k, _)| k == "KUBERNETES_SERVICE_HOST").count(), 1, "the container's wins");
    assert!(got.vars.iter().any(|(k, v)| k == "KUBERNETES_SERVICE_PORT" && v == "443"));

    let mut no_links = pod.clone();
    no_links.spec.as_mut().unwrap().enable_service_links = Some(false);
    let got = environment(&no_links, &c, &Downward::default(), &objects).unwrap();
    assert_eq!(got.vars[0].1, "$(REDIS_MASTER_SERVICE_HOST):$(REDIS_MASTER_SERVICE_PORT)", "left as written");
    assert!(!got.vars.iter().any(|(k, _)| k.starts_with("REDIS_MASTER")));
}

#[test]
fn an_ephemeral_container_joins_its_targets_process_namespace_unless_the_pod_shares_one() {
    let c = Container { name: "debug".into(), ..Container::default() };
    let user = ImageUser::default();
    let pid_of = |pod: &Pod| {
        let input = ConfigInput {
            pod,
            container: &c,
            restart_count: 0,
            image_ref: "sha256:abc",
            image_user: &user,
            env: &[],
            memory_capacity: 1 << 30,
            hugepage_sizes: &[],
            volumes: &PodVolumes::new(),
            sub_paths: &SubPathMounts::new(),
            seccomp_profiles: std::path::Path::new("/var/lib/kubelet/seccomp"),
            pid_target: Some("c0ffee"),
        };
        let config = container_config(&input).unwrap();
        let namespaces = config.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        (pb::NamespaceMode::try_from(namespaces.pid).unwrap(), namespaces.target_id)
    };
    let mut pod = pod_with(c.clone());
    assert_eq!(pid_of(&pod), (pb::NamespaceMode::Target, "c0ffee".to_owned()));
    pod.spec.as_mut().unwrap().share_process_namespace = Some(true);
    assert_eq!(pid_of(&pod), (pb::NamespaceMode::Pod, String::new()), "the pod's namespace holds the target already");
}

#[test]
fn an_apparmor_profile_goes_to_the_runtime_in_both_of_the_cris_ways() {
    let c = Container { name: "app".into(), ..Container::default() };
    let mut pod = pod_with(c.clone());
    let key = "container.apparmor.security.beta.kubernetes.io/app".to_owned();
    pod.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(key, "localhost/k8s-nginx".to_owned());
    let context = security_context(&pod, &c, &ImageUser::default(), std::path::Path::new("/p")).unwrap();
    #[allow(deprecated)] // Reason: containerd 1.6 reads the deprecated name; it must be there.
    let name = context.apparmor_profile.clone();
    assert_eq!(name, "localhost/k8s-nginx");
    let profile = context.apparmor.unwrap();
    assert_eq!(
        (profile.profile_type, profile.localhost_ref.as_str()),
        (pb::security_profile::ProfileType::Localhost as i32, "k8s-nginx")
    );
    let plain = security_context(&pod_with(c.clone()), &c, &ImageUser::default(), std::path::Path::new("/p")).unwrap();
    assert!(plain.apparmor.is_none(), "none asked for: the runtime's default");
}

#[test]
fn selinux_options_come_from_the_container_else_the_pod_and_managed_volumes_are_relabelled() {
    use k8s_openapi::api::core::v1::{PodSecurityContext, SELinuxOptions, SecurityContext, VolumeMount};
    let level = |level: &str| Some(SELinuxOptions { level: Some(level.into()), ..SELinuxOptions::default() });
    let mut c = Container { name: "app".into(), ..Container::default() };
    c.volume_mounts = Some(vec![
        VolumeMount { name: "cache".into(), mount_path: "/cache".into(), ..VolumeMount::default() },
        VolumeMount { name: "host".into(), mount_path: "/host".into(), ..VolumeMount::default() },
    ]);
    let mut pod = pod_with(c.clone());
    pod.spec.as_mut().unwrap().security_context =
        Some(PodSecurityContext { se_linux_options: level("s0:c1,c2"), ..PodSecurityContext::default() });
    let of = |pod: &Pod, c: &Container| {
        let context = security_context(pod, c, &ImageUser::default(), std::path::Path::new("/p")).unwrap();
        context.selinux_options.map(|o| o.level)
    };
    assert_eq!(of(&pod, &c).as_deref(), Some("s0:c1,c2"), "the pod's");
    let mut own = c.clone();
    own.security_context = Some(SecurityContext { se_linux_options: level("s0:c3"), ..SecurityContext::default() });
    assert_eq!(of(&pod, &own).as_deref(), Some("s0:c3"), "the container's over the pod's");
    let mut volumes = PodVolumes::new();
    volumes.insert("cache", "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache");
    volumes.relabel("cache");
    volumes.insert("host", "/srv");
    let relabelled: Vec<bool> =
        mounts(&c, &volumes, &SubPathMounts::new()).unwrap().iter().map(|m| m.selinux_relabel).collect();
    assert_eq!(relabelled, [true, false], "the agent's volume, not the host's path");
}
