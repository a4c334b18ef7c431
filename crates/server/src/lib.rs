//! The kubelet API of kubelet-rs, as upstream's `pkg/kubelet/server` serves it on the kubelet
//! port (10250): HTTPS, every request authenticated ([`authn`]: client certificate, bearer token
//! through a TokenReview, or anonymous) and authorized ([`authz`]: the Node subresources its
//! path falls under, allowed always or by SubjectAccessReviews) before the handlers see it; and
//! the bounds every listener of the node keeps against its clients ([`listen`]).
//!
//! The handlers are any axum `Router`: the binary serves `kubelet_node::server`'s API
//! (`/containerLogs`, `/pods`, `/healthz`, ...). [`tls`] makes the server's TLS configuration,
//! [`review`] asks the API server, and [`serve`] runs it all until cancelled.
//!
//! A refusal is upstream's: 401 `Unauthorized`, 403 `Forbidden (user=..., verb=...,
//! resource=nodes, subresource(s)=[...])`, 500 `Authorization error (...)` when a review fails.

pub mod authn;
pub mod authz;
mod cache;
pub mod listen;
pub mod review;
pub mod tls;

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use axum::{Router, body::Body};
use http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;
use rustls::pki_types::CertificateDer;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, info, warn};

pub use authn::{Authenticator, User};
pub use authz::{Attributes, Authorizer, Decision};
pub use listen::Limits;

/// The kubelet API could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The address could not be bound.
    #[error("cannot listen on {address}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What guards the handlers: TLS, who is calling, and what they may do on which node.
pub struct Guard {
    tls: Arc<rustls::ServerConfig>,
    authenticator: Authenticator,
    authorizer: Authorizer,
    node_name: String,
}

impl Guard {
    /// Requests to node `node_name` over `tls`, checked by `authenticator` and `authorizer`.
    pub fn new(
        tls: Arc<rustls::ServerConfig>,
        authenticator: Authenticator,
        authorizer: Authorizer,
        node_name: impl Into<String>,
    ) -> Self {
        Guard { tls, authenticator, authorizer, node_name: node_name.into() }
    }

    /// The router's answer to `request` from the holder of `client_certificate`, or upstream's
    /// refusal.
    pub async fn handle(
        &self,
        mut request: Request<Body>,
        client_certificate: Option<&CertificateDer<'_>>,
        router: Router,
    ) -> Response<Body> {
        let user = match self.authenticator.authenticate(client_certificate, request.headers_mut()).await {
            Ok(Some(user)) => user,
            Ok(None) => return text(StatusCode::UNAUTHORIZED, "Unauthorized".to_owned()),
            Err(error) => {
                warn!(error = %error_chain(&error), "Unable to authenticate the request due to an error");
                return text(StatusCode::UNAUTHORIZED, "Unauthorized".to_owned());
            }
        };
        let attributes = Attributes::of_request(user, request.method(), request.uri().path(), &self.node_name);
        if let Err(refusal) = self.authorize_any(&attributes).await {
            return refusal;
        }
        match router.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }

    /// Allows a request when any of its `attributes` is allowed, asked in order; the first
    /// failed review is a 500, and none allowed a 403, with upstream's texts.
    async fn authorize_any(&self, attributes: &[Attributes]) -> Result<(), Response<Body>> {
        for asked in attributes {
            match self.authorizer.authorize(asked).await {
                Ok(Decision::Allow) => return Ok(()),
                Ok(Decision::Deny) => {}
                Err(error) => {
                    warn!(%error, user = %asked.user.name, verb = %asked.verb, subresource = asked.subresource, "Authorization error");
                    return Err(text(StatusCode::INTERNAL_SERVER_ERROR, asked.describe_error()));
                }
            }
        }
        let subresources: Vec<&str> = attributes.iter().map(|a| a.subresource).collect();
        let user = attributes.first().map(|a| a.user.name.as_str()).unwrap_or_default();
        debug!(user, subresources = ?subresources, "Forbidden");
        Err(text(StatusCode::FORBIDDEN, authz::describe_forbidden(attributes)))
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Binds `address` (failing clearly when it is taken) and serves `router` behind `guard` within
/// `limits` until `cancel`; the returned task ends once every connection has.
pub async fn serve(
    address: SocketAddr,
    guard: Guard,
    router: Router,
    limits: Limits,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let listener = tokio::net::TcpListener::bind(address).await.map_err(|source| Error::Listen { address, source })?;
    info!(%address, "serving the kubelet API");
    let guard = Arc::new(guard);
    Ok(tokio::spawn(async move {
        let builder = limits.http1();
        let handshake_timeout = limits.handshake_timeout;
        let connection_cancel = cancel.clone();
        listen::accept_until_cancelled(listener, &limits, "the kubelet API", cancel, move |stream| {
            let guarded = GuardedRouter { guard: guard.clone(), router: router.clone() };
            connection(stream, guarded, builder.clone(), handshake_timeout, connection_cancel.clone())
        })
        .await;
    }))
}

/// The router behind the guard, for one connection.
struct GuardedRouter {
    guard: Arc<Guard>,
    router: Router,
}

/// One connection: the TLS handshake within `handshake_timeout`, then HTTP/1.1 (with upgrades)
/// until the client or `cancel` ends it.
async fn connection(
    stream: listen::Admitted<tokio::net::TcpStream>,
    guarded: GuardedRouter,
    builder: hyper::server::conn::http1::Builder,
    handshake_timeout: Duration,
    cancel: CancellationToken,
) -> Result<(), listen::ConnectionError> {
    let tls = TlsAcceptor::from(guarded.guard.tls.clone());
    let tls = tokio::time::timeout(handshake_timeout, tls.accept(stream)).await??;
    let client_certificate: Option<CertificateDer<'static>> =
        tls.get_ref().1.peer_certificates().and_then(|chain| chain.first()).map(|c| c.clone().into_owned());
    let client_certificate = Arc::new(client_certificate);
    let GuardedRouter { guard, router } = guarded;
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let (guard, router, client_certificate) = (guard.clone(), router.clone(), client_certificate.clone());
        async move {
            let response = guard.handle(request.map(Body::new), client_certificate.as_ref().as_ref(), router).await;
            Ok::<_, Infallible>(response)
        }
    });
    listen::serve_http(builder, tls, service, cancel).await
}
