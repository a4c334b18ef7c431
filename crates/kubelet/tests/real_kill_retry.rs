//! A whole agent on the real containerd whose runtime fails to stop a pod twice: the kill is
//! retried until the pod is stopped, though the pod already left the config.

// Reason: test helpers outside `#[test]` functions may panic on broken invariants.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod as ApiPod;
use kubelet_core::{
    Backoff, Operation, PodUid, PodUpdate, Runtime, Source,
    events::RingRecorder,
    runtime::{ExecResult, GcPolicy, Image, Pod, PodStatus, PodSyncResult, RuntimeStatus, Version},
    testing::RealRuntime,
};
use kubelet_cri_client::{Client, Config, CriRuntime, manager};
use kubelet_node::{Agent, agent};
use tokio_util::sync::CancellationToken;

/// The real runtime, except that its next `kill_pod` calls fail as a StopContainer error would.
struct FailingKills {
    inner: CriRuntime,
    failures_left: AtomicUsize,
    kills: AtomicUsize,
}

#[derive(Debug, thiserror::Error)]
enum FailingError {
    #[error("CRI StopContainer failed: injected failure")]
    Injected,
    #[error(transparent)]
    Cri(#[from] kubelet_cri_client::Error),
}

impl Runtime for FailingKills {
    type Error = FailingError;

    async fn version(&self) -> Result<Version, FailingError> {
        Ok(self.inner.version().await?)
    }
    async fn status(&self) -> Result<RuntimeStatus, FailingError> {
        Ok(self.inner.status().await?)
    }
    async fn get_pods(&self, all: bool) -> Result<Vec<Pod>, FailingError> {
        Ok(self.inner.get_pods(all).await?)
    }
    async fn get_pod_status(&self, uid: &PodUid, name: &str, namespace: &str) -> Result<PodStatus, FailingError> {
        Ok(self.inner.get_pod_status(uid, name, namespace).await?)
    }
    async fn sync_pod(
        &self,
        pod: &ApiPod,
        status: &PodStatus,
        backoff: &Backoff,
        probes: &kubelet_core::ProbeResults,
        volumes: &kubelet_core::volume::PodVolumes,
    ) -> PodSyncResult {
        self.inner.sync_pod(pod, status, backoff, probes, volumes).await
    }
    async fn kill_pod(&self, pod: Option<&ApiPod>, running: &Pod, grace: Option<i64>) -> Result<(), FailingError> {
        self.kills.fetch_add(1, Ordering::SeqCst);
        let fail = self.failures_left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if fail {
            return Err(FailingError::Injected);
        }
        Ok(self.inner.kill_pod(pod, running, grace).await?)
    }
    async fn pull_image(&self, image: &str) -> Result<String, FailingError> {
        Ok(self.inner.pull_image(image).await?)
    }
    async fn image_ref(&self, image: &str) -> Result<Option<String>, FailingError> {
        Ok(self.inner.image_ref(image).await?)
    }
    async fn list_images(&self) -> Result<Vec<Image>, FailingError> {
        Ok(self.inner.list_images().await?)
    }
    async fn remove_image(&self, image: &str) -> Result<(), FailingError> {
        Ok(self.inner.remove_image(image).await?)
    }
    async fn exec_sync(&self, id: &str, cmd: &[String], timeout: Duration) -> Result<ExecResult, FailingError> {
        Ok(self.inner.exec_sync(id, cmd, timeout).await?)
    }
    async fn delete_container(&self, id: &str) -> Result<(), FailingError> {
        Ok(self.inner.delete_container(id).await?)
    }
    async fn remove_pod_content(&self, uid: &PodUid) -> Result<(), FailingError> {
        Ok(self.inner.remove_pod_content(uid).await?)
    }
    async fn garbage_collect(&self, policy: &GcPolicy, ready: bool, evict: bool) -> Result<(), FailingError> {
        Ok(self.inner.garbage_collect(policy, ready, evict).await?)
    }
}

#[tokio::test]
async fn real_a_kill_that_fails_twice_is_retried_until_the_pod_stops() {
    let Some(rt) = RealRuntime::from_env("real_a_kill_that_fails_twice_is_retried_until_the_pod_stops") else {
        return;
    };
    let dir = rt.scratch_dir.join(format!("kill-retry-{}", std::process::id()));
    let node = format!("kill-retry-{}", std::process::id());
    let client = Client::connect(&Config::new(&rt.endpoint)).unwrap();
    let cri = CriRuntime::new(
        client,
        manager::Config::new(&node)
            .pod_logs_dir(dir.join("pods"))
            .container_logs_dir(dir.join("containers"))
            .pods_dir(dir.join("root/pods")),
        Arc::new(RingRecorder::default()),
    );
    let runtime = Arc::new(FailingKills { inner: cri, failures_left: AtomicUsize::new(0), kills: AtomicUsize::new(0) });
    let cancel = CancellationToken::new();
    let config = agent::Config::new(kubelet_node::Config::new(&node).root_dir(dir.join("root")), [Source::File]);
    let agent = Agent::builder(runtime.clone(), config).cancel(cancel.clone()).build(
        |runtime, cache| kubelet_pleg::GenericPleg::new(runtime, cache, Default::default()),
        |parts| {
            // A short error backoff keeps the test short; the retry rule is the same.
            let config = kubelet_podworkers::Config::default().backoff_period(Duration::from_secs(1));
            kubelet_podworkers::PodWorkers::new(parts.syncer, parts.cache, parts.work_queue, config, parts.cancel)
        },
    );
    let (updates, rx) = tokio::sync::mpsc::channel(8);
    let running = tokio::spawn(agent.run(rx));

    let mut pod = rt.sleeping_pod(&format!("victim-{node}"), "default");
    pod.spec.as_mut().unwrap().termination_grace_period_seconds = Some(1);
    let uid = PodUid::of(&pod);
    let runs = |runtime: Arc<FailingKills>, uid: PodUid| async move {
        let status = runtime.inner.get_pod_status(&uid, "", "").await.unwrap();
        status.is_running()
    };
    updates.send(PodUpdate::new(Operation::Add, Source::File, vec![Arc::new(pod.clone())])).await.unwrap();
    let mut started = false;
    for _ in 0..300 {
        if runs(runtime.clone(), uid.clone()).await {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(started, "the pod never ran");

    // The pod leaves the config; its first two kills fail.
    runtime.failures_left.store(2, Ordering::SeqCst);
    updates.send(PodUpdate::new(Operation::Remove, Source::File, vec![Arc::new(pod)])).await.unwrap();
    let mut stopped = false;
    for _ in 0..300 {
        if !runs(runtime.clone(), uid.clone()).await {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kills = runtime.kills.load(Ordering::SeqCst);
    cancel.cancel();
    running.await.unwrap();
    let leftover = runtime.inner.get_pods(true).await.unwrap().into_iter().filter(|p| p.uid == uid).count();
    if leftover > 0 {
        let api = ApiPod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                uid: Some(uid.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        runtime.inner.remove_pod(&api).await.unwrap();
    }
    assert!(stopped, "the pod still runs after {kills} kills");
    assert!(kills >= 3, "two failed kills and one that worked: {kills}");
    let _ = std::fs::remove_dir_all(&dir);
}
