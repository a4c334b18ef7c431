//! `cargo xtask bench --check`: the run's figures against the baseline kept in the repository
//! (`xtask/bench-baseline.json`, written by `--save-baseline`), each regression named. The file
//! holds two sets: `full` (the `dist` build, every figure) and `quick` (the tests' `dev` build,
//! which CI checks), each held only to its own.
//!
//! The baseline holds a figure only by what the machine's speed does not move: a figure with a
//! floor by its ratio to that floor, measured in the same run, and a count with no floor
//! (threads, open files, relists) by its median. A time, a size or a CPU cost with no floor is
//! reported and never held: measured on another machine, it says nothing of the code (the hollow
//! node's 1,000-pod start took 1.37 s on the machine that made the quick baseline, 2.19 s on a
//! fresh CI machine). A regression is a ratio or a count more than 20 % worse than its baseline
//! and also worse by more than its measuring noise (0.05 for a ratio; two threads or open files,
//! three relists a minute).
//! The nominal counts (the probed pods Ready, the probes run per second) are held to their
//! nominal in every run, not to the baseline, which keeps them so that their absence is seen.
//!
//! A figure the baseline holds fails the check where the run has no figure of its name (unless
//! the run left its whole phase out: cluster mode, where no kube-apiserver is found) or where its
//! ratio or median is not a number; a figure the baseline does not hold (a new one) passes, and an
//! entry whose figure is no longer held is ignored, and dropped when the baseline is next saved.
//!
//! A run with regressions is measured again, and only a figure that regresses in both runs fails
//! it ([`confirmed`]): on a shared machine, a phase in which everything ran two to three times
//! slower, the runtime's own calls too, moved some figures past the check's 20 % where their
//! floors did not move alike; a change of the agent shows in every run.
//!
//! `--save-baseline` and `--widen-baseline` refuse a baseline that holds a figure worse than the
//! one it replaces did, or no longer holds it, unless `--reason` says why, which the new baseline
//! then records ([`vetted`]).

use std::{collections::BTreeMap, fs, path::PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::{Figure, Gate, machine_bound, number};
use crate::util::project_root;

/// How much worse than its baseline a held figure may get.
const TOLERANCE: f64 = 1.2;

/// What the baseline keeps of a figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Kept {
    pub(super) unit: String,
    pub(super) median: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ratio: Option<f64>,
}

/// The baseline: the held figures of one run, or the worst of a few runs of one build, by name.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Baseline {
    pub(super) commit: String,
    /// The runs it holds the worst of ([`widen`]).
    #[serde(default = "one_run")]
    pub(super) runs: u32,
    /// Why it was let hold a figure worse than the baseline it replaced (`--reason`), where it
    /// was.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(super) reason: String,
    pub(super) figures: BTreeMap<String, Kept>,
}

fn one_run() -> u32 {
    1
}

pub(super) fn path() -> Result<PathBuf> {
    Ok(project_root()?.join("xtask/bench-baseline.json"))
}

/// The baseline file: a baseline by mode (`full`, `quick`).
type Baselines = BTreeMap<String, Baseline>;

fn load_all() -> Result<Baselines> {
    let path = path()?;
    let text = fs::read_to_string(&path).with_context(|| format!("reading the baseline {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("decoding the baseline {}", path.display()))
}

/// The baseline of runs of `mode`.
pub(super) fn load(mode: &str) -> Result<Baseline> {
    let mut all = load_all()?;
    all.remove(mode).with_context(|| {
        format!(
            "the baseline file has no {mode} baseline: make one with `cargo xtask bench --save-baseline` in that mode"
        )
    })
}

/// The baseline of runs of `mode`, or `None` where the file or its set of `mode` is missing.
pub(super) fn load_if_any(mode: &str) -> Result<Option<Baseline>> {
    if !path()?.exists() {
        return Ok(None);
    }
    Ok(load_all()?.remove(mode))
}

/// Whether the baseline keeps `figure`: a gated one with the value it is held by (its ratio, or
/// its median), a number.
fn keeps(figure: &Figure) -> bool {
    match figure.gate() {
        Gate::Reported => false,
        Gate::Ratio => figure.ratio().is_some_and(f64::is_finite),
        Gate::Count | Gate::Nominal(_) => figure.stat.median.is_finite(),
    }
}

/// Whether the baseline holds its entry `kept` of a figure the run does not have: by its ratio
/// where it keeps one, by its median where its unit is a count's.
fn held(kept: &Kept) -> bool {
    kept.ratio.is_some() || !machine_bound(&kept.unit)
}

/// Whether the baseline still holds its entry `kept` of `name`: by the run's figure of that
/// name where there is one, by what it keeps otherwise ([`held`]).
fn still_held(name: &str, kept: &Kept, figures: &[Figure]) -> bool {
    match figures.iter().find(|f| f.name == name) {
        Some(figure) => figure.gate() != Gate::Reported,
        None => held(kept),
    }
}

/// The baseline of `figures`: the gated ones ([`keeps`]).
pub(super) fn of(figures: &[Figure], commit: &str) -> Baseline {
    let kept = figures
        .iter()
        .filter(|f| keeps(f))
        .map(|f| (f.name.clone(), Kept { unit: f.unit.to_owned(), median: f.stat.median, ratio: f.ratio() }));
    Baseline { commit: commit.to_owned(), runs: 1, reason: String::new(), figures: kept.collect() }
}

/// `kept` widened by `run`, a run of the same build whose figures are `figures`: each figure the
/// worse of the two (its median and ratio alike), so the baseline covers the spread between runs
/// rather than one run's luck. A figure only one of them has is kept as it is; one no longer held
/// is dropped ([`still_held`]).
pub(super) fn widen(kept: &Baseline, run: &Baseline, figures: &[Figure]) -> Baseline {
    let mut widened = kept.clone();
    widened.commit.clone_from(&run.commit);
    widened.runs = kept.runs + run.runs;
    widened.figures.retain(|name, then| still_held(name, then, figures));
    for (name, now) in &run.figures {
        let higher_is_better = figures.iter().any(|f| &f.name == name && f.higher_is_better);
        let worse = |a: f64, b: f64| if higher_is_better { a.min(b) } else { a.max(b) };
        let merged = match kept.figures.get(name) {
            Some(then) => Kept {
                unit: now.unit.clone(),
                median: worse(then.median, now.median),
                ratio: then.ratio.zip(now.ratio).map(|(a, b)| a.max(b)).or(now.ratio),
            },
            None => now.clone(),
        };
        widened.figures.insert(name.clone(), merged);
    }
    widened
}

/// Makes `baseline` the one of `mode`, keeping the other modes'.
pub(super) fn save(mode: &str, baseline: &Baseline) -> Result<PathBuf> {
    let path = path()?;
    let mut all = if path.exists() { load_all()? } else { Baselines::new() };
    all.insert(mode.to_owned(), baseline.clone());
    fs::write(&path, serde_json::to_string_pretty(&all)? + "\n")?;
    Ok(path)
}

/// `new`, the baseline to replace `replaced` (where there is one), as it may be written, with the
/// figures it lets be worse ([`loosened`]): refused, naming each, where there are some and no
/// `reason` says why; `reason` is recorded in it, after the reasons a widened baseline kept.
pub(super) fn vetted(
    replaced: Option<&Baseline>,
    mut new: Baseline,
    reason: Option<&str>,
    figures: &[Figure],
) -> Result<(Baseline, Vec<String>)> {
    let worse = replaced.map(|old| loosened(old, &new, figures)).unwrap_or_default();
    match reason {
        // A widened baseline keeps the reasons given for the runs it already held.
        Some(reason) if new.reason.is_empty() => reason.clone_into(&mut new.reason),
        Some(reason) => new.reason = format!("{}; then {reason}", new.reason),
        None if worse.is_empty() => {}
        None => bail!(
            "not written: the new baseline lets {} gated figure(s) be worse than the one it replaces; say why with \
             --reason \"...\" to write it anyway:\n  {}",
            worse.len(),
            worse.join("\n  ")
        ),
    }
    Ok((new, worse))
}

/// Every figure `old` held that `new` holds worse (a higher ratio, a worse count) or no longer
/// holds, as a sentence; `figures` are the run's, which say how each is held. The nominal counts
/// are held to their nominal, whatever the baseline keeps of them.
fn loosened(old: &Baseline, new: &Baseline, figures: &[Figure]) -> Vec<String> {
    let mut found = Vec::new();
    for (name, then) in &old.figures {
        let figure = figures.iter().find(|f| &f.name == name);
        if !still_held(name, then, figures) {
            continue;
        }
        let Some(now) = new.figures.get(name) else {
            found.push(format!("{name}: held by the baseline it replaces, not by the new one"));
            continue;
        };
        if figure.is_some_and(|f| matches!(f.gate(), Gate::Nominal(_))) {
            continue;
        }
        let higher_is_better = figure.is_some_and(|f| f.higher_is_better);
        match (then.ratio, now.ratio) {
            (Some(a), Some(b)) if b > a => found.push(format!("{name}: {b:.3}× the floor, was {a:.3}×")),
            (Some(_), Some(_)) => {}
            (Some(_), None) => found.push(format!("{name}: no longer held by its ratio to a floor")),
            (None, _) => {
                let (a, b) = (then.median, now.median);
                if (higher_is_better && b < a) || (!higher_is_better && b > a) {
                    found.push(format!("{name}: {}, was {}", with_unit(b, &now.unit), number(a)));
                }
            }
        }
    }
    found
}

/// The measuring noise of a count's unit: a change smaller than this is no regression, whatever
/// its share.
fn noise(unit: &str) -> f64 {
    match unit {
        "/min" => 3.0,
        "/s" => 5.0,
        _ => 2.0,
    }
}

/// Ratios to a floor move by this much between runs of the same build.
const RATIO_NOISE: f64 = 0.05;

/// The bound `baseline` holds `figure` to: its ratio at most this, or its median (a count) at
/// most this, or at least this where more is better; `None` where it does not hold it.
pub(super) fn bound(baseline: &Baseline, figure: &Figure) -> Option<f64> {
    let kept = baseline.figures.get(&figure.name)?;
    match figure.gate() {
        Gate::Ratio => kept.ratio.map(|then| then * TOLERANCE + RATIO_NOISE),
        Gate::Count if figure.higher_is_better => Some(kept.median / TOLERANCE - noise(figure.unit)),
        Gate::Count => Some(kept.median * TOLERANCE + noise(figure.unit)),
        Gate::Reported | Gate::Nominal(_) => None,
    }
}

/// `v` and its unit, if it has one.
fn with_unit(v: f64, unit: &str) -> String {
    if unit.is_empty() { number(v) } else { format!("{} {unit}", number(v)) }
}

/// The regressions of a second run, `again`, of figures that had regressed in the first one,
/// `first`: those a change of the agent made, where the machine's noise seldom hits the same
/// figure twice.
pub(super) fn confirmed(first: &[(String, String)], again: Vec<(String, String)>) -> Vec<String> {
    again.into_iter().filter(|(name, _)| first.iter().any(|(then, _)| then == name)).map(|(_, s)| s).collect()
}

/// Every figure `baseline` holds that regressed in `figures`, or that is not a number there, or
/// that is missing from them (unless its name starts with one of `left_out`, the phases the run
/// did not set out to measure): its name, and a sentence that says how. Figures the baseline
/// does not hold (a new one, a reported one) pass; the nominal counts are held elsewhere
/// ([`Figure::nominal_missed`]).
pub(super) fn regressed(baseline: &Baseline, figures: &[Figure], left_out: &[&str]) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for figure in figures {
        let Some(kept) = baseline.figures.get(&figure.name) else { continue };
        let name = &figure.name;
        let how = match figure.gate() {
            Gate::Reported | Gate::Nominal(_) => None,
            Gate::Ratio => {
                let now = figure.ratio().unwrap_or(f64::NAN);
                match (kept.ratio, bound(baseline, figure)) {
                    _ if !now.is_finite() => Some(format!(
                        "{name}: its ratio to its floor is not a number (median {}, floor {})",
                        number(figure.stat.median),
                        figure.floor.map_or_else(|| "none".to_owned(), number)
                    )),
                    (Some(then), Some(bound)) if now > bound => {
                        Some(format!("{name}: {now:.2}× the floor, was {then:.2}× (at most {bound:.2}×)"))
                    }
                    _ => None,
                }
            }
            Gate::Count => {
                let (now, then) = (figure.stat.median, kept.median);
                let worse = match bound(baseline, figure) {
                    Some(bound) if figure.higher_is_better => now < bound,
                    Some(bound) => now > bound,
                    None => false,
                };
                if !now.is_finite() {
                    Some(format!("{name}: its median is not a number"))
                } else if worse {
                    Some(format!("{name}: {}, was {}", with_unit(now, figure.unit), number(then)))
                } else {
                    None
                }
            }
        };
        found.extend(how.map(|how| (name.clone(), how)));
    }
    for (name, kept) in &baseline.figures {
        let measured = figures.iter().any(|f| &f.name == name);
        if !measured && held(kept) && !left_out.iter().any(|phase| name.starts_with(phase)) {
            found.push((name.clone(), format!("{name}: held by the baseline, not measured in this run")));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Target;

    /// The sentences of [`regressed`], for a run that left nothing out.
    fn regressions(baseline: &Baseline, figures: &[Figure]) -> Vec<String> {
        regressed(baseline, figures, &[]).into_iter().map(|(_, sentence)| sentence).collect()
    }

    #[test]
    fn a_time_a_size_or_a_cpu_cost_with_no_floor_is_reported_however_much_worse() {
        let then = [
            Figure::new("hollow start", "s", &[1.37]).target(Target::AtMost(5.0)),
            Figure::new("relist", "ms", &[6.0]),
            Figure::new("idle CPU", "s/min", &[0.08]),
            Figure::new("CPU per pod", "ms/min", &[0.6]),
            Figure::new("memory", "MiB", &[51.0]),
            Figure::new("memory per pod", "KiB", &[72.0]),
        ];
        let baseline = of(&then, "abc");
        assert!(baseline.figures.is_empty(), "none is kept: {:?}", baseline.figures);
        // The baseline file of before keeps them; they are not held, missing or three times worse.
        let mut old = baseline.clone();
        for f in &then {
            old.figures.insert(f.name.clone(), Kept { unit: f.unit.to_owned(), median: f.stat.median, ratio: None });
        }
        let slower: Vec<Figure> =
            then.iter().map(|f| Figure::new(f.name.clone(), f.unit, &[3.0 * f.stat.median])).collect();
        assert!(regressions(&old, &slower).is_empty());
        assert!(regressions(&old, &[]).is_empty());
        assert!(slower.iter().all(|f| f.gate_text(Some(&old)) == "reported"));
    }

    #[test]
    fn a_figure_with_a_floor_is_held_by_its_ratio() {
        let baseline = of(&[Figure::new("start-up", "s", &[0.30]).floor(0.25)], "abc");
        assert_eq!(baseline.figures["start-up"].ratio, Some(1.2));
        // 1.2× → 1.6× the floor, though the time itself went down (the floor went faster).
        let worse = [Figure::new("start-up", "s", &[0.24]).floor(0.15)];
        assert_eq!(regressions(&baseline, &worse), ["start-up: 1.60× the floor, was 1.20× (at most 1.49×)"]);
        // Three times slower on a machine three times slower: the same ratio.
        let slower_machine = [Figure::new("start-up", "s", &[0.90]).floor(0.75)];
        assert!(regressions(&baseline, &slower_machine).is_empty());
        // Within a fifth and the ratio's noise: 1.2 × 1.2 + 0.05.
        let within = [Figure::new("start-up", "s", &[0.296]).floor(0.2)];
        assert!(regressions(&baseline, &within).is_empty());
        assert_eq!(within[0].gate_text(Some(&baseline)), "≤ 1.49× floor");
    }

    #[test]
    fn a_cluster_start_up_is_held_by_its_ratio_to_the_standalone_one() {
        let name = "cluster, 10 API pods: created → all Running in the API (floor: the standalone start-up)";
        let baseline = of(&[Figure::new(name, "s", &[1.25]).floor(1.10)], "abc");
        // The same time against a standalone start-up a third faster: 1.14× → 1.55×.
        let faster_floor = [Figure::new(name, "s", &[1.21]).floor(0.78)];
        assert_eq!(regressions(&baseline, &faster_floor).len(), 1);
        // Slower itself, as the standalone start-up: the same ratio.
        let slower = [Figure::new(name, "s", &[1.60]).floor(1.41)];
        assert!(regressions(&baseline, &slower).is_empty());
    }

    #[test]
    fn a_count_is_held_by_its_median() {
        let run = |threads: f64, relists: f64| {
            [Figure::new("threads", "", &[threads]), Figure::new("relists", "/min", &[relists])]
        };
        let baseline = of(&run(6.0, 0.0), "abc");
        assert_eq!(baseline.figures.len(), 2);
        // 6 × 1.2 + 2 threads at most, 0 × 1.2 + 3 relists a minute.
        assert!(regressions(&baseline, &run(9.0, 3.0)).is_empty());
        assert_eq!(
            regressions(&baseline, &run(10.0, 6.0)),
            ["threads: 10.0, was 6.00", "relists: 6.00 /min, was 0.000"]
        );
        assert_eq!(run(9.0, 0.0)[0].gate_text(Some(&baseline)), "≤ 9.20");
        // Fewer is worse where more is better.
        let started = of(&[Figure::new("started", "", &[50.0]).higher_is_better()], "abc");
        assert_eq!(regressions(&started, &[Figure::new("started", "", &[30.0]).higher_is_better()]).len(), 1);
        assert_eq!(Figure::new("started", "", &[50.0]).higher_is_better().gate_text(Some(&started)), "≥ 39.7");
    }

    #[test]
    fn a_held_figure_missing_from_the_run_or_not_a_number_fails() {
        let baseline = of(
            &[
                Figure::new("start-up", "s", &[0.30]).floor(0.25),
                Figure::new("threads", "", &[6.0]),
                Figure::new("cluster, 1 API pod", "s", &[0.3]).floor(0.12),
                Figure::new("floor", "s", &[0.25]).unchecked(),
            ],
            "abc",
        );
        let missing = regressed(&baseline, &[Figure::new("new figure", "", &[3.0])], &[]);
        let names: Vec<&str> = missing.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["cluster, 1 API pod", "start-up", "threads"], "the new figure passes");
        assert_eq!(missing[1].1, "start-up: held by the baseline, not measured in this run");
        // A phase the run did not set out to measure (cluster mode, where no kube-apiserver is named).
        let left_out = regressed(&baseline, &[Figure::new("start-up", "s", &[0.3]).floor(0.25)], &["cluster, "]);
        assert_eq!(left_out.len(), 1, "{left_out:?}");
        assert_eq!(left_out[0].0, "threads");

        // Its floor not measured, its runs all failed: not a number.
        let nan = [
            Figure::new("start-up", "s", &[0.30]).floor(f64::NAN),
            Figure::new("threads", "", &[]),
            Figure::new("cluster, 1 API pod", "s", &[]).floor(0.12),
        ];
        assert_eq!(
            regressions(&baseline, &nan),
            [
                "start-up: its ratio to its floor is not a number (median 0.300, floor n/a)",
                "threads: its median is not a number",
                "cluster, 1 API pod: its ratio to its floor is not a number (median n/a, floor 0.120)",
            ]
        );
        // A new figure that is not a number is not held.
        assert!(
            regressions(&baseline, &[Figure::new("new", "s", &[]).floor(0.1)]).iter().all(|s| !s.starts_with("new"))
        );
    }

    #[test]
    fn an_entry_no_longer_held_is_ignored_and_dropped_when_saved_again() {
        let mut old = of(&[Figure::new("start-up", "s", &[0.30]).floor(0.25)], "abc");
        old.figures.insert("hollow start".to_owned(), Kept { unit: "s".to_owned(), median: 1.37, ratio: None });
        old.figures.insert("deletion".to_owned(), Kept { unit: "s".to_owned(), median: 1.0, ratio: Some(1.1) });
        let figures = [
            Figure::new("start-up", "s", &[0.30]).floor(0.25),
            Figure::new("hollow start", "s", &[4.0]),
            Figure::new("deletion", "s", &[9.0]).floor(1.0).unchecked(),
        ];
        assert!(regressions(&old, &figures).is_empty());
        let widened = widen(&old, &of(&figures, "def"), &figures);
        assert_eq!(widened.figures.keys().collect::<Vec<_>>(), ["start-up"]);
    }

    #[test]
    fn a_regression_is_confirmed_only_by_the_same_figure_regressing_again() {
        let figure = |name: &str, ratio: f64| Figure::new(name, "s", &[ratio]).floor(1.0);
        let baseline = of(&[figure("a", 1.0), figure("b", 1.0)], "abc");
        let first = regressed(&baseline, &[figure("a", 2.0), figure("b", 1.0)], &[]);
        assert_eq!(first.len(), 1);
        // Only "b" regressed the second time: noise, both times.
        let again = regressed(&baseline, &[figure("a", 1.1), figure("b", 2.0)], &[]);
        assert!(confirmed(&first, again).is_empty());
        // "a" again: a regression.
        let again = regressed(&baseline, &[figure("a", 1.9), figure("b", 1.0)], &[]);
        assert_eq!(confirmed(&first, again), ["a: 1.90× the floor, was 1.00× (at most 1.25×)"]);
    }

    #[test]
    fn widening_keeps_the_worse_of_each_figure() {
        let first = [
            Figure::new("start-up", "s", &[0.30]).floor(0.25),
            Figure::new("threads", "", &[5.0, 6.0]),
            Figure::new("started", "", &[50.0]).higher_is_better(),
            Figure::new("only first", "", &[1.0]),
        ];
        let second = [
            Figure::new("start-up", "s", &[0.28]).floor(0.20),
            Figure::new("threads", "", &[5.0]),
            Figure::new("started", "", &[48.0]).higher_is_better(),
            Figure::new("only second", "", &[2.0]),
        ];
        let widened = widen(&of(&first, "abc"), &of(&second, "def"), &second);
        assert_eq!((widened.commit.as_str(), widened.runs), ("def", 2));
        let start_up = &widened.figures["start-up"];
        assert_eq!(start_up.median, 0.30, "the slower time");
        assert!((start_up.ratio.unwrap() - 1.4).abs() < 1e-9, "the higher ratio: {:?}", start_up.ratio);
        assert_eq!(widened.figures["threads"].median, 5.5, "the higher median");
        assert_eq!(widened.figures["started"].median, 48.0, "fewer started is worse");
        assert!(widened.figures.contains_key("only first") && widened.figures.contains_key("only second"));
    }

    #[test]
    fn a_baseline_that_lets_a_held_figure_be_worse_needs_a_reason() {
        let figures = |ratio: f64, threads: f64| {
            [
                Figure::new("start-up", "s", &[ratio]).floor(1.0),
                Figure::new("threads", "", &[threads]),
                Figure::new("Ready", "", &[49.0]).exactly(50),
                Figure::new("hollow start", "s", &[ratio * 3.0]),
            ]
        };
        let old = of(&figures(1.2, 6.0), "abc");
        // As good or better: written, with no reason.
        let better = figures(1.1, 6.0);
        let (new, worse) = vetted(Some(&old), of(&better, "def"), None, &better).unwrap();
        assert!(worse.is_empty() && new.reason.is_empty());
        // A higher ratio and more threads (Ready is held to its nominal, the time not at all).
        let worse_run = figures(1.3, 7.0);
        let refused = vetted(Some(&old), of(&worse_run, "def"), None, &worse_run).unwrap_err().to_string();
        assert!(refused.contains("start-up: 1.300× the floor, was 1.200×"), "{refused}");
        assert!(refused.contains("threads: 7.00, was 6.00"), "{refused}");
        assert!(!refused.contains("Ready") && !refused.contains("hollow"), "{refused}");
        // Widened, the same.
        let widened = widen(&old, &of(&worse_run, "def"), &worse_run);
        assert!(vetted(Some(&old), widened.clone(), None, &worse_run).is_err());
        // A held figure gone from the new baseline.
        let without: Vec<Figure> = worse_run.iter().filter(|f| f.name != "threads").cloned().collect();
        let refused = vetted(Some(&old), of(&without, "def"), None, &without).unwrap_err().to_string();
        assert!(refused.contains("threads: held by the baseline it replaces, not by the new one"), "{refused}");
        // With a reason: written, and the reason with it.
        let (new, worse) = vetted(Some(&old), widened, Some("a slower kernel"), &worse_run).unwrap();
        assert_eq!((new.reason.as_str(), worse.len()), ("a slower kernel", 2));
        let text = serde_json::to_string(&new).unwrap();
        assert!(text.contains(r#""reason":"a slower kernel""#), "{text}");
        // Widened again: the reasons given for the runs it holds are kept.
        let again = widen(&new, &of(&worse_run, "ghi"), &worse_run);
        let (again, _) = vetted(Some(&new), again, Some("another run"), &worse_run).unwrap();
        assert_eq!(again.reason, "a slower kernel; then another run");
        // No baseline to replace: nothing to be worse than.
        assert!(vetted(None, of(&worse_run, "def"), None, &worse_run).is_ok());
    }

    #[test]
    fn the_baseline_reads_back() {
        let baseline = of(&[Figure::new("a", "s", &[1.0]).floor(0.5)], "abc");
        let text = serde_json::to_string(&baseline).unwrap();
        assert!(!text.contains("reason"), "no reason, no field: {text}");
        let read: Baseline = serde_json::from_str(&text).unwrap();
        assert_eq!(read.figures, baseline.figures);
        // A file of before: no reason, a CPU figure's least window.
        let old =
            r#"{"commit": "c", "runs": 2, "figures": {"idle CPU": {"unit": "s/min", "median": 0.1, "min": 0.08}}}"#;
        let read: Baseline = serde_json::from_str(old).unwrap();
        assert_eq!((read.reason.as_str(), read.figures["idle CPU"].median), ("", 0.1));
    }
}
