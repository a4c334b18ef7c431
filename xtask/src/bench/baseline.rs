//! `cargo xtask bench --check`: the run's figures against the baseline kept in the repository
//! (`xtask/bench-baseline.json`, written by `--save-baseline`), each regression named. The file
//! holds two sets: `full` (the `dist` build, every figure) and `quick` (the tests' `dev` build,
//! which CI checks), each held only to its own.
//!
//! A figure with a floor is held by its ratio to the floor, which the machine's speed moves
//! less than the time itself; the others by their median, and so are those whose floor is the
//! agent's own figure (cluster mode's start-ups, held to the standalone ones). A regression is a
//! figure more than 20 % worse than its baseline (the criterion figures, which have no floor:
//! two and a half times) and also worse by more than its unit's
//! measuring noise (an idle CPU of 0.02 s/min moves by more than 20 % between two runs of the
//! same build). The runtime's own figures (the floor, its ExecSync) are not checked: no change
//! here moves them.
//!
//! A run with regressions is measured again, and only a figure that regresses in both runs fails
//! it ([`confirmed`]): on a shared machine, a phase in which everything ran two to three times
//! slower, the runtime's own calls too, moved some figures past the check's 20 % where their
//! floors did not move alike; a change of the agent shows in every run.
//!
//! CPU figures (s/min, ms/min) are held by their least window, not their median: what else the
//! machine does only adds CPU time to a window, and a periodic burst (a resync, housekeeping)
//! falls into some windows and not others. Between two machines of CI's kind, the same build's
//! median of the hollow node's idle CPU moved by 40 %, its least window by 5 %.

use std::{collections::BTreeMap, fs, path::PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::Figure;
use crate::util::project_root;

/// How much worse than its baseline a figure may get, unless it says otherwise
/// (`Figure::tolerance`).
pub(super) const TOLERANCE: f64 = 1.2;

/// What the baseline keeps of a figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Kept {
    pub(super) unit: String,
    pub(super) median: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ratio: Option<f64>,
    /// The least sample, kept for the CPU figures ([`held_by_least`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) min: Option<f64>,
}

/// The baseline: the figures of one run, or the worst of a few runs of one build, by name.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Baseline {
    pub(super) commit: String,
    /// The runs it holds the worst of ([`widen`]).
    #[serde(default = "one_run")]
    pub(super) runs: u32,
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

/// The baseline of `figures`, the checked ones with a median.
pub(super) fn of(figures: &[Figure], commit: &str) -> Baseline {
    let kept = figures.iter().filter(|f| f.checked && f.stat.median.is_finite()).map(|f| {
        let min = held_by_least(f.unit).then_some(f.stat.min);
        (f.name.clone(), Kept { unit: f.unit.to_owned(), median: f.stat.median, ratio: f.ratio(), min })
    });
    Baseline { commit: commit.to_owned(), runs: 1, figures: kept.collect() }
}

/// `kept` widened by `run`, a run of the same build whose figures are `figures`: each figure the
/// worse of the two (its median, ratio and least window alike), so the baseline covers the
/// spread between runs rather than one run's luck. A figure only one of them has is kept as it
/// is.
pub(super) fn widen(kept: &Baseline, run: &Baseline, figures: &[Figure]) -> Baseline {
    let mut widened = kept.clone();
    widened.commit.clone_from(&run.commit);
    widened.runs = kept.runs + run.runs;
    for (name, now) in &run.figures {
        let higher_is_better = figures.iter().any(|f| &f.name == name && f.higher_is_better);
        let worse = |a: f64, b: f64| if higher_is_better { a.min(b) } else { a.max(b) };
        let merged = match kept.figures.get(name) {
            Some(then) => Kept {
                unit: now.unit.clone(),
                median: worse(then.median, now.median),
                ratio: then.ratio.zip(now.ratio).map(|(a, b)| a.max(b)).or(now.ratio),
                min: then.min.zip(now.min).map(|(a, b)| worse(a, b)).or(now.min),
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

/// The measuring noise of a unit: a change smaller than this is no regression, whatever its
/// share.
fn noise(unit: &str) -> f64 {
    match unit {
        "s" => 0.02,
        "ms" => 0.5,
        "s/min" => 0.05,
        "ms/min" => 0.05,
        "MiB" => 1.0,
        "KiB" => 2.0,
        "/min" => 3.0,
        "/s" => 5.0,
        _ => 2.0,
    }
}

/// Whether figures of `unit` are held by their least sample: the CPU figures.
fn held_by_least(unit: &str) -> bool {
    matches!(unit, "s/min" | "ms/min")
}

/// Ratios to a floor move by this much between runs of the same build.
const RATIO_NOISE: f64 = 0.05;

/// The regressions of a second run, `again`, of figures that had regressed in the first one,
/// `first`: those a change of the agent made, where the machine's noise seldom hits the same
/// figure twice.
pub(super) fn confirmed(first: &[(String, String)], again: Vec<(String, String)>) -> Vec<String> {
    again.into_iter().filter(|(name, _)| first.iter().any(|(then, _)| then == name)).map(|(_, s)| s).collect()
}

/// Every checked figure of `figures` that regressed against `baseline`: its name, and a sentence
/// that says how. Figures the baseline does not have (a new one, or one a quick run leaves out)
/// pass.
pub(super) fn regressed(baseline: &Baseline, figures: &[Figure]) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for figure in figures.iter().filter(|f| f.checked) {
        let Some(kept) = baseline.figures.get(&figure.name) else { continue };
        if let (Some(now), Some(then), false) = (figure.ratio(), kept.ratio, figure.held_by_median) {
            if now > then * figure.tolerance + RATIO_NOISE {
                found.push((figure.name.clone(), format!("{}: {now:.2}× the floor, was {then:.2}×", figure.name)));
            }
            continue;
        }
        let (now, then, which) = match kept.min {
            Some(min) if held_by_least(&kept.unit) => (figure.stat.min, min, "least window"),
            _ => (figure.stat.median, kept.median, "median"),
        };
        let noise = noise(&kept.unit);
        let worse = if figure.higher_is_better {
            now < then / figure.tolerance - noise
        } else {
            now > then * figure.tolerance + noise
        };
        if worse {
            let sentence = format!("{}: {now:.3} {}, was {then:.3} ({which})", figure.name, kept.unit);
            found.push((figure.name.clone(), sentence));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Target;

    /// The sentences of [`regressed`].
    fn regressions(baseline: &Baseline, figures: &[Figure]) -> Vec<String> {
        regressed(baseline, figures).into_iter().map(|(_, sentence)| sentence).collect()
    }

    #[test]
    fn a_figure_more_than_a_fifth_and_its_noise_worse_regresses() {
        let then = [
            Figure::new("start-up", "s", &[0.30]).floor(0.25).target(Target::AtMost(1.0)),
            Figure::new("memory", "MiB", &[14.0]),
            Figure::new("idle CPU", "s/min", &[0.02]),
            Figure::new("probes", "/s", &[200.0]).higher_is_better(),
            Figure::new("floor", "s", &[0.25]).unchecked(),
        ];
        let baseline = of(&then, "abc");
        assert!(!baseline.figures.contains_key("floor"), "the runtime's own figures are not kept");
        assert!(regressions(&baseline, &then).is_empty());

        let now = [
            // 1.2× → 1.6× the floor (the floor itself went faster: the time alone would pass).
            Figure::new("start-up", "s", &[0.32]).floor(0.20),
            // +20 % and 0.5 MiB: within.
            Figure::new("memory", "MiB", &[17.3]),
            // Three times 0.02 s/min, but only 0.04 s/min more: noise.
            Figure::new("idle CPU", "s/min", &[0.06]),
            // Fewer probes a second is worse.
            Figure::new("probes", "/s", &[150.0]).higher_is_better(),
            Figure::new("floor", "s", &[9.0]).unchecked(),
            Figure::new("new figure", "s", &[9.0]),
        ];
        let found = regressions(&baseline, &now);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("start-up: 1.60× the floor, was 1.20×"), "{found:?}");
        assert!(found[1].starts_with("probes: 150.000 /s, was 200.000 (median)"), "{found:?}");

        let now = [Figure::new("memory", "MiB", &[18.0])];
        assert_eq!(regressions(&baseline, &now), ["memory: 18.000 MiB, was 14.000 (median)"]);
    }

    #[test]
    fn a_figure_with_a_wider_tolerance_regresses_only_past_it() {
        let baseline = of(&[Figure::new("criterion", "ms", &[29.0])], "abc");
        let within = [Figure::new("criterion", "ms", &[71.0]).tolerance(2.5)];
        assert!(regressions(&baseline, &within).is_empty());
        let past = [Figure::new("criterion", "ms", &[73.5]).tolerance(2.5)];
        assert_eq!(regressions(&baseline, &past), ["criterion: 73.500 ms, was 29.000 (median)"]);
        let held_to_a_fifth = [Figure::new("criterion", "ms", &[36.0])];
        assert_eq!(regressions(&baseline, &held_to_a_fifth).len(), 1);
    }

    #[test]
    fn a_regression_is_confirmed_only_by_the_same_figure_regressing_again() {
        let baseline = of(&[Figure::new("a", "s", &[1.0]), Figure::new("b", "s", &[1.0])], "abc");
        let first = regressed(&baseline, &[Figure::new("a", "s", &[2.0]), Figure::new("b", "s", &[1.0])]);
        assert_eq!(first.len(), 1);
        // Only "b" regressed the second time: noise, both times.
        let again = regressed(&baseline, &[Figure::new("a", "s", &[1.1]), Figure::new("b", "s", &[2.0])]);
        assert!(confirmed(&first, again).is_empty());
        // "a" again: a regression.
        let again = regressed(&baseline, &[Figure::new("a", "s", &[1.9]), Figure::new("b", "s", &[1.0])]);
        assert_eq!(confirmed(&first, again), ["a: 1.900 s, was 1.000 (median)"]);
    }

    #[test]
    fn a_figure_held_by_its_median_ignores_its_floor_moving() {
        let baseline = of(&[Figure::new("cluster", "s", &[1.25]).floor(1.10).held_by_median()], "abc");
        // The same time against a standalone start-up a third faster: 1.14× → 1.56×, as before.
        let faster_floor = [Figure::new("cluster", "s", &[1.21]).floor(0.78).held_by_median()];
        assert!(regressions(&baseline, &faster_floor).is_empty());
        // Slower itself, whatever the floor did.
        let slower = [Figure::new("cluster", "s", &[1.60]).floor(1.60).held_by_median()];
        assert_eq!(regressions(&baseline, &slower), ["cluster: 1.600 s, was 1.250 (median)"]);
    }

    #[test]
    fn cpu_figures_are_held_by_their_least_window() {
        let baseline = of(&[Figure::new("idle CPU", "s/min", &[0.30, 0.35, 0.60])], "abc");
        assert_eq!(baseline.figures["idle CPU"].min, Some(0.30));

        // The median doubled with a burst in two windows; the least window held.
        let bursty = [Figure::new("idle CPU", "s/min", &[0.31, 0.70, 0.75])];
        assert!(regressions(&baseline, &bursty).is_empty());

        // Every window costs more: a regression.
        let worse = [Figure::new("idle CPU", "s/min", &[0.50, 0.52, 0.55])];
        assert_eq!(regressions(&baseline, &worse), ["idle CPU: 0.500 s/min, was 0.300 (least window)"]);

        // A baseline from before the least window was kept holds the median.
        let mut old = baseline.clone();
        old.figures.get_mut("idle CPU").unwrap().min = None;
        assert_eq!(regressions(&old, &bursty), ["idle CPU: 0.700 s/min, was 0.350 (median)"]);
    }

    #[test]
    fn widening_keeps_the_worse_of_each_figure() {
        let first = [
            Figure::new("start-up", "s", &[0.30]).floor(0.25),
            Figure::new("idle CPU", "s/min", &[0.30, 0.40]),
            Figure::new("probes", "/s", &[200.0]).higher_is_better(),
            Figure::new("only first", "s", &[1.0]),
        ];
        let second = [
            Figure::new("start-up", "s", &[0.28]).floor(0.20),
            Figure::new("idle CPU", "s/min", &[0.35, 0.36]),
            Figure::new("probes", "/s", &[180.0]).higher_is_better(),
            Figure::new("only second", "s", &[2.0]),
        ];
        let widened = widen(&of(&first, "abc"), &of(&second, "def"), &second);
        assert_eq!((widened.commit.as_str(), widened.runs), ("def", 2));
        let start_up = &widened.figures["start-up"];
        assert_eq!(start_up.median, 0.30, "the slower time");
        assert!((start_up.ratio.unwrap() - 1.4).abs() < 1e-9, "the higher ratio: {:?}", start_up.ratio);
        let idle = &widened.figures["idle CPU"];
        assert_eq!((idle.median, idle.min), (0.355, Some(0.35)), "the higher median and least window");
        assert_eq!(widened.figures["probes"].median, 180.0, "fewer probes a second is worse");
        assert!(widened.figures.contains_key("only first") && widened.figures.contains_key("only second"));
    }

    #[test]
    fn the_baseline_reads_back() {
        let baseline = of(&[Figure::new("a", "s", &[1.0]).floor(0.5)], "abc");
        let text = serde_json::to_string(&baseline).unwrap();
        let read: Baseline = serde_json::from_str(&text).unwrap();
        assert_eq!(read.figures, baseline.figures);
    }
}
