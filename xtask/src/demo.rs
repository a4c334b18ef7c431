//! `cargo xtask demo`: the agent running the example pods, in one command.
//!
//! As root it installs and starts what it needs (`setup` without CI's cargo tools, `runtime
//! start`), builds the agent (the quick `dev` profile; `--release` for an optimized one), runs it
//! with `examples/manifests`, and shows a live `get pods` table until Ctrl-C or `--duration`;
//! with `--check`, until every example pod has been Running and ready, or Completed, without a
//! restart for 10 s, failing if they are not by the end of `--duration`. Then it removes the demo
//! pods through the agent, stops the agent, and stops the runtime if it started it. `--runtime
//! fake` needs no root: the pods are simulated.

use std::{
    fs,
    io::IsTerminal as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    harness::Profile,
    runtime, setup,
    util::{is_root, output, project_root, run},
};

/// Where the demo keeps its files on the real runtime.
const REAL_DIR: &str = "/var/lib/kubelet-rs-dev/demo";

#[derive(Debug, PartialEq, Eq)]
struct Options {
    fake: bool,
    duration: Option<Duration>,
    /// Fail unless every pod ended Running and ready, or Completed (for CI).
    check: bool,
    /// The profile the agent is built in.
    profile: Profile,
    /// A binary to run instead of building one (CI passes the one its tests built).
    agent: Option<PathBuf>,
}

fn parse(args: &[&str]) -> Result<Options> {
    let mut options = Options { fake: false, duration: None, check: false, profile: Profile::Dev, agent: None };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match *arg {
            "--runtime" => match args.next().copied() {
                Some("fake") => options.fake = true,
                Some("containerd") => options.fake = false,
                other => bail!("--runtime takes containerd or fake, not {other:?}"),
            },
            "--duration" => {
                let value = args.next().context("--duration takes a time such as 60s or 5m")?;
                options.duration = Some(parse_duration(value)?);
            }
            "--check" => options.check = true,
            "--release" => options.profile = Profile::Release,
            "--agent" => options.agent = Some(PathBuf::from(args.next().context("--agent takes a binary's path")?)),
            other => bail!(
                "unknown demo option {other:?}; usage: cargo xtask demo [--runtime containerd|fake] [--duration 60s] [--check] [--release] [--agent PATH]"
            ),
        }
    }
    Ok(options)
}

fn parse_duration(value: &str) -> Result<Duration> {
    let (number, unit) = value.split_at(value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len()));
    let number: u64 = number.parse().with_context(|| format!("--duration {value:?}: expected 60s, 5m or 1h"))?;
    Ok(Duration::from_secs(match unit {
        "" | "s" => number,
        "m" => number * 60,
        "h" => number * 3600,
        _ => bail!("--duration {value:?}: expected 60s, 5m or 1h"),
    }))
}

/// Builds the agent in `profile`: the dev one builds in half the time of an optimized one, which
/// a few pods do not need.
fn build_agent(root: &Path, profile: Profile) -> Result<PathBuf> {
    println!("building the agent ({} profile)", profile.name());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    run(Command::new(cargo).current_dir(root).args([
        "build",
        "--profile",
        profile.name(),
        "--locked",
        "-p",
        "kubelet-rs",
    ]))?;
    Ok(root.join("target").join(profile.dir()).join("kubelet-rs"))
}

pub(crate) fn run_demo(args: &[&str]) -> Result<()> {
    let options = parse(args)?;
    if !options.fake && !is_root() {
        bail!(
            "the demo runs real pods on the project's own containerd, which needs root: run it with sudo,\n\
             or try the simulated runtime without root: cargo xtask demo --runtime fake"
        );
    }
    let root = project_root()?;
    let mut started_runtime = false;
    if !options.fake {
        setup::setup_for_demo()?;
        started_runtime = runtime::start()?;
    }
    let binary = match &options.agent {
        Some(binary) => binary.clone(),
        None => build_agent(&root, options.profile)?,
    };
    let dir = if options.fake {
        std::env::temp_dir().join(format!("kubelet-rs-demo-{}", std::process::id()))
    } else {
        PathBuf::from(REAL_DIR)
    };
    let _ = fs::remove_dir_all(&dir);
    let manifests = dir.join("manifests");
    fs::create_dir_all(&manifests)?;
    for entry in fs::read_dir(root.join("examples/manifests"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            fs::copy(&path, manifests.join(path.file_name().context("a file name")?))?;
        }
    }
    let endpoint = if options.fake {
        "fake://?startLatency=500ms".to_owned()
    } else {
        format!("unix://{}", runtime::socket().display())
    };
    let mut agent = start_agent(&binary, &dir, &endpoint)?;
    let examples = root.join("examples/manifests");
    let checked = options.check.then_some(examples.as_path());
    let shown = show_pods(&binary, &dir, options.duration, checked).and_then(|last| match checked {
        Some(examples) => check_table(&last, examples).map(|expected| {
            println!("--check: all {expected} example pods Running and ready, or Completed, with no restart");
        }),
        None => Ok(()),
    });
    println!("\nremoving the demo pods");
    let cleaned = remove_pods(&binary, &dir, &manifests, !options.fake);
    let _ = output(Command::new("kill").arg("-TERM").arg(agent.id().to_string()));
    let _ = agent.wait();
    if started_runtime {
        runtime::stop()?;
    }
    if options.fake {
        let _ = fs::remove_dir_all(&dir);
    } else {
        println!("agent log: {}", dir.join("agent.log").display());
    }
    shown.and(cleaned)
}

fn start_agent(binary: &Path, dir: &Path, endpoint: &str) -> Result<Child> {
    let log = fs::File::create(dir.join("agent.log"))?;
    let mut command = Command::new(binary);
    command
        .args(["run", "--container-runtime-endpoint", endpoint, "--healthz-port", "0"])
        .arg("--pod-manifest-path")
        .arg(dir.join("manifests"))
        .arg("--root-dir")
        .arg(dir.join("root"))
        .arg("--pod-logs-dir")
        .arg(dir.join("logs"))
        .arg("--container-logs-dir")
        .arg(dir.join("containers"))
        .stdout(Stdio::null())
        .stderr(log)
        // Its own process group: Ctrl-C in the terminal reaches the demo, which then stops the
        // agent in order, after removing the pods.
        .process_group(0);
    command.spawn().with_context(|| format!("starting {}", binary.display()))
}

fn get_pods(binary: &Path, dir: &Path) -> String {
    Command::new(binary)
        .args(["get", "pods", "--root-dir"])
        .arg(dir.join("root"))
        .output()
        .map(|o| if o.status.success() { String::from_utf8_lossy(&o.stdout).into_owned() } else { String::new() })
        .unwrap_or_default()
}

/// The live table, refreshed every second, until Ctrl-C or the duration ends, or, when `checked`
/// names the examples, once the table has passed [`check_table`] for [`STEADY`]; returns the last.
fn show_pods(binary: &Path, dir: &Path, duration: Option<Duration>, checked: Option<&Path>) -> Result<String> {
    let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let started = Instant::now();
    let mut passing_since: Option<Instant> = None;
    let terminal = std::io::stdout().is_terminal();
    tokio.block_on(async {
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        loop {
            let table = get_pods(binary, dir);
            if terminal {
                print!("\x1b[2J\x1b[H");
            }
            let until =
                duration.map_or_else(|| "Ctrl-C to stop".to_owned(), |d| format!("for {}s or Ctrl-C", d.as_secs()));
            println!(
                "kubelet-rs demo, {}s in ({until}); agent log: {}\n",
                started.elapsed().as_secs(),
                dir.join("agent.log").display()
            );
            print!("{}", if table.is_empty() { "(waiting for the agent)\n" } else { &table });
            if duration.is_some_and(|d| started.elapsed() >= d) {
                return Ok(table);
            }
            if let Some(examples) = checked {
                if check_table(&table, examples).is_ok() {
                    if passing_since.get_or_insert_with(Instant::now).elapsed() >= STEADY {
                        return Ok(table);
                    }
                } else {
                    passing_since = None;
                }
            }
            tokio::select! {
                result = &mut ctrl_c => return result.context("waiting for Ctrl-C").map(|()| table),
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    })
}

/// How long `--check` watches the example pods as expected before it ends: a container that
/// fails soon after its start has restarted within it.
const STEADY: Duration = Duration::from_secs(10);

/// Every example pod is in the table, Running with all containers ready, or Completed; returns
/// how many there are.
fn check_table(table: &str, examples: &Path) -> Result<usize> {
    // Each example's pod name (`metadata.name`, the only key indented by two spaces that is
    // `name`); its row is that name with the node's suffix.
    let mut expected = Vec::new();
    for entry in fs::read_dir(examples)?.filter_map(Result::ok) {
        if entry.path().extension().is_some_and(|x| x == "yaml") {
            let text = fs::read_to_string(entry.path())?;
            let name = text.lines().find_map(|l| l.strip_prefix("  name: ")).map(str::trim);
            expected.push(name.with_context(|| format!("{}: no metadata.name", entry.path().display()))?.to_owned());
        }
    }
    expected.sort();
    let rows: Vec<Vec<&str>> = table.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    let row_of = |name: &str| {
        let prefix = format!("{name}-");
        let mut found = rows.iter().filter(|r| r.first().is_some_and(|n| n.starts_with(&prefix)));
        match (found.next(), found.next()) {
            (Some(row), None) => Some(row),
            _ => None,
        }
    };
    let good = |row: &Vec<&str>| {
        let ready = row.get(1).and_then(|r| r.split_once('/')).is_some_and(|(a, b)| a == b);
        let status = row.get(2).copied();
        ((status == Some("Running") && ready) || status == Some("Completed")) && row.get(3) == Some(&"0")
    };
    let bad: Vec<&String> = expected.iter().filter(|name| !row_of(name).is_some_and(good)).collect();
    if rows.len() != expected.len() || !bad.is_empty() {
        bail!(
            "--check: expected the pods {expected:?}, each Running and ready or Completed, with no restart; \
             wrong: {bad:?}; the table was:\n{table}"
        );
    }
    Ok(expected.len())
}

/// Removes the manifests and waits (at most 60 s) until the agent has removed every pod and,
/// on the real runtime, every container and sandbox of them.
fn remove_pods(binary: &Path, dir: &Path, manifests: &Path, real: bool) -> Result<()> {
    for entry in fs::read_dir(manifests)? {
        fs::remove_file(entry?.path())?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let table = get_pods(binary, dir);
        if table.lines().count() <= 1 && (!real || runtime::container_count() == 0) {
            println!("all demo pods removed");
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("demo pods still present after 60 s:\n{table}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_wants_each_example_pod_running_or_completed_without_restarts() {
        let examples = tempfile_dir(&[("a.yaml", "a"), ("b.yaml", "b"), ("README.md", "x")]);
        let header = "NAME READY STATUS RESTARTS AGE IP\n";
        let check = |rows: &str| check_table(&format!("{header}{rows}"), &examples);
        assert!(check("a-n 1/1 Running 0 5s 10.0.0.1\nb-n 0/1 Completed 0 5s <none>\n").is_ok());
        assert!(check("a-n 0/1 Running 0 5s 10.0.0.1\nb-n 0/1 Completed 0 5s <none>\n").is_err(), "not ready");
        assert!(check("a-n 1/1 Running 0 5s 10.0.0.1\n").is_err(), "missing");
        assert!(check("a-n 1/1 Running 2 5s 10.0.0.1\nb-n 0/1 Completed 0 5s <none>\n").is_err(), "restarted");
        assert!(check("a-n 1/1 Running 0 5s 10.0.0.1\nc-n 0/1 Completed 0 5s <none>\n").is_err(), "wrong name");
        assert!(check("a-n 1/1 Running 0 5s 10.0.0.1\nb-n 0/1 Error 0 5s <none>\n").is_err(), "failed");
        let _ = fs::remove_dir_all(&examples);
    }

    /// A directory of files (name, pod name); a `.yaml` file gets a manifest with that name.
    fn tempfile_dir(files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-demo-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        for (file, name) in files {
            let content =
                format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n");
            fs::write(dir.join(file), content).unwrap();
        }
        dir
    }

    #[test]
    fn options_parse() {
        assert_eq!(
            parse(&[]).unwrap(),
            Options { fake: false, duration: None, check: false, profile: Profile::Dev, agent: None }
        );
        assert_eq!(
            parse(&["--runtime", "fake", "--duration", "2m", "--check", "--release"]).unwrap(),
            Options {
                fake: true,
                duration: Some(Duration::from_secs(120)),
                check: true,
                profile: Profile::Release,
                agent: None
            }
        );
        assert!(parse(&["--runtime", "docker"]).is_err());
        assert!(parse(&["--duration", "soon"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
    }
}
