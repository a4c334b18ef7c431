//! `cargo xtask ci`: everything CI runs, in order, so a green run here means a green CI.
//!
//! fmt, clippy, unit and integration tests, the example agent run on a static pod, docs, tidy, the toolchain against `rust-version`,
//! every feature combination of the library crates (cargo-hack), the licence and dependency
//! policy (cargo-deny, `deny.toml`), that the libraries build from their packages
//! (`package.rs`), that the benchmarks build, then the tests against the real runtime (test
//! functions named `real_*`), which the earlier test step leaves out, with the short version of
//! the chaos scenarios beside them on the project's second containerd, then the .deb installed
//! and run under its unit (`dist.rs`), and the demo's check.
//! Under `CI=true` nothing may skip itself (a missing tool, runtime or kube-apiserver fails the
//! run), and the summary lists what the tests recorded they did not check, by test.
//! Everything is built in the dev profile, once: an optimized build takes minutes on two cores
//! and checks nothing the dev one does not (`cargo xtask bench` and `dist` build those).
//! When the real-runtime step runs, the steps that only compile (clippy aside) run beside it
//! instead of before it ([`Lane`]), and the quick bench waits for them, alone on the machine.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    cluster, demo, dist, harness,
    lane::{Background, Lane},
    leaks, runtime, tidy,
    util::{have, in_ci, output, project_root, run},
};

/// Test functions whose names match this run only in the real-runtime step.
const REAL_FILTER: &str = "test(/(^|::)real_/)";

/// The variable naming the file where tests record what they did not check
/// (`kubelet_core::testing::not_checked`), which the summary lists.
const ENV_NOT_CHECKED: &str = "KUBELET_RS_TEST_NOT_CHECKED";

/// The file the tests of this run record what they did not check in.
fn not_checked_file() -> Result<std::path::PathBuf> {
    Ok(project_root()?.join("target/ci-not-checked.txt"))
}

/// What the tests recorded they did not check, one line each, in the order recorded.
fn not_checked() -> Vec<String> {
    let text = not_checked_file().and_then(|file| Ok(std::fs::read_to_string(file)?)).unwrap_or_default();
    let mut lines: Vec<String> = Vec::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        if !lines.iter().any(|seen| seen == line) {
            lines.push(line.to_owned());
        }
    }
    lines
}

pub(crate) fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    if let Ok(root) = project_root() {
        cmd.current_dir(root);
    }
    cmd
}

fn nextest() -> bool {
    cargo().args(["nextest", "--version"]).output().is_ok_and(|o| o.status.success())
}

/// The steps, in the order they run.
const STEPS: [&str; 13] = [
    "fmt",
    "clippy",
    "test",
    "example",
    "tidy",
    "toolchain",
    "features",
    "doc",
    "deny",
    "package",
    "bench-build",
    "real-runtime",
    "bench",
];

/// What `cargo xtask ci` is asked to run.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CiOptions {
    /// How many times in a row the real-runtime tests run.
    repeat: u32,
    /// The steps to run (all of them unless `--only` names some), less those `--skip` names.
    steps: Vec<&'static str>,
}

impl CiOptions {
    /// `[--repeat N] [--only STEP[,STEP]] [--skip STEP[,STEP]]`.
    pub(crate) fn parse(args: &[&str]) -> Result<Self> {
        let mut options = CiOptions { repeat: 1, steps: STEPS.to_vec() };
        let mut skipped = Vec::new();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = || args.next().with_context(|| format!("{arg} takes a value"));
            match *arg {
                "--repeat" => {
                    let n = value()?;
                    options.repeat = n
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .with_context(|| format!("--repeat takes a positive number of runs, not {n:?}"))?;
                }
                "--only" => {
                    let chosen = step_names(value()?)?;
                    options.steps = STEPS.iter().copied().filter(|step| chosen.contains(step)).collect();
                }
                "--skip" => skipped.extend(step_names(value()?)?),
                other => bail!("unknown ci option {other:?}: --repeat N, --only STEP[,STEP], --skip STEP[,STEP]"),
            }
        }
        options.steps.retain(|step| !skipped.contains(step));
        Ok(options)
    }
}

/// The steps a comma-separated list names, each checked against [`STEPS`]; a list that names
/// none is an error, not a run of nothing.
fn step_names(list: &str) -> Result<Vec<&'static str>> {
    if list.split(',').all(|name| name.trim().is_empty()) {
        bail!("no ci step named in {list:?}; the steps: {}", STEPS.join(", "));
    }
    list.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| {
            STEPS
                .iter()
                .find(|step| **step == name)
                .copied()
                .with_context(|| format!("no ci step {name:?}; the steps: {}", STEPS.join(", ")))
        })
        .collect()
}

/// The steps that only compile and read the source, clippy aside: with the real-runtime step,
/// they run beside it (see [`Lane`]) rather than before it.
const COMPILE_ONLY: [&str; 4] = ["features", "doc", "deny", "package"];

/// The steps `options` asks for, in order; the real-runtime tests run `repeat` times in a row.
pub(crate) fn run_ci(options: &CiOptions) -> Result<()> {
    let repeat = options.repeat;
    say_what_will_be_skipped(&options.steps)?;
    let not_checked_file = not_checked_file()?;
    if let Err(err) = std::fs::remove_file(&not_checked_file)
        && err.kind() != std::io::ErrorKind::NotFound
    {
        bail!("cannot clear {}: {err}", not_checked_file.display());
    }
    let beside = steps_beside_real_runtime(&options.steps);
    let mut timings: Vec<(&str, Duration)> = Vec::new();
    let mut step = |name: &'static str, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        if !options.steps.contains(&name) {
            println!("\n==> {name}: skipped");
            return Ok(());
        }
        if beside.contains(&name) {
            println!("\n==> {name}: in the background from the tests on (below)");
            return Ok(());
        }
        println!("\n==> {name}");
        let started = Instant::now();
        f().with_context(|| format!("ci step `{name}` failed"))?;
        timings.push((name, started.elapsed()));
        Ok(())
    };

    step("fmt", &mut || run(cargo().args(["fmt", "--all", "--", "--check"])))?;
    step("clippy", &mut || {
        run(cargo().args(["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"]))
    })?;
    // The compile-only steps start now, at idle priority: they take what CPU the tests' build
    // leaves (its last crates and links run on one core), and the idle time of everything up to
    // the real-runtime tests (the unit tests' waits, the runtime's and the control plane's start).
    let lane = if beside.is_empty() { None } else { Some(Lane::start(&beside)?) };
    step("test", &mut || {
        if nextest() {
            let filter = format!("not {REAL_FILTER}");
            let mut tests = cargo();
            tests.args(["nextest", "run", "--workspace", "--locked", "--no-fail-fast", "-E", &filter]);
            run(tests.env(ENV_NOT_CHECKED, &not_checked_file))?;
            run(cargo().args(["test", "--workspace", "--locked", "--doc"]))
        } else {
            let mut tests = cargo();
            tests.args(["test", "--workspace", "--locked", "--", "--skip", "real_"]);
            run(tests.env(ENV_NOT_CHECKED, &not_checked_file))
        }
    })?;
    // With the lane, the example agent, which mostly waits on its pods, runs after the
    // real-runtime tests, while the lane's compiler finishes, rather than before them.
    let example_after_real_runtime = !beside.is_empty() && options.steps.contains(&"example");
    if example_after_real_runtime {
        println!("\n==> example: after the real-runtime tests (below)");
    } else {
        step("example", &mut crate::example::check)?;
    }
    step("tidy", &mut tidy::run_tidy)?;
    step("toolchain", &mut check_toolchain)?;
    step("features", &mut check_feature_combinations)?;
    // After the feature combinations, whose last builds (kubelet-sdk with all its features) have
    // checked most of the dependencies the documentation's build needs: run first, it took 200
    // CPU-seconds, after them 120, and the two steps together 55 fewer.
    step("doc", &mut || {
        run(cargo()
            .args(["doc", "--workspace", "--no-deps", "--all-features", "--locked"])
            .env("RUSTDOCFLAGS", "-D warnings"))
    })?;
    step("deny", &mut || {
        // Offline checks only: the licence policy, the one tonic/hyper stack, crates.io alone.
        if !tool("cargo-deny")? {
            return Ok(());
        }
        run(cargo().args(["deny", "--locked", "check", "bans", "licenses", "sources"]))
    })?;
    step("package", &mut crate::package::check)?;
    step("bench-build", &mut || {
        // The benchmarks compile and link; in the dev profile, which shares the tests' build, since
        // an optimized build of them (the `bench` profile) takes minutes and checks nothing more.
        run(cargo().args(["build", "--workspace", "--benches", "--locked"]))
    })?;
    let mut lane_timings = Vec::new();
    step("real-runtime", &mut || real_runtime_tests(repeat, lane.as_ref()))?;
    if example_after_real_runtime {
        step("example", &mut crate::example::check)?;
    }
    if let Some(lane) = lane {
        println!("\n==> {} (in the background from the tests on)", beside.join(", "));
        lane_timings = lane.join()?;
    }
    step("bench", &mut || {
        // The quick bench on the tests' build, held to the quick baseline in the repository: a
        // figure more than 20 % worse than it fails the run.
        if let Some(why) = runtime::missing_prerequisites()
            && !in_ci()
        {
            println!("SKIPPED the quick bench check: {why}");
            return Ok(());
        }
        crate::bench::run_bench(&["--quick", "--check"])
    })?;

    if options.steps.len() == STEPS.len() {
        println!("\nci: all steps passed");
    } else {
        println!("\nci: the {} steps asked for passed ({})", options.steps.len(), options.steps.join(", "));
    }
    for (name, took) in timings {
        println!("  {name:<13} {:>6.1} s", took.as_secs_f64());
    }
    for (name, took) in lane_timings {
        println!("  {name:<13} {:>6.1} s (in the background)", took.as_secs_f64());
    }
    let tests_ran = options.steps.iter().any(|step| ["test", "real-runtime"].contains(step));
    let not_checked = not_checked();
    if !tests_ran {
        return Ok(());
    }
    if not_checked.is_empty() {
        println!("every test checked all it names");
    } else {
        println!("not checked in this run ({}), by test:", not_checked.len());
        for line in not_checked {
            println!("  {line}");
        }
    }
    Ok(())
}

/// Says at the start which of `steps` will be skipped for a missing cargo tool, and the one
/// command that installs them; under CI, fails instead.
fn say_what_will_be_skipped(steps: &[&str]) -> Result<()> {
    let needs = [("features", "cargo-hack"), ("deny", "cargo-deny"), ("real-runtime's .deb check", "cargo-deb")];
    let missing: Vec<String> = needs
        .into_iter()
        .filter(|(step, tool)| steps.iter().any(|asked| step.starts_with(asked)) && !have(tool))
        .map(|(step, tool)| format!("{step} ({tool} is missing)"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let fix = "`cargo xtask setup` installs what is missing";
    if in_ci() {
        bail!("steps that cannot run: {}; {fix}", missing.join(", "));
    }
    println!("SKIPPING: {}; {fix}", missing.join(", "));
    Ok(())
}

/// The compile-only steps among `steps` that run in the background, from the tests' build to the
/// end of the real-runtime step: all of them when that step runs and this machine can run it,
/// none otherwise.
fn steps_beside_real_runtime(steps: &[&'static str]) -> Vec<&'static str> {
    if !steps.contains(&"real-runtime") || runtime::missing_prerequisites().is_some() {
        return Vec::new();
    }
    COMPILE_ONLY.iter().copied().filter(|step| steps.contains(step)).collect()
}

/// The packages whose feature combinations are not checked one by one: the binary, xtask, and
/// the facade, whose features only re-export crates checked here (none and all of them are
/// checked instead: its powerset would be 64 builds).
const PACKAGES_NOT_IN_POWERSET: [&str; 3] = ["kubelet-rs", "xtask", "kubelet-sdk"];

/// Features left out of every powerset: kubelet-cluster's OpenSSL backend, which only changes
/// kube's TLS (checked once, alone, rather than in every combination, each rebuilding kube); and
/// `default`, which each library crate keeps to features of its powerset (checked by
/// [`defaults_outside_powerset`] first), so its combinations are the powerset's again: with it,
/// 41 builds, 16 of them repeats.
const FEATURES_NOT_IN_POWERSET: [&str; 2] = ["openssl-tls", "default"];

/// Every feature combination of the library crates, as crates.io users build them: without
/// dev-dependencies, which would turn features on.
fn check_feature_combinations() -> Result<()> {
    if !tool("cargo-hack")? {
        return Ok(());
    }
    let metadata = output(cargo().args(["metadata", "--no-deps", "--format-version", "1", "--locked"]))?;
    let metadata: serde_json::Value = serde_json::from_str(&metadata).context("cargo metadata printed no JSON")?;
    let uncovered = defaults_outside_powerset(&metadata);
    if !uncovered.is_empty() {
        bail!(
            "the powerset leaves out `default`, but {}: give each a feature of its own and name that in `default`",
            uncovered.join("; ")
        );
    }
    // `--no-dev-deps` edits the manifests while it runs, which `--locked` refuses; `--offline`
    // keeps it to what the lock file already names, and the lock file is put back as it was.
    // Every crate the lock file names, optional ones included, is fetched first: the earlier
    // steps download only what their feature sets use.
    run(cargo().args(["fetch", "--locked"]))?;
    let lock = project_root()?.join("Cargo.lock");
    let locked = std::fs::read(&lock)?;
    let mut powerset = cargo();
    powerset.args(["hack", "check", "--feature-powerset", "--no-dev-deps", "--workspace", "--offline"]);
    for package in PACKAGES_NOT_IN_POWERSET {
        powerset.args(["--exclude", package]);
    }
    powerset.args(["--exclude-features", &FEATURES_NOT_IN_POWERSET.join(",")]);
    let result = run(&mut powerset).and_then(|()| {
        let openssl = ["hack", "check", "--no-dev-deps", "-p", "kubelet-cluster", "--offline"];
        run(cargo().args(openssl).args(["--no-default-features", "--features", "openssl-tls"]))?;
        let sdk = ["hack", "check", "--no-dev-deps", "-p", "kubelet-sdk", "--offline"];
        run(cargo().args(sdk).arg("--no-default-features"))?;
        run(cargo().args(sdk).arg("--all-features"))
    });
    if std::fs::read(&lock)? != locked {
        std::fs::write(&lock, &locked)?;
    }
    result
}

/// The library crates (in `cargo metadata`'s output) whose `default` feature turns on anything
/// but features of their powerset: an optional dependency or another crate's feature named there
/// alone would be checked in no combination once `default` is left out.
fn defaults_outside_powerset(metadata: &serde_json::Value) -> Vec<String> {
    let mut uncovered = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let name = package["name"].as_str().unwrap_or_default();
        if PACKAGES_NOT_IN_POWERSET.contains(&name) {
            continue;
        }
        let features = &package["features"];
        for enabled in features["default"].as_array().into_iter().flatten().filter_map(|f| f.as_str()) {
            let in_powerset = features.get(enabled).is_some() && !FEATURES_NOT_IN_POWERSET.contains(&enabled);
            if !in_powerset {
                uncovered.push(format!("{name}'s default turns on `{enabled}`"));
            }
        }
    }
    uncovered
}

/// Whether the cargo subcommand `program` (installed by `cargo xtask setup`) is there; in CI its
/// absence is an error, elsewhere a skip that says so.
fn tool(program: &str) -> Result<bool> {
    if have(program) {
        return Ok(true);
    }
    let why = format!("{program} is missing: run `cargo xtask setup` (it installs it from crates.io)");
    if in_ci() {
        bail!("{why}");
    }
    println!("SKIPPED: {why}");
    Ok(false)
}

/// The workspace's `rust-version` is the toolchain CI builds with: a toolchain older than it
/// cannot build the crates, and a newer one is noted, since the declared version is then no
/// longer the one proven.
fn check_toolchain() -> Result<()> {
    let manifest = std::fs::read_to_string(project_root()?.join("Cargo.toml"))?;
    let declared = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .context("no rust-version in Cargo.toml")?;
    let rustc = output(Command::new("rustc").arg("--version"))?;
    let used = rustc.split_whitespace().nth(1).context("rustc --version")?;
    let version = |v: &str| v.split('.').map(|n| n.parse::<u32>().unwrap_or(0)).collect::<Vec<_>>();
    let (declared_v, used_v) = (version(declared), version(used));
    // The CI machine has one toolchain and can fetch no other, so no `rust-toolchain.toml` pins
    // one: instead, every step of this run is the build with the declared rust-version, and this
    // fails when the toolchain is any other release.
    if used_v.get(..2) != declared_v.get(..2) {
        bail!(
            "rustc {used} builds this run, but Cargo.toml declares rust-version {declared}: a build with {declared} \
             is what proves it; set rust-version to the release CI builds with"
        );
    }
    println!("rustc {used} is the declared rust-version {declared}: every step of this run builds with it");
    Ok(())
}

/// Which of the real-runtime tests a run takes.
#[derive(Clone, Copy)]
enum RealTests {
    /// The tests that set a threshold from the host's free memory (named `*memory_pressure*`):
    /// they run before the compile-only steps start beside the others, since a compiler would
    /// move that figure under them.
    ReadingHostMemory,
    /// All the others.
    TheRest,
}

fn real_runtime_tests(repeat: u32, lane: Option<&Lane>) -> Result<()> {
    if let Some(why) = runtime::missing_prerequisites() {
        if in_ci() {
            bail!("real-runtime tests cannot run: {why}");
        }
        println!("SKIPPED real-runtime tests: {why}");
        return Ok(());
    }
    // The tests' build, whose agent the chaos scenarios and the demo run.
    let agent = harness::build(harness::Profile::Dev)?.agent;
    let started = runtime::start()?;
    // Cluster mode against upstream's kube-apiserver, which `cargo xtask setup` builds: in CI
    // its absence fails the run; elsewhere one line says its tests did not run.
    let control_plane = match cluster::missing_prerequisites() {
        Some(why) if in_ci() => bail!("the cluster-mode tests against kube-apiserver cannot run: {why}"),
        Some(why) => {
            println!("SKIPPED cluster-mode tests against kube-apiserver: {why}");
            false
        }
        None => {
            cluster::up()?;
            true
        }
    };
    let not_checked_file = not_checked_file()?;
    let tests = |which: RealTests| {
        let mut cmd = real_tests_command(which);
        cmd.env(ENV_NOT_CHECKED, &not_checked_file);
        for (key, value) in runtime::test_env() {
            cmd.env(key, value);
        }
        if control_plane {
            for (key, value) in cluster::test_env() {
                cmd.env(key, value);
            }
        }
        cmd
    };
    let (mut on_a_quiet_host, mut the_rest) = (tests(RealTests::ReadingHostMemory), tests(RealTests::TheRest));
    let mut result = Ok(());
    let mut chaos = None;
    for round in 1..=repeat {
        if repeat > 1 {
            println!("\n--> real-runtime run {round} of {repeat}");
        }
        let baseline = leaks::host_objects();
        // The others run even when the first ones failed, as one nextest run would have run them.
        // The compiler is stopped meanwhile: the memory it holds then stays as it is, while a
        // running one takes and gives back more than the tests' thresholds leave.
        let quiet = match lane {
            Some(lane) => lane.paused(|| run(&mut on_a_quiet_host)),
            None => run(&mut on_a_quiet_host),
        };
        let chaos_started = match chaos {
            None => start_chaos().map(|started| chaos = Some(started)),
            Some(_) => Ok(()),
        };
        let rest = run(&mut the_rest);
        result = quiet
            .and(chaos_started)
            .and(rest)
            .with_context(|| format!("real-runtime run {round} of {repeat} failed"))
            .and_then(|()| nothing_leaked(&baseline));
        if result.is_err() {
            break;
        }
    }
    // Joined even when the tests failed: the scenarios stop their agents and their containerd.
    let chaos_result = chaos.map_or(Ok(()), join_chaos);
    result = result.and(chaos_result);
    if result.is_ok() {
        println!("\n--> the .deb, installed and run under its unit (cargo xtask dist)");
        result = match dist::missing_prerequisites() {
            Some(why) if in_ci() => Err(anyhow::anyhow!("the package check cannot run: {why}")),
            Some(why) => {
                println!("SKIPPED the package check: {why}");
                Ok(())
            }
            None => dist::check_package().context("the package check failed"),
        };
    }
    if result.is_ok() {
        // The README's first command, checked: every example pod Running and ready, or Completed.
        println!("\n--> demo --check");
        // The same binary: building the agent's crate alone would compile it again with fewer
        // features than the tests turned on.
        let agent = agent.to_string_lossy();
        let args = ["--duration", "40s", "--check", "--agent", &agent];
        result = demo::run_demo(&args).context("demo --check failed");
    }
    if control_plane {
        cluster::down()?;
    }
    if started {
        runtime::stop()?;
    }
    result
}

/// Starts the short chaos scenarios on the project's second containerd, beside the real-runtime
/// tests on the first (an agent owns the runtime it runs on): the dev profile's binary the tests'
/// build has made already (an optimized build would take minutes and check nothing more).
fn start_chaos() -> Result<Background> {
    let mut command = Command::new(std::env::current_exe()?);
    command.args(["chaos", "--short", "--dev", "--second-runtime"]);
    println!("\n--> chaos, short version (the full one: cargo xtask chaos), on the second containerd");
    Background::spawn(command, "the chaos scenarios", project_root()?.join("target/ci-chaos.log"))
}

/// Waits for the chaos scenarios and prints their report.
fn join_chaos(chaos: Background) -> Result<()> {
    println!("\n==> chaos, short version (beside the real-runtime tests)");
    let log = chaos.join().context("chaos --short failed")?;
    // The report the run ends with.
    print!("{}", log.rfind("\nchaos: ").map_or("", |start| &log[start + 1..]));
    Ok(())
}

/// A run of the real-runtime tests `which` names, one at a time.
fn real_tests_command(which: RealTests) -> Command {
    const MEMORY: &str = "memory_pressure";
    let mut cmd = cargo();
    if nextest() {
        let filter = match which {
            RealTests::ReadingHostMemory => format!("{REAL_FILTER} and test(/{MEMORY}/)"),
            RealTests::TheRest => format!("{REAL_FILTER} and not test(/{MEMORY}/)"),
        };
        cmd.args(["nextest", "run", "--workspace", "--locked", "--no-fail-fast"]);
        // One at a time: an agent under test owns the whole runtime, as a kubelet owns its node,
        // and would remove other tests' pods as orphans.
        cmd.args(["--test-threads", "1", "--no-tests", "warn", "-E", &filter]);
    } else {
        cmd.args(["test", "--workspace", "--locked", "--", "--test-threads", "1"]);
        match which {
            RealTests::ReadingHostMemory => cmd.args([format!("real_{MEMORY}")]),
            RealTests::TheRest => cmd.args(["real_", "--skip", MEMORY]),
        };
    }
    cmd
}

/// Fails when the real-runtime tests left on the host what pods leave (pod cgroups, network
/// namespaces, IPAM reservations, veths, mounts, shims) beyond `baseline`, after letting it settle.
fn nothing_leaked(baseline: &leaks::HostObjects) -> Result<()> {
    let leaked = leaks::leaked_after(baseline, std::time::Duration::from_secs(15));
    let leaked: Vec<String> = leaked
        .into_iter()
        .filter(|(_, objects)| !objects.is_empty())
        .map(|(kind, objects)| format!("{kind}: {}", objects.join(", ")))
        .collect();
    if leaked.is_empty() {
        println!("the real-runtime tests left nothing on the host");
        Ok(())
    } else {
        bail!("the real-runtime tests left on the host: {}", leaked.join("; "))
    }
}

/// `cargo xtask bench`: every benchmark, which print their own figures; the ones that need the
/// real runtime get it when this machine can start it.
pub(crate) fn run_bench() -> Result<()> {
    let mut cmd = cargo();
    cmd.args(["bench", "--workspace", "--locked"]);
    let started = match runtime::missing_prerequisites() {
        Some(why) => {
            println!("real-runtime benchmarks will be skipped: {why}");
            false
        }
        None => {
            let started = runtime::start()?;
            for (key, value) in runtime::test_env() {
                cmd.env(key, value);
            }
            started
        }
    };
    let result = run(&mut cmd);
    if started {
        runtime::stop()?;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_feature_must_be_one_the_powerset_checks() {
        let metadata = serde_json::json!({"packages": [
            {"name": "kubelet-cri-client", "features": {"default": [], "server": ["tonic/server"]}},
            {"name": "kubelet-cluster", "features": {"default": ["rustls-tls"], "rustls-tls": [], "openssl-tls": []}},
            {"name": "kubelet-sdk", "features": {"default": ["dep:server"]}},
        ]});
        assert!(defaults_outside_powerset(&metadata).is_empty());
        let metadata = serde_json::json!({"packages": [
            {"name": "a", "features": {"default": ["dep:notify", "file-source"], "file-source": []}},
            {"name": "b", "features": {"default": ["openssl-tls"], "openssl-tls": []}},
        ]});
        assert_eq!(
            defaults_outside_powerset(&metadata),
            ["a's default turns on `dep:notify`", "b's default turns on `openssl-tls`"]
        );
    }

    #[test]
    fn only_and_skip_choose_steps_in_their_order() {
        assert_eq!(CiOptions::parse(&[]).unwrap(), CiOptions { repeat: 1, steps: STEPS.to_vec() });
        let only = CiOptions::parse(&["--only", "real-runtime,clippy"]).unwrap();
        assert_eq!(only.steps, ["clippy", "real-runtime"], "in the steps' order, not the list's");
        let skip = CiOptions::parse(&["--skip", "features,package", "--repeat", "3"]).unwrap();
        assert_eq!(skip.repeat, 3);
        assert!(!skip.steps.contains(&"features") && !skip.steps.contains(&"package") && skip.steps.len() == 11);
        let error = CiOptions::parse(&["--only", "lint"]).unwrap_err().to_string();
        assert!(error.contains("no ci step \"lint\"") && error.contains("bench-build"), "{error}");
        assert!(CiOptions::parse(&["--repeat", "0"]).is_err());
        assert!(CiOptions::parse(&["--only"]).is_err());
        for nothing in ["", " ", ","] {
            let error = CiOptions::parse(&["--only", nothing]).unwrap_err().to_string();
            assert!(error.contains("no ci step named"), "--only {nothing:?}: {error}");
            assert!(CiOptions::parse(&["--skip", nothing]).is_err(), "--skip {nothing:?}");
        }
    }
}
