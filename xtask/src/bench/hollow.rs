//! The hollow node: the agent on its in-memory runtime (`fake://`) with 1,000 or 10,000 static
//! pods, so what a pod costs the agent itself is known, apart from any runtime's.
//!
//! A fresh agent per pod count: idle windows with no pod, the manifests written and timed until
//! every pod is Running in `/pods`, then idle windows with them all. The cost per pod is the
//! difference between the two idle figures, divided by the pods. The start-up is timed again
//! on more fresh agents, as often as the other start-ups, so one slow run is not the figure.

use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

use super::{Figure, Options, Stat, Target, idle_windows, keep_log, logs_dir, progress};
use crate::{
    harness::{self, Agent, write_manifest},
    util::SmallFilesystems,
};

/// The hollow node's figures at one pod count.
#[derive(Debug)]
pub(super) struct Hollow {
    pods: usize,
    /// Manifests written → all Running in `/pods`, seconds, one sample per fresh agent.
    running: Vec<f64>,
    /// Idle CPU per pod, milliseconds per minute.
    cpu_per_pod: Vec<f64>,
    /// Resident memory per pod, KiB.
    rss_per_pod: Vec<f64>,
    /// Threads with every pod running.
    threads: Vec<f64>,
}

/// The size of the tmpfs a hollow node runs on, a bound and not memory taken: 1,000 pods'
/// directories, manifests and the agent's log took 4 MiB.
const FILESYSTEM_SIZE: &str = "1g";

/// Runs a hollow node of `pods` pods in `dir` and measures it: `options.repeat` start-ups, each
/// on a fresh agent, and the idle figures of the first.
///
/// Each agent runs on a tmpfs of its own. On the host's disk, the agent's writes for each pod
/// (its directories) and the manifests' made the figure the disk's: 1,000 pods took 1.0-1.3 s
/// on a tmpfs and 1.3-2.6 s on this machine's disk, one build alike, where CI's check then
/// allowed 20 %.
pub(super) fn measure(binary: &Path, dir: &Path, pods: usize, options: &Options) -> Result<Hollow> {
    let _ = fs::remove_dir_all(dir);
    let mut running = Vec::new();

    let (empty, full) = on_own_filesystem(dir, pods, || {
        let mut agent = start(binary, dir, pods)?;
        progress(&format!("hollow node, 0 pods: {} windows of {:?}", options.windows, options.window));
        let empty = idle_windows(&agent, options)?;
        progress(&format!("hollow node, {pods} pods: manifests written → all Running, run 1 of {}", options.repeat));
        running.push(start_pods(&mut agent, pods)?);
        progress(&format!("hollow node, {pods} pods: {} windows of {:?}", options.windows, options.window));
        std::thread::sleep(Duration::from_secs(10));
        let full = idle_windows(&agent, options)?;
        agent.stop(Duration::from_secs(60))?;
        Ok((empty, full))
    })?;
    for round in 2..=options.repeat {
        progress(&format!(
            "hollow node, {pods} pods: manifests written → all Running, run {round} of {}",
            options.repeat
        ));
        on_own_filesystem(dir, pods, || {
            let mut agent = start(binary, dir, pods)?;
            running.push(start_pods(&mut agent, pods)?);
            agent.stop(Duration::from_secs(60))
        })?;
    }
    let _ = fs::remove_dir_all(dir);

    let per_pod = |with: &[f64], without: &[f64], scale: f64| -> Vec<f64> {
        let base = Stat::of(without).median;
        with.iter().map(|v| (v - base) * scale / pods as f64).collect()
    };
    Ok(Hollow {
        pods,
        running,
        cpu_per_pod: per_pod(&full.cpu, &empty.cpu, 1000.0),
        rss_per_pod: per_pod(&full.rss, &empty.rss, 1024.0),
        threads: full.threads,
    })
}

/// Runs `body` with a tmpfs of its own mounted on `dir`, and keeps the log of the agent it ran
/// there as `target/bench/logs/hollow-{pods}.log` before the tmpfs goes.
fn on_own_filesystem<T>(dir: &Path, pods: usize, body: impl FnOnce() -> Result<T>) -> Result<T> {
    let _mounted = SmallFilesystems::mount(&[dir.to_owned()], FILESYSTEM_SIZE)?;
    let result = body();
    keep_log(&dir.join("agent.log"), &format!("hollow-{pods}"))?;
    result
}

/// A fresh agent on `fake://` in `dir`, room for `pods` and more, healthy.
fn start(binary: &Path, dir: &Path, pods: usize) -> Result<Agent> {
    let max_pods = (pods * 2).to_string();
    let mut agent = Agent::start_on("fake://", binary, dir, &["--max-pods", &max_pods])?;
    agent.wait_healthy(Duration::from_secs(30))?;
    Ok(agent)
}

/// Writes `pods` manifests into the agent's manifest path and times them until all are Running.
fn start_pods(agent: &mut Agent, pods: usize) -> Result<f64> {
    let manifests = agent.dir.join("manifests");
    let (_, started_before) = agent.metric_sum_count(POD_STARTS)?;
    let started = Instant::now();
    for i in 0..pods {
        let name = format!("hollow-{i}");
        write_manifest(&manifests, &name, &harness::manifest(&name))?;
    }
    wait_running(agent, pods, started, started_before)
}

/// The agent's histogram of pods first seen → Running (upstream's), observed once for each pod
/// as its status turns Running.
const POD_STARTS: &str = "kubelet_pod_start_duration_seconds";

/// Seconds from `started` until `pods` pods are Running: until the agent's [`POD_STARTS`] has
/// counted `pods` more than `counted_before`, then confirmed in `/pods`. The metric is polled
/// every 20 ms: `/metrics` is the same size with 10 or 10,000 pods, where `/pods` grows with
/// them (polled every 100 ms, it slowed 1,000 pods from 0.55 s to 0.94 s).
fn wait_running(agent: &mut Agent, pods: usize, started: Instant, counted_before: f64) -> Result<f64> {
    let limit = Duration::from_secs(300);
    loop {
        let (_, counted) = agent.metric_sum_count(POD_STARTS)?;
        if counted - counted_before >= pods as f64 {
            let took = started.elapsed().as_secs_f64();
            if agent.running() >= pods {
                return Ok(took);
            }
        }
        if !agent.alive() {
            bail!("the hollow agent exited; see {}", agent.dir.join("agent.log").display());
        }
        if started.elapsed() > limit {
            let kept = keep_answers(agent, pods);
            bail!(
                "{pods} hollow pods were not all Running in /pods within {limit:?}: the start metric counted {} \
                 of them, /pods lists {}; {kept}",
                counted - counted_before,
                phases_in_pods(agent)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many of the pods `/pods` lists are in each phase ("3 Pending, 9997 Running"), or why it
/// could not be read: a failed wait says which of its two figures stayed short.
fn phases_in_pods(agent: &Agent) -> String {
    let pods = match agent.pods() {
        Ok(pods) => pods,
        Err(err) => return format!("nothing ({err:#})"),
    };
    let mut phases = std::collections::BTreeMap::<String, usize>::new();
    for (_, phase) in pods {
        *phases.entry(phase).or_default() += 1;
    }
    let counts: Vec<String> = phases.iter().map(|(phase, count)| format!("{count} {phase}")).collect();
    if counts.is_empty() { "no pod".to_owned() } else { counts.join(", ") }
}

/// Keeps the agent's `/pods` and `/metrics` answers as they are at a failed wait, beside its log
/// in `target/bench/logs/` (the run's tmpfs goes with the agent), and says where they are.
fn keep_answers(agent: &Agent, pods: usize) -> String {
    let keep = || -> Result<std::path::PathBuf> {
        let logs = logs_dir()?;
        for (path, file) in [("/pods", "pods.json"), ("/metrics", "metrics.txt")] {
            let (_, body) = harness::get(&agent.socket(), path)?;
            fs::write(logs.join(format!("hollow-{pods}-{file}")), body)?;
        }
        Ok(logs)
    };
    match keep() {
        Ok(logs) => format!("its /pods and /metrics are kept in {}", logs.display()),
        Err(err) => format!("its /pods and /metrics could not be kept: {err:#}"),
    }
}

/// The table's rows of one hollow node.
pub(super) fn figures(hollow: &Hollow) -> Vec<Figure> {
    let pods = hollow.pods;
    let target = if pods <= 1_000 { 5.0 } else { 60.0 };
    vec![
        Figure::new(
            format!("hollow node, {pods} pods on fake://: manifests written → all Running"),
            "s",
            &hollow.running,
        )
        .target(Target::AtMost(target)),
        Figure::new(format!("hollow node, {pods} pods: idle CPU per pod"), "ms/min", &hollow.cpu_per_pod),
        Figure::new(format!("hollow node, {pods} pods: resident memory per pod"), "KiB", &hollow.rss_per_pod),
        Figure::new(format!("hollow node, {pods} pods: threads"), "", &hollow.threads).target(Target::AtMost(16.0)),
    ]
}
