//! What the binary's integration tests share.

use std::{
    path::Path,
    process::{Command, Stdio},
};

/// The agent as upstream's kubelet is started (flags, no subcommand) on `endpoint` as node
/// `node`, with every directory under `dir` (`manifests`, `root`, `pods`, `containers`, `pki`)
/// and its log in `dir/agent.log`.
pub(crate) fn agent_command(endpoint: &str, dir: &Path, node: &str) -> Command {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("agent.log")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_kubelet-rs"));
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
