//! A typed CRI (`runtime.v1`) client over unix sockets.
//!
//! [`Client`] connects lazily to a runtime's `RuntimeService` and `ImageService` (for example
//! containerd's CRI plugin) from an upstream-style endpoint such as
//! `unix:///run/containerd/containerd.sock`, applies the per-call timeout
//! (`runtimeRequestTimeout`, default 2 min) and the 16 MiB message limit, and turns gRPC
//! statuses into [`Error`]s that can be classified without string matching.
//! The protocol's types are generated ahead of time from the CRI of Kubernetes 1.32 and shipped
//! in [`pb`], so building the crate needs no `protoc`.
//!
//! [`CriRuntime`] is upstream's runtime manager (`kuberuntime`) on top of it; given a
//! `kubelet_core::HookRunner` ([`CriRuntime::hooks`]) it runs containers' postStart and preStop
//! hooks as upstream does.
//!
//! # Example
//!
//! ```no_run
//! # async fn example() -> Result<(), kubelet_cri_client::Error> {
//! use kubelet_cri_client::{Client, Config};
//!
//! let client = Client::connect(&Config::new("unix:///run/containerd/containerd.sock"))?;
//! let version = client.version().await?;
//! println!("{} {}", version.runtime_name, version.runtime_version);
//! # Ok(())
//! # }
//! ```

use std::{path::PathBuf, time::Duration};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::{
    Code,
    transport::{Channel, Endpoint, Uri},
};
use tower::service_fn;

pub mod actions;
pub mod cgroups;
pub mod container;
mod containerd;
mod convert;
pub mod hosts;
mod instrument;
pub mod labels;
mod listing;
pub mod log_rotation;
pub mod manager;
pub mod sandbox;

/// The CRI `runtime.v1` messages and the `RuntimeService` and `ImageService` clients, as
/// Kubernetes 1.32 defines them (`k8s.io/cri-api` `pkg/apis/runtime/v1/api.proto`), generated
/// ahead of time by `cargo xtask codegen` so that building this crate needs no `protoc`; the
/// two servers too with the feature `server`, for fake runtimes in tests.
#[allow(
    missing_docs,
    unreachable_pub,
    rust_2018_idioms,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    rustdoc::bare_urls,
    rustdoc::broken_intra_doc_links,
    rustdoc::invalid_html_tags,
    reason = "generated code"
)]
pub mod pb {
    include!("pb/runtime.v1.rs");
}

#[doc(inline)]
pub use crate::{
    instrument::OPERATIONS,
    manager::{CriRuntime, MIN_GRACE_PERIOD_SECONDS},
};

/// Re-exported so callers build requests and fake servers with the same tonic.
pub use tonic;

/// Largest gRPC message accepted: list responses of busy nodes exceed tonic's 4 MiB default.
pub const MAX_MESSAGE_SIZE: usize = 16 << 20;

/// Results of the CRI client and the runtime manager.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the CRI client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The endpoint is not a `unix://` URL or absolute socket path.
    #[error("invalid CRI endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The runtime answered a call with a gRPC error (or the call failed in transport). The
    /// message says the status's code and message once (tonic's own text repeats its source).
    #[error("CRI {operation} failed: {:?}: {}", status.code(), status.message())]
    Status {
        /// The CRI method, e.g. `Version`.
        operation: &'static str,
        /// The gRPC status.
        status: Box<tonic::Status>,
    },
    /// An image pull found no token of `registryPullQPS` and `registryBurst` left (upstream's
    /// throttled image service).
    #[error("pull QPS exceeded")]
    PullQpsExceeded,
    /// The pod whose content was to be removed still has a running container or a ready sandbox.
    #[error("pod {uid} still runs; stop it before removing it")]
    PodStillRuns {
        /// The pod's UID.
        uid: String,
    },
    /// Something the runtime left beside a pod (its cgroup) could not be removed yet.
    #[error("cannot remove what is left of pod {uid}")]
    Leftover {
        /// The pod's UID.
        uid: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The filesystem the runtime keeps its images on could not be measured.
    #[error("cannot measure the image filesystem at {mountpoint}")]
    ImageFs {
        /// Where the runtime says it is mounted.
        mountpoint: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn status(operation: &'static str, status: tonic::Status) -> Self {
        // tonic reports its own per-call timeout as `Cancelled` caused by `TimeoutExpired`; to
        // callers that is a deadline, like the runtime's own `DeadlineExceeded`.
        let timed_out = {
            let mut source = std::error::Error::source(&status);
            let mut found = false;
            while let Some(err) = source {
                found |= err.is::<tonic::TimeoutExpired>();
                source = err.source();
            }
            found
        };
        let status = if timed_out && status.code() == Code::Cancelled {
            tonic::Status::deadline_exceeded(format!("no answer within the request timeout ({})", status.message()))
        } else {
            status
        };
        Error::Status { operation, status: Box::new(status) }
    }

    /// The gRPC code, for errors that carry one.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Status { status, .. } => Some(status.code()),
            Error::InvalidEndpoint { .. }
            | Error::PullQpsExceeded
            | Error::PodStillRuns { .. }
            | Error::Leftover { .. }
            | Error::ImageFs { .. } => None,
        }
    }

    /// The object does not exist (a stop or remove of it counts as done).
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(Code::NotFound)
    }

    /// The runtime does not implement the call.
    pub fn is_unimplemented(&self) -> bool {
        self.code() == Some(Code::Unimplemented)
    }

    /// The call ran out of time.
    pub fn is_deadline_exceeded(&self) -> bool {
        self.code() == Some(Code::DeadlineExceeded)
    }

    /// The runtime could not be reached.
    pub fn is_unavailable(&self) -> bool {
        self.code() == Some(Code::Unavailable)
    }
}

/// How to reach the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// The runtime endpoint, as upstream's `--container-runtime-endpoint`.
    pub endpoint: String,
    /// A separate image service endpoint; the runtime endpoint when `None`.
    pub image_endpoint: Option<String>,
    /// Timeout of each call (`runtimeRequestTimeout`, default 2 min), except `PullImage` and
    /// the container event stream, which upstream leaves unbounded.
    pub request_timeout: Duration,
    /// Timeout of establishing the connection (2 s).
    pub connect_timeout: Duration,
}

impl Config {
    /// A config for `endpoint` with upstream's timeouts.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Config {
            endpoint: endpoint.into(),
            image_endpoint: None,
            request_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(2),
        }
    }

    /// Sets the per-call timeout.
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets a separate image service endpoint.
    #[must_use]
    pub fn image_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.image_endpoint = Some(endpoint.into());
        self
    }
}

/// The socket path of a `unix://` endpoint (or a bare absolute path).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, Error> {
    let invalid = |reason| Error::InvalidEndpoint { endpoint: endpoint.to_owned(), reason };
    let path = match endpoint.split_once("://") {
        Some(("unix", path)) => path,
        Some(_) => return Err(invalid("only unix:// endpoints are supported")),
        None => endpoint,
    };
    if !path.starts_with('/') {
        return Err(invalid("the socket path must be absolute"));
    }
    Ok(PathBuf::from(path))
}

/// A channel to a unix socket that connects on first use and reconnects after failures.
fn unix_channel(endpoint: &str, config: &Config) -> Result<Channel, Error> {
    let path = socket_path(endpoint)?;
    // The URI is required by tonic but never used: the connector dials the socket.
    let channel = Endpoint::from_static("http://[::]:50051")
        .connect_timeout(config.connect_timeout)
        .connect_with_connector_lazy(service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }));
    Ok(channel)
}

/// A CRI client: the runtime and image services of one runtime.
///
/// Cloning is cheap; clones share the connection.
#[derive(Clone, Debug)]
pub struct Client {
    runtime: pb::runtime_service_client::RuntimeServiceClient<instrument::Instrumented>,
    /// The runtime service's channel, for the calls whose answers [`listing`] decodes.
    runtime_channel: instrument::Instrumented,
    image: pb::image_service_client::ImageServiceClient<instrument::Instrumented>,
    /// The runtime's socket, unmeasured, for containerd's own event service.
    containerd: Channel,
    unimplemented: instrument::Unimplemented,
}

/// The channel type of the generated clients: a tonic channel whose calls are measured.
pub type CriChannel = instrument::Instrumented;

impl Client {
    /// Creates a client; the connection is made on the first call.
    pub fn connect(config: &Config) -> Result<Self, Error> {
        let runtime_channel = unix_channel(&config.endpoint, config)?;
        let image_channel = match &config.image_endpoint {
            Some(endpoint) => unix_channel(endpoint, config)?,
            None => runtime_channel.clone(),
        };
        Ok(Client::with_timeout(runtime_channel, image_channel, Some(config.request_timeout)))
    }

    /// Creates a client over existing channels (for example to an in-process fake server),
    /// with no per-call timeout.
    pub fn from_channels(runtime: Channel, image: Channel) -> Self {
        Client::with_timeout(runtime, image, None)
    }

    fn with_timeout(runtime: Channel, image: Channel, timeout: Option<std::time::Duration>) -> Self {
        let unimplemented = instrument::Unimplemented::default();
        let runtime_channel = instrument::Instrumented::new(runtime.clone(), unimplemented.clone(), timeout);
        Client {
            containerd: runtime,
            runtime: pb::runtime_service_client::RuntimeServiceClient::new(runtime_channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
            image: pb::image_service_client::ImageServiceClient::new(instrument::Instrumented::new(
                image,
                unimplemented.clone(),
                timeout,
            ))
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE),
            runtime_channel,
            unimplemented,
        }
    }

    /// The generated runtime service client, for calls this crate does not wrap yet.
    pub fn runtime_service(&self) -> pb::runtime_service_client::RuntimeServiceClient<CriChannel> {
        self.runtime.clone()
    }

    /// A unary call of the runtime service at `path` whose answer is decoded as `Answer`: one of
    /// [`listing`]'s messages, which read the generated answer's bytes.
    pub(crate) async fn runtime_call<Request, Answer>(
        &self,
        path: &'static str,
        request: Request,
    ) -> Result<Answer, tonic::Status>
    where
        Request: prost::Message + Send + 'static,
        Answer: prost::Message + Default + Send + 'static,
    {
        let mut grpc =
            tonic::client::Grpc::new(self.runtime_channel.clone()).max_decoding_message_size(MAX_MESSAGE_SIZE);
        grpc.ready()
            .await
            .map_err(|err| tonic::Status::unknown(format!("the runtime's channel is not ready: {err}")))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
        let codec = listing::ListingCodec::<Request, Answer>::default();
        Ok(grpc.unary(tonic::Request::new(request), path, codec).await?.into_inner())
    }

    /// The generated image service client, for calls this crate does not wrap yet.
    pub fn image_service(&self) -> pb::image_service_client::ImageServiceClient<CriChannel> {
        self.image.clone()
    }

    /// The CRI methods the runtime answered `Unimplemented` so far (snake case, e.g.
    /// `runtime_config`): features it lacks, which callers replace with fallbacks.
    pub fn unimplemented(&self) -> Vec<String> {
        self.unimplemented.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }

    /// Sends a hint into `changed` whenever a container or sandbox of the CRI plugin is created,
    /// starts, exits or is removed, from containerd's own event service on the runtime's socket
    /// (`containerd.services.events.v1.Events/Subscribe`, namespace `k8s.io`).
    ///
    /// For runtimes whose CRI has no event stream (containerd 1.6): the hints carry no status,
    /// so the PLEG relists on each. Hints are coalesced: one waiting in `changed` stands for all
    /// that follow until it is taken. Returns `Ok` when the receiver goes away, and
    /// [`EventStreamError::Unimplemented`](kubelet_core::runtime::EventStreamError) from a
    /// runtime that is not containerd.
    pub async fn watch_containerd_changes(
        &self,
        changed: tokio::sync::mpsc::Sender<kubelet_core::runtime::ChangeHint>,
    ) -> Result<(), kubelet_core::runtime::EventStreamError> {
        containerd::watch(self.containerd.clone(), changed).await
    }

    /// Kills and deletes the task containerd keeps under `container_id`, through containerd's
    /// own Tasks service on the runtime's socket (namespace `k8s.io`), waiting at most `wait`
    /// for it to exit; a task already gone is success.
    ///
    /// For the state containerd 1.6 can be left in when a StartContainer is cut short: a running
    /// task under a container its CRI reports as created, which no CRI call stops or removes.
    /// A runtime that is not containerd answers [`Error::is_unimplemented`].
    pub async fn remove_containerd_task(&self, container_id: &str, wait: std::time::Duration) -> Result<(), Error> {
        containerd::remove_task(self.containerd.clone(), container_id, wait)
            .await
            .map_err(|s| Error::status("containerd Tasks", s))
    }

    /// CRI `Version`.
    pub async fn version(&self) -> Result<pb::VersionResponse, Error> {
        let request = pb::VersionRequest { version: "v1".to_owned() };
        Ok(self.runtime.clone().version(request).await.map_err(|s| Error::status("Version", s))?.into_inner())
    }

    /// CRI `Status` (not verbose).
    pub async fn status(&self) -> Result<pb::RuntimeStatus, Error> {
        let request = pb::StatusRequest { verbose: false };
        let response = self.runtime.clone().status(request).await.map_err(|s| Error::status("Status", s))?.into_inner();
        Ok(response.status.unwrap_or_default())
    }

    /// CRI `RuntimeConfig` (the runtime's cgroup driver); runtimes that predate it answer
    /// `Unimplemented` ([`Error::is_unimplemented`]), and the kubelet then uses its own setting.
    pub async fn runtime_config(&self) -> Result<pb::RuntimeConfigResponse, Error> {
        let request = pb::RuntimeConfigRequest {};
        Ok(self
            .runtime
            .clone()
            .runtime_config(request)
            .await
            .map_err(|s| Error::status("RuntimeConfig", s))?
            .into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_like_upstream() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(socket_path("/run/x.sock").unwrap(), PathBuf::from("/run/x.sock"));
        assert!(matches!(socket_path("tcp://127.0.0.1:1"), Err(Error::InvalidEndpoint { .. })));
        assert!(matches!(socket_path("unix://relative.sock"), Err(Error::InvalidEndpoint { .. })));
    }

    #[tokio::test]
    async fn missing_socket_is_unavailable() {
        let dir = std::env::temp_dir().join(format!("cri-missing-{}", std::process::id()));
        let client = Client::connect(&Config::new(format!("unix://{}/nope.sock", dir.display()))).unwrap();
        let err = client.version().await.unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        assert!(!err.is_not_found());
        assert!(err.to_string().starts_with("CRI Version failed"), "{err}");
    }
}
