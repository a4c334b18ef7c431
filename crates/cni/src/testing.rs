//! Helpers for tests and benchmarks against the real plugins (feature `test-util`).
//!
//! [`RealPlugins::from_env`] says whether the machine can run them (root, `ip`, the plugin
//! binaries): outside CI a missing prerequisite skips the test with a message; under CI
//! (`CI=true`) it fails the test. [`Netns`] and [`NatSnapshot`] clean up what a test creates.

// Reason: test helpers fail the test that uses them on broken setup, with a message.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

use ipnet::{IpNet, Ipv4Net};

/// Where the plugins are when `KUBELET_RS_CNI_PATH` does not say: Debian's package puts them here.
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/lib/cni";

/// The environment variable naming the plugin directory for tests.
pub const ENV_CNI_PATH: &str = "KUBELET_RS_CNI_PATH";

/// The real plugins, found and usable.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RealPlugins {
    /// The directory holding the plugin binaries.
    pub dir: PathBuf,
}

impl RealPlugins {
    /// The plugins, if this machine can run them; otherwise prints why `test` is skipped and
    /// returns `None`, or panics under CI.
    pub fn from_env(test: &str) -> Option<Self> {
        let dir = PathBuf::from(std::env::var_os(ENV_CNI_PATH).unwrap_or_else(|| DEFAULT_PLUGIN_DIR.into()));
        let why = if !nix_is_root() {
            Some("not root (network namespaces and bridges need root)".to_owned())
        } else if !dir.join("bridge").exists() || !dir.join("loopback").exists() {
            Some(format!("no CNI plugins in {} (Debian package containernetworking-plugins)", dir.display()))
        } else if Command::new("ip").arg("-V").output().is_err() {
            Some("no `ip` command (Debian package iproute2)".to_owned())
        } else {
            None
        };
        match why {
            None => Some(RealPlugins { dir }),
            Some(why) => {
                let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
                assert!(
                    !ci,
                    "{test}: CI=true but the real CNI plugins cannot run: {why}; run `cargo xtask setup` as root"
                );
                println!("SKIPPED {test}: {why}");
                None
            }
        }
    }
}

fn nix_is_root() -> bool {
    // /proc/self/status is readable everywhere and needs no unsafe call.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

/// Runs a command and returns its stdout; panics with its stderr when it fails.
pub fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(output.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Whether a command succeeds.
pub fn succeeds(command: &mut Command) -> bool {
    command.output().is_ok_and(|o| o.status.success())
}

/// A network namespace made with `ip netns add`, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `<prefix>-<pid>-<n>`, a name no other test process uses.
    pub fn create(prefix: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        run(Command::new("ip").args(["netns", "add", &name]));
        Netns { name }
    }

    /// The namespace name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its path, as `CNI_NETNS` takes it.
    pub fn path(&self) -> PathBuf {
        Path::new("/var/run/netns").join(&self.name)
    }

    /// Runs a command inside the namespace and returns its stdout.
    pub fn exec(&self, args: &[&str]) -> String {
        run(Command::new("ip").args(["netns", "exec", &self.name]).args(args))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// An IPv4 `/24` that no route of this machine covers or falls into, from `10.213.0.0/16`.
pub fn free_subnet() -> Ipv4Net {
    let routes = run(Command::new("ip").args(["-4", "-o", "route", "show", "table", "all"]));
    let taken: Vec<Ipv4Net> = routes
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let first = words.next()?;
            // `local 10.0.0.1 ...`, `broadcast ...`: the route type comes first.
            let dst =
                if matches!(first, "local" | "broadcast" | "unicast" | "multicast") { words.next()? } else { first };
            if dst == "default" {
                return None;
            }
            dst.parse::<Ipv4Net>().ok().or_else(|| dst.parse::<Ipv4Addr>().ok().map(Ipv4Net::from))
        })
        .collect();
    (0..=255u8)
        .map(|third| Ipv4Net::new(Ipv4Addr::new(10, 213, third, 0), 24).expect("a /24 is a valid prefix"))
        .find(|candidate| taken.iter().all(|route| !overlaps(candidate, route)))
        .expect("every 10.213.x.0/24 is covered by a route")
}

fn overlaps(a: &Ipv4Net, b: &Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Whether an address is inside a subnet.
pub fn in_subnet(address: &IpNet, subnet: &Ipv4Net) -> bool {
    match address.addr() {
        std::net::IpAddr::V4(a) => subnet.contains(&a),
        std::net::IpAddr::V6(_) => false,
    }
}

/// The `nat` table's rules and chains at one moment, to remove what a test added.
#[derive(Debug, Clone)]
pub struct NatSnapshot(BTreeSet<String>);

impl NatSnapshot {
    /// The current `iptables -t nat -S` lines.
    pub fn take() -> Self {
        NatSnapshot(nat_lines())
    }

    /// The lines added since the snapshot.
    pub fn added(&self) -> Vec<String> {
        nat_lines().difference(&self.0).cloned().collect()
    }

    /// Deletes the rules, then the chains, added since the snapshot (portmap leaves its shared
    /// `CNI-HOSTPORT-*` chains behind by design).
    pub fn remove_added(&self) {
        let added = self.added();
        for rule in added.iter().filter(|l| l.starts_with("-A ")) {
            let mut args: Vec<String> = shell_words(rule);
            args[0] = "-D".to_owned();
            let _ = Command::new("iptables").args(["-t", "nat"]).args(&args).output();
        }
        for chain in added.iter().filter_map(|l| l.strip_prefix("-N ")) {
            let _ = Command::new("iptables").args(["-t", "nat", "-F", chain]).output();
            let _ = Command::new("iptables").args(["-t", "nat", "-X", chain]).output();
        }
    }
}

fn nat_lines() -> BTreeSet<String> {
    match Command::new("iptables").args(["-t", "nat", "-S"]).output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).lines().map(str::to_owned).collect(),
        _ => BTreeSet::new(),
    }
}

/// Splits an `iptables -S` line into arguments, honouring double quotes (comments).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !current.is_empty() {
                    words.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_lines_split_like_a_shell() {
        assert_eq!(
            shell_words(
                r#"-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ"#
            ),
            [
                "-A",
                "POSTROUTING",
                "-m",
                "comment",
                "--comment",
                "CNI portfwd requiring masquerade",
                "-j",
                "CNI-HOSTPORT-MASQ"
            ]
        );
    }

    #[test]
    fn overlap_both_ways() {
        let a: Ipv4Net = "10.213.5.0/24".parse().unwrap();
        assert!(overlaps(&a, &"10.0.0.0/8".parse().unwrap()));
        assert!(overlaps(&a, &"10.213.5.7/32".parse().unwrap()));
        assert!(!overlaps(&a, &"10.213.6.0/24".parse().unwrap()));
    }
}
