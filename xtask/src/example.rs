//! The example agent (`crates/sdk/examples/process_agent.rs`) run as a user runs it, on the real
//! CNI plugins (bridge, host-local, portmap): static pods in a fresh manifest directory must be
//! reported Running through its local API, a container restarted by its restart policy, a pod
//! answering on its IP and on its host port; once a manifest is removed (also while the agent
//! was down) nothing of the pod's network may be left: namespace, IPAM reservation, iptables
//! rules, veth.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::{
    harness,
    util::{output, project_root, run},
};

/// The network the example's pods join: a bridge of its own, a subnet no test uses.
const BRIDGE: &str = "krs-example0";
const SUBNET: &str = "10.254.31.0/24";
const GATEWAY: &str = "10.254.31.1";
const HOST_PORT: u16 = 18_931;
const NETNS_DIR: &str = "/run/netns";

const SLEEPER: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: sleeper}\nspec:\n  containers:\n  - {name: main, image: none, command: [sh, -c, 'sleep 1; exit 3']}\n";

/// A pod serving `dir` over HTTP on port 8000, published on the host as [`HOST_PORT`].
fn web_pod(dir: &Path) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  containers:\n  - name: httpd\n    image: none\n    \
         command: [busybox, httpd, -f, -p, '8000', -h, '{}']\n    ports: [{{containerPort: 8000, hostPort: {HOST_PORT}}}]\n",
        dir.display()
    )
}

fn conflist(ipam_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "kubelet-rs-example",
        "plugins": [
            {
                "type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": true,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET}]], "dataDir": ipam_dir},
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

/// The scratch directories of one run.
struct Scratch {
    manifests: PathBuf,
    root: PathBuf,
    net_d: PathBuf,
    ipam: PathBuf,
    www: PathBuf,
}

/// Builds the example, runs it on a scratch directory, and checks what its API reports and
/// what its pods' networks leave behind.
pub(crate) fn check() -> Result<()> {
    // As the tests' build makes it, which has made it already in CI: built alone, as the README's
    // `cargo run -p kubelet-sdk --features cni` does, it compiled 26 dependencies again with fewer
    // features (70 CPU-seconds at the end of CI's run). That build is checked by the package step,
    // which checks this example's source as a crate depending on the published kubelet-sdk.
    run(crate::ci::cargo().args(["build", "--workspace", "--example", "process_agent", "--locked"]))?;
    let dir = project_root()?.join("target/example-agent");
    let _ = fs::remove_dir_all(&dir);
    let scratch = Scratch {
        manifests: dir.join("manifests"),
        root: dir.join("root"),
        net_d: dir.join("net.d"),
        ipam: dir.join("ipam"),
        www: dir.join("www"),
    };
    for made in [&scratch.manifests, &scratch.net_d, &scratch.www] {
        fs::create_dir_all(made)?;
    }
    // A bridge an interrupted run left; its pods' networks the agent tears down at start.
    let _ = Command::new("ip").args(["link", "del", BRIDGE]).stderr(Stdio::null()).status();
    ensure!(
        !output(Command::new("ip").args(["-4", "route"]))?.contains("10.254.31."),
        "{SUBNET} is in use on this host"
    );
    fs::write(scratch.net_d.join("10-example.conflist"), conflist(&scratch.ipam))?;
    fs::write(scratch.www.join("index.html"), "served from the example's pod\n")?;
    fs::write(scratch.manifests.join("sleeper.yaml"), SLEEPER)?;
    fs::write(scratch.manifests.join("web.yaml"), web_pod(&scratch.www))?;

    let outcome = check_pods(&scratch);
    let _ = Command::new("ip").args(["link", "del", BRIDGE]).status();
    outcome
}

fn check_pods(scratch: &Scratch) -> Result<()> {
    let socket = scratch.root.join("kubelet-rs.sock");
    let mut agent = Agent::start(scratch)?;
    let restarted = wait(&socket, "sleeper-node-1", |pod| {
        pod["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1)
    })
    .context("the example's pod never ran and restarted (restartPolicy Always)")?;
    println!("example agent: sleeper restarted {} times", restarted["status"]["containerStatuses"][0]["restartCount"]);

    let web =
        wait(&socket, "web-node-1", |pod| pod["status"]["podIP"].is_string() && pod["status"]["phase"] == "Running")
            .context("the web pod never ran with an IP")?;
    let (uid, ip) =
        (web["metadata"]["uid"].as_str().unwrap_or_default(), web["status"]["podIP"].as_str().unwrap_or_default());
    ensure!(ip.starts_with("10.254.31."), "the web pod's IP {ip} is not from the network's subnet {SUBNET}");
    served(&format!("http://{ip}:8000/")).context("the web pod does not answer on its IP")?;
    served(&format!("http://{GATEWAY}:{HOST_PORT}/")).context("the web pod's host port does not forward")?;
    println!("example agent: web answers on {ip}:8000 and on host port {HOST_PORT}");
    let web_network = PodNetwork::of(uid, ip);
    web_network.check_present(scratch)?;

    fs::remove_file(scratch.manifests.join("web.yaml"))?;
    wait_gone(&socket, "web-node-1").context("the web pod was not removed with its manifest")?;
    web_network.wait_gone(scratch).context("after the web pod was removed")?;

    // The sleeper's manifest goes while the agent is down: its network must go at the next start.
    let sleeper =
        wait(&socket, "sleeper-node-1", |pod| pod["status"]["podIP"].is_string()).context("the sleeper has no IP")?;
    let sleeper_network = PodNetwork::of(
        sleeper["metadata"]["uid"].as_str().unwrap_or_default(),
        sleeper["status"]["podIP"].as_str().unwrap_or_default(),
    );
    agent.stop();
    fs::remove_file(scratch.manifests.join("sleeper.yaml"))?;
    sleeper_network.check_present(scratch).context("while the agent was down")?;
    let _agent = Agent::start(scratch)?;
    sleeper_network.wait_gone(scratch).context("a network whose pod went while the agent was down")?;
    let left = output(Command::new("ip").args(["-o", "link", "show", "master", BRIDGE]))?;
    ensure!(left.trim().is_empty(), "veths left on {BRIDGE}:\n{left}");
    println!("example agent: both pods' networks are gone, one torn down after a restart");
    Ok(())
}

/// The example agent, killed when dropped.
struct Agent(Child);

impl Agent {
    fn start(scratch: &Scratch) -> Result<Agent> {
        let binary = project_root()?.join("target/debug/examples/process_agent");
        let child = Command::new(&binary)
            .args([&scratch.manifests, &scratch.root, &scratch.net_d])
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Agent(child))
    }

    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a pod's network is made of on the host.
struct PodNetwork {
    sandbox: String,
    ip: String,
}

impl PodNetwork {
    fn of(uid: &str, ip: &str) -> Self {
        PodNetwork { sandbox: format!("network-{uid}"), ip: ip.to_owned() }
    }

    fn namespace(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.sandbox)
    }

    fn iptables_lines(&self) -> Result<Vec<String>> {
        let rules = output(Command::new("iptables-save").args(["-t", "nat"]))?;
        Ok(rules.lines().filter(|line| line.contains(&self.sandbox)).map(str::to_owned).collect())
    }

    /// The namespace, the address reservation and the NAT rules (masquerade, host port) exist.
    fn check_present(&self, scratch: &Scratch) -> Result<()> {
        ensure!(self.namespace().exists(), "no namespace {}", self.namespace().display());
        let reservation = scratch.ipam.join("kubelet-rs-example").join(&self.ip);
        ensure!(reservation.exists(), "no IPAM reservation {}", reservation.display());
        ensure!(!self.iptables_lines()?.is_empty(), "no iptables rules name {}", self.sandbox);
        Ok(())
    }

    /// Waits up to 30 s for [`check_gone`](Self::check_gone) to hold: the agent tears a pod's
    /// network down after the pod has left its pod list.
    fn wait_gone(&self, scratch: &Scratch) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.check_gone(scratch).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        self.check_gone(scratch)
    }

    /// Nothing is left: namespace, reservation, rules.
    fn check_gone(&self, scratch: &Scratch) -> Result<()> {
        ensure!(!self.namespace().exists(), "namespace {} is left", self.namespace().display());
        let reservation = scratch.ipam.join("kubelet-rs-example").join(&self.ip);
        ensure!(!reservation.exists(), "IPAM reservation {} is left", reservation.display());
        let rules = self.iptables_lines()?;
        ensure!(rules.is_empty(), "iptables rules are left:\n{}", rules.join("\n"));
        Ok(())
    }
}

/// Whether `url` serves the example's page.
fn served(url: &str) -> Result<()> {
    let body = output(Command::new("curl").args(["-sf", "--max-time", "5", url]))?;
    ensure!(body.contains("served from the example's pod"), "{url} answered {body:?}");
    Ok(())
}

/// The pod named `name` (a static pod's name ends with the node's) of the example's `/pods` once `done` holds for it, within 30 s.
fn wait(socket: &Path, name: &str, done: impl Fn(&Value) -> bool) -> Option<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(pod) = pod(socket, name)
            && done(&pod)
        {
            return Some(pod);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// Waits up to 30 s for the pod named `name` to leave the example's `/pods`.
fn wait_gone(socket: &Path, name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok((200, body)) = harness::get(socket, "/pods")
            && !body.contains(&format!("\"name\":\"{name}\""))
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("still listed after 30 s")
}

fn pod(socket: &Path, name: &str) -> Option<Value> {
    let (status, body) = harness::get(socket, "/pods").ok()?;
    let list: Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
    list["items"].as_array()?.iter().find(|pod| pod["metadata"]["name"] == name).cloned()
}
