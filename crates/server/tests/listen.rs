//! The bounds every listener keeps, on real sockets with tokio's clock paused: a request head
//! sent too slowly, a kept-alive connection left idle and a TLS handshake never finished are
//! each closed by the server when their time is up and not before; a head over 1 MiB is
//! refused; and a peer holding its share of connections is refused more while another peer is
//! served.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{net::SocketAddr, time::Duration};

use axum::{Router, routing::get};
use kubelet_server::{Limits, listen::serve_router};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpSocket, TcpStream},
};
use tokio_util::sync::CancellationToken;

/// A router that answers `ok`, served within `limits` on a port of 127.0.0.1.
async fn serving(limits: Limits) -> (SocketAddr, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let router = Router::new().route("/healthz", get(|| async { "ok" }));
    tokio::spawn(serve_router(listener, router, limits, "the test API", cancel.clone()));
    (address, cancel)
}

/// Whether the server has closed `stream` (a read ends, or is reset) within `wait`.
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // A response (the 408 or 431 hyper may send) before the close.
            Ok(Ok(_)) => {}
        }
    }
}

const REQUEST: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n";

#[tokio::test(start_paused = true)]
async fn a_request_head_sent_slowly_is_cut_off_at_its_timeout() {
    let limits = Limits::default();
    let (address, _cancel) = serving(limits.clone()).await;
    let mut slow = TcpStream::connect(address).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: node\r\n").await.unwrap();
    // A header line every 10 s keeps nothing alive: the whole head has its time.
    let mut sent = Duration::ZERO;
    while sent + Duration::from_secs(10) < limits.request_head_timeout {
        tokio::time::sleep(Duration::from_secs(10)).await;
        sent += Duration::from_secs(10);
        slow.write_all(b"X-Slow: yes\r\n").await.unwrap();
    }
    let left = limits.request_head_timeout - sent;
    assert!(closed_within(&mut slow, left + Duration::from_secs(1)).await, "closed at the head's timeout");
}

#[tokio::test(start_paused = true)]
async fn a_kept_alive_connection_is_closed_after_upstreams_idle_timeout() {
    let limits = Limits::default();
    assert_eq!(limits.request_head_timeout, Duration::from_secs(90), "upstream's IdleTimeout");
    let (address, _cancel) = serving(limits).await;
    let mut client = TcpStream::connect(address).await.unwrap();
    client.write_all(REQUEST).await.unwrap();
    let mut response = [0u8; 4096];
    let read = client.read(&mut response).await.unwrap();
    assert!(response[..read].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&response[..read]));
    assert!(!closed_within(&mut client, Duration::from_secs(89)).await, "kept alive while under the timeout");
    client.write_all(REQUEST).await.unwrap();
    let read = client.read(&mut response).await.unwrap();
    assert!(response[..read].starts_with(b"HTTP/1.1 200"), "a second request on the kept connection");
    assert!(closed_within(&mut client, Duration::from_secs(91)).await, "closed once idle for 90 s");
}

#[tokio::test(start_paused = true)]
async fn a_head_over_upstreams_one_mebibyte_is_refused_and_one_under_it_served() {
    let (address, _cancel) = serving(Limits::default()).await;
    let head = |value_bytes: usize| {
        let mut head = b"GET /healthz HTTP/1.1\r\nHost: node\r\nX-Big: ".to_vec();
        head.extend(std::iter::repeat_n(b'a', value_bytes));
        head.extend(b"\r\n\r\n");
        head
    };
    let answer = |head: Vec<u8>| async move {
        let mut client = TcpStream::connect(address).await.unwrap();
        // The server may answer and close before reading the whole head.
        let _ = client.write_all(&head).await;
        let mut response = Vec::new();
        let mut buffer = [0u8; 1024];
        while !response.contains(&b'\n') {
            match tokio::time::timeout(Duration::from_secs(5), client.read(&mut buffer)).await {
                Ok(Ok(read)) if read > 0 => response.extend(&buffer[..read]),
                _ => break,
            }
        }
        String::from_utf8_lossy(&response).lines().next().unwrap_or_default().to_owned()
    };
    assert_eq!(answer(head(1_000_000)).await, "HTTP/1.1 200 OK");
    assert_eq!(answer(head(1 << 20)).await, "HTTP/1.1 431 Request Header Fields Too Large");
}

#[tokio::test(start_paused = true)]
async fn a_peer_holding_its_share_is_refused_more_while_another_is_served() {
    let mut limits = Limits::default();
    limits.connections_per_peer = 3;
    let (address, _cancel) = serving(limits).await;
    let from = |source: [u8; 4]| async move {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((source, 0))).unwrap();
        socket.connect(address).await.unwrap()
    };
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(from([127, 0, 0, 1]).await);
    }
    let mut refused = from([127, 0, 0, 1]).await;
    assert!(closed_within(&mut refused, Duration::from_secs(1)).await, "a fourth connection is closed at once");
    let mut other = from([127, 0, 0, 2]).await;
    other.write_all(REQUEST).await.unwrap();
    let mut response = [0u8; 64];
    let read = other.read(&mut response).await.unwrap();
    assert!(response[..read].starts_with(b"HTTP/1.1 200"), "another peer is served");
    drop(held.pop());
    // Give the server the closed connection's place back before the peer asks again.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mut again = from([127, 0, 0, 1]).await;
    again.write_all(REQUEST).await.unwrap();
    let read = again.read(&mut response).await.unwrap();
    assert!(response[..read].starts_with(b"HTTP/1.1 200"), "a closed connection gives its place back");
}

#[tokio::test(start_paused = true)]
async fn a_tls_handshake_never_finished_is_cut_off_at_its_timeout() {
    use kubelet_server::{Authenticator, Authorizer, Guard, tls};
    let dir = tempfile::tempdir().unwrap();
    let certificate = tls::ServingCertificate::self_signed(dir.path(), "node-1").unwrap();
    let config =
        tls::server_config(tls::ServingSlot::with(certificate).unwrap(), &tls::TlsSettings::default()).unwrap();
    let guard = Guard::new(config, Authenticator::new(None, true), Authorizer::AlwaysAllow, "node-1");
    let limits = Limits::default();
    let address = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _server =
        kubelet_server::serve(address, guard, Router::new(), limits.clone(), CancellationToken::new()).await.unwrap();
    let mut silent = TcpStream::connect(address).await.unwrap();
    let under = limits.handshake_timeout - Duration::from_secs(1);
    assert!(!closed_within(&mut silent, under).await, "open while the handshake has time");
    assert!(closed_within(&mut silent, Duration::from_secs(2)).await, "closed at the handshake's timeout");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test]
async fn an_upgraded_session_holds_its_place_until_it_ends() {
    use axum::{body::Body, extract::Request, response::Response};
    async fn upgrade(mut request: Request) -> Response {
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            if let Ok(session) = upgrade.await {
                let mut session = hyper_util::rt::TokioIo::new(session);
                // The session runs until the client closes it.
                let _ = tokio::io::copy(&mut session, &mut tokio::io::sink()).await;
            }
        });
        Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", "test")
            .body(Body::empty())
            .unwrap()
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut limits = Limits::default();
    limits.connections_per_peer = 1;
    let router = Router::new().route("/session", get(upgrade)).route("/healthz", get(|| async { "ok" }));
    tokio::spawn(serve_router(listener, router, limits, "the test API", CancellationToken::new()));

    let mut session = TcpStream::connect(address).await.unwrap();
    session
        .write_all(b"GET /session HTTP/1.1\r\nHost: node\r\nConnection: upgrade\r\nUpgrade: test\r\n\r\n")
        .await
        .unwrap();
    let mut response = [0u8; 256];
    let read = session.read(&mut response).await.unwrap();
    assert!(response[..read].starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&response[..read]));

    let mut second = TcpStream::connect(address).await.unwrap();
    assert!(closed_within(&mut second, Duration::from_secs(2)).await, "the session holds the peer's one place");
    drop(session);
    let mut answer = Vec::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut after = TcpStream::connect(address).await.unwrap();
        after.write_all(REQUEST).await.unwrap();
        answer.clear();
        let _ = tokio::time::timeout(Duration::from_secs(1), after.read_buf(&mut answer)).await;
        if answer.starts_with(b"HTTP/1.1 200") {
            return;
        }
    }
    panic!("the place did not come back once the session ended: {}", String::from_utf8_lossy(&answer));
}
