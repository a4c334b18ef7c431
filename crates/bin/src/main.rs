//! The kubelet-rs reference node binary: parses flags, sets up logging, builds the agent from the
//! library crates, and runs it until SIGTERM or SIGINT.
//!
//! `kubelet-rs run` is the agent; `get`, `describe` and `logs` talk to a running agent over its
//! unix socket; `cni` is cnitool; `version` and `check-runtime` are small helpers.

mod agent;
mod api;
mod cli;
mod cnitool;
mod logs;
mod settings;

use std::{process::ExitCode, time::Duration};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use cri_client::{Client, Config};
use settings::{LogFormat, RunArgs, Settings};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Command-line interface.
#[derive(Debug, Parser)]
#[command(name = "kubelet-rs", version, about = "A Kubernetes node agent in Rust")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent.
    Run(Box<RunArgs>),
    /// Print the version.
    Version,
    /// Connect to a CRI runtime and print its version and conditions; fails unless it is ready.
    CheckRuntime {
        /// The runtime endpoint, as upstream's flag.
        #[arg(long, default_value = "unix:///run/containerd/containerd.sock")]
        container_runtime_endpoint: String,
    },
    /// Add, check or delete a network namespace's attachment with CNI plugins, as cnitool does.
    Cni(cnitool::CniArgs),
    /// Show a running agent's pods (`get pods`), through its unix socket.
    Get(cli::GetArgs),
    /// Show one of a running agent's pods in detail (`describe pod NAME`), through its unix socket.
    Describe(cli::DescribeArgs),
    /// Print a container's logs from a running agent, through its unix socket.
    Logs(cli::LogsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Version => {
            println!("kubelet-rs {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckRuntime { container_runtime_endpoint } => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(check_runtime(&container_runtime_endpoint))
        }
        Command::Cni(args) => cnitool::main(args),
        Command::Get(args) => cli::get(args),
        Command::Describe(args) => cli::describe(args),
        Command::Logs(args) => cli::logs(args),
        Command::Run(args) => {
            init_logging(args.verbosity, args.logging_format);
            let settings = match Settings::resolve(*args, host_name) {
                Ok(settings) => settings,
                Err(e) => {
                    // Upstream exits with 2 on a configuration it cannot use.
                    tracing::error!(error = %e, "invalid configuration");
                    return Ok(ExitCode::from(2));
                }
            };
            // Sized for a node agent, not a server: at most 4 workers and 8 blocking threads
            // (file IO), so the agent stays within 16 threads however many pods run.
            let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(AGENT_WORKER_THREADS));
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .max_blocking_threads(AGENT_BLOCKING_THREADS)
                .enable_all()
                .build()?;
            // Logging is set up by now, so the failure is a log line in the chosen format, as
            // upstream's "command failed".
            if let Err(err) = runtime.block_on(run_agent(settings)) {
                tracing::error!(error = format!("{err:#}"), "command failed");
                return Ok(ExitCode::FAILURE);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The agent's tokio worker threads, at most.
const AGENT_WORKER_THREADS: usize = 4;
/// The agent's threads for blocking file IO, at most.
const AGENT_BLOCKING_THREADS: usize = 8;

/// Logs to stderr: `RUST_LOG` when set, else the level `--v` names.
fn init_logging(verbosity: u8, format: LogFormat) {
    let level = match verbosity {
        0 | 1 => "info",
        2..=4 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "localhost".to_owned())
}

/// Upstream's `KubeletOOMScoreAdj`: the agent is among the last things the OOM killer picks.
const AGENT_OOM_SCORE_ADJ: i32 = -999;

async fn run_agent(config: Settings) -> Result<()> {
    info!(node = %config.node_name, "starting kubelet-rs");
    // Lowering it needs CAP_SYS_RESOURCE; without it the agent runs on with a warning.
    if let Err(err) = std::fs::write("/proc/self/oom_score_adj", AGENT_OOM_SCORE_ADJ.to_string()) {
        warn!(error = %err, "cannot set the agent's oom_score_adj to {AGENT_OOM_SCORE_ADJ}; continuing");
    }
    let cancel = CancellationToken::new();
    let metrics = install_metrics(&cancel)?;
    let mut agent = tokio::spawn(agent::run(config, Some(metrics), cancel.clone()));
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: stopping; running pods keep running"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT: stopping; running pods keep running"),
        // The agent stopped by itself: a start-up failure, or its inputs closed.
        result = &mut agent => return result.context("agent task")?,
    }
    cancel.cancel();
    // A second signal, or 5 s, ends the wait.
    tokio::select! {
        result = agent => result.context("agent task")??,
        _ = term.recv() => warn!("second signal: exiting at once"),
        _ = tokio::time::sleep(Duration::from_secs(5)) => warn!("shutdown took longer than 5 s: exiting"),
    }
    Ok(())
}

/// The Prometheus recorder for every library's metrics, with its upkeep task.
fn install_metrics(cancel: &CancellationToken) -> Result<metrics_exporter_prometheus::PrometheusHandle> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    // Histograms with upstream's buckets, never summaries: dashboards read the `_bucket` series,
    // and a summary's sketch grows with the range of values it has seen.
    let mut builder = PrometheusBuilder::new().set_buckets(&kubelet_core::metrics::DEFAULT_BUCKETS)?;
    for (name, buckets) in kubelet_core::metrics::HISTOGRAMS {
        builder = builder.set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)?;
    }
    let handle = builder.install_recorder().context("installing the metrics recorder")?;
    tokio::spawn({
        let (handle, cancel) = (handle.clone(), cancel.clone());
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    _ = tick.tick() => handle.run_upkeep(),
                }
            }
        }
    });
    Ok(handle)
}

async fn check_runtime(endpoint: &str) -> Result<ExitCode> {
    let client = Client::connect(&Config::new(endpoint))?;
    let version = client.version().await.with_context(|| format!("cannot reach the runtime at {endpoint}"))?;
    println!("runtime: {} {} (CRI {})", version.runtime_name, version.runtime_version, version.runtime_api_version);
    let status = client.status().await?;
    let mut ready = true;
    for condition in &status.conditions {
        println!("{}: {} {} {}", condition.r#type, condition.status, condition.reason, condition.message);
        ready &= condition.status;
    }
    Ok(if ready && !status.conditions.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
