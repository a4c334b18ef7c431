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

    /// Kills one container with upstream's grace rules (`killContainer`).
    pub(super) async fn kill_container(
        &self,
        pod: Option<&ApiPod>,
        id: &str,
        name: &str,
        annotations_grace: Option<i64>,
        grace_override: Option<i64>,
        message: &str,
    ) -> Result<(), Error> {
        let mut grace = pod
            .and_then(|p| {
                p.metadata
                    .deletion_grace_period_seconds
                    .or_else(|| p.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
            })
            .or(annotations_grace)
            .unwrap_or(30);
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
    // Every container at once, each with its own grace period.
    let kills = running.containers.iter().filter(|c| c.state != ContainerState::Exited).map(|c| async move {
        let annotations_grace = None;
        rt.kill_container(pod, &c.id, &c.name, annotations_grace, grace_override, "").await
    });
    let results = futures::future::join_all(kills).await;
    if let Some(err) = results.into_iter().find_map(Result::err) {
        return Err(err);
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
