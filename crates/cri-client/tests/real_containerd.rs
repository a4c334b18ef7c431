//! Smoke test against the real containerd `cargo xtask ci` starts: Version, Status, and one pod
//! sandbox with one busybox container, run and removed without leaving anything behind.

// Reason: test helpers outside `#[test]` functions may panic on broken invariants.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::HashMap, path::PathBuf, time::Duration};

use kubelet_core::testing::RealRuntime;
use kubelet_cri_client::{Client, Config, cgroups, pb};

struct SmokePod {
    uid: String,
    name: String,
    namespace: String,
    log_dir: PathBuf,
    cgroup_parent: String,
    busybox: String,
}

impl SmokePod {
    fn new(rt: &RealRuntime) -> SmokePod {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let uid = format!("smoke-{}-{nanos}", std::process::id());
        let name = "smoke".to_owned();
        let namespace = "kubelet-rs-test".to_owned();
        SmokePod {
            log_dir: rt.scratch_dir.join("pods").join(format!("{namespace}_{name}_{uid}")),
            cgroup_parent: format!("/kubepods/besteffort/pod{uid}"),
            busybox: rt.busybox_image.clone(),
            uid,
            name,
            namespace,
        }
    }

    fn labels(&self) -> HashMap<String, String> {
        HashMap::from([
            ("io.kubernetes.pod.uid".to_owned(), self.uid.clone()),
            ("io.kubernetes.pod.name".to_owned(), self.name.clone()),
            ("io.kubernetes.pod.namespace".to_owned(), self.namespace.clone()),
        ])
    }

    fn sandbox_config(&self) -> pb::PodSandboxConfig {
        pb::PodSandboxConfig {
            metadata: Some(pb::PodSandboxMetadata {
                name: self.name.clone(),
                uid: self.uid.clone(),
                namespace: self.namespace.clone(),
                attempt: 0,
            }),
            hostname: "smoke-host".to_owned(),
            log_directory: self.log_dir.display().to_string(),
            labels: self.labels(),
            linux: Some(pb::LinuxPodSandboxConfig { cgroup_parent: self.cgroup_parent.clone(), ..Default::default() }),
            ..Default::default()
        }
    }

    async fn run(&self, client: &Client) -> Result<(), Box<dyn std::error::Error>> {
        let mut runtime = client.runtime_service();
        let mut images = client.image_service();

        // The image comes over plain HTTP from the registry on 127.0.0.1.
        let image = Some(pb::ImageSpec { image: self.busybox.clone(), ..Default::default() });
        let pulled =
            images.pull_image(pb::PullImageRequest { image: image.clone(), ..Default::default() }).await?.into_inner();
        assert!(!pulled.image_ref.is_empty());

        std::fs::create_dir_all(&self.log_dir)?;
        let config = self.sandbox_config();
        let sandbox_id = runtime
            .run_pod_sandbox(pb::RunPodSandboxRequest { config: Some(config.clone()), ..Default::default() })
            .await?
            .into_inner()
            .pod_sandbox_id;
        let sandbox = runtime
            .pod_sandbox_status(pb::PodSandboxStatusRequest { pod_sandbox_id: sandbox_id.clone(), verbose: false })
            .await?
            .into_inner()
            .status
            .unwrap();
        assert_eq!(sandbox.state, pb::PodSandboxState::SandboxReady as i32);
        let ip = sandbox.network.map(|n| n.ip).unwrap_or_default();
        assert!(ip.parse::<std::net::Ipv4Addr>().is_ok(), "sandbox has a pod IP, got {ip:?}");

        let container_config = pb::ContainerConfig {
            metadata: Some(pb::ContainerMetadata { name: "c0".to_owned(), attempt: 0 }),
            image,
            command: vec!["sh".into(), "-c".into(), "echo hello from kubelet-rs; exec sleep 3600".into()],
            log_path: "c0/0.log".to_owned(),
            labels: self.labels(),
            ..Default::default()
        };
        let container_id = runtime
            .create_container(pb::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.clone(),
                config: Some(container_config),
                sandbox_config: Some(config),
            })
            .await?
            .into_inner()
            .container_id;
        runtime.start_container(pb::StartContainerRequest { container_id: container_id.clone() }).await?;
        let status = container_status(client, &container_id).await?;
        assert_eq!(status.state, pb::ContainerState::ContainerRunning as i32);

        // Its output lands in the CRI log file under the pod log directory.
        let log = self.log_dir.join("c0/0.log");
        let mut content = String::new();
        for _ in 0..100 {
            content = std::fs::read_to_string(&log).unwrap_or_default();
            if content.contains("hello from kubelet-rs") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let line = content.lines().next().unwrap_or_default();
        assert!(line.ends_with(" stdout F hello from kubelet-rs"), "CRI log line, got {line:?}");

        let exec = runtime
            .exec_sync(pb::ExecSyncRequest {
                container_id: container_id.clone(),
                cmd: vec!["hostname".into()],
                timeout: 10,
            })
            .await?
            .into_inner();
        assert_eq!((exec.exit_code, String::from_utf8_lossy(&exec.stdout).trim()), (0, "smoke-host"));

        runtime.stop_container(pb::StopContainerRequest { container_id: container_id.clone(), timeout: 1 }).await?;
        let status = container_status(client, &container_id).await?;
        assert_eq!(status.state, pb::ContainerState::ContainerExited as i32);
        runtime.remove_container(pb::RemoveContainerRequest { container_id: container_id.clone() }).await?;
        let gone = client
            .runtime_service()
            .container_status(pb::ContainerStatusRequest { container_id, verbose: false })
            .await
            .unwrap_err();
        assert_eq!(gone.code(), tonic::Code::NotFound);

        runtime.stop_pod_sandbox(pb::StopPodSandboxRequest { pod_sandbox_id: sandbox_id.clone() }).await?;
        runtime.remove_pod_sandbox(pb::RemovePodSandboxRequest { pod_sandbox_id: sandbox_id }).await?;
        assert!(self.sandboxes(client).await?.is_empty());
        Ok(())
    }

    async fn sandboxes(&self, client: &Client) -> Result<Vec<pb::PodSandbox>, tonic::Status> {
        let filter = pb::PodSandboxFilter {
            label_selector: HashMap::from([("io.kubernetes.pod.uid".to_owned(), self.uid.clone())]),
            ..Default::default()
        };
        Ok(client
            .runtime_service()
            .list_pod_sandbox(pb::ListPodSandboxRequest { filter: Some(filter) })
            .await?
            .into_inner()
            .items)
    }

    /// Removes whatever the test left, as a kubelet would: sandboxes, the pod cgroup, the log dir.
    async fn cleanup(&self, client: &Client) -> Result<(), Box<dyn std::error::Error>> {
        for sandbox in self.sandboxes(client).await? {
            let mut runtime = client.runtime_service();
            match runtime.stop_pod_sandbox(pb::StopPodSandboxRequest { pod_sandbox_id: sandbox.id.clone() }).await {
                Ok(_) => {}
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) => return Err(status.into()),
            }
            runtime.remove_pod_sandbox(pb::RemovePodSandboxRequest { pod_sandbox_id: sandbox.id }).await?;
        }
        cgroups::remove_pod_cgroup(std::path::Path::new(cgroups::CGROUP_ROOT), &self.cgroup_parent)?;
        if self.log_dir.exists() {
            std::fs::remove_dir_all(&self.log_dir)?;
        }
        Ok(())
    }
}

async fn container_status(client: &Client, id: &str) -> Result<pb::ContainerStatus, tonic::Status> {
    let request = pb::ContainerStatusRequest { container_id: id.to_owned(), verbose: false };
    Ok(client.runtime_service().container_status(request).await?.into_inner().status.unwrap_or_default())
}

#[tokio::test]
async fn real_containerd_smoke() {
    let Some(rt) = RealRuntime::from_env("real_containerd_smoke") else { return };
    let client = Client::connect(&Config::new(&rt.endpoint)).unwrap();

    let version = client.version().await.unwrap();
    assert_eq!(version.runtime_name, "containerd");
    assert_eq!(version.runtime_api_version, "v1");
    let status = client.status().await.unwrap();
    for condition in ["RuntimeReady", "NetworkReady"] {
        assert!(status.conditions.iter().any(|c| c.r#type == condition && c.status), "{condition} in {status:?}");
    }

    let pod = SmokePod::new(&rt);
    let result = pod.run(&client).await;
    let cleanup = pod.cleanup(&client).await;
    result.unwrap();
    cleanup.unwrap();
    for hierarchy in ["cpu", "memory", "pids", "unified"] {
        let dir = PathBuf::from(cgroups::CGROUP_ROOT).join(hierarchy).join(pod.cgroup_parent.trim_start_matches('/'));
        assert!(!dir.exists(), "pod cgroup {} left behind", dir.display());
    }
    assert!(!pod.log_dir.exists());
}

#[tokio::test]
async fn real_unimplemented_features_are_reported_not_fatal() {
    let Some(rt) = RealRuntime::from_env("real_unimplemented_features_are_reported_not_fatal") else { return };
    let client = Client::connect(&Config::new(&rt.endpoint)).unwrap();
    // containerd 1.6 has no RuntimeConfig; the client classifies that without string matching.
    let err = client.runtime_config().await.unwrap_err();
    assert!(err.is_unimplemented(), "{err:?}");
    // The connection is still good afterwards.
    client.version().await.unwrap();
}
