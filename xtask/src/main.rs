//! Project automation for kubelet-rs: `cargo xtask <command>`.
//!
//! Commands: `demo`, `ci`, `setup`, `runtime start|stop|status`, `images`, `tidy`, `bench`, `chaos`.

// Reason: xtask measures and waits for real processes; the paused-time rule is for the product crates.
#![allow(clippy::disallowed_methods)]

mod bench;
mod chaos;
mod ci;
mod cluster;
#[cfg(feature = "codegen")]
mod codegen;
mod demo;
mod dist;
mod example;
mod harness;
mod images;
mod kube_apiserver;
mod lane;
mod layout;
mod leaks;
mod package;
mod runtime;
mod setup;
mod symbols;
mod tidy;
mod util;

use anyhow::{Result, bail};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  demo [--runtime containerd|fake] [--duration 60s]
                          the agent running the example pods, with a live table (root, or --runtime fake)
  ci [--repeat N] [--only STEP[,STEP]] [--skip STEP[,STEP]]
                          everything CI runs: fmt, clippy, test, example, doc, tidy, toolchain,
                          features, deny, package, bench-build, real-runtime, bench (--only and --skip
                          choose steps; --repeat runs the real-runtime tests N times, to catch flakes)
  dist [--profile release | --check]
                          the .deb (cargo-deb): the binary (also /usr/bin/kubelet), kubelet.service
                          (Type=notify), a standalone configuration, man page and completions;
                          --check (root) installs it and runs its unit as CI does
  setup                   (root) install Debian packages, build the test images, and build the
                          cluster tests' kube-apiserver from Debian's source package (once per machine)
  runtime start|stop|status
                          (root) the project's own containerd and local registry
  runtime start|stop --second
                          (root) the second containerd, which CI's chaos scenarios run on (it
                          needs the first's registry running)
  cluster up|down|status  (root) etcd and the kube-apiserver setup built (or KUBELET_RS_KUBE_APISERVER)
                          on loopback, with Node,RBAC authorization, NodeRestriction and node credentials
  images                  (root) rebuild the test images (and load them if the runtime runs)
  tidy                    project rules no compiler checks
  symbol-order            (root, valgrind) list the functions the shipped agent runs at start-up,
                          idle and for a pod, which its dist build's linker lays out together
  codegen PROTO           the CRI bindings of kubelet-cri-client from the CRI's api.proto
                          (cargo run -p xtask --features codegen -- codegen PROTO)
  example                 the example agent (crates/sdk/examples/process_agent.rs) running a pod
  bench [--quick] [--repeat N] [--check] [--save-baseline | --widen-baseline] [--reason TEXT]
                          (root) the agent against the bare CRI floor: start-up and its breakdown,
                          teardown, idle cost, cluster mode (with setup's kube-apiserver) and a
                          hollow node on fake://; one table, also under target/bench/ as
                          Markdown, JSON and SVG; --check fails on a ratio to a same-run floor
                          20 % worse than xtask/bench-baseline.json's, a nominal count missed, or
                          (full mode) a target missed; --save-baseline rewrites that file,
                          --widen-baseline keeps each figure's worse of it and this run; either
                          refuses a worse baseline without --reason
  bench criterion         every criterion benchmark (fake runtime; real ones when root)
  chaos [--short] [--only SCENARIO] [--dev] [--second-runtime]
                          (root) crash-consistency, runtime outage, churn and bad-input scenarios;
                          CI runs --short --dev --second-runtime: the tests' build on the
                          project's second containerd, beside the real-runtime tests
";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["demo", rest @ ..] => demo::run_demo(rest),
        ["ci", options @ ..] => ci::run_ci(&ci::CiOptions::parse(options)?),
        ["dist", options @ ..] => dist::run_dist(options),
        ["setup"] => setup::run_setup(),
        ["runtime", "start"] => runtime::start().map(drop),
        ["runtime", "stop"] => runtime::stop(),
        ["runtime", "start", "--second"] => {
            runtime::select(runtime::Instance::Second).and_then(|()| runtime::start().map(drop))
        }
        ["runtime", "stop", "--second"] => runtime::select(runtime::Instance::Second).and_then(|()| runtime::stop()),
        ["runtime", "status"] => runtime::status(),
        ["cluster", "up"] => cluster::up(),
        ["cluster", "down"] => cluster::down(),
        ["cluster", "status"] => cluster::status(),
        ["images"] => {
            images::build()?;
            if runtime::containerd_running() {
                images::load(&runtime::socket())?;
            }
            Ok(())
        }
        ["tidy"] => tidy::run_tidy(),
        ["symbol-order"] => symbols::run_symbol_order(),
        #[cfg(feature = "codegen")]
        ["codegen", rest @ ..] => codegen::run_codegen(rest),
        #[cfg(not(feature = "codegen"))]
        ["codegen", ..] => bail!("codegen needs the feature: cargo run -p xtask --features codegen -- codegen PROTO"),
        ["example"] => example::check(),
        ["bench", "criterion"] => ci::run_bench(),
        ["bench", rest @ ..] => bench::run_bench(rest),
        ["chaos", rest @ ..] => chaos::run_chaos(rest),
        ["help" | "--help" | "-h"] | [] => {
            print!("{USAGE}");
            Ok(())
        }
        _ => {
            eprint!("{USAGE}");
            bail!("unknown command: {}", args.join(" "))
        }
    }
}
