//! The compile-only steps of `cargo xtask ci`, in the background from the tests' build to the end
//! of the real-runtime step.
//!
//! The real-runtime tests run one at a time and spend most of their time waiting for containers,
//! leases and timeouts, with the CPU mostly idle; the compile-only steps (feature combinations, docs,
//! cargo-deny, packaging) are the opposite.
//! Clippy is not among them: it runs first, the tests' build reuses its build scripts and
//! proc-macros (without it the tests' build alone took longer than both), and a lint fails the
//! run early.
//! So from the tests' build on, a second `cargo xtask ci --only <those steps>` runs in a
//! copy of the source (this binary, its root set to the copy), with its own target directory, at
//! idle CPU and I/O priority (`chrt --idle`, `ionice -c 3`): the compiler gets only the time the
//! tests leave, and neither run waits for the other's cargo lock or sees the manifests `cargo hack
//! --no-dev-deps` edits while it runs.
//! It is stopped while the tests that read the host's free memory run (the memory-pressure
//! tests), so that the memory it holds does not move under their thresholds.
//! Its output goes to a log file, printed whole when the lane is joined if it failed.

use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::util::{ROOT_VAR, output, project_root};

/// The copy of the source the lane runs in, under the project's target directory.
const COPY: &str = "target/ci-lane";

/// The second run of `cargo xtask ci`, killed with its process group if dropped unjoined.
pub(crate) struct Lane {
    process: Background,
    steps: Vec<&'static str>,
}

impl Lane {
    /// Copies the source and starts `cargo xtask ci --only <steps>` in the copy.
    pub(crate) fn start(steps: &[&'static str]) -> Result<Lane> {
        let root = project_root()?;
        let copy = root.join(COPY);
        copy_source(&root, &copy)?;
        // This binary, built from the same source: `cargo xtask` would build it again in the
        // copy's target directory first.
        let mut command = Command::new("chrt");
        command
            .args(["--idle", "0", "ionice", "-c", "3"])
            .arg(std::env::current_exe()?)
            .args(["ci", "--only", &steps.join(",")])
            .current_dir(&copy)
            .env(ROOT_VAR, &copy)
            // The copy's own target directory, whatever this run was given.
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("CARGO_BUILD_TARGET_DIR");
        let log = root.join("target/ci-lane.log");
        let process = Background::spawn(command, "the compile-only steps", log)
            .context("cannot start the compile-only steps (chrt, from util-linux)")?;
        println!("in {}, at idle priority", copy.display());
        Ok(Lane { process, steps: steps.to_vec() })
    }

    /// Runs `body` with the lane stopped (SIGSTOP to its process group), and lets it go on after.
    pub(crate) fn paused<T>(&self, body: impl FnOnce() -> T) -> T {
        self.process.signal(nix::sys::signal::Signal::SIGSTOP);
        let result = body();
        self.process.signal(nix::sys::signal::Signal::SIGCONT);
        result
    }

    /// Waits for the lane and returns each step's time as it reported it; prints the whole of its
    /// log when it failed, its summary otherwise.
    pub(crate) fn join(self) -> Result<Vec<(&'static str, Duration)>> {
        let log = self.process.join()?;
        print!("{}", summary(&log).unwrap_or_default());
        Ok(self.steps.iter().filter_map(|step| Some((*step, reported_time(&log, step)?))).collect())
    }
}

/// A process beside the real-runtime tests, in a process group of its own and with its output in
/// a log file; killed with its group if dropped unjoined.
pub(crate) struct Background {
    child: Option<Child>,
    /// What it runs, for the messages.
    what: &'static str,
    log: PathBuf,
    started: Instant,
}

impl Background {
    /// Starts `command` as `what`, its output into `log`.
    pub(crate) fn spawn(mut command: Command, what: &'static str, log: PathBuf) -> Result<Background> {
        let file = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        command.stdin(Stdio::null()).stdout(file.try_clone()?).stderr(file).process_group(0);
        let child = command.spawn()?;
        println!("started {what} in the background (log: {})", log.display());
        Ok(Background { child: Some(child), what, log, started: Instant::now() })
    }

    /// Waits for it and returns its log; prints the whole log and fails when it failed.
    pub(crate) fn join(mut self) -> Result<String> {
        let mut child = self.child.take().context("joined twice")?;
        let status = child.wait()?;
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        let what = self.what;
        if !status.success() {
            println!("--- the log of {what} ({}), {:.0} s in all ---", self.log.display(), self.elapsed());
            print!("{log}");
            println!("--- end of the log of {what} ---");
            bail!("{what} in the background failed ({status}): see the log above");
        }
        println!("{what} passed; joined {:.0} s after they started (log: {})", self.elapsed(), self.log.display());
        Ok(log)
    }

    /// Sends `signal` to its process group.
    fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(pid) = self.child.as_ref().and_then(|child| i32::try_from(child.id()).ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-pid), signal);
        }
    }

    fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let group = nix::unistd::Pid::from_raw(-pid);
                let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
            }
            let _ = child.wait();
            println!("stopped {} after {:.0} s (log: {})", self.what, self.elapsed(), self.log.display());
        }
    }
}

/// The summary `cargo xtask ci` ends with when it passed: its `ci: ...` line and the step times.
fn summary(log: &str) -> Option<&str> {
    log.rfind("\nci: ").map(|start| &log[start + 1..])
}

/// A step's time from the summary `cargo xtask ci` ends with (`  clippy          92.1 s`).
fn reported_time(log: &str, step: &str) -> Option<Duration> {
    summary(log)?.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next()? == step).then_some(())?;
        let seconds: f64 = words.next()?.parse().ok()?;
        (words.next()? == "s").then(|| Duration::from_secs_f64(seconds))
    })
}

/// Makes `copy` hold the source git knows of (tracked files and untracked ones not ignored, as
/// they are in the working tree), keeping the copy's own `target` from an earlier run.
fn copy_source(root: &Path, copy: &Path) -> Result<()> {
    if let Ok(entries) = fs::read_dir(copy) {
        for entry in entries {
            let path = entry?.path();
            if path.file_name().is_some_and(|name| name == "target") {
                continue;
            }
            if path.is_dir() {
                fs::remove_dir_all(&path)?;
            } else {
                fs::remove_file(&path)?;
            }
        }
    }
    let listed = output(
        Command::new("git").args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"]).current_dir(root),
    )
    .context("listing the source with git")?;
    for file in listed.split('\0').filter(|file| !file.is_empty()) {
        let from = root.join(file);
        // A tracked file deleted in the working tree is not part of what is checked.
        if !from.is_file() {
            continue;
        }
        let to = copy.join(file);
        if let Some(dir) = to.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_times_come_from_the_summary_the_lane_ends_with() {
        let log = "==> clippy\n  clippy is fine\n\nci: the 2 steps asked for passed (clippy, doc)\n  clippy          92.1 s\n  doc             41.0 s\n";
        assert_eq!(reported_time(log, "clippy"), Some(Duration::from_secs_f64(92.1)));
        assert_eq!(reported_time(log, "doc"), Some(Duration::from_secs_f64(41.0)));
        assert_eq!(reported_time(log, "features"), None);
        assert_eq!(reported_time("==> clippy\nerror\n", "clippy"), None, "no summary: the run failed");
        assert_eq!(
            summary(log),
            Some(
                "ci: the 2 steps asked for passed (clippy, doc)\n  clippy          92.1 s\n  doc             41.0 s\n"
            )
        );
    }
}
