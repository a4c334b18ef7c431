//! Stopping containers and pods within their grace periods (upstream `killContainer`, `KillPod`).

use k8s_openapi::api::core::v1::LifecycleHandler;

use super::*;

impl CriRuntime {
    pub(super) async fn stop_container(&self, id: &str, grace: i64) -> Result<(), Error> {
        let request = pb::StopContainerRequest { container_id: id.to_owned(), timeout: grace };
        match self.client.runtime_service().stop_container(request).await {
            Ok(_) => Ok(()),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
            Err(status) => Err(Error::status("StopContainer", status)),
        }
    }

    /// Kills one container with upstream's grace rules (`killContainer`): a deletion's grace
    /// period, else `probe_grace` (a failed probe's own), else the pod's; `grace_override`
    /// replaces it; the preStop hook runs within it and its time is subtracted; at least 2 s are
    /// left for `StopContainer`, except that an override of 0 (a forced removal) stays 0.
    /// Without the pod's spec, what the container's labels and annotations keep stands in for it.
    pub(super) async fn kill_container(
        &self,
        pod: Option<&ApiPod>,
        id: &str,
        name: &str,
        probe_grace: Option<i64>,
        grace_override: Option<i64>,
        message: &str,
    ) -> Result<(), Error> {
        let restored;
        let (pod, spec) = match pod {
            Some(pod) => (pod, container_spec(pod, name)),
            None => {
                restored = self.restore_specs(id).await;
                match &restored {
                    Some((pod, container)) => (pod, Some(container)),
                    // Gone already, or unreadable: stop it with the defaults.
                    None => return self.stop_container(id, grace_override.unwrap_or(MIN_GRACE_PERIOD_SECONDS)).await,
                }
            }
        };
        let deletion_grace = pod.metadata.deletion_grace_period_seconds;
        let mut grace = deletion_grace.or(probe_grace).or_else(|| pod_grace(Some(pod))).unwrap_or(30);
        let message = if message.is_empty() { format!("Stopping container {name}") } else { message.to_owned() };
        self.event(pod, EventType::Normal, "Killing", message);
        if let Some(grace_override) = grace_override {
            grace = grace_override;
        }
        if let Some(spec) = spec
            && let Some(handler) = spec.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
            && grace > 0
        {
            grace -= self.pre_stop(pod, spec, id, handler, grace).await;
        }
        if grace_override != Some(0) {
            grace = grace.max(MIN_GRACE_PERIOD_SECONDS);
        }
        debug!(container.id = id, container.name = name, grace, "stopping container");
        self.stop_container(id, grace).await
    }

    /// Runs the preStop hook for at most `grace` seconds (upstream `executePreStopHook`) and
    /// returns the whole seconds it took; a failure is an event, never a reason not to stop.
    async fn pre_stop(
        &self,
        pod: &ApiPod,
        spec: &ApiContainer,
        id: &str,
        handler: &LifecycleHandler,
        grace: i64,
    ) -> i64 {
        let Some(hooks) = &self.hooks else { return 0 };
        let started = Instant::now();
        let ip = if handler.http_get.is_some() { self.hook_ip(pod, &[]).await } else { None };
        let target = kubelet_core::hook::Target::new(pod, spec, id, ip.as_deref());
        let bound = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        match tokio::time::timeout(bound, hooks.run(self, target, handler)).await {
            Ok(Ok(())) => debug!(container.name = %spec.name, "the preStop hook completed"),
            Ok(Err(err)) => {
                warn!(error = %err, container.name = %spec.name, "the preStop hook failed");
                // The message stays out of the event, as upstream's: it may carry secrets.
                self.event(pod, EventType::Warning, "FailedPreStopHook", "PreStopHook failed".to_owned());
            }
            Err(_) => {
                debug!(container.name = %spec.name, grace, "the preStop hook did not complete within the grace period")
            }
        }
        i64::try_from(started.elapsed().as_secs()).unwrap_or(i64::MAX)
    }

    /// The pod and container as the container's labels and annotations keep them (upstream
    /// `restoreSpecsFromContainerLabels`); `None` when the runtime cannot say.
    async fn restore_specs(&self, id: &str) -> Option<(ApiPod, ApiContainer)> {
        let request = pb::ContainerStatusRequest { container_id: id.to_owned(), verbose: false };
        let status = self.client.runtime_service().container_status(request).await.ok()?.into_inner().status?;
        Some(labels::restore_specs(&status.labels, &status.annotations))
    }
}

/// The spec of the container `name`: a regular, init or sidecar container.
fn container_spec<'a>(pod: &'a ApiPod, name: &str) -> Option<&'a ApiContainer> {
    let spec = pod.spec.as_ref()?;
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name)
}

pub(super) async fn kill_pod(
    rt: &CriRuntime,
    pod: Option<&ApiPod>,
    running: &runtime::Pod,
    grace_override: Option<i64>,
) -> Result<(), Error> {
    // Sidecars (KEP-753) stop after the regular containers, in reverse spec order, within what
    // is left of the pod's grace period; everything else stops at once.
    let sidecars: Vec<&str> = pod
        .and_then(|p| p.spec.as_ref())
        .map(|s| {
            s.init_containers
                .iter()
                .flatten()
                .filter(|c| kubelet_core::types::is_sidecar(c))
                .map(|c| c.name.as_str())
                .collect()
        })
        .unwrap_or_default();
    // Only running containers are killed as upstream kills them (its running pod holds no
    // other), with the Killing event and the preStop hook. One the runtime holds as created or
    // unknown (a start it lost when it crashed) has nothing to run a hook in: it is only stopped.
    let live = || running.containers.iter().filter(|c| c.state == ContainerState::Running);
    for c in running.containers.iter().filter(|c| matches!(c.state, ContainerState::Created | ContainerState::Unknown))
    {
        rt.stop_container(&c.id, grace_override.unwrap_or(MIN_GRACE_PERIOD_SECONDS)).await?;
    }
    let started = Instant::now();
    let kills = live()
        .filter(|c| !sidecars.contains(&c.name.as_str()))
        .map(|c| async move { rt.kill_container(pod, &c.id, &c.name, None, grace_override, "").await });
    let results = futures::future::join_all(kills).await;
    if let Some(err) = results.into_iter().find_map(Result::err) {
        return Err(err);
    }
    let budget = grace_override.or_else(|| pod_grace(pod));
    for name in sidecars.iter().rev() {
        for c in live().filter(|c| c.name == *name) {
            let spent = i64::try_from(started.elapsed().as_secs()).unwrap_or(i64::MAX);
            let left = budget.map(|b| b.saturating_sub(spent).max(MIN_GRACE_PERIOD_SECONDS));
            rt.kill_container(pod, &c.id, &c.name, None, left, "").await?;
        }
    }
    for sandbox in &running.sandboxes {
        stop_pod_sandbox(rt, &sandbox.id).await?;
    }
    Ok(())
}

/// StopPodSandbox; when the runtime cannot read the sandbox's cached CNI result (a runtime
/// killed while it wrote it leaves it empty, and then fails every stop, for good), that file
/// is removed and the stop tried once more, now without the cached result, as for a sandbox
/// whose network was never cached.
pub(super) async fn stop_pod_sandbox(rt: &CriRuntime, id: &str) -> Result<(), Error> {
    let stop = || async {
        let request = pb::StopPodSandboxRequest { pod_sandbox_id: id.to_owned() };
        rt.client.runtime_service().stop_pod_sandbox(request).await
    };
    let status = match stop().await {
        Ok(_) => return Ok(()),
        Err(status) if status.code() == tonic::Code::NotFound => return Ok(()),
        Err(status) => status,
    };
    if !status.message().contains(UNREADABLE_CNI_RESULT) {
        return Err(Error::status("StopPodSandbox", status));
    }
    let results = rt.config.cni_cache_dir.join("results");
    let removed = remove_unreadable_cni_results(&results, id);
    if removed.is_empty() {
        return Err(Error::status("StopPodSandbox", status));
    }
    warn!(sandbox.id = id, files = ?removed, "removed the sandbox's cached CNI results the runtime could not read");
    match stop().await {
        Ok(_) => Ok(()),
        Err(status) if status.code() == tonic::Code::NotFound => Ok(()),
        Err(status) => Err(Error::status("StopPodSandbox", status)),
    }
}

/// What libcni says when a cached result cannot be read (`failed to get network "x" cached
/// result: ...`).
const UNREADABLE_CNI_RESULT: &str = "cached result: decoding version from network config";

/// Removes the cached CNI results of sandbox `id` in `results` (libcni names them
/// `<network>-<id>-<interface>`) that are not JSON; returns their names. Only regular files
/// go (never a link), and an `id` that is not a plain hex ID matches nothing.
fn remove_unreadable_cni_results(results: &std::path::Path, id: &str) -> Vec<String> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(results) else { return Vec::new() };
    let mut removed = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if !is_file || !name.contains(&format!("-{id}-")) {
            continue;
        }
        let readable =
            std::fs::read(entry.path()).is_ok_and(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).is_ok());
        if !readable && std::fs::remove_file(entry.path()).is_ok() {
            removed.push(name);
        }
    }
    removed
}

/// The pod's own grace period: the deletion's, else the spec's.
fn pod_grace(pod: Option<&ApiPod>) -> Option<i64> {
    let pod = pod?;
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
}

#[cfg(test)]
mod tests {
    use super::remove_unreadable_cni_results;

    #[test]
    fn only_the_sandboxs_unreadable_cni_results_are_removed() {
        let results = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| std::fs::write(results.path().join(name), text).unwrap();
        write("net-abc123-eth0", "");
        write("net-abc123-lo", "{\"cniVersion\": \"1.0.0\"}");
        write("net-def456-eth0", "");
        std::os::unix::fs::symlink("/etc/hostname", results.path().join("net-abc123-eth1")).unwrap();
        assert_eq!(remove_unreadable_cni_results(results.path(), "abc123"), ["net-abc123-eth0"]);
        assert!(results.path().join("net-abc123-lo").exists(), "a readable result stays");
        assert!(results.path().join("net-def456-eth0").exists(), "another sandbox's stays");
        assert!(results.path().join("net-abc123-eth1").exists(), "a link is never removed");
        assert!(remove_unreadable_cni_results(results.path(), "../x").is_empty());
    }
}
