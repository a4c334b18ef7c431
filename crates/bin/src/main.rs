//! The kubelet-rs reference node binary: parses flags, sets up logging, builds the agent from the
//! library crates, and runs it until SIGTERM or SIGINT.
//!
//! `kubelet-rs` with upstream's flags (or `kubelet-rs run`) is the agent; `get`, `describe` and
//! `logs` talk to a running agent over its unix socket; `cni` is cnitool; `version` and
//! `check-runtime` are small helpers.

mod agent;
mod alloc;
mod cli;
mod cluster;
mod cnitool;
mod configz;
mod debug_flags;
mod exec;
mod flags;
mod kubelet_api;
mod logging;
mod node_ip;
mod node_logs;
mod port_forward;
mod settings;
mod spec;
mod stats;
mod systemd;

use std::{process::ExitCode, time::Duration};

use anyhow::{Context, Result};
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use cri_client::{Client, Config};
use settings::{LogFormat, RunArgs, Settings};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Command-line interface: upstream's kubelet invocation (flags, no subcommand) runs the agent,
/// as `run` does.
#[derive(Debug, Parser)]
#[command(
    name = "kubelet-rs",
    about = "A Kubernetes node agent in Rust",
    args_conflicts_with_subcommands = true,
    disable_version_flag = true
)]
struct Cli {
    /// Print the version (`Kubernetes vX.Y.Z-kubelet-rs.A.B.C`, as kubeadm reads it) and exit;
    /// `--version=raw` prints the build's details too.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "true|raw")]
    version: Option<String>,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
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
    /// Run a command in a running container of a running agent, through its unix socket.
    Exec(exec::ExecArgs),
    /// Forward local ports to a pod of a running agent, through its unix socket.
    PortForward(port_forward::PortForwardArgs),
    /// Print the shell completion script for this command (bash, zsh, fish, elvish, powershell).
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
        /// The name the command is installed as (`kubelet` where it stands in for upstream's).
        #[arg(long, default_value = "kubelet-rs")]
        name: String,
    },
    /// Print the manual page (roff), as packages install it.
    #[command(hide = true)]
    Man,
}

/// The whole command line: `Cli` with upstream's flags from [`flags::FLAGS`] at the top level and
/// on `run`.
fn full_command() -> clap::Command {
    flags::register(Cli::command()).mut_subcommand("run", flags::register)
}

fn main() -> ExitCode {
    // Upstream's flags beyond `RunArgs` come from a table, at the top level and on `run`.
    let matches = full_command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let run_matches = matches.subcommand_matches("run").unwrap_or(&matches).clone();
    match run(cli, &run_matches) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// The Kubernetes version whose kubelet this agent stands in for.
const KUBERNETES_VERSION: &str = "v1.36.0";

/// The version the agent reports, to `--version` and as the Node's `kubeletVersion`: the
/// Kubernetes version, with kubelet-rs's own as its pre-release part (`v1.36.0-kubelet-rs.0.1.0`).
pub(crate) fn kubelet_version() -> String {
    format!("{KUBERNETES_VERSION}-kubelet-rs.{}", env!("CARGO_PKG_VERSION"))
}

/// `--version`: upstream's line, or with `raw` the build's details as well.
fn print_version(mode: &str) -> Result<ExitCode> {
    match mode {
        "true" => println!("Kubernetes {}", kubelet_version()),
        "raw" => {
            let mut numbers = KUBERNETES_VERSION.trim_start_matches('v').split('.');
            let (major, minor) = (numbers.next().unwrap_or("0"), numbers.next().unwrap_or("0"));
            println!(
                "version.Info{{Major:\"{major}\", Minor:\"{minor}\", GitVersion:\"{}\", Compiler:\"rustc\", \
                 Platform:\"{}/{}\"}}",
                kubelet_version(),
                std::env::consts::OS,
                go_arch(),
            );
        }
        "false" => return Ok(ExitCode::SUCCESS),
        other => anyhow::bail!("invalid --version {other:?}: true, false or raw"),
    }
    Ok(ExitCode::SUCCESS)
}

/// This machine's architecture as Go names it.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn run(cli: Cli, run_matches: &ArgMatches) -> Result<ExitCode> {
    if let Some(mode) = cli.version.as_deref().filter(|mode| *mode != "false") {
        return print_version(mode);
    }
    let Some(command) = cli.command else { return Ok(run_node(cli.run, run_matches)) };
    match command {
        Command::Version => print_version("true"),
        Command::CheckRuntime { container_runtime_endpoint } => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(check_runtime(&container_runtime_endpoint))
        }
        Command::Cni(args) => cnitool::main(args),
        Command::Get(args) => cli::get(args),
        Command::Describe(args) => cli::describe(args),
        Command::Logs(args) => cli::logs(args),
        Command::Exec(args) => exec::exec(args),
        Command::PortForward(args) => port_forward::port_forward(args),
        Command::Completion { shell, name } => {
            // Written whole, so a closed pipe is an error here, not a panic in the generator.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut full_command(), name, &mut script);
            std::io::Write::write_all(&mut std::io::stdout(), &script)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            let man = clap_mangen::Man::new(full_command())
                .source(concat!("kubelet-rs ", env!("CARGO_PKG_VERSION")))
                .manual("System Administration");
            man.render(&mut std::io::stdout())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => Ok(run_node(*args, run_matches)),
    }
}

/// Raises the soft limit on open files to the hard one, as Go raises upstream's kubelet's at
/// start-up: the node's connections, log files, cgroups and the runtime's socket share it, and
/// the listeners' connection bounds are set well under the hard limit a unit gives.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "raised the soft limit on open files"),
            Err(error) => warn!(%error, soft, hard, "cannot raise the soft limit on open files"),
        },
        Ok(_) => {}
        Err(error) => warn!(%error, "cannot read the limit on open files"),
    }
}

/// The agent: resolves its configuration, sets up logging, checks the node, and runs.
fn run_node(args: RunArgs, matches: &ArgMatches) -> ExitCode {
    // Before any thread exists, so every thread shares the bounded arenas.
    let arenas = alloc::limit_arenas();
    let given = match flags::given(matches) {
        Ok(given) => given,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    // pflag's own words, on stderr, before anything else.
    for line in &given.deprecations {
        eprintln!("{line}");
    }
    let settings = match Settings::resolve(args, given, host_name) {
        Ok(settings) => settings,
        Err(e) => {
            logging::init(0, LogFormat::Text);
            // Upstream exits with 2 on a configuration it cannot use.
            tracing::error!(error = %e, "invalid configuration");
            return ExitCode::from(2);
        }
    };
    logging::init(settings.verbosity, settings.log_format);
    tracing::debug!(?arenas, bound = alloc::ARENAS, "memory allocator arenas");
    raise_open_files_limit();
    if !settings.without_effect.is_empty() {
        warn!("set but without effect in kubelet-rs: {}", settings.without_effect.join(", "));
    }
    if let Err(err) = check_node(&settings) {
        tracing::error!(error = format!("{err:#}"), "failed to run Kubelet");
        return ExitCode::FAILURE;
    }
    // Upstream's `InitializeTLS`, before anything starts: a suite the kubelet API cannot offer
    // stops the agent even where the API will not be served.
    if let Err(err) = server::tls::check_cipher_suites(&settings.file.server.tls_cipher_suites) {
        tracing::error!(error = %err, "failed to construct kubelet dependencies");
        return ExitCode::FAILURE;
    }
    // Sized for a node agent, not a server: at most 4 workers and 8 blocking threads
    // (file IO), so the agent stays within 16 threads however many pods run.
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(AGENT_WORKER_THREADS));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .max_blocking_threads(AGENT_BLOCKING_THREADS)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!(error = %err, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    // Logging is set up by now, so the failure is a log line in the chosen format, as
    // upstream's "command failed".
    if let Err(err) = runtime.block_on(run_agent(settings)) {
        tracing::error!(error = format!("{err:#}"), "command failed");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// What upstream checks of the node before it starts: swap (`failSwapOn`) and the cgroup
/// version (`failCgroupV1`).
fn check_node(settings: &Settings) -> Result<()> {
    if settings.file.fail_swap_on {
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        let active: Vec<&str> = swaps.lines().skip(1).filter(|l| !l.trim().is_empty()).collect();
        anyhow::ensure!(
            active.is_empty(),
            "running with swap on is not supported, please disable swap or set --fail-swap-on flag to false. /proc/swaps contained: {active:?}"
        );
    }
    if settings.file.fail_cgroup_v1 {
        let v2 = std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        anyhow::ensure!(
            v2,
            "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is unsupported and will be removed in a future release"
        );
    }
    Ok(())
}

/// The agent's tokio worker threads, at most.
const AGENT_WORKER_THREADS: usize = 4;
/// The agent's threads for blocking file IO, at most.
const AGENT_BLOCKING_THREADS: usize = 8;

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "localhost".to_owned())
}

async fn run_agent(config: Settings) -> Result<()> {
    info!(node = %config.node_name, "starting kubelet-rs");
    // Lowering it needs CAP_SYS_RESOURCE; without it the agent runs on with a warning.
    let adj = config.file.oom_score_adj;
    if let Err(err) = std::fs::write("/proc/self/oom_score_adj", adj.to_string()) {
        warn!(error = %err, "cannot set the agent's oom_score_adj to {adj}; continuing");
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
