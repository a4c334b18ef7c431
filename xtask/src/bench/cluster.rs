//! Cluster mode: the agent joined to the project's kube-apiserver (`cargo xtask cluster`) as a
//! test node, with its own client certificate and kubeAPIQPS 50 / burst 100, and pods created
//! and deleted through the API as `api_bench pods` sees them, through one watch opened before the
//! first create.
//!
//! First one unmeasured round of each size, as the standalone rounds come after the agent has
//! run a while: the first pods after a join meet cold connections, lists and caches on both
//! sides (on a kube-apiserver just started, the 10-pod round took 1.28× the standalone start-up
//! where one up for a while took 0.99×).
//! Then one pod and 50 (10 with `--quick`), each `repeat` times: created → all
//! Running in the API, held to the standalone start-up of as many pods (one pod: to the CRI
//! floor of one pod, measured just before in the same round with the agent paused, plus 100 ms),
//! and deleted → all gone from the API, held to the standalone teardown plus a second. Each
//! round starts once the agent has removed the last round's pods from the node. Each round also
//! reports the agent's own requests to the API server, from its client-go metrics (how many,
//! their mean time, their wait for rate-limit tokens). Then a config map a running pod mounts is
//! changed `repeat` times, each timed until the file in the pod's volume holds the new value
//! (each held to 2 s: the agent's object watch, not the minute's resync). Measured wherever
//! the machine has a kube-apiserver (the one `cargo xtask setup` builds, or
//! `KUBELET_RS_KUBE_APISERVER`'s); without one, a run under `CI=true` fails, and elsewhere one
//! line says the figures were not measured, and why.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Figure, Options, Target, path_str, progress};
use crate::{
    cluster,
    harness::{self, Agent, CriTool},
    images, leaks,
    util::{in_ci, output},
};

/// Created → all Running, and deleted → all gone, seconds, by pod count; and config map
/// updates until the pod's file changed, seconds.
#[derive(Debug, Default)]
pub(super) struct ClusterRuns {
    running: BTreeMap<usize, Vec<f64>>,
    gone: BTreeMap<usize, Vec<f64>>,
    /// Where a deletion's seconds went, by pod count.
    deletion: BTreeMap<usize, Vec<DeletionTimes>>,
    /// The agent's own requests to the API server in each round, by pod count.
    requests: BTreeMap<usize, Vec<Requests>>,
    config_map_updates: Vec<f64>,
    /// The CRI floor of one pod, all at once, measured in each round with the agent paused.
    floor_one: Vec<f64>,
}

/// One round's deletion as the API showed it, seconds from the first delete: every delete
/// answered, every pod marked for deletion, every pod's terminal status in, every pod gone.
#[derive(Debug, Clone, Copy)]
struct DeletionTimes {
    answered: f64,
    marked: f64,
    terminal: f64,
}

/// The agent's requests to the API server over one round, from its client-go metrics: how
/// many (watches aside), their time in all, and their wait for tokens of the rate limits in all.
#[derive(Debug, Clone, Copy, Default)]
struct Requests {
    count: f64,
    seconds: f64,
    token_wait_seconds: f64,
}

impl Requests {
    /// The agent's totals so far.
    fn so_far(agent: &Agent) -> Result<Requests> {
        let (seconds, count) = agent.metric_sum_count("rest_client_request_duration_seconds")?;
        let (token_wait_seconds, _) = agent.metric_sum_count("rest_client_rate_limiter_duration_seconds")?;
        Ok(Requests { count, seconds, token_wait_seconds })
    }

    /// What was added since `before`.
    fn since(self, before: Requests) -> Requests {
        Requests {
            count: self.count - before.count,
            seconds: self.seconds - before.seconds,
            token_wait_seconds: self.token_wait_seconds - before.token_wait_seconds,
        }
    }
}

/// What the cluster figures are held to, from the same run's standalone figures.
#[derive(Debug)]
pub(super) struct Standalone {
    /// Start-up (all Running in `/pods`) medians by pod count.
    pub(super) startup: BTreeMap<usize, f64>,
    /// Teardown medians by pod count.
    pub(super) teardown: BTreeMap<usize, f64>,
}

/// Runs the cluster rounds of 1 and `most_pods` pods, or says why not and returns `None`.
pub(super) fn measure(
    agent_binary: &Path,
    api_tool: &Path,
    cri_tool: &CriTool,
    dir: &Path,
    most_pods: usize,
    options: &Options,
) -> Result<Option<ClusterRuns>> {
    if let Some(why) = cluster::missing_prerequisites() {
        if in_ci() {
            bail!("cluster mode cannot be measured: {why}");
        }
        progress(&format!("cluster mode: not measured ({why})"));
        return Ok(None);
    }
    let started = !cluster::running();
    cluster::up()?;
    let result = measure_on_cluster(agent_binary, api_tool, cri_tool, dir, most_pods, options);
    if started {
        cluster::down()?;
    }
    result.map(Some)
}

fn measure_on_cluster(
    agent_binary: &Path,
    api_tool: &Path,
    cri_tool: &CriTool,
    dir: &Path,
    most_pods: usize,
    options: &Options,
) -> Result<ClusterRuns> {
    let (node, kubeconfig) = cluster::node(0);
    let config = config(dir)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port().to_string();
    let cert_dir = dir.join("pki");
    let flags = [
        "--kubeconfig",
        path_str(&kubeconfig)?,
        "--config",
        path_str(&config)?,
        "--cert-dir",
        path_str(&cert_dir)?,
        "--port",
        &port,
    ];
    progress(&format!("cluster mode: the agent joins as {node}"));
    let cgroups_before = leaks::pod_cgroups();
    let mut agent = Agent::start_as(&node, &harness::endpoint(), agent_binary, dir, &flags)?;
    agent.wait_healthy(Duration::from_secs(30))?;
    let mut runs = ClusterRuns::default();
    let sizes = if most_pods > 1 { vec![1, most_pods] } else { vec![1] };
    let measured = (|| -> Result<()> {
        progress("cluster mode: one round of each size to warm up, not measured");
        for &pods in &sizes {
            api_pods(api_tool, &node, pods)?;
            wait_until_cleaned_up(&agent, &cgroups_before)?;
        }
        for round in 1..=options.repeat {
            for &pods in &sizes {
                if pods == 1 {
                    let paused = agent.pause();
                    let floor = cri_tool.floor(1, 1, dir)?;
                    drop(paused);
                    runs.floor_one.push(floor.start);
                    agent.wait_quiet(Duration::from_secs(10));
                }
                progress(&format!("cluster mode, {pods} API pods, run {round} of {}", options.repeat));
                let before = Requests::so_far(&agent)?;
                let round = api_pods(api_tool, &node, pods)?;
                let requests = Requests::so_far(&agent)?.since(before);
                runs.requests.entry(pods).or_default().push(requests);
                runs.running.entry(pods).or_default().push(round.running);
                runs.gone.entry(pods).or_default().push(round.gone);
                runs.deletion.entry(pods).or_default().push(round.deletion);
                // The next round starts on a node that has removed these pods, as the standalone
                // rounds do: a 1-pod round right after 50 pods were deleted ran beside their
                // removal (sandboxes, cgroups, directories), 0.25-0.31 s where it takes
                // 0.17-0.21 s on a quiet node.
                wait_until_cleaned_up(&agent, &cgroups_before)?;
            }
        }
        progress(&format!("cluster mode, a configMap changed {} times under a pod", options.repeat));
        runs.config_map_updates = config_map_updates(api_tool, &node, &dir.join("root"), options.repeat)?;
        wait_until_cleaned_up(&agent, &cgroups_before)
    })();
    if measured.is_err() {
        remove_api_pods(api_tool, &node, &agent, &cgroups_before);
    }
    agent.stop(Duration::from_secs(10))?;
    // A Node left NotReady in the API would meet the next agent of that name (a real-runtime
    // test registers it afresh).
    let forgotten = output(
        Command::new(api_tool)
            .arg("forget-node")
            .arg("--kubeconfig")
            .arg(cluster::admin_kubeconfig())
            .args(["--node", &node]),
    );
    measured.context("see the agent's log, kept as target/bench/logs/cluster.log")?;
    forgotten.with_context(|| format!("deleting the Node {node}"))?;
    Ok(runs)
}

/// Waits (at most 30 s) until the agent has forgotten the API pods and removed their cgroups
/// (its housekeeping does, every 2 s), which `api_bench` does not wait for: the API forgets a
/// pod once it has terminated. An agent stopped before would leave them on the host, and a
/// round started before would run beside their removal.
fn wait_until_cleaned_up(agent: &Agent, cgroups_before: &BTreeSet<String>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pods = agent.pods()?;
        if pods.is_empty() {
            return super::wait_for_pod_cgroups(cgroups_before);
        }
        if Instant::now() > deadline {
            bail!("30 s after the last API pod was gone, the agent still had {pods:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// After a failed round: deletes its pods in the API and waits until the agent has removed them
/// from the node (sandboxes, networks, cgroups), as it does any deleted pod. Stopping the agent
/// and the runtime with them still there would leave their network namespaces and addresses on
/// the host. Where that fails too, says so; the bench's own clean-up then removes the sandboxes
/// through the runtime.
fn remove_api_pods(api_tool: &Path, node: &str, agent: &Agent, cgroups_before: &BTreeSet<String>) {
    let removed = run_api_tool(api_tool, "clean", node, |tool| tool).and_then(|deleted| {
        progress(&format!("cluster mode: the failed run's API pods deleted ({deleted})"));
        wait_until_cleaned_up(agent, cgroups_before)
    });
    if let Err(err) = removed {
        println!("warning: the failed run's API pods were not removed through the agent: {err:#}");
    }
}

/// The agent's configuration: kubeAPIQPS 50 and burst 100, upstream's defaults since v1.27, and
/// its kubelet API open to this machine alone.
fn config(dir: &Path) -> Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\naddress: 127.0.0.1\n\
         kubeAPIQPS: 50\nkubeAPIBurst: 100\n",
    )?;
    Ok(config)
}

/// One round of API pods, seconds: created → all Running, deleted → all gone, and the deletion's
/// steps.
struct ApiRound {
    running: f64,
    gone: f64,
    deletion: DeletionTimes,
}

/// One round of `pods` API pods.
fn api_pods(api_tool: &Path, node: &str, pods: usize) -> Result<ApiRound> {
    let times = run_api_tool(api_tool, "pods", node, |tool| tool.args(["--pods", &pods.to_string()]))?;
    let seconds = |key: &str| times[key].as_f64().with_context(|| format!("api_bench printed no {key}: {times}"));
    let deletion = DeletionTimes {
        answered: seconds("deletes_answered_s")?,
        marked: seconds("marked_s")?,
        terminal: seconds("terminal_s")?,
    };
    Ok(ApiRound { running: seconds("running_s")?, gone: seconds("gone_s")?, deletion })
}

/// `updates` changes of a config map a pod mounts, each until the file in the pod's volume under
/// the agent's `root_dir` changed, seconds.
fn config_map_updates(api_tool: &Path, node: &str, root_dir: &Path, updates: usize) -> Result<Vec<f64>> {
    let times = run_api_tool(api_tool, "configmap", node, |tool| {
        tool.arg("--root-dir").arg(root_dir).args(["--updates", &updates.to_string()])
    })?;
    let seconds = times["update_s"].as_array().with_context(|| format!("api_bench printed no update_s: {times}"))?;
    Ok(seconds.iter().filter_map(serde_json::Value::as_f64).collect())
}

/// Runs `api_bench <command>` as the admin, on `node`'s bench namespace with the busybox image,
/// with the arguments `more` adds; the JSON it prints.
fn run_api_tool(
    api_tool: &Path,
    command: &str,
    node: &str,
    more: impl FnOnce(&mut Command) -> &mut Command,
) -> Result<serde_json::Value> {
    let mut tool = Command::new(api_tool);
    tool.arg(command)
        .arg("--kubeconfig")
        .arg(cluster::admin_kubeconfig())
        .args(["--node", node, "--namespace", harness::NAMESPACE])
        .args(["--image", &images::BUSYBOX.reference()]);
    let out = output(more(&mut tool))?;
    serde_json::from_str(out.trim()).with_context(|| format!("api_bench printed {out:?}"))
}

/// What the name of every cluster-mode figure starts with: a run that does not measure cluster
/// mode leaves them all out.
pub(super) const FIGURES: &str = "cluster, ";

/// The table's rows.
pub(super) fn figures(runs: &ClusterRuns, standalone: &Standalone) -> Vec<Figure> {
    let mut figures = Vec::new();
    for (&pods, running) in &runs.running {
        let figure = if pods == 1 {
            let name = "cluster, 1 API pod: created → Running in the API (floor: the CRI floor)";
            let figure = Figure::new(name, "s", running).target(Target::Floor { factor: 1.0, plus: 0.1 });
            let floor = (!runs.floor_one.is_empty()).then(|| super::Stat::of(&runs.floor_one).median);
            with_floor(figure, floor.as_ref())
        } else {
            let name =
                format!("cluster, {pods} API pods: created → all Running in the API (floor: the standalone start-up)");
            // Held by its ratio to the standalone start-up of the same run, like every figure with
            // a floor: its time alone, measured on another machine, says nothing of the code.
            let figure = Figure::new(name, "s", running).target(Target::Floor { factor: 1.2, plus: 0.0 });
            with_floor(figure, standalone.startup.get(&pods))
        };
        figures.push(figure);
    }
    for (&pods, gone) in &runs.gone {
        let name =
            format!("cluster, {pods} API pods: deleted → all gone from the API (floor: the standalone teardown)");
        let figure = Figure::new(name, "s", gone).target(Target::Floor { factor: 1.0, plus: 1.0 });
        // Reported, not held to the baseline: the same build's deletion of 10 API pods took
        // 0.95 to 1.29 s over 20 runs, a spread wider than the check's 20 %.
        figures.push(with_floor(figure, standalone.teardown.get(&pods)).unchecked());
        figures.extend(deletion_breakdown(pods, runs.deletion.get(&pods).map_or(&[], Vec::as_slice)));
        figures.extend(request_figures(pods, runs.requests.get(&pods).map_or(&[], Vec::as_slice)));
    }
    if !runs.config_map_updates.is_empty() {
        let name = "cluster, a configMap changed in the API → the file changed in the pod's volume";
        figures.push(Figure::new(name, "s", &runs.config_map_updates).target(Target::EachAtMost(2.0)));
    }
    figures
}

/// Where a deletion of `pods` API pods spent its seconds: the API server's part (answering
/// the deletes, and marking the pods, which the agent's watch then sees) and the agent's
/// (killing the pods and sending their terminal statuses; then deleting them from the API).
fn deletion_breakdown(pods: usize, rounds: &[DeletionTimes]) -> Vec<Figure> {
    if rounds.is_empty() {
        return Vec::new();
    }
    let samples = |step: fn(&DeletionTimes) -> f64| rounds.iter().map(step).collect::<Vec<f64>>();
    let steps = [
        ("every delete answered", samples(|t| t.answered)),
        ("every pod marked for deletion in the watch", samples(|t| t.marked)),
        ("every pod's terminal status in the API", samples(|t| t.terminal)),
    ];
    steps
        .into_iter()
        .map(|(step, samples)| {
            let name = format!("cluster, {pods} API pods, breakdown: deleted → {step}");
            Figure::new(name, "s", &samples).unchecked()
        })
        .collect()
}

/// The agent's requests over each round of `pods` API pods (created → gone): how many, how long
/// one took on average, and how long they waited for tokens of the agent's rate limits in all
/// (`kubeAPIQPS` and `eventRecordQPS`).
fn request_figures(pods: usize, rounds: &[Requests]) -> Vec<Figure> {
    if rounds.is_empty() {
        return Vec::new();
    }
    let samples = |of: fn(&Requests) -> f64| rounds.iter().map(of).collect::<Vec<f64>>();
    let name = |what: &str| format!("cluster, {pods} API pods, the agent's requests to the API server: {what}");
    vec![
        Figure::new(name("how many (watches aside)"), "", &samples(|r| r.count)).unchecked(),
        Figure::new(name("the mean time of one"), "ms", &samples(|r| 1000.0 * r.seconds / r.count.max(1.0)))
            .unchecked(),
        Figure::new(name("their wait for rate-limit tokens, in all"), "s", &samples(|r| r.token_wait_seconds))
            .unchecked(),
    ]
}

fn with_floor(figure: Figure, floor: Option<&f64>) -> Figure {
    match floor {
        Some(&floor) => figure.floor(floor),
        None => figure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_figure_is_named_as_cluster_modes() {
        let rounds = || BTreeMap::from([(1, vec![0.2]), (10, vec![1.0])]);
        let runs = ClusterRuns {
            running: rounds(),
            gone: rounds(),
            deletion: BTreeMap::from([(10, vec![DeletionTimes { answered: 0.1, marked: 0.2, terminal: 0.5 }])]),
            requests: BTreeMap::from([(10, vec![Requests { count: 40.0, seconds: 0.4, token_wait_seconds: 0.0 }])]),
            config_map_updates: vec![0.02],
            floor_one: vec![0.1],
        };
        let standalone = Standalone { startup: BTreeMap::from([(10, 0.9)]), teardown: BTreeMap::from([(10, 0.5)]) };
        let figures = figures(&runs, &standalone);
        assert!(figures.len() > 5);
        for figure in &figures {
            assert!(figure.name.starts_with(FIGURES), "{}", figure.name);
        }
    }
}
