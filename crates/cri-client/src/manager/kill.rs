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
