//! The binary's ports against a hostile client, as a pod on the node could play it: floods of
//! idle connections and of request heads that never end, from one peer, on the kubelet API
//! (TLS), the read-only port and the healthz port of an agent on the fake runtime.
//!
//! Each attack prints what it held of the agent; each asserts bounds well above normal use and
//! well below harm: the flooding peer holds its share of a port and no more, the agent's open
//! files grow by no more than that share, a well-behaved peer is served within a second, and
//! every file comes back when the attacker goes.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::{
    net::SocketAddr,
    path::Path,
    process::{Child, Command},
    time::Duration,
};

use tokio::{io::AsyncWriteExt, net::TcpStream};

/// The share of a port one peer may hold (`kubelet_server::Limits::default`).
const SHARE_PER_PEER: usize = 256;
/// Connections each attack opens.
const FLOOD: usize = 2000;
/// Files the agent may open beside the attacker's share while it is flooded (its own watches,
/// the runtime's, a log file).
const SLACK: usize = 64;

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent's three ports.
struct Ports {
    kubelet_api: u16,
    read_only: u16,
    healthz: u16,
}

/// The agent on the fake runtime with the kubelet API (anonymous, always allowed), the
/// read-only and healthz ports on 127.0.0.1; returns once the read-only port lists its pod.
async fn start(dir: &Path, ports: &Ports) -> Agent {
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    std::fs::write(
        dir.join("manifests/web.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - {name: app, image: busybox}\n",
    )
    .unwrap();
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\naddress: 127.0.0.1\n\
             port: {}\nreadOnlyPort: {}\nhealthzPort: {}\nhealthzBindAddress: 127.0.0.1\n\
             authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}\n\
             authorization: {{mode: AlwaysAllow}}\n",
            ports.kubelet_api, ports.read_only, ports.healthz
        ),
    )
    .unwrap();
    // Started with a shell's soft limit on open files, which the agent raises.
    let mut command = common::agent_command_with_open_files(1024, "fake://", dir, "fake");
    let child = command.arg("--config").arg(&config).spawn().unwrap();
    let agent = Agent(child);
    for _ in 0..200 {
        if curl("127.0.0.1", "http", ports.read_only, "/pods").1.contains("web-fake") {
            return agent;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the read-only port did not list the pod within 20 s");
}

/// `GET path` from `source` with at most a second for the whole exchange: the status (0 when
/// refused or late), the body and the seconds it took.
fn curl(source: &str, scheme: &str, port: u16, path: &str) -> (u16, String, f64) {
    let output = Command::new("curl")
        .args(["-sk", "--max-time", "1", "--interface", source, "-w", "\n%{http_code} %{time_total}"])
        .arg(format!("{scheme}://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl (`cargo xtask setup` installs it)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, figures) = text.rsplit_once('\n').unwrap_or(("", "0 0"));
    let (code, seconds) = figures.split_once(' ').unwrap_or(("0", "0"));
    (code.parse().unwrap_or(0), body.to_owned(), seconds.trim().parse().unwrap_or(0.0))
}

/// The files the process `pid` holds open.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// The agent's soft and hard limits on open files.
fn open_files_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_owned();
    let mut numbers = line.split_whitespace().skip(3);
    (numbers.next().unwrap().to_owned(), numbers.next().unwrap().to_owned())
}

/// Lets this test hold the flood: its soft limit on open files up to the hard one.
fn raise_own_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(hard as usize > 3 * FLOOD, "the hard limit on open files ({hard}) is too low for the test");
}

/// Opens `count` connections to `port` from `source`, sending `head` on each (a request head
/// that never ends, or nothing); returns those the agent still holds once it has had time to
/// close the ones over its bound.
async fn flood(source: [u8; 4], port: u16, count: usize, head: &[u8]) -> Vec<TcpStream> {
    let mut streams = Vec::with_capacity(count);
    for _ in 0..count {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((source, 0))).unwrap();
        let mut stream = socket.connect(SocketAddr::from(([127, 0, 0, 1], port))).await.unwrap();
        // A refused connection may be closed before the head is written.
        let _ = stream.write_all(head).await;
        streams.push(stream);
    }
    // The agent closes what is over its bounds as it accepts; wait until the count holds still.
    let mut open = streams.iter().filter(|s| still_open(s)).count();
    for _ in 0..25 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = streams.iter().filter(|s| still_open(s)).count();
        if now == open {
            break;
        }
        open = now;
    }
    streams.into_iter().filter(still_open).collect()
}

/// Whether the agent has not closed `stream` (nothing to read, no end of stream).
fn still_open(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// Opens `count` TLS connections to `port` from 127.0.0.1 and finishes each handshake; returns
/// those the agent admitted (the others are closed before their handshake).
async fn flood_tls(port: u16, count: usize) -> Vec<tokio_rustls::client::TlsStream<TcpStream>> {
    let connector = common::trusting_connector();
    let mut handshakes = tokio::task::JoinSet::new();
    for _ in 0..count {
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let connector = connector.clone();
        handshakes.spawn(async move {
            let name = rustls::pki_types::ServerName::try_from("fake").unwrap();
            tokio::time::timeout(Duration::from_secs(10), connector.connect(name, stream)).await.ok()?.ok()
        });
    }
    let mut admitted = Vec::new();
    while let Some(handshake) = handshakes.join_next().await {
        admitted.extend(handshake.unwrap());
    }
    admitted
}

/// What one attack found, printed and checked.
struct Held {
    port: String,
    held: usize,
    files_before: usize,
    files_during: usize,
}

impl Held {
    fn check(&self) {
        let grown = self.files_during.saturating_sub(self.files_before);
        println!(
            "{}: the attacker holds {} of {FLOOD} connections; the agent's open files {} -> {} (+{grown})",
            self.port, self.held, self.files_before, self.files_during
        );
        assert_eq!(self.held, SHARE_PER_PEER, "{}: the flooding peer holds its share, no more", self.port);
        assert!(grown <= SHARE_PER_PEER + SLACK, "{}: the agent's open files grew by {grown}", self.port);
    }
}

/// A well-behaved peer (127.0.0.2) is served within a second while the flood holds, and the
/// flooding peer (127.0.0.1) is refused more.
fn check_served(what: &str, scheme: &str, port: u16, path: &str) {
    let (code, body, seconds) = curl("127.0.0.2", scheme, port, path);
    println!("{what}: another peer served {code} in {:.1} ms", seconds * 1000.0);
    assert_eq!(code, 200, "{what}: another peer is served within a second: {body}");
    assert_eq!(curl("127.0.0.1", scheme, port, path).0, 0, "{what}: the flooding peer is refused more");
}

/// Waits (at most 5 s) for the agent to hold no more files than `bound`; returns what it holds.
async fn files_settle(pid: u32, bound: usize) -> usize {
    for _ in 0..50 {
        if open_files(pid) <= bound {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    open_files(pid)
}

/// 2,000 idle connections (TLS finished on the kubelet API), then 2,000 request heads that never
/// end, from one peer on each port: the peer holds its share and no more, the agent's open files
/// stay bounded, another peer is still served within a second, and the files come back when the
/// attacker goes. The agent raised its soft limit on open files to the hard one at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_from_one_peer_hold_only_its_share_of_each_port() {
    raise_own_open_files_limit();
    let dir = tempfile::tempdir().unwrap();
    let ports =
        Ports { kubelet_api: common::free_port(), read_only: common::free_port(), healthz: common::free_port() };
    let agent = start(dir.path(), &ports).await;
    let pid = agent.0.id();
    let (soft, hard) = open_files_limits(pid);
    assert_eq!(soft, hard, "the agent raised its soft limit on open files (1024 at start) to the hard one");

    let files_before = open_files(pid);
    let admitted = flood_tls(ports.kubelet_api, FLOOD).await;
    let port = "kubelet API (idle TLS)".to_owned();
    Held { port, held: admitted.len(), files_before, files_during: open_files(pid) }.check();
    check_served("kubelet API", "https", ports.kubelet_api, "/healthz");
    drop(admitted);
    let settled = files_settle(pid, files_before + 8).await;
    assert!(settled <= files_before + 8, "kubelet API: the agent gave back its files ({settled} open)");
    let files_before = settled;

    let plain = [("read-only port", ports.read_only, "/pods"), ("healthz port", ports.healthz, "/healthz")];
    for (port_name, port, path) in plain {
        let attacks: [(&str, &[u8]); 2] =
            [("idle", b""), ("endless heads", b"GET /healthz HTTP/1.1\r\nHost: node\r\nX-Slow: ")];
        for (attack, head) in attacks {
            let held_streams = flood([127, 0, 0, 1], port, FLOOD, head).await;
            let name = format!("{port_name} ({attack})");
            let files_during = open_files(pid);
            Held { port: name.clone(), held: held_streams.len(), files_before, files_during }.check();
            check_served(&name, "http", port, path);
            drop(held_streams);
            let settled = files_settle(pid, files_before + 8).await;
            assert!(settled <= files_before + 8, "{name}: the agent gave back its files ({settled} open)");
        }
    }
}

/// The agent's peak resident memory (bytes).
fn peak_resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap().to_owned();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// `GET path` on the kubelet API: the status and the body's bytes.
fn kubelet_api_bytes(port: u16, path: &str) -> (u16, Vec<u8>) {
    let output = Command::new("curl")
        .args(["-sk", "--max-time", "20", "-w", "\n%{http_code}"])
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl (`cargo xtask setup` installs it)");
    let split = output.stdout.iter().rposition(|b| *b == b'\n').unwrap();
    let code = String::from_utf8_lossy(&output.stdout[split + 1..]).trim().parse().unwrap_or(0);
    (code, output.stdout[..split].to_vec())
}

/// The log directory of the pod's container `app`, where the runtime would write its logs.
fn app_log_dir(dir: &Path, read_only: u16) -> std::path::PathBuf {
    let (_, pods, _) = curl("127.0.0.1", "http", read_only, "/pods");
    let pods: serde_json::Value = serde_json::from_str(&pods).unwrap();
    let uid = pods["items"][0]["metadata"]["uid"].as_str().unwrap().to_owned();
    dir.join(format!("pods/default_web-fake_{uid}/app"))
}

/// A container's log of 500 MB (sparse: what comes before its last lines is a hole) read with
/// `tailLines=1` by eight callers at once: each gets the last line, and the agent's peak
/// resident memory grows by less than 8 MiB (the log was read whole into memory before). A log
/// with bytes that are not UTF-8 is served as it is, every line of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_logs_are_read_from_their_end_and_as_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let ports =
        Ports { kubelet_api: common::free_port(), read_only: common::free_port(), healthz: common::free_port() };
    let agent = start(dir.path(), &ports).await;
    let pid = agent.0.id();
    let logs = app_log_dir(dir.path(), ports.read_only);
    std::fs::create_dir_all(&logs).unwrap();

    let mut raw = b"2026-12-07T10:00:01.000000000Z stdout F before\n".to_vec();
    raw.extend(b"2026-12-07T10:00:02.000000000Z stdout F \xff\xfe not UTF-8 \xc3\x28\n");
    raw.extend(b"2026-12-07T10:00:03.000000000Z stderr F after\n");
    std::fs::write(logs.join("0.log"), &raw).unwrap();
    let (code, body) = kubelet_api_bytes(ports.kubelet_api, "/containerLogs/default/web-fake/app");
    assert_eq!((code, body.as_slice()), (200, &b"before\n\xff\xfe not UTF-8 \xc3\x28\nafter\n"[..]));

    const LOG_BYTES: u64 = 500 << 20;
    // A hole, then the end of a line the hole is the start of, then the last line.
    let last_line = b"\n2026-12-07T10:00:04.000000000Z stdout F the last line\n";
    let file = std::fs::OpenOptions::new().write(true).truncate(true).open(logs.join("0.log")).unwrap();
    file.set_len(LOG_BYTES - last_line.len() as u64).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, last_line, LOG_BYTES - last_line.len() as u64).unwrap();
    drop(file);
    // The peak from here on: the kernel resets it to what the agent holds now.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let before = peak_resident(pid);
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let port = ports.kubelet_api;
            std::thread::spawn(move || kubelet_api_bytes(port, "/containerLogs/default/web-fake/app?tailLines=1"))
        })
        .collect();
    for reader in readers {
        let (code, body) = reader.join().unwrap();
        let shown = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        assert_eq!((code, body.len(), shown.as_str()), (200, 14, "the last line\n"), "the last line alone");
    }
    let grown = peak_resident(pid).saturating_sub(before);
    println!(
        "8 readers of the last line of a {} MB log: the agent's peak resident memory {} -> {} MiB (+{} KiB)",
        LOG_BYTES >> 20,
        before >> 20,
        (before + grown) >> 20,
        grown >> 10
    );
    assert!(grown < 8 << 20, "the agent's peak resident memory grew by {grown} bytes");
}
