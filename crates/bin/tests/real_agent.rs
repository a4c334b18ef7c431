//! The `kubelet-rs run` binary against the real containerd, driven through static pod files:
//! a manifest becomes a running pod, a restarted agent re-adopts it untouched, a container
//! stopped behind the agent's back is restarted, a removed manifest stops the pod, and SIGTERM
//! leaves running pods running.

// Reason: test helpers outside `#[test]` functions may panic on broken invariants.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use cri_client::{Client, Config, CriRuntime, RuntimeConfig, pb};
use kubelet_core::{Runtime, events::RingRecorder, runtime::ContainerState, testing::RealRuntime};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

struct Agent {
    child: Child,
}

impl Agent {
    fn start(rt: &RealRuntime, dir: &Path, node: &str) -> Agent {
        let log = std::fs::File::create(dir.join(format!("agent-{}.log", std::process::id()))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kubelet-rs"))
            .args(["run", "--container-runtime-endpoint", &rt.endpoint, "--hostname-override", node])
            .arg("--pod-manifest-path")
            .arg(dir.join("manifests"))
            .arg("--root-dir")
            .arg(dir.join("root"))
            .arg("--pod-logs-dir")
            .arg(dir.join("pods"))
            .arg("--container-logs-dir")
            .arg(dir.join("containers"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Agent { child }
    }

    fn signal(&mut self, signal: Signal) {
        kill(Pid::from_raw(i32::try_from(self.child.id()).unwrap()), signal).unwrap();
    }

    /// Waits for the process to exit, at most `within`.
    async fn exited_within(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn manifest(node_pod: &str, image: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {node_pod}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {image}\n    command: [\"sh\", \"-c\", \"{script}\"]\n"
    )
}

/// The runtime's view of the static pod named `name`, once `done` holds (at most 20 s).
async fn wait_for(
    runtime: &CriRuntime,
    name: &str,
    what: &str,
    done: impl Fn(&kubelet_core::runtime::PodStatus) -> bool,
) -> kubelet_core::runtime::PodStatus {
    for _ in 0..200 {
        let pods = runtime.get_pods(true).await.unwrap();
        if let Some(pod) = pods.into_iter().find(|p| p.name == name) {
            let status = runtime.get_pod_status(&pod.uid, &pod.name, &pod.namespace).await.unwrap();
            if done(&status) {
                return status;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

fn running(status: &kubelet_core::runtime::PodStatus) -> bool {
    status.container_status("app").is_some_and(|c| c.state == ContainerState::Running)
}

#[tokio::test]
async fn real_static_pod_lifecycle_through_the_agent() {
    let Some(rt) = RealRuntime::from_env("real_static_pod_lifecycle_through_the_agent") else { return };
    let dir = rt.scratch_dir.join(format!("agent-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    let node = format!("node-{}", std::process::id());
    let name = format!("web-{node}");
    let client = Client::connect(&Config::new(&rt.endpoint)).unwrap();
    let runtime = Arc::new(CriRuntime::new(
        client.clone(),
        RuntimeConfig::new(&node)
            .pod_logs_dir(dir.join("pods"))
            .container_logs_dir(dir.join("containers"))
            .pods_dir(dir.join("root/pods")),
        Arc::new(RingRecorder::default()),
    ));

    let outcome = async {
        std::fs::write(dir.join("manifests/web.yaml"), manifest("web", &rt.busybox_image, "exec sleep 3600")).unwrap();
        let mut agent = Agent::start(&rt, &dir, &node);
        let first = wait_for(&runtime, &name, "the pod to run", running).await;

        // SIGKILL and restart: the pod is re-adopted as it is.
        agent.signal(Signal::SIGKILL);
        assert!(agent.exited_within(Duration::from_secs(5)).await);
        let mut agent = Agent::start(&rt, &dir, &node);
        tokio::time::sleep(Duration::from_secs(4)).await;
        let after = wait_for(&runtime, &name, "the pod after a restart", running).await;
        assert_eq!(after.sandbox_statuses[0].id, first.sandbox_statuses[0].id, "same sandbox");
        assert_eq!(
            after.container_status("app").unwrap().id,
            first.container_status("app").unwrap().id,
            "same container"
        );
        assert_eq!(after.container_status("app").unwrap().restart_count, 0);

        // A container stopped behind the agent's back is restarted.
        let id = after.container_status("app").unwrap().id.clone();
        client
            .runtime_service()
            .stop_container(pb::StopContainerRequest { container_id: id.clone(), timeout: 0 })
            .await
            .unwrap();
        let restarted = wait_for(&runtime, &name, "the container to be restarted", |s| {
            running(s) && s.container_status("app").unwrap().id != id
        })
        .await;
        assert_eq!(restarted.container_status("app").unwrap().restart_count, 1);

        // A removed manifest stops the pod.
        std::fs::remove_file(dir.join("manifests/web.yaml")).unwrap();
        wait_for(&runtime, &name, "the pod to stop", |s| !s.is_running()).await;

        // SIGTERM: the agent leaves promptly and running pods keep running.
        std::fs::write(dir.join("manifests/other.yaml"), manifest("other", &rt.busybox_image, "exec sleep 3600"))
            .unwrap();
        let other = format!("other-{node}");
        let before = wait_for(&runtime, &other, "the second pod to run", running).await;
        agent.signal(Signal::SIGTERM);
        assert!(agent.exited_within(Duration::from_secs(5)).await, "exits within 5 s of SIGTERM");
        let still = wait_for(&runtime, &other, "the second pod to keep running", running).await;
        assert_eq!(still.container_status("app").unwrap().id, before.container_status("app").unwrap().id);
    };
    outcome.await;

    // Clean up as a kubelet would.
    for pod in runtime.get_pods(true).await.unwrap().into_iter().filter(|p| p.name.ends_with(&node)) {
        let api = k8s_openapi::api::core::v1::Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                uid: Some(pod.uid.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        runtime.remove_pod(&api).await.unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _: PathBuf = dir;
}
