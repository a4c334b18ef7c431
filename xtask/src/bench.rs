//! `cargo xtask bench`: the agent against the bare CRI floor, on the project's containerd.
//!
//! The agent is built as it ships, in the `dist` profile (whole-program LTO). One run, a progress
//! line per phase, then one table, written as Markdown, JSON and an SVG chart
//! under `target/bench/`, beside the standalone and cluster agents' logs (`logs/`). Every figure
//! is min/median/max over repeated runs (or over idle windows), and the machine's load is noted
//! before and after.
//! - The floor: the CRI calls a kubelet cannot avoid (`cri_bench floor`), one pod at a time and all
//!   pods at once (the agent's parallelism: one worker per pod), measured in each round just
//!   before the agent's start-up of the same size, with the agent paused; every round of one size
//!   before the next size.
//! - Start-up of N static pods (1, 10, 50 and 110; 1 and 10 with `--quick`): from writing the
//!   manifests until every container runs in the CRI, and until every pod is Running in `/pods`,
//!   with its breakdown ([`breakdown`]).
//! - Teardown: from removing the manifests until no sandbox of them is ready.
//! - Cluster mode ([`cluster`]), where the machine has a kube-apiserver (`cargo xtask setup`'s): one
//!   and 50 API pods (10 with `--quick`) created until Running in the API, and deleted until gone
//!   from it.
//! - Restart: from the runtime confirming a container's death (StopContainer without grace) until
//!   `/pods` first shows it (the target: a transition the runtime reports is seen within 50 ms),
//!   until the runtime started its replacement, and from then until `/pods` shows it restarted
//!   and running.
//! - Idle cost with 0 pods and with the largest start-up's (110, a full node; 10 with `--quick`):
//!   CPU seconds per minute, resident memory (and its anonymous part: what the resident figure
//!   holds beyond the binary's own pages), threads, open files, and the relists per minute and
//!   their mean time from the agent's own `kubelet_pleg_relist_duration_seconds` (no time row
//!   when no relist ran).
//! - Probing: CPU seconds per minute of the agent while 100 containers each have an exec probe
//!   every 10 s and an httpGet probe every second, with the probes run per second and the pods
//!   Ready. Its floor is a client running the same probes with nothing around them
//!   (`cri_bench probe`) in the same windows, so the figure is held by its ratio to that: between
//!   this machine and CI's, the same build's probing CPU moved by 35 % while its idle CPU did not.
//! - The hollow node ([`hollow`]): the agent on `fake://` with 1,000 and (unless `--quick`)
//!   10,000 static pods, from the manifests written until all are Running, and its idle CPU and
//!   resident memory per pod.
//! - The shipped binary's size, and (unless `--quick`) two criterion benchmarks on the fake
//!   runtime: a relist of 10,000 unchanged containers and a pod-worker dispatch of 10,000 pods.
//!
//! `--check` gates a figure only by what the machine's speed does not move ([`Gate`], the table's
//! gate column): a figure with a floor by its ratio to that floor, measured in the same run,
//! against the baseline's ratio ([`baseline`]); a count with no floor (threads, open files,
//! relists) by its median against the baseline's; the probed pods Ready and the probes run per
//! second by their nominal (all 50; within 5 % of 110), whatever the baseline holds. A time, a
//! size or a CPU cost with no floor is reported, never held to the baseline: measured on another
//! machine, it says nothing of the code. Issue 38's targets were set for the `dist` build: a full
//! run is held to each too (the target and met columns), a quick run prints none.
//! `--save-baseline` makes the run the baseline, and `--widen-baseline` widens it by the run
//! (another run of the same build: each figure keeps the worse of the two); either refuses a
//! baseline that lets a gated figure be worse than the one it replaces, unless `--reason` says why.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

mod baseline;
mod breakdown;
mod cluster;
mod hollow;

use crate::{
    harness::{self, Agent, CriTool, write_manifest},
    layout::STATE_DIR,
    leaks, runtime,
    util::{SmallFilesystems, in_ci, is_root, output, project_root, run},
};

#[derive(Debug, Clone, PartialEq)]
struct Options {
    /// `full`, or `quick`: which of the baseline's sets the run is held to and saved as.
    mode: &'static str,
    /// The profile the agent is built in.
    profile: harness::Profile,
    /// Runs of every start-up, teardown and floor figure.
    repeat: usize,
    /// Pod counts of the start-up figures; the largest is also the idle figure's.
    sizes: Vec<usize>,
    /// Idle windows, and the length of each.
    windows: usize,
    window: Duration,
    /// Also run the criterion benchmarks on the fake runtime.
    criterion: bool,
    /// Pod counts of the hollow node (the agent on `fake://`).
    hollow: Vec<usize>,
    /// Whether issue 38's targets apply: to the `dist` build only, as they were set for it.
    targets: bool,
    /// Hold the figures to their gates, failing on a regression or a missed target.
    check: bool,
    /// Write the figures as the new baseline.
    save: Option<Save>,
    /// Why the new baseline may let a gated figure be worse than the one it replaces
    /// (`--reason`), recorded in it.
    reason: Option<String>,
    /// Only the start-up rounds (floor, agent start-up, teardown) of `sizes`: `--startup`, for
    /// looking into a start-up figure with more runs than the whole bench can afford.
    startup_only: bool,
}

impl Options {
    fn full() -> Options {
        Options {
            mode: "full",
            profile: harness::Profile::Dist,
            // Medians of five: a 10-pod start-up moves by a quarter from one run to the next on
            // two cores, and the targets are held to a tenth.
            repeat: 5,
            // 110: a full node at upstream's default maxPods.
            sizes: vec![1, 10, 50, MAX_PODS],
            windows: 3,
            window: Duration::from_secs(20),
            criterion: true,
            hollow: vec![1_000, 10_000],
            targets: true,
            check: false,
            save: None,
            reason: None,
            startup_only: false,
        }
    }

    fn quick() -> Options {
        Options {
            mode: "quick",
            profile: harness::Profile::Dev,
            repeat: 3,
            sizes: vec![1, 10],
            // Two windows: in CI's runs the three windows of 10 s moved by a tenth; a third cost CI
            // 50 s.
            windows: 2,
            window: Duration::from_secs(10),
            criterion: false,
            hollow: vec![1_000],
            targets: false,
            check: false,
            save: None,
            reason: None,
            startup_only: false,
        }
    }
}

/// A full node: upstream's default `maxPods`, the largest start-up of the full bench, whose idle
/// figures are held to the full node's targets (0.1 s/min, 30 MiB).
const MAX_PODS: usize = 110;

/// API pods of the cluster-mode figure (fewer when the bench's largest start-up is smaller).
const CLUSTER_PODS: usize = 50;

/// What `--save-baseline` and `--widen-baseline` do with the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Save {
    /// The run becomes its mode's baseline.
    Replace,
    /// Each figure of the baseline becomes the worse of it and the run's.
    Widen,
}

fn parse(args: &[&str]) -> Result<Options> {
    let mut options = Options::full();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match *arg {
            "--quick" => {
                options = Options {
                    check: options.check,
                    save: options.save,
                    reason: options.reason,
                    startup_only: options.startup_only,
                    sizes: if options.startup_only { options.sizes } else { Options::quick().sizes },
                    ..Options::quick()
                }
            }
            "--startup" => {
                let sizes = args.next().context("--startup takes pod counts, such as 10 or 10,50")?;
                options.sizes = sizes
                    .split(',')
                    .map(|n| n.parse().ok().filter(|n| *n > 0))
                    .collect::<Option<Vec<usize>>>()
                    .with_context(|| format!("--startup {sizes:?}"))?;
                options.startup_only = true;
            }
            "--check" => options.check = true,
            "--save-baseline" => options.save = Some(Save::Replace),
            "--widen-baseline" => options.save = Some(Save::Widen),
            "--reason" => {
                let reason = args.next().map(|r| r.trim()).filter(|r| !r.is_empty());
                options.reason =
                    Some(reason.context("--reason takes a text: why the new baseline is worse")?.to_owned());
            }
            "--repeat" => {
                let n = args.next().context("--repeat takes a number of runs")?;
                options.repeat = n.parse().ok().filter(|n| *n > 0).with_context(|| format!("--repeat {n:?}"))?;
            }
            other => bail!(
                "unknown bench option {other:?}; usage: cargo xtask bench [--quick] [--repeat N] [--check] \
                 [--save-baseline | --widen-baseline] [--reason TEXT] [--startup N[,N...]]\n\
                 --reason TEXT: let --save-baseline or --widen-baseline write a baseline in which a gated \
                 figure is worse than in the one it replaces, recording why"
            ),
        }
    }
    if options.reason.is_some() && options.save.is_none() {
        bail!("--reason says why a new baseline is worse: it goes with --save-baseline or --widen-baseline");
    }
    if options.startup_only && (options.check || options.save.is_some()) {
        bail!("--startup measures some figures only, which cannot be held to the baseline or saved as it");
    }
    Ok(options)
}

/// Min, median and max of some samples.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    min: f64,
    median: f64,
    max: f64,
}

impl Stat {
    fn of(samples: &[f64]) -> Stat {
        let mut sorted: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
        sorted.sort_by(f64::total_cmp);
        if sorted.is_empty() {
            return Stat { min: f64::NAN, median: f64::NAN, max: f64::NAN };
        }
        let mid = sorted.len() / 2;
        let median = if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 };
        Stat { min: sorted[0], median, max: sorted[sorted.len() - 1] }
    }
}

/// A target of issue 38 a figure's median is held to: set for the `dist` build, so held in full
/// mode only ([`apply_targets`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    /// At most this value.
    AtMost(f64),
    /// At most `factor` times the floor plus `plus`.
    Floor { factor: f64, plus: f64 },
    /// Every sample at most this value: a promise each time, not on the whole.
    EachAtMost(f64),
}

/// What a count must be in every run, whatever the baseline holds: how many of what the bench
/// asked for the agent did.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Nominal {
    /// Exactly this many.
    Exactly(f64),
    /// Within `share` of this, either way.
    Within { nominal: f64, share: f64 },
}

/// What `--check` holds a figure to ([`Figure::gate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Gate {
    /// Nothing: the figure is reported only.
    Reported,
    /// Its ratio to its floor, measured in the same run, against the baseline's ratio.
    Ratio,
    /// Its median against the baseline's: a count that the machine's speed does not move.
    Count,
    /// Its median to its nominal.
    Nominal(Nominal),
}

/// Whether figures of `unit` are times, sizes or CPU costs, which the machine moves (its speed,
/// its phase, its libraries): with no floor measured beside them, they are reported, never gated.
fn machine_bound(unit: &str) -> bool {
    matches!(unit, "s" | "ms" | "s/min" | "ms/min" | "MiB" | "KiB")
}

/// One row of the table.
#[derive(Debug, Clone)]
struct Figure {
    name: String,
    unit: &'static str,
    stat: Stat,
    /// The floor's median, where the figure has one.
    floor: Option<f64>,
    target: Option<Target>,
    /// Whether `--check` may gate it: not the runtime's own figures (the floor), which no change
    /// of the agent moves.
    checked: bool,
    /// Whether more is better; less is for the others.
    higher_is_better: bool,
    /// What it must be in every run, where the bench asked for a number of something.
    nominal: Option<Nominal>,
}

impl Figure {
    fn new(name: impl Into<String>, unit: &'static str, samples: &[f64]) -> Figure {
        Figure {
            name: name.into(),
            unit,
            stat: Stat::of(samples),
            floor: None,
            target: None,
            checked: true,
            higher_is_better: false,
            nominal: None,
        }
    }

    /// Reported, never gated: the floors (the runtime's own figures, the probing client's), the
    /// start-up breakdown's (the start-up figure holds their sum), and cluster mode's deletions
    /// (their spread between runs is wider than the check's 20 %, [`cluster`]).
    fn unchecked(mut self) -> Figure {
        self.checked = false;
        self
    }

    /// More is better (a rate, a count of pods that made it), where less is for every other
    /// figure (times, costs).
    fn higher_is_better(mut self) -> Figure {
        self.higher_is_better = true;
        self
    }

    /// Held to exactly `n` in every run, not to the baseline.
    fn exactly(mut self, n: usize) -> Figure {
        self.nominal = Some(Nominal::Exactly(n as f64));
        self
    }

    /// Held within `share` (0.05: 5 %) of `nominal`, either way, in every run, not to the
    /// baseline.
    fn within(mut self, share: f64, nominal: usize) -> Figure {
        self.nominal = Some(Nominal::Within { nominal: nominal as f64, share });
        self
    }

    fn floor(mut self, floor: f64) -> Figure {
        self.floor = Some(floor);
        self
    }

    fn target(mut self, target: Target) -> Figure {
        self.target = Some(target);
        self
    }

    /// What `--check` holds it to: nothing where it is unchecked; its nominal where it has one;
    /// its ratio to its floor where it has a floor; nothing where it is a time, a size or a CPU
    /// cost ([`machine_bound`]); its median, a count, otherwise.
    fn gate(&self) -> Gate {
        match (self.checked, self.nominal, self.floor) {
            (false, _, _) => Gate::Reported,
            (true, Some(nominal), _) => Gate::Nominal(nominal),
            (true, None, Some(_)) => Gate::Ratio,
            (true, None, None) if machine_bound(self.unit) => Gate::Reported,
            (true, None, None) => Gate::Count,
        }
    }

    /// Its median over its floor's, where it has a floor: not finite where the floor was not
    /// measured (NaN) or is zero.
    fn ratio(&self) -> Option<f64> {
        self.floor.map(|f| self.stat.median / f)
    }

    /// The target's bound, in the figure's unit.
    fn bound(&self) -> Option<f64> {
        match self.target? {
            Target::AtMost(v) | Target::EachAtMost(v) => Some(v),
            Target::Floor { factor, plus } => self.floor.map(|f| f * factor + plus),
        }
    }

    /// What the target holds: the worst sample for [`Target::EachAtMost`], the median otherwise.
    fn held(&self) -> f64 {
        match self.target {
            Some(Target::EachAtMost(_)) => self.stat.max,
            _ => self.stat.median,
        }
    }

    fn met(&self) -> Option<bool> {
        self.bound().map(|b| self.held() <= b)
    }

    fn target_text(&self) -> String {
        match self.target {
            None => String::new(),
            Some(Target::AtMost(v)) => format!("≤ {}", number(v)),
            Some(Target::EachAtMost(v)) => format!("each ≤ {}", number(v)),
            Some(Target::Floor { factor, plus }) if plus > 0.0 => format!("≤ {factor}× floor + {}", number(plus)),
            Some(Target::Floor { factor, .. }) => format!("≤ {factor}× floor"),
        }
    }

    /// How it misses its target, where it has one and does not meet it (a target against a floor
    /// that was not measured is missed too).
    fn target_missed(&self) -> Option<String> {
        self.target?;
        if self.met() == Some(true) {
            return None;
        }
        Some(match self.bound() {
            Some(bound) => format!(
                "{}: {} {}, its target {} ({}) missed",
                self.name,
                number(self.held()),
                self.unit,
                self.target_text(),
                number(bound)
            ),
            None => format!("{}: its target {} has no floor to be held to", self.name, self.target_text()),
        })
    }

    /// How it misses its nominal, where it has one and does not meet it (a median that is not a
    /// number misses it).
    fn nominal_missed(&self) -> Option<String> {
        let v = self.stat.median;
        let (met, nominal) = match self.nominal? {
            Nominal::Exactly(n) => (v == n, format!("{v}, not {n}")),
            Nominal::Within { nominal, share } => (
                (v - nominal).abs() <= share * nominal,
                format!("{} {}, not within {:.0} % of {nominal}", number(v), self.unit, share * 100.0),
            ),
        };
        (!met).then(|| format!("{}: {nominal}", self.name))
    }

    /// The bound `--check` holds it to, as the table's gate column says it (`baseline`: the one
    /// it is held to, where there is one).
    fn gate_text(&self, baseline: Option<&baseline::Baseline>) -> String {
        let bound = baseline.and_then(|baseline| baseline::bound(baseline, self));
        match (self.gate(), bound) {
            (Gate::Reported, _) => "reported".to_owned(),
            (Gate::Nominal(Nominal::Exactly(n)), _) => format!("= {n}"),
            (Gate::Nominal(Nominal::Within { nominal, share }), _) => {
                format!("within {:.0} % of {nominal}", share * 100.0)
            }
            (Gate::Ratio, Some(bound)) => format!("≤ {bound:.2}× floor"),
            (Gate::Ratio, None) => "its ratio (not in the baseline)".to_owned(),
            (Gate::Count, Some(bound)) if self.higher_is_better => format!("≥ {}", number(bound)),
            (Gate::Count, Some(bound)) => format!("≤ {}", number(bound)),
            (Gate::Count, None) => "its median (not in the baseline)".to_owned(),
        }
    }

    fn json(&self, baseline: Option<&baseline::Baseline>) -> serde_json::Value {
        serde_json::json!({
            "name": self.name, "unit": self.unit,
            "min": self.stat.min, "median": self.stat.median, "max": self.stat.max,
            "floor": self.floor, "ratio": self.ratio(), "gate": self.gate_text(baseline),
            "target": self.target_text(), "bound": self.bound(), "met": self.met(),
        })
    }
}

/// Drops issue 38's targets from the figures of a run whose mode they do not apply to (a quick
/// run's `dev` build: they were set for the `dist` build), which then prints and checks none.
fn apply_targets(options: &Options, figures: &mut [Figure]) {
    if !options.targets {
        for figure in figures {
            figure.target = None;
        }
    }
}

/// Every gate `results` fail, each as the figure's name and a sentence that says how: the
/// baseline's ([`baseline::regressed`]), the nominal counts', and the targets' where the mode
/// has them.
fn failures(options: &Options, baseline: &baseline::Baseline, results: &Results) -> Vec<(String, String)> {
    let mut found = baseline::regressed(baseline, &results.figures, &results.left_out);
    for figure in &results.figures {
        let target = if options.targets { figure.target_missed() } else { None };
        found.extend(figure.nominal_missed().into_iter().chain(target).map(|how| (figure.name.clone(), how)));
    }
    found
}

fn number(v: f64) -> String {
    if !v.is_finite() {
        "n/a".to_owned()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Start-up medians of one pod count.
#[derive(Debug, Clone, Copy)]
struct StartupPoint {
    pods: usize,
    /// Agent: all Running in `/pods`.
    api: f64,
    /// Agent: all containers running in the CRI.
    cri: f64,
    floor_parallel: f64,
    floor_sequential: f64,
}

/// A line of the start-up chart: label, colour, value.
type Series = (&'static str, &'static str, fn(&StartupPoint) -> f64);

/// Everything one run measured.
#[derive(Debug, Default)]
struct Results {
    figures: Vec<Figure>,
    /// Start-up medians per N, for the chart.
    startup: Vec<StartupPoint>,
    /// Resident memory medians per pod count, for the chart.
    memory: Vec<(usize, f64)>,
    /// What the names of the figures start with that the run did not set out to measure (cluster
    /// mode's, where no kube-apiserver is found): the baseline's are not missed.
    left_out: Vec<&'static str>,
    load_before: f64,
    load_after: f64,
}

pub(crate) fn run_bench(args: &[&str]) -> Result<()> {
    let options = parse(args)?;
    // A missing baseline fails a check before the run, not after it; without a check, the
    // baseline only gives the gate column its bounds.
    let baseline = if options.check {
        Some(baseline::load(options.mode)?)
    } else {
        baseline::load_if_any(options.mode).unwrap_or_else(|err| {
            println!("warning: {err:#}; the table gives no bounds of the baseline");
            None
        })
    };
    if let Some(why) = runtime::missing_prerequisites() {
        if in_ci() || is_root() {
            bail!("the benchmark needs the project's containerd: {why}");
        }
        bail!("the benchmark runs real pods on the project's containerd, which needs root: {why}");
    }
    let results = measure_on_the_runtime(&options)?;
    let commit = commit()?;
    report(&options, &results, &commit, baseline.as_ref())?;
    if let Some(save) = options.save {
        let run = baseline::of(&results.figures, &commit);
        let (replaced, new) = match save {
            Save::Replace => (baseline::load_if_any(options.mode)?, run),
            Save::Widen => {
                let kept = baseline::load(options.mode)?;
                let widened = baseline::widen(&kept, &run, &results.figures);
                (Some(kept), widened)
            }
        };
        let (new, worse) = baseline::vetted(replaced.as_ref(), new, options.reason.as_deref(), &results.figures)?;
        let path = baseline::save(options.mode, &new)?;
        println!("wrote the {} baseline ({} run(s)) into {}", options.mode, new.runs, path.display());
        if !worse.is_empty() {
            println!(
                "bench: the new baseline lets {} gated figure(s) be worse, because {:?}:\n  {}",
                worse.len(),
                new.reason,
                worse.join("\n  ")
            );
        }
    }
    if let (true, Some(baseline)) = (options.check, &baseline) {
        check(&options, baseline, &results, &commit)?;
    }
    Ok(())
}

/// Holds `results` to their gates ([`failures`]); a run that fails some is measured again, and
/// the gates that fail again fail it ([`baseline::confirmed`]).
fn check(options: &Options, baseline: &baseline::Baseline, results: &Results, commit: &str) -> Result<()> {
    let failing = |results: &Results| failures(options, baseline, results);
    let against = format!("the {} baseline of commit {}", options.mode, baseline.commit);
    for left_out in &results.left_out {
        println!("bench: the figures \"{left_out}...\" were not measured, so not held to {against}");
    }
    let gates = if options.targets { "gates and targets" } else { "gates" };
    let first = failing(results);
    if first.is_empty() {
        println!("bench: every figure passes its {gates} (against {against})");
        return Ok(());
    }
    let sentences: Vec<&str> = first.iter().map(|(_, sentence)| sentence.as_str()).collect();
    println!(
        "bench: {} of the {gates} failed (against {against}); measuring again, where they must fail again to \
         fail the run:\n  {}",
        first.len(),
        sentences.join("\n  ")
    );
    let again = measure_on_the_runtime(options)?;
    report(options, &again, commit, Some(baseline))?;
    let confirmed = baseline::confirmed(&first, failing(&again));
    if !confirmed.is_empty() {
        bail!(
            "{} of the {gates} failed (against {against}) in two runs:\n  {}",
            confirmed.len(),
            confirmed.join("\n  ")
        );
    }
    println!("bench: none of them failed again");
    Ok(())
}

/// [`measure`] on the project's containerd, started for it unless it runs.
fn measure_on_the_runtime(options: &Options) -> Result<Results> {
    let started_runtime = runtime::start()?;
    let result = measure(options);
    if started_runtime {
        runtime::stop()?;
    }
    result
}

/// The checked-out commit, short.
fn commit() -> Result<String> {
    let root = project_root()?;
    Ok(output(Command::new("git").current_dir(&root).args(["rev-parse", "--short", "HEAD"]))
        .map(|c| c.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned()))
}

/// The scratch directory of the benchmark's agent and floor.
fn bench_dir() -> PathBuf {
    Path::new(STATE_DIR).join("bench")
}

fn progress(line: &str) {
    println!("bench: {line}");
}

/// The bench's figures; a run that fails removes what it left on the runtime.
fn measure(options: &Options) -> Result<Results> {
    let binaries = harness::build(options.profile)?;
    let tool = CriTool::new(binaries.cri_tool.clone());
    runtime_holds_only_bench_pods(&tool)?;
    let cgroups_before = leaks::pod_cgroups();
    let measured = measure_with(options, &binaries, &tool);
    if measured.is_err() {
        remove_leftover_pods(&tool, &cgroups_before);
    }
    measured
}

/// Refuses a runtime that holds sandboxes the bench did not make, and removes the ones an earlier
/// run of its own left: the bench's agent lists every sandbox at start and removes the ones that
/// are not its pods', and the runtime works for them meanwhile, which skews the figures (a run
/// on a runtime holding the stopped sandboxes of pods run by hand had twice the anonymous
/// memory at 0 pods of a run on an empty one).
fn runtime_holds_only_bench_pods(tool: &CriTool) -> Result<()> {
    let held = tool.sandboxes_by_namespace()?;
    let foreign = foreign_sandboxes(&held);
    if !foreign.is_empty() {
        bail!(
            "the runtime holds sandboxes the bench did not make ({}), which its agent would list and remove while \
             it measures; stop whatever made them and run `cargo xtask runtime stop` (the runtime's state is \
             on a tmpfs of its own: it starts again empty)",
            foreign.join(", ")
        );
    }
    for namespace in OWN_NAMESPACES.into_iter().filter(|namespace| held.contains_key(*namespace)) {
        progress(&format!("removing the sandboxes an earlier run left in namespace {namespace}"));
        tool.remove_pods_of(namespace)?;
    }
    Ok(())
}

/// The namespaces of the pods the bench makes: its agent's and the floor's.
const OWN_NAMESPACES: [&str; 2] = [harness::NAMESPACE, harness::FLOOR_NAMESPACE];

/// The sandboxes of `held` (counts by namespace) that are not the bench's, one phrase each.
fn foreign_sandboxes(held: &BTreeMap<String, usize>) -> Vec<String> {
    held.iter()
        .filter(|(namespace, _)| !OWN_NAMESPACES.contains(&namespace.as_str()))
        .map(|(namespace, count)| format!("{count} of namespace {namespace:?}"))
        .collect()
}

/// Removes the pods a failed run left on the runtime: their sandboxes through the runtime,
/// which tears their networks down (stopping containerd with them there would leave their
/// network namespaces and addresses on the host), then their pod cgroups, empty once the
/// sandboxes are gone.
fn remove_leftover_pods(tool: &CriTool, cgroups_before: &BTreeSet<String>) {
    if let Err(err) = tool.remove_namespace() {
        println!("warning: the failed run's sandboxes were not removed: {err:#}");
    }
    let left: Vec<String> = leaks::pod_cgroups().difference(cgroups_before).cloned().collect();
    let kept: Vec<&String> = left.iter().filter(|cgroup| fs::remove_dir(cgroup).is_err()).collect();
    if !kept.is_empty() {
        println!("warning: the failed run's pod cgroups {kept:?} could not be removed");
    }
}

/// The size of the tmpfs the bench's agents keep their root directories and pod logs on.
const SCRATCH_SIZE: &str = "2g";

/// Measures with the bench's scratch directory on a tmpfs of its own, and keeps its agents' logs
/// whatever the outcome. The directory is the agents' node filesystem (`nodefs`): on the host's
/// disk, a host with less than a tenth of its disk free gives the agent upstream's DiskPressure,
/// which refuses every API pod (a clean clone's cold build on a full CI disk did so).
fn measure_with(options: &Options, binaries: &harness::Binaries, tool: &CriTool) -> Result<Results> {
    let dir = bench_dir();
    let _ = fs::remove_dir_all(&dir);
    let _scratch = SmallFilesystems::mount(std::slice::from_ref(&dir), SCRATCH_SIZE)?;
    let measured = measure_in(options, binaries, tool, &dir);
    keep_agent_logs(&dir)?;
    measured
}

fn measure_in(options: &Options, binaries: &harness::Binaries, tool: &CriTool, dir: &Path) -> Result<Results> {
    let mut results = Results { load_before: harness::load(), ..Results::default() };
    let largest = options.sizes.iter().copied().max().unwrap_or(1);

    progress("starting the agent, with its kubelet API served");
    let agent_dir = dir.join("agent");
    let served = harness::kubelet_api_served(&agent_dir)?;
    let served: Vec<&str> = served.iter().map(String::as_str).collect();
    let mut agent = Agent::start(&binaries.agent, &agent_dir, &served)?;
    let measured = agent_figures(options, &mut agent, tool, dir, largest);
    agent.stop(Duration::from_secs(10))?;
    let runs = measured?;
    let api_pods = largest.min(CLUSTER_PODS);
    let cluster_runs = if options.startup_only {
        None
    } else {
        cluster::measure(&binaries.agent, &binaries.api_tool, tool, &dir.join("cluster"), api_pods, options)?
    };

    let floors: Vec<_> = runs.floors.iter().map(|(n, floor)| (*n, floor.stats())).collect();
    for (n, FloorStats { seq, par, seq_stop, par_stop, par_calls, par_runtime_cpu }) in &floors {
        let api = runs.api.get(n).map(Vec::as_slice).unwrap_or_default();
        let cri = runs.cri.get(n).map(Vec::as_slice).unwrap_or_default();
        let teardown = runs.teardown.get(n).map(Vec::as_slice).unwrap_or_default();
        // Issue 38's targets: one pod within the floor + 40 ms, more within 1.1× the floor.
        let (factor, plus) = if *n == 1 { (1.0, 0.04) } else { (1.1, 0.0) };
        results.figures.push(
            Figure::new(format!("start-up, {n} pods: manifests written → all Running in /pods"), "s", api)
                .floor(par.median)
                .target(Target::Floor { factor, plus }),
        );
        results.figures.push(
            Figure::new(format!("start-up, {n} pods: manifests written → all containers running (CRI)"), "s", cri)
                .floor(par.median),
        );
        let breakdowns = runs.breakdown.get(n).map(Vec::as_slice).unwrap_or_default();
        results.figures.extend(breakdown::figures(*n, breakdowns, par_calls, par_runtime_cpu.median));
        results.figures.push(floor_figure(format!("floor, {n} pods, all at once"), *par));
        results.figures.push(floor_figure(format!("floor, {n} pods, one at a time"), *seq));
        results.figures.push(
            Figure::new(format!("teardown, {n} pods: manifests removed → no sandbox ready"), "s", teardown)
                .floor(par_stop.median),
        );
        results.figures.push(floor_figure(format!("floor teardown, {n} pods, all at once"), *par_stop));
        results.figures.push(floor_figure(format!("floor teardown, {n} pods, one at a time"), *seq_stop));
        results.startup.push(StartupPoint {
            pods: *n,
            api: Stat::of(api).median,
            cri: Stat::of(cri).median,
            floor_parallel: par.median,
            floor_sequential: seq.median,
        });
    }
    if let Some(cluster_runs) = &cluster_runs {
        let medians = |samples: &Samples| samples.iter().map(|(&n, s)| (n, Stat::of(s).median)).collect();
        let standalone = cluster::Standalone { startup: medians(&runs.api), teardown: medians(&runs.teardown) };
        results.figures.extend(cluster::figures(cluster_runs, &standalone));
    }
    if cluster_runs.is_none() {
        results.left_out.push(cluster::FIGURES);
    }
    if !options.startup_only {
        others(options, binaries, dir, &runs, &mut results)?;
    }
    apply_targets(options, &mut results.figures);
    results.load_after = harness::load();
    Ok(results)
}

/// The figures of every phase but the start-ups: a container's death and restart, exec, probing,
/// idling, the hollow node, the binary's size and criterion's.
fn others(
    options: &Options,
    binaries: &harness::Binaries,
    dir: &Path,
    runs: &AgentRuns,
    results: &mut Results,
) -> Result<()> {
    results.figures.push(
        Figure::new("container death (runtime confirms) → the death seen in /pods", "s", &runs.death_seen)
            .target(Target::AtMost(0.05)),
    );
    results.figures.push(Figure::new(
        "container death (runtime confirms) → replacement started by the runtime",
        "s",
        &runs.restart,
    ));
    results.figures.push(Figure::new(
        "replacement started by the runtime → restarted and Running in /pods",
        "s",
        &runs.restart_seen,
    ));
    let exec_floor = Stat::of(&runs.exec_floor).median;
    results.figures.push(
        Figure::new("exec round trip through the agent (`true` by /run on its socket)", "s", &runs.exec)
            .floor(exec_floor)
            .target(Target::Floor { factor: 1.0, plus: 0.02 }),
    );
    results.figures.push(Figure::new("exec round trip, the runtime's own ExecSync", "s", &runs.exec_floor).unchecked());
    results.figures.push(
        Figure::new(
            format!(
                "agent CPU probing {PROBED_CONTAINERS} containers (an exec probe every 10 s, an httpGet every 1 s)"
            ),
            "s/min",
            &runs.probing.cpu,
        )
        .floor(Stat::of(&runs.probing.floor_cpu).median),
    );
    results.figures.push(
        Figure::new("probing floor: CPU of a client running the same probes alone", "s/min", &runs.probing.floor_cpu)
            .unchecked(),
    );
    results.figures.push(
        Figure::new(format!("probes run per second (of {})", PROBES_PER_SECOND), "/s", &runs.probing.rate)
            .higher_is_better()
            .within(0.05, PROBES_PER_SECOND),
    );
    results.figures.push(
        Figure::new(format!("pods Ready while probed (of {PROBED_PODS})"), "", &[runs.probing.ready as f64])
            .higher_is_better()
            .exactly(PROBED_PODS),
    );
    for (pods, idle) in &runs.idle {
        let (cpu, rss) = match *pods {
            0 => (0.05, 12.0),
            MAX_PODS.. => (0.1, 30.0),
            _ => (0.3, 20.0),
        };
        results
            .figures
            .push(Figure::new(format!("idle CPU, {pods} pods"), "s/min", &idle.cpu).target(Target::AtMost(cpu)));
        results
            .figures
            .push(Figure::new(format!("resident memory, {pods} pods"), "MiB", &idle.rss).target(Target::AtMost(rss)));
        results.figures.push(Figure::new(
            format!("of which anonymous (heap, stacks), {pods} pods"),
            "MiB",
            &idle.rss_anon,
        ));
        let threads = Figure::new(format!("threads, {pods} pods"), "", &idle.threads);
        results.figures.push(if *pods > 0 { threads.target(Target::AtMost(16.0)) } else { threads });
        results.figures.push(Figure::new(format!("open files, {pods} pods"), "", &idle.fds));
        results.figures.push(Figure::new(format!("relists while idle, {pods} pods"), "/min", &idle.relists));
        if !idle.relist.is_empty() {
            results.figures.push(Figure::new(format!("relist (agent's own metric), {pods} pods"), "ms", &idle.relist));
        }
        results.memory.push((*pods, Stat::of(&idle.rss).median));
    }
    for &pods in &options.hollow {
        let hollow = hollow::measure(&binaries.agent, &dir.join("hollow"), pods, options)?;
        results.figures.extend(hollow::figures(&hollow));
    }
    let size = fs::metadata(&binaries.agent)?.len() as f64 / (1024.0 * 1024.0);
    results.figures.push(Figure::new(format!("binary size ({} profile)", options.profile.name()), "MiB", &[size]));
    if options.criterion {
        // The agent's figures stand without these.
        match criterion_figures() {
            Ok(figures) => results.figures.extend(figures),
            Err(err) => println!("warning: the criterion benchmarks failed; their rows are left out: {err:#}"),
        }
    }
    Ok(())
}

/// Copies the standalone and the cluster agent's logs to `target/bench/logs/`, where they stay
/// after the run's directory is gone: a figure far off its usual value is read from them.
fn keep_agent_logs(dir: &Path) -> Result<()> {
    for agent in ["agent", "cluster"] {
        keep_log(&dir.join(agent).join("agent.log"), agent)?;
    }
    Ok(())
}

/// Copies `log`, where it exists, to `target/bench/logs/{name}.log`.
fn keep_log(log: &Path, name: &str) -> Result<()> {
    if !log.exists() {
        return Ok(());
    }
    fs::copy(log, logs_dir()?.join(format!("{name}.log")))?;
    Ok(())
}

/// `target/bench/logs/`, made if missing: what the bench keeps of its agents after their
/// directories are gone.
fn logs_dir() -> Result<PathBuf> {
    let logs = project_root()?.join("target/bench/logs");
    fs::create_dir_all(&logs)?;
    Ok(logs)
}

/// A row of the floor's, whose runs were summed up as they came.
fn floor_figure(name: String, stat: Stat) -> Figure {
    Figure { stat, ..Figure::new(name, "s", &[]) }.unchecked()
}

/// Idle figures of one pod count, one sample per window.
#[derive(Debug, Default)]
struct Idle {
    cpu: Vec<f64>,
    rss: Vec<f64>,
    rss_anon: Vec<f64>,
    threads: Vec<f64>,
    fds: Vec<f64>,
    relist: Vec<f64>,
    relists: Vec<f64>,
}

type Samples = std::collections::HashMap<usize, Vec<f64>>;

/// What the agent's runs measured, per pod count.
#[derive(Debug, Default)]
struct AgentRuns {
    /// Manifests written → all Running in `/pods`.
    api: Samples,
    /// Manifests written → all containers running in the CRI.
    cri: Samples,
    /// Manifests removed → no sandbox ready.
    teardown: Samples,
    /// The start-up runs' breakdowns.
    breakdown: BTreeMap<usize, Vec<breakdown::Breakdown>>,
    /// A container's death confirmed by the runtime → `/pods` no longer shows it running (a
    /// transition the runtime reports, which the agent must notice by itself).
    death_seen: Vec<f64>,
    /// A container's death confirmed by the runtime → its replacement started by the runtime.
    restart: Vec<f64>,
    /// The replacement started by the runtime → restarted and running in `/pods`.
    restart_seen: Vec<f64>,
    /// `true` run through the agent's `/run`, round trip.
    exec: Vec<f64>,
    /// `true` run by the runtime's own ExecSync, round trip.
    exec_floor: Vec<f64>,
    idle: Vec<(usize, Idle)>,
    /// The agent probing 100 containers.
    probing: Probing,
    /// The floor of each pod count, measured in the same rounds as the agent's start-ups.
    floors: BTreeMap<usize, FloorRuns>,
}

/// The floor's runs of one pod count: one pod at a time and all at once, start and stop, and the
/// mean time of each start call of the runs all at once.
#[derive(Debug, Default)]
struct FloorRuns {
    seq: Vec<f64>,
    par: Vec<f64>,
    seq_stop: Vec<f64>,
    par_stop: Vec<f64>,
    par_calls: BTreeMap<String, Vec<f64>>,
    /// containerd's CPU seconds per pod until all had started, all at once.
    par_runtime_cpu: Vec<f64>,
}

/// [`FloorRuns`] summed up.
struct FloorStats {
    seq: Stat,
    par: Stat,
    seq_stop: Stat,
    par_stop: Stat,
    par_calls: BTreeMap<String, Vec<f64>>,
    par_runtime_cpu: Stat,
}

impl FloorRuns {
    fn stats(&self) -> FloorStats {
        FloorStats {
            seq: Stat::of(&self.seq),
            par: Stat::of(&self.par),
            seq_stop: Stat::of(&self.seq_stop),
            par_stop: Stat::of(&self.par_stop),
            par_calls: self.par_calls.clone(),
            par_runtime_cpu: Stat::of(&self.par_runtime_cpu),
        }
    }
}

/// One round of the floor for `n` pods, one at a time then all at once, with the agent paused
/// (SIGSTOP), which would otherwise remove the floor's pods as orphans. Measured just before the
/// agent's own round of the same size, so that both meet the machine in the same state: on this
/// 2-core VM the runtime's own calls run up to twice as slow for minutes at a time, and floors
/// measured all first, ten minutes before the agent's rounds, put the same build's start-up at
/// 1.1× the floor in one run and 2× in the next.
fn floor_round(agent: &Agent, tool: &CriTool, dir: &Path, n: usize, floor: &mut FloorRuns) -> Result<()> {
    let paused = agent.pause();
    let one_at_a_time = tool.floor(n, 1, dir)?;
    let all_at_once = tool.floor(n, n, dir)?;
    drop(paused);
    floor.seq.push(one_at_a_time.start);
    floor.seq_stop.push(one_at_a_time.stop);
    floor.par.push(all_at_once.start);
    floor.par_stop.push(all_at_once.stop);
    for (call, mean) in all_at_once.calls {
        floor.par_calls.entry(call).or_default().push(mean);
    }
    floor.par_runtime_cpu.push(all_at_once.runtime_cpu / n as f64);
    // The agent hears of the floor's pods, all gone by now, when it resumes.
    agent.wait_quiet(Duration::from_secs(10));
    Ok(())
}

fn agent_figures(
    options: &Options,
    agent: &mut Agent,
    tool: &CriTool,
    dir: &Path,
    largest: usize,
) -> Result<AgentRuns> {
    agent.wait_healthy(Duration::from_secs(30))?;
    let mut runs = AgentRuns::default();
    if !options.startup_only {
        progress(&format!("idle, 0 pods: {} windows of {:?}", options.windows, options.window));
        std::thread::sleep(Duration::from_secs(5));
        runs.idle.push((0, idle_windows(agent, options)?));
    }
    // Every round of one size before the next size: a start-up pays for the pods removed in the
    // minute before it (the root filesystem has no journal, and ext4 then passes over every inode
    // freed in the last minute before it reuses one), so the floor's start-up, which follows the
    // floor's one-at-a-time pods and the agent's teardown of the round before, and the agent's,
    // which follows the floor's two sets, each follow the removal of twice as many pods as they
    // start. Sizes interleaved, a floor followed the teardown of the size before it.
    for &n in &options.sizes {
        for round in 1..=options.repeat {
            progress(&format!("floor, {n} pods, run {round} of {}", options.repeat));
            floor_round(agent, tool, dir, n, runs.floors.entry(n).or_default())?;
            progress(&format!("agent start-up, {n} pods, run {round} of {}", options.repeat));
            let cgroups_before = leaks::pod_cgroups();
            let started = start_pods(agent, tool, n, round)?;
            runs.api.entry(n).or_default().push(started.api);
            runs.cri.entry(n).or_default().push(started.cri);
            runs.breakdown.entry(n).or_default().push(started.breakdown);
            if n == 1 && !options.startup_only {
                progress(&format!("agent restart of a dead container, run {round} of {}", options.repeat));
                let restart = restart_after_death(agent, tool)?;
                runs.death_seen.push(restart.death_seen);
                runs.restart.push(restart.replacement_started);
                runs.restart_seen.push(restart.replacement_seen);
                progress(&format!("exec round trips, run {round} of {}", options.repeat));
                let (floor, through_agent) = exec_round_trips(agent, tool, round)?;
                runs.exec_floor.extend(floor);
                runs.exec.extend(through_agent);
            }
            if n == largest && round == options.repeat && !options.startup_only {
                progress(&format!("idle, {n} pods: {} windows of {:?}", options.windows, options.window));
                std::thread::sleep(Duration::from_secs(10));
                runs.idle.push((n, idle_windows(agent, options)?));
            }
            progress(&format!("agent teardown, {n} pods, run {round} of {}", options.repeat));
            runs.teardown.entry(n).or_default().push(stop_pods(agent, tool)?);
            wait_for_pod_cgroups(&cgroups_before)?;
        }
    }
    if !options.startup_only {
        runs.probing = probing_cost(agent, tool, options)?;
    }
    Ok(runs)
}

/// Containers of the probing figure, two per pod.
const PROBED_CONTAINERS: usize = 100;

/// Pods of the probing figure.
const PROBED_PODS: usize = PROBED_CONTAINERS / 2;

/// Probes a second the probed pods ask for: each container's httpGet every second and its exec
/// every 10 s ([`harness::probed_manifest`]).
const PROBES_PER_SECOND: usize = PROBED_CONTAINERS + PROBED_CONTAINERS / 10;

/// Runs 50 pods of two containers, each with an exec probe every 10 s and an httpGet probe every
/// second, waits until they are Ready (for at most a minute: the windows then measure what there
/// is, and the Ready row tells), and measures the agent's CPU while they only run and are probed.
fn probing_cost(agent: &mut Agent, tool: &CriTool, options: &Options) -> Result<Probing> {
    progress(&format!("probing, {PROBED_CONTAINERS} containers: {} windows of {:?}", options.windows, options.window));
    let manifests = agent.dir.join("manifests");
    for i in 0..PROBED_PODS {
        let name = format!("probed-{i}");
        write_manifest(&manifests, &name, &harness::probed_manifest(&name))?;
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    while agent.running() < PROBED_PODS {
        if Instant::now() > deadline {
            bail!("{PROBED_PODS} probed pods were not all Running within 180 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while agent.ready()? < PROBED_PODS && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    let probe_floor = tool.probe(&harness::PROBED_PORTS)?;
    std::thread::sleep(Duration::from_secs(5));
    let per_minute = |ns: u64, took: f64| ns as f64 / 1e9 * 60.0 / took;
    let mut probing = Probing::default();
    for _ in 0..options.windows {
        let (_, probes0) = agent.metric_sum_count("prober_probe_duration_seconds")?;
        let (cpu0, floor0) = (agent.cpu_ns(), probe_floor.cpu_ns());
        let began = Instant::now();
        std::thread::sleep(options.window);
        let (cpu1, floor1) = (agent.cpu_ns(), probe_floor.cpu_ns());
        let took = began.elapsed().as_secs_f64();
        let (_, probes1) = agent.metric_sum_count("prober_probe_duration_seconds")?;
        probing.cpu.push(per_minute(cpu1.saturating_sub(cpu0), took));
        probing.floor_cpu.push(per_minute(floor1.saturating_sub(floor0), took));
        probing.rate.push((probes1 - probes0) / took);
    }
    drop(probe_floor);
    probing.ready = agent.ready()?;
    stop_pods(agent, tool)?;
    Ok(probing)
}

/// The probing figure's samples.
#[derive(Debug, Default)]
struct Probing {
    /// The agent's CPU seconds per minute.
    cpu: Vec<f64>,
    /// The probing floor's (`cri_bench probe`) CPU seconds per minute, in the same windows.
    floor_cpu: Vec<f64>,
    /// Probes run per second ([`PROBES_PER_SECOND`] when every probe keeps its period).
    rate: Vec<f64>,
    /// Pods Ready at the end (the exec probes pass only when the runtime keeps up).
    ready: usize,
}

fn idle_windows(agent: &Agent, options: &Options) -> Result<Idle> {
    let mut idle = Idle::default();
    for _ in 0..options.windows {
        let (sum0, count0) = agent.metric_sum_count("kubelet_pleg_relist_duration_seconds")?;
        let cpu0 = agent.cpu_ns();
        let began = Instant::now();
        std::thread::sleep(options.window);
        let cpu1 = agent.cpu_ns();
        let took = began.elapsed().as_secs_f64();
        let (sum1, count1) = agent.metric_sum_count("kubelet_pleg_relist_duration_seconds")?;
        idle.cpu.push((cpu1.saturating_sub(cpu0)) as f64 / 1e9 * 60.0 / took);
        idle.rss.push(agent.rss_bytes() as f64 / (1024.0 * 1024.0));
        idle.rss_anon.push(agent.rss_anon_bytes() as f64 / (1024.0 * 1024.0));
        idle.threads.push(agent.threads() as f64);
        idle.fds.push(agent.fds() as f64);
        idle.relists.push((count1 - count0) * 60.0 / took);
        if count1 > count0 {
            idle.relist.push((sum1 - sum0) / (count1 - count0) * 1000.0);
        }
    }
    Ok(idle)
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str().with_context(|| format!("{} is not UTF-8", path.display()))
}

/// Round trips of each exec figure.
const EXEC_ROUND_TRIPS: usize = 20;

/// The exec figures: `true` run in the 1-pod run's container by the runtime's own ExecSync, then
/// through the agent's `/run` (an HTTP request, the pod looked up, ExecSync, the output back).
fn exec_round_trips(agent: &Agent, tool: &CriTool, round: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    let floor = tool.exec_sync(EXEC_ROUND_TRIPS)?;
    let path = format!("/run/{}/bench-r{round}-0-{}/app?cmd=true", harness::NAMESPACE, harness::NODE);
    let mut through_agent = Vec::with_capacity(EXEC_ROUND_TRIPS);
    for _ in 0..EXEC_ROUND_TRIPS {
        let began = Instant::now();
        let (status, body) = harness::request(&agent.socket(), "POST", &path)?;
        through_agent.push(began.elapsed().as_secs_f64());
        if status != 200 {
            bail!("/run answered {status}: {body}");
        }
    }
    Ok((floor, through_agent))
}

/// One start-up run, seconds from the manifests written.
struct StartRun {
    /// Until all are Running in `/pods`.
    api: f64,
    /// Until all containers run in the CRI.
    cri: f64,
    breakdown: breakdown::Breakdown,
}

/// Writes N manifests; times them until all are Running in `/pods`, and until all their
/// containers run in the CRI, with the breakdown of the agent's metrics in between. Names carry
/// the run, so every run has new pods (a static pod's UID comes from its manifest, and a
/// container's restart back-off from its pod's UID).
///
/// The watching must not load the machine the floor had to itself: `/pods` is read every 10 ms
/// at first and then every hundredth of the time so far (at most 1 % late), and the containers'
/// start comes afterwards from the runtime's own record of it. Reading `/pods` and listing the
/// runtime's containers every 10 ms each made the agent's start-up of 50 pods 15 % slower by
/// hand (6.0-6.3 s against 5.2-5.9 s, the floor 4.8-5.3 s).
fn start_pods(agent: &mut Agent, tool: &CriTool, n: usize, round: usize) -> Result<StartRun> {
    let manifests = agent.dir.join("manifests");
    let before = breakdown::snapshot(agent)?;
    let t0 = harness::unix_now();
    for i in 0..n {
        let name = format!("bench-r{round}-{i}");
        write_manifest(&manifests, &name, &harness::manifest(&name))?;
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    let api = loop {
        if agent.running() >= n {
            break harness::unix_now() - t0;
        }
        if !agent.alive() {
            bail!("the agent exited; see {}", agent.dir.join("agent.log").display());
        }
        if Instant::now() > deadline {
            bail!("{n} pods were not all Running in /pods within 180 s");
        }
        let so_far = Duration::from_secs_f64((harness::unix_now() - t0).max(0.0));
        std::thread::sleep((so_far / 100).max(Duration::from_millis(10)));
    };
    let after = breakdown::snapshot(agent)?;
    let cri = last_container_start(tool)? - t0;
    Ok(StartRun { api, cri, breakdown: breakdown::between(&before, &after, n) })
}

/// When the last of the running containers of the bench's pods started, as the runtime
/// recorded it (Unix seconds).
fn last_container_start(tool: &CriTool) -> Result<f64> {
    let started = tool.state()?.values().filter_map(|pod| pod["started"].as_f64()).fold(f64::NAN, f64::max);
    if started.is_nan() {
        bail!("the runtime runs no container of the bench's pods");
    }
    Ok(started)
}

/// Seconds of a restart after a container's death, from the runtime's confirmation of the death.
struct Restart {
    /// Until `/pods` first shows the container not running, or already restarted.
    death_seen: f64,
    /// Until the runtime started the replacement.
    replacement_started: f64,
    /// From the replacement's start until `/pods` shows it restarted and running.
    replacement_seen: f64,
}

/// Stops the running container at once, and times how the agent notices and replaces it.
fn restart_after_death(agent: &mut Agent, tool: &CriTool) -> Result<Restart> {
    let (before, _) = agent.restarts()?;
    let killed = tool.kill_containers()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut death_seen = None;
    let seen = loop {
        let (restarts, running) = agent.restarts()?;
        if death_seen.is_none() && (restarts > before || !running) {
            death_seen = Some(harness::unix_now());
        }
        if restarts > before && running {
            break harness::unix_now();
        }
        if Instant::now() > deadline {
            bail!("the killed container was not restarted within 60 s");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    // When the runtime started the replacement, by its own clock (the same machine's).
    let started = last_container_start(tool)?;
    Ok(Restart {
        death_seen: death_seen.unwrap_or(seen) - killed,
        replacement_started: started - killed,
        replacement_seen: seen - started,
    })
}

/// Removes every manifest; returns seconds until no sandbox of them is ready, then waits until
/// the agent has forgotten them and the runtime holds nothing of them.
fn stop_pods(agent: &mut Agent, tool: &CriTool) -> Result<f64> {
    let watch = tool.watch(&["--stopped"])?;
    let t0 = harness::unix_now();
    for entry in fs::read_dir(agent.dir.join("manifests"))? {
        fs::remove_file(entry?.path())?;
    }
    let stopped = watch.wait(Duration::from_secs(180))? - t0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(agent.pods()?.is_empty() && tool.state()?.is_empty()) {
        if Instant::now() > deadline {
            bail!("the removed pods were still in /pods or in the runtime after 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(stopped)
}

/// Waits (at most 30 s) until the pod cgroups are back to `before`: the agent's housekeeping
/// queues a stopped pod's removal within 2 s, its background task removes one pod after
/// another, and the next round then starts on a node as quiet as the floor's, not beside the
/// last round's cleanup.
fn wait_for_pod_cgroups(before: &BTreeSet<String>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<String> = leaks::pod_cgroups().difference(before).cloned().collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("30 s after the pods were removed, their cgroups {left:?} were still there");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The two criterion benchmarks on the fake runtime the table reports.
fn criterion_figures() -> Result<Vec<Figure>> {
    let root = project_root()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    progress("criterion: pleg relist of 10,000 unchanged containers (fake runtime)");
    run(Command::new(&cargo).current_dir(&root).args([
        "bench",
        "--locked",
        "-p",
        "kubelet-pleg",
        "--bench",
        "relist",
        "--",
        "unchanged/10000",
    ]))?;
    progress("criterion: pod-worker dispatch of 10,000 pods (fake runtime)");
    run(Command::new(&cargo).current_dir(&root).args([
        "bench",
        "--locked",
        "-p",
        "kubelet-podworkers",
        "--bench",
        "dispatch",
        "--",
        "podworkers_dispatch/10000",
    ]))?;
    let criterion = root.join("target/criterion");
    Ok(vec![
        Figure::new(
            "relist, 10,000 unchanged containers (fake runtime, criterion)",
            "ms",
            &criterion_samples(&criterion.join("pleg_relist/unchanged/10000"))?,
        ),
        Figure::new(
            "pod-worker dispatch, 10,000 pods (fake runtime, criterion)",
            "ms",
            &criterion_samples(&criterion.join("podworkers_dispatch/10000"))?,
        ),
    ])
}

/// Per-iteration times of a criterion benchmark's last run, in milliseconds.
fn criterion_samples(dir: &Path) -> Result<Vec<f64>> {
    let path = dir.join("new/sample.json");
    let json: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?)?;
    let iters = json["iters"].as_array().context("sample.json without iters")?;
    let times = json["times"].as_array().context("sample.json without times")?;
    Ok(iters.iter().zip(times).filter_map(|(i, t)| Some(t.as_f64()? / i.as_f64()? / 1e6)).collect())
}

/// Writes the table (`baseline`: the one the run is held to, which gives the gate column its
/// bounds, where there is one).
fn report(options: &Options, results: &Results, commit: &str, baseline: Option<&baseline::Baseline>) -> Result<()> {
    let out = project_root()?.join("target/bench");
    fs::create_dir_all(&out)?;
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let markdown = markdown(options, results, commit, cpus, baseline);
    print!("\n{markdown}");
    fs::write(out.join("bench.md"), &markdown)?;
    let json = serde_json::json!({
        "commit": commit,
        "cpus": cpus,
        "load_before": results.load_before,
        "load_after": results.load_after,
        "repeat": options.repeat,
        "idle_windows": options.windows,
        "idle_window_s": options.window.as_secs_f64(),
        "figures": results.figures.iter().map(|f| f.json(baseline)).collect::<Vec<_>>(),
    });
    fs::write(out.join("bench.json"), serde_json::to_string_pretty(&json)?)?;
    fs::write(out.join("bench.svg"), svg(results))?;
    println!("wrote {}, bench.json and bench.svg", out.join("bench.md").display());
    Ok(())
}

/// The table; its target and met columns in full mode only, where the targets apply.
fn markdown(
    options: &Options,
    results: &Results,
    commit: &str,
    cpus: usize,
    baseline: Option<&baseline::Baseline>,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Commit {commit}, {cpus} CPUs, load {:.2} before and {:.2} after; {} run(s) per start-up, teardown and \
         floor figure, {} idle window(s) of {} s.\n",
        results.load_before,
        results.load_after,
        options.repeat,
        options.windows,
        options.window.as_secs()
    );
    if options.targets {
        md.push_str("| figure | unit | min | median | max | floor | ratio | gate | target | met |\n");
        md.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    } else {
        md.push_str("| figure | unit | min | median | max | floor | ratio | gate |\n");
        md.push_str("|---|---|---|---|---|---|---|---|\n");
    }
    for f in &results.figures {
        let _ = write!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            f.name,
            f.unit,
            number(f.stat.min),
            number(f.stat.median),
            number(f.stat.max),
            f.floor.map(number).unwrap_or_default(),
            f.ratio().map(|r| if r.is_finite() { format!("{r:.2}×") } else { "n/a".to_owned() }).unwrap_or_default(),
            f.gate_text(baseline),
        );
        if options.targets {
            let met = match f.met() {
                Some(true) => "yes".to_owned(),
                Some(false) => format!("no (by {})", number(f.held() - f.bound().unwrap_or(0.0))),
                None if f.target.is_some() => "no (no floor)".to_owned(),
                None => String::new(),
            };
            let _ = write!(md, " {} | {met} |", f.target_text());
        }
        md.push('\n');
    }
    md
}

/// Two panels: start-up latency against N (agent and floor), resident memory against pods.
fn svg(results: &Results) -> String {
    let (w, h, pad) = (420.0_f64, 260.0_f64, 40.0_f64);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n",
        2.0 * w
    );
    s.push_str("<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
    // Panel 1: start-up.
    let max_n = results.startup.iter().map(|r| r.pods).max().unwrap_or(1) as f64;
    let max_t = results
        .startup
        .iter()
        .flat_map(|r| [r.api, r.cri, r.floor_parallel, r.floor_sequential])
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let x = |n: f64| pad + (w - 2.0 * pad) * n / max_n.max(1.0);
    let y = |v: f64| h - pad - (h - 2.0 * pad) * v / max_t.max(1e-9);
    axes(&mut s, 0.0, w, h, pad, "pods started at once", &format!("seconds (max {})", number(max_t)));
    let _ = writeln!(s, "<text x=\"{pad}\" y=\"16\" font-weight=\"bold\">start-up latency</text>");
    let series: [Series; 4] = [
        ("agent: Running in /pods", "#d62728", |r| r.api),
        ("agent: running in CRI", "#ff7f0e", |r| r.cri),
        ("floor, all at once", "#1f77b4", |r| r.floor_parallel),
        ("floor, one at a time", "#7f7f7f", |r| r.floor_sequential),
    ];
    for (i, (label, colour, value)) in series.iter().enumerate() {
        let points: Vec<String> =
            results.startup.iter().map(|r| format!("{:.1},{:.1}", x(r.pods as f64), y(value(r)))).collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
            points.join(" ")
        );
        let ly = pad + 14.0 * i as f64;
        let _ = writeln!(
            s,
            "<line x1=\"{0}\" y1=\"{ly}\" x2=\"{1}\" y2=\"{ly}\" stroke=\"{colour}\" stroke-width=\"2\"/><text x=\"{2}\" y=\"{3}\">{label}</text>",
            pad + 10.0,
            pad + 30.0,
            pad + 34.0,
            ly + 4.0
        );
    }
    for r in &results.startup {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            x(r.pods as f64),
            h - pad + 14.0,
            r.pods
        );
    }
    // Panel 2: memory.
    let max_m = results.memory.iter().map(|m| m.1).filter(|v| v.is_finite()).fold(0.0, f64::max).max(1.0);
    axes(&mut s, w, w, h, pad, "pods", &format!("resident MiB (max {})", number(max_m)));
    let _ = writeln!(s, "<text x=\"{}\" y=\"16\" font-weight=\"bold\">resident memory, idle</text>", w + pad);
    let slot = (w - 2.0 * pad) / results.memory.len().max(1) as f64;
    for (i, (pods, mib)) in results.memory.iter().enumerate() {
        let bar = (h - 2.0 * pad) * mib / max_m;
        let bx = w + pad + slot * i as f64 + slot * 0.25;
        let _ = writeln!(
            s,
            "<rect x=\"{bx:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bar:.1}\" fill=\"#d62728\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{pods} pods: {} MiB</text>",
            h - pad - bar,
            slot * 0.5,
            bx + slot * 0.25,
            h - pad + 14.0,
            number(*mib)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn axes(s: &mut String, left: f64, w: f64, h: f64, pad: f64, x_label: &str, y_label: &str) {
    let _ = writeln!(
        s,
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/><line x1=\"{0}\" y1=\"{3}\" x2=\"{0}\" y2=\"{1}\" stroke=\"black\"/>",
        left + pad,
        h - pad,
        left + w - pad,
        pad
    );
    let _ = writeln!(s, "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{x_label}</text>", left + w / 2.0, h - 8.0);
    let _ = writeln!(s, "<text x=\"{}\" y=\"{}\">{y_label}</text>", left + pad, pad - 6.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_is_min_median_max() {
        assert_eq!(Stat::of(&[3.0, 1.0, 2.0]), Stat { min: 1.0, median: 2.0, max: 3.0 });
        assert_eq!(Stat::of(&[4.0, 1.0, 2.0, 3.0]), Stat { min: 1.0, median: 2.5, max: 4.0 });
        assert!(Stat::of(&[]).median.is_nan());
    }

    #[test]
    fn targets_against_the_floor() {
        let f = Figure::new("x", "s", &[0.30, 0.31, 0.29]).floor(0.2).target(Target::Floor { factor: 1.3, plus: 0.05 });
        assert_eq!(f.bound(), Some(0.31));
        assert_eq!(f.met(), Some(true));
        let f = Figure::new("x", "s", &[0.5]).floor(0.2).target(Target::Floor { factor: 1.2, plus: 0.0 });
        assert_eq!(f.met(), Some(false));
        assert!(
            markdown(&Options::full(), &Results { figures: vec![f], ..Results::default() }, "c", 2, None)
                .contains("no (by 0.260)")
        );
    }

    #[test]
    fn a_target_for_each_run_is_held_by_the_worst() {
        let f = Figure::new("x", "s", &[0.02, 0.03, 79.1]).target(Target::EachAtMost(2.0));
        assert_eq!(f.met(), Some(false), "the median is within, one update is not");
        assert!(
            markdown(&Options::full(), &Results { figures: vec![f], ..Results::default() }, "c", 2, None)
                .contains("| each ≤ 2.00 | no (by 77.1) |")
        );
        assert_eq!(Figure::new("x", "s", &[0.02, 1.9]).target(Target::EachAtMost(2.0)).met(), Some(true));
    }

    #[test]
    fn sandboxes_of_other_namespaces_are_named() {
        let held = BTreeMap::from([
            (harness::NAMESPACE.to_owned(), 3),
            (harness::FLOOR_NAMESPACE.to_owned(), 1),
            ("hand".to_owned(), 2),
            (String::new(), 1),
        ]);
        assert_eq!(foreign_sandboxes(&held), [r#"1 of namespace """#, r#"2 of namespace "hand""#]);
        assert!(foreign_sandboxes(&BTreeMap::from([(harness::NAMESPACE.to_owned(), 1)])).is_empty());
    }

    #[test]
    fn options_parse() {
        assert_eq!(parse(&[]).unwrap(), Options::full());
        assert_eq!(parse(&["--quick"]).unwrap(), Options::quick());
        assert_eq!(parse(&["--repeat", "5"]).unwrap().repeat, 5);
        let checked = parse(&["--check", "--quick"]).unwrap();
        assert_eq!((checked.check, checked.hollow), (true, vec![1_000]));
        assert_eq!(parse(&["--save-baseline"]).unwrap().save, Some(Save::Replace));
        assert_eq!(parse(&["--quick", "--widen-baseline"]).unwrap().save, Some(Save::Widen));
        assert!(parse(&["--repeat", "0"]).is_err());
        assert!(parse(&["--fast"]).is_err());
        let startup = parse(&["--startup", "10,50", "--repeat", "9"]).unwrap();
        assert!(startup.startup_only);
        assert_eq!((startup.sizes, startup.repeat, startup.profile), (vec![10, 50], 9, harness::Profile::Dist));
        let quick = parse(&["--startup", "10", "--quick"]).unwrap();
        assert_eq!((quick.sizes, quick.profile), (vec![10], harness::Profile::Dev));
        assert!(parse(&["--startup", "10,0"]).is_err());
        assert!(parse(&["--startup", "10", "--check"]).is_err());
        let reasoned = parse(&["--widen-baseline", "--reason", "a slower kernel", "--quick"]).unwrap();
        assert_eq!((reasoned.save, reasoned.reason.as_deref()), (Some(Save::Widen), Some("a slower kernel")));
        assert!(parse(&["--save-baseline", "--reason"]).is_err());
        assert!(parse(&["--save-baseline", "--reason", " "]).is_err());
        assert!(parse(&["--check", "--reason", "why"]).is_err(), "a reason without a baseline to write");
    }

    /// A run of `figures`, as its mode keeps them ([`apply_targets`]).
    fn run_of(options: &Options, mut figures: Vec<Figure>) -> Results {
        apply_targets(options, &mut figures);
        Results { figures, ..Results::default() }
    }

    /// The sentences of [`failures`].
    fn failing(options: &Options, baseline: &baseline::Baseline, results: &Results) -> Vec<String> {
        failures(options, baseline, results).into_iter().map(|(_, sentence)| sentence).collect()
    }

    fn ready(n: f64) -> Figure {
        Figure::new("pods Ready while probed (of 50)", "", &[n]).higher_is_better().exactly(PROBED_PODS)
    }

    fn probes(rate: f64) -> Figure {
        Figure::new("probes run per second (of 110)", "/s", &[rate]).higher_is_better().within(0.05, PROBES_PER_SECOND)
    }

    #[test]
    fn the_probed_pods_ready_are_held_to_all_of_them() {
        let baseline = baseline::of(&[ready(49.0)], "abc");
        let options = Options::quick();
        assert_eq!(
            failing(&options, &baseline, &run_of(&options, vec![ready(49.0)])),
            ["pods Ready while probed (of 50): 49, not 50"]
        );
        assert!(failing(&options, &baseline, &run_of(&options, vec![ready(50.0)])).is_empty());
        assert_eq!(failing(&options, &baseline, &run_of(&options, vec![ready(f64::NAN)])).len(), 1);
        assert_eq!(ready(50.0).gate_text(Some(&baseline)), "= 50");
    }

    #[test]
    fn the_probes_run_are_held_within_five_percent_of_those_asked_for() {
        let baseline = baseline::of(&[probes(109.7)], "abc");
        let options = Options::quick();
        assert_eq!(
            failing(&options, &baseline, &run_of(&options, vec![probes(104.0)])),
            ["probes run per second (of 110): 104 /s, not within 5 % of 110"]
        );
        assert!(failing(&options, &baseline, &run_of(&options, vec![probes(106.0)])).is_empty());
        assert!(failing(&options, &baseline, &run_of(&options, vec![probes(114.0)])).is_empty());
        assert_eq!(failing(&options, &baseline, &run_of(&options, vec![probes(116.0)])).len(), 1);
        assert_eq!(probes(106.0).gate_text(None), "within 5 % of 110");
    }

    #[test]
    fn targets_are_printed_and_held_in_full_mode_only() {
        let hollow = || Figure::new("hollow node, 1000 pods", "s", &[2.19]).target(Target::AtMost(2.0));
        let start_up =
            || Figure::new("start-up", "s", &[0.9]).floor(0.6).target(Target::Floor { factor: 1.1, plus: 0.0 });
        let baseline = baseline::of(&[start_up()], "abc");

        let quick = Options::quick();
        let run = run_of(&quick, vec![hollow(), start_up()]);
        let table = markdown(&quick, &run, "c", 2, Some(&baseline));
        assert!(!table.contains("≤ 2.00") && !table.contains("1.1× floor") && !table.contains("| met |"), "{table}");
        assert!(table.contains("| hollow node, 1000 pods | s | 2.19 | 2.19 | 2.19 |  |  | reported |"), "{table}");
        assert!(table.contains("| 0.600 | 1.50× | ≤ 1.85× floor |"), "{table}");
        assert!(failing(&quick, &baseline, &run).is_empty(), "a quick run misses no target");

        let full = Options::full();
        let run = run_of(&full, vec![hollow(), start_up()]);
        let table = markdown(&full, &run, "c", 2, Some(&baseline));
        assert!(table.contains("| reported | ≤ 2.00 | no (by 0.190) |"), "{table}");
        assert_eq!(
            failing(&full, &baseline, &run),
            [
                "hollow node, 1000 pods: 2.19 s, its target ≤ 2.00 (2.00) missed",
                "start-up: 0.900 s, its target ≤ 1.1× floor (0.660) missed",
            ]
        );
        // Measured again, only what misses again fails.
        let first = failures(&full, &baseline, &run);
        let again = run_of(
            &full,
            vec![Figure::new("hollow node, 1000 pods", "s", &[1.9]).target(Target::AtMost(2.0)), start_up()],
        );
        assert_eq!(
            baseline::confirmed(&first, failures(&full, &baseline, &again)),
            ["start-up: 0.900 s, its target ≤ 1.1× floor (0.660) missed"]
        );
    }

    #[test]
    fn an_absolute_time_three_times_slower_passes_a_quick_check() {
        let name = "hollow node, 1000 pods on fake://: manifests written → all Running";
        let mut baseline = baseline::Baseline::default();
        baseline.figures.insert(name.to_owned(), baseline::Kept { unit: "s".to_owned(), median: 1.37, ratio: None });
        let options = Options::quick();
        let run = run_of(&options, vec![Figure::new(name, "s", &[4.11]).target(Target::AtMost(5.0))]);
        assert!(failing(&options, &baseline, &run).is_empty());
    }
}
