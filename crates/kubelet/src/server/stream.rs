//! `/exec`, `/attach`, `/portForward` and `/run`, as upstream's kubelet serves them: the runtime
//! is asked for a stream (CRI `Exec`, `Attach`, `PortForward`), and the caller's request, an
//! HTTP upgrade to SPDY or WebSocket, is proxied to the URL of the runtime's streaming server;
//! once both sides have switched protocols the bytes are copied both ways until either closes.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::{Path as UrlPath, Query, Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use hyper_util::rt::TokioIo;
use kubelet_core::{
    Runtime,
    runtime::{ContainerState, SandboxState, StreamIo, StreamRequest},
};
use tracing::debug;

use super::ApiState;

/// The query of a streaming request: repeated keys (`command`, `port`) in order.
type Params = Vec<(String, String)>;

/// The path of a streaming request: `{namespace}/{pod}`, then the pod's UID when the path gives
/// one, then the container (`/portForward` names none).
#[derive(Debug, serde::Deserialize)]
pub(super) struct PodRef {
    namespace: String,
    #[serde(rename = "pod")]
    name: String,
    uid: Option<String>,
    container: Option<String>,
}

/// Why a stream cannot be served: the status and the text answered.
#[derive(Debug)]
pub(super) struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}

fn refuse(status: StatusCode, message: impl Into<String>) -> Refusal {
    Refusal(status, message.into())
}

/// What a streaming handler answers.
pub(super) type Answer = Result<Response, Refusal>;

/// A parameter set to true (`1`, as kube-apiserver sends it, or `true`).
fn flag(params: &Params, name: &str) -> bool {
    params.iter().any(|(key, value)| key == name && (value == "1" || value == "true"))
}

/// The values of a repeated parameter, in order.
fn values<'a>(params: &'a Params, name: &'a str) -> impl Iterator<Item = &'a str> {
    params.iter().filter(move |(key, _)| key == name).map(|(_, value)| value.as_str())
}

/// The streams a request asks for (upstream's `NewOptions`, with its parameter names `input`,
/// `output`, `error` and `tty`): at least one.
fn stream_io(params: &Params) -> Result<StreamIo, Refusal> {
    let io = StreamIo::new(flag(params, "input"), flag(params, "output"), flag(params, "error"), flag(params, "tty"));
    if !io.stdin && !io.stdout && !io.stderr {
        return Err(refuse(StatusCode::BAD_REQUEST, "you must specify at least 1 of stdin, stdout, stderr"));
    }
    Ok(io)
}

/// The runtime's view of the pod: its running container `container`'s ID, or its ready
/// sandbox's when `container` is `None`.
async fn runtime_id<R: Runtime>(state: &ApiState<R>, pod: &PodRef, container: Option<&str>) -> Result<String, Refusal> {
    let Some(desired) = state.pods.pod_by_name(&pod.namespace, &pod.name) else {
        return Err(refuse(StatusCode::NOT_FOUND, "pod does not exist"));
    };
    let uid = desired.metadata.uid.clone().unwrap_or_default();
    if pod.uid.as_ref().is_some_and(|wanted| *wanted != uid) {
        return Err(refuse(StatusCode::NOT_FOUND, "pod does not exist"));
    }
    let running = state
        .runtime
        .get_pods(false)
        .await
        .map_err(|e| refuse(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot list the runtime's pods: {e}")))?;
    let in_runtime = running.into_iter().find(|p| p.uid.as_str() == uid);
    let found = match container {
        Some(name) => in_runtime.and_then(|p| {
            p.containers.into_iter().find(|c| c.name == name && c.state == ContainerState::Running).map(|c| c.id)
        }),
        None => in_runtime.and_then(|p| p.sandboxes.into_iter().find(|s| s.state == SandboxState::Ready).map(|s| s.id)),
    };
    found.ok_or_else(|| match container {
        Some(name) => refuse(StatusCode::NOT_FOUND, format!("container not found (\"{name}\")")),
        None => refuse(StatusCode::NOT_FOUND, "pod has no running sandbox"),
    })
}

/// Asks the runtime for `request`'s stream and proxies `caller` to it.
async fn stream<R: Runtime>(state: &ApiState<R>, request: StreamRequest, caller: Request) -> Answer {
    match state.runtime.stream_url(request).await {
        Ok(Some(url)) => proxy(&url, caller, state.streaming_idle_timeout).await,
        Ok(None) => Err(refuse(StatusCode::NOT_IMPLEMENTED, "the container runtime cannot stream")),
        Err(e) => Err(refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}

/// `/exec/{namespace}/{pod}[/{uid}]/{container}`.
pub(super) async fn exec<R: Runtime>(
    State(state): State<Arc<ApiState<R>>>,
    UrlPath(pod): UrlPath<PodRef>,
    Query(params): Query<Params>,
    caller: Request,
) -> Answer {
    let io = stream_io(&params)?;
    let command: Vec<String> = values(&params, "command").map(str::to_owned).collect();
    let container_id = runtime_id(&state, &pod, pod.container.as_deref()).await?;
    stream(&state, StreamRequest::Exec { container_id, command, io }, caller).await
}

/// `/attach/{namespace}/{pod}[/{uid}]/{container}`.
pub(super) async fn attach<R: Runtime>(
    State(state): State<Arc<ApiState<R>>>,
    UrlPath(pod): UrlPath<PodRef>,
    Query(params): Query<Params>,
    caller: Request,
) -> Answer {
    let io = stream_io(&params)?;
    let container_id = runtime_id(&state, &pod, pod.container.as_deref()).await?;
    stream(&state, StreamRequest::Attach { container_id, io }, caller).await
}

/// `/portForward/{namespace}/{pod}[/{uid}]`.
pub(super) async fn port_forward<R: Runtime>(
    State(state): State<Arc<ApiState<R>>>,
    UrlPath(pod): UrlPath<PodRef>,
    Query(params): Query<Params>,
    caller: Request,
) -> Answer {
    let mut ports = Vec::new();
    for port in values(&params, "port") {
        match port.parse::<u16>() {
            Ok(port) if port > 0 => ports.push(i32::from(port)),
            _ => {
                let message = format!("unable to parse \"{port}\" as a port: must be 1-65535");
                return Err(refuse(StatusCode::BAD_REQUEST, message));
            }
        }
    }
    let sandbox_id = runtime_id(&state, &pod, None).await?;
    stream(&state, StreamRequest::PortForward { sandbox_id, ports }, caller).await
}

/// `POST /run/{namespace}/{pod}/{container}?cmd=...`: runs `cmd` (split at spaces, as
/// upstream's) to its end and answers its stdout and then its stderr.
pub(super) async fn run<R: Runtime>(
    State(state): State<Arc<ApiState<R>>>,
    UrlPath(pod): UrlPath<PodRef>,
    Query(params): Query<Params>,
) -> Answer {
    let command: Vec<String> =
        values(&params, "cmd").next().unwrap_or_default().split(' ').map(str::to_owned).collect();
    let container_id = runtime_id(&state, &pod, pod.container.as_deref()).await?;
    let result = state
        .runtime
        .exec_sync(&container_id, &command, std::time::Duration::ZERO)
        .await
        .map_err(|e| refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let mut output = result.stdout;
    output.extend_from_slice(&result.stderr);
    Ok(([(header::CONTENT_TYPE, "application/json")], output).into_response())
}

/// Whether a request asks to switch protocols (`Connection: Upgrade` with an `Upgrade`).
fn is_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && headers.contains_key(header::UPGRADE)
}

/// The headers of a caller's request the runtime's streaming server gets: those that negotiate
/// the upgrade and its protocol (SPDY's `X-Stream-Protocol-Version`, WebSocket's
/// `Sec-WebSocket-*` and `Origin`), and nothing else. Upstream's kubelet forwards every header;
/// here the caller's credentials, cookies and impersonation headers stay with the kubelet API.
const FORWARDED_HEADERS: [header::HeaderName; 8] = [
    header::CONNECTION,
    header::UPGRADE,
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_VERSION,
    header::SEC_WEBSOCKET_PROTOCOL,
    header::SEC_WEBSOCKET_EXTENSIONS,
    header::ORIGIN,
    header::HeaderName::from_static("x-stream-protocol-version"),
];

/// A `Sec-WebSocket-Protocol` value without the bearer token subprotocols
/// (`base64url.bearer.authorization.k8s.io.<token>`) that another credential left in it.
fn without_token_subprotocols(value: &HeaderValue) -> HeaderValue {
    let text = String::from_utf8_lossy(value.as_bytes());
    let kept: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|protocol| !protocol.starts_with("base64url.bearer.authorization.k8s.io."))
        .collect();
    HeaderValue::from_str(&kept.join(", ")).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Sends `caller`'s request to the runtime's streaming server at `url` and answers with its
/// response; a switch of protocols joins the two connections until either ends or no byte goes
/// either way for `idle_timeout`.
async fn proxy(url: &str, mut caller: Request, idle_timeout: Duration) -> Answer {
    let bad_gateway = |what: String| refuse(StatusCode::BAD_GATEWAY, what);
    let target =
        url.parse::<Uri>().map_err(|_| bad_gateway(format!("the runtime's stream URL {url:?} is not a URL")))?;
    let (Some("http"), Some(authority)) = (target.scheme_str(), target.authority().cloned()) else {
        return Err(bad_gateway(format!("the runtime's stream URL {url:?} is not http://host:port/...")));
    };
    let unreachable =
        |e: &dyn std::fmt::Display| bad_gateway(format!("the runtime's streaming server at {authority}: {e}"));
    let connection = tokio::net::TcpStream::connect(authority.as_str()).await.map_err(|e| unreachable(&e))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(connection)).await.map_err(|e| unreachable(&e))?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            debug!(%error, "the runtime's streaming connection ended");
        }
    });
    let upgrading = is_upgrade(caller.headers()).then(|| hyper::upgrade::on(&mut caller));
    let (parts, body) = caller.into_parts();
    let path = target.path_and_query().map_or("/", |p| p.as_str());
    let mut forwarded = axum::http::Request::builder().method(parts.method).uri(path);
    for (name, value) in parts.headers.iter().filter(|(name, _)| FORWARDED_HEADERS.contains(name)) {
        if name == header::SEC_WEBSOCKET_PROTOCOL {
            forwarded = forwarded.header(name, without_token_subprotocols(value));
        } else {
            forwarded = forwarded.header(name, value);
        }
    }
    forwarded = forwarded.header(header::HOST, authority.as_str());
    let body = if upgrading.is_some() { Body::empty() } else { body };
    let forwarded = forwarded.body(body).map_err(|e| unreachable(&e))?;
    let mut response = sender.send_request(forwarded).await.map_err(|e| unreachable(&e))?;
    if let (StatusCode::SWITCHING_PROTOCOLS, Some(caller_side)) = (response.status(), upgrading) {
        let runtime_side = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            let (Ok(caller_side), Ok(runtime_side)) = tokio::join!(caller_side, runtime_side) else { return };
            join_until_idle(TokioIo::new(caller_side), TokioIo::new(runtime_side), idle_timeout).await;
        });
    }
    Ok(response.map(Body::new).into_response())
}

/// Copies between the two sides of a stream until either ends, or nothing moves either way for
/// `idle_timeout`; both are then dropped, which closes them.
async fn join_until_idle<C, R>(caller_side: C, mut runtime_side: R, idle_timeout: Duration)
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    R: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let activity = Activity::default();
    let mut caller_side = Watched { io: caller_side, activity: &activity };
    let copying = tokio::io::copy_bidirectional(&mut caller_side, &mut runtime_side);
    tokio::select! {
        copied = copying => debug!(?copied, "stream ended"),
        () = activity.idle_for(idle_timeout) => debug!(?idle_timeout, "idle stream closed"),
    }
}

/// When a stream last moved a byte.
#[derive(Debug)]
struct Activity(std::sync::Mutex<tokio::time::Instant>);

impl Default for Activity {
    fn default() -> Self {
        Activity(std::sync::Mutex::new(tokio::time::Instant::now()))
    }
}

impl Activity {
    fn moved(&self) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = tokio::time::Instant::now();
    }

    fn last(&self) -> tokio::time::Instant {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Returns once nothing has moved for `timeout`: one timer, set again to the last move's
    /// deadline each time it fires early.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            // A timeout past what the clock can count is no timeout.
            let Some(deadline) = self.last().checked_add(timeout) else { return std::future::pending().await };
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// One side of a stream, every byte read or written through it noted in `activity`.
struct Watched<'a, T> {
    io: T,
    activity: &'a Activity,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<'_, T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.moved();
        }
        polled
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<'_, T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(polled, std::task::Poll::Ready(Ok(written)) if written > 0) {
            self.activity.moved();
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Params {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn stream_options_are_read_as_upstream_reads_them() {
        let io = stream_io(&params(&[("input", "1"), ("output", "1"), ("error", "1"), ("tty", "1")])).unwrap();
        assert_eq!(io, StreamIo::new(true, true, false, true), "a TTY merges stderr into stdout");
        let io = stream_io(&params(&[("output", "1"), ("error", "true")])).unwrap();
        assert!(io.stdout && io.stderr && !io.stdin && !io.tty);
        assert!(stream_io(&params(&[("tty", "1"), ("output", "0"), ("stdout", "1")])).is_err(), "no stream at all");
        let command = params(&[("command", "sh"), ("output", "1"), ("command", "-c"), ("command", "echo hi")]);
        assert_eq!(values(&command, "command").collect::<Vec<_>>(), ["sh", "-c", "echo hi"]);
    }

    #[test]
    fn upgrades_are_told_from_plain_requests() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        assert!(!is_upgrade(&headers), "no Upgrade header");
        headers.insert(header::UPGRADE, "SPDY/3.1".parse().unwrap());
        assert!(is_upgrade(&headers));
        headers.insert(header::CONNECTION, "close".parse().unwrap());
        assert!(!is_upgrade(&headers));
    }

    #[tokio::test]
    async fn the_runtime_gets_the_upgrades_headers_and_never_the_callers_credentials() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let runtime = tokio::spawn(async move {
            let (mut connection, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buffer = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let read = connection.read(&mut buffer).await.unwrap();
                head.extend(&buffer[..read]);
            }
            connection.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await.unwrap();
            String::from_utf8(head).unwrap().to_ascii_lowercase()
        });
        let caller = Request::builder()
            .uri("/exec/ns/pod/c?command=ls")
            .header(header::AUTHORIZATION, "Bearer secret")
            .header(header::PROXY_AUTHORIZATION, "Basic c2VjcmV0")
            .header(header::COOKIE, "session=secret")
            .header("Impersonate-User", "admin")
            .header("Impersonate-Group", "system:masters")
            .header("X-Stream-Protocol-Version", "v4.channel.k8s.io")
            .header("X-Stream-Protocol-Version", "v3.channel.k8s.io")
            .header(header::SEC_WEBSOCKET_PROTOCOL, "base64url.bearer.authorization.k8s.io.c2VjcmV0, v5.channel.k8s.io")
            .body(Body::empty())
            .unwrap();
        let answer = proxy(&format!("http://{address}/exec/abc"), caller, Duration::from_secs(60)).await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        let head = runtime.await.unwrap();
        assert!(head.starts_with("get /exec/abc http/1.1\r\n"), "{head}");
        for kept in [
            "x-stream-protocol-version: v4.channel.k8s.io",
            "x-stream-protocol-version: v3.channel.k8s.io",
            "sec-websocket-protocol: v5.channel.k8s.io",
            &format!("host: {address}"),
        ] {
            assert!(head.contains(kept), "{kept} in {head}");
        }
        for dropped in ["authorization", "cookie", "impersonate", "secret"] {
            assert!(!head.contains(dropped), "{dropped} in {head}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_is_closed_once_idle_for_its_timeout_and_not_before() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (caller_side, mut caller) = tokio::io::duplex(1024);
        let (runtime_side, mut runtime) = tokio::io::duplex(1024);
        let timeout = Duration::from_secs(60);
        let started = tokio::time::Instant::now();
        let joined = tokio::spawn(join_until_idle(caller_side, runtime_side, timeout));
        let mut byte = [0u8; 1];
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(50)).await;
            caller.write_all(b"i").await.unwrap();
            runtime.read_exact(&mut byte).await.unwrap();
            tokio::time::sleep(Duration::from_secs(50)).await;
            runtime.write_all(b"o").await.unwrap();
            caller.read_exact(&mut byte).await.unwrap();
        }
        assert!(!joined.is_finished(), "bytes either way every 50 s keep it open");
        let last_move = tokio::time::Instant::now();
        joined.await.unwrap();
        assert_eq!(tokio::time::Instant::now() - last_move, timeout, "closed a timeout after the last byte");
        assert_eq!(last_move - started, Duration::from_secs(300));
        assert_eq!(caller.read(&mut byte).await.unwrap(), 0, "the caller's side is closed");
    }
}
