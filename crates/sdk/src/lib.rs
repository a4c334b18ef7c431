//! Build a Kubernetes node agent: the crates of kubelet-rs behind one dependency, and defaults
//! that run pods from your [`Runtime`] and a directory of manifests.
//!
//! # A node agent in four steps
//!
//! **1. A runtime.** The agent runs pods through a [`Runtime`]: it lists pods, reports their
//! status, makes a pod's containers match its spec ([`Runtime::sync_pod`]) and kills them. Bring
//! your own for processes, VMs or WASM, or take upstream's runtime manager over a CRI runtime
//! (containerd, CRI-O) with the feature `cri` ([`cri::CriRuntime`]). `examples/process_agent.rs`
//! implements one that runs each container's command as a host process.
//!
//! **Its network.** A CRI runtime networks its pods itself. One that does not gets it from the
//! agent (feature `cni`): wrapped in [`core::network::Networked`] with
//! `cni::CniNetworkPlugin`, each pod gets a network namespace, an IP and its host ports from the
//! CNI plugins before its containers start, and the runtime's `sync_pod` finds the namespace in
//! [`PodStatus::network_namespace`](core::runtime::PodStatus::network_namespace) to run them in:
//!
//! ```no_run
//! # #[cfg(feature = "cni")]
//! # async fn example<R: kubelet_sdk::Runtime>(my_runtime: R) -> Result<(), Box<dyn std::error::Error>> {
//! use kubelet_sdk::{cni, core::network::Networked};
//!
//! let plugins = cni::Cni::new(vec!["/usr/lib/cni".into(), "/opt/cni/bin".into()]);
//! let network = cni::CniNetworkPlugin::open(plugins, "/etc/cni/net.d", "/run/netns").await?;
//! let runtime = std::sync::Arc::new(Networked::new(my_runtime, network));
//! # Ok(())
//! # }
//! ```
//!
//! **2. Run it.** [`Node`] wires the rest with upstream's defaults: the generic PLEG (a relist
//! every second), the pod workers, static pods read from a directory (as `--pod-manifest-path`),
//! and the local API on a unix socket under the root directory:
//!
//! ```no_run
//! # async fn example<R: kubelet_sdk::Runtime>(runtime: std::sync::Arc<R>) -> Result<(), kubelet_sdk::Error> {
//! use kubelet_sdk::Node;
//!
//! Node::new("node-1")
//!     .root_dir("/var/lib/my-agent")
//!     .static_pods("/etc/my-agent/manifests")
//!     .run(runtime)
//!     .await
//! # }
//! ```
//!
//! **3. Look at it.** A manifest written to the directory becomes a pod; removing it stops the
//! pod. `kubelet-rs get pods --root-dir /var/lib/my-agent` (or `curl --unix-socket
//! /var/lib/my-agent/kubelet-rs.sock http://localhost/pods`) shows them as upstream's read-only
//! API does, with their statuses, container logs and events.
//!
//! **4. Replace what you need.** [`Node`] is a few lines over [`node::Agent`]; build the agent
//! yourself to choose its parts: [`defaults::pleg`] and [`defaults::pod_workers`] are what
//! [`Node`] passes to [`node::agent::Builder::build`], and any [`core::Pleg`] or
//! [`core::PodWorkers`] can take their place. The builder also takes a prober (feature
//! `prober`), a volume manager (feature `volumes`), pod cgroups and a mirror pod client; cluster
//! mode (feature `cluster`) adds the API server as a pod source and status sink.
//!
//! # Features
//!
//! | feature | what it adds |
//! | --- | --- |
//! | `server` (default) | the local API [`Node`] serves, and the kubelet API ([`server`]) |
//! | `cri` | [`cri`]: the CRI client and upstream's runtime manager over it |
//! | `cni` | [`cni`]: libcni in Rust, network configuration lists and plugin calls |
//! | `cluster` | [`cluster`]: the node's client of the API server |
//! | `prober` | [`prober`]: probes and lifecycle hooks |
//! | `volumes` | [`volumes`]: emptyDir, hostPath, configMap, secret, downwardAPI, projected |

#![cfg_attr(docsrs, feature(doc_cfg))]

use std::{path::PathBuf, sync::Arc};

use tokio_util::sync::CancellationToken;

#[cfg(feature = "cni")]
#[cfg_attr(docsrs, doc(cfg(feature = "cni")))]
/// libcni in Rust (`kubelet-cni`).
pub use cni;
/// Pod sources (`kubelet-config`): static pod files and URLs, merged for the agent.
pub use config;
#[cfg(feature = "cri")]
#[cfg_attr(docsrs, doc(cfg(feature = "cri")))]
/// The CRI client and runtime manager (`kubelet-cri-client`).
pub use cri_client as cri;
/// The kubelet (`kubelet-node`): the agent builder, pod sync, admission, status, cleanup, and the
/// local API with the feature `server`.
pub use kubelet as node;
#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
/// The node's client of the API server (`kubelet-cluster`).
pub use kubelet_cluster as cluster;
/// The vocabulary every agent shares (`kubelet-core`): the traits, pod status types, the cache,
/// queue, backoff and the sync loop.
pub use kubelet_core as core;
#[doc(inline)]
pub use kubelet_core::Runtime;
/// The generic PLEG (`kubelet-pleg`).
pub use pleg;
/// The pod workers (`kubelet-podworkers`).
pub use podworkers;
#[cfg(feature = "prober")]
#[cfg_attr(docsrs, doc(cfg(feature = "prober")))]
/// Probes and lifecycle hooks (`kubelet-prober`).
pub use prober;
#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
/// The kubelet API over HTTPS (`kubelet-server`).
pub use server;
#[cfg(feature = "volumes")]
#[cfg_attr(docsrs, doc(cfg(feature = "volumes")))]
/// Volumes (`kubelet-volumes`).
pub use volumes;

/// Why [`Node::run`] could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The local API could not be served (another agent has the root directory, or the socket
    /// cannot be made).
    #[cfg(feature = "server")]
    #[error("the local API")]
    LocalApi(#[from] kubelet::server::Error),
}

/// The parts [`Node`] chooses, to pass to [`node::agent::Builder::build`] or to replace.
pub mod defaults {
    use std::sync::Arc;

    use kubelet_core::{Cache, PodLifecycleEvent, Runtime};
    use tokio::sync::mpsc;

    /// The generic PLEG with upstream's periods (a relist every second).
    pub fn pleg<R: Runtime>(
        runtime: Arc<R>,
        cache: Arc<Cache>,
    ) -> (pleg::GenericPleg<R>, mpsc::Receiver<PodLifecycleEvent>) {
        pleg::GenericPleg::new(runtime, cache, pleg::Config::default())
    }

    /// The pod workers with upstream's backoffs.
    pub fn pod_workers<R: Runtime>(
        parts: kubelet::agent::WorkerParts<R>,
    ) -> podworkers::PodWorkers<kubelet::PodSync<R>> {
        podworkers::PodWorkers::new(parts.syncer, parts.cache, parts.work_queue, Default::default(), parts.cancel)
    }
}

/// A node agent with the defaults: static pods from a directory, the generic PLEG, the pod
/// workers, and (feature `server`) the local API on `<root-dir>/kubelet-rs.sock`.
#[derive(Debug)]
#[must_use]
pub struct Node {
    name: String,
    root_dir: PathBuf,
    static_pods: PathBuf,
    pod_logs_dir: PathBuf,
    cancel: CancellationToken,
}

impl Node {
    /// A node named `name`, with upstream's paths: root directory `/var/lib/kubelet`, static
    /// pods from `/etc/kubernetes/manifests`, container logs under `/var/log/pods`.
    pub fn new(name: impl Into<String>) -> Self {
        Node {
            name: name.into(),
            root_dir: PathBuf::from("/var/lib/kubelet"),
            static_pods: PathBuf::from("/etc/kubernetes/manifests"),
            pod_logs_dir: PathBuf::from("/var/log/pods"),
            cancel: CancellationToken::new(),
        }
    }

    /// Where the runtime writes container logs (`<namespace>_<name>_<uid>/<container>/`), which
    /// the local API's `/containerLogs` reads.
    pub fn pod_logs_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.pod_logs_dir = dir.into();
        self
    }

    /// Where the agent keeps its state (pod directories, container logs, the local API's socket).
    pub fn root_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.root_dir = dir.into();
        self
    }

    /// The directory (or file) of static pod manifests, as `--pod-manifest-path`.
    pub fn static_pods(mut self, path: impl Into<PathBuf>) -> Self {
        self.static_pods = path.into();
        self
    }

    /// Stops the agent when `cancel` fires; the pods it started keep running, as a kubelet's do.
    pub fn cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }

    /// Runs the agent on `runtime` until cancelled.
    ///
    /// # Errors
    ///
    /// When the local API cannot be served: another agent runs with the same root directory, or
    /// its socket cannot be made.
    pub async fn run<R: Runtime>(self, runtime: Arc<R>) -> Result<(), Error> {
        use kubelet_core::{Source, events::RingRecorder};

        let events = Arc::new(RingRecorder::default());
        let settings = kubelet::Config::new(&self.name).root_dir(&self.root_dir);
        let agent = kubelet::Agent::builder(runtime, kubelet::agent::Config::new(settings, [Source::File]))
            .recorder(events.clone())
            .cancel(self.cancel.clone())
            .build(defaults::pleg, defaults::pod_workers);

        let (pod_config, updates) = config::PodConfig::new(events.clone());
        let files = config::file::FileSource::new(
            config::file::Config::new(&self.static_pods, &self.name),
            pod_config.source(Source::File),
            events.clone(),
        );
        tokio::spawn(files.run(self.cancel.clone()));

        #[cfg(feature = "server")]
        {
            use kubelet::server;
            let api = Arc::new(server::ApiState::of(&agent, events, &self.pod_logs_dir));
            let socket = server::socket_path(&self.root_dir);
            server::serve_unix(&socket, server::local_router(api), self.cancel.clone()).await?;
        }
        agent.run(updates).await;
        Ok(())
    }
}
