//! `kubelet-rs run`'s flags and configuration file, resolved as upstream does: a flag given on
//! the command line wins over the `--config` file, which wins over the defaults.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use clap::{Args, ValueEnum};
use config::KubeletConfiguration;

/// Flags of `run`, with upstream's names. Unset flags fall back to the file, then the defaults.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// A `KubeletConfiguration` (kubelet.config.k8s.io/v1beta1) YAML file.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// The CRI endpoint of the container runtime [file: containerRuntimeEndpoint].
    #[arg(long)]
    container_runtime_endpoint: Option<String>,
    /// Static pod manifests: a directory or one file [file: staticPodPath].
    #[arg(long)]
    pod_manifest_path: Option<PathBuf>,
    /// The kubelet's state directory; the local API socket lives here.
    #[arg(long, default_value = "/var/lib/kubelet")]
    root_dir: PathBuf,
    /// The node's name (defaults to the host name).
    #[arg(long)]
    hostname_override: Option<String>,
    /// The node's IP.
    #[arg(long, default_value = "")]
    node_ip: String,
    /// Where pod log directories go [file: podLogsDir].
    #[arg(long)]
    pod_logs_dir: Option<PathBuf>,
    /// Where the legacy container log links go.
    #[arg(long, default_value = "/var/log/containers")]
    container_logs_dir: PathBuf,
    /// The cgroup under which the pods' `kubepods` hierarchy goes [file: cgroupRoot].
    #[arg(long)]
    cgroup_root: Option<String>,
    /// The address of the read-only API [file: address].
    #[arg(long)]
    address: Option<IpAddr>,
    /// The port of the read-only API (`/healthz`, `/pods`, `/runningpods/`, `/metrics`); 0 disables it [file: readOnlyPort].
    #[arg(long)]
    read_only_port: Option<u16>,
    /// The address of the healthz endpoint [file: healthzBindAddress].
    #[arg(long)]
    healthz_bind_address: Option<IpAddr>,
    /// The port of the healthz endpoint; 0 disables it [file: healthzPort].
    #[arg(long)]
    healthz_port: Option<u16>,
    /// Log verbosity, as klog's `-v`: 0-1 info, 2-4 debug, 5 and up trace. `RUST_LOG` wins when set.
    #[arg(long = "v", default_value_t = 0)]
    pub(crate) verbosity: u8,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) logging_format: LogFormat,
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
    pub(crate) container_logs_dir: PathBuf,
    /// The cgroup parent of pod cgroups: `<cgroupRoot>/kubepods`.
    pub(crate) pods_cgroup: String,
    pub(crate) read_only: Option<std::net::SocketAddr>,
    pub(crate) healthz: Option<std::net::SocketAddr>,
}

/// A configuration file that cannot be used: the process exits with code 2, as upstream's.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub(crate) struct ConfigFileError {
    path: PathBuf,
    message: String,
}

impl Settings {
    /// The file (if any) with the flags applied over it.
    pub(crate) fn resolve(args: RunArgs, host_name: impl FnOnce() -> String) -> Result<Self, ConfigFileError> {
        let mut file = match &args.config {
            None => KubeletConfiguration::default(),
            Some(path) => {
                let error = |message: String| ConfigFileError { path: path.clone(), message };
                let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
                KubeletConfiguration::from_yaml(&text).map_err(|e| error(e.to_string()))?
            }
        };
        if let Some(endpoint) = args.container_runtime_endpoint {
            file.container_runtime_endpoint = endpoint;
        }
        if let Some(path) = args.pod_manifest_path {
            file.static_pod_path = Some(path);
        }
        if let Some(dir) = args.pod_logs_dir {
            file.pod_logs_dir = dir;
        }
        if let Some(root) = args.cgroup_root {
            file.cgroup_root = root;
        }
        if let Some(address) = args.address {
            file.address = address;
        }
        if let Some(port) = args.read_only_port {
            file.read_only_port = port;
        }
        if let Some(address) = args.healthz_bind_address {
            file.healthz_bind_address = address;
        }
        if let Some(port) = args.healthz_port {
            file.healthz_port = port;
        }
        let socket = |ip, port: u16| (port != 0).then(|| std::net::SocketAddr::new(ip, port));
        Ok(Settings {
            read_only: socket(file.address, file.read_only_port),
            healthz: socket(file.healthz_bind_address, file.healthz_port),
            pods_cgroup: format!("{}/kubepods", file.cgroup_root.trim_end_matches('/')),
            file,
            root_dir: args.root_dir,
            node_name: args.hostname_override.map(|h| h.to_lowercase()).unwrap_or_else(host_name),
            node_ip: args.node_ip,
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
        let cli = Cli::try_parse_from(std::iter::once("kubelet-rs").chain(argv.iter().copied())).unwrap();
        Settings::resolve(cli.args, || "host".to_owned())
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
}
