//! `kubelet-rs exec POD [-c CONTAINER] [-i] [-t] -- COMMAND...`: a command in a running
//! container of a running agent, through its unix socket and the same `/exec` the kubelet API
//! serves, over WebSocket with Kubernetes' `v4.channel.k8s.io` protocol (the one containerd's
//! streaming server speaks): each binary message starts with its channel, 0 stdin, 1 stdout,
//! 2 stderr, 3 the final status.

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context, Result, bail};
use clap::Args;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest, http::HeaderValue};

/// The channel protocol asked for.
const PROTOCOL: &str = "v4.channel.k8s.io";

/// `kubelet-rs exec`.
#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// The pod's name.
    pod: String,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    command: Vec<String>,
    /// The container (the pod's only container when it has one).
    #[arg(short = 'c', long)]
    container: Option<String>,
    /// The pod's namespace.
    #[arg(short = 'n', long, default_value = "default")]
    namespace: String,
    /// Pass standard input to the command.
    #[arg(short = 'i', long)]
    stdin: bool,
    /// Give the command a terminal (this terminal, in raw mode, when standard input is one).
    #[arg(short = 't', long)]
    tty: bool,
    /// The agent's root directory (where its socket is).
    #[arg(long, default_value = "/var/lib/kubelet")]
    root_dir: PathBuf,
}

pub(crate) fn exec(args: ExecArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(run(args))
}

/// The `/exec` path and query for `args` and `container`.
fn exec_path(args: &ExecArgs, container: &str) -> Result<String> {
    let mut query: Vec<(&str, &str)> = args.command.iter().map(|part| ("command", part.as_str())).collect();
    query.push(("output", "1"));
    if args.stdin {
        query.push(("input", "1"));
    }
    if args.tty {
        query.push(("tty", "1"));
    } else {
        query.push(("error", "1"));
    }
    let query = serde_urlencoded::to_string(&query).context("the command")?;
    Ok(format!("/exec/{}/{}/{container}?{query}", args.namespace, args.pod))
}

async fn run(args: ExecArgs) -> Result<ExitCode> {
    let socket = kubelet::server::socket_path(&args.root_dir);
    let container = match &args.container {
        Some(container) => container.clone(),
        None => crate::cli::only_container(&socket, &args.namespace, &args.pod).await?,
    };
    let socket_stream =
        open_channels(&socket, &exec_path(&args, &container)?).await.context("cannot start the command")?;
    let _raw = if args.tty { RawTerminal::enter() } else { None };
    let (mut to_agent, mut from_agent) = socket_stream.split();
    let forward_stdin = async {
        if !args.stdin {
            return std::future::pending::<Result<()>>().await;
        }
        // v4 has no way to close stdin alone; the command sees it open until it ends.
        send_on_channel_0(tokio::io::stdin(), &mut to_agent).await
    };
    let print_output = async {
        let (mut stdout, mut stderr) = (tokio::io::stdout(), tokio::io::stderr());
        while let Some(message) = from_agent.next().await {
            let Message::Binary(data) = message? else { continue };
            match data.split_first() {
                Some((1, out)) => {
                    stdout.write_all(out).await?;
                    stdout.flush().await?;
                }
                Some((2, err)) => {
                    stderr.write_all(err).await?;
                    stderr.flush().await?;
                }
                Some((3, status)) => return Ok(exit_code(status)),
                _ => {}
            }
        }
        Ok::<_, anyhow::Error>(ExitCode::SUCCESS)
    };
    tokio::select! {
        code = print_output => code,
        failed = forward_stdin => Err(failed.err().unwrap_or_else(|| anyhow::anyhow!("stdin ended"))),
    }
}

/// Sends what `reader` reads as channel 0's messages; at its end, waits for ever, since
/// `v4.channel.k8s.io` cannot close one channel alone.
pub(crate) async fn send_on_channel_0(
    mut reader: impl tokio::io::AsyncRead + Unpin,
    sink: &mut (impl futures::Sink<Message, Error = tungstenite::Error> + Unpin),
) -> Result<()> {
    let mut buffer = vec![0u8; 32 * 1024];
    loop {
        let read = reader.read(&mut buffer[1..]).await?;
        if read == 0 {
            return std::future::pending::<Result<()>>().await;
        }
        buffer[0] = 0;
        sink.send(Message::binary(buffer[..=read].to_vec())).await?;
    }
}

/// A WebSocket to `path` on the agent's socket, speaking `v4.channel.k8s.io`.
pub(crate) async fn open_channels(
    socket: &std::path::Path,
    path: &str,
) -> Result<tokio_tungstenite::WebSocketStream<tokio::net::UnixStream>> {
    let mut request = format!("ws://localhost{path}").into_client_request()?;
    request.headers_mut().insert("Sec-WebSocket-Protocol", HeaderValue::from_static(PROTOCOL));
    let stream = crate::cli::connect(socket).await?;
    match tokio_tungstenite::client_async(request, stream).await {
        Ok((connected, _)) => Ok(connected),
        Err(tungstenite::Error::Http(response)) => {
            let body = response.body().as_deref().map(String::from_utf8_lossy).unwrap_or_default();
            bail!("the agent answered {}: {}", response.status(), body.trim());
        }
        Err(e) => Err(e.into()),
    }
}

/// The exit code a final status says: 0 for `Success`, the `ExitCode` cause's for a command
/// that failed, 1 (after printing why) for anything else.
fn exit_code(status: &[u8]) -> ExitCode {
    let status: serde_json::Value = serde_json::from_slice(status).unwrap_or_default();
    if status["status"] == "Success" {
        return ExitCode::SUCCESS;
    }
    let causes = status["details"]["causes"].as_array().cloned().unwrap_or_default();
    let code =
        causes.iter().find(|c| c["reason"] == "ExitCode").and_then(|c| c["message"].as_str()?.parse::<u8>().ok());
    match code {
        Some(code) => ExitCode::from(code),
        None => {
            eprintln!("error: {}", status["message"].as_str().unwrap_or("the command failed"));
            ExitCode::FAILURE
        }
    }
}

/// This terminal in raw mode while the value lives, as `kubectl exec -t` puts it.
struct RawTerminal(nix::sys::termios::Termios);

impl RawTerminal {
    /// Raw mode, when standard input is a terminal.
    fn enter() -> Option<Self> {
        use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let saved = tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(&stdin, SetArg::TCSANOW, &raw).ok()?;
        Some(RawTerminal(saved))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSANOW, &self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_final_status_gives_the_exit_code() {
        let failure = br#"{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        assert_eq!(exit_code(failure), ExitCode::from(3));
        assert_eq!(exit_code(br#"{"metadata":{},"status":"Success"}"#), ExitCode::SUCCESS);
        assert_eq!(exit_code(br#"{"status":"Failure","message":"no such file"}"#), ExitCode::FAILURE);
    }

    #[test]
    fn the_query_carries_the_command_and_streams_as_upstream_names_them() {
        let args = ExecArgs {
            pod: "web".to_owned(),
            command: vec!["sh".to_owned(), "-c".to_owned(), "echo a&b".to_owned()],
            container: None,
            namespace: "default".to_owned(),
            stdin: true,
            tty: false,
            root_dir: PathBuf::from("/var/lib/kubelet"),
        };
        assert_eq!(
            exec_path(&args, "app").unwrap(),
            "/exec/default/web/app?command=sh&command=-c&command=echo+a%26b&output=1&input=1&error=1"
        );
    }
}
