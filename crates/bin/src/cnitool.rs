//! `kubelet-rs cni add|check|del|gc|status NETWORK NETNS`: cnitool, on kubelet-cni.
//!
//! Takes the same environment as `cnitool`: `NETCONFPATH` (default `/etc/cni/net.d`),
//! `CNI_PATH`, `CNI_IFNAME` (default `eth0`), `CNI_ARGS` (`K=V;K2=V2`) and `CAP_ARGS` (JSON),
//! and derives the container ID from the namespace path the same way, so either tool can
//! delete what the other added.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use sha2::{Digest, Sha512};

/// The operations, as cnitool names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Op {
    /// Attach the namespace to the network; prints the result.
    Add,
    /// Check the attachment.
    Check,
    /// Detach it.
    Del,
    /// Delete every cached attachment of the network, then GC the plugins (1.1.0).
    Gc,
    /// Ask the plugins whether they are ready (1.1.0).
    Status,
}

/// Arguments of `kubelet-rs cni`.
#[derive(Debug, Args)]
pub(crate) struct CniArgs {
    /// What to do.
    op: Op,
    /// The network name, looked up in `NETCONFPATH`.
    network: String,
    /// The network namespace path (for example /var/run/netns/NAME).
    netns: PathBuf,
    /// The result cache directory (libcni's).
    #[arg(long, default_value = cni::cache::DEFAULT_DIR)]
    cache_dir: PathBuf,
    /// How long one plugin may run.
    #[arg(long, default_value_t = 60)]
    timeout_seconds: u64,
}

/// The default configuration directory, as cnitool's.
const DEFAULT_NETCONFPATH: &str = "/etc/cni/net.d";

pub(crate) fn main(args: CniArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(run(args))
}

async fn run(args: CniArgs) -> Result<ExitCode> {
    let env = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
    let conf_dir = PathBuf::from(env("NETCONFPATH").unwrap_or_else(|| DEFAULT_NETCONFPATH.to_owned()));
    let network = match cni::config::load_dir(&conf_dir).and_then(|found| found.network(&args.network).cloned()) {
        Ok(network) => network,
        Err(e) => return report(&e),
    };
    let network = &network;
    let paths: Vec<PathBuf> =
        std::env::var_os("CNI_PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    let netns = std::path::absolute(&args.netns).with_context(|| format!("namespace path {}", args.netns.display()))?;
    let mut rt = cni::RuntimeConf::new(
        container_id(&netns.to_string_lossy()),
        netns.to_string_lossy(),
        std::env::var("CNI_IFNAME").unwrap_or_else(|_| "eth0".to_owned()),
    );
    if let Some(cni_args) = env("CNI_ARGS") {
        rt.args = parse_cni_args(&cni_args)?;
    }
    if let Some(cap_args) = env("CAP_ARGS") {
        rt.capability_args = serde_json::from_str(&cap_args).context("CAP_ARGS must be a JSON object")?;
    }
    let plugins = cni::Cni::new(paths)
        .with_cache(cni::Cache::new(&args.cache_dir))
        .with_timeout(Duration::from_secs(args.timeout_seconds));
    let outcome = match args.op {
        Op::Add => plugins.add_network_list(network, &rt).await.and_then(|result| {
            println!("{}", String::from_utf8_lossy(&result.to_vec_pretty()?));
            Ok(())
        }),
        Op::Check => plugins.check_network_list(network, &rt).await,
        Op::Del => plugins.del_network_list(network, &rt).await,
        Op::Gc => plugins.gc_network_list(network, None).await,
        Op::Status => plugins.status_network_list(network).await,
    };
    match outcome {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => report(&e),
    }
}

/// The CNI error JSON on stdout for scripts, the whole story on stderr; exit code 1.
fn report(e: &cni::Error) -> Result<ExitCode> {
    println!("{}", serde_json::to_string(&e.to_plugin_error())?);
    eprintln!("error: {e}");
    Ok(ExitCode::FAILURE)
}

/// cnitool's container ID: `cnitool-` and the first 10 bytes of the SHA-512 of the netns path.
fn container_id(netns: &str) -> String {
    let digest = Sha512::digest(netns.as_bytes());
    let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("cnitool-{hex}")
}

/// `K=V;K2=V2`, each key and value non-empty, as cnitool requires.
fn parse_cni_args(raw: &str) -> Result<Vec<(String, String)>> {
    raw.split(';')
        .map(|pair| match pair.split('=').collect::<Vec<_>>()[..] {
            [key, value] if !key.is_empty() && !value.is_empty() => Ok((key.to_owned(), value.to_owned())),
            _ => bail!("invalid CNI_ARGS pair {pair:?}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_id_matches_cnitool() {
        let id = container_id("/var/run/netns/test");
        assert!(id.starts_with("cnitool-") && id.len() == "cnitool-".len() + 20, "{id}");
        assert_eq!(id, container_id("/var/run/netns/test"));
        assert_ne!(id, container_id("/var/run/netns/other"));
        let digest = Sha512::digest(b"/var/run/netns/test");
        assert_eq!(&id[8..10], format!("{:02x}", digest[0]));
    }

    #[test]
    fn cni_args_parse_like_cnitool() {
        assert_eq!(
            parse_cni_args("IgnoreUnknown=1;K8S_POD_NAME=web").unwrap(),
            [("IgnoreUnknown".to_owned(), "1".to_owned()), ("K8S_POD_NAME".to_owned(), "web".to_owned())]
        );
        for bad in ["K", "K=", "=V", "K=V=W", "K=V;"] {
            assert!(parse_cni_args(bad).is_err(), "{bad}");
        }
    }
}
