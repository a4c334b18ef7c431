//! Stopping containers and pods within their grace periods (upstream `killContainer`, `KillPod`).

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
    /// period, else `probe_grace` (a failed probe's own), else the pod's, at least 2 s, unless
    /// `grace_override` says otherwise.
    pub(super) async fn kill_container(
        &self,
        pod: Option<&ApiPod>,
        id: &str,
        name: &str,
        probe_grace: Option<i64>,
        grace_override: Option<i64>,
        message: &str,
    ) -> Result<(), Error> {
        let deletion_grace = pod.and_then(|p| p.metadata.deletion_grace_period_seconds);
        let mut grace = deletion_grace.or(probe_grace).or_else(|| pod_grace(pod)).unwrap_or(30);
        if let Some(pod) = pod {
            let message = if message.is_empty() { format!("Stopping container {name}") } else { message.to_owned() };
            self.event(pod, EventType::Normal, "Killing", message);
        }
        // The preStop hook (delivered with the probes and hooks) would run here and shorten `grace`.
        grace = grace.max(MIN_GRACE_PERIOD_SECONDS);
        if let Some(grace_override) = grace_override {
            grace = grace_override;
        }
        debug!(container.id = id, container.name = name, grace, "stopping container");
        self.stop_container(id, grace).await
    }
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
    let live = || running.containers.iter().filter(|c| c.state != ContainerState::Exited);
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
        let request = pb::StopPodSandboxRequest { pod_sandbox_id: sandbox.id.clone() };
        match rt.client.runtime_service().stop_pod_sandbox(request).await {
            Ok(_) => {}
            Err(status) if status.code() == tonic::Code::NotFound => {}
            Err(status) => return Err(Error::status("StopPodSandbox", status)),
        }
    }
    Ok(())
}

/// The pod's own grace period: the deletion's, else the spec's.
fn pod_grace(pod: Option<&ApiPod>) -> Option<i64> {
    let pod = pod?;
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
}
