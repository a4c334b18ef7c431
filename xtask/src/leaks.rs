//! What pods leave on the host, counted by kind, so a chaos scenario can say what it leaked:
//! network namespaces, IPAM reservations, veth interfaces, mounts, runtime shims and pod
//! cgroups.
//!
//! Each containerd of the project's ([`Instance`]) counts its own, so that one's pods coming and
//! going are never the other's leaks: the second's are those it can tell as its own (its
//! network namespaces, reservations, bridge's veths, mounts below its directories, shims, pod
//! cgroups under its agents' `cgroupRoot`), and the first's are all the others, so that its
//! checks miss nothing.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
    time::{Duration, Instant},
};

use crate::runtime::{Instance, instance};

/// The host objects of each kind, by name.
pub(crate) type HostObjects = BTreeMap<&'static str, BTreeSet<String>>;

/// Every kind of host object pods leave, as the host holds them now.
pub(crate) fn host_objects() -> HostObjects {
    BTreeMap::from([
        ("netns", network_namespaces()),
        ("IPAM", ipam_reservations()),
        ("veth", veths()),
        ("mounts", mounts()),
        ("shims", shims()),
        ("cgroups", pod_cgroups()),
    ])
}

/// What `now` holds that `baseline` did not, by kind (every kind listed, empty when clean).
pub(crate) fn leaked(baseline: &HostObjects, now: &HostObjects) -> BTreeMap<&'static str, Vec<String>> {
    now.iter()
        .map(|(kind, objects)| {
            let before = baseline.get(kind);
            let new = objects.iter().filter(|o| before.is_none_or(|b| !b.contains(*o))).cloned().collect();
            (*kind, new)
        })
        .collect()
}

/// Waits up to `settle` for the host to hold nothing beyond `baseline` (shims and veths go a
/// moment after their sandbox), and returns what it still holds then.
pub(crate) fn leaked_after(baseline: &HostObjects, settle: Duration) -> BTreeMap<&'static str, Vec<String>> {
    let deadline = Instant::now() + settle;
    loop {
        let leaks = leaked(baseline, &host_objects());
        if leaks.values().all(Vec::is_empty) || Instant::now() > deadline {
            return leaks;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Whether an object the second containerd does (`of_second`) or does not own is this process's
/// instance's.
fn ours(of_second: bool) -> bool {
    of_second == (instance() == Instance::Second)
}

/// Named network namespaces (containerd's `cni-<id>`).
fn network_namespaces() -> BTreeSet<String> {
    names_in(&instance().netns_dir(), |_| true)
}

/// The host-local IPAM plugin's reservations: one file per address under its data directory.
fn ipam_reservations() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let root = instance().state_dir().join("cni-ipam");
    for network in names_in(&root, |_| true) {
        let reserved = names_in(&root.join(&network), |n| n != "lock" && !n.starts_with("last_reserved_ip"));
        found.extend(reserved.into_iter().map(|ip| format!("{network}/{ip}")));
    }
    found
}

/// The host ends of pods' veth pairs: the second's are those on its bridge.
fn veths() -> BTreeSet<String> {
    let on_second_bridge = |name: &str| {
        let master = fs::read_link(Path::new("/sys/class/net").join(name).join("master")).ok();
        master.is_some_and(|m| m.file_name().is_some_and(|m| m == Instance::Second.bridge()))
    };
    names_in(Path::new("/sys/class/net"), |n| n.starts_with("veth") && ours(on_second_bridge(n)))
}

/// Mount points (field 5 of `/proc/self/mountinfo`): the second's are those below its
/// directories.
///
/// The netns directory itself is left out: the first `ip netns add` on a host (the CNI tests'
/// namespaces) bind-mounts `/run/netns` on itself to share it, and iproute2 keeps it so for the
/// host's life; a namespace left in it is still counted, as its own mount and as a name.
fn mounts() -> BTreeSet<String> {
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let second = Instance::Second.roots();
    let below_second = |mount: &str| second.iter().any(|root| Path::new(mount).starts_with(root));
    let netns_dir = instance().netns_dir();
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|m| ours(below_second(m)) && Path::new(m) != netns_dir)
        .map(str::to_owned)
        .collect()
}

/// Runtime shim processes, as `<pid> <id>` (the `-id` it serves): the second's are those
/// serving its socket.
fn shims() -> BTreeSet<String> {
    let is_shim = |pid: &str| {
        fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.starts_with("containerd-shim"))
    };
    let second = Instance::Second.socket().display().to_string();
    let pids = names_in(Path::new("/proc"), |n| n.bytes().all(|b| b.is_ascii_digit()) && is_shim(n));
    pids.into_iter()
        .filter(|pid| ours(shim_argument(pid, "-address").is_some_and(|a| a == second)))
        .map(|pid| format!("{pid} {}", shim_argument(&pid, "-id").unwrap_or_default()))
        .collect()
}

/// The argument after `flag` (`-id`, `-address`) in shim `pid`'s command line.
fn shim_argument(pid: &str, flag: &str) -> Option<String> {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned());
    args.by_ref().find(|a| a == flag)?;
    args.next()
}

/// Splits leaked shims (`<pid> <id>`) into those serving a container the runtime still holds
/// (`held`, by ID) and those it lost track of: containerd 1.6 keeps a shim running when a
/// RunPodSandbox is cancelled in flight or containerd dies during it, after logging "cleaning
/// up after shim disconnected" and forgetting the sandbox (containerd issues 6860, 8931, 9309).
/// No CRI call can see or stop such a shim.
pub(crate) fn split_lost_shims(leaked: Vec<String>, held: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    leaked.into_iter().partition(|shim| shim.split_once(' ').is_some_and(|(_, id)| held.contains(id)))
}

/// Splits leaked network namespaces into those a container of the runtime still uses
/// (`in_use`, by name) and those no container uses: made by a RunPodSandbox that containerd
/// died in, and forgotten by it on its return. No CRI call can see or remove them.
pub(crate) fn split_lost_netns(leaked: Vec<String>, in_use: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    leaked.into_iter().partition(|name| in_use.contains(name))
}

/// Whether mount point `mount` is the bind mount of one of the network namespaces `names` in
/// `netns_dir` (`/run/netns`, which is also `/var/run/netns`, for the first containerd).
pub(crate) fn is_netns_mount_of(mount: &str, names: &[String], netns_dir: &Path) -> bool {
    let mount = Path::new(mount);
    let dirs = [netns_dir.to_owned(), Path::new("/var").join(netns_dir.strip_prefix("/").unwrap_or(netns_dir))];
    let name = dirs.iter().find_map(|dir| mount.strip_prefix(dir).ok()).and_then(Path::to_str);
    name.is_some_and(|name| names.iter().any(|n| n == name))
}

/// Removes the network namespaces `names` of this process's instance (unmounted and deleted,
/// as `ip netns delete` does).
pub(crate) fn remove_netns(names: &[String]) {
    let dir = instance().netns_dir();
    for name in names {
        let path = dir.join(name);
        let _ = std::process::Command::new("umount").arg("--lazy").arg(&path).status();
        let _ = fs::remove_file(&path);
    }
}

/// Pod cgroups on the host, cgroup v1 (every controller) and v2:
/// `…/<cgroupRoot>/kubepods/[qos/]pod<uid>`, with the `cgroupRoot` of this process's instance's
/// agents.
pub(crate) fn pod_cgroups() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let kubepods = Path::new(instance().cgroup_root().trim_start_matches('/')).join("kubepods");
    let mut roots = vec![Path::new("/sys/fs/cgroup").join(&kubepods)];
    if let Ok(controllers) = fs::read_dir("/sys/fs/cgroup") {
        roots.extend(controllers.filter_map(Result::ok).map(|c| c.path().join(&kubepods)));
    }
    for root in roots {
        for dir in [root.clone(), root.join("besteffort"), root.join("burstable")] {
            let pods = names_in(&dir, |n| n.starts_with("pod") && dir.join(n).is_dir());
            found.extend(pods.into_iter().map(|pod| dir.join(pod).display().to_string()));
        }
    }
    found
}

/// The names in `dir` that `keep` accepts (none when `dir` cannot be read).
fn names_in(dir: &Path, keep: impl Fn(&str) -> bool) -> BTreeSet<String> {
    let Ok(entries) = fs::read_dir(dir) else { return BTreeSet::new() };
    entries.filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| keep(n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaked_lists_what_is_new_by_kind() {
        let baseline: HostObjects =
            BTreeMap::from([("netns", BTreeSet::from(["cni-a".to_owned()])), ("veth", BTreeSet::new())]);
        let now: HostObjects = BTreeMap::from([
            ("netns", BTreeSet::from(["cni-a".to_owned(), "cni-b".to_owned()])),
            ("veth", BTreeSet::new()),
        ]);
        let leaks = leaked(&baseline, &now);
        assert_eq!(leaks["netns"], vec!["cni-b".to_owned()]);
        assert!(leaks["veth"].is_empty());
        assert!(leaked(&now, &baseline).values().all(Vec::is_empty), "what went away is no leak");
    }

    #[test]
    fn netns_the_runtime_lost_and_their_mounts_are_told_apart() {
        let in_use = BTreeSet::from(["cni-a".to_owned()]);
        let (held, lost) = split_lost_netns(vec!["cni-a".to_owned(), "cni-b".to_owned()], &in_use);
        assert_eq!((held, lost.clone()), (vec!["cni-a".to_owned()], vec!["cni-b".to_owned()]));
        let first = Path::new("/run/netns");
        assert!(is_netns_mount_of("/run/netns/cni-b", &lost, first));
        assert!(is_netns_mount_of("/var/run/netns/cni-b", &lost, first));
        assert!(!is_netns_mount_of("/run/netns/cni-a", &lost, first));
        assert!(!is_netns_mount_of("/var/lib/kubelet/pods/cni-b", &lost, first));
        let second = Path::new("/run/second/netns");
        assert!(is_netns_mount_of("/run/second/netns/cni-b", &lost, second));
        assert!(!is_netns_mount_of("/run/netns/cni-b", &lost, second));
    }

    #[test]
    fn shims_the_runtime_lost_are_told_apart() {
        let held = BTreeSet::from(["abc".to_owned()]);
        let (held_shims, lost) = split_lost_shims(vec!["10 abc".to_owned(), "11 def".to_owned()], &held);
        assert_eq!((held_shims, lost), (vec!["10 abc".to_owned()], vec!["11 def".to_owned()]));
    }

    #[test]
    fn this_process_mounts_are_seen() {
        assert!(mounts().contains("/"), "the root mount is in the table");
    }
}
