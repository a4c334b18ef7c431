//! Removal: what is left of pods that are gone, single containers, and garbage collection
//! (upstream `kuberuntime_gc.go`).

use std::path::{Component, Path, PathBuf};

use super::*;

impl CriRuntime {
    /// The pod's cgroup under each QoS class: the runtime makes it below the cgroup parent the
    /// sandbox names, and leaves it when the sandbox goes.
    fn pod_cgroup_parents(&self, uid: &str) -> Vec<String> {
        ["", "burstable/", "besteffort/"]
            .iter()
            .map(|qos| format!("{}/{qos}pod{uid}", self.config.cgroup_root.trim_end_matches('/')))
            .collect()
    }

    /// What a start cut short (say, between creating the log directory and the end of
    /// RunPodSandbox) can leave of a pod the runtime no longer holds: its cgroups and log directory.
    /// A cgroup that cannot be removed yet (the runtime may still be removing the sandbox's own
    /// cgroup below it) is an error, so the caller tries again later.
    async fn remove_leftovers(&self, uid: &PodUid) -> Result<(), Error> {
        let mut failed = None;
        for parent in self.pod_cgroup_parents(uid.as_str()) {
            if let Err(err) = self.remove_pod_cgroup(&parent).await {
                debug!(error = %err, parent, "pod cgroup not removed");
                failed.get_or_insert(err);
            }
        }
        self.remove_log_dirs(uid).await;
        match failed {
            Some(source) => Err(Error::Leftover { uid: uid.to_string(), source }),
            None => Ok(()),
        }
    }

    /// Removes the pod cgroup `parent`, trying again while it is busy: the processes a try
    /// killed there, or those the runtime's stop killed, are reaped by their shim a moment later
    /// (waits of 0.1, 0.2, 0.4 and 0.8 s; a busy machine has been seen to need more than the first).
    async fn remove_pod_cgroup(&self, parent: &str) -> std::io::Result<usize> {
        let mut wait = std::time::Duration::from_millis(100);
        loop {
            match cgroups::remove_pod_cgroup(&self.config.cgroup_mount, parent) {
                Err(err) if err.kind() != std::io::ErrorKind::InvalidInput && wait <= REMOVAL_LAST_WAIT => {
                    debug!(error = %err, parent, ?wait, "pod cgroup busy; trying again");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                result => return result,
            }
        }
    }

    async fn remove_log_dirs(&self, uid: &PodUid) {
        let Ok(mut entries) = tokio::fs::read_dir(&self.config.pod_logs_dir).await else { return };
        let suffix = format!("_{uid}");
        while let Ok(Some(entry)) = entries.next_entry().await {
            if entry.file_name().to_string_lossy().ends_with(&suffix)
                && let Err(err) = tokio::fs::remove_dir_all(entry.path()).await
            {
                warn!(error = %err, dir = %entry.path().display(), "cannot remove the pod log directory");
            }
        }
    }

    /// Removes a pod's cgroup and log directory once nothing of it remains in the runtime.
    pub(super) async fn cleanup_pod(&self, uid: &str, name: &str, namespace: &str, qos_parents: &[String]) {
        for parent in qos_parents {
            match self.remove_pod_cgroup(parent).await {
                Ok(0) => {}
                Ok(hierarchies) => debug!(parent, hierarchies, "pod cgroup removed"),
                Err(err) => debug!(error = %err, parent, "pod cgroup not removed"),
            }
        }
        let dir = sandbox::pod_log_dir(&self.config.pod_logs_dir, namespace, name, uid);
        if dir.exists()
            && let Err(err) = tokio::fs::remove_dir_all(&dir).await
        {
            warn!(error = %err, dir = %dir.display(), "cannot remove the pod log directory");
        }
        self.remove_dangling_log_links(&format!("{name}_{namespace}_")).await;
    }

    /// Removes the legacy container log symlinks named for a pod (`<name>_<namespace>_...log`)
    /// whose log is gone: a container the runtime removed with its sandbox leaves its link, which
    /// now points at nothing. A link of a pod of the same name that still logs stays.
    async fn remove_dangling_log_links(&self, prefix: &str) {
        let Ok(mut entries) = tokio::fs::read_dir(&self.config.container_logs_dir).await else { return };
        while let Ok(Some(entry)) = entries.next_entry().await {
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_link = entry.file_type().await.is_ok_and(|t| t.is_symlink());
            // `exists` follows the link: false once its log is gone.
            if name.starts_with(prefix) && name.ends_with(".log") && is_link && !entry.path().exists() {
                let _ = tokio::fs::remove_file(entry.path()).await;
            }
        }
    }
}

/// Refuses the removal of pod `uid` while a RunPodSandbox of it is in flight: the sandbox is not
/// listed yet, but its `runc init` already runs in the pod's cgroup, and removing what is left
/// of the pod would kill it and fail the call (leaving runc's bind mount of itself behind).
fn no_sandbox_starting(rt: &CriRuntime, uid: &PodUid) -> Result<(), Error> {
    if rt.sandboxes_starting.contains(uid) {
        return Err(Error::PodStillRuns { uid: uid.to_string() });
    }
    Ok(())
}

pub(super) async fn remove_pod_content(rt: &CriRuntime, uid: &PodUid) -> Result<(), Error> {
    no_sandbox_starting(rt, uid)?;
    // Only this pod's sandboxes and containers are asked for: a node's whole listing grows
    // with its pods, and a node that churns pods removes one after another.
    let mut status = rt.get_pod_status(uid, "", "").await?;
    // Asked again after the listing: a start that began while it ran is not in it.
    no_sandbox_starting(rt, uid)?;
    if status.sandbox_statuses.is_empty() && status.container_statuses.is_empty() {
        return rt.remove_leftovers(uid).await;
    }
    if status.container_statuses.iter().any(|c| c.state == ContainerState::Running)
        || status.sandbox_statuses.iter().any(|s| s.state == SandboxState::Ready)
    {
        return Err(Error::PodStillRuns { uid: uid.to_string() });
    }
    if status.name.is_empty() {
        // Containers without a sandbox: their labels name the pod, for its log directory.
        let pods = rt.get_pods(true).await?;
        if let Some(pod) = pods.into_iter().find(|p| p.uid == *uid) {
            status.name = pod.name;
            status.namespace = pod.namespace;
        }
    }
    rt.remove_pod_with_status(None, &status).await
}

/// RemovePodSandbox. A runtime that could not tear a stopped sandbox's network down keeps the
/// sandbox (containerd: "network namespace is not fully closed"): it is stopped again, which
/// tries the teardown again, and removed once more.
async fn remove_pod_sandbox(rt: &CriRuntime, id: &str) -> Result<(), Error> {
    let remove = || async {
        let request = pb::RemovePodSandboxRequest { pod_sandbox_id: id.to_owned() };
        rt.client.runtime_service().remove_pod_sandbox(request).await
    };
    match remove().await {
        Ok(_) => Ok(()),
        Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
        Err(status) => {
            debug!(sandbox.id = id, error = %status.message(), "sandbox not removed; stopping it again first");
            super::kill::stop_pod_sandbox(rt, id).await?;
            remove().await.map(|_| ()).map_err(|st| Error::status("RemovePodSandbox", st))
        }
    }
}

/// The longest wait between two tries at removing a busy pod cgroup.
const REMOVAL_LAST_WAIT: std::time::Duration = std::time::Duration::from_millis(800);

/// How long a task killed through containerd's Tasks service may take to exit.
const TASK_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Removes a container of a pod that stays, with its log files, rotated ones included
/// (upstream's `removeContainerLog`).
pub(super) async fn delete_container(rt: &CriRuntime, container_id: &str) -> Result<(), Error> {
    let log_path = container_log_path(rt, container_id).await;
    delete_container_keeping_logs(rt, container_id).await?;
    if let Some(log) = log_path {
        let pod_logs_dir = rt.config.pod_logs_dir.clone();
        let removed = tokio::task::spawn_blocking(move || remove_log_files(&pod_logs_dir, &log)).await;
        if let Ok(Err(err)) = removed {
            warn!(container.id = container_id, error = %err, "cannot remove a removed container's logs");
        }
    }
    Ok(())
}

/// Removes a container but not its log files: what removes the whole pod removes its log
/// directory after.
async fn delete_container_keeping_logs(rt: &CriRuntime, container_id: &str) -> Result<(), Error> {
    remove_container(rt, container_id).await?;
    // Its legacy log symlink goes with it.
    if let Ok(mut entries) = tokio::fs::read_dir(&rt.config.container_logs_dir).await {
        while let Ok(Some(entry)) = entries.next_entry().await {
            if entry.file_name().to_string_lossy().ends_with(&format!("-{container_id}.log")) {
                let _ = tokio::fs::remove_file(entry.path()).await;
            }
        }
    }
    Ok(())
}

/// Where the runtime says the container logs, when it still knows the container.
async fn container_log_path(rt: &CriRuntime, container_id: &str) -> Option<PathBuf> {
    let request = pb::ContainerStatusRequest { container_id: container_id.to_owned(), verbose: false };
    let status = rt.client.runtime_service().container_status(request).await.ok()?.into_inner().status?;
    (!status.log_path.is_empty()).then(|| PathBuf::from(status.log_path))
}

/// Removes log file `log` and its rotated files (`<log>.*`), when `log` is a plain path below
/// `pod_logs_dir`. Only regular files are removed.
fn remove_log_files(pod_logs_dir: &Path, log: &Path) -> std::io::Result<()> {
    let plain = log.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let (Some(dir), Some(name)) = (log.parent(), log.file_name().and_then(|n| n.to_str())) else { return Ok(()) };
    if !plain || !log.starts_with(pod_logs_dir) {
        return Ok(());
    }
    let rotated_prefix = format!("{name}.");
    let entries = match std::fs::read_dir(dir) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        entries => entries?,
    };
    for entry in entries {
        let entry = entry?;
        let file_name = entry.file_name();
        let file_name = file_name.to_string_lossy();
        let belongs = *file_name == *name || file_name.starts_with(&rotated_prefix);
        if belongs && entry.file_type()?.is_file() {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// RemoveContainer, through what a start cut short may have left in the way.
async fn remove_container(rt: &CriRuntime, container_id: &str) -> Result<(), Error> {
    let request = pb::RemoveContainerRequest { container_id: container_id.to_owned() };
    match rt.client.runtime_service().remove_container(request.clone()).await {
        Ok(_) => {}
        Err(status) if status.code() == tonic::Code::NotFound => {}
        Err(status) if status.code() == tonic::Code::FailedPrecondition => {
            // A start cut short (the agent killed during StartContainer) can leave a task the
            // runtime still counts as running under a container it reports as created: stop it,
            // then remove.
            debug!(container.id = container_id, "container still has a task: stopping it before removal");
            let stop = pb::StopContainerRequest { container_id: container_id.to_owned(), timeout: 0 };
            match rt.client.runtime_service().stop_container(stop).await {
                Ok(_) => {}
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) => return Err(Error::status("StopContainer", status)),
            }
            match rt.client.runtime_service().remove_container(request.clone()).await {
                Ok(_) => {}
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                    // containerd 1.6's CRI skips the stop of a container it reports as created,
                    // task or not: kill and delete the task through containerd's Tasks service.
                    warn!(container.id = container_id, "removing the task left under a created container");
                    if let Err(err) = rt.client.remove_containerd_task(container_id, TASK_EXIT_WAIT).await {
                        debug!(container.id = container_id, error = %err, "containerd's Tasks service did not remove it");
                        return Err(Error::status("RemoveContainer", status));
                    }
                    match rt.client.runtime_service().remove_container(request).await {
                        Ok(_) => {}
                        Err(status) if status.code() == tonic::Code::NotFound => {}
                        Err(status) => return Err(Error::status("RemoveContainer", status)),
                    }
                }
                Err(status) => return Err(Error::status("RemoveContainer", status)),
            }
        }
        Err(status) => return Err(Error::status("RemoveContainer", status)),
    }
    Ok(())
}

pub(super) async fn garbage_collect(
    rt: &CriRuntime,
    policy: &GcPolicy,
    _all_sources_ready: bool,
    _evict_non_deleted_pods: bool,
) -> Result<(), Error> {
    let pods = rt.get_pods(true).await?;
    let now = kubelet_core::clock::wall_now();
    // One failed removal does not stop the collection: the rest goes on, the first error is
    // returned and every one is logged.
    let mut first_error: Option<Error> = None;
    let mut failed = |err: Error| {
        warn!(error = %err, "garbage collection: a removal failed; going on");
        first_error.get_or_insert(err);
    };
    for id in dead_containers_to_remove(&pods, policy, now) {
        if let Err(err) = rt.delete_container(&id).await {
            failed(err);
        }
    }
    for pod in &pods {
        // Dead sandboxes, except the newest of the pod (it holds the pod's last IP and logs).
        for s in pod.sandboxes.iter().skip(1).filter(|s| s.state == SandboxState::NotReady) {
            let request = pb::RemovePodSandboxRequest { pod_sandbox_id: s.id.clone() };
            if let Err(status) = rt.client.runtime_service().remove_pod_sandbox(request).await
                && status.code() != tonic::Code::NotFound
            {
                failed(Error::status("RemovePodSandbox", status));
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The dead containers garbage collection removes (upstream `evictContainers`): of those older
/// than `min_age`, all but the newest `max_per_pod_container` of each (pod, container name);
/// then, while more than `max_containers` are left, the same with an equal share per (pod,
/// container name) of at least one, and then the oldest of all. A negative limit is no limit.
fn dead_containers_to_remove(
    pods: &[kubelet_core::runtime::Pod],
    policy: &GcPolicy,
    now: k8s_openapi::jiff::Timestamp,
) -> Vec<String> {
    let min_age = i64::try_from(policy.min_age.as_secs()).unwrap_or(i64::MAX);
    let old_enough = |created: Option<k8s_openapi::jiff::Timestamp>| {
        created.is_none_or(|c| now.as_second() - c.as_second() >= min_age)
    };
    // Evictable containers per (pod, name), newest first.
    let mut units: Vec<Vec<(Option<k8s_openapi::jiff::Timestamp>, &str)>> = Vec::new();
    for pod in pods {
        let mut by_name: HashMap<&str, Vec<(Option<k8s_openapi::jiff::Timestamp>, &str)>> = HashMap::new();
        for c in pod.containers.iter().filter(|c| c.state != ContainerState::Running && old_enough(c.created_at)) {
            by_name.entry(c.name.as_str()).or_default().push((c.created_at, c.id.as_str()));
        }
        units.extend(by_name.into_values());
    }
    for unit in &mut units {
        unit.sort_by_key(|c| std::cmp::Reverse(c.0));
    }
    let mut removed = Vec::new();
    let mut trim = |units: &mut Vec<Vec<(Option<k8s_openapi::jiff::Timestamp>, &str)>>, keep: usize| {
        for unit in units.iter_mut() {
            if unit.len() > keep {
                removed.extend(unit.drain(keep..).map(|(_, id)| id.to_owned()));
            }
        }
    };
    if let Ok(keep) = usize::try_from(policy.max_per_pod_container) {
        trim(&mut units, keep);
    }
    if let Ok(max) = usize::try_from(policy.max_containers) {
        let total = |units: &Vec<Vec<_>>| units.iter().map(Vec::len).sum::<usize>();
        let count = units.iter().filter(|u| !u.is_empty()).count();
        if total(&units) > max && count > 0 {
            trim(&mut units, (max / count).max(1));
        }
        let mut rest: Vec<(Option<k8s_openapi::jiff::Timestamp>, &str)> = units.into_iter().flatten().collect();
        if rest.len() > max {
            // Oldest first (no creation time counts as oldest).
            rest.sort_by_key(|c| c.0);
            let excess = rest.len() - max;
            removed.extend(rest.drain(..excess).map(|(_, id)| id.to_owned()));
        }
    }
    removed
}

impl CriRuntime {
    /// Removes everything of a pod that is gone: its containers and sandboxes, its pod cgroup and
    /// its log directory (upstream leaves these to GC and housekeeping; this does all at once).
    pub async fn remove_pod(&self, pod: &ApiPod) -> Result<(), Error> {
        let (name, namespace, uid) = pod_meta(pod);
        let uid = PodUid::new(uid);
        let status = self.get_pod_status(&uid, name, namespace).await?;
        no_sandbox_starting(self, &uid)?;
        self.remove_pod_with_status(Some(pod), &status).await
    }

    /// [`CriRuntime::remove_pod`] for the pod whose runtime status is `status`.
    async fn remove_pod_with_status(&self, pod: Option<&ApiPod>, status: &PodStatus) -> Result<(), Error> {
        let (uid, name, namespace) = (status.uid.as_str(), status.name.as_str(), status.namespace.as_str());
        // What still runs is killed first. A stopped sandbox is not stopped again: that would
        // tear its network down a second time, and the runtime's removal stops what it removes.
        let mut running = status.to_running_pod();
        running.containers.retain(|c| c.state != ContainerState::Exited);
        running.sandboxes.retain(|s| s.state == SandboxState::Ready);
        self.kill_pod(pod, &running, Some(0)).await?;
        for c in &status.container_statuses {
            delete_container_keeping_logs(self, &c.id).await?;
        }
        for s in &status.sandbox_statuses {
            remove_pod_sandbox(self, &s.id).await?;
        }
        self.cleanup_pod(uid, name, namespace, &self.pod_cgroup_parents(uid)).await;
        // Never through a mount: a volume or subPath still mounted below keeps the directory
        // (housekeeping tears the volumes down and removes it later).
        let pod_dir = self.config.pods_dir.join(uid);
        if !pod_dir.exists() {
            return Ok(());
        }
        // An unreadable mount table proves nothing is unmounted: keep the directory.
        match tokio::fs::read_to_string("/proc/self/mountinfo").await {
            Err(err) => {
                warn!(error = %err, dir = %pod_dir.display(), "not removing the pod directory: cannot read the mount table");
            }
            Ok(mountinfo) => match kubelet_core::volume::mount_below(&mountinfo, &pod_dir) {
                Some(mount) => {
                    warn!(dir = %pod_dir.display(), mount, "not removing the pod directory: something is mounted below it");
                }
                None => {
                    if let Err(err) = tokio::fs::remove_dir_all(&pod_dir).await {
                        warn!(error = %err, dir = %pod_dir.display(), "cannot remove the pod directory");
                    }
                }
            },
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use kubelet_core::runtime::{Container, Pod};

    use super::*;

    #[test]
    fn a_removed_containers_log_files_go_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ns_web_u1/app");
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["0.log", "0.log.20261126-100000.gz", "0.log.20261126-100010", "1.log", "10.log"] {
            std::fs::write(dir.join(name), "x").unwrap();
        }
        std::fs::create_dir(dir.join("0.log.dir")).unwrap();
        remove_log_files(root.path(), &dir.join("0.log")).unwrap();
        let mut left: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["0.log.dir", "1.log", "10.log"]);
        // A path outside the pod log directory, or with `..`, is left alone.
        remove_log_files(&root.path().join("elsewhere"), &dir.join("1.log")).unwrap();
        remove_log_files(root.path(), &dir.join("../app/1.log")).unwrap();
        assert!(dir.join("1.log").exists());
    }

    fn at(second: i64) -> Option<Timestamp> {
        Some(Timestamp::from_second(1_000_000 + second).unwrap())
    }

    /// A pod `uid` with containers (id, name, created second, running).
    fn pod(uid: &str, containers: &[(&str, &str, i64, bool)]) -> Pod {
        let mut pod = Pod::new(PodUid::new(uid), uid, "ns");
        for (id, name, created, running) in containers {
            let state = if *running { ContainerState::Running } else { ContainerState::Exited };
            let mut c = Container::new(*id, *name, state);
            c.created_at = at(*created);
            pod.containers.push(c);
        }
        pod
    }

    fn policy(min_age: u64, per_container: i32, total: i32) -> GcPolicy {
        let mut policy = GcPolicy::default();
        policy.min_age = Duration::from_secs(min_age);
        policy.max_per_pod_container = per_container;
        policy.max_containers = total;
        policy
    }

    fn removed(pods: &[Pod], policy: &GcPolicy) -> Vec<String> {
        let mut ids = dead_containers_to_remove(pods, policy, at(100).unwrap());
        ids.sort();
        ids
    }

    #[test]
    fn the_newest_dead_instances_of_each_container_stay() {
        let p = pod("p", &[("a1", "a", 1, false), ("a3", "a", 3, false), ("a2", "a", 2, false), ("a4", "a", 4, true)]);
        let q = pod("q", &[("b1", "b", 1, false)]);
        assert_eq!(removed(&[p.clone(), q.clone()], &policy(0, 1, -1)), ["a1", "a2"]);
        assert_eq!(removed(&[p.clone(), q.clone()], &policy(0, 0, -1)), ["a1", "a2", "a3", "b1"]);
        assert!(removed(&[p, q], &policy(0, -1, -1)).is_empty(), "no limit");
    }

    #[test]
    fn young_dead_containers_stay() {
        let p = pod("p", &[("old", "a", 1, false), ("older", "a", 0, false), ("young", "a", 95, false)]);
        // At 100 s, a minimum age of 10 s spares the one created at 95 s, and it does not count.
        assert_eq!(removed(&[p], &policy(10, 1, -1)), ["older"]);
    }

    #[test]
    fn a_total_limit_shares_out_then_takes_the_oldest() {
        let p = pod("p", &[("a1", "a", 1, false), ("a2", "a", 2, false), ("b1", "b", 3, false), ("b2", "b", 4, false)]);
        let q = pod("q", &[("c1", "c", 5, false), ("c2", "c", 6, false)]);
        // Six dead, four allowed over three (pod, name) pairs: one each, so three are left.
        assert_eq!(removed(&[p.clone(), q.clone()], &policy(0, -1, 4)), ["a1", "b1", "c1"]);
        // Two allowed: one each is still three, so the oldest of those goes too.
        assert_eq!(removed(&[p, q], &policy(0, -1, 2)), ["a1", "a2", "b1", "c1"]);
    }
}
