//! What a hostile client can send the kubelet API's parsing, as property tests: arbitrary
//! paths, methods, `Authorization` headers and WebSocket subprotocols through `Guard::handle`,
//! and arbitrary bytes as request heads to a listener.
//!
//! Whatever comes in, the guard answers 200, 401 or 403 (never panics), a request reaches the
//! router only with a token the reviewer accepts, and the token that authenticated it never
//! reaches the router; a listener answers or closes each connection and goes on serving.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use async_trait::async_trait;
use axum::{Router, body::Body, extract::Request};
use http::{HeaderValue, StatusCode, header};
use kubelet_server::{
    Attributes, Authenticator, Authorizer, Decision, Guard, Limits, User,
    authn::{ReviewError, TokenReviewer},
    authz::AccessReviewer,
    listen::serve_router,
    tls::{ServingSlot, TlsSettings, server_config},
};
use proptest::{prelude::*, test_runner::RngSeed};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The one token the reviewer accepts, for `jane`.
const GOOD_TOKEN: &str = "good-token";

/// Accepts `GOOD_TOKEN` as `jane`, allows `jane` everything and refuses everyone else.
struct Reviews;

#[async_trait]
impl TokenReviewer for Reviews {
    async fn review(&self, token: &str) -> Result<Option<User>, ReviewError> {
        Ok((token == GOOD_TOKEN).then(|| User::new("jane", ["dev"])))
    }
}

#[async_trait]
impl AccessReviewer for Reviews {
    async fn review(&self, attributes: &Attributes) -> Result<Decision, ReviewError> {
        Ok(if attributes.user.name == "jane" { Decision::Allow } else { Decision::Deny })
    }
}

/// A guard with webhook authentication and authorization and anonymous requests on.
fn guard() -> Guard {
    let tls = server_config(Arc::new(ServingSlot::default()), &TlsSettings::default()).unwrap();
    let authenticator = Authenticator::new(Some((Arc::new(Reviews), Duration::from_secs(60))), true);
    let authorizer = Authorizer::webhook(Arc::new(Reviews), Duration::from_secs(60), Duration::from_secs(60));
    Guard::new(tls, authenticator, authorizer, "node-1")
}

/// A router that records the headers of each request that reaches it.
fn recording_router(reached: Arc<Mutex<Vec<http::HeaderMap>>>) -> Router {
    Router::new().fallback(move |request: Request| async move {
        reached.lock().unwrap().push(request.headers().clone());
        "reached"
    })
}

/// The bearer token of an `Authorization` value, as upstream splits it.
fn bearer_token(value: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(value);
    let mut parts = text.trim().splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next().filter(|token| !token.is_empty())?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.to_owned())
}

/// A path of the characters that matter to routing and decoding.
fn path() -> impl Strategy<Value = String> {
    proptest::string::string_regex("/[a-zA-Z0-9/%._~?=&-]{0,40}").unwrap()
}

/// An `Authorization` header value: around the bearer scheme, or anything a header may hold.
fn authorization() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::string::string_regex("( ?[Bb][Ee][Aa][Rr][Ee][Rr]( {0,3})(good-token|[a-z-]{0,12})( [a-z]{0,4})?)")
            .unwrap()
            .prop_map(String::into_bytes),
        proptest::collection::vec(0x20u8..=0xff, 0..64),
    ]
}

/// A `Sec-WebSocket-Protocol` value, with and without token subprotocols.
fn websocket_protocols() -> impl Strategy<Value = String> {
    proptest::string::string_regex(
        "((v5\\.channel\\.k8s\\.io|base64url\\.bearer\\.authorization\\.k8s\\.io\\.(Z29vZC10b2tlbg|[A-Za-z0-9_!-]{0,12})) ?,? ?){0,3}",
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(kubelet_core::testing::proptest_seed(module_path!())),
        ..ProptestConfig::default()
    })]

    /// Whatever the path, method and credentials, the guard answers 200, 401 or 403 (anonymous
    /// is refused everything, so 200 is the good token's), and the router never sees the
    /// credential that authenticated.
    #[test]
    fn the_guard_answers_every_request_and_passes_on_no_credential(
        path in path(),
        method in prop_oneof![Just("GET"), Just("POST"), Just("HEAD"), Just("DELETE"), Just("BREW")],
        authorization in proptest::option::of(authorization()),
        protocols in proptest::option::of(websocket_protocols()),
    ) {
        let Ok(uri) = path.parse::<http::Uri>() else { return Ok(()) };
        let mut request = http::Request::builder().method(method).uri(uri);
        if let Some(value) = authorization.as_deref().and_then(|v| HeaderValue::from_bytes(v).ok()) {
            request = request.header(header::AUTHORIZATION, value);
        }
        if let Some(protocols) = protocols.as_deref().and_then(|p| HeaderValue::from_str(p).ok()) {
            request = request
                .header(header::CONNECTION, "Upgrade")
                .header(header::UPGRADE, "websocket")
                .header(header::SEC_WEBSOCKET_PROTOCOL, protocols);
        }
        let request = request.body(Body::empty()).unwrap();
        let sent_good_bearer = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| bearer_token(v.as_bytes()))
            .is_some_and(|token| token == GOOD_TOKEN);
        let reached = Arc::new(Mutex::new(Vec::new()));
        let router = recording_router(reached.clone());
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let status = runtime.block_on(guard().handle(request, None, router)).status();
        prop_assert!(
            [StatusCode::OK, StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&status),
            "{status}"
        );
        let reached = reached.lock().unwrap();
        prop_assert_eq!(reached.len(), usize::from(status == StatusCode::OK));
        let sent_good_protocol = protocols
            .as_deref()
            .is_some_and(|p| p.split(',').any(|p| p.trim() == "base64url.bearer.authorization.k8s.io.Z29vZC10b2tlbg"));
        prop_assert!(status != StatusCode::OK || sent_good_bearer || sent_good_protocol, "allowed without the good token");
        for headers in reached.iter() {
            // The credential that authenticated is taken off: the bearer header when it holds the
            // good token (it is tried first), else the token subprotocol.
            let authorization = headers.get(header::AUTHORIZATION).map(HeaderValue::as_bytes);
            prop_assert!(authorization.and_then(bearer_token).as_deref() != Some(GOOD_TOKEN), "the bearer token was passed on");
            if sent_good_bearer {
                continue;
            }
            let protocols = headers.get(header::SEC_WEBSOCKET_PROTOCOL).map(HeaderValue::as_bytes).unwrap_or_default();
            let token_protocol = String::from_utf8_lossy(protocols)
                .split(',')
                .any(|p| p.trim() == "base64url.bearer.authorization.k8s.io.Z29vZC10b2tlbg");
            prop_assert!(!token_protocol, "the token subprotocol was passed on");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(kubelet_core::testing::proptest_seed(module_path!())),
        ..ProptestConfig::default()
    })]

    /// Arbitrary bytes as a request head (a request line and headers of any shape, or none):
    /// the listener answers or closes the connection within its bounds, and serves the next
    /// client.
    #[test]
    fn a_listener_answers_or_closes_whatever_head_comes_and_serves_the_next(
        head in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..512),
            proptest::string::string_regex("[A-Z]{0,7} /[ -~]{0,30} HTTP/1\\.[01]\r\n([A-Za-z-]{0,12}: ?[ -~]{0,20}\r\n){0,4}\r?\n?")
                .unwrap()
                .prop_map(String::into_bytes),
        ],
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let cancel = tokio_util::sync::CancellationToken::new();
            let router = Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
            let server = tokio::spawn(serve_router(listener, router, Limits::default(), "the test API", cancel.clone()));
            let mut hostile = tokio::net::TcpStream::connect(address).await.unwrap();
            let _ = hostile.write_all(&head).await;
            let _ = hostile.shutdown().await;
            let mut answer = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(5), hostile.read_to_end(&mut answer)).await;
            assert!(read.is_ok(), "the connection is answered or closed, not held");
            let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
            client.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").await.unwrap();
            let mut response = Vec::new();
            client.read_to_end(&mut response).await.unwrap();
            assert!(response.starts_with(b"HTTP/1.0 200"), "{}", String::from_utf8_lossy(&response));
            cancel.cancel();
            server.await.unwrap();
        });
    }
}
