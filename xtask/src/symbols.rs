//! `cargo xtask symbol-order`: the functions the shipped agent runs at start-up and while idle,
//! then those one pod's life adds, in that order, written to [`ORDER_FILE`]; the `dist` build
//! hands the file to the linker (lld's `--symbol-ordering-file`), which lays those functions out
//! together at the start of the code. It links by a copy of the file under `target/` named by
//! a hash of its content, so a list written again links the agent again (cargo does not know
//! the linker reads it).
//!
//! An idle agent's resident memory is mostly its code pages, and the kernel maps a file's pages
//! 64 KiB around each fault: with the 1.7 MiB of functions start-up and idling run spread over
//! 15 MiB of code, most of the code was resident (11 MiB of it with no pod).
//! The list comes from valgrind's callgrind, which records every function that runs, with the
//! agent on the project's containerd and serving the kubelet API as a node does: a dump after
//! start-up and a minute idle (every periodic task has run by then), then one pod started and
//! removed, then a stop.
//! Symbol names carry a hash that changes with their crate's dependencies and, for generic
//! code, with what instantiates it, so the list goes stale as the code changes: a function
//! missing from it is only placed after the listed ones, and the `dist` build warns when a tenth
//! of the listed names are no longer in the agent (adding one dependency to the API client's
//! crate left 2,781 of 4,073, and the idle agent 13.3-14.0 MiB resident where the list
//! written again gave 9.7-9.8).

use std::{
    collections::HashSet,
    fs,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    harness::{self, Agent, Profile},
    runtime,
    util::{have, project_root, run},
};

/// The ordering the `dist` build links by, one mangled symbol per line.
pub(crate) const ORDER_FILE: &str = "xtask/dist-symbol-order.txt";

/// How long the agent idles before the first dump: longer than every periodic task's period
/// (container GC, once a minute, is the longest).
const IDLE: Duration = Duration::from_secs(65);

/// Runs the agent under callgrind and writes [`ORDER_FILE`].
pub(crate) fn run_symbol_order() -> Result<()> {
    for program in ["valgrind", "callgrind_control"] {
        if !have(program) {
            bail!("{program} is missing: apt-get install valgrind");
        }
    }
    let binaries = harness::build(Profile::Dist)?;
    let started_runtime = runtime::start()?;
    let result = profile(&binaries.agent);
    if started_runtime {
        runtime::stop()?;
    }
    let (idle, pod) = result?;
    let order = ordered(&idle, &pod);
    let root = project_root()?;
    fs::write(root.join(ORDER_FILE), order.join("\n") + "\n")?;
    println!(
        "{ORDER_FILE}: {} functions at start-up and idle, {} more for a pod",
        idle.len(),
        order.len() - idle.len()
    );
    Ok(())
}

/// The functions of `agent` that run at start-up and idle, and those that ran afterwards, each
/// in the order callgrind first met them.
fn profile(agent: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let dir = project_root()?.join("target/symbol-order");
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    let out = dir.join("callgrind.out");
    let callgrind = [
        "--tool=callgrind".to_owned(),
        "--demangle=no".to_owned(),
        "--compress-strings=no".to_owned(),
        "--compress-pos=no".to_owned(),
        format!("--callgrind-out-file={}", out.display()),
    ];
    // Serving the kubelet API, as a node and the bench's agent do, so that the functions of its
    // server and serving certificate are listed too.
    let agent_dir = dir.join("agent");
    let served = harness::kubelet_api_served(&agent_dir)?;
    let served: Vec<&str> = served.iter().map(String::as_str).collect();
    let mut agent = Agent::start_under("valgrind", &callgrind, agent, &agent_dir, &served)?;
    agent.wait_healthy(Duration::from_secs(120))?;
    println!("symbol-order: the agent idles for {IDLE:?} under callgrind");
    std::thread::sleep(IDLE);
    run(Command::new("callgrind_control").arg("--dump=idle").arg(agent.pid().to_string()))?;
    println!("symbol-order: one pod started and removed");
    harness::write_manifest(&agent.dir.join("manifests"), "order", &harness::manifest("order"))?;
    wait_until("the pod to run", || Ok(agent.running() >= 1))?;
    fs::remove_file(agent.dir.join("manifests/order.yaml"))?;
    wait_until("the pod to go", || Ok(agent.pods()?.is_empty()))?;
    agent.stop(Duration::from_secs(60))?;
    let idle = functions(&dir.join("callgrind.out.1"))?;
    let after = functions(&out)?;
    Ok((idle, after))
}

/// Polls `done` every 100 ms for at most two minutes (the agent runs some 50 times slower).
fn wait_until(what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done()? {
        if Instant::now() > deadline {
            bail!("symbol-order: timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The functions of the agent's own binary in a callgrind profile (written with
/// `--compress-strings=no`: every `fn=` line names its function), in the order they first appear.
fn functions(profile: &Path) -> Result<Vec<String>> {
    let text = fs::read_to_string(profile).with_context(|| format!("reading {}", profile.display()))?;
    Ok(functions_of_binary(&text, "kubelet-rs"))
}

/// The `fn=` names listed under an `ob=` line of `binary`, each once, in order.
fn functions_of_binary(profile: &str, binary: &str) -> Vec<String> {
    let mut in_binary = false;
    let mut seen = HashSet::new();
    let mut names = Vec::new();
    for line in profile.lines() {
        if let Some(object) = line.strip_prefix("ob=") {
            in_binary = Path::new(object.trim()).file_name().is_some_and(|name| name == binary);
        } else if let Some(name) = line.strip_prefix("fn=")
            && in_binary
            && seen.insert(name.trim())
        {
            names.push(name.trim().to_owned());
        }
    }
    names
}

/// The ordering: the idle functions, then the pod's that are not among them.
fn ordered(idle: &[String], pod: &[String]) -> Vec<String> {
    let first: HashSet<&String> = idle.iter().collect();
    idle.iter().chain(pod.iter().filter(|name| !first.contains(name))).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_binarys_functions_are_listed_once_each_in_first_seen_order() {
        let profile = "ob=/usr/lib/libc.so.6\nfn=malloc\nob=/x/target/dist/kubelet-rs\nfn=_ZN4main\n\
                       cfn=_ZN4callee\nfn=_ZN3run\nfn=_ZN4main\nob=/usr/lib/libc.so.6\nfn=free\n";
        assert_eq!(functions_of_binary(profile, "kubelet-rs"), ["_ZN4main", "_ZN3run"]);
    }

    #[test]
    fn the_idle_functions_come_first() {
        let names = |list: &[&str]| list.iter().map(|name| (*name).to_owned()).collect::<Vec<_>>();
        let order = ordered(&names(&["a", "b"]), &names(&["c", "a", "d"]));
        assert_eq!(order, ["a", "b", "c", "d"]);
    }
}
