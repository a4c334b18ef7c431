//! Operator commands that talk to a running agent over its unix socket:
//! `kubelet-rs get pods` and `kubelet-rs logs`.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;

/// `kubelet-rs get`.
#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    #[command(subcommand)]
    what: GetWhat,
}

#[derive(Debug, Subcommand)]
enum GetWhat {
    /// The agent's pods, with the statuses it computed.
    #[command(alias = "pod", alias = "po")]
    Pods(GetPodsArgs),
}

#[derive(Debug, Args)]
struct GetPodsArgs {
    /// Output format.
    #[arg(short = 'o', long, value_enum)]
    output: Option<Output>,
    /// Print the table again whenever it changes.
    #[arg(short = 'w', long)]
    watch: bool,
    /// The agent's root directory (where its socket is).
    #[arg(long, default_value = "/var/lib/kubelet")]
    root_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// The table with more columns.
    Wide,
    /// The PodList as JSON.
    Json,
    /// The PodList as YAML.
    Yaml,
}

/// `kubelet-rs logs`.
#[derive(Debug, Args)]
pub(crate) struct LogsArgs {
    /// The pod's name.
    pod: String,
    /// The container (the pod's only container when it has one).
    #[arg(short = 'c', long)]
    container: Option<String>,
    /// The pod's namespace.
    #[arg(short = 'n', long, default_value = "default")]
    namespace: String,
    /// Keep printing new output.
    #[arg(short = 'f', long)]
    follow: bool,
    /// The previous instance of the container (before its last restart).
    #[arg(short = 'p', long)]
    previous: bool,
    /// Only the last N lines.
    #[arg(long)]
    tail: Option<usize>,
    /// Prefix each line with its RFC 3339 timestamp.
    #[arg(long)]
    timestamps: bool,
    /// The agent's root directory (where its socket is).
    #[arg(long, default_value = "/var/lib/kubelet")]
    root_dir: PathBuf,
}

pub(crate) fn get(args: GetArgs) -> Result<ExitCode> {
    let GetWhat::Pods(args) = args.what;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(get_pods(args))
}

pub(crate) fn logs(args: LogsArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(container_logs(args))
}

async fn get_pods(args: GetPodsArgs) -> Result<ExitCode> {
    let socket = crate::api::socket_path(&args.root_dir);
    let mut shown = String::new();
    loop {
        let (status, body) = request(&socket, "/pods").await?;
        if status != 200 {
            bail!("the agent answered {status}: {}", String::from_utf8_lossy(&body));
        }
        let list: serde_json::Value = serde_json::from_slice(&body).context("the agent's /pods is not JSON")?;
        let text = match args.output {
            Some(Output::Json) => format!("{}\n", serde_json::to_string_pretty(&list)?),
            Some(Output::Yaml) => serde_saphyr::to_string(&list).context("YAML output")?,
            wide => {
                let pods: Vec<Pod> = serde_json::from_value(list["items"].clone()).context("the agent's pods")?;
                table(&pods, wide == Some(Output::Wide), unix_now())
            }
        };
        if text != shown {
            print!("{text}");
            std::io::stdout().flush()?;
            shown = text;
        }
        if !args.watch {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        if args.output.is_none() || args.output == Some(Output::Wide) {
            println!();
        }
    }
}

async fn container_logs(args: LogsArgs) -> Result<ExitCode> {
    let socket = crate::api::socket_path(&args.root_dir);
    let container = match args.container {
        Some(container) => container,
        None => {
            let (_, body) = request(&socket, "/pods").await?;
            let list: serde_json::Value = serde_json::from_slice(&body).context("the agent's /pods is not JSON")?;
            let pods: Vec<Pod> = serde_json::from_value(list["items"].clone())?;
            let pod = pods
                .iter()
                .find(|p| {
                    p.metadata.name.as_deref() == Some(&args.pod)
                        && p.metadata.namespace.as_deref().unwrap_or("default") == args.namespace
                })
                .with_context(|| format!("pod {}/{} not found", args.namespace, args.pod))?;
            let names: Vec<&str> = pod.spec.iter().flat_map(|s| s.containers.iter()).map(|c| c.name.as_str()).collect();
            match names[..] {
                [one] => one.to_owned(),
                _ => bail!("pod {} has containers {}: choose one with -c", args.pod, names.join(", ")),
            }
        }
    };
    let mut path = format!(
        "/containerLogs/{}/{}/{container}?follow={}&previous={}&timestamps={}",
        args.namespace, args.pod, args.follow, args.previous, args.timestamps
    );
    if let Some(tail) = args.tail {
        path.push_str(&format!("&tailLines={tail}"));
    }
    let response = send(&socket, &path).await?;
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut out = std::io::stdout().lock();
    let mut failed = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame.context("reading the logs")?.data_ref() {
            if status == 200 {
                out.write_all(data)?;
                out.flush()?;
            } else {
                failed.extend_from_slice(data);
            }
        }
    }
    if status != 200 {
        bail!("{}", String::from_utf8_lossy(&failed).trim());
    }
    Ok(ExitCode::SUCCESS)
}

/// A GET on the agent's socket: the status and the whole body.
async fn request(socket: &Path, path: &str) -> Result<(u16, Vec<u8>)> {
    let response = send(socket, path).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.context("reading the agent's answer")?.to_bytes();
    Ok((status, body.to_vec()))
}

async fn send(socket: &Path, path: &str) -> Result<hyper::Response<hyper::body::Incoming>> {
    let stream = tokio::net::UnixStream::connect(socket).await.with_context(|| {
        format!(
            "cannot reach the agent at {} (is `kubelet-rs run` running with this --root-dir, and are you root?)",
            socket.display()
        )
    })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, "localhost")
        .body(http_body_util::Empty::<hyper::body::Bytes>::new())?;
    Ok(sender.send_request(request).await?)
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// `kubectl get pods`'s table: NAME, READY, STATUS, RESTARTS, AGE, IP (and NAMESPACE, NODE
/// with `wide`).
fn table(pods: &[Pod], wide: bool, now: i64) -> String {
    let mut rows = vec![if wide {
        vec!["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
            .into_iter()
            .map(str::to_owned)
            .collect()
    } else {
        vec!["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"].into_iter().map(str::to_owned).collect::<Vec<_>>()
    }];
    let mut pods: Vec<&Pod> = pods.iter().collect();
    pods.sort_by_key(|p| (p.metadata.namespace.clone(), p.metadata.name.clone()));
    for pod in pods {
        let status = pod.status.clone().unwrap_or_default();
        let statuses = status.container_statuses.clone().unwrap_or_default();
        let total = pod.spec.as_ref().map_or(0, |s| s.containers.len());
        let ready = statuses.iter().filter(|c| c.ready).count();
        let restarts: i32 = statuses.iter().map(|c| c.restart_count).sum();
        let started = status
            .start_time
            .as_ref()
            .map(|t| t.0.as_second())
            .or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second()));
        let age = started.map_or_else(|| "<unknown>".to_owned(), |s| human_duration(now - s));
        let ip = status.pod_ip.clone().filter(|ip| !ip.is_empty()).unwrap_or_else(|| "<none>".to_owned());
        let mut row = vec![
            pod.metadata.name.clone().unwrap_or_default(),
            format!("{ready}/{total}"),
            pod_status_reason(pod),
            restarts.to_string(),
            age,
            ip,
        ];
        if wide {
            row.insert(0, pod.metadata.namespace.clone().unwrap_or_default());
            row.push(pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| "<none>".to_owned()));
        }
        rows.push(row);
    }
    let widths: Vec<usize> =
        (0..rows[0].len()).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// The STATUS column as kubectl computes it: init progress, a waiting or terminated reason,
/// Terminating, else the phase.
fn pod_status_reason(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let mut reason = status.reason.clone().or(status.phase.clone()).unwrap_or_else(|| "Pending".to_owned());
    let inits = status.init_container_statuses.clone().unwrap_or_default();
    let init_total = pod.spec.as_ref().and_then(|s| s.init_containers.as_ref()).map_or(0, Vec::len);
    let mut initializing = false;
    for (i, init) in inits.iter().enumerate() {
        let state = init.state.clone().unwrap_or_default();
        if let Some(t) = state.terminated.as_ref().filter(|t| t.exit_code != 0) {
            reason = format!("Init:{}", t.reason.clone().unwrap_or_else(|| format!("ExitCode:{}", t.exit_code)));
            initializing = true;
        } else if let Some(w) = state.waiting.as_ref().and_then(|w| w.reason.clone()).filter(|r| r != "PodInitializing")
        {
            reason = format!("Init:{w}");
            initializing = true;
        } else if state.terminated.is_none() {
            reason = format!("Init:{i}/{init_total}");
            initializing = true;
        }
        if initializing {
            break;
        }
    }
    if !initializing {
        let mut has_running = false;
        for container in status.container_statuses.iter().flatten().rev() {
            let state = container.state.clone().unwrap_or_default();
            if let Some(w) = state.waiting.as_ref().and_then(|w| w.reason.clone()).filter(|r| !r.is_empty()) {
                reason = w;
            } else if let Some(t) = state.terminated.as_ref() {
                reason = t.reason.clone().filter(|r| !r.is_empty()).unwrap_or_else(|| {
                    if t.signal.unwrap_or(0) != 0 {
                        format!("Signal:{}", t.signal.unwrap_or(0))
                    } else {
                        format!("ExitCode:{}", t.exit_code)
                    }
                });
            } else if container.ready && state.running.is_some() {
                has_running = true;
            }
        }
        if reason == "Completed" && has_running {
            reason = "Running".to_owned();
        }
    }
    if pod.metadata.deletion_timestamp.is_some() {
        reason = "Terminating".to_owned();
    }
    reason
}

/// kubectl's short ages: `45s`, `3m20s`, `25m`, `5h10m`, `20h`, `3d4h`, `12d`.
fn human_duration(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 8 * 3600 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s if s < 8 * 86400 => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn ages_read_like_kubectl() {
        for (seconds, want) in [
            (5, "5s"),
            (119, "119s"),
            (200, "3m20s"),
            (1500, "25m"),
            (18_600, "5h10m"),
            (72_000, "20h"),
            (273_600, "3d4h"),
            (1_036_800, "12d"),
        ] {
            assert_eq!(human_duration(seconds), want, "{seconds}");
        }
    }

    #[test]
    fn the_status_column_reads_like_kubectl() {
        let running = pod(json!({"metadata":{"name":"web"},"spec":{"containers":[{"name":"app"}]},
            "status":{"phase":"Running","containerStatuses":[{"name":"app","ready":true,"restartCount":0,"image":"i","imageID":"",
                "state":{"running":{}}}]}}));
        assert_eq!(pod_status_reason(&running), "Running");
        let crash = pod(json!({"metadata":{"name":"c"},"spec":{"containers":[{"name":"app"}]},
            "status":{"phase":"Running","containerStatuses":[{"name":"app","ready":false,"restartCount":3,"image":"i","imageID":"",
                "state":{"waiting":{"reason":"CrashLoopBackOff"}}}]}}));
        assert_eq!(pod_status_reason(&crash), "CrashLoopBackOff");
        let done = pod(json!({"metadata":{"name":"d"},"spec":{"containers":[{"name":"app"}]},
            "status":{"phase":"Succeeded","containerStatuses":[{"name":"app","ready":false,"restartCount":0,"image":"i","imageID":"",
                "state":{"terminated":{"exitCode":0,"reason":"Completed"}}}]}}));
        assert_eq!(pod_status_reason(&done), "Completed");
        let init = pod(
            json!({"metadata":{"name":"i"},"spec":{"initContainers":[{"name":"a"},{"name":"b"}],"containers":[{"name":"app"}]},
            "status":{"phase":"Pending","initContainerStatuses":[
                {"name":"a","ready":false,"restartCount":0,"image":"i","imageID":"","state":{"terminated":{"exitCode":0,"reason":"Completed"}}},
                {"name":"b","ready":false,"restartCount":0,"image":"i","imageID":"","state":{"running":{}}}]}}),
        );
        assert_eq!(pod_status_reason(&init), "Init:1/2");
        let deadline = pod(json!({"metadata":{"name":"x"},"spec":{"containers":[{"name":"app"}]},
            "status":{"phase":"Failed","reason":"DeadlineExceeded"}}));
        assert_eq!(pod_status_reason(&deadline), "DeadlineExceeded");
    }

    #[test]
    fn the_table_aligns_columns() {
        let pods = [pod(
            json!({"metadata":{"name":"web-node1","namespace":"default"},"spec":{"containers":[{"name":"app"},{"name":"side"}]},
            "status":{"phase":"Running","podIP":"10.85.0.7","startTime":"2026-11-22T10:00:00Z","containerStatuses":[
                {"name":"app","ready":true,"restartCount":1,"image":"i","imageID":"","state":{"running":{}}},
                {"name":"side","ready":true,"restartCount":2,"image":"i","imageID":"","state":{"running":{}}}]}}),
        )];
        let now = 1_795_341_600 + 200; // 2026-11-22T10:03:20Z
        let text = table(&pods, false, now);
        assert_eq!(
            text,
            "NAME        READY   STATUS    RESTARTS   AGE     IP\nweb-node1   2/2     Running   3          3m20s   10.85.0.7\n"
        );
        assert!(table(&pods, true, now).starts_with("NAMESPACE   NAME"));
    }
}
