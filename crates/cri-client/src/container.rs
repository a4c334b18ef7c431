//! The container config (upstream `kuberuntime_container.go` `generateContainerConfig`):
//! command and args with `$(VAR)` expansion, environment with downward-API values, security
//! context, resources and the log path.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use k8s_openapi::api::core::v1::{Container, Pod};
use kubelet_core::{
    resources::{container_resource, hugepage_limits, milli, qos_class, units},
    volume::PodVolumes,
};

use crate::{labels, pb};

/// Expands `$(VAR)` references in `input` with `lookup` (upstream `expansion.Expand`): `$$` is
/// a literal `$`, and a reference to an undefined variable stays as written.
pub fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match lookup(name) {
                Some(value) => out.push_str(&value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// What the environment's downward-API values come from.
#[derive(Clone, Debug)]
pub struct Downward<'a> {
    /// The pod's IPs, primary first.
    pub pod_ips: &'a [String],
    /// The node's name.
    pub node_name: &'a str,
    /// The node's IPs, primary first.
    pub host_ips: &'a [String],
    /// The node's allocatable resources, for `resourceFieldRef`s to limits the container does
    /// not set.
    pub allocatable: &'a std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
}

/// No allocatable resources: what [`Downward::default`] knows.
static NO_ALLOCATABLE: std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> =
    std::collections::BTreeMap::new();

impl Default for Downward<'_> {
    fn default() -> Self {
        Downward { pod_ips: &[], node_name: "", host_ips: &[], allocatable: &NO_ALLOCATABLE }
    }
}

/// CPU shares from a CPU request in millicores (upstream `MilliCPUToShares`).
pub fn cpu_shares(milli_cpu: i64) -> i64 {
    (milli_cpu * 1024 / 1000).max(2)
}

/// The CFS period the kubelet gives every container and sandbox, in microseconds (upstream's
/// `quotaPeriod`; `cpuCFSQuotaPeriod` is refused at any other value).
pub const CPU_PERIOD: i64 = 100_000;

/// Linux resources from a CPU request and limit in millicores and a memory limit in bytes (zero
/// for none), as upstream's `calculateLinuxResources` makes them with `cpuCFSQuota` (which is
/// refused when off): shares from the request, or from the limit where no request is named; the
/// period always; a quota from the limit, at least 1 ms of it.
pub fn cpu_and_memory(cpu_request: Option<i64>, cpu_limit: i64, memory_limit: i64) -> pb::LinuxContainerResources {
    let cpu_quota = if cpu_limit > 0 { (cpu_limit * CPU_PERIOD / 1000).max(1000) } else { 0 };
    pb::LinuxContainerResources {
        cpu_shares: cpu_shares(cpu_request.unwrap_or(cpu_limit)),
        cpu_period: CPU_PERIOD,
        cpu_quota,
        memory_limit_in_bytes: memory_limit,
        ..Default::default()
    }
}

/// The container's Linux resources: [`cpu_and_memory`] from its CPU request and limit and its
/// memory limit, a huge page limit for each of the node's `hugepage_sizes` (zero for a size it
/// does not ask for), and the OOM score adjustment of its QoS class.
pub fn linux_resources(
    pod: &Pod,
    container: &Container,
    memory_capacity: i64,
    hugepage_sizes: &[u64],
) -> pb::LinuxContainerResources {
    let cpu_request = container_resource(container, "cpu", false).and_then(milli);
    let cpu_limit = container_resource(container, "cpu", true).and_then(milli).unwrap_or(0);
    let memory_limit = container_resource(container, "memory", true).and_then(units).unwrap_or(0);
    let memory_request = container_resource(container, "memory", false).and_then(units).unwrap_or(0);
    let mut resources = cpu_and_memory(cpu_request, cpu_limit, memory_limit);
    let limits = container.resources.as_ref().and_then(|r| r.limits.clone()).unwrap_or_default();
    resources.hugepage_limits = hugepage_limits(hugepage_sizes, &limits)
        .into_iter()
        .map(|(page_size, limit)| pb::HugepageLimit { page_size, limit })
        .collect();
    resources.oom_score_adj = match qos_class(pod) {
        _ if is_node_critical(pod) => -997,
        "Guaranteed" => -997,
        "BestEffort" => 1000,
        _ => {
            let adjust = 1000 - (1000 * memory_request) / memory_capacity.max(1);
            adjust.clamp(3, 999)
        }
    };
    resources
}

/// Whether `pod` is node-critical (upstream `IsNodeCriticalPod`): `system-node-critical`, and
/// critical, being static, a mirror pod, or of a priority of at least `system-cluster-critical`'s.
/// Its containers are the last the kernel kills, as a Guaranteed pod's.
fn is_node_critical(pod: &Pod) -> bool {
    let node_critical_class =
        pod.spec.as_ref().and_then(|s| s.priority_class_name.as_deref()) == Some("system-node-critical");
    node_critical_class && kubelet_core::types::is_critical_pod(pod)
}

/// Where the kubelet keeps `Localhost` seccomp profiles when nobody says (`<root-dir>/seccomp`).
pub const DEFAULT_SECCOMP_DIR: &str = "/var/lib/kubelet/seccomp";

/// The CRI profile of a container's `seccompProfile`; a `Localhost` one is a file under
/// `profiles` (`<root-dir>/seccomp`, upstream's `seccompProfileRoot`), named by a relative path
/// that stays there.
fn seccomp(
    profile: Option<&k8s_openapi::api::core::v1::SeccompProfile>,
    profiles: &Path,
) -> Result<Option<pb::SecurityProfile>, String> {
    let Some(profile) = profile else { return Ok(None) };
    let (kind, local) = match profile.type_.as_str() {
        "RuntimeDefault" => (pb::security_profile::ProfileType::RuntimeDefault, String::new()),
        "Localhost" => {
            let relative = profile.localhost_profile.as_deref().filter(|p| !p.is_empty());
            let relative = relative.ok_or("localhostProfile must be set if seccompProfile type is Localhost.")?;
            let inside = Path::new(relative)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir));
            if !inside {
                return Err(format!("localhostProfile {relative:?} must be a relative path without '..'"));
            }
            (pb::security_profile::ProfileType::Localhost, profiles.join(relative).display().to_string())
        }
        _ => (pb::security_profile::ProfileType::Unconfined, String::new()),
    };
    Ok(Some(pb::SecurityProfile { profile_type: kind as i32, localhost_ref: local }))
}

/// What a container's `/proc` and `/sys` hide: each path is covered (a file by `/dev/null`, a
/// directory by an empty read-only tmpfs). Upstream's defaults for the `Default` proc mount
/// (`securitycontext.ConvertToRuntimeMaskedPaths`), with `/sys/devices/virtual/powercap`, which
/// upstream masks since v1.31 (its energy counters leak what other processes compute).
///
/// The kubelet must send them: containerd masks nothing the request does not name.
pub const MASKED_PATHS: [&str; 10] = [
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// What a container's `/proc` shows read-only (upstream's defaults for the `Default` proc
/// mount, `securitycontext.ConvertToRuntimeReadonlyPaths`): with `/proc/sys` writable, a
/// container's root could set the host's `kernel.core_pattern`, a program the host runs as root.
///
/// The kubelet must send them: containerd makes nothing read-only the request does not name.
pub const READONLY_PATHS: [&str; 6] =
    ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// The masked and read-only paths of a container's `procMount`, as the CRI request carries them:
/// none for `Unmasked`, the defaults otherwise. A privileged container gets the defaults too, as
/// upstream sends them; the runtime drops them for it.
pub fn proc_paths(proc_mount: Option<&str>) -> (Vec<String>, Vec<String>) {
    if proc_mount == Some("Unmasked") {
        return (Vec::new(), Vec::new());
    }
    let owned = |paths: &[&str]| paths.iter().map(|path| (*path).to_owned()).collect();
    (owned(&MASKED_PATHS), owned(&READONLY_PATHS))
}

/// The user an image runs as, from `ImageStatus`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageUser {
    /// Numeric UID, when the image names one.
    pub uid: Option<i64>,
    /// User name, when the image names one.
    pub username: String,
}

/// The container's security context; `runAsNonRoot` is checked against the effective user.
pub fn security_context(
    pod: &Pod,
    container: &Container,
    image_user: &ImageUser,
    seccomp_profiles: &Path,
) -> Result<pb::LinuxContainerSecurityContext, String> {
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = container.security_context.as_ref();
    let run_as_user = sc.and_then(|s| s.run_as_user).or_else(|| pod_sc.and_then(|s| s.run_as_user));
    let run_as_group = sc.and_then(|s| s.run_as_group).or_else(|| pod_sc.and_then(|s| s.run_as_group));
    let non_root =
        sc.and_then(|s| s.run_as_non_root).or_else(|| pod_sc.and_then(|s| s.run_as_non_root)).unwrap_or(false);
    if non_root {
        match run_as_user.or(image_user.uid) {
            Some(0) => return Err("container has runAsNonRoot and image will run as root".to_owned()),
            Some(_) => {}
            None if image_user.username.is_empty() || image_user.username == "root" => {
                return Err("container has runAsNonRoot and image will run as root".to_owned());
            }
            None => {
                return Err(format!(
                    "container has runAsNonRoot and image has non-numeric user ({}), cannot verify user is non-root",
                    image_user.username
                ));
            }
        }
    }
    let spec = pod.spec.as_ref();
    let (masked_paths, readonly_paths) = proc_paths(sc.and_then(|s| s.proc_mount.as_deref()));
    let capabilities = sc.and_then(|s| s.capabilities.as_ref()).map(|c| pb::Capability {
        add_capabilities: c.add.clone().unwrap_or_default(),
        drop_capabilities: c.drop.clone().unwrap_or_default(),
        ..pb::Capability::default()
    });
    let apparmor = kubelet_core::apparmor::profile(pod, &container.name, sc);
    // Reason: containerd 1.6 reads only the deprecated name; newer runtimes read `apparmor`.
    #[allow(deprecated)]
    Ok(pb::LinuxContainerSecurityContext {
        apparmor_profile: apparmor.as_ref().map(kubelet_core::apparmor::Profile::deprecated_name).unwrap_or_default(),
        apparmor: apparmor.map(security_profile),
        // The container's own, else the pod's (upstream `determineEffectiveSecurityContext`).
        selinux_options: sc
            .and_then(|s| s.se_linux_options.as_ref())
            .or_else(|| pod_sc.and_then(|s| s.se_linux_options.as_ref()))
            .map(selinux_option),
        capabilities,
        privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
        namespace_options: Some(crate::sandbox::namespace_options(spec)),
        run_as_user: run_as_user.map(|value| pb::Int64Value { value }),
        run_as_group: run_as_group.map(|value| pb::Int64Value { value }),
        readonly_rootfs: sc.and_then(|s| s.read_only_root_filesystem).unwrap_or(false),
        supplemental_groups: supplemental_groups(pod_sc),
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        seccomp: seccomp(
            sc.and_then(|s| s.seccomp_profile.as_ref()).or_else(|| pod_sc.and_then(|s| s.seccomp_profile.as_ref())),
            seccomp_profiles,
        )?,
        masked_paths,
        readonly_paths,
        ..pb::LinuxContainerSecurityContext::default()
    })
}

/// SELinux options as the CRI names them.
pub(crate) fn selinux_option(options: &k8s_openapi::api::core::v1::SELinuxOptions) -> pb::SeLinuxOption {
    pb::SeLinuxOption {
        user: options.user.clone().unwrap_or_default(),
        role: options.role.clone().unwrap_or_default(),
        r#type: options.type_.clone().unwrap_or_default(),
        level: options.level.clone().unwrap_or_default(),
    }
}

/// An AppArmor profile as the CRI names it (upstream `getAppArmorProfile`).
fn security_profile(profile: kubelet_core::apparmor::Profile) -> pb::SecurityProfile {
    use kubelet_core::apparmor::Profile;
    use pb::security_profile::ProfileType;
    let (profile_type, localhost_ref) = match profile {
        Profile::RuntimeDefault => (ProfileType::RuntimeDefault, String::new()),
        Profile::Localhost(name) => (ProfileType::Localhost, name),
        Profile::Unconfined => (ProfileType::Unconfined, String::new()),
    };
    pb::SecurityProfile { profile_type: profile_type.into(), localhost_ref }
}

/// A container's supplemental groups as upstream's `determineEffectiveSecurityContext` lists
/// them: the pod's `fsGroup` first, then its `supplementalGroups` in order (no volume adds a
/// group here: upstream's come from persistent volumes' `pv.beta.kubernetes.io/gid`).
pub(crate) fn supplemental_groups(pod_sc: Option<&k8s_openapi::api::core::v1::PodSecurityContext>) -> Vec<i64> {
    let fs_group = pod_sc.and_then(|s| s.fs_group);
    let listed = pod_sc.and_then(|s| s.supplemental_groups.as_ref()).into_iter().flatten().copied();
    fs_group.into_iter().chain(listed).collect()
}

/// The host paths prepared for a container's `subPath` mounts (bind mounts made by
/// `kubelet_volumes::subpath::prepare`), by the mount's index in its `volumeMounts`.
pub type SubPathMounts = BTreeMap<usize, PathBuf>;

/// The `subPath` a volume mount asks for: its `subPathExpr` expanded with the container's
/// environment `env` (upstream's `ExpandContainerVolumeMounts`), where a variable that is
/// missing or empty is an error naming each, else its `subPath`; `None` for neither.
pub fn sub_path_of(
    mount: &k8s_openapi::api::core::v1::VolumeMount,
    env: &[(String, String)],
) -> Result<Option<String>, String> {
    let Some(expression) = mount.sub_path_expr.as_deref().filter(|s| !s.is_empty()) else {
        return Ok(mount.sub_path.clone().filter(|s| !s.is_empty()));
    };
    // The last definition of a name wins, as upstream's map of the variables keeps it.
    let values: std::collections::HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let missing = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let expanded = expand(expression, &|name| match values.get(name) {
        Some(value) if !value.is_empty() => Some((*value).to_owned()),
        _ => {
            missing.borrow_mut().insert(name.to_owned());
            Some(String::new())
        }
    });
    let missing = missing.into_inner();
    if !missing.is_empty() {
        return Err(format!("missing value for {}", missing.into_iter().collect::<Vec<_>>().join(", ")));
    }
    Ok(Some(expanded))
}

/// The container's mounts from its `volumeMounts` and the pod's volumes' host paths (upstream
/// `makeMounts`); an error (a volume that is not set up, a `subPath` not prepared, a bad
/// propagation) is a `CreateContainerConfigError` message.
///
/// A volume the agent writes is mounted read-only whatever the mount says; a `subPath` mount
/// takes the host path prepared for it, never the volume's path joined with the `subPath`.
pub fn mounts(
    container: &Container,
    volumes: &PodVolumes,
    sub_paths: &SubPathMounts,
) -> Result<Vec<pb::Mount>, String> {
    let privileged = container.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false);
    let mut mounts = Vec::new();
    for (index, mount) in container.volume_mounts.iter().flatten().enumerate() {
        let volume = volumes.get(&mount.name).ok_or_else(|| {
            format!("cannot find volume {:?} to mount into container {:?}", mount.name, container.name)
        })?;
        let has_sub_path = [&mount.sub_path, &mount.sub_path_expr].into_iter().flatten().any(|s| !s.is_empty());
        let host_path = if has_sub_path {
            sub_paths
                .get(&index)
                .cloned()
                .ok_or_else(|| format!("the subPath of volumeMount {:?} has not been prepared", mount.name))?
        } else {
            volume.to_owned()
        };
        let propagation = match mount.mount_propagation.as_deref().unwrap_or("None") {
            "None" => pb::MountPropagation::PropagationPrivate,
            "HostToContainer" => pb::MountPropagation::PropagationHostToContainer,
            "Bidirectional" if privileged => pb::MountPropagation::PropagationBidirectional,
            "Bidirectional" => {
                return Err(format!(
                    "volume mount {:?}: Bidirectional propagation needs a privileged container",
                    mount.name
                ));
            }
            other => return Err(format!("volume mount {:?}: unknown mountPropagation {other:?}", mount.name)),
        };
        mounts.push(pb::Mount {
            container_path: mount.mount_path.clone(),
            host_path: host_path.display().to_string(),
            readonly: mount.read_only.unwrap_or(false) || volumes.is_read_only(&mount.name),
            selinux_relabel: volumes.relabels(&mount.name),
            propagation: propagation as i32,
            ..pb::Mount::default()
        });
    }
    Ok(mounts)
}

/// Everything a container config is made from.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ConfigInput<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The container.
    pub container: &'a Container,
    /// This instance's restart count (also its attempt and log file number).
    pub restart_count: u32,
    /// The image reference to run (what the pull resolved).
    pub image_ref: &'a str,
    /// The image's user.
    pub image_user: &'a ImageUser,
    /// The container's environment ([`environment`]).
    pub env: &'a [(String, String)],
    /// The node's memory capacity in bytes, for the OOM score of Burstable pods.
    pub memory_capacity: i64,
    /// The huge page sizes (bytes) the kernel offers, each limited for the container.
    pub hugepage_sizes: &'a [u64],
    /// The host paths of the pod's volumes, for the container's `volumeMounts`.
    pub volumes: &'a PodVolumes,
    /// The host paths prepared for the container's `subPath` mounts.
    pub sub_paths: &'a SubPathMounts,
    /// Where `Localhost` seccomp profiles live (`<root-dir>/seccomp`).
    pub seccomp_profiles: &'a Path,
    /// The runtime ID of the running container whose process namespace an ephemeral container
    /// joins (its `targetContainerName`).
    pub pid_target: Option<&'a str>,
}

/// The container config; an error is a `CreateContainerConfigError` message.
pub fn container_config(input: &ConfigInput<'_>) -> Result<pb::ContainerConfig, String> {
    let ConfigInput { pod, container, restart_count, .. } = *input;
    let env = input.env;
    let mounts = mounts(container, input.volumes, input.sub_paths)?;
    let defined = env::lookup_of(env);
    let lookup = |name: &str| defined.get(name).map(|v| (*v).to_owned());
    let expand_all = |list: &Option<Vec<String>>| list.iter().flatten().map(|s| expand(s, &lookup)).collect::<Vec<_>>();
    Ok(pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata { name: container.name.clone(), attempt: restart_count }),
        image: Some(pb::ImageSpec {
            image: input.image_ref.to_owned(),
            user_specified_image: container.image.clone().unwrap_or_default(),
            ..pb::ImageSpec::default()
        }),
        command: expand_all(&container.command),
        args: expand_all(&container.args),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: env.iter().map(|(key, value)| pb::KeyValue { key: key.clone(), value: value.clone() }).collect(),
        labels: labels::container_labels(pod, container),
        annotations: labels::container_annotations(pod, container, restart_count, crate::actions::hash(container)),
        log_path: format!("{}/{restart_count}.log", container.name),
        mounts,
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(pb::LinuxContainerConfig {
            resources: Some(linux_resources(pod, container, input.memory_capacity, input.hugepage_sizes)),
            security_context: Some(targeting(
                security_context(pod, container, input.image_user, input.seccomp_profiles)?,
                input.pid_target,
            )),
        }),
        ..pb::ContainerConfig::default()
    })
}

/// `context` with its process namespace that of container `target` when one is given and the
/// container would have a process namespace of its own (upstream `generateLinuxContainerConfig`:
/// a pod sharing its process namespace, or the node's, keeps it).
fn targeting(
    mut context: pb::LinuxContainerSecurityContext,
    target: Option<&str>,
) -> pb::LinuxContainerSecurityContext {
    let Some(target) = target else { return context };
    if let Some(namespaces) = context.namespace_options.as_mut()
        && namespaces.pid == pb::NamespaceMode::Container as i32
    {
        namespaces.pid = pb::NamespaceMode::Target as i32;
        namespaces.target_id = target.to_owned();
    }
    context
}

mod env;
#[cfg(test)]
mod tests;

pub use env::{EnvObjects, Environment, environment, service_environment};
