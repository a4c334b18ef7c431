//! A node agent whose runtime runs each container's command as a host process in the pod's own
//! network namespace: no image, a `Runtime` of a hundred lines, its pods networked by CNI.
//!
//! ```sh
//! cargo run -p kubelet-sdk --features cni --example process_agent -- /tmp/manifests /tmp/agent-root /etc/cni/net.d
//! kubelet-rs get pods --root-dir /tmp/agent-root
//! ```
//!
//! A manifest written to `/tmp/manifests` becomes a pod with an IP from the first network in
//! `/etc/cni/net.d` (and its `hostPort`s, with the `portmap` plugin); each container's command
//! runs in its namespace, restarted as its `restartPolicy` says. Removing the manifest kills the
//! processes and tears the network down.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use kubelet_sdk::{
    cni::{Cni, CniNetworkPlugin, netns, pod_network::DEFAULT_NETNS_DIR},
    core::{
        Backoff, PodUid, ProbeResults,
        clock::wall_now,
        k8s_openapi::api::core::v1::Pod as PodSpec,
        network::Networked,
        runtime::{ContainerState, ContainerStatus, Pod, PodStatus, PodSyncResult, Runtime, RuntimeStatus, Version},
        volume::PodVolumes,
    },
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
    /// Marks each running container whose process has exited as exited, with its exit code.
    fn reap(&mut self) {
        for container in &mut self.status.container_statuses {
            let Some(process) = self.processes.get_mut(&container.id) else { continue };
            if let (ContainerState::Running, Ok(Some(exit))) = (container.state, process.try_wait()) {
                container.state = ContainerState::Exited;
                container.exit_code = exit.code().unwrap_or(137);
                container.finished_at = Some(wall_now());
            }
        }
    }

    /// Starts each container of `spec` that has never run, or has exited and may restart, in
    /// the network namespace at `network`.
    fn start_due_containers(&mut self, spec: &PodSpec, network: Option<&Path>) {
        let pod_spec = spec.spec.clone().unwrap_or_default();
        for container in &pod_spec.containers {
            let last = self.status.container_status(&container.name);
            // Never run, or exited and allowed to restart by the pod's restart policy.
            let due = match (last, pod_spec.restart_policy.as_deref()) {
                (None, _) => true,
                (Some(last), _) if last.state != ContainerState::Exited => false,
                (Some(_), Some("Never")) => false,
                (Some(last), Some("OnFailure")) => last.exit_code != 0,
                (Some(_), _) => true,
            };
            if !due {
                continue;
            }
            let restart_count = last.map_or(0, |last| last.restart_count + 1);
            let id = format!("{}-{}-{restart_count}", self.status.uid, container.name);
            let mut status = ContainerStatus::new(&id, &container.name, ContainerState::Running);
            status.restart_count = restart_count;
            status.started_at = Some(wall_now());
            let argv: Vec<&String> = container.command.iter().chain(&container.args).flatten().collect();
            match spawn(&argv, network) {
                Ok(process) => drop(self.processes.insert(id, process)),
                Err(error) => {
                    status.state = ContainerState::Exited;
                    status.exit_code = 127;
                    status.message = error.to_string();
                }
            }
            self.status.container_statuses.insert(0, status);
        }
    }
}

/// Runs `argv` as a process in the network namespace at `network`.
fn spawn(argv: &[&String], network: Option<&Path>) -> std::io::Result<Child> {
    let Some((program, args)) = argv.split_first() else {
        return Err(std::io::Error::other("the container has no command"));
    };
    let mut command = std::process::Command::new(program);
    command.args(args);
    if let Some(namespace) = network {
        netns::join_on_spawn(&mut command, namespace)?;
    }
    tokio::process::Command::from(command).kill_on_drop(true).spawn()
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
        pods.values_mut().for_each(ProcessPod::reap);
        Ok(pods.values().map(|pod| pod.status.to_running_pod()).collect())
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
        status: &PodStatus,
        _backoff: &Backoff,
        _probes: &ProbeResults,
        _volumes: &PodVolumes,
    ) -> PodSyncResult {
        let mut pods = self.pods.lock().await;
        let pod = pods
            .entry(PodUid::of(spec))
            .or_insert_with(|| ProcessPod { status: PodStatus::of(spec), processes: HashMap::new() });
        pod.reap();
        pod.start_due_containers(spec, status.network_namespace());
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
    let (Some(manifests), Some(root_dir), Some(cni_conf_dir)) = (args.next(), args.next(), args.next()) else {
        return Err("usage: process_agent MANIFESTS ROOT_DIR CNI_CONF_DIR".into());
    };
    // Debian's CNI plugins, and the upstream release's.
    let cni = Cni::new(vec!["/usr/lib/cni".into(), "/opt/cni/bin".into()]);
    let network = CniNetworkPlugin::open(cni, cni_conf_dir, DEFAULT_NETNS_DIR).await?;
    let runtime = Arc::new(Networked::new(Processes::default(), network));
    kubelet_sdk::Node::new("node-1").root_dir(root_dir).static_pods(manifests).run(runtime).await?;
    Ok(())
}
