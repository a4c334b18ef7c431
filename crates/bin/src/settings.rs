//! `kubelet-rs run`'s flags and configuration file, resolved as upstream does: a flag given on
//! the command line wins over the drop-in directory (`--config-dir`), which wins over the
//! `--config` file, which wins over the defaults.

use std::{path::PathBuf, time::Duration};

use clap::{Args, ValueEnum};
use config::KubeletConfiguration;
use serde_json::{Map, Value};

use crate::flags::Given;

/// The flags this binary declares itself; every other upstream flag is in [`crate::flags::FLAGS`].
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// A `KubeletConfiguration` (kubelet.config.k8s.io/v1beta1) YAML file.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// A directory of drop-in `KubeletConfiguration` files (`*.conf`, in lexical order) that
    /// override the `--config` file.
    #[arg(long)]
    config_dir: Option<PathBuf>,
    /// The kubelet's state directory; the local API socket lives here.
    #[arg(long, default_value = "/var/lib/kubelet")]
    root_dir: PathBuf,
    /// The node's name (defaults to the host name).
    #[arg(long)]
    hostname_override: Option<String>,
    /// The node's IP.
    #[arg(long, default_value = "")]
    node_ip: String,
    /// The cloud provider: none, or `external`, whose controller manager initializes the Node
    /// (it registers tainted `node.cloudprovider.kubernetes.io/uninitialized`); upstream's
    /// in-tree providers are not built in.
    #[arg(long, default_value = "")]
    cloud_provider: String,
    /// Where the kubelet API's self-signed certificate and key go (`kubelet.crt`, `kubelet.key`)
    /// when `tlsCertFile` and `tlsPrivateKeyFile` are not set.
    #[arg(long, default_value = "/var/lib/kubelet/pki")]
    cert_dir: PathBuf,
    /// Where pod log directories go (kubelet-rs's own flag) [file: podLogsDir].
    #[arg(long)]
    pod_logs_dir: Option<PathBuf>,
    /// Where the legacy container log links go (kubelet-rs's own flag).
    #[arg(long, default_value = "/var/log/containers")]
    container_logs_dir: PathBuf,
    /// A kubeconfig for the API server: with it the agent joins that cluster as a node
    /// (registers the Node, renews its lease, runs the pods bound to it, reports their status).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// A kubeconfig with bootstrap credentials: when the `--kubeconfig` file is missing or its
    /// client certificate has expired, the agent asks for a client certificate with them (a
    /// CertificateSigningRequest), stores it in `--cert-dir` and writes `--kubeconfig`.
    #[arg(long)]
    bootstrap_kubeconfig: Option<PathBuf>,
    /// Labels the Node registers with (`key=value,...`; repeatable).
    #[arg(long, value_name = "KEY=VALUE,...")]
    node_labels: Vec<String>,
    /// Log verbosity, as klog's `-v`: 0-1 info, 2-4 debug, 5 and up trace. `RUST_LOG` wins when set [file: logging.verbosity].
    #[arg(short = 'v', long = "v")]
    verbosity: Option<u8>,
    /// Log format [file: logging.format].
    #[arg(long, value_enum)]
    logging_format: Option<LogFormat>,
}

/// `--logging-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Everything the agent is built from, resolved.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) file: KubeletConfiguration,
    pub(crate) root_dir: PathBuf,
    pub(crate) node_name: String,
    pub(crate) node_ip: String,
    /// The second address of a dual-stack `--node-ip`.
    pub(crate) secondary_node_ip: Option<std::net::IpAddr>,
    /// `--cloud-provider=external`.
    pub(crate) external_cloud_provider: bool,
    /// Whether `--node-ip` named the node's IP (not `0.0.0.0` or `::`, which ask for it to be
    /// found).
    pub(crate) node_ip_given: bool,
    pub(crate) container_logs_dir: PathBuf,
    /// The cgroup parent of pod cgroups: `<cgroupRoot>/kubepods`.
    pub(crate) pods_cgroup: String,
    pub(crate) read_only: Option<std::net::SocketAddr>,
    /// The kubelet API's address: `address:port` unless `enableServer` is false or `port` 0.
    pub(crate) kubelet_api: Option<std::net::SocketAddr>,
    /// `--cert-dir`.
    pub(crate) cert_dir: PathBuf,
    pub(crate) healthz: Option<std::net::SocketAddr>,
    pub(crate) verbosity: u8,
    pub(crate) log_format: LogFormat,
    /// `--kubeconfig`: cluster mode.
    pub(crate) kubeconfig: Option<PathBuf>,
    /// `--bootstrap-kubeconfig`: TLS bootstrap of `kubeconfig`.
    pub(crate) bootstrap_kubeconfig: Option<PathBuf>,
    /// `--node-labels`.
    pub(crate) node_labels: std::collections::BTreeMap<String, String>,
    /// What was set without effect: configuration fields (by file or flag) and flags, for the
    /// start-up warning.
    pub(crate) without_effect: Vec<String>,
}

/// A configuration that cannot be used: the process exits with code 2, as upstream's.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {message}")]
pub(crate) struct ConfigFileError {
    /// The file, or the flag, at fault.
    origin: String,
    message: String,
}

/// Merges `layer` into `base` as upstream merges drop-ins: objects key by key, anything else
/// replaced.
fn deep_merge(base: &mut Map<String, Value>, layer: Map<String, Value>) {
    for (key, value) in layer {
        match (base.get_mut(&key), value) {
            (Some(Value::Object(old)), Value::Object(new)) => deep_merge(old, new),
            (_, value) => _ = base.insert(key, value),
        }
    }
}

/// A configuration file's text, checked on its own (so its errors carry its lines), as fields.
fn read_layer(path: &std::path::Path) -> Result<Map<String, Value>, ConfigFileError> {
    let error = |message: String| ConfigFileError { origin: path.display().to_string(), message };
    let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
    KubeletConfiguration::from_yaml(&text).map_err(|e| error(e.to_string()))?;
    serde_saphyr::from_str(&text).map_err(|e| error(e.to_string()))
}

impl Settings {
    /// The file (if any), the drop-ins over it, and the flags over both.
    pub(crate) fn resolve(
        args: RunArgs,
        given: Given,
        host_name: impl FnOnce() -> String,
    ) -> Result<Self, ConfigFileError> {
        let mut fields = match &args.config {
            Some(path) => read_layer(path)?,
            None => Map::from_iter([
                ("apiVersion".to_owned(), Value::from(config::configuration::API_VERSION)),
                ("kind".to_owned(), Value::from(config::configuration::KIND)),
            ]),
        };
        let mut layered = false;
        if let Some(dir) = &args.config_dir {
            let error = |message: String| ConfigFileError { origin: dir.display().to_string(), message };
            let mut drop_ins: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| error(e.to_string()))?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "conf"))
                .collect();
            drop_ins.sort();
            for path in drop_ins {
                deep_merge(&mut fields, read_layer(&path)?);
                layered = true;
            }
        }
        if !given.fields.is_empty() {
            deep_merge(&mut fields, given.fields);
            layered = true;
        }
        // Every layer was valid alone: what fails now is a flag's value, or a drop-in's
        // combination with the file.
        let text = serde_json::to_string(&Value::Object(fields)).unwrap_or_default();
        let mut file = KubeletConfiguration::from_yaml(&text).map_err(|e| {
            let field = e.field.clone().unwrap_or_default();
            let flag = given.flag_of.iter().rev().find(|(f, _)| *f == field).map(|(_, flag)| flag.clone());
            let origin = match (flag, layered) {
                (Some(flag), _) => flag,
                (None, true) => "the configuration with its drop-ins".to_owned(),
                (None, false) => "the configuration".to_owned(),
            };
            ConfigFileError { origin, message: e.to_string() }
        })?;
        if let Some(dir) = args.pod_logs_dir {
            file.pod_logs_dir = dir;
        }
        let socket = |ip, port: u16| (port != 0).then(|| std::net::SocketAddr::new(ip, port));
        let log_format = match args.logging_format {
            Some(format) => format,
            None if file.logging_format.as_deref() == Some("json") => LogFormat::Json,
            None => LogFormat::Text,
        };
        let mut node_labels = std::collections::BTreeMap::new();
        for item in args.node_labels.iter().flat_map(|v| v.split(',')).map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = item.split_once('=').ok_or_else(|| ConfigFileError {
                origin: "--node-labels".to_owned(),
                message: format!("{item:?} is not key=value"),
            })?;
            node_labels.insert(key.trim().to_owned(), value.trim().to_owned());
        }
        kubelet_cluster::labels::check_node_labels(&node_labels)
            .map_err(|message| ConfigFileError { origin: "--node-labels".to_owned(), message })?;
        let mut without_effect = std::mem::take(&mut file.without_effect);
        without_effect.extend(given.missing);
        let node_name = args.hostname_override.map(|h| h.to_lowercase()).unwrap_or_else(host_name);
        let external_cloud_provider = match args.cloud_provider.as_str() {
            "" => false,
            "external" => true,
            other => {
                let message = format!(
                    "cloud provider {other:?} is not built in: leave it unset, or run the cloud's controller manager \
                     with --cloud-provider=external"
                );
                return Err(ConfigFileError { origin: "--cloud-provider".to_owned(), message });
            }
        };
        let node_ips = crate::node_ip::parse_node_ips(&args.node_ip).map_err(|reason| ConfigFileError {
            origin: "--node-ip".to_owned(),
            message: format!("bad --node-ip {:?}: {reason}", args.node_ip),
        })?;
        if args.bootstrap_kubeconfig.is_some() && args.kubeconfig.is_none() {
            let message = "needs --kubeconfig, the file the node's kubeconfig is written to".to_owned();
            return Err(ConfigFileError { origin: "--bootstrap-kubeconfig".to_owned(), message });
        }
        Ok(Settings {
            read_only: socket(file.address, file.read_only_port),
            kubelet_api: socket(file.address, file.server.port).filter(|_| file.server.enable_server),
            cert_dir: args.cert_dir,
            healthz: socket(file.healthz_bind_address, file.healthz_port),
            pods_cgroup: format!("{}/kubepods", file.cgroup_root.trim_end_matches('/')),
            verbosity: args.verbosity.or(file.verbosity).unwrap_or(0),
            log_format,
            kubeconfig: args.kubeconfig,
            bootstrap_kubeconfig: args.bootstrap_kubeconfig,
            node_labels,
            without_effect,
            file,
            root_dir: args.root_dir,
            node_ip: crate::node_ip::node_ip(&node_ips, &node_name).map(|ip| ip.to_string()).unwrap_or_default(),
            secondary_node_ip: node_ips.get(1).copied(),
            external_cloud_provider,
            node_ip_given: node_ips.first().is_some_and(|ip| !ip.is_unspecified()),
            node_name,
            container_logs_dir: args.container_logs_dir,
        })
    }

    /// How often the file source rescans, the HTTP source polls, and pods resync.
    pub(crate) fn periods(&self) -> (Duration, Duration, Duration) {
        (self.file.file_check_frequency, self.file.http_check_frequency, self.file.sync_frequency)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: RunArgs,
    }

    fn resolve(argv: &[&str]) -> Result<Settings, ConfigFileError> {
        use clap::{CommandFactory, FromArgMatches};
        let command = crate::flags::register(Cli::command());
        let matches = command.try_get_matches_from(std::iter::once("kubelet-rs").chain(argv.iter().copied())).unwrap();
        let cli = Cli::from_arg_matches(&matches).unwrap();
        Settings::resolve(cli.args, crate::flags::given(&matches).unwrap(), || "host".to_owned())
    }

    #[test]
    fn flags_win_over_the_file_which_wins_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(
            &file,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: /from/file\n\
             readOnlyPort: 10255\nhealthzPort: 10300\nsyncFrequency: 30s\ncgroupRoot: /node\n",
        )
        .unwrap();
        let config = file.to_str().unwrap();
        let settings = resolve(&["--config", config, "--read-only-port", "10266"]).unwrap();
        assert_eq!(settings.file.static_pod_path, Some(PathBuf::from("/from/file")));
        assert_eq!(settings.read_only.unwrap().port(), 10266);
        assert_eq!(settings.healthz.unwrap().port(), 10300);
        assert_eq!(settings.file.sync_frequency, Duration::from_secs(30));
        assert_eq!(settings.pods_cgroup, "/node/kubepods");

        let settings =
            resolve(&["--config", config, "--pod-manifest-path", "/from/flag", "--healthz-port", "0"]).unwrap();
        assert_eq!(settings.file.static_pod_path, Some(PathBuf::from("/from/flag")));
        assert_eq!(settings.healthz, None);

        let defaults = resolve(&[]).unwrap();
        assert_eq!(defaults.read_only, None);
        assert_eq!(defaults.healthz.unwrap().to_string(), "127.0.0.1:10248");
        assert_eq!(defaults.pods_cgroup, "/kubepods");
        assert_eq!(defaults.node_name, "host");
    }

    #[test]
    fn the_node_ip_is_the_flags_or_one_of_this_hosts_and_a_bad_one_is_refused() {
        assert_eq!(resolve(&["--node-ip", "192.0.2.50"]).unwrap().node_ip, "192.0.2.50");
        let err = resolve(&["--node-ip", "not-an-ip"]).unwrap_err();
        assert_eq!(err.origin, "--node-ip");
        assert!(err.message.contains("\"not-an-ip\""), "{}", err.message);
        let dual = resolve(&["--node-ip", "192.0.2.50,fd00::50"]).unwrap();
        assert_eq!((dual.node_ip.as_str(), dual.secondary_node_ip), ("192.0.2.50", Some("fd00::50".parse().unwrap())));
        let err = resolve(&["--node-ip", "192.0.2.50,192.0.2.51"]).unwrap_err();
        assert!(err.message.contains("dual-stack pair"), "{}", err.message);
        // Without the flag: found as upstream finds it, when this host has a route out.
        if crate::node_ip::default_route_ip().is_some() {
            let found: std::net::IpAddr = resolve(&[]).unwrap().node_ip.parse().unwrap();
            assert!(!found.is_loopback());
        }
    }

    #[test]
    fn a_bad_file_names_itself_and_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPod: 3\n")
            .unwrap();
        let e = resolve(&["--config", file.to_str().unwrap()]).unwrap_err().to_string();
        assert!(e.contains("config.yaml") && e.contains("maxPod") && e.contains("line 3"), "{e}");
        let e = resolve(&["--config", "/does/not/exist"]).unwrap_err().to_string();
        assert!(e.contains("/does/not/exist"), "{e}");
    }

    #[test]
    fn a_kubeadm_file_drop_ins_and_upstream_flags_layer_as_upstream_does() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(
            &file,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 50\nport: 10250\n\
             authentication: {anonymous: {enabled: false}}\nevictionHard: {memory.available: 100Mi}\n\
             staticPodPath: /etc/kubernetes/manifests\n",
        )
        .unwrap();
        let drop_ins = dir.path().join("conf.d");
        std::fs::create_dir(&drop_ins).unwrap();
        let header = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
        std::fs::write(
            drop_ins.join("10-pods.conf"),
            format!("{header}maxPods: 60\nevictionHard: {{nodefs.available: 10%}}\n"),
        )
        .unwrap();
        std::fs::write(drop_ins.join("20-pods.conf"), format!("{header}maxPods: 70\n")).unwrap();
        std::fs::write(drop_ins.join("ignored.yaml"), "not: [a kubelet config").unwrap();
        let (config, drop_ins) = (file.to_str().unwrap(), drop_ins.to_str().unwrap());

        let settings = resolve(&[
            "--config",
            config,
            "--config-dir",
            drop_ins,
            "--kubeconfig",
            "/etc/kubernetes/kubelet.conf",
            "--cert-dir",
            "/pki",
            "--node-labels",
            "a=1,b=2",
        ])
        .unwrap();
        assert_eq!(settings.file.max_pods, 70, "the last drop-in wins over the file");
        assert!(settings.without_effect.is_empty(), "{:?}", settings.without_effect);
        assert_eq!(settings.cert_dir, PathBuf::from("/pki"));
        assert_eq!(settings.kubelet_api, Some(std::net::SocketAddr::from(([0, 0, 0, 0], 10250))));
        assert!(!settings.file.server.authentication.anonymous_enabled);
        let hard: Vec<&String> = settings.file.eviction_hard.keys().collect();
        assert_eq!(hard, ["memory.available", "nodefs.available"], "the drop-in's map merges into the file's");
        assert_eq!(settings.kubeconfig, Some(PathBuf::from("/etc/kubernetes/kubelet.conf")));
        assert_eq!(settings.node_labels.len(), 2);
        // A node may not give itself a role the control plane trusts (upstream refuses it too).
        let e = resolve(&["--config", config, "--node-labels", "a=1,node-role.kubernetes.io/control-plane="])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "--node-labels: unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: \
                           [node-role.kubernetes.io/control-plane]"
            ),
            "{e}"
        );

        let settings =
            resolve(&["--config", config, "--config-dir", drop_ins, "--max-pods", "80", "--cluster-dns=10.96.0.10"])
                .unwrap();
        assert_eq!(settings.file.max_pods, 80, "a flag wins over every file");
        assert_eq!(settings.file.cluster_dns, [std::net::IpAddr::from([10, 96, 0, 10])]);

        let e = resolve(&["--config", config, "--cgroups-per-qos=false"]).unwrap_err().to_string();
        assert!(e.starts_with("--cgroups-per-qos: field cgroupsPerQOS"), "the flag is named: {e}");
        let e = resolve(&["--config", config, "--cluster-dns", "dns.local"]).unwrap_err().to_string();
        assert!(e.starts_with("--cluster-dns:") && e.contains("not an IP address"), "{e}");
    }
}
