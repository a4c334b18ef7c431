//! Serving a port to clients that may be hostile: every listener of the node (the kubelet API,
//! the read-only and healthz ports, the local socket) bounds how many connections it holds, in
//! all and from each peer, how long a client has to finish its TLS handshake and to send each
//! request's head, and how large that head may be.
//!
//! A connection over a bound is accepted and closed at once, so the kernel's queue never fills
//! and a well-behaved peer is still served while another holds its share (up to the port's
//! bound, which a few peers together can fill). A connection's place is given back when its
//! socket closes, so an exec, attach or port-forward session holds its place for as long as it
//! runs.

use std::{
    collections::HashMap,
    future::Future,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use axum::{Router, serve::Listener};
use hyper::server::conn::http1;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{debug, warn};

/// What one listener bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Connections held at once.
    pub connections: usize,
    /// Connections held at once from one IP address (a unix socket's peers share the whole).
    pub connections_per_peer: usize,
    /// How long a client has to finish its TLS handshake.
    pub handshake_timeout: Duration,
    /// How long a connection waits for the head of its next request and reads it: upstream's
    /// `IdleTimeout` for a kept-alive connection, and the bound on a head sent slowly.
    pub request_head_timeout: Duration,
    /// The largest request head (request line and headers), upstream's `MaxHeaderBytes`.
    pub max_header_bytes: usize,
}

impl Default for Limits {
    /// Upstream's values where its server has them (90 s idle, 1 MiB of headers); the
    /// connection caps are well above what the API server's proxied sessions need of one node.
    fn default() -> Self {
        Limits {
            connections: 4096,
            connections_per_peer: 256,
            handshake_timeout: Duration::from_secs(10),
            request_head_timeout: Duration::from_secs(90),
            max_header_bytes: 1 << 20,
        }
    }
}

impl Limits {
    /// The local socket's: its clients are root's own commands, so a smaller bound of 256.
    pub fn local() -> Self {
        Limits { connections: 256, ..Limits::default() }
    }

    /// An HTTP/1.1 server that enforces these limits on a connection.
    pub(crate) fn http1(&self) -> http1::Builder {
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.request_head_timeout)
            .max_header_size(self.max_header_bytes)
            // The read buffer holds a whole head; Go's reader allows 4 KiB over the limit too.
            .max_buf_size(self.max_header_bytes.max(MIN_BUFFER) + 4096);
        builder
    }
}

/// hyper's smallest read buffer.
const MIN_BUFFER: usize = 8192;

/// The peer a listener's address names, when it has one (a TCP client's IP address).
pub trait Peer {
    /// The IP address connections are counted under.
    fn peer_ip(&self) -> Option<IpAddr>;
}

impl Peer for std::net::SocketAddr {
    /// An IPv4 client of a dual-stack socket is the same peer as over IPv4; an IPv6 client is
    /// its /64, which one host holds whole.
    fn peer_ip(&self) -> Option<IpAddr> {
        match self.ip().to_canonical() {
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) & !u128::from(u64::MAX);
                Some(IpAddr::V6(std::net::Ipv6Addr::from(prefix)))
            }
            v4 => Some(v4),
        }
    }
}

impl Peer for tokio::net::unix::SocketAddr {
    fn peer_ip(&self) -> Option<IpAddr> {
        None
    }
}

/// Counts the connections a listener holds, in all and per peer.
#[derive(Debug)]
struct Admission {
    connections: usize,
    connections_per_peer: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_peer: HashMap<IpAddr, PeerCount>,
    /// Set at the first refusal of a full port, so that one full spell is told of once.
    refused_full: bool,
}

#[derive(Debug, Default)]
struct PeerCount {
    open: usize,
    /// Set at the first refusal, so that a peer held at its bound is told of once.
    refused: bool,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The listener holds its bound; `first` when it was under it until now.
    Listener { first: bool },
    /// The peer holds its share; `first` when it was under it until now.
    Peer { first: bool },
}

/// One admitted connection's place; dropping it gives the place back.
#[derive(Debug)]
struct Permit {
    admission: Arc<Admission>,
    peer: Option<IpAddr>,
}

impl Admission {
    fn new(limits: &Limits) -> Arc<Self> {
        Arc::new(Admission {
            connections: limits.connections,
            connections_per_peer: limits.connections_per_peer,
            held: Mutex::default(),
        })
    }

    fn admit(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<Permit, Refusal> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = peer.and_then(|ip| held.by_peer.get_mut(&ip))
            && count.open >= self.connections_per_peer
        {
            let first = !count.refused;
            count.refused = true;
            return Err(Refusal::Peer { first });
        }
        if held.total >= self.connections {
            let first = !held.refused_full;
            held.refused_full = true;
            return Err(Refusal::Listener { first });
        }
        held.total += 1;
        if let Some(ip) = peer {
            held.by_peer.entry(ip).or_default().open += 1;
        }
        Ok(Permit { admission: self.clone(), peer })
    }

    fn release(&self, peer: Option<IpAddr>) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.total = held.total.saturating_sub(1);
        held.refused_full = false;
        let Some(ip) = peer else { return };
        if let Some(count) = held.by_peer.get_mut(&ip) {
            count.open = count.open.saturating_sub(1);
            if count.open == 0 {
                held.by_peer.remove(&ip);
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.admission.release(self.peer);
    }
}

/// An admitted connection's socket, holding its place in the listener's bounds until it is
/// dropped: when the connection ends, or, once it is upgraded (exec, attach, port-forward), when
/// the session that took it over ends.
pub struct Admitted<T> {
    io: T,
    _permit: Permit,
}

impl<T: AsyncRead + Unpin> AsyncRead for Admitted<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Admitted<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
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

/// An error that ended one connection.
pub(crate) type ConnectionError = Box<dyn std::error::Error + Send + Sync>;

/// Accepts connections on `listener` until `cancel`, and serves each one admitted by `limits`
/// with `serve`; returns once every connection has ended.
pub(crate) async fn accept_until_cancelled<L, S, F>(
    mut listener: L,
    limits: &Limits,
    what: &'static str,
    cancel: CancellationToken,
    serve: S,
) where
    L: Listener,
    L::Addr: Peer,
    S: Fn(Admitted<L::Io>) -> F,
    F: Future<Output = Result<(), ConnectionError>> + Send + 'static,
{
    let admission = Admission::new(limits);
    let connections = TaskTracker::new();
    loop {
        let (io, address) = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let peer = address.peer_ip();
        let permit = match admission.admit(peer) {
            Ok(permit) => permit,
            Err(refusal) => {
                tell_of(refusal, what, peer, limits);
                continue;
            }
        };
        let connection = serve(Admitted { io, _permit: permit });
        connections.spawn(async move {
            if let Err(error) = connection.await {
                debug!(peer = ?peer, %error, "{what} connection ended");
            }
        });
    }
    connections.close();
    connections.wait().await;
}

/// Logs a refused connection once per spell: when the port is first full, and when a peer
/// first holds its share (a flood is not a line per connection).
fn tell_of(refusal: Refusal, what: &str, peer: Option<IpAddr>, limits: &Limits) {
    match refusal {
        Refusal::Listener { first: true } => {
            warn!(peer = ?peer, bound = limits.connections, "{what}: refusing connections, the port holds its bound");
        }
        Refusal::Listener { first: false } => {}
        Refusal::Peer { first: true } => warn!(
            peer = ?peer,
            bound = limits.connections_per_peer,
            "{what}: refusing connections from a peer that holds its share of the port"
        ),
        Refusal::Peer { first: false } => {}
    }
}

/// Serves `router` over HTTP/1.1 on `listener` within `limits` until `cancel`.
pub async fn serve_router<L>(listener: L, router: Router, limits: Limits, what: &'static str, cancel: CancellationToken)
where
    L: Listener,
    L::Addr: Peer,
{
    let connection_cancel = cancel.clone();
    let builder = limits.http1();
    accept_until_cancelled(listener, &limits, what, cancel, move |io| {
        serve_http(builder.clone(), io, TowerToHyperService::new(router.clone()), connection_cancel.clone())
    })
    .await;
}

/// One connection's HTTP/1.1 (with upgrades) until the client or `cancel` ends it.
pub(crate) async fn serve_http<I, S, B>(
    builder: http1::Builder,
    io: I,
    service: S,
    cancel: CancellationToken,
) -> Result<(), ConnectionError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<ConnectionError>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<ConnectionError>,
{
    let serving = builder.serve_connection(TokioIo::new(io), service).with_upgrades();
    tokio::pin!(serving);
    tokio::select! {
        result = serving.as_mut() => result?,
        () = cancel.cancelled() => {
            serving.as_mut().graceful_shutdown();
            serving.await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(connections: usize, connections_per_peer: usize) -> Limits {
        Limits { connections, connections_per_peer, ..Limits::default() }
    }

    #[test]
    fn a_peer_holds_its_share_and_the_listener_its_bound() {
        let admission = Admission::new(&limits(3, 2));
        let (a, b) = (Some(IpAddr::from([10, 0, 0, 1])), Some(IpAddr::from([10, 0, 0, 2])));
        let first = admission.admit(a).unwrap();
        let _second = admission.admit(a).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Refusal::Peer { first: true });
        assert_eq!(admission.admit(a).unwrap_err(), Refusal::Peer { first: false }, "told of once");
        let _third = admission.admit(b).unwrap();
        assert_eq!(admission.admit(b).unwrap_err(), Refusal::Listener { first: true }, "the port is full");
        assert_eq!(admission.admit(None).unwrap_err(), Refusal::Listener { first: false }, "told of once");
        let c = IpAddr::from([10, 0, 0, 3]);
        assert_eq!(admission.admit(Some(c)).unwrap_err(), Refusal::Listener { first: false });
        assert!(!admission.held.lock().unwrap().by_peer.contains_key(&c), "a refused peer is not kept");
        drop(first);
        let again = admission.admit(a).unwrap();
        assert_eq!(admission.held.lock().unwrap().total, 3);
        assert_eq!(admission.admit(None).unwrap_err(), Refusal::Listener { first: true }, "full again: a new spell");
        drop(again);
    }

    #[test]
    fn a_peer_that_leaves_is_forgotten() {
        let admission = Admission::new(&limits(8, 1));
        let peer = Some(IpAddr::from([10, 0, 0, 1]));
        let permit = admission.admit(peer).unwrap();
        assert!(admission.admit(peer).is_err());
        drop(permit);
        let held = admission.held.lock().unwrap();
        assert_eq!((held.total, held.by_peer.len()), (0, 0), "no entry stays for a peer with no connection");
    }

    #[test]
    fn an_ipv4_client_of_a_dual_stack_socket_is_its_ipv4_peer_and_an_ipv6_one_its_64() {
        let mapped: std::net::SocketAddr = "[::ffff:10.0.0.1]:443".parse().unwrap();
        assert_eq!(mapped.peer_ip(), Some(IpAddr::from([10, 0, 0, 1])));
        let one: std::net::SocketAddr = "[2001:db8:1:2:aaaa::1]:443".parse().unwrap();
        let other: std::net::SocketAddr = "[2001:db8:1:2:bbbb::9]:443".parse().unwrap();
        assert_eq!(one.peer_ip(), other.peer_ip(), "one /64");
        assert_eq!(one.peer_ip(), Some("2001:db8:1:2::".parse().unwrap()));
    }
}
