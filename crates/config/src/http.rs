//! The static pod HTTP source (upstream `pkg/kubelet/config/http.go`).
//!
//! `staticPodURL` is fetched every `httpCheckFrequency` (20 s) with the configured headers.
//! The body is one Pod or a PodList, YAML or JSON, at most 10 MB.
//! A non-200 answer, a timeout or a body that does not decode is an error that keeps the last
//! good snapshot; an empty body is an empty snapshot; an unchanged body is not decoded again.
//! Plain `http://` only for now.

use std::{sync::Arc, time::Duration};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Request, StatusCode, Uri, body::Bytes};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::{
    SourceSender,
    manifest::{MAX_MANIFEST_BYTES, ManifestError, Origin, static_pods},
};
use kubelet_core::{
    ErrorChain,
    events::{Event, EventRecorder, EventType, ObjectRef},
};

/// How the HTTP source runs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// `staticPodURL`.
    pub url: String,
    /// `staticPodURLHeader`: headers sent with every request.
    pub headers: Vec<(String, String)>,
    /// The node's name, for static pod names and UIDs.
    pub node_name: String,
    /// `httpCheckFrequency` (20 s).
    pub check_frequency: Duration,
    /// Timeout of one fetch, body included (10 s, as upstream's client).
    pub timeout: Duration,
}

impl Config {
    /// A config for `url` on node `node_name` with upstream's timings.
    pub fn new(url: impl Into<String>, node_name: impl Into<String>) -> Self {
        Config {
            url: url.into(),
            headers: Vec::new(),
            node_name: node_name.into(),
            check_frequency: Duration::from_secs(20),
            timeout: Duration::from_secs(10),
        }
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the poll period.
    #[must_use]
    pub fn check_frequency(mut self, period: Duration) -> Self {
        self.check_frequency = period;
        self
    }

    /// Sets the fetch timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// Why one fetch failed; the source then keeps its last good snapshot.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The URL is not a valid `http://` URL, or a header is invalid.
    #[error("invalid request to {url}: {message}")]
    InvalidRequest {
        /// The URL.
        url: String,
        /// What is wrong.
        message: &'static str,
        /// The parser's error, when one failed.
        #[source]
        source: Option<hyper::http::Error>,
    },
    /// The server could not be reached, or the connection failed.
    #[error("{url}: request failed")]
    Transport {
        /// The URL.
        url: String,
        /// The client's error.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// No complete answer within the timeout.
    #[error("{url}: no answer within {timeout:?}")]
    Timeout {
        /// The URL.
        url: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The server answered with another status than 200.
    #[error("{url}: {status}")]
    Status {
        /// The URL.
        url: String,
        /// The status.
        status: StatusCode,
    },
    /// The body was larger than 10 MB, or failed to arrive.
    #[error("{url}: reading the body failed")]
    Body {
        /// The URL.
        url: String,
        /// What failed: the connection, or the 10 MB limit.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The body did not hold valid pods.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

/// The HTTP source.
pub struct HttpSource {
    config: Config,
    sender: SourceSender,
    recorder: Arc<dyn EventRecorder>,
    client: Client<HttpConnector, Empty<Bytes>>,
    last_body: Option<Bytes>,
}

impl std::fmt::Debug for HttpSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSource").field("config", &self.config).finish_non_exhaustive()
    }
}

impl HttpSource {
    /// A source that sends its snapshots through `sender` and reports failures to `recorder`.
    pub fn new(config: Config, sender: SourceSender, recorder: Arc<dyn EventRecorder>) -> Self {
        let client = Client::builder(TokioExecutor::new()).build_http();
        HttpSource { config, sender, recorder, client, last_body: None }
    }

    /// Fetches the URL once: `Ok(Some(pods))` is a new snapshot, `Ok(None)` an unchanged body.
    pub async fn fetch(&mut self) -> Result<Option<Vec<Pod>>, FetchError> {
        let url = self.config.url.clone();
        let invalid = |message: &'static str, source: Option<hyper::http::Error>| FetchError::InvalidRequest {
            url: url.clone(),
            message,
            source,
        };
        let uri: Uri = url.parse().map_err(|e: hyper::http::uri::InvalidUri| invalid("not a URL", Some(e.into())))?;
        if uri.scheme_str() != Some("http") {
            return Err(invalid("only http:// URLs are supported", None));
        }
        let mut request = Request::get(uri);
        for (name, value) in &self.config.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let request = request.body(Empty::new()).map_err(|e| invalid("a header is not valid", Some(e)))?;
        let fetch = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|source| FetchError::Transport { url: url.clone(), source })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_MANIFEST_BYTES)
                .collect()
                .await
                .map_err(|source| FetchError::Body { url: url.clone(), source })?
                .to_bytes();
            if status != StatusCode::OK {
                return Err(FetchError::Status { url: url.clone(), status });
            }
            Ok(body)
        };
        let body = tokio::time::timeout(self.config.timeout, fetch)
            .await
            .map_err(|_| FetchError::Timeout { url: url.clone(), timeout: self.config.timeout })??;
        if body.iter().all(u8::is_ascii_whitespace) {
            debug!(%url, "empty body: no static pods");
            self.last_body = Some(body);
            return Ok(Some(Vec::new()));
        }
        if self.last_body.as_ref() == Some(&body) {
            return Ok(None);
        }
        self.last_body = Some(body.clone());
        Ok(Some(static_pods(&body, &Origin::Url(url), &self.config.node_name, true)?))
    }

    /// Runs until `cancel` fires or the config channel closes.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut poll = tokio::time::interval(self.config.check_frequency);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_error: Option<String> = None;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = poll.tick() => {}
            }
            let fetched = tokio::select! {
                () = cancel.cancelled() => return,
                fetched = self.fetch() => fetched,
            };
            match fetched {
                Ok(Some(pods)) => {
                    last_error = None;
                    if self.sender.set(pods).await.is_err() {
                        return;
                    }
                }
                Ok(None) => {}
                Err(err) => {
                    let message = ErrorChain(&err).to_string();
                    warn!(error = %message, "static pod URL failed; keeping the last good pods");
                    if last_error.as_ref() != Some(&message) {
                        let object = ObjectRef::other("URL", self.config.url.clone());
                        self.recorder.record(Event::new(
                            EventType::Warning,
                            "InvalidManifest",
                            message.clone(),
                            object,
                        ));
                    }
                    last_error = Some(message);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
