//! What pods leave on the host, counted by kind, so a chaos scenario can say what it leaked:
//! network namespaces, IPAM reservations, veth interfaces, mounts, runtime shims and pod
//! cgroups.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::layout::STATE_DIR;

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

/// Named network namespaces (containerd's `cni-<id>`).
fn network_namespaces() -> BTreeSet<String> {
    names_in(Path::new("/var/run/netns"), |_| true)
}

/// The host-local IPAM plugin's reservations: one file per address under its data directory.
fn ipam_reservations() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let root = Path::new(STATE_DIR).join("cni-ipam");
    for network in names_in(&root, |_| true) {
        let reserved = names_in(&root.join(&network), |n| n != "lock" && !n.starts_with("last_reserved_ip"));
        found.extend(reserved.into_iter().map(|ip| format!("{network}/{ip}")));
    }
    found
}

/// The host ends of pods' veth pairs.
fn veths() -> BTreeSet<String> {
    names_in(Path::new("/sys/class/net"), |n| n.starts_with("veth"))
}

/// Mount points (field 5 of `/proc/self/mountinfo`).
fn mounts() -> BTreeSet<String> {
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table.lines().filter_map(|line| line.split(' ').nth(4)).map(str::to_owned).collect()
}

/// Runtime shim processes, as `<pid> <id>` (the `-id` it serves).
fn shims() -> BTreeSet<String> {
    let is_shim = |pid: &str| {
        fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.starts_with("containerd-shim"))
    };
    let pids = names_in(Path::new("/proc"), |n| n.bytes().all(|b| b.is_ascii_digit()) && is_shim(n));
    pids.into_iter().map(|pid| format!("{pid} {}", shim_id(&pid).unwrap_or_default())).collect()
}

/// The `-id` argument of shim `pid`.
fn shim_id(pid: &str) -> Option<String> {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned());
    args.by_ref().find(|a| a == "-id")?;
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

/// Whether mount point `mount` is the bind mount of one of the network namespaces `names`.
pub(crate) fn is_netns_mount_of(mount: &str, names: &[String]) -> bool {
    let name = mount.strip_prefix("/var/run/netns/").or_else(|| mount.strip_prefix("/run/netns/"));
    name.is_some_and(|name| names.iter().any(|n| n == name))
}

/// Removes the network namespaces `names` (unmounted and deleted, as `ip netns delete` does).
pub(crate) fn remove_netns(names: &[String]) {
    for name in names {
        let _ = std::process::Command::new("ip").args(["netns", "delete", name]).status();
    }
}

/// Pod cgroups on the host, cgroup v1 (every controller) and v2: `…/kubepods/[qos/]pod<uid>`.
pub(crate) fn pod_cgroups() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut roots = vec![PathBuf::from("/sys/fs/cgroup/kubepods")];
    if let Ok(controllers) = fs::read_dir("/sys/fs/cgroup") {
        roots.extend(controllers.filter_map(Result::ok).map(|c| c.path().join("kubepods")));
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
        assert!(is_netns_mount_of("/run/netns/cni-b", &lost));
        assert!(is_netns_mount_of("/var/run/netns/cni-b", &lost));
        assert!(!is_netns_mount_of("/run/netns/cni-a", &lost));
        assert!(!is_netns_mount_of("/var/lib/kubelet/pods/cni-b", &lost));
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
