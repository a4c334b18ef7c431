//! [`CniNetworkPlugin`]: pods networked through CNI by the agent, for runtimes that do not do
//! it themselves (`kubelet_core::network`).
//!
//! Each pod gets a network namespace of its own under the namespace directory, named for its
//! sandbox (`network-<pod UID>`), then ADD of the loopback plugin and of the default network
//! (the first configuration in the configuration directory), with the pod's host ports
//! (`portMappings`) and bandwidth annotations (`bandwidth`) as capability arguments and
//! upstream's `K8S_POD_*` CNI arguments.
//! DEL and CHECK use the configuration ADD used, kept in libcni's result cache, which is also
//! how the plugin knows its pods again after a restart.

use std::{
    collections::HashMap,
    io,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
};

use kubelet_core::{
    PodUid,
    k8s_openapi::api::core::v1::Pod,
    network::{NetworkPlugin, PodNetworkStatus, SANDBOX_ID_PREFIX, sandbox_id},
    resources::parse_quantity,
};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::{AddResult, Cni, ConfigError, Error, NetworkList, PluginConf, RuntimeConf, Version, config, netns};

/// Where pods' network namespaces are kept by default, beside `ip netns`'s.
pub const DEFAULT_NETNS_DIR: &str = "/run/netns";

/// The interface name of a pod's network inside its namespace.
pub const POD_INTERFACE: &str = "eth0";

/// The network name of the loopback attachment every pod gets, as containerd names it.
pub const LOOPBACK_NETWORK: &str = "cni-loopback";

/// Upstream's bandwidth annotations.
const INGRESS_BANDWIDTH: &str = "kubernetes.io/ingress-bandwidth";
const EGRESS_BANDWIDTH: &str = "kubernetes.io/egress-bandwidth";

/// What setting up, checking or tearing down a pod's network can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PodNetworkError {
    /// A CNI operation failed.
    #[error(transparent)]
    Cni(#[from] Error),
    /// The pod's network namespace could not be made or removed.
    #[error("network namespace {}", path.display())]
    Namespace {
        /// The namespace's file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The pod cannot be given a network as it is (its UID cannot name a namespace, a bandwidth
    /// annotation is out of range).
    #[error("pod {pod}: {reason}")]
    InvalidPod {
        /// The pod, `namespace/name`.
        pod: String,
        /// What is wrong.
        reason: String,
    },
}

/// One pod's attachment: its status and what DEL and CHECK need.
#[derive(Clone)]
struct Attachment {
    status: PodNetworkStatus,
    network: NetworkList,
    runtime_conf: RuntimeConf,
}

/// Pod networks made with CNI plugins (a [`NetworkPlugin`]).
pub struct CniNetworkPlugin {
    cni: Cni,
    conf_dir: PathBuf,
    netns_dir: PathBuf,
    attachments: Mutex<HashMap<PodUid, Attachment>>,
}

impl CniNetworkPlugin {
    /// A plugin running `cni`'s plugins with the default network of `conf_dir`, keeping
    /// namespaces in `netns_dir` ([`DEFAULT_NETNS_DIR`]).
    ///
    /// The pods networked before a restart are read back from `cni`'s result cache; a
    /// namespace left without an attachment (a set-up cut short) is removed.
    pub async fn open(cni: Cni, conf_dir: impl Into<PathBuf>, netns_dir: impl Into<PathBuf>) -> Result<Self, Error> {
        let plugin = CniNetworkPlugin {
            cni,
            conf_dir: conf_dir.into(),
            netns_dir: netns_dir.into(),
            attachments: Mutex::new(HashMap::new()),
        };
        plugin.recover().await?;
        Ok(plugin)
    }

    async fn recover(&self) -> Result<(), Error> {
        let mut recovered = HashMap::new();
        for entry in self.cni.cache().attachments(None).await? {
            let Some(uid) = entry.container_id.strip_prefix(SANDBOX_ID_PREFIX) else { continue };
            if entry.network_name == LOOPBACK_NETWORK || !Path::new(&entry.netns).starts_with(&self.netns_dir) {
                continue;
            }
            let network = match NetworkList::from_slice(&entry.config)
                .or_else(|_| NetworkList::from_single_slice(&entry.config))
            {
                Ok(network) => network,
                Err(error) => {
                    warn!(container = %entry.container_id, error = %error, "cached network configuration unreadable; attachment skipped");
                    continue;
                }
            };
            let arg =
                |key: &str| entry.cni_args.iter().find(|[k, _]| k == key).map(|[_, v]| v.clone()).unwrap_or_default();
            let uid = PodUid::new(uid);
            let mut status = PodNetworkStatus::new(
                uid.clone(),
                arg("K8S_POD_NAME"),
                arg("K8S_POD_NAMESPACE"),
                entry.netns.clone().into(),
            );
            if let Some(result) = entry.result.clone().and_then(|result| AddResult::from_value(result).ok()) {
                status.ips = pod_ips(&result);
            }
            recovered.insert(uid, Attachment { status, network, runtime_conf: entry.runtime_conf() });
        }
        info!(pods = recovered.len(), "pod networks recovered from the CNI result cache");
        self.remove_unattached_namespaces(&recovered);
        *self.lock() = recovered;
        Ok(())
    }

    /// Removes the namespaces of this plugin's naming that no attachment holds.
    fn remove_unattached_namespaces(&self, attached: &HashMap<PodUid, Attachment>) {
        let Ok(entries) = std::fs::read_dir(&self.netns_dir) else { return };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let Some(uid) = name.to_str().and_then(|name| name.strip_prefix(SANDBOX_ID_PREFIX)) else { continue };
            if attached.contains_key(uid) {
                continue;
            }
            match netns::remove(&entry.path()) {
                Ok(()) => info!(path = %entry.path().display(), "removed a namespace left without a network"),
                Err(error) => {
                    warn!(path = %entry.path().display(), error = %error, "could not remove a namespace left without a network")
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PodUid, Attachment>> {
        self.attachments.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The default network as the configuration directory has it now.
    fn default_network(&self) -> Result<NetworkList, Error> {
        Ok(config::load_dir(&self.conf_dir)?.default_network()?.clone())
    }

    /// The namespace path of pod `uid`'s sandbox, refusing a UID that is not one file name.
    fn namespace_path(&self, pod: &Pod, uid: &PodUid) -> Result<PathBuf, PodNetworkError> {
        // The CNI rule for container IDs: no '/', no leading '.', so one plain file name.
        if let Err(rule) = config::validate_name(uid.as_str()) {
            let reason = format!("UID {:?} cannot name a network namespace: it {rule}", uid.as_str());
            return Err(PodNetworkError::InvalidPod { pod: pod_name(pod), reason });
        }
        Ok(self.netns_dir.join(sandbox_id(uid)))
    }

    /// ADD of the loopback and the default network in the pod's namespace.
    async fn attach(&self, network: &NetworkList, runtime_conf: &RuntimeConf) -> Result<AddResult, Error> {
        self.cni.add_network_list(&loopback(), &loopback_conf(runtime_conf)).await?;
        self.cni.add_network_list(network, runtime_conf).await
    }

    /// DEL of the default network and the loopback.
    async fn detach(&self, network: &NetworkList, runtime_conf: &RuntimeConf) -> Result<(), Error> {
        self.cni.del_network_list(network, runtime_conf).await?;
        self.cni.del_network_list(&loopback(), &loopback_conf(runtime_conf)).await
    }
}

/// Refuses a pod that asks for what no plugin of `network` does: host ports without a plugin
/// taking `portMappings`, bandwidth annotations without one taking `bandwidth`. ADD would
/// succeed and the pod run without them.
fn refuse_unserved_capabilities(pod: &Pod, network: &NetworkList, conf: &RuntimeConf) -> Result<(), PodNetworkError> {
    for capability in conf.capability_args.keys() {
        let served = network.plugins.iter().any(|plugin| plugin.enabled_capabilities().any(|c| c == capability));
        if !served {
            let asked = if capability == "portMappings" { "host ports" } else { "bandwidth annotations" };
            let reason = format!(
                "the pod's {asked} need a plugin taking {capability:?}, which network {:?} has not",
                network.name
            );
            return Err(PodNetworkError::InvalidPod { pod: pod_name(pod), reason });
        }
    }
    Ok(())
}

/// The loopback network every pod's namespace gets first.
fn loopback() -> NetworkList {
    // A fixed, valid one-plugin list: building it cannot fail.
    NetworkList::single(LOOPBACK_NETWORK, Version::V1_0_0, PluginConf::new("loopback"))
        .unwrap_or_else(|error: ConfigError| unreachable!("the loopback list is valid: {error}"))
}

fn loopback_conf(pod: &RuntimeConf) -> RuntimeConf {
    let mut conf = pod.clone();
    conf.ifname = "lo".to_owned();
    conf.capability_args.clear();
    conf
}

fn pod_name(pod: &Pod) -> String {
    let meta = &pod.metadata;
    format!("{}/{}", meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
}

/// The pod's IPs from an ADD result, primary first.
fn pod_ips(result: &AddResult) -> Vec<IpAddr> {
    result.ips.iter().map(|ip| ip.address.addr()).collect()
}

/// The runtime configuration of the pod's attachment: its sandbox, namespace, upstream's CNI
/// arguments, host ports and bandwidth.
fn runtime_conf(pod: &Pod, uid: &PodUid, netns: &Path) -> Result<RuntimeConf, PodNetworkError> {
    let sandbox = sandbox_id(uid);
    let meta = &pod.metadata;
    let mut conf = RuntimeConf::new(&sandbox, netns.to_string_lossy(), POD_INTERFACE)
        .with_arg("IgnoreUnknown", "1")
        .with_arg("K8S_POD_NAMESPACE", meta.namespace.as_deref().unwrap_or_default())
        .with_arg("K8S_POD_NAME", meta.name.as_deref().unwrap_or_default())
        .with_arg("K8S_POD_INFRA_CONTAINER_ID", &sandbox)
        .with_arg("K8S_POD_UID", uid.as_str());
    let ports = port_mappings(pod);
    if !ports.is_empty() {
        conf = conf.with_capability("portMappings", Value::Array(ports));
    }
    if let Some(bandwidth) = bandwidth(pod)? {
        conf = conf.with_capability("bandwidth", bandwidth);
    }
    Ok(conf)
}

/// The `portMappings` capability: every container port with a host port, as upstream passes it.
pub fn port_mappings(pod: &Pod) -> Vec<Value> {
    let containers = pod.spec.iter().flat_map(|spec| &spec.containers);
    let ports = containers.flat_map(|container| container.ports.iter().flatten());
    ports
        .filter(|port| port.host_port.is_some_and(|host_port| host_port > 0))
        .map(|port| {
            let protocol = port.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase();
            let mut mapping =
                json!({"hostPort": port.host_port, "containerPort": port.container_port, "protocol": protocol});
            if let Some(host_ip) = port.host_ip.as_deref().filter(|ip| !ip.is_empty()) {
                mapping["hostIP"] = Value::String(host_ip.to_owned());
            }
            mapping
        })
        .collect()
}

/// The `bandwidth` capability from upstream's annotations, in bits per second, with no burst
/// limit (upstream's `math.MaxInt32`); `None` without them.
pub fn bandwidth(pod: &Pod) -> Result<Option<Value>, PodNetworkError> {
    let annotations = pod.metadata.annotations.as_ref();
    let rate = |key: &str| -> Result<Option<u64>, PodNetworkError> {
        let Some(value) = annotations.and_then(|annotations| annotations.get(key)) else { return Ok(None) };
        bits_per_second(value).map(Some).map_err(|reason| PodNetworkError::InvalidPod {
            pod: pod_name(pod),
            reason: format!("annotation {key}={value:?}: {reason}"),
        })
    };
    let (ingress, egress) = (rate(INGRESS_BANDWIDTH)?, rate(EGRESS_BANDWIDTH)?);
    if ingress.is_none() && egress.is_none() {
        return Ok(None);
    }
    let mut limits = serde_json::Map::new();
    if let Some(ingress) = ingress {
        limits.insert("ingressRate".into(), json!(ingress));
        limits.insert("ingressBurst".into(), json!(i32::MAX));
    }
    if let Some(egress) = egress {
        limits.insert("egressRate".into(), json!(egress));
        limits.insert("egressBurst".into(), json!(i32::MAX));
    }
    Ok(Some(Value::Object(limits)))
}

/// A bandwidth quantity in bits per second, within upstream's bounds (1k to 1P).
fn bits_per_second(quantity: &str) -> Result<u64, String> {
    let value = parse_quantity(quantity).ok_or_else(|| "not a quantity".to_owned())?;
    if value < 1e3 {
        return Err("resource is unreasonably small (< 1kbit)".to_owned());
    }
    if value > 1e15 {
        return Err("resource is unreasonably large (> 1Pbit)".to_owned());
    }
    // Within 1e3..=1e15, so it fits u64; a fraction of a bit per second is dropped.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(value as u64)
}

impl NetworkPlugin for CniNetworkPlugin {
    type Error = PodNetworkError;

    async fn status(&self) -> Result<(), PodNetworkError> {
        self.default_network()?;
        Ok(())
    }

    async fn set_up_pod(&self, pod: &Pod) -> Result<PodNetworkStatus, PodNetworkError> {
        let uid = PodUid::of(pod);
        let path = self.namespace_path(pod, &uid)?;
        let network = self.default_network()?;
        let conf = runtime_conf(pod, &uid, &path)?;
        refuse_unserved_capabilities(pod, &network, &conf)?;
        netns::create(&path).map_err(|source| PodNetworkError::Namespace { path: path.clone(), source })?;
        let result = match self.attach(&network, &conf).await {
            Ok(result) => result,
            Err(error) => {
                // As upstream does after a failed ADD: DEL what may be half made, then drop the sandbox.
                if let Err(cleanup) = self.detach(&network, &conf).await {
                    warn!(pod.uid = %uid, error = %cleanup, "DEL after a failed ADD failed");
                }
                let _ = netns::remove(&path);
                return Err(error.into());
            }
        };
        let meta = &pod.metadata;
        let name = meta.name.clone().unwrap_or_default();
        let mut status = PodNetworkStatus::new(uid.clone(), name, meta.namespace.clone().unwrap_or_default(), path);
        status.ips = pod_ips(&result);
        info!(pod.uid = %uid, ips = ?status.ips, network = %network.name, "pod network set up");
        self.lock().insert(uid, Attachment { status: status.clone(), network, runtime_conf: conf });
        Ok(status)
    }

    /// CHECK (0.4.0+, unless the network disables it). A failed check is reported, not
    /// repaired: DEL and ADD again would give the pod another IP under its running containers.
    async fn check_pod(&self, _pod: &Pod, network: &PodNetworkStatus) -> Result<PodNetworkStatus, PodNetworkError> {
        let Some(attachment) = self.lock().get(&network.uid).cloned() else { return Ok(network.clone()) };
        match self.cni.check_network_list(&attachment.network, &attachment.runtime_conf).await {
            Ok(()) | Err(Error::NotSupported { .. }) => Ok(attachment.status),
            Err(error) if error.is_portmap_ipv6_check_bug() => Ok(attachment.status),
            Err(error) => Err(error.into()),
        }
    }

    async fn tear_down_pod(&self, uid: &PodUid) -> Result<(), PodNetworkError> {
        let Some(attachment) = self.lock().remove(uid) else { return Ok(()) };
        if let Err(error) = self.detach(&attachment.network, &attachment.runtime_conf).await {
            // Kept, so that the pod stays listed and the teardown is tried again.
            self.lock().insert(uid.clone(), attachment);
            return Err(error.into());
        }
        let path = attachment.status.namespace_path;
        netns::remove(&path).map_err(|source| PodNetworkError::Namespace { path: path.clone(), source })?;
        info!(pod.uid = %uid, "pod network torn down");
        Ok(())
    }

    fn pod_network(&self, uid: &PodUid) -> Option<PodNetworkStatus> {
        self.lock().get(uid).map(|attachment| attachment.status.clone())
    }

    fn pod_networks(&self) -> Vec<PodNetworkStatus> {
        self.lock().values().map(|attachment| attachment.status.clone()).collect()
    }
}

#[cfg(test)]
mod tests;
