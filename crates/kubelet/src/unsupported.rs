//! The pod fields this agent does not implement yet.
//!
//! A pod that uses one is refused at admission (phase `Failed`, reason `UnsupportedPodSpec`, a
//! Warning event naming the field), never run without it: a pod without its volume mounts,
//! readiness probe or hooks looks healthy until data is lost.
//! The change that implements a field removes it from [`FIELDS`].

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, SecurityContext, Volume};

/// Upstream-style reason of the rejection.
pub const REASON: &str = "UnsupportedPodSpec";

/// The pod fields this agent does not implement, as path patterns (`[*]` is any index, and
/// `containers` stands for init, regular and ephemeral containers alike).
pub const FIELDS: &[&str] = &[
    "spec.volumes[*]",
    "spec.hostUsers",
    "spec.resourceClaims",
    "spec.securityContext.supplementalGroupsPolicy",
    "spec.containers[*].volumeMounts[*].recursiveReadOnly",
    "spec.containers[*].volumeDevices",
    "spec.containers[*].lifecycle.postStart.tcpSocket",
    "spec.containers[*].lifecycle.preStop.tcpSocket",
    "spec.containers[*].lifecycle.stopSignal",
    "spec.containers[*].resources.claims",
    "spec.containers[*].securityContext.procMount",
    "spec.containers[*].restartPolicy",
    "spec.containers[*].restartPolicyRules",
];

/// The probe fields, refused as well when the agent runs without a prober, and on containers
/// that are never probed (regular init containers and ephemeral containers, where upstream's API
/// validation forbids them).
pub const PROBE_FIELDS: &[&str] =
    &["spec.containers[*].livenessProbe", "spec.containers[*].readinessProbe", "spec.containers[*].startupProbe"];

/// The lifecycle hooks, refused as well when the runtime runs no hooks, and on containers that
/// never run them (regular init containers and ephemeral containers, where upstream's API
/// validation forbids them).
pub const HOOK_FIELDS: &[&str] = &["spec.containers[*].lifecycle"];

/// The runtime class, refused as well when the runtime looks no runtime classes up (an agent
/// without an API server).
pub const RUNTIME_CLASS_FIELDS: &[&str] = &["spec.runtimeClassName"];

/// The volume mounts, refused as well when the agent has no volume manager (then every volume
/// is refused too).
pub const VOLUME_FIELDS: &[&str] = &["spec.containers[*].volumeMounts"];

/// What the agent at hand can do beyond the fixed set of fields.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct Abilities<'a> {
    /// The agent has a prober: the [`PROBE_FIELDS`] are implemented.
    pub probes: bool,
    /// The runtime runs lifecycle hooks: the [`HOOK_FIELDS`] are implemented.
    pub hooks: bool,
    /// The runtime looks runtime classes up: the [`RUNTIME_CLASS_FIELDS`] are implemented.
    pub runtime_classes: bool,
    /// The agent's volume manager says which volumes it sets up; `None`: no volumes at all.
    pub volumes: Option<&'a (dyn Fn(&Volume) -> bool + Sync)>,
}

impl std::fmt::Debug for Abilities<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Abilities")
            .field("probes", &self.probes)
            .field("hooks", &self.hooks)
            .field("runtime_classes", &self.runtime_classes)
            .field("volumes", &self.volumes.is_some())
            .finish()
    }
}

impl<'a> Abilities<'a> {
    /// What an agent with (or without) a prober and hooks, and without volumes, can do.
    pub fn new(probes: bool, hooks: bool) -> Self {
        Abilities { probes, hooks, runtime_classes: false, volumes: None }
    }

    /// Whether the runtime looks runtime classes up (`spec.runtimeClassName`).
    #[must_use]
    pub fn runtime_classes(mut self, runs_them: bool) -> Self {
        self.runtime_classes = runs_them;
        self
    }

    /// Volumes for which `supports` holds are implemented, and so are volume mounts.
    #[must_use]
    pub fn volumes(mut self, supports: &'a (dyn Fn(&Volume) -> bool + Sync)) -> Self {
        self.volumes = Some(supports);
        self
    }
}

/// The fields of `pod` this agent does not implement, as concrete paths
/// (`spec.volumes[0].configMap`, `spec.containers[1].lifecycle`), in spec order.
pub fn unsupported_fields(pod: &Pod, abilities: Abilities<'_>) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    let mut found = pod_fields(spec, abilities);
    for (path, container) in containers(spec) {
        container_fields(&path, &container, abilities, &mut found);
    }
    found
}

/// The rejection message: every unsupported field the pod uses.
pub fn message(fields: &[String]) -> String {
    format!("this node agent does not implement {}", fields.join(", "))
}

fn pod_fields(spec: &PodSpec, abilities: Abilities<'_>) -> Vec<String> {
    let mut found = Vec::new();
    for (i, volume) in spec.volumes.iter().flatten().enumerate() {
        if !abilities.volumes.is_some_and(|supports| supports(volume)) {
            found.push(format!("spec.volumes[{i}]{}", volume_source(volume)));
        }
    }
    let mut check = |used: bool, field: &str| {
        if used {
            found.push(field.to_owned());
        }
    };
    let names_a_class = spec.runtime_class_name.as_ref().is_some_and(|s| !s.is_empty());
    check(names_a_class && !abilities.runtime_classes, "spec.runtimeClassName");
    check(spec.host_users == Some(false), "spec.hostUsers");
    check(spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()), "spec.resourceClaims");
    if let Some(sc) = &spec.security_context {
        check(
            sc.supplemental_groups_policy.as_deref().is_some_and(|p| p != "Merge"),
            "spec.securityContext.supplementalGroupsPolicy",
        );
    }
    found
}

/// `.configMap` for a configMap volume: the name of the source field that is set.
fn volume_source(volume: &Volume) -> String {
    match serde_json::to_value(volume) {
        Ok(serde_json::Value::Object(fields)) => {
            fields.keys().find(|k| *k != "name").map(|k| format!(".{k}")).unwrap_or_default()
        }
        _ => String::new(),
    }
}

/// Every container with its path: init, regular, then ephemeral (as the containers they run as).
fn containers(spec: &PodSpec) -> Vec<(String, Container)> {
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c.clone()));
    let regular = spec.containers.iter().enumerate().map(|(i, c)| (format!("spec.containers[{i}]"), c.clone()));
    let ephemeral = spec.ephemeral_containers.iter().flatten().enumerate().map(|(i, e)| {
        let as_container = kubelet_core::types::ephemeral_as_container(e);
        (format!("spec.ephemeralContainers[{i}]"), as_container)
    });
    init.chain(regular).chain(ephemeral).collect()
}

fn container_fields(path: &str, c: &Container, abilities: Abilities<'_>, found: &mut Vec<String>) {
    // A container's own restart policy is honoured only as a sidecar's: `Always` on an init
    // container. Elsewhere (upstream's container restart rules) it would be ignored.
    let sidecar = path.starts_with("spec.initContainers") && kubelet_core::types::is_sidecar(c);
    let long_running = path.starts_with("spec.containers") || sidecar;
    let probed = abilities.probes && long_running;
    let hooked = abilities.hooks && long_running;
    let mut check = |used: bool, field: &str| {
        if used {
            found.push(format!("{path}.{field}"));
        }
    };
    let mounts = c.volume_mounts.as_deref().unwrap_or_default();
    check(!mounts.is_empty() && abilities.volumes.is_none(), "volumeMounts");
    for (j, mount) in mounts.iter().enumerate().filter(|_| abilities.volumes.is_some()) {
        check(
            mount.recursive_read_only.as_deref().is_some_and(|r| r != "Disabled"),
            &format!("volumeMounts[{j}].recursiveReadOnly"),
        );
    }
    check(c.volume_devices.as_ref().is_some_and(|d| !d.is_empty()), "volumeDevices");
    for (name, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        check(!probed && probe.is_some(), name);
    }
    if let Some(lifecycle) = &c.lifecycle {
        check(!hooked, "lifecycle");
        for (name, handler) in [("postStart", &lifecycle.post_start), ("preStop", &lifecycle.pre_stop)] {
            let Some(handler) = handler.as_ref().filter(|_| hooked) else { continue };
            // Upstream keeps the field for compatibility only; the hook would fail every time.
            check(handler.tcp_socket.is_some(), &format!("lifecycle.{name}.tcpSocket"));
        }
        check(hooked && lifecycle.stop_signal.is_some(), "lifecycle.stopSignal");
    }
    check(c.resources.as_ref().and_then(|r| r.claims.as_ref()).is_some_and(|c| !c.is_empty()), "resources.claims");
    let sc: Option<&SecurityContext> = c.security_context.as_ref();
    check(sc.and_then(|s| s.proc_mount.as_deref()).is_some_and(|m| m != "Default"), "securityContext.procMount");
    check(c.restart_policy.is_some() && !sidecar, "restartPolicy");
    check(c.restart_policy_rules.as_ref().is_some_and(|r| !r.is_empty()), "restartPolicyRules");
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ConfigMapVolumeSource, Container as ApiContainer, ContainerRestartRule, EmptyDirVolumeSource,
        EphemeralContainer, Lifecycle, LifecycleHandler, PodResourceClaim, PodSecurityContext, Probe, ResourceClaim,
        ResourceRequirements, TCPSocketAction, Volume, VolumeDevice, VolumeMount,
    };

    use super::*;

    fn pod() -> Pod {
        kubelet_core::testing::pod("u", &["web"])
    }

    /// The node-local volume types, as `kubelet-volumes` sets them up.
    fn node_local(volume: &Volume) -> bool {
        volume.empty_dir.is_some() || volume.host_path.is_some() || volume.downward_api.is_some()
    }

    /// Everything: a prober, hooks, runtime classes and node-local volumes.
    fn all() -> Abilities<'static> {
        Abilities::new(true, true).runtime_classes(true).volumes(&node_local)
    }

    /// A pod that uses `field` and nothing else unsupported, for every entry of [`FIELDS`].
    fn using(field: &str) -> Pod {
        let mut pod = pod();
        let spec = pod.spec.as_mut().unwrap();
        let c = &mut spec.containers[0];
        match field {
            "spec.volumes[*]" => {
                spec.volumes = Some(vec![Volume {
                    name: "v".into(),
                    config_map: Some(ConfigMapVolumeSource::default()),
                    ..Volume::default()
                }]);
            }
            "spec.containers[*].volumeMounts[*].recursiveReadOnly" => {
                c.volume_mounts = Some(vec![VolumeMount {
                    name: "v".into(),
                    mount_path: "/v".into(),
                    recursive_read_only: Some("Enabled".into()),
                    ..VolumeMount::default()
                }]);
            }
            "spec.runtimeClassName" => spec.runtime_class_name = Some("gvisor".into()),
            "spec.hostUsers" => spec.host_users = Some(false),
            "spec.resourceClaims" => {
                spec.resource_claims =
                    Some(vec![PodResourceClaim { name: "gpu".into(), ..PodResourceClaim::default() }]);
            }
            "spec.securityContext.supplementalGroupsPolicy" => {
                spec.security_context = Some(PodSecurityContext {
                    supplemental_groups_policy: Some("Strict".into()),
                    ..PodSecurityContext::default()
                });
            }
            "spec.containers[*].volumeMounts" => {
                c.volume_mounts =
                    Some(vec![VolumeMount { name: "v".into(), mount_path: "/v".into(), ..VolumeMount::default() }]);
            }
            "spec.containers[*].volumeDevices" => {
                c.volume_devices = Some(vec![VolumeDevice { name: "d".into(), device_path: "/dev/d".into() }]);
            }
            "spec.containers[*].livenessProbe" => c.liveness_probe = Some(Probe::default()),
            "spec.containers[*].readinessProbe" => c.readiness_probe = Some(Probe::default()),
            "spec.containers[*].startupProbe" => c.startup_probe = Some(Probe::default()),
            "spec.containers[*].lifecycle" => c.lifecycle = Some(Lifecycle::default()),
            "spec.containers[*].lifecycle.postStart.tcpSocket" => c.lifecycle = Some(hook(true, tcp_hook())),
            "spec.containers[*].lifecycle.preStop.tcpSocket" => c.lifecycle = Some(hook(false, tcp_hook())),
            "spec.containers[*].lifecycle.stopSignal" => {
                c.lifecycle = Some(Lifecycle { stop_signal: Some("SIGUSR1".into()), ..Lifecycle::default() });
            }
            "spec.containers[*].resources.claims" => {
                c.resources = Some(ResourceRequirements {
                    claims: Some(vec![ResourceClaim { name: "gpu".into(), ..ResourceClaim::default() }]),
                    ..ResourceRequirements::default()
                });
            }
            "spec.containers[*].securityContext.procMount" => {
                c.security_context =
                    Some(SecurityContext { proc_mount: Some("Unmasked".into()), ..SecurityContext::default() });
            }
            "spec.containers[*].restartPolicy" => c.restart_policy = Some("Never".into()),
            "spec.containers[*].restartPolicyRules" => {
                c.restart_policy_rules = Some(vec![ContainerRestartRule::default()]);
            }
            other => panic!("FIELDS lists {other} but this test has no pod using it: add one"),
        }
        pod
    }

    fn hook(post_start: bool, handler: LifecycleHandler) -> Lifecycle {
        if post_start {
            Lifecycle { post_start: Some(handler), ..Lifecycle::default() }
        } else {
            Lifecycle { pre_stop: Some(handler), ..Lifecycle::default() }
        }
    }

    fn tcp_hook() -> LifecycleHandler {
        LifecycleHandler { tcp_socket: Some(TCPSocketAction::default()), ..LifecycleHandler::default() }
    }

    /// `spec.containers[*].lifecycle` matches `spec.containers[0].lifecycle`.
    fn matches(pattern: &str, path: &str) -> bool {
        let mut rest = path;
        for (i, part) in pattern.split("[*]").enumerate() {
            if i > 0 {
                let Some(after) = rest.strip_prefix('[').and_then(|r| r.split_once(']')) else { return false };
                rest = after.1;
            }
            let Some(after) = rest.strip_prefix(part) else { return false };
            rest = after;
        }
        rest.is_empty() || rest.starts_with('.')
    }

    #[test]
    fn every_listed_field_is_found_and_named() {
        assert!(unsupported_fields(&pod(), all()).is_empty(), "a plain pod uses nothing unsupported");
        for field in FIELDS {
            let found = unsupported_fields(&using(field), all());
            assert_eq!(found.len(), 1, "{field}: {found:?}");
            assert!(matches(field, &found[0]), "{field} found as {}", found[0]);
        }
        let without = [
            (PROBE_FIELDS, Abilities::new(false, true).volumes(&node_local)),
            (HOOK_FIELDS, Abilities::new(true, false).volumes(&node_local)),
            (VOLUME_FIELDS, Abilities::new(true, true).runtime_classes(true)),
            (RUNTIME_CLASS_FIELDS, Abilities::new(true, true).volumes(&node_local)),
        ];
        for (fields, lacking) in without {
            for field in fields {
                assert!(unsupported_fields(&using(field), all()).is_empty(), "{field} when implemented");
                let found = unsupported_fields(&using(field), lacking);
                assert_eq!(found.len(), 1, "{field}: {found:?}");
                assert!(matches(field, &found[0]), "{field} found as {}", found[0]);
            }
        }
    }

    #[test]
    fn probes_are_refused_where_nothing_probes_them() {
        let mut pod = pod();
        let spec = pod.spec.as_mut().unwrap();
        let probed = |name: &str, policy: Option<&str>| ApiContainer {
            name: name.into(),
            restart_policy: policy.map(Into::into),
            readiness_probe: Some(Probe::default()),
            ..ApiContainer::default()
        };
        spec.init_containers = Some(vec![probed("sidecar", Some("Always")), probed("once", None)]);
        spec.ephemeral_containers = Some(vec![EphemeralContainer {
            name: "debug".into(),
            liveness_probe: Some(Probe::default()),
            ..EphemeralContainer::default()
        }]);
        assert_eq!(
            unsupported_fields(&pod, all()),
            ["spec.initContainers[1].readinessProbe", "spec.ephemeralContainers[0].livenessProbe"]
        );
    }

    #[test]
    fn paths_name_the_volume_source_and_every_kind_of_container() {
        let mut pod = pod();
        let spec = pod.spec.as_mut().unwrap();
        spec.volumes = Some(vec![
            Volume { name: "a".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() },
            Volume { name: "b".into(), config_map: Some(ConfigMapVolumeSource::default()), ..Volume::default() },
        ]);
        let mut init = spec.containers[0].clone();
        init.name = "init".into();
        init.startup_probe = Some(Probe::default());
        spec.init_containers = Some(vec![init]);
        spec.ephemeral_containers = Some(vec![EphemeralContainer {
            name: "debug".into(),
            lifecycle: Some(Lifecycle::default()),
            ..EphemeralContainer::default()
        }]);
        let found = unsupported_fields(&pod, all());
        assert_eq!(
            found,
            [
                "spec.volumes[1].configMap",
                "spec.initContainers[0].startupProbe",
                "spec.ephemeralContainers[0].lifecycle",
            ]
        );
        assert_eq!(
            unsupported_fields(&pod, Abilities::new(true, true))[..2],
            ["spec.volumes[0].emptyDir", "spec.volumes[1].configMap"],
            "without a volume manager every volume is refused"
        );
        assert_eq!(
            message(&found[1..]),
            "this node agent does not implement spec.initContainers[0].startupProbe, spec.ephemeralContainers[0].lifecycle"
        );
    }

    #[test]
    fn a_sidecar_restart_policy_is_honoured_any_other_is_refused() {
        let mut pod = pod();
        let spec = pod.spec.as_mut().unwrap();
        let init = |name: &str, policy: &str| ApiContainer {
            name: name.into(),
            restart_policy: Some(policy.into()),
            ..ApiContainer::default()
        };
        spec.init_containers = Some(vec![init("sidecar", "Always"), init("once", "Never")]);
        assert_eq!(unsupported_fields(&pod, all()), ["spec.initContainers[1].restartPolicy"]);
    }

    #[test]
    fn defaults_that_change_nothing_are_accepted() {
        let mut pod = pod();
        let spec = pod.spec.as_mut().unwrap();
        spec.host_users = Some(true);
        spec.set_hostname_as_fqdn = Some(false);
        spec.security_context = Some(PodSecurityContext {
            supplemental_groups_policy: Some("Merge".into()),
            run_as_user: Some(1000),
            ..PodSecurityContext::default()
        });
        spec.containers[0].security_context =
            Some(SecurityContext { proc_mount: Some("Default".into()), ..SecurityContext::default() });
        assert!(unsupported_fields(&pod, all()).is_empty());
    }
}
