//! The kubelet-rs reference node binary.
//!
//! For now it answers `version` and `check-runtime` (talk to a CRI runtime and report its version
//! and conditions); the agent itself is assembled from the library crates as they land.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use cri_client::{Client, Config};

/// Command-line interface.
#[derive(Debug, Parser)]
#[command(name = "kubelet-rs", version, about = "A Kubernetes node agent in Rust")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the version.
    Version,
    /// Connect to a CRI runtime and print its version and conditions; fails unless it is ready.
    CheckRuntime {
        /// The runtime endpoint, as upstream's flag.
        #[arg(long, default_value = "unix:///run/containerd/containerd.sock")]
        container_runtime_endpoint: String,
    },
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
    }
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
