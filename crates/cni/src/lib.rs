//! A CNI invoker for kubelet-rs and other node agents: libcni in Rust.
//!
//! It loads network configurations ([`config::load_dir`], [`NetworkList`]), runs CNI plugins
//! for ADD, DEL, CHECK, STATUS and GC ([`Cni`]), converts results between spec versions 0.1.0
//! to 1.1.0 ([`AddResult`]), and keeps libcni's on-disk result cache ([`Cache`]) so DEL and
//! CHECK work after a restart. Plugins run through the [`Exec`] trait: [`RawExec`] forks and
//! execs them with a clean environment and a timeout; tests substitute their own.
//!
//! For a node agent whose runtime does not network pods itself, [`CniNetworkPlugin`] is
//! `kubelet-core`'s [`NetworkPlugin`](kubelet_core::network::NetworkPlugin) over these plugins:
//! wrap the runtime in [`Networked`](kubelet_core::network::Networked) with it, and each pod gets
//! a network namespace ([`netns`]) and an address before its containers start.
//!
//! ```no_run
//! use kubelet_cni::{Cni, RuntimeConf, config};
//!
//! # async fn example() -> Result<(), kubelet_cni::Error> {
//! let dir = config::load_dir("/etc/cni/net.d".as_ref())?;
//! let network = dir.default_network()?;
//! let cni = Cni::new(vec!["/usr/lib/cni".into(), "/opt/cni/bin".into()]);
//! let rt = RuntimeConf::new("sandbox-1", "/var/run/netns/sandbox-1", "eth0")
//!     .with_capability("portMappings", serde_json::json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]));
//! let result = cni.add_network_list(network, &rt).await?;
//! println!("pod IP: {}", result.ips[0].address);
//! cni.del_network_list(network, &rt).await?;
//! # Ok(())
//! # }
//! ```

mod api;
pub mod cache;
pub mod config;
mod error;
mod exec;
pub mod netns;
pub mod pod_network;
pub mod result;
#[cfg(feature = "test-util")]
pub mod testing;
mod version;

pub use api::{Cni, DEFAULT_TIMEOUT, GcAttachment, RuntimeConf};
pub use cache::{Cache, CacheEntry};
pub use config::{ConfDir, NetworkList, PluginConf};
pub use error::{ConfigError, Error, PluginError};

/// Results of CNI operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
pub use exec::{Command, DEFAULT_PATH, Exec, Exit, Invocation, Output, RawExec};
pub use pod_network::{CniNetworkPlugin, PodNetworkError};
pub use result::AddResult;
pub use version::{ParseVersionError, Version, VersionInfo};

#[cfg(test)]
mod tests;
