//! `kubelet-rs port-forward POD [LOCAL:]REMOTE...`: local TCP ports forwarded to a running pod
//! of a running agent, through its unix socket and the same `/portForward` the kubelet API
//! serves. Each accepted connection gets its own WebSocket (`v4.channel.k8s.io`), on which
//! channel 0 carries the data and channel 1 the runtime's errors, each opened by the port
//! number (two bytes, little-endian), as Kubernetes' port-forward protocol has it.

use std::{net::IpAddr, path::PathBuf, process::ExitCode};

use anyhow::{Context, Result, bail};
use clap::Args;
use futures::StreamExt;
use tokio::{
    io::AsyncWriteExt,
    net::{TcpListener, TcpStream},
};
use tokio_tungstenite::tungstenite::Message;

/// `kubelet-rs port-forward`.
#[derive(Debug, Args)]
pub(crate) struct PortForwardArgs {
    /// The pod's name.
    pod: String,
    /// The ports: `REMOTE` (the same port here), `LOCAL:REMOTE`, or `:REMOTE` (any free port here).
    #[arg(required = true)]
    ports: Vec<String>,
    /// The pod's namespace.
    #[arg(short = 'n', long, default_value = "default")]
    namespace: String,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    address: IpAddr,
    /// The agent's root directory (where its socket is).
    #[arg(long, default_value = "/var/lib/kubelet")]
    root_dir: PathBuf,
}

/// One forwarded port: where it listens here, and the pod's port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Forward {
    local: u16,
    remote: u16,
}

impl Forward {
    /// `REMOTE`, `LOCAL:REMOTE` or `:REMOTE`, as kubectl reads them.
    fn parse(text: &str) -> Result<Self> {
        let port = |p: &str| p.parse::<u16>().with_context(|| format!("{p:?} in {text:?} is not a port"));
        match text.split_once(':') {
            None => {
                let remote = port(text)?;
                Ok(Forward { local: remote, remote })
            }
            Some(("", remote)) => Ok(Forward { local: 0, remote: port(remote)? }),
            Some((local, remote)) => Ok(Forward { local: port(local)?, remote: port(remote)? }),
        }
        .and_then(|forward| match forward.remote {
            0 => bail!("{text:?}: the pod's port cannot be 0"),
            _ => Ok(forward),
        })
    }
}

pub(crate) fn port_forward(args: PortForwardArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(run(args))
}

async fn run(args: PortForwardArgs) -> Result<ExitCode> {
    let forwards: Vec<Forward> = args.ports.iter().map(|p| Forward::parse(p)).collect::<Result<_>>()?;
    let socket = kubelet::server::socket_path(&args.root_dir);
    // The pod must exist before anything listens.
    crate::cli::find_pod(&socket, &args.namespace, &args.pod).await?;
    let mut listening = tokio::task::JoinSet::new();
    for forward in forwards {
        let listener = TcpListener::bind((args.address, forward.local))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.address, forward.local))?;
        println!("Forwarding from {} -> {}", listener.local_addr()?, forward.remote);
        let path = format!("/portForward/{}/{}?port={}", args.namespace, args.pod, forward.remote);
        listening.spawn(accept(listener, socket.clone(), path));
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Ok(ExitCode::SUCCESS),
        Some(ended) = listening.join_next() => {
            ended.context("a listener stopped")??;
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Accepts connections on `listener` and forwards each through its own WebSocket to `path`.
async fn accept(listener: TcpListener, socket: PathBuf, path: String) -> Result<()> {
    loop {
        let (connection, peer) = listener.accept().await?;
        println!("Handling connection for {}", listener.local_addr()?.port());
        let (socket, path) = (socket.clone(), path.clone());
        tokio::spawn(async move {
            if let Err(err) = forward_one(connection, &socket, &path).await {
                eprintln!("error: forwarding the connection from {peer}: {err:#}");
            }
        });
    }
}

/// Carries one connection's bytes both ways until the pod's side ends.
async fn forward_one(connection: TcpStream, socket: &std::path::Path, path: &str) -> Result<()> {
    let channels = crate::exec::open_channels(socket, path).await?;
    let (mut to_pod, mut from_pod) = channels.split();
    let (local_reader, mut local_writer) = connection.into_split();
    // At the local end of input, the pod's answer still comes back.
    let send = crate::exec::send_on_channel_0(local_reader, &mut to_pod);
    let receive = async {
        // Each channel opens with the port number, which is not data.
        let mut port_prefix_pending = [true, true];
        while let Some(message) = from_pod.next().await {
            let Message::Binary(data) = message? else { continue };
            let Some((&channel, mut payload)) = data.split_first() else { continue };
            let channel = usize::from(channel);
            if let Some(pending) = port_prefix_pending.get_mut(channel).filter(|pending| **pending) {
                *pending = false;
                payload = payload.get(2..).unwrap_or_default();
            }
            match channel {
                0 => local_writer.write_all(payload).await?,
                1 if !payload.is_empty() => bail!("{}", String::from_utf8_lossy(payload).trim()),
                _ => {}
            }
        }
        local_writer.shutdown().await?;
        Ok(())
    };
    tokio::select! {
        received = receive => received,
        sent = send => sent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_read_as_kubectl_reads_them() {
        assert_eq!(Forward::parse("8080").unwrap(), Forward { local: 8080, remote: 8080 });
        assert_eq!(Forward::parse("9000:80").unwrap(), Forward { local: 9000, remote: 80 });
        assert_eq!(Forward::parse(":80").unwrap(), Forward { local: 0, remote: 80 });
        for bad in ["http", "80:", "70000", "9000:0"] {
            assert!(Forward::parse(bad).is_err(), "{bad}");
        }
    }
}
