//! `cargo xtask dist`: the Debian package as it ships (cargo-deb, the `dist` profile): the binary
//! (also `/usr/bin/kubelet`), upstream's `kubelet.service` as a `Type=notify` unit, a standalone
//! configuration, the man page and the bash completions, the last two written by the binary.
//!
//! [`check_package`] is CI's test of it: the package (of the `dev` profile's binary) installed
//! with dpkg, its unit read and run as systemd would run it (its `EnvironmentFile`s, `$VAR`
//! expansion, `NOTIFY_SOCKET`, `WATCHDOG_USEC`), the agent's `READY=1`, `WATCHDOG=1` and
//! `STOPPING=1` heard on the test's own socket, and the package purged.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::net::UnixDatagram,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    ci::cargo,
    harness::Profile,
    runtime,
    util::{have, in_ci, output, project_root, run},
};

/// `cargo xtask dist [--profile release|dev] | --check`.
pub(crate) fn run_dist(args: &[&str]) -> Result<()> {
    let profile = match args {
        [] => Profile::Dist,
        ["--profile", "release"] => Profile::Release,
        ["--profile", "dev"] => Profile::Dev,
        ["--check"] => {
            // CI's check alone, on the project's runtime (started for it when not running).
            let started = runtime::start()?;
            let checked = check_package();
            if started {
                runtime::stop()?;
            }
            return checked;
        }
        other => bail!("unknown dist options {other:?}; usage: cargo xtask dist [--profile release|dev | --check]"),
    };
    let deb = build_deb(profile)?;
    println!("{}", deb.display());
    Ok(())
}

/// Builds the agent in `profile`, writes its man page and completions next to it, and packages
/// them; returns the `.deb`.
fn build_deb(profile: Profile) -> Result<PathBuf> {
    if !have("cargo-deb") {
        bail!("cargo-deb is missing: run `cargo xtask setup` (it installs it from crates.io)");
    }
    let binary = crate::harness::build(profile)?.agent;
    let target = project_root()?.join("target");
    // cargo-deb takes the assets from `<target>/<profile>/` and warns that it will refuse the dev
    // profile (it makes releases): a dev build is packaged from a target directory of its own,
    // laid out as a release build's, holding a link to the dev binary.
    let (target, deb_profile) = match profile {
        Profile::Dev => (target.join("debug/deb-as-release"), Profile::Release),
        other => (target, other),
    };
    let out = target.join(deb_profile.dir());
    let assets = out.join("packaging");
    fs::create_dir_all(&assets)?;
    if profile == Profile::Dev {
        let staged = out.join("kubelet-rs");
        let _ = fs::remove_file(&staged);
        fs::hard_link(&binary, &staged)
            .with_context(|| format!("linking {} into {}", binary.display(), out.display()))?;
    }
    let generated: [(&[&str], &str); 3] = [
        (&["man"], "kubelet-rs.1"),
        (&["completion", "bash", "--name", "kubelet"], "kubelet.bash"),
        (&["completion", "bash"], "kubelet-rs.bash"),
    ];
    for (args, file) in generated {
        fs::write(assets.join(file), output(Command::new(&binary).args(args))?)?;
    }
    let deb = out.join("kubelet-rs.deb");
    let mut cargo_deb = cargo();
    cargo_deb
        .args(["deb", "-p", "kubelet-rs", "--profile", deb_profile.name(), "--no-build", "--output"])
        .arg(&deb)
        .env("CARGO_TARGET_DIR", &target);
    if profile == Profile::Dev {
        // CI's check installs it once: xz's best compression of the dev binary took 20 s.
        cargo_deb.arg("--fast");
    }
    run(&mut cargo_deb)?;
    Ok(deb)
}

/// The package installed with dpkg for as long as it lives, then purged; `/etc/default/kubelet`
/// is put back as it was.
struct Installed {
    default_env: Option<Vec<u8>>,
}

const DEFAULT_ENV: &str = "/etc/default/kubelet";

impl Installed {
    fn install(deb: &Path) -> Result<Installed> {
        if have("dpkg-query") && output(Command::new("dpkg-query").args(["-W", "kubelet"])).is_ok() {
            bail!("upstream's kubelet package is installed here; the check would replace it");
        }
        let default_env = fs::read(DEFAULT_ENV).ok();
        run(Command::new("dpkg").arg("-i").arg(deb))?;
        Ok(Installed { default_env })
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = run(Command::new("dpkg").args(["--purge", "kubelet-rs"]));
        let _ = match &self.default_env {
            Some(before) => fs::write(DEFAULT_ENV, before),
            None => fs::remove_file(DEFAULT_ENV),
        };
    }
}

/// CI's check of the package (root, with the project's runtime running).
pub(crate) fn check_package() -> Result<()> {
    // The dev profile: CI has built it for the tests already; the package around it is the same.
    let deb = build_deb(Profile::Dev)?;
    let manifests_existed = Path::new("/etc/kubernetes/manifests").exists();
    let installed = Installed::install(&deb)?;
    for file in [
        "/usr/bin/kubelet-rs",
        "/lib/systemd/system/kubelet.service",
        "/etc/kubelet-rs/config.yaml",
        "/usr/share/man/man1/kubelet-rs.1",
        "/usr/share/bash-completion/completions/kubelet",
    ] {
        ensure!(Path::new(file).is_file(), "the package did not install {file}");
    }
    let link = fs::read_link("/usr/bin/kubelet").context("/usr/bin/kubelet")?;
    ensure!(link == Path::new("kubelet-rs"), "/usr/bin/kubelet points at {}", link.display());
    let unit_file = "/lib/systemd/system/kubelet.service";
    if have("systemd-analyze") {
        run(Command::new("systemd-analyze").args(["verify", unit_file]))?;
    } else {
        println!("SKIPPED systemd-analyze verify: not on this machine (the unit is read below instead)");
    }
    let unit = Unit::parse(&fs::read_to_string(unit_file)?);
    ensure!(unit.get("Type") == Some("notify"), "the unit is not Type=notify");
    // A node's /etc/default/kubelet, here pointing the agent at the project's runtime and a
    // scratch directory.
    let scratch = Path::new(&runtime_test_dir()).join("deb-check");
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(scratch.join("manifests"))?;
    let extra = format!(
        "--container-runtime-endpoint=unix://{} --root-dir={} --pod-manifest-path={} --cert-dir={} \
         --pod-logs-dir={} --container-logs-dir={} --hostname-override=deb-check --fail-swap-on=false",
        runtime::socket().display(),
        scratch.join("root").display(),
        scratch.join("manifests").display(),
        scratch.join("pki").display(),
        scratch.join("pods").display(),
        scratch.join("containers").display(),
    );
    fs::write(DEFAULT_ENV, format!("KUBELET_EXTRA_ARGS=\"{extra}\"\n"))?;
    let supervised = supervise(&unit, &scratch);
    drop(installed);
    let _ = fs::remove_dir_all(&scratch);
    supervised?;
    for left in ["/usr/bin/kubelet", "/etc/kubelet-rs"] {
        ensure!(!Path::new(left).exists(), "purging the package left {left}");
    }
    let manifests_left = Path::new("/etc/kubernetes/manifests").exists();
    ensure!(manifests_existed || !manifests_left, "purging the package left the static pod directory it made");
    Ok(())
}

fn runtime_test_dir() -> String {
    runtime::test_env()
        .into_iter()
        .find(|(key, _)| *key == "KUBELET_RS_TEST_DIR")
        .map(|(_, dir)| dir)
        .unwrap_or_default()
}

/// Runs the unit's command as systemd would, and checks what it says on the notify socket.
fn supervise(unit: &Unit, scratch: &Path) -> Result<()> {
    let (program, args) = unit.command()?;
    let socket_path = scratch.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path)?;
    let unit_watchdog =
        unit.get("WatchdogSec").map(parse_seconds).transpose()?.context("the unit has no WatchdogSec")?;
    // systemd gives the agent the unit's interval in WATCHDOG_USEC, and the agent pings at half of
    // whatever it is given: a short one here, or the check would wait 30 s for the first ping.
    let watchdog = unit_watchdog.min(Duration::from_secs(4));
    let log = fs::File::create(scratch.join("agent.log"))?;
    println!("starting {program} {}", args.join(" "));
    let mut agent = Agent(
        Command::new(&program)
            .args(&args)
            .env("NOTIFY_SOCKET", &socket_path)
            .env("WATCHDOG_USEC", watchdog.as_micros().to_string())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {program}"))?,
    );
    let log = || fs::read_to_string(scratch.join("agent.log")).unwrap_or_default();
    let heard = |within: Duration| -> Result<String> {
        socket.set_read_timeout(Some(within))?;
        let mut buffer = [0u8; 256];
        let length = socket
            .recv(&mut buffer)
            .with_context(|| format!("nothing on the notify socket; the agent's log:\n{}", log()))?;
        Ok(String::from_utf8_lossy(&buffer[..length]).into_owned())
    };
    ensure!(heard(Duration::from_secs(60))? == "READY=1\n", "the first notification is not READY=1");
    ensure!(heard(watchdog)? == "WATCHDOG=1\n", "no watchdog ping within the {watchdog:?} WATCHDOG_USEC gave");
    nix::sys::signal::kill(agent.pid(), nix::sys::signal::Signal::SIGTERM)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let said = heard(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)))?;
        if said == "STOPPING=1\n" {
            break;
        }
        ensure!(said == "WATCHDOG=1\n", "unexpected notification {said:?}");
    }
    agent.wait(Duration::from_secs(10))?;
    println!("the packaged agent started under its unit: READY=1, WATCHDOG=1, then STOPPING=1 at SIGTERM");
    Ok(())
}

/// The agent the check started, killed if it outlives the check.
struct Agent(Child);

impl Agent {
    fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.0.id().cast_signed())
    }

    fn wait(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(status) = self.0.try_wait()? {
                ensure!(status.success(), "the agent exited with {status} at SIGTERM");
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("the agent did not exit within {within:?} of SIGTERM")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A systemd duration as units write them: seconds, or a number with `s`, `min`, `ms`.
fn parse_seconds(text: &str) -> Result<Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let number: u64 = number.parse().with_context(|| format!("{text:?} is not a duration"))?;
    Ok(match unit {
        "" | "s" => Duration::from_secs(number),
        "min" => Duration::from_secs(number * 60),
        "ms" => Duration::from_millis(number),
        other => bail!("unknown unit {other:?} in {text:?}"),
    })
}

/// A unit's `[Service]` section, as much of it as the check runs.
#[derive(Debug, Default, PartialEq)]
struct Unit {
    settings: Vec<(String, String)>,
}

impl Unit {
    fn parse(text: &str) -> Unit {
        let mut unit = Unit::default();
        let mut in_service = false;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with(['#', ';'])) {
            if line.starts_with('[') {
                in_service = line == "[Service]";
                continue;
            }
            if let (true, Some((key, value))) = (in_service, line.split_once('=')) {
                unit.settings.push((key.trim().to_owned(), value.trim().to_owned()));
            }
        }
        unit
    }

    /// The last value of `key`.
    fn get(&self, key: &str) -> Option<&str> {
        self.settings.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The environment its `Environment=` and `EnvironmentFile=` lines give, in order.
    fn environment(&self) -> Result<BTreeMap<String, String>> {
        let mut environment = BTreeMap::new();
        for (key, value) in &self.settings {
            match key.as_str() {
                "Environment" => {
                    for assignment in words(value) {
                        if let Some((name, value)) = assignment.split_once('=') {
                            environment.insert(name.to_owned(), value.to_owned());
                        }
                    }
                }
                "EnvironmentFile" => {
                    let (optional, path) = match value.strip_prefix('-') {
                        Some(path) => (true, path),
                        None => (false, value.as_str()),
                    };
                    let text = match fs::read_to_string(path) {
                        Ok(text) => text,
                        Err(_) if optional => continue,
                        Err(err) => return Err(err).with_context(|| format!("EnvironmentFile {path}")),
                    };
                    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
                        if let Some((name, value)) = line.split_once('=') {
                            let value = value.trim().trim_matches('"');
                            environment.insert(name.trim().to_owned(), value.to_owned());
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(environment)
    }

    /// `ExecStart` (the last one after an empty reset), with `$VAR` split into words and
    /// `${VAR}` kept as one, as systemd expands them.
    fn command(&self) -> Result<(String, Vec<String>)> {
        let exec = self.get("ExecStart").filter(|e| !e.is_empty()).context("the unit has no ExecStart")?;
        let environment = self.environment()?;
        let mut expanded = Vec::new();
        for word in words(exec) {
            if let Some(name) = word.strip_prefix("${").and_then(|w| w.strip_suffix('}')) {
                expanded.push(environment.get(name).cloned().unwrap_or_default());
            } else if let Some(name) = word.strip_prefix('$') {
                expanded.extend(environment.get(name).map(|v| words(v)).unwrap_or_default());
            } else {
                expanded.push(word);
            }
        }
        let mut words = expanded.into_iter();
        let program = words.next().context("an empty ExecStart")?;
        Ok((program, words.collect()))
    }
}

/// Whitespace-separated words, quotes grouping (`"A=b c" D=e`), as systemd splits a setting.
fn words(text: &str) -> Vec<String> {
    shlex::split(text).unwrap_or_default()
}

/// Whether the check can run here: root, dpkg, and (in CI) cargo-deb.
pub(crate) fn missing_prerequisites() -> Option<String> {
    if !have("dpkg") {
        return Some("dpkg is missing".to_owned());
    }
    if !have("cargo-deb") && !in_ci() {
        return Some("cargo-deb is missing: run `cargo xtask setup`".to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_runs_as_systemd_expands_it() {
        let dir = std::env::temp_dir().join(format!("kubelet-rs-unit-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let flags = dir.join("kubeadm-flags.env");
        fs::write(&flags, "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/c.sock --v=2\"\n").unwrap();
        // kubeadm's drop-in over the packaged unit: ExecStart reset, then its own.
        let unit = Unit::parse(&format!(
            "[Unit]\nDescription=x\n[Service]\nType=notify\nExecStart=/usr/bin/kubelet --config=/etc/a.yaml\n\
             WatchdogSec=60s\n[Service]\n\
             Environment=\"KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/b.conf --kubeconfig=/k.conf\"\n\
             Environment=\"KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml\"\n\
             EnvironmentFile=-{}\nEnvironmentFile=-/nonexistent/kubelet\nExecStart=\n\
             ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS\n",
            flags.display()
        ));
        let (program, args) = unit.command().unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(program, "/usr/bin/kubelet");
        assert_eq!(
            args,
            [
                "--bootstrap-kubeconfig=/b.conf",
                "--kubeconfig=/k.conf",
                "--config=/var/lib/kubelet/config.yaml",
                "--container-runtime-endpoint=unix:///run/c.sock",
                "--v=2"
            ]
        );
        assert_eq!(unit.get("Type"), Some("notify"));
        assert_eq!(parse_seconds(unit.get("WatchdogSec").unwrap()).unwrap(), Duration::from_secs(60));
        assert_eq!(parse_seconds("5min").unwrap(), Duration::from_secs(300));
    }
}
