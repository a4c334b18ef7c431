//! What the binary's integration tests share.

use std::{
    path::Path,
    process::{Command, Stdio},
};

/// The agent as upstream's kubelet is started (flags, no subcommand) on `endpoint` as node
/// `node`, with every directory under `dir` (`manifests`, `root`, `pods`, `containers`, `pki`)
/// and its log in `dir/agent.log`.
#[allow(dead_code)]
pub(crate) fn agent_command(endpoint: &str, dir: &Path, node: &str) -> Command {
    agent_command_in(Command::new(env!("CARGO_BIN_EXE_kubelet-rs")), endpoint, dir, node)
}

/// The agent, as [`agent_command`] starts it, with its soft limit on open files at `soft` (as a
/// shell's default leaves it), through util-linux's `prlimit`, which runs it in its own place.
#[allow(dead_code)]
pub(crate) fn agent_command_with_open_files(soft: u32, endpoint: &str, dir: &Path, node: &str) -> Command {
    let mut prlimit = Command::new("prlimit");
    prlimit.arg(format!("--nofile={soft}:")).arg(env!("CARGO_BIN_EXE_kubelet-rs"));
    agent_command_in(prlimit, endpoint, dir, node)
}

/// `command` (the binary, or what runs it) given the agent's flags, environment and log.
fn agent_command_in(mut command: Command, endpoint: &str, dir: &Path, node: &str) -> Command {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("agent.log")).unwrap();
    command
        .args(["--container-runtime-endpoint", endpoint, "--hostname-override", node])
        .arg("--pod-manifest-path")
        .arg(dir.join("manifests"))
        .arg("--root-dir")
        .arg(dir.join("root"))
        .arg("--pod-logs-dir")
        .arg(dir.join("pods"))
        .arg("--container-logs-dir")
        .arg(dir.join("containers"))
        .arg("--cert-dir")
        .arg(dir.join("pki"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log);
    command
}

/// A TCP port nothing listens on now, for an agent's kubelet API.
#[allow(dead_code)]
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// What the test's pods hold: the pods in the runtime that `ours` says are the test's, and every
/// pod directory, mount below them, log directory and container log link of the agent running
/// in `dir` (each test has a scratch directory of its own, so all of them are the test's).
#[allow(dead_code)]
pub(crate) async fn pods_left(
    runtime: &cri_client::manager::CriRuntime,
    dir: &Path,
    ours: impl Fn(&kubelet_core::runtime::Pod) -> bool,
) -> Vec<String> {
    use kubelet_core::Runtime;
    let pods = runtime.get_pods(true).await.unwrap();
    let mut left: Vec<String> =
        pods.iter().filter(|p| ours(p)).map(|p| format!("pod {}/{} in the runtime", p.namespace, p.name)).collect();
    for (sub, what) in [("root/pods", "pod directory"), ("pods", "log directory"), ("containers", "log link")] {
        let entries = std::fs::read_dir(dir.join(sub)).into_iter().flatten();
        left.extend(entries.map(|e| format!("{what} {}", e.unwrap().file_name().to_string_lossy())));
    }
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let pods_dir = dir.join("root/pods");
    let mounts = kubelet_core::volume::mount_points(&table).filter(|p| Path::new(p).starts_with(&pods_dir));
    left.extend(mounts.map(|p| format!("mount {p}")));
    left
}

/// Unmounts whatever is mounted below `dir`, deepest first: what a failed test leaves would
/// otherwise confuse the next one.
#[allow(dead_code)]
pub(crate) fn unmount_below(dir: &Path) {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let below: Vec<String> =
        kubelet_core::volume::mount_points(&table).filter(|p| Path::new(p).starts_with(dir)).collect();
    for point in below.iter().rev() {
        let _ = std::process::Command::new("umount").arg(point).status();
    }
}

/// A TLS client that trusts whatever certificate the agent's kubelet API presents: the tests
/// that use it are about the port, not about TLS.
#[allow(dead_code)]
pub(crate) fn trusting_connector() -> tokio_rustls::TlsConnector {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(AnyServer))
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

/// Trusts whatever certificate the agent presents: the attack is on the port, not on TLS.
#[derive(Debug)]
struct AnyServer;

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &rustls::pki_types::CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &rustls::pki_types::CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider().signature_verification_algorithms.supported_schemes()
    }
}
