//! The container's environment (upstream `makeEnvironmentVariables`): the keys of its `envFrom`
//! config maps and secrets first, then its `env` in order, each value's `$(VAR)` references
//! expanded against what is defined before it and the service variables, and each `valueFrom`
//! read from the pod's fields, the container's resources, or a config map's or secret's key;
//! last, the service variables ([`service_environment`]) it does not define itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Container, Pod, Service};
use kubelet_core::volume::ObjectData;

use super::{Downward, expand};

/// The config maps and secrets a container's environment names, as read for it by name: `None`
/// for one that does not exist. A name that is not here could not be read at all: the agent has
/// no API server (a static pod in standalone mode).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct EnvObjects {
    /// Config maps' `data` (their text keys; `binaryData` is not for environment variables).
    pub config_maps: BTreeMap<String, Option<BTreeMap<String, String>>>,
    /// Secrets' `data`.
    pub secrets: BTreeMap<String, Option<ObjectData>>,
    /// The services of the pod's namespace and `kubernetes` of `default` (none without an API
    /// server).
    pub services: Vec<Service>,
}

impl EnvObjects {
    /// The names of the config maps and of the secrets `container`'s `envFrom` and `env` refer to.
    pub fn references(container: &Container) -> (BTreeSet<String>, BTreeSet<String>) {
        let (mut config_maps, mut secrets) = (BTreeSet::new(), BTreeSet::new());
        for from in container.env_from.iter().flatten() {
            config_maps.extend(from.config_map_ref.as_ref().map(|r| r.name.clone()));
            secrets.extend(from.secret_ref.as_ref().map(|r| r.name.clone()));
        }
        for source in container.env.iter().flatten().filter_map(|v| v.value_from.as_ref()) {
            config_maps.extend(source.config_map_key_ref.as_ref().map(|r| r.name.clone()));
            secrets.extend(source.secret_key_ref.as_ref().map(|r| r.name.clone()));
        }
        (config_maps, secrets)
    }
}

/// A container's environment, and what upstream warns about on the way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Environment {
    /// The variables, in order.
    pub vars: Vec<(String, String)>,
    /// One message per `envFrom` object with keys that are no valid variable names, which were
    /// skipped (upstream's `InvalidEnvironmentVariableNames` Warning event).
    pub invalid_names: Vec<String>,
}

impl Environment {
    /// Sets `name`, replacing an earlier value (a later definition wins, as in upstream's map).
    fn set(&mut self, name: String, value: String) {
        self.vars.retain(|(k, _)| *k != name);
        self.vars.push((name, value));
    }

    fn lookup(&self, name: &str) -> Option<String> {
        self.vars.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }
}

/// The container's environment; an error names what cannot be resolved (a
/// `CreateContainerConfigError`), in upstream's words.
pub fn environment(
    pod: &Pod,
    container: &Container,
    downward: &Downward<'_>,
    objects: &EnvObjects,
) -> Result<Environment, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
    let services = service_environment(&objects.services, namespace, links);
    let mut env = Environment::default();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        let (kind, name, data) = if let Some(reference) = &from.config_map_ref {
            let read = objects
                .config_maps
                .get(&reference.name)
                .ok_or_else(|| no_client("configMap", namespace, &reference.name))?;
            match read {
                Some(data) => ("configMap", &reference.name, data.clone()),
                None if reference.optional == Some(true) => continue,
                None => return Err(format!("configmap \"{}\" not found", reference.name)),
            }
        } else if let Some(reference) = &from.secret_ref {
            let read =
                objects.secrets.get(&reference.name).ok_or_else(|| no_client("secret", namespace, &reference.name))?;
            match read {
                Some(data) => {
                    let text = data.iter().map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned())).collect();
                    ("secret", &reference.name, text)
                }
                None if reference.optional == Some(true) => continue,
                None => return Err(format!("secret \"{}\" not found", reference.name)),
            }
        } else {
            continue;
        };
        let mut invalid = Vec::new();
        for (key, value) in data {
            let key = format!("{prefix}{key}");
            if is_env_var_name(&key) {
                env.set(key, value);
            } else {
                invalid.push(key);
            }
        }
        if !invalid.is_empty() {
            invalid.sort();
            env.invalid_names.push(format!(
                "Keys [{}] from the EnvFrom {kind} {namespace}/{name} were skipped since they are considered invalid environment variable names.",
                invalid.join(", ")
            ));
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) if !value.is_empty() => {
                expand(value, &|name| env.lookup(name).or_else(|| services.get(name).cloned()))
            }
            (_, Some(source)) => {
                if let Some(field) = &source.field_ref {
                    field_ref(pod, &field.field_path, downward)?
                } else if let Some(resource) = &source.resource_field_ref {
                    let target = match resource.container_name.as_deref() {
                        Some(name) if !name.is_empty() && name != container.name => pod
                            .spec
                            .as_ref()
                            .and_then(|s| s.containers.iter().find(|c| c.name == name))
                            .ok_or_else(|| format!("resourceFieldRef names unknown container {name:?}"))?,
                        _ => container,
                    };
                    kubelet_core::resources::resource_field_value(
                        target,
                        &resource.resource,
                        resource.divisor.as_ref(),
                        downward.allocatable,
                    )?
                } else if let Some(key_ref) = &source.config_map_key_ref {
                    let name = &key_ref.name;
                    let optional = key_ref.optional == Some(true);
                    let read = objects.config_maps.get(name).ok_or_else(|| no_client("configMap", namespace, name))?;
                    match read.as_ref().map(|data| data.get(&key_ref.key)) {
                        Some(Some(value)) => value.clone(),
                        None | Some(None) if optional => continue,
                        None => return Err(format!("configmap \"{name}\" not found")),
                        Some(None) => {
                            return Err(format!("couldn't find key {} in ConfigMap {namespace}/{name}", key_ref.key));
                        }
                    }
                } else if let Some(key_ref) = &source.secret_key_ref {
                    let name = &key_ref.name;
                    let optional = key_ref.optional == Some(true);
                    let read = objects.secrets.get(name).ok_or_else(|| no_client("secret", namespace, name))?;
                    match read.as_ref().map(|data| data.get(&key_ref.key)) {
                        Some(Some(value)) => String::from_utf8_lossy(value).into_owned(),
                        None | Some(None) if optional => continue,
                        None => return Err(format!("secret \"{name}\" not found")),
                        Some(None) => {
                            return Err(format!("couldn't find key {} in Secret {namespace}/{name}", key_ref.key));
                        }
                    }
                } else {
                    return Err(format!("couldn't find a source for env var {:?}", var.name));
                }
            }
            (_, None) => String::new(),
        };
        env.set(var.name.clone(), value);
    }
    for (name, value) in services {
        if env.lookup(&name).is_none() {
            env.vars.push((name, value));
        }
    }
    Ok(env)
}

/// The name `kubernetes` of `default` goes by: the API server's own service, whose variables
/// every pod gets, `enableServiceLinks` or not (upstream's `masterServices`).
const API_SERVER_SERVICE: &str = "kubernetes";

/// The service variables of a container in `namespace` (upstream `getServiceEnvVarMap` and
/// `envvars.FromServices`): those of `kubernetes` in `default`, and with `links`
/// (`enableServiceLinks`) those of every service in `namespace`, whose own `kubernetes` wins.
/// Services without a cluster IP (headless, ExternalName) have none.
pub fn service_environment(services: &[Service], namespace: &str, links: bool) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for service in services {
        let (Some(name), Some(service_namespace)) =
            (service.metadata.name.as_deref(), service.metadata.namespace.as_deref())
        else {
            continue;
        };
        let cluster_ip = service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()).unwrap_or_default();
        if cluster_ip.is_empty() || cluster_ip == "None" {
            continue;
        }
        if service_namespace == "default" && name == API_SERVER_SERVICE {
            chosen.entry(name).or_insert(service);
        } else if service_namespace == namespace && links {
            chosen.insert(name, service);
        }
    }
    let mut vars = BTreeMap::new();
    for (name, service) in chosen {
        service_variables(name, service, &mut vars);
    }
    vars
}

/// One service's variables: `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT` (the first port), one
/// `<NAME>_SERVICE_PORT_<PORT NAME>` per named port, and Docker's link variables.
fn service_variables(name: &str, service: &Service, vars: &mut BTreeMap<String, String>) {
    let Some(spec) = &service.spec else { return };
    let (Some(ip), Some(ports)) = (spec.cluster_ip.as_deref(), spec.ports.as_deref()) else { return };
    let Some(first) = ports.first() else { return };
    let prefix = env_var_name(name);
    vars.insert(format!("{prefix}_SERVICE_HOST"), ip.to_owned());
    vars.insert(format!("{prefix}_SERVICE_PORT"), first.port.to_string());
    for port in ports {
        if let Some(port_name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            vars.insert(format!("{prefix}_SERVICE_PORT_{}", env_var_name(port_name)), port.port.to_string());
        }
    }
    for (index, port) in ports.iter().enumerate() {
        let protocol = port.protocol.as_deref().filter(|p| !p.is_empty()).unwrap_or("TCP");
        let address = format!("{}://{}", protocol.to_lowercase(), host_port(ip, port.port));
        if index == 0 {
            vars.insert(format!("{prefix}_PORT"), address.clone());
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", port.port, protocol.to_uppercase());
        vars.insert(format!("{port_prefix}_PROTO"), protocol.to_lowercase());
        vars.insert(format!("{port_prefix}_PORT"), port.port.to_string());
        vars.insert(format!("{port_prefix}_ADDR"), ip.to_owned());
        vars.insert(port_prefix, address);
    }
}

/// A service or port name as a variable name: upper case, `-` as `_`.
fn env_var_name(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

/// `ip:port`, with an IPv6 address in brackets (Go's `net.JoinHostPort`).
fn host_port(ip: &str, port: i32) -> String {
    if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") }
}

/// Upstream's error for an object it cannot read without an API server.
fn no_client(kind: &str, namespace: &str, name: &str) -> String {
    format!("couldn't get {kind} {namespace}/{name}, no kubeClient defined")
}

/// Whether `name` may name an environment variable (upstream `IsEnvVarName`): letters, digits,
/// `-`, `.` and `_`, not starting with a digit, and neither `.`, `..` nor anything starting `..`.
fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || matches!(c, '-' | '.' | '_'));
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    first_ok && rest_ok && name != "." && !name.starts_with("..")
}

fn field_ref(pod: &Pod, path: &str, downward: &Downward<'_>) -> Result<String, String> {
    let value = match path {
        "spec.nodeName" => downward.node_name.to_owned(),
        "spec.serviceAccountName" => pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.hostIP" => downward.host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => downward.host_ips.join(","),
        "status.podIP" => downward.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => downward.pod_ips.join(","),
        _ => kubelet_core::types::metadata_field(pod, path)
            .ok_or_else(|| format!("unsupported fieldRef fieldPath {path:?}"))?,
    };
    Ok(value)
}

/// The environment as a lookup for `$(VAR)` in commands and arguments.
pub(super) fn lookup_of(vars: &[(String, String)]) -> HashMap<&str, &str> {
    vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}
