//! A node agent whose runtime runs each container's command as a process on the host: no image
//! and no isolation, just a `Runtime` of a hundred lines inside the library's agent.
//!
//! ```sh
//! cargo run -p kubelet-sdk --example process_agent -- /tmp/manifests /tmp/agent-root
//! kubelet-rs get pods --root-dir /tmp/agent-root
//! ```
//!
//! A pod manifest written to `/tmp/manifests` becomes a pod: each container's `command` and
//! `args` run as a host process, restarted when it exits as the pod's `restartPolicy` says.
//! Removing the manifest kills the processes.

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use kubelet_sdk::core::{
    Backoff, PodUid, ProbeResults,
    clock::wall_now,
    k8s_openapi::api::core::v1::Pod as PodSpec,
    runtime::{ContainerState, ContainerStatus, Pod, PodStatus, PodSyncResult, Runtime, RuntimeStatus, Version},
    volume::PodVolumes,
};
use tokio::{process::Child, sync::Mutex};

/// A runtime whose containers are host processes.
#[derive(Default)]
struct Processes {
    pods: Mutex<HashMap<PodUid, ProcessPod>>,
}

/// One pod: its status (newest container instance first) and the process of each container
/// instance, by container ID.
struct ProcessPod {
    status: PodStatus,
    processes: HashMap<String, Child>,
}

impl ProcessPod {
    fn new(spec: &PodSpec) -> Self {
        ProcessPod { status: PodStatus::of(spec), processes: HashMap::new() }
    }

    /// Marks each running container whose process has exited as exited, with its exit code.
    fn reap(&mut self) {
        for container in &mut self.status.container_statuses {
            if container.state != ContainerState::Running {
                continue;
            }
            let Some(process) = self.processes.get_mut(&container.id) else { continue };
            if let Ok(Some(exit)) = process.try_wait() {
                container.state = ContainerState::Exited;
                container.exit_code = exit.code().unwrap_or(137);
                container.finished_at = Some(wall_now());
            }
        }
    }

    /// Starts each container of `spec` that has never run, or has exited and may restart.
    fn start_due_containers(&mut self, spec: &PodSpec) {
        let pod_spec = spec.spec.clone().unwrap_or_default();
        let policy = pod_spec.restart_policy.as_deref();
        for container in &pod_spec.containers {
            let last = self.status.container_status(&container.name);
            let due = match last {
                None => true,
                Some(last) => last.state == ContainerState::Exited && may_restart(policy, last.exit_code),
            };
            if !due {
                continue;
            }
            let restart_count = last.map_or(0, |last| last.restart_count + 1);
            let argv: Vec<&String> = container.command.iter().chain(&container.args).flatten().collect();
            let started = self.start(&container.name, restart_count, &argv);
            self.status.container_statuses.insert(0, started);
        }
    }

    /// Runs `argv` as container `name`'s instance number `restart_count`; its status.
    fn start(&mut self, name: &str, restart_count: u32, argv: &[&String]) -> ContainerStatus {
        let id = format!("{}-{name}-{restart_count}", self.status.uid);
        let mut status = ContainerStatus::new(&id, name, ContainerState::Running);
        status.restart_count = restart_count;
        status.started_at = Some(wall_now());
        let Some((program, args)) = argv.split_first() else {
            status.state = ContainerState::Exited;
            status.message = "the container has no command".to_owned();
            return status;
        };
        match tokio::process::Command::new(program).args(args).kill_on_drop(true).spawn() {
            Ok(process) => {
                self.processes.insert(id, process);
            }
            Err(error) => {
                status.state = ContainerState::Exited;
                status.exit_code = 127;
                status.message = error.to_string();
            }
        }
        status
    }
}

/// Whether a container that exited with `exit_code` restarts under the pod's restart policy.
fn may_restart(policy: Option<&str>, exit_code: i32) -> bool {
    match policy {
        Some("Never") => false,
        Some("OnFailure") => exit_code != 0,
        _ => true,
    }
}

impl Runtime for Processes {
    type Error = std::io::Error;

    async fn version(&self) -> Result<Version, Self::Error> {
        Ok(Version::new("processes", "0.1.0", "v1"))
    }

    async fn status(&self) -> Result<RuntimeStatus, Self::Error> {
        Ok(RuntimeStatus::ready())
    }

    async fn get_pods(&self, _all: bool) -> Result<Vec<Pod>, Self::Error> {
        let mut pods = self.pods.lock().await;
        let mut running = Vec::new();
        for pod in pods.values_mut() {
            pod.reap();
            running.push(pod.status.to_running_pod());
        }
        Ok(running)
    }

    async fn get_pod_status(&self, uid: &PodUid, name: &str, namespace: &str) -> Result<PodStatus, Self::Error> {
        let mut pods = self.pods.lock().await;
        let Some(pod) = pods.get_mut(uid) else { return Ok(PodStatus::new(uid.clone(), name, namespace)) };
        pod.reap();
        Ok(pod.status.clone())
    }

    async fn sync_pod(
        &self,
        spec: &PodSpec,
        _status: &PodStatus,
        _backoff: &Backoff,
        _probes: &ProbeResults,
        _volumes: &PodVolumes,
    ) -> PodSyncResult {
        let mut pods = self.pods.lock().await;
        let pod = pods.entry(PodUid::of(spec)).or_insert_with(|| ProcessPod::new(spec));
        pod.reap();
        pod.start_due_containers(spec);
        PodSyncResult::default()
    }

    async fn kill_pod(&self, _spec: Option<&PodSpec>, running: &Pod, _grace: Option<i64>) -> Result<(), Self::Error> {
        let mut pods = self.pods.lock().await;
        let Some(pod) = pods.get_mut(&running.uid) else { return Ok(()) };
        for process in pod.processes.values_mut() {
            process.kill().await?;
        }
        pod.reap();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).map(PathBuf::from);
    let (Some(manifests), Some(root_dir)) = (args.next(), args.next()) else {
        return Err("usage: process_agent MANIFESTS ROOT_DIR".into());
    };
    let runtime = Arc::new(Processes::default());
    kubelet_sdk::Node::new("node-1").root_dir(root_dir).static_pods(manifests).run(runtime).await?;
    Ok(())
}
