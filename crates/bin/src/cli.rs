//! Operator commands that talk to a running agent over its unix socket:
//! `kubelet-rs get pods`, `kubelet-rs describe pod` and `kubelet-rs logs`.

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

/// `kubelet-rs describe`.
#[derive(Debug, Args)]
pub(crate) struct DescribeArgs {
    #[command(subcommand)]
    what: DescribeWhat,
}

#[derive(Debug, Subcommand)]
enum DescribeWhat {
    /// A pod: its spec in short, conditions, container states and recent events.
    #[command(alias = "pods", alias = "po")]
    Pod(DescribePodArgs),
}

#[derive(Debug, Args)]
struct DescribePodArgs {
    /// The pod's name.
    name: String,
    /// The pod's namespace.
    #[arg(short = 'n', long, default_value = "default")]
    namespace: String,
    /// The agent's root directory (where its socket is).
    #[arg(long, default_value = "/var/lib/kubelet")]
    root_dir: PathBuf,
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

pub(crate) fn describe(args: DescribeArgs) -> Result<ExitCode> {
    let DescribeWhat::Pod(args) = args.what;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let socket = kubelet::server::socket_path(&args.root_dir);
        let pod = find_pod(&socket, &args.namespace, &args.name).await?;
        let (_, body) = request(&socket, &format!("/events/{}/{}", args.namespace, args.name)).await?;
        let events: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        print!("{}", describe_pod(&pod, events["items"].as_array().map(Vec::as_slice).unwrap_or_default(), unix_now()));
        Ok(ExitCode::SUCCESS)
    })
}

/// The pod named `name` in `namespace`, from the agent's `/pods`.
pub(crate) async fn find_pod(socket: &Path, namespace: &str, name: &str) -> Result<Pod> {
    let (status, body) = request(socket, "/pods").await?;
    if status != 200 {
        bail!("the agent answered {status}: {}", String::from_utf8_lossy(&body));
    }
    let list: serde_json::Value = serde_json::from_slice(&body).context("the agent's /pods is not JSON")?;
    let pods: Vec<Pod> = serde_json::from_value(list["items"].clone()).context("the agent's pods")?;
    pods.into_iter()
        .find(|p| {
            p.metadata.name.as_deref() == Some(name)
                && p.metadata.namespace.as_deref().unwrap_or("default") == namespace
        })
        .with_context(|| format!("pod {namespace}/{name} not found"))
}

/// A probe as `kubectl describe` shows it: the action, then delays and thresholds with the
/// API's defaults filled in.
fn describe_probe(probe: &k8s_openapi::api::core::v1::Probe) -> String {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let port = |p: &IntOrString| match p {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    };
    let action = if let Some(exec) = &probe.exec {
        format!("exec [{}]", exec.command.clone().unwrap_or_default().join(" "))
    } else if let Some(http) = &probe.http_get {
        format!(
            "http-get {}://{}:{}{}",
            http.scheme.as_deref().unwrap_or("HTTP").to_lowercase(),
            http.host.clone().unwrap_or_default(),
            port(&http.port),
            http.path.clone().unwrap_or_default()
        )
    } else if let Some(tcp) = &probe.tcp_socket {
        format!("tcp-socket {}:{}", tcp.host.clone().unwrap_or_default(), port(&tcp.port))
    } else if let Some(grpc) = &probe.grpc {
        format!("grpc <pod>:{} {}", grpc.port, grpc.service.clone().unwrap_or_default())
    } else {
        "unknown".to_owned()
    };
    format!(
        "{action} delay={}s timeout={}s period={}s #success={} #failure={}",
        probe.initial_delay_seconds.unwrap_or(0),
        probe.timeout_seconds.unwrap_or(1),
        probe.period_seconds.unwrap_or(10),
        probe.success_threshold.unwrap_or(1),
        probe.failure_threshold.unwrap_or(3)
    )
}

/// `kubectl describe pod`'s layout, for what a standalone node knows.
fn describe_pod(pod: &Pod, events: &[serde_json::Value], now: i64) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let meta = &pod.metadata;
    let map = |m: &Option<std::collections::BTreeMap<String, String>>| -> String {
        let pairs: Vec<String> = m.iter().flatten().map(|(k, v)| format!("{k}={v}")).collect();
        if pairs.is_empty() { "<none>".to_owned() } else { pairs.join("\n              ") }
    };
    let _ = writeln!(out, "Name:         {}", meta.name.clone().unwrap_or_default());
    let _ = writeln!(out, "Namespace:    {}", meta.namespace.clone().unwrap_or_default());
    let _ = writeln!(out, "UID:          {}", meta.uid.clone().unwrap_or_default());
    let _ = writeln!(out, "Node:         {}", spec.node_name.clone().unwrap_or_else(|| "<none>".to_owned()));
    if let Some(start) = &status.start_time {
        let _ = writeln!(out, "Start Time:   {}", start.0);
    }
    let _ = writeln!(out, "Labels:       {}", map(&meta.labels));
    let _ = writeln!(out, "Annotations:  {}", map(&meta.annotations));
    let _ = writeln!(out, "Status:       {}", pod_status_reason(pod));
    if let Some(reason) = &status.reason {
        let _ = writeln!(out, "Reason:       {reason}");
    }
    if let Some(message) = &status.message {
        let _ = writeln!(out, "Message:      {message}");
    }
    let _ = writeln!(out, "IP:           {}", status.pod_ip.clone().unwrap_or_default());
    let sections = [
        ("Init Containers", spec.init_containers.clone().unwrap_or_default(), status.init_container_statuses.clone()),
        ("Containers", spec.containers.clone(), status.container_statuses.clone()),
    ];
    for (title, containers, statuses) in sections {
        if containers.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{title}:");
        for container in containers {
            let found = statuses.iter().flatten().find(|s| s.name == container.name);
            let _ = writeln!(out, "  {}:", container.name);
            let _ = writeln!(out, "    Image:          {}", container.image.clone().unwrap_or_default());
            let command: Vec<String> =
                container.command.iter().flatten().chain(container.args.iter().flatten()).cloned().collect();
            if !command.is_empty() {
                let _ = writeln!(out, "    Command:        {}", command.join(" "));
            }
            let ports: Vec<String> = container
                .ports
                .iter()
                .flatten()
                .map(|p| format!("{}/{}", p.container_port, p.protocol.clone().unwrap_or_else(|| "TCP".to_owned())))
                .collect();
            if !ports.is_empty() {
                let _ = writeln!(out, "    Ports:          {}", ports.join(", "));
            }
            let state = found.and_then(|s| s.state.clone()).unwrap_or_default();
            if let Some(running) = &state.running {
                let _ = writeln!(out, "    State:          Running");
                if let Some(at) = &running.started_at {
                    let _ = writeln!(out, "      Started:      {}", at.0);
                }
            } else if let Some(waiting) = &state.waiting {
                let _ = writeln!(out, "    State:          Waiting");
                let _ = writeln!(out, "      Reason:       {}", waiting.reason.clone().unwrap_or_default());
                if let Some(message) = &waiting.message {
                    let _ = writeln!(out, "      Message:      {message}");
                }
            } else if let Some(terminated) = &state.terminated {
                let _ = writeln!(out, "    State:          Terminated");
                let _ = writeln!(out, "      Reason:       {}", terminated.reason.clone().unwrap_or_default());
                let _ = writeln!(out, "      Exit Code:    {}", terminated.exit_code);
            } else {
                let _ = writeln!(out, "    State:          <unknown>");
            }
            if let Some(last) = found.and_then(|s| s.last_state.as_ref()).and_then(|s| s.terminated.as_ref()) {
                let _ = writeln!(out, "    Last State:     Terminated");
                let _ = writeln!(out, "      Reason:       {}", last.reason.clone().unwrap_or_default());
                let _ = writeln!(out, "      Exit Code:    {}", last.exit_code);
            }
            let _ =
                writeln!(out, "    Ready:          {}", if found.is_some_and(|s| s.ready) { "True" } else { "False" });
            let _ = writeln!(out, "    Restart Count:  {}", found.map_or(0, |s| s.restart_count));
            if container.startup_probe.is_some() {
                let started = found.and_then(|s| s.started).unwrap_or(false);
                let _ = writeln!(out, "    Started:        {}", if started { "True" } else { "False" });
            }
            for (kind, probe) in [
                ("Liveness", &container.liveness_probe),
                ("Readiness", &container.readiness_probe),
                ("Startup", &container.startup_probe),
            ] {
                if let Some(probe) = probe {
                    let _ = writeln!(out, "    {:<16}{}", format!("{kind}:"), describe_probe(probe));
                }
            }
            for (kind, list) in [
                ("Limits", container.resources.as_ref().and_then(|r| r.limits.clone())),
                ("Requests", container.resources.as_ref().and_then(|r| r.requests.clone())),
            ] {
                if let Some(list) = list.filter(|l| !l.is_empty()) {
                    let _ = writeln!(out, "    {kind}:");
                    for (resource, quantity) in list {
                        let _ = writeln!(out, "      {resource}:  {}", quantity.0);
                    }
                }
            }
        }
    }
    let conditions = status.conditions.clone().unwrap_or_default();
    if !conditions.is_empty() {
        let _ = writeln!(out, "Conditions:");
        let _ = writeln!(out, "  Type              Status");
        for condition in conditions {
            let _ = writeln!(out, "  {:<17} {}", condition.type_, condition.status);
        }
    }
    let _ = writeln!(
        out,
        "QoS Class:    {}",
        status.qos_class.clone().unwrap_or_else(|| kubelet_core::resources::qos_class(pod).to_owned())
    );
    if events.is_empty() {
        let _ = writeln!(out, "Events:       <none>");
    } else {
        let _ = writeln!(out, "Events:");
        let rows: Vec<[String; 4]> = events
            .iter()
            .map(|e| {
                let at = e["lastTimestamp"].as_str().and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
                let age = at.map_or_else(|| "<unknown>".to_owned(), |t| human_duration(now - t.as_second()));
                let text = |key: &str| e[key].as_str().unwrap_or_default().to_owned();
                [text("type"), text("reason"), age, text("message")]
            })
            .collect();
        let header = [("Type", "----"), ("Reason", "------"), ("Age", "---"), ("Message", "-------")];
        let width = |i: usize, title: &str| rows.iter().map(|r| r[i].len()).chain([title.len()]).max().unwrap_or(0);
        let widths: Vec<usize> = header.iter().enumerate().map(|(i, (title, _))| width(i, title)).collect();
        for line in [header.map(|(t, _)| t.to_owned()), header.map(|(_, d)| d.to_owned())].iter().chain(rows.iter()) {
            let _ = writeln!(
                out,
                "  {:<w0$}  {:<w1$}  {:<w2$}  {}",
                line[0],
                line[1],
                line[2],
                line[3],
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2]
            );
        }
    }
    out
}

pub(crate) fn logs(args: LogsArgs) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(container_logs(args))
}

async fn get_pods(args: GetPodsArgs) -> Result<ExitCode> {
    let socket = kubelet::server::socket_path(&args.root_dir);
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
    let socket = kubelet::server::socket_path(&args.root_dir);
    let container = match args.container {
        Some(container) => container,
        None => only_container(&socket, &args.namespace, &args.pod).await?,
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

/// The name of pod `namespace/name`'s only container; an error names them when it has several.
pub(crate) async fn only_container(socket: &Path, namespace: &str, name: &str) -> Result<String> {
    let pod = find_pod(socket, namespace, name).await?;
    let names: Vec<&str> = pod.spec.iter().flat_map(|s| s.containers.iter()).map(|c| c.name.as_str()).collect();
    match names[..] {
        [one] => Ok(one.to_owned()),
        _ => bail!("pod {name} has containers {}: choose one with -c", names.join(", ")),
    }
}

/// A GET on the agent's socket: the status and the whole body.
async fn request(socket: &Path, path: &str) -> Result<(u16, Vec<u8>)> {
    let response = send(socket, path).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.context("reading the agent's answer")?.to_bytes();
    Ok((status, body.to_vec()))
}

/// A connection to the agent's socket.
pub(crate) async fn connect(socket: &Path) -> Result<tokio::net::UnixStream> {
    tokio::net::UnixStream::connect(socket).await.with_context(|| {
        format!(
            "cannot reach the agent at {} (is `kubelet-rs run` running with this --root-dir, and are you root?)",
            socket.display()
        )
    })
}

async fn send(socket: &Path, path: &str) -> Result<hyper::Response<hyper::body::Incoming>> {
    let stream = connect(socket).await?;
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
    fn describe_shows_spec_states_conditions_and_events() {
        let web = pod(json!({"metadata":{"name":"web-n","namespace":"default","uid":"u1","labels":{"app":"web"}},
            "spec":{"nodeName":"n","containers":[{"name":"httpd","image":"busybox","command":["httpd","-f"],
                "ports":[{"containerPort":8080,"name":"http"}],"resources":{"requests":{"cpu":"50m"}},
                "livenessProbe":{"exec":{"command":["cat","/tmp/healthy"]},"periodSeconds":1,"failureThreshold":2},
                "readinessProbe":{"httpGet":{"port":"http","path":"/"}},
                "startupProbe":{"tcpSocket":{"port":8080},"initialDelaySeconds":2,"failureThreshold":30}}]},
            "status":{"phase":"Running","podIP":"10.85.0.7","qosClass":"Burstable",
                "conditions":[{"type":"Ready","status":"True"}],
                "containerStatuses":[{"name":"httpd","ready":true,"started":true,"restartCount":1,"image":"busybox","imageID":"",
                    "state":{"running":{"startedAt":"2026-11-22T10:00:00Z"}},
                    "lastState":{"terminated":{"exitCode":137,"reason":"Error"}}}]}}));
        let events = [
            json!({"type":"Normal","reason":"Started","message":"Started container httpd","lastTimestamp":"2026-11-22T10:00:00Z"}),
        ];
        let text = describe_pod(&web, &events, 1_795_341_630);
        for want in [
            "Name:         web-n",
            "Labels:       app=web",
            "Status:       Running",
            "IP:           10.85.0.7",
            "  httpd:",
            "    Command:        httpd -f",
            "    Ports:          8080/TCP",
            "    State:          Running",
            "    Last State:     Terminated",
            "      Exit Code:    137",
            "    Restart Count:  1",
            "    Started:        True",
            "    Liveness:       exec [cat /tmp/healthy] delay=0s timeout=1s period=1s #success=1 #failure=2",
            "    Readiness:      http-get http://:http/ delay=0s timeout=1s period=10s #success=1 #failure=3",
            "    Startup:        tcp-socket :8080 delay=2s timeout=1s period=10s #success=1 #failure=30",
            "      cpu:  50m",
            "  Ready             True",
            "QoS Class:    Burstable",
            "  Normal  Started  30s  Started container httpd",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
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
