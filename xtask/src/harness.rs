//! What `bench` and `chaos` share: the release agent as a process, its local API, its costs as
//! `/proc` shows them, the manifests they write, and the CRI tool (`cri_bench`, an example of
//! `kubelet-cri-client`).

use std::{
    collections::BTreeMap,
    fs,
    io::{Read as _, Write as _},
    os::unix::{net::UnixStream, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    time::{Duration, Instant, SystemTime},
};

use anyhow::{Context, Result, bail};

use crate::{
    images, runtime,
    util::{output, project_root, run},
};

/// The namespace of every pod the harness writes.
pub(crate) const NAMESPACE: &str = "kubelet-rs-bench";
/// The namespace of the pods `cri_bench floor` makes.
pub(crate) const FLOOR_NAMESPACE: &str = "kubelet-rs-floor";
/// The agent's node name (`--hostname-override`), which static pods' names end with.
pub(crate) const NODE: &str = "bench";

/// A static pod's manifest name from its name in `/pods` and the runtime (`<name>-<node>`).
pub(crate) fn manifest_name(pod_name: &str) -> &str {
    pod_name.strip_suffix(&format!("-{NODE}")).unwrap_or(pod_name)
}

/// The binaries: the agent and the CRI tool.
pub(crate) struct Binaries {
    pub(crate) agent: PathBuf,
    pub(crate) cri_tool: PathBuf,
    /// `api_bench`, an example of `kubelet-cluster`: the bench's cluster-mode figures.
    pub(crate) api_tool: PathBuf,
}

/// The cargo profile the agent is built with: `dev` (CI's, which shares the tests' build),
/// `release` (optimized, cargo's default) for `cargo xtask chaos`, `dist` (what ships, with
/// whole-program LTO) for the benchmark's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Profile {
    Dev,
    Release,
    Dist,
}

impl Profile {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Profile::Dev => "dev",
            Profile::Release => "release",
            Profile::Dist => "dist",
        }
    }

    /// The directory under `target/` the profile builds into (`dev` builds into `debug`).
    pub(crate) fn dir(self) -> &'static str {
        match self {
            Profile::Dev => "debug",
            other => other.name(),
        }
    }
}

/// Builds the agent in `profile`, and the CRI tool.
pub(crate) fn build(profile: Profile) -> Result<Binaries> {
    let root = project_root()?;
    println!("building the agent ({} profile) and the CRI tool", profile.name());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    if profile == Profile::Dev {
        // As the tests' build makes them, with the features the tests turn on: after `cargo
        // test`, nothing is compiled again (one crate's build alone would compile its
        // dependencies again with fewer features).
        run(Command::new(&cargo).current_dir(&root).args([
            "build",
            "--workspace",
            "--tests",
            "--examples",
            "--locked",
        ]))?;
    } else {
        let mut agent = Command::new(&cargo);
        agent.current_dir(&root).args(["rustc", "--profile", profile.name(), "--locked", "-p", "kubelet-rs"]);
        agent.args(["--bin", "kubelet-rs"]);
        let order = if profile == Profile::Dist { symbol_ordering(&root)? } else { None };
        if let Some(order) = &order {
            // What ships lays out the functions start-up and idling run together (`symbols.rs`).
            agent.arg("--").arg(format!("-Clink-arg=-Wl,--symbol-ordering-file={}", order.display()));
        }
        run(&mut agent)?;
        if let Some(order) = &order {
            warn_of_a_stale_ordering(order, &root.join("target").join(profile.dir()).join("kubelet-rs"));
        }
        // The tools in the dev profile: they share their dependencies with the tests' build, and
        // what they measure is the runtime's and the API server's time, not their own.
        run(Command::new(&cargo).current_dir(&root).args([
            "build",
            "--locked",
            "-p",
            "kubelet-cri-client",
            "--example",
            "cri_bench",
            "-p",
            "kubelet-cluster",
            "--example",
            "api_bench",
        ]))?;
    }
    Ok(Binaries {
        agent: root.join("target").join(profile.dir()).join("kubelet-rs"),
        cri_tool: root.join("target/debug/examples/cri_bench"),
        api_tool: root.join("target/debug/examples/api_bench"),
    })
}

/// The symbol ordering to link the `dist` agent by, if the repository has one: a copy of
/// [`crate::symbols::ORDER_FILE`] under `target/` named by a hash of its content. Cargo does not
/// know the linker reads the file, so a list written again would not link the agent again under
/// the same name; a new name changes the build's arguments, which cargo does compare.
fn symbol_ordering(root: &Path) -> Result<Option<PathBuf>> {
    use std::hash::{Hash, Hasher};

    let Ok(content) = fs::read(root.join(crate::symbols::ORDER_FILE)) else {
        return Ok(None);
    };
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    content.hash(&mut hasher);
    let copy = root.join(format!("target/dist-symbol-order-{:016x}.txt", hasher.finish()));
    if !copy.exists() {
        fs::create_dir_all(root.join("target"))?;
        fs::write(&copy, &content)?;
    }
    Ok(Some(copy))
}

/// Says so when much of the symbol ordering names functions the linked agent does not have:
/// the names carry hashes that change with their crates' dependencies and with what instantiates
/// generic code, and functions left out of the list spread the idle agent's code over more
/// pages ([`crate::symbols`]).
fn warn_of_a_stale_ordering(order: &Path, agent: &Path) {
    let (Ok(list), Ok(symbols)) =
        (fs::read_to_string(order), Command::new("nm").arg("--defined-only").arg(agent).output())
    else {
        return;
    };
    let (listed, found) = listed_and_found(&list, &String::from_utf8_lossy(&symbols.stdout));
    if found * 10 < listed * 9 {
        println!(
            "warning: only {found} of the {listed} functions the symbol ordering lists are in the agent; \
             `cargo xtask symbol-order` writes the list again"
        );
    }
}

/// How many names `list` holds (one a line), and how many of them `nm` output names.
fn listed_and_found(list: &str, nm: &str) -> (usize, usize) {
    let defined: std::collections::HashSet<&str> =
        nm.lines().filter_map(|line| line.split_whitespace().nth(2)).collect();
    let listed: Vec<&str> = list.lines().map(str::trim).filter(|name| !name.is_empty()).collect();
    let found = listed.iter().filter(|name| defined.contains(*name)).count();
    (listed.len(), found)
}

/// The CRI endpoint of the project's containerd.
pub(crate) fn endpoint() -> String {
    format!("unix://{}", runtime::socket().display())
}

/// A static pod that runs until SIGTERM, which it obeys at once.
pub(crate) fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\nspec:\n  \
         terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {image}\n    \
         imagePullPolicy: IfNotPresent\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 36000 & wait\"]\n",
        image = images::BUSYBOX.reference()
    )
}

/// The ports the two containers of a [`probed_manifest`] pod serve HTTP on.
pub(crate) const PROBED_PORTS: [u16; 2] = [8080, 8081];

/// A pod of two containers, each serving HTTP and probed twice: an exec readiness probe every
/// 10 s (upstream's default period) and an httpGet liveness probe every second (the probing cost
/// figure). The periods keep the load within what the runtime serves on two cores: at an exec a
/// second per container, containerd fell behind, readiness flapped, and the agent's CPU measured
/// the runtime's overload more than its own probing.
pub(crate) fn probed_manifest(name: &str) -> String {
    let mut yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\nspec:\n  \
         terminationGracePeriodSeconds: 2\n  containers:\n"
    );
    for (container, port) in ["a", "b"].into_iter().zip(PROBED_PORTS) {
        yaml.push_str(&format!(
            "  - name: {container}\n    image: {image}\n    imagePullPolicy: IfNotPresent\n    \
             command: [sh, -c, \"mkdir -p /w && echo ok > /w/index.html && exec httpd -f -p {port} -h /w\"]\n    \
             readinessProbe: {{exec: {{command: [\"true\"]}}, periodSeconds: 10}}\n    \
             livenessProbe: {{httpGet: {{port: {port}, path: /}}, periodSeconds: 1, failureThreshold: 30}}\n",
            image = images::BUSYBOX.reference()
        ));
    }
    yaml
}

/// Writes `name.yaml` into `dir` whole: a temporary dotfile renamed into place.
pub(crate) fn write_manifest(dir: &Path, name: &str, content: &str) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, content)?;
    fs::rename(&tmp, dir.join(format!("{name}.yaml")))?;
    Ok(())
}

/// The agent's arguments to serve the kubelet API on a free loopback port, as a node serves it,
/// with no API server to ask: a configuration file in `agent_dir` (client certificates only,
/// every authenticated request allowed) and its serving certificate under `agent_dir/pki`.
pub(crate) fn kubelet_api_served(agent_dir: &Path) -> Result<Vec<String>> {
    fs::create_dir_all(agent_dir)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let config = agent_dir.join("config.yaml");
    fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\naddress: 127.0.0.1\n\
             port: {port}\nauthentication: {{webhook: {{enabled: false}}}}\nauthorization: {{mode: AlwaysAllow}}\n"
        ),
    )?;
    let path =
        |path: PathBuf| path.to_str().map(str::to_owned).with_context(|| format!("{} is not UTF-8", path.display()));
    Ok(vec!["--config".to_owned(), path(config)?, "--cert-dir".to_owned(), path(agent_dir.join("pki"))?])
}

/// The agent under test, started from the release binary with its files under `dir`.
pub(crate) struct Agent {
    child: Child,
    pub(crate) dir: PathBuf,
}

impl Agent {
    /// Starts the agent on the project's containerd with `dir/manifests` as its manifest path.
    pub(crate) fn start(binary: &Path, dir: &Path, extra: &[&str]) -> Result<Agent> {
        Agent::start_on(&endpoint(), binary, dir, extra)
    }

    /// Starts the agent on the runtime at `endpoint` (`fake://` for the in-memory one) with
    /// `dir/manifests` as its manifest path.
    pub(crate) fn start_on(endpoint: &str, binary: &Path, dir: &Path, extra: &[&str]) -> Result<Agent> {
        Agent::start_as(NODE, endpoint, binary, dir, extra)
    }

    /// Starts the agent as node `node` on the runtime at `endpoint`, with `dir/manifests` as its
    /// manifest path.
    pub(crate) fn start_as(node: &str, endpoint: &str, binary: &Path, dir: &Path, extra: &[&str]) -> Result<Agent> {
        Agent::spawn(Command::new(binary), node, endpoint, binary, dir, extra)
    }

    /// Starts the agent on the project's containerd under `wrapper`, a program that runs the
    /// binary it is given after its own arguments (valgrind).
    pub(crate) fn start_under(
        wrapper: &str,
        wrapper_args: &[String],
        binary: &Path,
        dir: &Path,
        extra: &[&str],
    ) -> Result<Agent> {
        let mut command = Command::new(wrapper);
        command.args(wrapper_args).arg(binary);
        Agent::spawn(command, NODE, &endpoint(), binary, dir, extra)
    }

    /// Spawns `command`, the agent's binary or what runs it, with the agent's arguments.
    fn spawn(
        mut command: Command,
        node: &str,
        endpoint: &str,
        binary: &Path,
        dir: &Path,
        extra: &[&str],
    ) -> Result<Agent> {
        fs::create_dir_all(dir.join("manifests"))?;
        let log = fs::OpenOptions::new().create(true).append(true).open(dir.join("agent.log"))?;
        command
            .args(["run", "--container-runtime-endpoint", endpoint, "--healthz-port", "0"])
            .args(["--hostname-override", node])
            // One line per record, so a record is counted once however many lines its message has.
            .args(["--logging-format", "json"])
            .arg("--pod-manifest-path")
            .arg(dir.join("manifests"))
            .arg("--root-dir")
            .arg(dir.join("root"))
            .arg("--pod-logs-dir")
            .arg(dir.join("logs"))
            .arg("--container-logs-dir")
            .arg(dir.join("containers"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0);
        // An agent removes every pod cgroup it did not make under its `cgroupRoot`: the agents
        // of each of the project's containerds keep to their own.
        let cgroup_root = runtime::instance().cgroup_root();
        if !cgroup_root.is_empty() {
            command.args(["--cgroup-root", cgroup_root]);
        }
        let child = command.spawn().with_context(|| format!("starting {}", binary.display()))?;
        Ok(Agent { child, dir: dir.to_owned() })
    }

    /// The agent's process ID.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The local API's socket.
    pub(crate) fn socket(&self) -> PathBuf {
        self.dir.join("root/kubelet-rs.sock")
    }

    /// Waits until `/healthz` answers 200.
    pub(crate) fn wait_healthy(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the agent exited ({status}); see {}", self.dir.join("agent.log").display());
            }
            if get(&self.socket(), "/healthz").is_ok_and(|(code, _)| code == 200) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the agent was not healthy within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process still runs.
    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `(manifest name, phase)` of every pod of the harness namespace in `/pods`.
    pub(crate) fn pods(&self) -> Result<Vec<(String, String)>> {
        let (code, body) = get(&self.socket(), "/pods")?;
        if code != 200 {
            bail!("/pods answered {code}");
        }
        let list: serde_json::Value = serde_json::from_str(&body).context("decoding /pods")?;
        Ok(list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|p| p["metadata"]["namespace"] == NAMESPACE)
                    .map(|p| {
                        let name = manifest_name(p["metadata"]["name"].as_str().unwrap_or_default()).to_owned();
                        (name, p["status"]["phase"].as_str().unwrap_or_default().to_owned())
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The sum of every container's restart count and whether every container runs, over the
    /// pods of the harness namespace in `/pods`.
    pub(crate) fn restarts(&self) -> Result<(u64, bool)> {
        let (_, body) = get(&self.socket(), "/pods")?;
        let list: serde_json::Value = serde_json::from_str(&body).context("decoding /pods")?;
        let (mut restarts, mut all_running) = (0, true);
        for pod in list["items"].as_array().into_iter().flatten().filter(|p| p["metadata"]["namespace"] == NAMESPACE) {
            for status in pod["status"]["containerStatuses"].as_array().into_iter().flatten() {
                restarts += status["restartCount"].as_u64().unwrap_or(0);
                all_running &= status["state"]["running"].is_object();
            }
        }
        Ok((restarts, all_running))
    }

    /// How many of the bench's pods have the Ready condition True in `/pods`.
    pub(crate) fn ready(&self) -> Result<usize> {
        let (code, body) = get(&self.socket(), "/pods")?;
        if code != 200 {
            bail!("/pods answered {code}");
        }
        let list: serde_json::Value = serde_json::from_str(&body).context("decoding /pods")?;
        let ready = |p: &&serde_json::Value| {
            p["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        };
        Ok(list["items"]
            .as_array()
            .map_or(0, |items| items.iter().filter(|p| p["metadata"]["namespace"] == NAMESPACE).filter(ready).count()))
    }

    /// Pods of the harness namespace that are Running in `/pods`; none when `/pods` cannot be read.
    pub(crate) fn running(&self) -> usize {
        self.pods().map(|pods| pods.iter().filter(|(_, phase)| phase == "Running").count()).unwrap_or(0)
    }

    /// The process's CPU time in nanoseconds, threads that have exited included.
    pub(crate) fn cpu_ns(&self) -> u64 {
        cpu_ns_of(self.pid())
    }

    /// Resident memory in bytes.
    pub(crate) fn rss_bytes(&self) -> u64 {
        status_field(self.pid(), "VmRSS:").map_or(0, |kib| kib * 1024)
    }

    /// The anonymous part of the resident memory (heap, stacks) in bytes; the rest is file
    /// pages, mostly the binary's own code, shared with the page cache.
    pub(crate) fn rss_anon_bytes(&self) -> u64 {
        status_field(self.pid(), "RssAnon:").map_or(0, |kib| kib * 1024)
    }

    /// Threads.
    pub(crate) fn threads(&self) -> u64 {
        status_field(self.pid(), "Threads:").unwrap_or(0)
    }

    /// Open file descriptors.
    pub(crate) fn fds(&self) -> u64 {
        fs::read_dir(format!("/proc/{}/fd", self.pid())).map_or(0, |d| d.count() as u64)
    }

    /// A summary or histogram from `/metrics`: (sum, count).
    pub(crate) fn metric_sum_count(&self, name: &str) -> Result<(f64, f64)> {
        let (_, body) = get(&self.socket(), "/metrics")?;
        let value = |suffix: &str| {
            body.lines()
                .filter(|l| l.starts_with(&format!("{name}{suffix}")))
                .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
                .sum::<f64>()
        };
        Ok((value("_sum"), value("_count")))
    }

    /// A summary or histogram from `/metrics` by the value of its label `label`: (sum, count).
    pub(crate) fn metric_by_label(&self, name: &str, label: &str) -> Result<BTreeMap<String, (f64, f64)>> {
        let (_, body) = get(&self.socket(), "/metrics")?;
        let mut by_label: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        let quoted = format!("{label}=\"");
        for line in body.lines() {
            let Some(rest) = line.strip_prefix(name) else { continue };
            let (is_sum, rest) = match (rest.strip_prefix("_sum"), rest.strip_prefix("_count")) {
                (Some(rest), _) => (true, rest),
                (None, Some(rest)) => (false, rest),
                (None, None) => continue,
            };
            let Some((labels, value)) = rest.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let Some(of) = labels.split(&quoted).nth(1).and_then(|v| v.split('"').next()) else { continue };
            let entry = by_label.entry(of.to_owned()).or_default();
            if is_sum {
                entry.0 += value;
            } else {
                entry.1 += value;
            }
        }
        Ok(by_label)
    }

    /// Stops the agent (SIGSTOP) until the guard is dropped (SIGCONT): it holds its state and
    /// its connections, and touches nothing meanwhile.
    pub(crate) fn pause(&self) -> Paused {
        signal(self.pid(), "STOP");
        Paused { pid: self.pid() }
    }

    /// Waits until the agent used less than 2 % of a CPU over half a second, for at most
    /// `timeout` (then goes on: the figures after it show a busy agent).
    pub(crate) fn wait_quiet(&self, timeout: Duration) {
        let window = Duration::from_millis(500);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let before = self.cpu_ns();
            std::thread::sleep(window);
            if self.cpu_ns().saturating_sub(before) < 10_000_000 {
                return;
            }
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub(crate) fn stop(&mut self, grace: Duration) -> Result<()> {
        signal(self.pid(), "TERM");
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        println!("warning: the agent did not stop within {grace:?} of SIGTERM: killing it");
        self.kill();
        Ok(())
    }

    /// SIGKILL, as a crash would.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A paused agent ([`Agent::pause`]), resumed when this is dropped.
pub(crate) struct Paused {
    pid: u32,
}

impl Drop for Paused {
    fn drop(&mut self) {
        signal(self.pid, "CONT");
    }
}

impl Drop for Agent {
    /// An agent left running by an error is killed with the harness.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn signal(pid: u32, name: &str) {
    let _ = output(Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()));
}

/// The CPU time of process `pid` in nanoseconds, threads that have exited included: its CPU-time
/// clock (`clock_getcpuclockid`), which counts to the nanosecond where `/proc/PID/stat` counts
/// clock ticks and `/proc/PID/task/*/schedstat` forgets threads that ended.
pub(crate) fn cpu_ns_of(pid: u32) -> u64 {
    let pid = nix::unistd::Pid::from_raw(pid.cast_signed());
    let Ok(clock) = nix::time::clock_getcpuclockid(pid) else { return 0 };
    nix::time::clock_gettime(clock)
        .map_or(0, |t| u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec()).unwrap_or(0))
}

/// A numeric field of `/proc/<pid>/status` (the first number after `key`).
pub(crate) fn status_field(pid: u32, key: &str) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(key))?.split_whitespace().nth(1)?.parse().ok()
}

/// A GET on the agent's local API: status code and body.
pub(crate) fn get(socket: &Path, path: &str) -> Result<(u16, String)> {
    request(socket, "GET", path)
}

/// A `method` request to `path` on the agent's socket: the status and the body. HTTP/1.0, so the
/// body ends with the connection.
pub(crate) fn request(socket: &Path, method: &str, path: &str) -> Result<(u16, String)> {
    let mut stream = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").context("a response without a header end")?;
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("a response without a status")?;
    Ok((code, body.to_owned()))
}

/// One run of the floor, seconds.
#[derive(Debug)]
pub(crate) struct FloorRun {
    /// Every pod started.
    pub(crate) start: f64,
    /// Every pod stopped.
    pub(crate) stop: f64,
    /// The mean time of each start call, by its `operation_type` (`run_podsandbox`,
    /// `create_container`, `start_container`).
    pub(crate) calls: BTreeMap<String, f64>,
    /// The CPU seconds containerd used until every pod had started.
    pub(crate) runtime_cpu: f64,
}

/// The CRI tool.
pub(crate) struct CriTool {
    path: PathBuf,
}

/// A `cri_bench watch` in progress.
pub(crate) struct Watch {
    child: Child,
    stdout: std::io::BufReader<ChildStdout>,
}

impl Watch {
    /// Waits for the goal: the Unix time at which the tool saw it.
    pub(crate) fn wait(mut self, timeout: Duration) -> Result<f64> {
        use std::io::BufRead as _;
        let (tx, rx) = std::sync::mpsc::channel();
        let mut stdout = self.stdout;
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = stdout.read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(timeout);
        let _ = self.child.kill();
        let _ = self.child.wait();
        let line = line.map_err(|_| anyhow::anyhow!("the CRI watch did not reach its goal within {timeout:?}"))?;
        line.trim().parse().with_context(|| format!("the CRI watch ended without its goal: {line:?}"))
    }
}

impl CriTool {
    pub(crate) fn new(path: PathBuf) -> CriTool {
        CriTool { path }
    }

    /// The floor of `pods` pods, `parallel` at a time.
    pub(crate) fn floor(&self, pods: usize, parallel: usize, dir: &Path) -> Result<FloorRun> {
        let mut floor = Command::new(&self.path);
        floor.args([
            "floor",
            &endpoint(),
            "--image",
            &images::BUSYBOX.reference(),
            "--pods",
            &pods.to_string(),
            "--parallel",
            &parallel.to_string(),
            "--dir",
            &dir.display().to_string(),
        ]);
        if let Some(pid) = runtime::containerd_pid() {
            floor.args(["--runtime-pid", &pid.to_string()]);
        }
        let out = output(&mut floor)?;
        let json: serde_json::Value = serde_json::from_str(out.trim()).context("decoding the floor's figures")?;
        let calls = json["calls_s"]
            .as_object()
            .map(|calls| calls.iter().filter_map(|(name, s)| Some((name.clone(), s.as_f64()?))).collect())
            .unwrap_or_default();
        Ok(FloorRun {
            start: json["start_s"].as_f64().unwrap_or(f64::NAN),
            stop: json["stop_s"].as_f64().unwrap_or(f64::NAN),
            calls,
            runtime_cpu: json["runtime_cpu_start_s"].as_f64().unwrap_or(f64::NAN),
        })
    }

    /// Starts watching the harness namespace for `goal` (`--running N` or `--stopped`), and
    /// returns once the tool has had its first look.
    pub(crate) fn watch(&self, goal: &[&str]) -> Result<Watch> {
        let endpoint = endpoint();
        let mut args = vec!["watch", &endpoint, "--namespace", NAMESPACE];
        args.extend(goal);
        let (child, stdout) = self.start_until(&args, "watching", "the CRI watch")?;
        Ok(Watch { child, stdout })
    }

    /// Starts the tool with `args` and waits for its first line, which must be `ready`; the
    /// running tool and the rest of its output. `what` names it in the error.
    fn start_until(&self, args: &[&str], ready: &str, what: &str) -> Result<(Child, std::io::BufReader<ChildStdout>)> {
        use std::io::BufRead as _;
        let mut child = Command::new(&self.path).args(args).stdout(Stdio::piped()).stdin(Stdio::null()).spawn()?;
        let mut stdout = std::io::BufReader::new(child.stdout.take().context("the tool's stdout")?);
        let mut line = String::new();
        let read = stdout.read_line(&mut line);
        if read.is_err() || line.trim() != ready {
            let _ = child.kill();
            let _ = child.wait();
            read?;
            bail!("{what} failed to start: {line:?}");
        }
        Ok((child, stdout))
    }

    /// Stops every running container of the harness namespace at once; returns the Unix time the
    /// runtime confirmed it.
    pub(crate) fn kill_containers(&self) -> Result<f64> {
        let out = output(Command::new(&self.path).args(["kill", &endpoint(), "--namespace", NAMESPACE]))?;
        out.trim().parse().context("the time of the kill")
    }

    /// Stops and removes every sandbox of the harness namespace.
    pub(crate) fn remove_namespace(&self) -> Result<()> {
        self.remove_pods_of(NAMESPACE)
    }

    /// Stops and removes every sandbox of `namespace`.
    pub(crate) fn remove_pods_of(&self, namespace: &str) -> Result<()> {
        output(Command::new(&self.path).args(["clean", &endpoint(), "--namespace", namespace])).map(drop)
    }

    /// Every sandbox the runtime holds, ready or not, counted by its pod's namespace ("" for a
    /// sandbox without one).
    pub(crate) fn sandboxes_by_namespace(&self) -> Result<BTreeMap<String, usize>> {
        let out = output(Command::new(&self.path).args(["namespaces", &endpoint()]))?;
        serde_json::from_str(out.trim()).context("decoding the runtime's sandboxes by namespace")
    }

    /// `times` round trips of the runtime's own ExecSync (`true`) in a running container of the
    /// harness namespace, in seconds.
    pub(crate) fn exec_sync(&self, times: usize) -> Result<Vec<f64>> {
        let out = output(Command::new(&self.path).args([
            "exec",
            &endpoint(),
            "--namespace",
            NAMESPACE,
            "--times",
            &times.to_string(),
        ]))?;
        out.lines().map(|l| l.trim().parse().context("an ExecSync round trip")).collect()
    }

    /// Starts the probing floor on the harness namespace's pods (an httpGet on each of `ports`
    /// every second, an exec every 10 s per container) and returns once its probes run; they
    /// run until the [`ProbeFloor`] is dropped.
    pub(crate) fn probe(&self, ports: &[u16]) -> Result<ProbeFloor> {
        let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
        let args = ["probe", &endpoint(), "--namespace", NAMESPACE, "--ports", &ports.join(",")];
        let (child, _) = self.start_until(&args, "probing", "the probing floor")?;
        Ok(ProbeFloor { child })
    }

    /// The harness namespace's pods in the runtime, by UID.
    pub(crate) fn state(&self) -> Result<serde_json::Map<String, serde_json::Value>> {
        let out = output(Command::new(&self.path).args(["state", &endpoint(), "--namespace", NAMESPACE]))?;
        match serde_json::from_str(out.trim())? {
            serde_json::Value::Object(map) => Ok(map),
            other => bail!("unexpected state from the CRI tool: {other}"),
        }
    }
}

/// `cri_bench probe` running: the probing floor, stopped when dropped.
pub(crate) struct ProbeFloor {
    child: Child,
}

impl ProbeFloor {
    /// Its CPU time in nanoseconds.
    pub(crate) fn cpu_ns(&self) -> u64 {
        cpu_ns_of(self.child.id())
    }
}

impl Drop for ProbeFloor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}

/// The 1-minute load average.
pub(crate) fn load() -> f64 {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symbol_ordering_written_again_is_linked_under_a_new_name() {
        let root = std::env::temp_dir().join(format!("xtask-harness-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        assert_eq!(symbol_ordering(&root).unwrap(), None, "no list, no ordering");
        fs::create_dir_all(root.join("xtask")).unwrap();
        fs::write(root.join(crate::symbols::ORDER_FILE), "_ZN4main\n").unwrap();
        let first = symbol_ordering(&root).unwrap().unwrap();
        assert_eq!(fs::read_to_string(&first).unwrap(), "_ZN4main\n");
        assert_eq!(symbol_ordering(&root).unwrap(), Some(first.clone()), "the same list, the same name");
        fs::write(root.join(crate::symbols::ORDER_FILE), "_ZN4main\n_ZN4idle\n").unwrap();
        let second = symbol_ordering(&root).unwrap().unwrap();
        assert_ne!(first, second);
        assert_eq!(fs::read_to_string(&second).unwrap(), "_ZN4main\n_ZN4idle\n");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn listed_functions_are_found_by_their_exact_names_in_nm_output() {
        let nm = "0000000000401000 T _ZN4main17h0123456789abcdefE\n\
                  0000000000401100 t _ZN4idle17hfedcba9876543210E\n\
                                   U malloc\n";
        // The same function under another hash is not found: the linker could not place it.
        let list = "_ZN4main17h0123456789abcdefE\n_ZN4idle17h0000000000000000E\n\n";
        assert_eq!(listed_and_found(list, nm), (2, 1));
    }

    #[test]
    fn cpu_time_counts_threads_that_have_exited() {
        let before = cpu_ns_of(std::process::id());
        // The thread spins until it has used 200 ms of CPU by its own clock, however busy the
        // machine is (a wall-clock spin gets less CPU on a loaded machine).
        let busy = std::thread::spawn(|| {
            let own_clock = || nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
            let started = own_clock();
            let mut spins = 0u64;
            while Duration::from(own_clock() - started) < Duration::from_millis(200) {
                spins = std::hint::black_box(spins + 1);
            }
        });
        busy.join().unwrap();
        let after = cpu_ns_of(std::process::id());
        assert!(after - before >= 200_000_000, "{} ms counted of a thread's 200 ms", (after - before) / 1_000_000);
    }
}
