//! `cargo xtask chaos`: the release agent on the project's containerd, under faults.
//!
//! Four scenarios, each bounded in time; each reports passed or failed with its counts, and the
//! command exits non-zero on any failure. `--short` is the version CI runs, with `--dev` (the
//! tests' build) and `--second-runtime` (the project's second containerd, beside the real-runtime
//! tests on the first).
//! - crash: start pods, SIGKILL the agent at a random moment of their start-up, restart it, and
//!   count duplicates, orphans and missing pods once it has converged; then leaks after teardown.
//! - outage: stop containerd while pods run and one is being created; `/healthz` must say so,
//!   and the agent must converge without duplicates once containerd is back, the pods that ran
//!   before it the same ones after.
//! - churn: create/delete cycles through the file source; anonymous memory, threads and open
//!   files after a warm-up of two batches and at the end (at most 14 KiB more anonymous memory for
//!   each pod churned after the warm-up), and leaked cgroups, pod directories and log directories.
//! - bad input: malformed, oversized, duplicate and hostile manifests next to good ones, a bad
//!   CNI configuration and a missing image: the good pods run, the agent neither panics nor grows,
//!   and each fault has a clear error.
//!
//! A shim left that the runtime no longer knows fails a scenario that killed neither the agent
//! nor the runtime; in the others, no more may be left than sandboxes in flight at its kills.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    harness::{self, Agent, Binaries, CriTool, NAMESPACE, NODE, write_manifest},
    leaks, runtime,
    util::{SmallFilesystems, in_ci, is_root},
};

#[derive(Debug, Clone, PartialEq, Eq)]
struct Options {
    crash_rounds: usize,
    crash_pods: usize,
    /// Pods that run through all the faults of a scenario, checked after each.
    steady_pods: usize,
    runtime_crash_rounds: usize,
    /// SIGKILL at a random moment within this much of writing the manifests.
    crash_window: Duration,
    outage_pods: usize,
    outage: Duration,
    churn_cycles: usize,
    churn_batch: usize,
    /// Copies of each kind of bad manifest.
    bad_copies: usize,
}

impl Options {
    fn full() -> Options {
        Options {
            crash_rounds: 20,
            crash_pods: 20,
            steady_pods: 5,
            runtime_crash_rounds: 6,
            crash_window: Duration::from_millis(3000),
            outage_pods: 10,
            outage: Duration::from_secs(10),
            churn_cycles: 2000,
            churn_batch: 20,
            bad_copies: 5,
        }
    }

    fn short() -> Options {
        Options {
            crash_rounds: 3,
            crash_pods: 5,
            steady_pods: 3,
            runtime_crash_rounds: 2,
            crash_window: Duration::from_millis(1500),
            outage_pods: 3,
            outage: Duration::from_secs(10),
            churn_cycles: 60,
            churn_batch: 10,
            bad_copies: 1,
        }
    }
}

/// What `cargo xtask chaos` was asked for besides the scenarios' sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    /// Only the scenario of this name.
    only: Option<String>,
    /// The agent's build.
    profile: harness::Profile,
    /// The containerd it runs on.
    runtime: runtime::Instance,
}

fn parse(args: &[&str]) -> Result<(Options, Run)> {
    let mut options = Options::full();
    let mut run = Run { only: None, profile: harness::Profile::Release, runtime: runtime::Instance::First };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match *arg {
            "--short" => options = Options::short(),
            "--only" => {
                run.only = Some(args.next().context("--only takes crash, outage, churn or bad-input")?.to_string());
            }
            // CI's: the tests' build, which it has made, on the second containerd beside the
            // real-runtime tests on the first.
            "--dev" => run.profile = harness::Profile::Dev,
            "--second-runtime" => run.runtime = runtime::Instance::Second,
            other => bail!(
                "unknown chaos option {other:?}; usage: cargo xtask chaos [--short] [--only SCENARIO] [--dev] \
                 [--second-runtime]"
            ),
        }
    }
    Ok((options, run))
}

/// What one scenario found.
#[derive(Debug, Default)]
struct Outcome {
    name: &'static str,
    /// Named counts; any count under `failures` fails the scenario when non-zero.
    counts: BTreeMap<String, String>,
    failures: Vec<String>,
}

impl Outcome {
    fn new(name: &'static str) -> Outcome {
        Outcome { name, ..Outcome::default() }
    }

    fn count(&mut self, key: impl Into<String>, value: impl ToString) {
        self.counts.insert(key.into(), value.to_string());
    }

    /// Records a count that must be zero.
    fn zero(&mut self, key: impl Into<String>, value: usize, detail: impl FnOnce() -> String) {
        let key = key.into();
        self.count(key.clone(), value);
        if value > 0 {
            self.failures.push(format!("{key} = {value}: {}", detail()));
        }
    }

    fn fail(&mut self, why: impl Into<String>) {
        self.failures.push(why.into());
    }

    fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

pub(crate) fn run_chaos(args: &[&str]) -> Result<()> {
    let (options, run) = parse(args)?;
    runtime::select(run.runtime)?;
    if let Some(why) = runtime::missing_prerequisites() {
        if in_ci() || is_root() {
            bail!("chaos needs the project's containerd: {why}");
        }
        bail!("chaos runs real pods on the project's containerd, which needs root: {why}");
    }
    let started_runtime = runtime::start()?;
    let result =
        harness::build(run.profile).and_then(|binaries| run_scenarios(&options, run.only.as_deref(), &binaries));
    if started_runtime {
        runtime::stop()?;
    }
    report(&result?)
}

/// Prints each scenario's verdict and counts; fails if any scenario failed.
fn report(outcomes: &[Outcome]) -> Result<()> {
    println!("\nchaos: {} scenario(s)", outcomes.len());
    for outcome in outcomes {
        let counts: Vec<String> = outcome.counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!(
            "  {:<10} {}  ({})",
            outcome.name,
            if outcome.passed() { "PASSED" } else { "FAILED" },
            counts.join(", ")
        );
        for failure in &outcome.failures {
            println!("             - {failure}");
        }
    }
    if outcomes.iter().any(|o| !o.passed()) {
        bail!("chaos: a scenario failed");
    }
    Ok(())
}

type Scenario = fn(&Options, &Binaries, &Path) -> Result<Outcome>;

fn run_scenarios(options: &Options, only: Option<&str>, binaries: &Binaries) -> Result<Vec<Outcome>> {
    let scenarios: [(&'static str, Scenario); 6] = [
        ("crash", crash),
        ("runtime-crash", runtime_crash),
        ("outage", outage),
        ("disk-full", disk_full),
        ("churn", churn),
        ("bad-input", bad_input),
    ];
    if let Some(name) = only
        && !scenarios.iter().any(|(n, _)| *n == name)
    {
        bail!("no scenario {name:?}: {}", scenarios.map(|(n, _)| n).join(", "));
    }
    let mut outcomes = Vec::new();
    for (name, scenario) in scenarios {
        if only.is_some_and(|o| o != name) {
            continue;
        }
        println!("\n==> chaos: {name}");
        let dir = runtime::instance().state_dir().join("chaos").join(name);
        let _ = fs::remove_dir_all(&dir);
        let baseline = leaks::host_objects();
        let mut outcome = scenario(options, binaries, &dir).unwrap_or_else(|err| {
            let mut outcome = Outcome::new(name);
            outcome.fail(format!("{name}: {err:#}"));
            outcome
        });
        // Counted before anything is cleaned up for the scenario: what its agent left.
        let mut leaked = leaks::leaked_after(&baseline, Duration::from_secs(15));
        let lost_netns = if KILLS_THE_RUNTIME.contains(&name) {
            let (held, lost) = leaks::split_lost_netns(
                leaked.remove("netns").unwrap_or_default(),
                &runtime::network_namespaces_in_use(),
            );
            leaked.insert("netns", held);
            let mounts = leaked.remove("mounts").unwrap_or_default();
            let netns_dir = runtime::instance().netns_dir();
            let of_lost = |mount: &String| leaks::is_netns_mount_of(mount, &lost, &netns_dir);
            leaked.insert("mounts", mounts.into_iter().filter(|m| !of_lost(m)).collect());
            outcome.count("netns the runtime lost", lost.len());
            lost
        } else {
            Vec::new()
        };
        for (kind, leaked) in leaked {
            if kind == "shims" {
                let (held, lost) = leaks::split_lost_shims(leaked, &runtime::container_ids());
                outcome.zero(leak_key(kind), held.len(), || held.join(", "));
                outcome.count("shims the runtime lost", lost.len());
                let allowed = lost_shims_allowed(name, options);
                if lost.len() > allowed {
                    outcome.fail(format!(
                        "the runtime lost {} shim(s), more than the {allowed} the sandboxes its kills can cut short: {}",
                        lost.len(),
                        lost.join(", ")
                    ));
                }
                continue;
            }
            outcome.zero(leak_key(kind), leaked.len(), || leaked.join(", "));
        }
        // Whatever happened, nothing of the scenario stays in the runtime, nor what it lost.
        clean_runtime(&CriTool::new(binaries.cri_tool.clone()));
        leaks::remove_netns(&lost_netns);
        if outcome.passed() {
            let _ = fs::remove_dir_all(&dir);
        } else {
            println!("chaos: {name} failed; its files stay in {}", dir.display());
        }
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// The scenarios that kill containerd. A RunPodSandbox it dies in leaves the network namespace
/// it had made, which it no longer knows on its return; those are counted apart, as "netns the
/// runtime lost", and any other netns left is a failure as in every scenario.
const KILLS_THE_RUNTIME: [&str; 1] = ["runtime-crash"];

/// How many shims scenario `name` may leave that the runtime no longer knows: a shim is lost by
/// a RunPodSandbox in flight when the agent or containerd is killed, so at most one for each pod
/// a round starts, for each kill (crash: a SIGKILL each round and a second one every other round;
/// runtime-crash: containerd's SIGKILL each round; outage: the one pod written as containerd
/// stops); none in the scenarios that kill neither.
fn lost_shims_allowed(name: &str, options: &Options) -> usize {
    match name {
        "crash" => (options.crash_rounds + options.crash_rounds / 2) * options.crash_pods,
        "runtime-crash" => options.runtime_crash_rounds * options.crash_pods,
        "outage" => 1,
        _ => 0,
    }
}

/// The count's name for leaks of one kind of host object.
fn leak_key(kind: &str) -> &'static str {
    match kind {
        "netns" => "leaked netns",
        "IPAM" => "leaked IPAM",
        "veth" => "leaked veths",
        "mounts" => "leaked mounts",
        "shims" => "leaked shims",
        _ => "leaked cgroups",
    }
}

/// A small pseudo-random generator, seeded from the clock (the seed is printed).
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = harness::unix_now().to_bits() | 1;
        println!("chaos: random seed {seed}");
        Rng(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// What the runtime holds of the harness namespace, judged against the expected pod names.
#[derive(Debug, Default)]
struct Judgement {
    /// Extra ready sandboxes or running containers of one pod, and pods run under two UIDs.
    duplicates: Vec<String>,
    /// Ready sandboxes or running containers of pods that should not run.
    orphans: Vec<String>,
    /// Expected pods without exactly one ready sandbox and one running container.
    missing: Vec<String>,
}

fn judge(state: &serde_json::Map<String, serde_json::Value>, expected: &BTreeSet<String>) -> Judgement {
    let mut judgement = Judgement::default();
    let mut live_uids: BTreeMap<String, usize> = BTreeMap::new();
    for (uid, pod) in state {
        let name = harness::manifest_name(pod["name"].as_str().unwrap_or_default()).to_owned();
        let ready = pod["ready_sandboxes"].as_u64().unwrap_or(0);
        let running: BTreeMap<String, u64> = pod["running"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect())
            .unwrap_or_default();
        if ready > 1 {
            judgement.duplicates.push(format!("{name} ({uid}): {ready} ready sandboxes"));
        }
        for (container, n) in &running {
            if *n > 1 {
                judgement.duplicates.push(format!("{name} ({uid}): {n} running {container}"));
            }
        }
        let live = ready > 0 || running.values().any(|n| *n > 0);
        if live {
            *live_uids.entry(name.clone()).or_default() += 1;
            if !expected.contains(&name) {
                judgement.orphans.push(format!("{name} ({uid})"));
            }
        }
    }
    for (name, uids) in &live_uids {
        if *uids > 1 && expected.contains(name) {
            judgement.duplicates.push(format!("{name}: runs under {uids} UIDs"));
        }
    }
    for name in expected {
        let ok = state.values().any(|pod| {
            harness::manifest_name(pod["name"].as_str().unwrap_or_default()) == name
                && pod["ready_sandboxes"] == 1
                && pod["running"].as_object().is_some_and(|m| m.values().all(|v| v == 1) && !m.is_empty())
        });
        if !ok {
            judgement.missing.push(name.clone());
        }
    }
    judgement
}

/// Waits until `/pods` shows exactly `expected`, all Running, and the runtime runs each once; the
/// duplicates seen on the way count too.
fn converge(agent: &mut Agent, tool: &CriTool, expected: &BTreeSet<String>, timeout: Duration) -> Result<Judgement> {
    let deadline = Instant::now() + timeout;
    let mut seen_duplicates = BTreeSet::new();
    loop {
        if !agent.alive() {
            bail!("the agent exited; see {}", agent.dir.join("agent.log").display());
        }
        let pods = agent.pods().unwrap_or_default();
        let api_ok = pods.len() == expected.len() && pods.iter().all(|(n, p)| expected.contains(n) && p == "Running");
        // The runtime may not answer yet (just restarted): look again.
        let Ok(state) = tool.state() else {
            if Instant::now() > deadline {
                bail!("the runtime did not answer within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        let mut judgement = judge(&state, expected);
        seen_duplicates.extend(judgement.duplicates.iter().cloned());
        let done = api_ok && judgement.missing.is_empty() && judgement.orphans.is_empty();
        if done || Instant::now() > deadline {
            judgement.duplicates = seen_duplicates.into_iter().collect();
            if !api_ok {
                judgement.missing.push(format!("/pods after {timeout:?}: {pods:?}"));
            }
            return Ok(judgement);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Removes every manifest and waits until neither `/pods` nor the runtime holds any pod of them.
fn teardown(agent: &mut Agent, tool: &CriTool, timeout: Duration) -> Result<()> {
    for entry in fs::read_dir(agent.dir.join("manifests"))? {
        fs::remove_file(entry?.path())?;
    }
    let deadline = Instant::now() + timeout;
    loop {
        if agent.pods()?.is_empty() && tool.state()?.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("removed pods still present after {timeout:?}: /pods {:?}", agent.pods()?);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What an agent leaves on the host for pods it no longer runs, once it has had
/// [`HOUSEKEEPING_GRACE`] to remove it: a pod's directory goes at the first housekeeping (every
/// 2 s, as upstream's) after the pod has terminated, which can come after its sandbox has left
/// the runtime.
fn settled_host_leaks(dir: &Path) -> Vec<String> {
    let deadline = std::time::Instant::now() + HOUSEKEEPING_GRACE;
    loop {
        let leaks = host_leaks(dir);
        if leaks.is_empty() || std::time::Instant::now() >= deadline {
            return leaks;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How long the agent has to remove what pods it no longer runs leave: several housekeeping
/// periods, on a loaded machine.
const HOUSEKEEPING_GRACE: Duration = Duration::from_secs(20);

/// What an agent leaves on the host for pods it no longer runs: pod directories and log
/// directories (cgroups are checked around every scenario).
fn host_leaks(dir: &Path) -> Vec<String> {
    let mut leaks = Vec::new();
    for sub in ["root/pods", "logs", "containers"] {
        if let Ok(entries) = fs::read_dir(dir.join(sub)) {
            leaks.extend(entries.filter_map(Result::ok).map(|e| format!("{sub}/{}", e.file_name().to_string_lossy())));
        }
    }
    leaks
}

/// Stops and removes whatever of the harness namespace is left in the runtime.
fn clean_runtime(tool: &CriTool) {
    if let Ok(state) = tool.state()
        && !state.is_empty()
    {
        println!("chaos: removing {} pod(s) left in the runtime", state.len());
        let _ = tool.remove_namespace();
    }
}

fn names(prefix: &str, n: usize) -> BTreeSet<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

fn write_all(dir: &Path, names: &BTreeSet<String>) -> Result<()> {
    for name in names {
        write_manifest(&dir.join("manifests"), name, &harness::manifest(name))?;
    }
    Ok(())
}

fn record(outcome: &mut Outcome, judgement: &Judgement, totals: &mut [usize; 3]) {
    totals[0] += judgement.duplicates.len();
    totals[1] += judgement.orphans.len();
    totals[2] += judgement.missing.len();
    for d in &judgement.duplicates {
        outcome.failures.push(format!("duplicate: {d}"));
    }
    for o in &judgement.orphans {
        outcome.failures.push(format!("orphan: {o}"));
    }
    for m in &judgement.missing {
        outcome.failures.push(format!("not converged: {m}"));
    }
}

/// What a crash round starts its pods with, so that the SIGKILL lands in each step in turn.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A plain pod: sandbox, container start.
    Start,
    /// A memory-backed emptyDir (a tmpfs mount) and a downwardAPI volume (the atomic writer).
    Volumes,
    /// `imagePullPolicy: Always`: an image pull from the local registry.
    Pull,
}

impl Step {
    fn of_round(round: usize) -> Step {
        [Step::Start, Step::Volumes, Step::Pull][round % 3]
    }

    fn manifest(self, name: &str) -> String {
        let pod = with_pre_stop(&harness::manifest(name));
        match self {
            Step::Start => pod,
            Step::Volumes => with_volumes(
                &pod,
                &[
                    ("scratch", "emptyDir: {medium: Memory}"),
                    ("info", "downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}"),
                ],
            ),
            Step::Pull => pod.replace("imagePullPolicy: IfNotPresent", "imagePullPolicy: Always"),
        }
    }
}

/// Adds a preStop hook of one second, so that a pod being deleted spends that long in it.
fn with_pre_stop(manifest: &str) -> String {
    manifest.replace(
        "    imagePullPolicy: IfNotPresent\n",
        "    imagePullPolicy: IfNotPresent\n    lifecycle: {preStop: {exec: {command: [sleep, \"1\"]}}}\n",
    )
}

/// Adds volumes, each mounted at `/<name>` in the pod's container.
fn with_volumes(manifest: &str, volumes: &[(&str, &str)]) -> String {
    let mounts: Vec<String> = volumes.iter().map(|(name, _)| format!("{{name: {name}, mountPath: /{name}}}")).collect();
    let mut yaml = manifest.replace(
        "    imagePullPolicy: IfNotPresent\n",
        &format!("    imagePullPolicy: IfNotPresent\n    volumeMounts: [{}]\n", mounts.join(", ")),
    );
    yaml.push_str("  volumes:\n");
    for (name, source) in volumes {
        yaml.push_str(&format!("  - {{name: {name}, {source}}}\n"));
    }
    yaml
}

/// What must not change while a pod keeps running: its UID, ready sandboxes and running
/// containers, by manifest name.
type Identities = BTreeMap<String, (String, BTreeSet<String>, BTreeSet<String>)>;

fn identities(state: &serde_json::Map<String, serde_json::Value>, names: &BTreeSet<String>) -> Identities {
    let ids = |v: &serde_json::Value| -> BTreeSet<String> {
        v.as_array().into_iter().flatten().filter_map(|id| id.as_str().map(str::to_owned)).collect()
    };
    state
        .iter()
        .filter(|(_, pod)| names.contains(harness::manifest_name(pod["name"].as_str().unwrap_or_default())))
        .filter(|(_, pod)| pod["ready_sandboxes"].as_u64().unwrap_or(0) > 0)
        .map(|(uid, pod)| {
            let name = harness::manifest_name(pod["name"].as_str().unwrap_or_default()).to_owned();
            (name, (uid.clone(), ids(&pod["ready_sandbox_ids"]), ids(&pod["running_ids"])))
        })
        .collect()
}

/// Restart counts summed per pod, by manifest name, from `/pods`.
fn restart_counts(agent: &Agent) -> Result<BTreeMap<String, u64>> {
    let (_, body) = harness::get(&agent.socket(), "/pods")?;
    let list: serde_json::Value = serde_json::from_str(&body).context("decoding /pods")?;
    let mut counts = BTreeMap::new();
    for pod in list["items"].as_array().into_iter().flatten().filter(|p| p["metadata"]["namespace"] == NAMESPACE) {
        let name = harness::manifest_name(pod["metadata"]["name"].as_str().unwrap_or_default()).to_owned();
        let statuses = pod["status"]["containerStatuses"].as_array().into_iter().flatten();
        counts.insert(name, statuses.map(|s| s["restartCount"].as_u64().unwrap_or(0)).sum());
    }
    Ok(counts)
}

/// The pods `/pods` shows Running, by manifest name.
fn running_pods(agent: &Agent) -> Result<BTreeSet<String>> {
    let (_, body) = harness::get(&agent.socket(), "/pods")?;
    let list: serde_json::Value = serde_json::from_str(&body).context("decoding /pods")?;
    let pods = list["items"].as_array().into_iter().flatten();
    let running = pods.filter(|p| p["metadata"]["namespace"] == NAMESPACE && p["status"]["phase"] == "Running");
    Ok(running.map(|p| harness::manifest_name(p["metadata"]["name"].as_str().unwrap_or_default()).to_owned()).collect())
}

/// The pods that run through a whole scenario, each with an emptyDir and a downwardAPI volume:
/// written first, their identity and a file planted in their emptyDir checked after every fault.
struct SteadyPods {
    names: BTreeSet<String>,
    identities: Identities,
}

impl SteadyPods {
    const MARKER: &str = "written-before-the-faults";

    /// Starts `n` pods with an emptyDir each, waits for them, and plants a file in each emptyDir.
    fn start(n: usize, agent: &mut Agent, tool: &CriTool, outcome: &mut Outcome) -> Result<SteadyPods> {
        let names = names("steady", n);
        for name in &names {
            let volumes = [
                ("data", "emptyDir: {}"),
                ("info", "downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}"),
            ];
            let manifest = with_volumes(&harness::manifest(name), &volumes);
            write_manifest(&agent.dir.join("manifests"), name, &manifest)?;
        }
        let judgement = converge(agent, tool, &names, Duration::from_secs(120))?;
        record(outcome, &judgement, &mut [0; 3]);
        let identities = identities(&tool.state()?, &names);
        let steady = SteadyPods { names, identities };
        for (uid, _, _) in steady.identities.values() {
            fs::write(steady.data_dir(agent, uid).join("marker"), Self::MARKER)?;
        }
        Ok(steady)
    }

    fn data_dir(&self, agent: &Agent, uid: &str) -> PathBuf {
        agent.dir.join("root/pods").join(uid).join("volumes/kubernetes.io~empty-dir/data")
    }

    /// What changed of the steady pods: identity, restart count, emptyDir data.
    fn check(&self, agent: &Agent, tool: &CriTool) -> Result<Vec<String>> {
        let mut changed = Vec::new();
        let now = identities(&tool.state()?, &self.names);
        for (name, before) in &self.identities {
            match now.get(name) {
                Some(after) if after == before => {}
                Some(after) => changed.push(format!("{name}: was {before:?}, now {after:?}")),
                None => changed.push(format!("{name}: no longer runs")),
            }
            let marker = fs::read_to_string(self.data_dir(agent, &before.0).join("marker")).unwrap_or_default();
            if marker != Self::MARKER {
                changed.push(format!("{name}: the file in its emptyDir is gone or changed ({marker:?})"));
            }
        }
        if self.identities.len() != self.names.len() {
            changed.push(format!("only {} of {} steady pods ran at first", self.identities.len(), self.names.len()));
        }
        let restarts = restart_counts(agent)?;
        for name in &self.names {
            let count = restarts.get(name).copied().unwrap_or(0);
            if count != 0 {
                changed.push(format!("{name}: restart count {count}"));
            }
        }
        Ok(changed)
    }
}

/// Kills the agent and starts it again, waiting until it is healthy.
fn crash_and_restart(agent: &mut Agent, binary: &Path) -> Result<()> {
    agent.kill();
    let dir = agent.dir.clone();
    *agent = Agent::start(binary, &dir, &[])?;
    agent.wait_healthy(Duration::from_secs(30))
}

fn crash(options: &Options, binaries: &Binaries, dir: &Path) -> Result<Outcome> {
    let mut second_kills = 0;
    let mut outcome =
        rounds_under_fault("crash", options.crash_rounds, options, binaries, dir, |agent, rng, round| {
            let running = agent.running();
            crash_and_restart(agent, &binaries.agent)?;
            let mut line = format!("SIGKILL, {running} pod(s) Running by then");
            if round % 2 == 0 {
                // The second kill lands in the recovery from the first.
                let again = Duration::from_millis(rng.below(options.crash_window.as_millis() as u64));
                std::thread::sleep(again);
                crash_and_restart(agent, &binaries.agent)?;
                second_kills += 1;
                line.push_str(&format!(", again {again:?} into the recovery"));
            }
            Ok(line)
        })?;
    outcome.count("second kills", second_kills);
    Ok(outcome)
}

/// SIGKILL containerd while pods start; once it is back, the agent converges and the pods that
/// ran before keep running as they were.
fn runtime_crash(options: &Options, binaries: &Binaries, dir: &Path) -> Result<Outcome> {
    rounds_under_fault("runtime-crash", options.runtime_crash_rounds, options, binaries, dir, |agent, _, _| {
        runtime::kill_containerd()?;
        std::thread::sleep(Duration::from_millis(500));
        runtime::start_containerd()?;
        if !agent.alive() {
            bail!("the agent exited while containerd was down");
        }
        Ok("containerd SIGKILL".to_owned())
    })
}

/// The rounds `crash` and `runtime-crash` share. Steady pods run throughout. Each round writes
/// its pods (the step they exercise rotates) and deletes the last round's, waits a random moment
/// within the crash window, and lets `strike` fault the node (it says what it did); then the
/// agent must converge, and the steady pods must be as they were.
fn rounds_under_fault(
    name: &'static str,
    rounds: usize,
    options: &Options,
    binaries: &Binaries,
    dir: &Path,
    mut strike: impl FnMut(&mut Agent, &mut Rng, usize) -> Result<String>,
) -> Result<Outcome> {
    let mut outcome = Outcome::new(name);
    let tool = CriTool::new(binaries.cri_tool.clone());
    let mut rng = Rng::new();
    let mut totals = [0usize; 3];
    let mut agent = Agent::start(&binaries.agent, dir, &[])?;
    agent.wait_healthy(Duration::from_secs(30))?;
    let steady = SteadyPods::start(options.steady_pods, &mut agent, &tool, &mut outcome)?;
    let manifests = dir.join("manifests");
    let mut previous = BTreeSet::new();
    let mut changed = Vec::new();
    for round in 1..=rounds {
        let step = Step::of_round(round);
        let new = names(&format!("{}{round}", name.replace('-', "")), options.crash_pods);
        for pod in &new {
            write_manifest(&manifests, pod, &step.manifest(pod))?;
        }
        // The last round's pods are deleted now: the fault finds them in their preStop hook.
        for pod in &previous {
            fs::remove_file(manifests.join(format!("{pod}.yaml")))?;
        }
        let delay = Duration::from_millis(rng.below(options.crash_window.as_millis() as u64));
        std::thread::sleep(delay);
        let what = strike(&mut agent, &mut rng, round).with_context(|| format!("round {round}"))?;
        println!("chaos: {name} round {round} ({step:?}): {delay:?} after writing, {what}");
        let expected: BTreeSet<String> = steady.names.union(&new).cloned().collect();
        let judgement = converge(&mut agent, &tool, &expected, Duration::from_secs(120))?;
        record(&mut outcome, &judgement, &mut totals);
        changed.extend(steady.check(&agent, &tool)?.into_iter().map(|c| format!("round {round}: {c}")));
        previous = new;
    }
    teardown(&mut agent, &tool, Duration::from_secs(120))?;
    let leaks = settled_host_leaks(dir);
    agent.stop(Duration::from_secs(10))?;
    outcome.count("rounds", rounds);
    outcome.count("duplicates", totals[0]);
    outcome.count("orphans", totals[1]);
    outcome.count("not converged", totals[2]);
    outcome.zero("steady pods changed", changed.len(), || changed.join("; "));
    outcome.zero("leaked directories", leaks.len(), || leaks.join(", "));
    Ok(outcome)
}

fn outage(options: &Options, binaries: &Binaries, dir: &Path) -> Result<Outcome> {
    let mut outcome = Outcome::new("outage");
    let tool = CriTool::new(binaries.cri_tool.clone());
    let mut agent = Agent::start(&binaries.agent, dir, &[])?;
    agent.wait_healthy(Duration::from_secs(30))?;
    let steady = SteadyPods::start(options.steady_pods, &mut agent, &tool, &mut outcome)?;
    let mut expected = names("outage", options.outage_pods);
    write_all(dir, &expected)?;
    expected.extend(steady.names.iter().cloned());
    let before = converge(&mut agent, &tool, &expected, Duration::from_secs(120))?;
    let mut totals = [0usize; 3];
    record(&mut outcome, &before, &mut totals);
    // One more pod, being created when the runtime goes away.
    let late = "outage-late".to_owned();
    write_manifest(&dir.join("manifests"), &late, &harness::manifest(&late))?;
    expected.insert(late);
    std::thread::sleep(Duration::from_millis(50));
    runtime::stop_containerd()?;
    let down = Instant::now();
    let mut unhealthy = None;
    while down.elapsed() < options.outage {
        if let Ok((code, body)) = harness::get(&agent.socket(), "/healthz")
            && code != 200
            && unhealthy.is_none()
        {
            unhealthy = Some((down.elapsed(), body.lines().next().unwrap_or_default().to_owned()));
        }
        if !agent.alive() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let restarted = runtime::start_containerd();
    if !agent.alive() {
        outcome.fail("the agent exited during the outage");
    }
    restarted?;
    match &unhealthy {
        Some((after, line)) => outcome.count("healthz down after", format!("{:.1} s ({line})", after.as_secs_f64())),
        None => outcome.fail(format!("/healthz never reported the runtime down in {:?}", options.outage)),
    }
    let back = Instant::now();
    let after = converge(&mut agent, &tool, &expected, Duration::from_secs(120))?;
    outcome.count("converged after", format!("{:.1} s", back.elapsed().as_secs_f64()));
    record(&mut outcome, &after, &mut totals);
    let healthy = harness::get(&agent.socket(), "/healthz").is_ok_and(|(code, _)| code == 200);
    if !healthy {
        outcome.fail("/healthz not ok after the runtime came back and the pods converged");
    }
    // The pods that ran before the outage are the same ones after it: not started again.
    let changed = steady.check(&agent, &tool)?;
    outcome.zero("steady pods changed", changed.len(), || changed.join("; "));
    teardown(&mut agent, &tool, Duration::from_secs(120))?;
    let leaks = settled_host_leaks(dir);
    agent.stop(Duration::from_secs(10))?;
    outcome.count("duplicates", totals[0]);
    outcome.count("orphans", totals[1]);
    outcome.count("not converged", totals[2]);
    outcome.zero("leaked directories", leaks.len(), || leaks.join(", "));
    Ok(outcome)
}

/// What a scenario does with its [`SmallFilesystems`].
impl SmallFilesystems {
    /// Remounts the first one read-only, or read-write again. (A filesystem with a file open for
    /// writing, as the log directories always have, cannot be made read-only.)
    fn set_read_only(&self, read_only: bool) -> Result<()> {
        let options = if read_only { "remount,ro" } else { "remount,rw" };
        if let Some(path) = self.0.first() {
            crate::util::output(Command::new("mount").args(["-o", options]).arg(path))?;
        }
        Ok(())
    }

    /// Fills every one up with a file named `.chaos-filler`.
    fn fill(&self) -> Result<()> {
        for path in &self.0 {
            fill_up(&path.join(FILLER))?;
        }
        Ok(())
    }

    fn empty(&self) {
        for path in &self.0 {
            let _ = fs::remove_file(path.join(FILLER));
        }
    }
}

/// The file that fills a filesystem up.
const FILLER: &str = ".chaos-filler";

/// Writes `file` until its filesystem has no room left.
fn fill_up(file: &Path) -> Result<()> {
    use std::io::Write as _;
    let chunk = vec![0u8; 1 << 20];
    let mut filler = fs::File::create(file).with_context(|| format!("cannot create {}", file.display()))?;
    while filler.write_all(&chunk).is_ok() {}
    let _ = filler.sync_all();
    Ok(())
}

/// The runtime's image filesystem, full: shrunk to what it holds plus a few MiB, which a filler
/// then takes, so that pulls and new containers' layers find no room (without taking 4 GiB of
/// the machine's memory to fill it). Emptied and given its size back when dropped.
struct FullImageFs(PathBuf);

impl FullImageFs {
    fn fill() -> Result<FullImageFs> {
        let (path, _) = runtime::image_fs();
        let used = crate::util::output(Command::new("df").args(["--block-size=1M", "--output=used"]).arg(&path))?;
        let used_mib: u64 = used.lines().last().unwrap_or_default().trim().parse().context("df's used MiB")?;
        let full = FullImageFs(path);
        remount_size(&full.0, &format!("{}m", used_mib + 8))?;
        fill_up(&full.0.join(FILLER))?;
        Ok(full)
    }
}

impl Drop for FullImageFs {
    fn drop(&mut self) {
        let _ = fs::remove_file(self.0.join(FILLER));
        let (_, size) = runtime::image_fs();
        if let Err(err) = remount_size(&self.0, size) {
            eprintln!("chaos: cannot give {} its size back: {err:#}", self.0.display());
        }
    }
}

fn remount_size(path: &Path, size: &str) -> Result<()> {
    crate::util::output(Command::new("mount").args(["-o", &format!("remount,size={size}")]).arg(path))?;
    Ok(())
}

/// Waits for the agent's log to show upstream's `EvictionThresholdMet` event, which the
/// eviction manager records each round a threshold is met: the pressure reported.
fn wait_for_pressure(agent: &Agent, since: usize, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let log = fs::read_to_string(agent.dir.join("agent.log")).unwrap_or_default();
        if log.get(since..).is_some_and(|new| new.contains("EvictionThresholdMet")) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    false
}

/// How long the agent's log is now, so a later search reads only what comes after.
fn log_length(agent: &Agent) -> usize {
    fs::metadata(agent.dir.join("agent.log")).map_or(0, |m| usize::try_from(m.len()).unwrap_or(0))
}

/// What a written volume directory holds beyond one `..data` link, one `..<timestamp>` set and
/// its visible names: the leftovers of a half-done write.
fn half_written(volume: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(volume) else { return vec![format!("{}: unreadable", volume.display())] };
    let names: Vec<String> =
        entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    let sets = names.iter().filter(|n| n.starts_with("..") && *n != "..data").count();
    let mut found = Vec::new();
    if sets != 1 || !names.iter().any(|n| n == "..data") {
        found.push(format!("{}: {names:?}", volume.display()));
    }
    if fs::read_to_string(volume.join("name")).is_err() {
        found.push(format!("{}: its file cannot be read", volume.display()));
    }
    found
}

/// The root directory and the log directories on small filesystems, filled up, then the root
/// directory made read-only, then the runtime's image filesystem filled up, while pods run and
/// new ones are written; the agent must stay up, say why the new pods cannot start, report the
/// pressure of a full filesystem, keep what runs, leave no half-written volume, and start them
/// by itself once space returns.
fn disk_full(options: &Options, binaries: &Binaries, dir: &Path) -> Result<Outcome> {
    let mut outcome = Outcome::new("disk-full");
    let tool = CriTool::new(binaries.cri_tool.clone());
    let small = SmallFilesystems::mount(&[dir.join("root"), dir.join("logs"), dir.join("containers")], "24m")?;
    let mut agent = Agent::start(&binaries.agent, dir, &[])?;
    agent.wait_healthy(Duration::from_secs(30))?;
    let steady = SteadyPods::start(options.steady_pods, &mut agent, &tool, &mut outcome)?;
    let manifests = dir.join("manifests");
    let mut waiting = BTreeSet::new();
    // The waiting pods with a downwardAPI volume, whose writes a full disk may cut short.
    let mut with_volumes = BTreeSet::new();
    let mut full_image_fs = None;
    for phase in ["full", "read-only", "image-fs-full"] {
        let log_before = log_length(&agent);
        match phase {
            "full" => small.fill()?,
            "read-only" => {
                small.empty();
                small.set_read_only(true)?;
            }
            _ => {
                small.set_read_only(false)?;
                small.empty();
                full_image_fs = Some(FullImageFs::fill()?);
            }
        }
        let new = names(&format!("{phase}-pod"), options.crash_pods.min(3));
        for (i, name) in new.iter().enumerate() {
            // A full image filesystem stops pulls and new containers' layers, not volumes.
            let step = if phase == "image-fs-full" { [Step::Start, Step::Pull][i % 2] } else { Step::Volumes };
            if matches!(step, Step::Volumes) {
                with_volumes.insert(name.clone());
            }
            write_manifest(&manifests, name, &step.manifest(name))?;
        }
        waiting.extend(new.iter().cloned());
        // Long enough for several syncs and retries of the pods that cannot start.
        std::thread::sleep(Duration::from_secs(10));
        if !agent.alive() {
            outcome.fail(format!("the agent exited with its disks {phase}"));
            return Ok(outcome);
        }
        // Every pod that could not start says why. (With the image filesystem full, containerd
        // may still start a container from an image it has: a layer's directories take no space.)
        let running = running_pods(&agent)?;
        let stuck: Vec<&String> = new.iter().filter(|name| !running.contains(*name)).collect();
        let warnings: Vec<(&String, String)> = stuck
            .iter()
            .filter_map(|name| wait_for_failure_warning(&agent, name, Duration::from_secs(5)).map(|w| (*name, w)))
            .collect();
        let explained = warnings.len();
        outcome.count(format!("pods explained, {phase}"), format!("{explained}/{}", stuck.len()));
        // Which warning explains which pod, by the warning's reason.
        let which: Vec<String> = warnings
            .iter()
            .map(|(name, warning)| format!("{name} {}", warning.split(':').next().unwrap_or_default()))
            .collect();
        outcome.count(format!("warnings, {phase}"), which.join(", "));
        if explained < stuck.len() {
            outcome.fail(format!(
                "{} pod(s) that could not start while the disks were {phase} had no Warning event",
                stuck.len() - explained
            ));
        }
        // A full filesystem is pressure (a read-only one has its space): the eviction manager's
        // round, every 10 s, says so.
        if phase != "read-only" {
            let reported = wait_for_pressure(&agent, log_before, Duration::from_secs(25));
            outcome.count(format!("pressure reported, {phase}"), if reported { "yes" } else { "no" });
            if !reported {
                outcome.fail(format!("no EvictionThresholdMet event while the disks were {phase}"));
            }
        }
        let changed = steady.check(&agent, &tool)?;
        outcome.zero(format!("steady pods changed, {phase}"), changed.len(), || changed.join("; "));
    }
    drop(full_image_fs);
    let back = Instant::now();
    let expected: BTreeSet<String> = steady.names.union(&waiting).cloned().collect();
    let judgement = converge(&mut agent, &tool, &expected, Duration::from_secs(120))?;
    outcome.count("converged after", format!("{:.1} s", back.elapsed().as_secs_f64()));
    record(&mut outcome, &judgement, &mut [0; 3]);
    let changed = steady.check(&agent, &tool)?;
    outcome.zero("steady pods changed", changed.len(), || changed.join("; "));
    let mut half = Vec::new();
    for (uid, _, _) in identities(&tool.state()?, &with_volumes).values() {
        half.extend(half_written(&dir.join("root/pods").join(uid).join("volumes/kubernetes.io~downward-api/info")));
    }
    outcome.zero("half-written volumes", half.len(), || half.join("; "));
    teardown(&mut agent, &tool, Duration::from_secs(120))?;
    let leaks = settled_host_leaks(dir);
    agent.stop(Duration::from_secs(10))?;
    drop(small);
    outcome.zero("leaked directories", leaks.len(), || leaks.join(", "));
    Ok(outcome)
}

/// Waits for a Warning event about pod `name` that says why it cannot run; returns its reason
/// and message.
fn wait_for_failure_warning(agent: &Agent, name: &str, timeout: Duration) -> Option<String> {
    // Every pod of the scenario gets this one (no `clusterDNS` is set): it explains nothing.
    let explains = |e: &serde_json::Value| e["type"] == "Warning" && e["reason"] != "MissingClusterDNS";
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok((200, body)) = harness::get(&agent.socket(), &format!("/events/{NAMESPACE}/{name}-{NODE}"))
            && let Ok(list) = serde_json::from_str::<serde_json::Value>(&body)
            && let Some(event) = list["items"].as_array().and_then(|items| items.iter().find(|e| explains(e)))
        {
            let message: String = event["message"].as_str().unwrap_or_default().chars().take(120).collect();
            return Some(format!("{}: {message}", event["reason"].as_str().unwrap_or_default()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// Resident MiB, threads and open files of the agent.
fn footprint(agent: &Agent) -> (f64, u64, u64) {
    (agent.rss_bytes() as f64 / (1024.0 * 1024.0), agent.threads(), agent.fds())
}

/// The agent's footprint once it has idled: its thread count unchanged and the agent all but
/// idle (less than [`BUSY_CPU`] of CPU in each half second) for longer than an idle blocking
/// thread lives (tokio's 10 s keep-alive), or as it is after [`SETTLE_DEADLINE`].
///
/// The agent still works for some seconds after the runtime shows no pod (housekeeping removes
/// the pods' directories and cgroups, and kills what the runtime still holds), and each blocking
/// thread of that work lives 10 s after its last task; a fixed wait from the harness's side read
/// some of them on a busy machine. The count alone is not enough: work that reuses the threads
/// already there keeps them alive without changing it (a CI run read 12 threads that had held
/// for 12 s while the agent killed the churn's last pods 8 s before).
fn settled_footprint(agent: &Agent) -> (f64, u64, u64) {
    let deadline = Instant::now() + SETTLE_DEADLINE;
    let mut threads = agent.threads();
    let mut cpu = agent.cpu_ns();
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < THREADS_SETTLED && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let (threads_now, cpu_now) = (agent.threads(), agent.cpu_ns());
        let busy = Duration::from_nanos(cpu_now.saturating_sub(cpu)) > BUSY_CPU;
        if threads_now != threads || busy {
            quiet_since = Instant::now();
        }
        (threads, cpu) = (threads_now, cpu_now);
    }
    footprint(agent)
}

/// Longer than tokio's keep-alive for an idle blocking thread (10 s).
const THREADS_SETTLED: Duration = Duration::from_secs(12);

/// The CPU in half a second above which the agent counts as working: the idle dev build takes
/// well under a millisecond, killing or removing a pod tens of them.
const BUSY_CPU: Duration = Duration::from_millis(10);

/// How long the agent has to settle before its footprint is read regardless.
const SETTLE_DEADLINE: Duration = Duration::from_secs(60);

/// The batches churn runs before it reads the footprint every later one is held to.
const WARM_UP_BATCHES: usize = 2;

/// How much the agent's anonymous memory (heap and stacks) may grow for each pod churned after
/// the warm-up. With no leak, the short run's 40 pods grew it by 5.0 to 9.9 KiB a pod (5.0-8.2
/// in five runs alone on the machine, 9.1 and 9.9 beside CI's real-runtime tests; the structures
/// that hold the recent past still filling: over the full run's 2,000 cycles, about 1 KiB a
/// pod), so a leak of 12 KiB a pod on top fails even the short run.
const LEAK_BOUND_KIB_PER_POD: f64 = 14.0;

fn churn(options: &Options, binaries: &Binaries, dir: &Path) -> Result<Outcome> {
    let mut outcome = Outcome::new("churn");
    let tool = CriTool::new(binaries.cri_tool.clone());
    let mut rng = Rng::new();
    let mut agent = Agent::start(&binaries.agent, dir, &[])?;
    agent.wait_healthy(Duration::from_secs(30))?;
    let batches = options.churn_cycles.div_ceil(options.churn_batch);
    let mut before = None;
    let started = Instant::now();
    for batch in 0..batches {
        let expected = names(&format!("churn{batch}"), options.churn_batch);
        write_all(dir, &expected)?;
        if batch % 2 == 0 {
            // Every other batch runs to completion; the others are deleted mid-start.
            let judgement = converge(&mut agent, &tool, &expected, Duration::from_secs(120))?;
            let mut totals = [0usize; 3];
            record(&mut outcome, &judgement, &mut totals);
        } else {
            std::thread::sleep(Duration::from_millis(rng.below(800)));
        }
        teardown(&mut agent, &tool, Duration::from_secs(120))?;
        if batch + 1 == WARM_UP_BATCHES {
            // After a batch run to completion and one deleted mid-start: every pool and cache the
            // agent keeps has been used by both paths.
            before = Some((settled_footprint(&agent), agent.rss_anon_bytes()));
        }
        if (batch + 1) % 10 == 0 {
            println!(
                "chaos: churn {} of {} cycles, {:?}",
                (batch + 1) * options.churn_batch,
                options.churn_cycles,
                started.elapsed()
            );
        }
    }
    let after = settled_footprint(&agent);
    let after_anon = agent.rss_anon_bytes();
    let ((before_rss, before_threads, before_fds), before_anon) = before.unwrap_or((after, after_anon));
    let measured_pods = batches.saturating_sub(WARM_UP_BATCHES) * options.churn_batch;
    outcome.count("cycles", batches * options.churn_batch);
    outcome.count("resident MiB before/after", format!("{before_rss:.1}/{:.1}", after.0));
    let kib = |bytes: u64| bytes as f64 / 1024.0;
    let grown_kib = kib(after_anon) - kib(before_anon);
    let allowed_kib = LEAK_BOUND_KIB_PER_POD * measured_pods as f64;
    outcome.count(
        "anonymous KiB before/after",
        format!("{:.0}/{:.0} (+{grown_kib:.0}, at most +{allowed_kib:.0})", kib(before_anon), kib(after_anon)),
    );
    outcome.count("threads before/after", format!("{before_threads}/{}", after.1));
    outcome.count("open files before/after", format!("{before_fds}/{}", after.2));
    // A run of no more batches than the warm-up measures nothing to hold.
    if measured_pods > 0 && grown_kib > allowed_kib {
        outcome.fail(format!(
            "anonymous memory grew by {grown_kib:.0} KiB over {measured_pods} pods after the warm-up, more than \
             {LEAK_BOUND_KIB_PER_POD} KiB a pod"
        ));
    }
    if after.1 > before_threads + 2 {
        outcome.fail(format!("threads grew from {before_threads} to {}", after.1));
    }
    if after.2 > before_fds + 2 {
        outcome.fail(format!("open files grew from {before_fds} to {}", after.2));
    }
    let leaks = settled_host_leaks(dir);
    agent.stop(Duration::from_secs(10))?;
    outcome.zero("leaked directories", leaks.len(), || leaks.join(", "));
    Ok(outcome)
}

/// The hostile manifests: (file name, content). Each must be refused with an error naming it.
fn bad_manifests(copies: usize) -> Vec<(String, Vec<u8>)> {
    let mut bad = Vec::new();
    for i in 0..copies {
        bad.push((format!("malformed-{i}.yaml"), b"apiVersion: v1\nkind: Pod\nmetadata: {name: [unclosed\n".to_vec()));
        bad.push((format!("not-a-pod-{i}.yaml"), b"apiVersion: v1\nkind: Service\nmetadata: {name: svc}\n".to_vec()));
        bad.push((format!("no-containers-{i}.yaml"), format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: empty-{i}, namespace: {NAMESPACE}}}\nspec: {{containers: []}}\n").into_bytes()));
        bad.push((format!("deep-{i}.yaml"), format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes()));
        let mut laughs =
            String::from("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
        for (n, prev) in ('b'..='j').zip('a'..='i') {
            laughs.push_str(&format!(
                "{n}: &{n} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
            ));
        }
        bad.push((format!("laughs-{i}.yaml"), laughs.into_bytes()));
        let mut utf8 = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: \xff\xfe\xfd\n".to_vec();
        utf8.extend_from_slice(b"spec:\n  containers: [{name: a, image: b}]\n");
        bad.push((format!("utf8-{i}.yaml"), utf8));
        let mut huge = harness::manifest(&format!("huge-{i}")).into_bytes();
        huge.extend_from_slice(b"# ");
        huge.extend(std::iter::repeat_n(b'x', 11 << 20));
        huge.push(b'\n');
        bad.push((format!("huge-{i}.yaml"), huge));
    }
    bad
}

fn bad_input(options: &Options, binaries: &Binaries, dir: &Path) -> Result<Outcome> {
    let mut outcome = Outcome::new("bad-input");
    let tool = CriTool::new(binaries.cri_tool.clone());
    let mut agent = Agent::start(&binaries.agent, dir, &[])?;
    agent.wait_healthy(Duration::from_secs(30))?;
    let manifests = dir.join("manifests");
    let good = names("good", 3);
    write_all(dir, &good)?;
    let mut totals = [0usize; 3];
    record(&mut outcome, &converge(&mut agent, &tool, &good, Duration::from_secs(120))?, &mut totals);
    // The agent's memory with its good pods running, before the storm: what it may not outgrow.
    // Anonymous memory (heap and stacks): the resident figure also counts the binary's pages the
    // error paths bring in, which are no growth of the agent's.
    let before_rss = settled_footprint(&agent).0;
    let before = mib(agent.rss_anon_bytes());
    let bad = bad_manifests(options.bad_copies);
    for (name, content) in &bad {
        fs::write(manifests.join(name), content)?;
    }
    // Two files for one pod name: one runs, the other is refused as a duplicate.
    let duplicate = harness::manifest("good-0").replace("36000", "36001");
    fs::write(manifests.join("zz-duplicate-of-good-0.yaml"), duplicate)?;
    let bad_files: Vec<&str> = bad.iter().map(|(name, _)| name.as_str()).collect();
    if !wait_until_logged(dir, &bad_files, Duration::from_secs(60)) {
        outcome.fail("the agent did not name every bad file within 60 s");
    }
    record(&mut outcome, &converge(&mut agent, &tool, &good, Duration::from_secs(120))?, &mut totals);
    let after_rss = settled_footprint(&agent).0;
    let after = mib(agent.rss_anon_bytes());
    outcome.count("resident MiB before/after the storm", format!("{before_rss:.1}/{after_rss:.1}"));
    outcome.count("anonymous MiB before/after the storm", format!("{before:.1}/{after:.1}"));
    if after > before + STORM_GROWTH_MIB {
        outcome.fail(format!(
            "anonymous memory grew from {before:.1} to {after:.1} MiB in the storm, more than {STORM_GROWTH_MIB} MiB"
        ));
    }

    // A missing image: a clear waiting reason, and the agent keeps going.
    let missing = harness::manifest("missing-image").replace("kubelet-rs/busybox:1.35", "kubelet-rs/no-such-image:1");
    write_manifest(&manifests, "missing-image", &missing)?;
    let reason =
        wait_for_reason(&agent, "missing-image", &["ErrImagePull", "ImagePullBackOff"], Duration::from_secs(60));
    match reason {
        Some(r) => outcome.count("missing image", r),
        None => outcome.fail("the pod with a missing image never showed ErrImagePull or ImagePullBackOff"),
    }

    // A bad CNI configuration that sorts first: sandboxes cannot be made; a clear error, no crash,
    // and the pod starts once the configuration is fixed. The error is `FailedCreatePodSandBox`
    // when containerd tries the configuration, or `NetworkNotReady` when it has already reported
    // its network not ready for it (upstream's kubelet then makes no sandbox either).
    let bad_cni = runtime::cni_conf_dir().join("00-chaos-bad.conflist");
    fs::write(&bad_cni, "{ this is not json")?;
    write_manifest(&manifests, "bad-cni", &harness::manifest("bad-cni"))?;
    let cni_error = wait_for_event(&agent, "bad-cni", Duration::from_secs(60));
    let _ = fs::remove_file(&bad_cni);
    match cni_error {
        Some(e) => outcome.count("bad CNI", e),
        None => outcome.fail("no event explained the pod that could not get a sandbox under a bad CNI configuration"),
    }
    if !agent.alive() {
        outcome.fail("the agent exited");
    }
    let mut all = good.clone();
    all.insert("bad-cni".to_owned());
    fs::remove_file(manifests.join("missing-image.yaml"))?;
    let recovered = converge_names(&mut agent, &tool, &all)?;
    record(&mut outcome, &recovered, &mut totals);
    teardown(&mut agent, &tool, Duration::from_secs(120))?;
    agent.stop(Duration::from_secs(10))?;
    outcome.count("good pods", good.len());

    // Each bad file has one error naming it, however many rescans passed meanwhile.
    let log = fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let mut unexplained = Vec::new();
    let mut repeated = Vec::new();
    let mut wanted: Vec<(String, Vec<String>)> =
        bad.iter().map(|(name, _)| (name.clone(), vec![name.clone()])).collect();
    // Upstream's message for a duplicate names the pod, not the file.
    let duplicate = vec!["duplicate pod name".to_owned(), format!("good-0-{NODE}")];
    wanted.push(("zz-duplicate-of-good-0.yaml".to_owned(), duplicate));
    for (file, needles) in &wanted {
        match log.lines().filter(|l| needles.iter().all(|n| l.contains(n.as_str()))).count() {
            0 => unexplained.push(file.clone()),
            1 => {}
            n => repeated.push(format!("{file} ({n} times)")),
        }
    }
    outcome.count("bad files", wanted.len());
    outcome.zero("bad files without an error naming them", unexplained.len(), || unexplained.join(", "));
    outcome.zero("bad files reported more than once", repeated.len(), || repeated.join(", "));
    if log.contains("panicked") {
        outcome.fail("the agent's log shows a panic");
    }
    Ok(outcome)
}

/// Bytes in MiB.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// How much the agent's anonymous memory may grow through the storm of bad manifests: each is
/// refused and dropped, so what grows is what the allocator keeps of their decoding (the
/// billion-laughs file's stops at 12,000 nodes; the 11 MiB one is refused by its size, unread).
const STORM_GROWTH_MIB: f64 = 8.0;

/// Waits (`timeout` at most) until the agent's log has a line naming each of `files`.
fn wait_until_logged(dir: &Path, files: &[&str], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let log = fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
        if files.iter().all(|file| log.contains(file)) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Like `converge`, but pods other than `expected` may still be listed in `/pods` (refused ones).
/// As `converge`, it waits for orphans to go too: a pod whose manifest was just removed keeps its
/// sandbox until the agent has stopped it.
fn converge_names(agent: &mut Agent, tool: &CriTool, expected: &BTreeSet<String>) -> Result<Judgement> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pods = agent.pods().unwrap_or_default();
        let running: BTreeSet<&String> = pods.iter().filter(|(_, p)| p == "Running").map(|(n, _)| n).collect();
        let judgement = judge(&tool.state()?, expected);
        let done = expected.iter().all(|n| running.contains(n))
            && judgement.missing.is_empty()
            && judgement.orphans.is_empty();
        if done || Instant::now() > deadline {
            return Ok(judgement);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until a container of pod `name` waits with one of `reasons`.
fn wait_for_reason(agent: &Agent, name: &str, reasons: &[&str], timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok((200, body)) = harness::get(&agent.socket(), "/pods")
            && let Ok(list) = serde_json::from_str::<serde_json::Value>(&body)
        {
            let pod = list["items"].as_array().and_then(|items| {
                items.iter().find(|p| {
                    p["metadata"]["name"] == format!("{name}-{NODE}") && p["metadata"]["namespace"] == NAMESPACE
                })
            });
            let statuses = pod.and_then(|p| p["status"]["containerStatuses"].as_array());
            for status in statuses.into_iter().flatten() {
                let reason = status["state"]["waiting"]["reason"].as_str().unwrap_or_default();
                if reasons.contains(&reason) {
                    return Some(format!(
                        "{reason}: {}",
                        status["state"]["waiting"]["message"].as_str().unwrap_or_default()
                    ));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// Waits for the Warning event that says pod `name` got no sandbox; returns its reason and
/// message.
fn wait_for_event(agent: &Agent, name: &str, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok((200, body)) = harness::get(&agent.socket(), &format!("/events/{NAMESPACE}/{name}-{NODE}"))
            && let Ok(list) = serde_json::from_str::<serde_json::Value>(&body)
            && let Some(event) = list["items"].as_array().and_then(|items| {
                items.iter().find(|e| {
                    e["type"] == "Warning"
                        && (e["reason"] == "FailedCreatePodSandBox" || e["reason"] == "NetworkNotReady")
                })
            })
        {
            let message: String = event["message"].as_str().unwrap_or_default().chars().take(120).collect();
            return Some(format!("{}: {message}", event["reason"].as_str().unwrap_or_default()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: u64, running: u64) -> serde_json::Value {
        serde_json::json!({"name": name, "ready_sandboxes": ready, "sandboxes": ready, "running": {"app": running}, "containers": running})
    }

    #[test]
    fn judge_counts_duplicates_orphans_and_missing() {
        let expected: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        let mut state = serde_json::Map::new();
        state.insert("uid-a".into(), pod("a", 1, 1));
        state.insert("uid-b".into(), pod("b", 2, 1));
        state.insert("uid-b2".into(), pod("b", 1, 1));
        state.insert("uid-x".into(), pod("x", 1, 0));
        let j = judge(&state, &expected);
        assert_eq!(j.duplicates.len(), 2, "{:?}", j.duplicates);
        assert_eq!(j.orphans, vec!["x (uid-x)".to_owned()]);
        assert_eq!(j.missing, vec!["c".to_owned()]);
        let mut clean = serde_json::Map::new();
        for name in ["a", "b", "c"] {
            clean.insert(format!("uid-{name}"), pod(name, 1, 1));
        }
        let j = judge(&clean, &expected);
        assert!(j.duplicates.is_empty() && j.orphans.is_empty() && j.missing.is_empty());
    }

    #[test]
    fn options_parse() {
        assert_eq!(parse(&[]).unwrap().0, Options::full());
        assert_eq!(parse(&["--short"]).unwrap().0, Options::short());
        assert_eq!(parse(&["--only", "crash"]).unwrap().1.only.as_deref(), Some("crash"));
        let (_, run) = parse(&[]).unwrap();
        assert_eq!((run.profile, run.runtime), (harness::Profile::Release, runtime::Instance::First));
        let (options, run) = parse(&["--short", "--dev", "--second-runtime"]).unwrap();
        assert_eq!(options, Options::short());
        assert_eq!((run.profile, run.runtime), (harness::Profile::Dev, runtime::Instance::Second));
        assert!(parse(&["--long"]).is_err());
    }
}
