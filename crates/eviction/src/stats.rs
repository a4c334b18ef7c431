//! Where the signals and the pods' use come from: [`StatsProvider`], and [`HostStats`], which
//! reads this host (`/proc`, the cgroup hierarchy, the root directory's filesystem) and the
//! runtime (`ImageFsInfo`, `ListContainerStats`), as upstream's summary provider does.
//!
//! The node's signals cost a handful of reads per round whatever the number of pods; the pods'
//! use is read only when the manager needs it: memory when memory is short, disk when disk is
//! short or for the pods with local storage limits.

use std::{
    collections::HashSet,
    future::Future,
    io,
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_openapi::api::core::v1::Pod;
use kubelet_core::{
    PodUid, Runtime,
    cgroups::{pod_cgroup_name, relative_cgroup_path},
    eviction::Signal,
    runtime::{ContainerStats, FsStats, InterfaceStats, PodNetworkStats},
    types::pod_log_dir,
    volume::EMPTY_DIR,
};
use nix::{
    fcntl::{AtFlags, OFlag, openat},
    sys::stat::{FileStat, Mode, SFlag, fstat, fstatat},
};
use tracing::debug;

use crate::{
    rank::{ContainerUsage, DiskUsage, PodStats, PodStatsMap},
    state::{Observation, Observations},
};

/// What to measure of the pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Need {
    /// Their containers' memory working sets.
    pub memory: bool,
    /// Their writable layers, logs and emptyDir volumes.
    pub disk: bool,
    /// Their processes.
    pub processes: bool,
}

impl Need {
    /// What ranking pods for `signal` needs.
    pub fn for_signal(signal: Signal) -> Need {
        match signal {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Need { memory: true, ..Need::default() },
            Signal::PidAvailable => Need { processes: true, ..Need::default() },
            _ => Need { disk: true, ..Need::default() },
        }
    }
}

/// Where an eviction manager reads the node's signals and the pods' use.
pub trait StatsProvider: Send + Sync + 'static {
    /// The node's signals now; a signal that cannot be read is left out (and logged).
    fn observe(&self) -> impl Future<Output = Observations> + Send;

    /// Whether the images are on a filesystem of their own (then `nodefs` and `imagefs` are
    /// reclaimed and ranked apart); `None` while that cannot be told (the runtime does not
    /// answer), and the manager asks again at its next round.
    fn dedicated_image_fs(&self) -> impl Future<Output = Option<bool>> + Send;

    /// The use of `pods`, as far as `need` asks; a pod that cannot be measured is left out.
    fn pod_stats(&self, pods: &[Arc<Pod>], need: Need) -> impl Future<Output = PodStatsMap> + Send;
}

/// This host's and a runtime's stats.
#[derive(Debug)]
pub struct HostStats<R> {
    runtime: Arc<R>,
    config: HostPaths,
}

/// Where [`HostStats`] reads.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct HostPaths {
    /// The root directory (`--root-dir`): its filesystem is `nodefs`, its `pods` directory holds
    /// the emptyDir volumes.
    pub root_dir: PathBuf,
    /// Where the pods' logs are (`podLogsDir`).
    pub pod_logs_dir: PathBuf,
    /// Where cgroup hierarchies are mounted (`/sys/fs/cgroup`).
    pub cgroup_mount: PathBuf,
    /// The pods' cgroup (`/kubepods`) and the node's allocatable memory, for
    /// `allocatableMemory.available` and the pods' processes; none without pod cgroups.
    pub pods_cgroup: Option<(String, u64)>,
    /// `/proc`.
    pub proc: PathBuf,
}

impl HostPaths {
    /// This host's usual paths with `root_dir` and `pod_logs_dir`.
    pub fn new(root_dir: impl Into<PathBuf>, pod_logs_dir: impl Into<PathBuf>) -> Self {
        HostPaths {
            root_dir: root_dir.into(),
            pod_logs_dir: pod_logs_dir.into(),
            cgroup_mount: PathBuf::from("/sys/fs/cgroup"),
            pods_cgroup: None,
            proc: PathBuf::from("/proc"),
        }
    }

    /// Reads the pods' cgroup `name` below `mount`, whose memory limit is `allocatable_memory`.
    #[must_use]
    pub fn pods_cgroup(mut self, mount: impl Into<PathBuf>, name: impl Into<String>, allocatable_memory: u64) -> Self {
        self.cgroup_mount = mount.into();
        self.pods_cgroup = Some((name.into(), allocatable_memory));
        self
    }
}

impl<R: Runtime> HostStats<R> {
    /// Stats of this host at `paths` and of `runtime`.
    pub fn new(runtime: Arc<R>, paths: HostPaths) -> Self {
        HostStats { runtime, config: paths }
    }

    fn pods_dir(&self) -> PathBuf {
        self.config.root_dir.join("pods")
    }
}

impl<R: Runtime> HostStats<R> {
    /// The node now, for the kubelet API's summary: CPU time, memory, the root directory's and
    /// the images' filesystems, process IDs.
    pub async fn node_sample(&self) -> crate::summary::NodeSample {
        let paths = self.config.clone();
        let host = tokio::task::spawn_blocking(move || {
            let network = std::fs::read_to_string("/proc/net/dev").map(|t| host_interfaces(&t)).unwrap_or_default();
            (read_host(&paths), node_cpu_usage(&paths.cgroup_mount), network)
        });
        let (observations, cpu, network) = host.await.unwrap_or_default();
        let mut sample = crate::summary::NodeSample::new(kubelet_core::clock::wall_now());
        sample.cpu_usage_core_nanoseconds = cpu;
        sample.memory = observations.get(&Signal::MemoryAvailable).copied();
        sample.pids = observations.get(&Signal::PidAvailable).copied();
        sample.fs = fs_stats(&self.config.root_dir).ok();
        sample.image_fs = self.runtime.image_fs_stats().await.ok().flatten();
        sample.network = network;
        sample
    }
}

/// The node's own interfaces in `/proc/net/dev`'s text, as cAdvisor counts the machine's: the
/// loopback, the pods' veth ends and bridges of other container engines left out.
pub(crate) fn host_interfaces(proc_net_dev: &str) -> Vec<InterfaceStats> {
    const IGNORED_PREFIXES: [&str; 4] = ["lo", "veth", "docker", "nerdctl"];
    proc_net_dev
        .lines()
        .skip(2)
        .filter_map(|line| {
            let (name, counters) = line.split_once(':')?;
            let name = name.trim();
            if IGNORED_PREFIXES.iter().any(|prefix| name.starts_with(prefix)) {
                return None;
            }
            // Receive: bytes packets errs drop fifo frame compressed multicast; then transmit:
            // bytes packets errs ...
            let counters: Vec<u64> = counters.split_whitespace().filter_map(|c| c.parse().ok()).collect();
            let mut interface = InterfaceStats::new(name);
            interface.rx_bytes = counters.first().copied();
            interface.rx_errors = counters.get(2).copied();
            interface.tx_bytes = counters.get(8).copied();
            interface.tx_errors = counters.get(10).copied();
            Some(interface)
        })
        .collect()
}

/// The CPU time every process of the host has used, in nanoseconds: the root cgroup's
/// `cpuacct.usage` (v1) or `cpu.stat`'s `usage_usec` (v2).
fn node_cpu_usage(mount: &Path) -> Option<u64> {
    for v1 in ["cpuacct", "cpu,cpuacct", "cpu"] {
        if let Ok(text) = std::fs::read_to_string(mount.join(v1).join("cpuacct.usage")) {
            return text.trim().parse().ok();
        }
    }
    let stat = std::fs::read_to_string(mount.join("cpu.stat")).ok()?;
    stat_value(&stat, "usage_usec").map(|micros| micros * 1000)
}

impl<R: Runtime> StatsProvider for HostStats<R> {
    async fn observe(&self) -> Observations {
        let mut observations = Observations::new();
        let paths = self.config.clone();
        let host = tokio::task::spawn_blocking(move || read_host(&paths)).await.unwrap_or_default();
        observations.extend(host);
        match self.runtime.image_fs_stats().await {
            Ok(Some(fs)) => insert_fs(&mut observations, fs, Signal::ImageFsAvailable, Signal::ImageFsInodesFree),
            Ok(None) => {}
            Err(err) => debug!(error = %kubelet_core::ErrorChain(&err), "cannot read the image filesystem"),
        }
        observations
    }

    async fn dedicated_image_fs(&self) -> Option<bool> {
        let root = self.config.root_dir.clone();
        let nodefs = tokio::task::spawn_blocking(move || fs_stats(&root).ok()).await.ok().flatten()?;
        // A runtime that reports no image filesystem keeps its images beside the node's.
        match self.runtime.image_fs_stats().await {
            Ok(Some(image)) => Some(nodefs.filesystem_id != image.filesystem_id),
            Ok(None) => Some(false),
            Err(err) => {
                debug!(error = %err, "the runtime's image filesystem is not known yet");
                None
            }
        }
    }

    async fn pod_stats(&self, pods: &[Arc<Pod>], need: Need) -> PodStatsMap {
        let containers = if need.memory || need.disk {
            self.runtime.container_stats().await.unwrap_or_else(|err| {
                debug!(error = %kubelet_core::ErrorChain(&err), "cannot read the containers' stats");
                Vec::new()
            })
        } else {
            Vec::new()
        };
        self.measure(pods, need, containers).await
    }
}

impl<R: Runtime> HostStats<R> {
    /// The runtime's stats of its containers.
    pub(crate) async fn container_stats(&self) -> Result<Vec<ContainerStats>, R::Error> {
        self.runtime.container_stats().await
    }

    /// The runtime's figures of its pods' networks.
    pub(crate) async fn pod_network_stats(&self) -> Result<Vec<PodNetworkStats>, R::Error> {
        self.runtime.pod_network_stats().await
    }

    /// The use of `pods` as far as `need` asks, their containers' from `containers`.
    pub(crate) async fn measure(&self, pods: &[Arc<Pod>], need: Need, containers: Vec<ContainerStats>) -> PodStatsMap {
        let pods_cgroup = self.config.pods_cgroup.as_ref().map(|(name, _)| name);
        let mut stats: PodStatsMap = pods
            .iter()
            .map(|pod| {
                let cgroup = pods_cgroup.map(|pods_cgroup| pod_cgroup_name(pods_cgroup, pod));
                (PodUid::of(pod), PodStats { cgroup, ..PodStats::default() })
            })
            .collect();
        for container in containers {
            let Some(pod) = stats.get_mut(&container.pod_uid) else { continue };
            pod.containers.push(ContainerUsage {
                id: Some(container.id),
                name: container.name,
                memory_working_set: container.memory_working_set_bytes,
                cpu: container.cpu_usage_core_nanoseconds.map(|used| (used, container.cpu_timestamp_nanos)),
                cpu_usage_nano_cores: None,
                rootfs: container
                    .writable_layer_bytes
                    .map(|bytes| DiskUsage::new(bytes, container.writable_layer_inodes.unwrap_or(0))),
                logs: None,
            });
        }
        if need.disk || need.processes {
            let pods: Vec<Arc<Pod>> = pods.to_vec();
            let (pods_dir, paths) = (self.pods_dir(), self.config.clone());
            let measured = tokio::task::spawn_blocking(move || {
                let mut measured = stats;
                for pod in &pods {
                    let Some(entry) = measured.get_mut(&PodUid::of(pod)) else { continue };
                    if need.disk {
                        measure_disk(entry, pod, &pods_dir, &paths.pod_logs_dir);
                    }
                    if need.processes {
                        entry.processes = pod_processes(&paths, pod);
                    }
                }
                measured
            })
            .await;
            return measured.unwrap_or_default();
        }
        stats
    }
}

/// The host's own signals: memory, the pods' memory, the root directory's filesystem, PIDs.
fn read_host(paths: &HostPaths) -> Observations {
    let mut observations = Observations::new();
    let read = |path: PathBuf| std::fs::read_to_string(path).ok();
    let meminfo = read(paths.proc.join("meminfo")).unwrap_or_default();
    let root_memory = paths.cgroup_mount.join("memory");
    let root_cgroup = match (read(root_memory.join("memory.usage_in_bytes")), read(root_memory.join("memory.stat"))) {
        (Some(usage), Some(stat)) => Some((usage, stat)),
        _ => None,
    };
    if let Some(memory) = memory_observation(&meminfo, root_cgroup.as_ref().map(|(u, s)| (u.as_str(), s.as_str()))) {
        observations.insert(Signal::MemoryAvailable, memory);
    }
    if let Some((name, allocatable)) = &paths.pods_cgroup
        && let Some(working_set) = cgroup_working_set(&paths.cgroup_mount, name)
    {
        let available = allocatable.saturating_sub(working_set);
        observations.insert(Signal::AllocatableMemoryAvailable, Observation::new(available, *allocatable));
    }
    match fs_stats(&paths.root_dir) {
        Ok(fs) => insert_fs(&mut observations, fs, Signal::NodeFsAvailable, Signal::NodeFsInodesFree),
        Err(err) => {
            debug!(error = %err, dir = %paths.root_dir.display(), "cannot read the root directory's filesystem")
        }
    }
    let pid_max = read(paths.proc.join("sys/kernel/pid_max"));
    let loadavg = read(paths.proc.join("loadavg"));
    if let Some(pids) = pid_max.zip(loadavg).and_then(|(max, load)| pid_observation(&max, &load)) {
        observations.insert(Signal::PidAvailable, pids);
    }
    observations
}

fn insert_fs(observations: &mut Observations, fs: FsStats, bytes: Signal, inodes: Signal) {
    observations.insert(bytes, Observation::new(fs.available_bytes, fs.capacity_bytes));
    if let Some((all, free)) = fs.inodes.zip(fs.inodes_free) {
        observations.insert(inodes, Observation::new(free, all));
    }
}

/// The filesystem holding `path` (`statvfs`).
pub fn fs_stats(path: &Path) -> io::Result<FsStats> {
    let stats = nix::sys::statvfs::statvfs(path)?;
    // Reason: the field types are the platform's (`c_ulong`, `fsblkcnt_t`), u64 here.
    #[allow(clippy::useless_conversion)]
    let (block, blocks, available) =
        (u64::from(stats.fragment_size()), u64::from(stats.blocks()), u64::from(stats.blocks_available()));
    #[allow(clippy::useless_conversion)]
    let (files, files_free) = (u64::from(stats.files()), u64::from(stats.files_free()));
    let mut fs =
        FsStats::new(blocks.saturating_mul(block), available.saturating_mul(block)).with_inodes(files, files_free);
    #[allow(clippy::useless_conversion)]
    {
        fs.filesystem_id = Some(u64::from(stats.filesystem_id()));
    }
    Ok(fs)
}

/// A `key  value kB` line of `/proc/meminfo`, in bytes.
fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// A `key value` line of a cgroup's `memory.stat`.
fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `memory.available` as upstream's summary computes it: the capacity (`MemTotal`) minus the
/// working set, which is the root memory cgroup's usage less its inactive file pages on
/// cgroup v1 (`root_cgroup`: `memory.usage_in_bytes` and `memory.stat`), and `MemTotal` less
/// `MemFree` less `Inactive(file)` without it.
pub fn memory_observation(meminfo: &str, root_cgroup: Option<(&str, &str)>) -> Option<Observation> {
    let capacity = meminfo_bytes(meminfo, "MemTotal")?;
    let working_set = match root_cgroup {
        Some((usage, stat)) => {
            let usage: u64 = usage.trim().parse().ok()?;
            usage.saturating_sub(stat_value(stat, "total_inactive_file").unwrap_or(0))
        }
        None => {
            let used = capacity.saturating_sub(meminfo_bytes(meminfo, "MemFree")?);
            used.saturating_sub(meminfo_bytes(meminfo, "Inactive(file)").unwrap_or(0))
        }
    };
    Some(Observation::new(capacity.saturating_sub(working_set), capacity))
}

/// `pid.available`: `pid_max` less the tasks that exist (the fourth field of `/proc/loadavg`,
/// `running/total`, counts them as `sysinfo` does).
pub fn pid_observation(pid_max: &str, loadavg: &str) -> Option<Observation> {
    let max: u64 = pid_max.trim().parse().ok()?;
    let tasks: u64 = loadavg.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok()?;
    Some(Observation::new(max.saturating_sub(tasks), max))
}

/// The working set of cgroup `name` (usage less inactive file pages), v1 or v2.
fn cgroup_working_set(mount: &Path, name: &str) -> Option<u64> {
    let relative = relative_cgroup_path(name).ok()?;
    let read = |path: PathBuf| std::fs::read_to_string(path).ok();
    let v1 = mount.join("memory").join(relative);
    if let Some(usage) = read(v1.join("memory.usage_in_bytes")) {
        let inactive = read(v1.join("memory.stat")).and_then(|s| stat_value(&s, "total_inactive_file"));
        return Some(usage.trim().parse::<u64>().ok()?.saturating_sub(inactive.unwrap_or(0)));
    }
    let v2 = mount.join(relative);
    let usage: u64 = read(v2.join("memory.current"))?.trim().parse().ok()?;
    let inactive = read(v2.join("memory.stat")).and_then(|s| stat_value(&s, "inactive_file"));
    Some(usage.saturating_sub(inactive.unwrap_or(0)))
}

/// The processes in the pod's cgroup (`pids.current`), v1 or v2.
fn pod_processes(paths: &HostPaths, pod: &Pod) -> Option<u64> {
    let (pods_cgroup, _) = paths.pods_cgroup.as_ref()?;
    let name = pod_cgroup_name(pods_cgroup, pod);
    let relative = relative_cgroup_path(&name).ok()?;
    let v1 = paths.cgroup_mount.join("pids").join(relative).join("pids.current");
    let v2 = paths.cgroup_mount.join(relative).join("pids.current");
    let text = std::fs::read_to_string(v1).or_else(|_| std::fs::read_to_string(v2)).ok()?;
    text.trim().parse().ok()
}

/// Measures the pod's emptyDir volumes on disk and its containers' logs into `stats`.
fn measure_disk(stats: &mut PodStats, pod: &Pod, pods_dir: &Path, pod_logs_dir: &Path) {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let Some(spec) = pod.spec.as_ref() else { return };
    let on_disk = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.empty_dir.as_ref().is_some_and(|e| e.medium.as_deref().unwrap_or_default().is_empty()));
    for volume in on_disk {
        let dir = pods_dir.join(uid).join("volumes").join(EMPTY_DIR).join(&volume.name);
        if let Ok(usage) = disk_usage(&dir) {
            stats.volumes.push((volume.name.clone(), usage));
        }
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let logs = pod_log_dir(pod_logs_dir, namespace, name, uid);
    for container in &spec.containers {
        let usage = disk_usage(&logs.join(&container.name)).ok();
        match stats.containers.iter_mut().find(|c| c.name == container.name) {
            Some(measured) => measured.logs = usage,
            None => stats.containers.push(ContainerUsage {
                name: container.name.clone(),
                logs: usage,
                ..Default::default()
            }),
        }
    }
}

/// How deep [`disk_usage`] descends; what is deeper is not counted.
const MAX_DEPTH: usize = 128;

/// The blocks and inodes used below `dir`, as `du` counts them: on `dir`'s filesystem only,
/// each hard-linked file once. Nothing is followed: every directory is opened relative to its
/// parent with `O_NOFOLLOW`, so a container that swaps a directory for a symbolic link cannot
/// point the walk outside its volume.
pub fn disk_usage(dir: &Path) -> io::Result<DiskUsage> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let top = nix::fcntl::open(dir, flags, Mode::empty())?;
    let top_stat = fstat(&top)?;
    let mut usage = DiskUsage::default();
    let mut linked = HashSet::new();
    count(&mut usage, &top_stat, &mut linked);
    let mut stack: Vec<(OwnedFd, nix::dir::OwningIter)> = vec![open_listing(top)?];
    loop {
        let depth = stack.len();
        let Some((fd, entries)) = stack.last_mut() else { break };
        let Some(entry) = entries.next() else {
            stack.pop();
            continue;
        };
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let Ok(stat) = fstatat(fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) else { continue };
        count(&mut usage, &stat, &mut linked);
        let is_dir = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
        if is_dir
            && stat.st_dev == top_stat.st_dev
            && depth < MAX_DEPTH
            && let Ok(child) = openat(fd.as_fd(), name, flags, Mode::empty())
        {
            stack.push(open_listing(child)?);
        }
    }
    Ok(usage)
}

fn open_listing(fd: OwnedFd) -> io::Result<(OwnedFd, nix::dir::OwningIter)> {
    let listing = nix::dir::Dir::from_fd(fd.try_clone()?)?;
    Ok((fd, listing.into_iter()))
}

fn count(usage: &mut DiskUsage, stat: &FileStat, linked: &mut HashSet<(u64, u64)>) {
    // Reason: `st_blocks` is signed on this platform, and never negative.
    #[allow(clippy::cast_sign_loss)]
    let (nlink, dev, ino, blocks) = (stat.st_nlink, stat.st_dev, stat.st_ino, stat.st_blocks as u64);
    if nlink > 1 && !linked.insert((dev, ino)) {
        return;
    }
    usage.bytes += blocks * 512;
    usage.inodes += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodes_interfaces_leave_out_loopback_and_pod_ends() {
        let proc_net_dev = "Inter-|   Receive                                                |  Transmit\n \
            face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n\
            \x20   lo: 100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n\
            \x20 ens3: 5000 40 2 0 0 0 0 0 6000 50 3 0 0 0 0 0\n\
            veth1a2b: 70 1 0 0 0 0 0 0 80 1 0 0 0 0 0 0\n\
            kubeletrs0: 900 9 0 0 0 0 0 0 800 8 0 0 0 0 0 0\n";
        let interfaces = host_interfaces(proc_net_dev);
        let names: Vec<&str> = interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["ens3", "kubeletrs0"]);
        let ens3 = &interfaces[0];
        assert_eq!(
            (ens3.rx_bytes, ens3.rx_errors, ens3.tx_bytes, ens3.tx_errors),
            (Some(5000), Some(2), Some(6000), Some(3))
        );
    }

    #[test]
    fn memory_is_capacity_less_the_working_set() {
        let meminfo = "MemTotal:        2000 kB\nMemFree:          500 kB\nInactive(file):   300 kB\n";
        let v1 = memory_observation(meminfo, Some(("1433600\n", "cache 1\ntotal_inactive_file 204800\n"))).unwrap();
        assert_eq!(v1, Observation::new(2000 * 1024 - (1_433_600 - 204_800), 2000 * 1024));
        let without = memory_observation(meminfo, None).unwrap();
        assert_eq!(without, Observation::new((500 + 300) * 1024, 2000 * 1024));
        assert_eq!(memory_observation("", None), None);
    }

    #[test]
    fn pids_are_pid_max_less_the_tasks() {
        assert_eq!(pid_observation("32768\n", "0.10 0.20 0.30 2/268 4242\n"), Some(Observation::new(32500, 32768)));
        assert_eq!(pid_observation("32768", "garbage"), None);
    }

    #[test]
    fn disk_usage_counts_blocks_and_inodes_without_following_links() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![1u8; 1 << 20]).unwrap();
        let volume = tempfile::tempdir().unwrap();
        std::fs::create_dir(volume.path().join("sub")).unwrap();
        std::fs::write(volume.path().join("sub/data"), vec![1u8; 64 * 1024]).unwrap();
        std::fs::hard_link(volume.path().join("sub/data"), volume.path().join("again")).unwrap();
        std::os::unix::fs::symlink(outside.path(), volume.path().join("escape")).unwrap();
        let usage = disk_usage(volume.path()).unwrap();
        assert_eq!(usage.inodes, 4, "the directory, sub, data once, the link itself");
        assert!(usage.bytes >= 64 * 1024 && usage.bytes < 512 * 1024, "{usage:?}: the linked megabyte is not counted");
        std::fs::remove_dir_all(volume.path().join("sub")).unwrap();
        std::os::unix::fs::symlink(outside.path(), volume.path().join("sub")).unwrap();
        assert!(disk_usage(&volume.path().join("sub")).is_err(), "a link is never the walk's start");
    }
}
