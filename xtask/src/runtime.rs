//! `cargo xtask runtime start|stop|status`: the project's own containerd and image registry.
//!
//! Everything lives under project-owned paths (`/var/lib/kubelet-rs-dev`, `/run/kubelet-rs-dev`),
//! so it never touches a containerd the machine may run for itself.
//! Daemons are started by hand (there is no systemd), their PIDs written to files, and `stop`
//! stops only those PIDs.
//! The configuration follows `shared/reference/runtime-recipe.md`: `restrict_oom_score_adj`
//! (no CAP_SYS_RESOURCE here), cgroupfs, no AppArmor, Debian's `/usr/lib/cni`, a `hosts.toml`
//! for the plain-HTTP registry on 127.0.0.1.
//!
//! There are two containerds ([`Instance`]), sharing the registry: the first serves everything,
//! and the second lets CI run the chaos scenarios beside the real-runtime tests. An agent owns the
//! runtime it runs on (it removes the pods it did not make) and the pod cgroups under its
//! `cgroupRoot`, so each containerd has its own directories, socket, CNI network, image
//! filesystem and agents' `cgroupRoot`. An xtask process works on one of them, the first unless
//! it [`select`]s the second at its start.

use std::{
    fs,
    io::{Read, Write},
    net::TcpStream,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    images,
    layout::{REGISTRY, REGISTRY_PORT, RUN_DIR, STATE_DIR},
    util::{have, is_root, output},
};

/// One of the project's two containerds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Instance {
    /// Everything's, by default: the tests, the bench, the demo, the chaos scenarios.
    First,
    /// CI's chaos scenarios, beside the real-runtime tests on the first.
    Second,
}

impl Instance {
    /// Persistent state: containerd's root, its configuration, IPAM reservations.
    pub(crate) fn state_dir(self) -> PathBuf {
        match self {
            Instance::First => PathBuf::from(STATE_DIR),
            Instance::Second => PathBuf::from(format!("{STATE_DIR}-2")),
        }
    }

    /// Runtime state: the socket, containerd's and runc's state.
    fn run_dir(self) -> PathBuf {
        match self {
            Instance::First => PathBuf::from(RUN_DIR),
            Instance::Second => PathBuf::from(format!("{RUN_DIR}-2")),
        }
    }

    /// The CNI bridge of its pods.
    pub(crate) fn bridge(self) -> &'static str {
        match self {
            Instance::First => "kubeletrs0",
            Instance::Second => "kubeletrs1",
        }
    }

    /// Its pods' subnet: no route on the machine may cover it.
    fn subnet(self) -> &'static str {
        match self {
            Instance::First => "10.85.0.0/16",
            Instance::Second => "10.86.0.0/16",
        }
    }

    /// The `cgroupRoot` of the agents that run on it ("" is the host's root, upstream's default):
    /// an agent removes every pod cgroup under its own that it did not make.
    pub(crate) fn cgroup_root(self) -> &'static str {
        match self {
            Instance::First => "",
            Instance::Second => "/kubelet-rs-dev-2",
        }
    }

    fn daemon(self) -> &'static Daemon {
        match self {
            Instance::First => &CONTAINERD_DAEMON,
            Instance::Second => &SECOND_CONTAINERD_DAEMON,
        }
    }

    /// The filesystems it owns below its state directory, each a tmpfs of its own size:
    /// containerd's root (the image filesystem, `imagefs`) and, on the first, the tests' scratch
    /// directory (their agents' root directories, `nodefs`). Their free space is then the tests'
    /// own, not whatever the host's disk has left, so upstream's default eviction thresholds
    /// (`nodefs.available<10%`, `imagefs.available<15%`) never see pressure the tests did not
    /// make.
    fn own_filesystems(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Instance::First => &[IMAGE_FS, ("test", "4g")],
            Instance::Second => &[IMAGE_FS],
        }
    }

    /// The containerd socket.
    pub(crate) fn socket(self) -> PathBuf {
        self.run_dir().join("containerd.sock")
    }

    /// Where its network namespaces are mounted: the host's `/run/netns` for the first, as
    /// containerd does by default; the second's below its own state, so that each can tell its
    /// own apart.
    pub(crate) fn netns_dir(self) -> PathBuf {
        match self {
            Instance::First => PathBuf::from("/run/netns"),
            Instance::Second => self.run_dir().join("containerd/io.containerd.grpc.v1.cri/netns"),
        }
    }

    /// The directories everything of its pods is below, mounts included (its state and runtime
    /// state; the second's agents keep theirs below its state too).
    pub(crate) fn roots(self) -> [PathBuf; 2] {
        [self.state_dir(), self.run_dir()]
    }
}

/// The instance this process works on, once [`select`]ed.
static SELECTED: std::sync::OnceLock<Instance> = std::sync::OnceLock::new();

/// Makes `instance` the one this process works on, before it touches any.
pub(crate) fn select(instance: Instance) -> Result<()> {
    SELECTED.set(instance).map_err(|_| anyhow::anyhow!("the runtime instance was selected twice"))?;
    Ok(())
}

/// The instance this process works on: the first unless it [`select`]ed the second.
pub(crate) fn instance() -> Instance {
    SELECTED.get().copied().unwrap_or(Instance::First)
}

/// containerd's root below the state directory, the image filesystem, and its size.
const IMAGE_FS: (&str, &str) = ("containerd", "4g");

/// The runtime's image filesystem (containerd's root, a tmpfs of its own) and its size as
/// mounted.
pub(crate) fn image_fs() -> (PathBuf, &'static str) {
    (instance().state_dir().join(IMAGE_FS.0), IMAGE_FS.1)
}

/// The binaries the runtime needs (from `cargo xtask setup`).
const BINARIES: [&str; 6] = ["containerd", "containerd-shim-runc-v2", "ctr", "runc", "docker-registry", "skopeo"];

/// Where the daemons' PID files are, the second containerd's too.
fn pid_dir() -> PathBuf {
    PathBuf::from(RUN_DIR)
}

fn etc_dir() -> PathBuf {
    instance().state_dir().join("etc")
}

/// The containerd socket of the test runtime.
pub(crate) fn socket() -> PathBuf {
    instance().socket()
}

/// The PID of the test runtime's containerd, while it runs.
pub(crate) fn containerd_pid() -> Option<u32> {
    instance().daemon().running_pid()
}

/// The environment real-runtime tests read.
pub(crate) fn test_env() -> Vec<(&'static str, String)> {
    vec![
        ("KUBELET_RS_CRI_ENDPOINT", format!("unix://{}", socket().display())),
        ("KUBELET_RS_TEST_BUSYBOX", images::BUSYBOX.reference()),
        ("KUBELET_RS_TEST_PAUSE", images::PAUSE.reference()),
        ("KUBELET_RS_TEST_DIR", instance().state_dir().join("test").display().to_string()),
    ]
}

/// Why the runtime cannot be started here, if it cannot.
pub(crate) fn missing_prerequisites() -> Option<String> {
    if !is_root() {
        return Some("the real runtime needs root".to_owned());
    }
    let missing: Vec<&str> = BINARIES.iter().copied().filter(|b| !have(b)).collect();
    if !missing.is_empty() {
        return Some(format!("missing {} (run `cargo xtask setup` as root)", missing.join(", ")));
    }
    if !Path::new("/usr/lib/cni/bridge").is_file() {
        return Some("missing CNI plugins in /usr/lib/cni (run `cargo xtask setup`)".to_owned());
    }
    if !images::built() {
        return Some("test images are not built (run `cargo xtask setup`)".to_owned());
    }
    None
}

/// How large a daemon's log may grow before its next start sets it aside (containerd's, at
/// debug level, gained about 100 MB a day of tests and benches).
const LOG_KEPT_BYTES: u64 = 64 << 20;

/// Renames `log` to `<log>.1` (replacing the one set aside before) when it holds more than
/// `limit` bytes, so that a daemon's log holds its recent starts and the two never outgrow
/// twice the limit by much.
fn set_aside_if_large(log: &Path, limit: u64) -> Result<()> {
    let size = match fs::metadata(log) {
        Ok(metadata) => metadata.len(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err).with_context(|| format!("reading {}", log.display())),
    };
    if size > limit {
        let mut aside = log.as_os_str().to_owned();
        aside.push(".1");
        fs::rename(log, &aside).with_context(|| format!("setting {} aside", log.display()))?;
    }
    Ok(())
}

/// A daemon this project starts by hand and stops by the PID it wrote.
pub(crate) struct Daemon {
    name: &'static str,
    binary: &'static str,
}

const REGISTRY_DAEMON: Daemon = Daemon::new("registry", "docker-registry");
const CONTAINERD_DAEMON: Daemon = Daemon::new("containerd", "containerd");
const SECOND_CONTAINERD_DAEMON: Daemon = Daemon::new("containerd-2", "containerd");

impl Daemon {
    /// The daemon `name`, whose processes run `binary` (a file name, as in their `argv[0]`).
    pub(crate) const fn new(name: &'static str, binary: &'static str) -> Daemon {
        Daemon { name, binary }
    }

    /// The daemon's name.
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// Where the PID of the process started last is kept.
    pub(crate) fn pid_file(&self) -> PathBuf {
        pid_dir().join(format!("{}.pid", self.name))
    }

    pub(crate) fn log_file(&self) -> PathBuf {
        Path::new(STATE_DIR).join("log").join(format!("{}.log", self.name))
    }

    /// The PID we started, if that process still runs this daemon.
    pub(crate) fn running_pid(&self) -> Option<u32> {
        let pid: u32 = fs::read_to_string(self.pid_file()).ok()?.trim().parse().ok()?;
        process_runs(pid, self.binary).then_some(pid)
    }

    fn spawn(&self, args: &[&str]) -> Result<u32> {
        self.spawn_program(Path::new(self.binary), args)
    }

    /// Starts `program` (whose file name is the daemon's binary) with `args`, logging to
    /// [`Daemon::log_file`], and writes its PID.
    pub(crate) fn spawn_program(&self, program: &Path, args: &[&str]) -> Result<u32> {
        fs::create_dir_all(pid_dir())?;
        fs::create_dir_all(self.log_file().parent().context("log dir")?)?;
        set_aside_if_large(&self.log_file(), LOG_KEPT_BYTES)?;
        let log = fs::OpenOptions::new().create(true).append(true).open(self.log_file())?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // A process group of its own: a Ctrl-C in the terminal that ran xtask does not reach it.
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let pid = child.id();
        fs::write(self.pid_file(), format!("{pid}\n"))?;
        Ok(pid)
    }

    pub(crate) fn stop(&self) -> Result<()> {
        let Some(pid) = self.running_pid() else {
            let _ = fs::remove_file(self.pid_file());
            return Ok(());
        };
        signal(pid, "TERM")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_runs(pid, self.binary) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        if process_runs(pid, self.binary) {
            signal(pid, "KILL")?;
        }
        fs::remove_file(self.pid_file())?;
        println!("stopped {} (pid {pid})", self.name);
        Ok(())
    }

    /// SIGKILL, as a crash would, and waits until the process is gone.
    pub(crate) fn kill(&self) -> Result<()> {
        let Some(pid) = self.running_pid() else {
            bail!("{} is not running", self.name);
        };
        signal(pid, "KILL")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_runs(pid, self.binary) {
            if Instant::now() > deadline {
                bail!("{} (pid {pid}) still runs 10 s after SIGKILL", self.name);
            }
            thread::sleep(Duration::from_millis(20));
        }
        fs::remove_file(self.pid_file())?;
        println!("killed {} (pid {pid})", self.name);
        Ok(())
    }
}

/// Whether `pid` is alive (not a zombie) and runs `binary`.
fn process_runs(pid: u32, binary: &str) -> bool {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let zombie = fs::read_to_string(proc_dir.join("stat"))
        .map(|s| s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(true);
    let cmdline = fs::read(proc_dir.join("cmdline")).unwrap_or_default();
    let argv0 = cmdline.split(|b| *b == 0).next().map(String::from_utf8_lossy).unwrap_or_default();
    !zombie && Path::new(argv0.as_ref()).file_name().is_some_and(|n| n == binary)
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    output(Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string())).map(drop)
}

pub(crate) fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !ready() {
        if Instant::now() > deadline {
            bail!("{what} did not become ready within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn registry_answers() -> bool {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], REGISTRY_PORT));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"GET /v2/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}

fn containerd_answers() -> bool {
    socket().exists() && output(Command::new("ctr").arg("--address").arg(socket()).arg("version")).is_ok()
}

fn ipv4_range(cidr: &str) -> Option<(u32, u32)> {
    let (addr, len) = cidr.split_once('/').unwrap_or((cidr, "32"));
    let addr: std::net::Ipv4Addr = addr.parse().ok()?;
    let len: u32 = len.parse().ok().filter(|l| *l <= 32)?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    let start = u32::from(addr) & mask;
    Some((start, start | !mask))
}

/// Fails when an existing route (other than the default and our bridge's) overlaps the pod subnet.
fn check_subnet() -> Result<()> {
    let (subnet, bridge) = (instance().subnet(), instance().bridge());
    let (ours_start, ours_end) = ipv4_range(subnet).context("pod subnet")?;
    for line in output(Command::new("ip").args(["-4", "route", "show"]))?.lines() {
        let mut words = line.split_whitespace();
        let Some(dest) = words.next() else { continue };
        if dest == "default" || line.contains(&format!("dev {bridge}")) {
            continue;
        }
        if let Some((start, end)) = ipv4_range(dest)
            && start <= ours_end
            && ours_start <= end
        {
            bail!("the route `{line}` overlaps the test pod subnet {subnet}; refusing to start");
        }
    }
    Ok(())
}

fn write_config() -> Result<PathBuf> {
    let this = instance();
    let etc = etc_dir();
    let certs = etc.join("certs.d").join(REGISTRY);
    fs::create_dir_all(&certs)?;
    fs::create_dir_all(etc.join("net.d"))?;
    fs::write(
        certs.join("hosts.toml"),
        format!(
            "server = \"http://{REGISTRY}\"\n[host.\"http://{REGISTRY}\"]\n  capabilities = [\"pull\", \"resolve\", \"push\"]\n  skip_verify = true\n"
        ),
    )?;
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "kubelet-rs",
        "plugins": [
            {
                "type": "bridge",
                "bridge": this.bridge(),
                "isGateway": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": this.subnet() }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": this.state_dir().join("cni-ipam"),
                },
            },
            { "type": "portmap", "capabilities": { "portMappings": true } },
        ],
    });
    fs::write(etc.join("net.d/10-kubelet-rs.conflist"), serde_json::to_vec_pretty(&conflist)?)?;
    fs::write(
        etc.join("registry.yml"),
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {STATE_DIR}/registry\n  delete:\n    enabled: true\nhttp:\n  addr: {REGISTRY}\n  secret: kubelet-rs-dev-only\n"
        ),
    )?;
    let runc = output(Command::new("sh").args(["-c", "command -v runc"]))?.trim().to_owned();
    let (state, run) = (this.state_dir().display().to_string(), this.run_dir().display().to_string());
    let config = format!(
        r#"version = 2
root = "{state}/containerd"
state = "{run}/containerd"
[grpc]
  address = "{run}/containerd.sock"
[ttrpc]
  address = "{run}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  disable_hugetlb_controller = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = {netns_under_state}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
        Root = "{run}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{etc}/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{etc}/certs.d"
"#,
        pause = images::PAUSE.reference(),
        etc = etc.display(),
        netns_under_state = this == Instance::Second,
    );
    let path = etc.join("containerd.toml");
    fs::write(&path, config)?;
    Ok(path)
}

/// Starts the registry and containerd unless they already run; returns whether it started anything.
/// The second containerd pulls from the registry the first one's start runs, and starts no
/// registry of its own.
pub(crate) fn start() -> Result<bool> {
    if let Some(why) = missing_prerequisites() {
        bail!("cannot start the test runtime: {why}");
    }
    let this = instance();
    fs::create_dir_all(this.run_dir())?;
    if this.daemon().running_pid().is_none() {
        mount_own_filesystems()?;
        mount_hugetlb_hierarchy()?;
    }
    let mut started = false;

    if let Some(pid) = REGISTRY_DAEMON.running_pid() {
        println!("registry already running (pid {pid})");
    } else if this == Instance::Second {
        bail!("the second containerd pulls from the first one's registry, which is not running: start it first");
    } else {
        if registry_answers() {
            bail!("something else already listens on {REGISTRY}; stop it or free the port");
        }
        write_config()?;
        let config = etc_dir().join("registry.yml");
        let pid = REGISTRY_DAEMON.spawn(&["serve", &config.to_string_lossy()])?;
        wait_until("the registry", Duration::from_secs(15), registry_answers)
            .with_context(|| format!("see {}", REGISTRY_DAEMON.log_file().display()))?;
        println!("started registry on {REGISTRY} (pid {pid})");
        started = true;
    }

    if let Some(pid) = this.daemon().running_pid() {
        println!("{} already running (pid {pid})", this.daemon().name);
    } else {
        start_containerd()?;
        started = true;
    }

    if started {
        images::import(&socket())?;
        if this == Instance::First {
            images::push()?;
        }
    }
    Ok(started)
}

/// Starts containerd alone (the registry and the images are already there).
pub(crate) fn start_containerd() -> Result<()> {
    check_subnet()?;
    let config = write_config()?;
    // A socket left by a daemon that died would make the readiness check pass too early.
    let _ = fs::remove_file(socket());
    let daemon = instance().daemon();
    let pid = daemon.spawn(&["--config", &config.to_string_lossy()])?;
    wait_until("containerd", Duration::from_secs(30), containerd_answers)
        .with_context(|| format!("see {}", daemon.log_file().display()))?;
    println!("started containerd on {} (pid {pid})", socket().display());
    Ok(())
}

/// Stops containerd alone, as an outage would: its containers keep running under their shims.
pub(crate) fn stop_containerd() -> Result<()> {
    instance().daemon().stop()
}

/// The IDs of every container (sandboxes included) containerd holds in the CRI namespace.
pub(crate) fn container_ids() -> std::collections::BTreeSet<String> {
    let listed =
        output(Command::new("ctr").arg("--address").arg(socket()).args(["-n", "k8s.io", "containers", "ls", "-q"]));
    listed.unwrap_or_default().lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

/// The named network namespaces (`cni-<id>`) the runtime's containers use, from their specs.
pub(crate) fn network_namespaces_in_use() -> std::collections::BTreeSet<String> {
    let mut in_use = std::collections::BTreeSet::new();
    for id in container_ids() {
        let info = output(Command::new("ctr").arg("--address").arg(socket()).args([
            "-n",
            "k8s.io",
            "containers",
            "info",
            &id,
        ]));
        let Ok(info) = serde_json::from_str::<serde_json::Value>(&info.unwrap_or_default()) else { continue };
        for namespace in info["Spec"]["linux"]["namespaces"].as_array().into_iter().flatten() {
            if namespace["type"] == "network"
                && let Some(name) = namespace["path"].as_str().and_then(|p| p.rsplit('/').next())
                && name.starts_with("cni-")
            {
                in_use.insert(name.to_owned());
            }
        }
    }
    in_use
}

/// Kills containerd with SIGKILL, as a crash would: its containers keep running under their
/// shims.
pub(crate) fn kill_containerd() -> Result<()> {
    instance().daemon().kill()
}

/// The CNI configuration directory containerd reads.
pub(crate) fn cni_conf_dir() -> PathBuf {
    etc_dir().join("net.d")
}

/// Stops the daemons this project started (by PID), containerd first; the registry with the
/// first containerd.
pub(crate) fn stop() -> Result<()> {
    let this = instance();
    if this.daemon().running_pid().is_some() {
        let leftovers =
            output(Command::new("ctr").arg("--address").arg(socket()).args(["-n", "k8s.io", "tasks", "ls", "-q"]))
                .unwrap_or_default();
        let leftovers: Vec<&str> = leftovers.lines().filter(|l| !l.trim().is_empty()).collect();
        if !leftovers.is_empty() {
            println!("warning: {} containers still run in the test runtime; killing them", leftovers.len());
            for id in leftovers {
                let _ = output(
                    Command::new("ctr")
                        .arg("--address")
                        .arg(socket())
                        .args(["-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id]),
                );
            }
        }
    }
    this.daemon().stop()?;
    stop_shims();
    // What the runtime and the tests leave on the host: the CNI bridge and the tests' scratch
    // files (containers, sandboxes and images stay in the state directory for the next start).
    if Path::new("/sys/class/net").join(this.bridge()).exists() {
        let _ = output(Command::new("ip").args(["link", "delete", this.bridge()]));
    }
    unmount_own_filesystems();
    // The tests' agents are gone with the runtime: the QoS cgroups they made (a node's kubelet
    // keeps its own) go too, where nothing is left in them.
    remove_cgroup_root(this.cgroup_root());
    if this == Instance::Second {
        return Ok(());
    }
    REGISTRY_DAEMON.stop()?;
    unmount_hugetlb_hierarchy();
    let scratch = this.state_dir().join("test");
    if scratch.exists() {
        fs::remove_dir_all(&scratch).with_context(|| format!("cannot remove {}", scratch.display()))?;
    }
    Ok(())
}

/// Removes the empty cgroups of the QoS hierarchy the agents made under `root` in every
/// controller, and `root` itself unless it is the hierarchy's (the first's agents use upstream's
/// `/kubepods`).
fn remove_cgroup_root(root: &str) {
    let Ok(controllers) = fs::read_dir("/sys/fs/cgroup") else { return };
    let root = root.trim_start_matches('/');
    for controller in controllers.filter_map(Result::ok) {
        let kubepods = controller.path().join(root).join("kubepods");
        for dir in [kubepods.join("besteffort"), kubepods.join("burstable"), kubepods] {
            let _ = fs::remove_dir(dir);
        }
        if !root.is_empty() {
            let _ = fs::remove_dir(controller.path().join(root));
        }
    }
}

/// Mounts [`Instance::own_filesystems`] where they are not mounted yet.
fn mount_own_filesystems() -> Result<()> {
    for (dir, size) in instance().own_filesystems() {
        let path = instance().state_dir().join(dir);
        fs::create_dir_all(&path)?;
        if is_mount_point(&path) {
            continue;
        }
        crate::util::run(
            Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs"]).arg(&path),
        )
        .with_context(|| format!("cannot mount the runtime's own filesystem on {}", path.display()))?;
    }
    Ok(())
}

/// Unmounts [`Instance::own_filesystems`]; one still held by a process that outlived the runtime
/// is detached now and freed when it lets go.
fn unmount_own_filesystems() {
    for (dir, _) in instance().own_filesystems() {
        let path = instance().state_dir().join(dir);
        if !is_mount_point(&path) {
            continue;
        }
        if output(Command::new("umount").arg(&path)).is_err() {
            println!("warning: {} is busy; detaching it", path.display());
            let _ = output(Command::new("umount").arg("--lazy").arg(&path));
        }
    }
}

/// Where the hugetlb controller's cgroup v1 hierarchy goes when the host has not mounted it.
const HUGETLB_HIERARCHY: &str = "/sys/fs/cgroup/hugetlb";

/// The file saying that [`HUGETLB_HIERARCHY`] was mounted here, and so is unmounted at stop.
fn hugetlb_marker() -> PathBuf {
    pid_dir().join("hugetlb-mounted")
}

/// On a cgroup v1 host whose kernel has the hugetlb controller unmounted (a host without systemd
/// mounts only what its init asked for), mounts its hierarchy before containerd starts: containerd
/// checks once, at start, whether it can apply huge page limits, and the agent writes pods'
/// huge page limits only where the hierarchy is.
fn mount_hugetlb_hierarchy() -> Result<()> {
    let unified = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let cgroups = fs::read_to_string("/proc/cgroups").unwrap_or_default();
    // `/proc/cgroups` rows: name, hierarchy ID, cgroups, enabled.
    let enabled = cgroups.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.first() == Some(&"hugetlb") && fields.get(3) == Some(&"1")
    });
    // A v1 hierarchy's mount options (the last field of its mountinfo line) name its controllers.
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounted = mounts.lines().any(|line| {
        let options = line.rsplit(' ').next().unwrap_or_default();
        line.contains(" - cgroup ") && options.split(',').any(|option| option == "hugetlb")
    });
    if unified || !enabled || mounted {
        return Ok(());
    }
    fs::create_dir_all(HUGETLB_HIERARCHY)?;
    crate::util::run(Command::new("mount").args(["-t", "cgroup", "-o", "hugetlb", "cgroup", HUGETLB_HIERARCHY]))
        .context("cannot mount the hugetlb cgroup hierarchy")?;
    fs::write(hugetlb_marker(), "")?;
    println!("mounted the hugetlb cgroup hierarchy on {HUGETLB_HIERARCHY}");
    Ok(())
}

/// Unmounts the hugetlb hierarchy [`mount_hugetlb_hierarchy`] mounted.
fn unmount_hugetlb_hierarchy() {
    if !hugetlb_marker().exists() {
        return;
    }
    if is_mount_point(Path::new(HUGETLB_HIERARCHY)) && output(Command::new("umount").arg(HUGETLB_HIERARCHY)).is_err() {
        println!("warning: {HUGETLB_HIERARCHY} is busy; detaching it");
        let _ = output(Command::new("umount").arg("--lazy").arg(HUGETLB_HIERARCHY));
    }
    let _ = fs::remove_dir(HUGETLB_HIERARCHY);
    let _ = fs::remove_file(hugetlb_marker());
}

/// Whether `path` is a mount point (field 5 of `/proc/self/mountinfo`).
pub(crate) fn is_mount_point(path: &Path) -> bool {
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table.lines().any(|line| line.split(' ').nth(4) == Some(&*path.to_string_lossy()))
}

/// Stops the runc shims of the test containerd that outlived it: containerd leaves a shim running
/// when it stops before the shim's task is deleted (an outage in `chaos`, a stop after a failure).
/// Only shims started for this project's socket are touched.
fn stop_shims() {
    let address = socket().display().to_string();
    let Ok(procs) = fs::read_dir("/proc") else { return };
    let mut stopped = 0;
    for entry in procs.filter_map(Result::ok) {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_shim = args.first().is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"));
        let ours = args.windows(2).any(|w| w[0] == b"-address" && w[1] == address.as_bytes());
        if is_shim && ours && signal(pid, "KILL").is_ok() {
            stopped += 1;
        }
    }
    if stopped > 0 {
        println!("stopped {stopped} runc shim(s) the test containerd left");
    }
}

/// How many containers (sandboxes included) the test containerd holds.
pub(crate) fn container_count() -> usize {
    output(Command::new("ctr").arg("--address").arg(socket()).args(["-n", "k8s.io", "containers", "ls", "-q"]))
        .map(|out| out.lines().filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(0)
}

/// Whether the test containerd we started is running.
pub(crate) fn containerd_running() -> bool {
    instance().daemon().running_pid().is_some()
}

/// Prints what runs.
pub(crate) fn status() -> Result<()> {
    if let Some(why) = missing_prerequisites() {
        println!("prerequisites: {why}");
    }
    for daemon in [&CONTAINERD_DAEMON, &SECOND_CONTAINERD_DAEMON, &REGISTRY_DAEMON] {
        match daemon.running_pid() {
            Some(pid) => println!("{}: running (pid {pid}), log {}", daemon.name, daemon.log_file().display()),
            None => println!("{}: not running", daemon.name),
        }
    }
    if containerd_answers() {
        println!("endpoint: unix://{}", socket().display());
        let tasks =
            output(Command::new("ctr").arg("--address").arg(socket()).args(["-n", "k8s.io", "tasks", "ls", "-q"]))?;
        println!("running containers: {}", tasks.lines().filter(|l| !l.trim().is_empty()).count());
    }
    println!("registry {}: {}", REGISTRY, if registry_answers() { "answering" } else { "not answering" });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_port_matches_address() {
        assert_eq!(REGISTRY, format!("127.0.0.1:{REGISTRY_PORT}"));
    }

    #[test]
    fn a_daemons_log_is_set_aside_once_it_outgrows_the_limit() {
        let dir = std::env::temp_dir().join(format!("xtask-log-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.join("containerd.log");
        set_aside_if_large(&log, 10).unwrap();
        assert!(!log.exists(), "no log yet: nothing to do");
        fs::write(&log, "0123456789").unwrap();
        set_aside_if_large(&log, 10).unwrap();
        assert_eq!(fs::read_to_string(&log).unwrap(), "0123456789", "at the limit, kept");
        fs::write(&log, "0123456789a").unwrap();
        set_aside_if_large(&log, 10).unwrap();
        assert!(!log.exists());
        assert_eq!(fs::read_to_string(dir.join("containerd.log.1")).unwrap(), "0123456789a");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cidr_ranges() {
        assert_eq!(ipv4_range("10.85.0.0/16"), Some((0x0a55_0000, 0x0a55_ffff)));
        assert_eq!(ipv4_range("10.85.3.4"), Some((0x0a55_0304, 0x0a55_0304)));
        assert_eq!(ipv4_range("0.0.0.0/0"), Some((0, u32::MAX)));
        assert_eq!(ipv4_range("nonsense"), None);
    }
}
