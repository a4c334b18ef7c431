//! The PLEGs against the real containerd `cargo xtask ci` starts: a container stopped behind the
//! kubelet's back is reported dead within two relist periods, and the evented PLEG, which has no
//! container events on containerd 1.6, relists on containerd's own task events instead of every
//! second.

// Reason: test helpers outside `#[test]` functions may panic on broken invariants.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use cri_client::{Client, Config as CriConfig, CriRuntime, manager, pb};
use k8s_openapi::api::core::v1::Pod;
use kubelet_core::{
    Backoff, Cache, Pleg, PodLifecycleEventKind, PodUid, Runtime, events::RingRecorder, runtime::ContainerState,
    testing::RealRuntime, tokio_util::sync::CancellationToken,
};
use kubelet_pleg::{Config, EventedPleg, GenericPleg, evented};

fn setup(rt: &RealRuntime, name: &str) -> (Client, Arc<CriRuntime>, Pod) {
    let logs = rt.scratch_dir.join(name);
    let client = Client::connect(&CriConfig::new(&rt.endpoint)).unwrap();
    let config = manager::Config::new("test-node")
        .pod_logs_dir(logs.join("pods"))
        .container_logs_dir(logs.join("containers"))
        .pods_dir(logs.join("kubelet-pods"));
    let runtime = Arc::new(CriRuntime::new(client.clone(), config, Arc::new(RingRecorder::default())));
    (client, runtime, rt.sleeping_pod(name, "kubelet-rs-test"))
}

/// Removes a test's pod when the test panics before its cleanup, so a failed test leaks no pod;
/// in a thread of its own, with its own tokio runtime and client, as the test's is unwinding.
struct RemoveOnPanic {
    rt: RealRuntime,
    name: &'static str,
    pod: Pod,
}

impl Drop for RemoveOnPanic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let (rt, name, pod) = (self.rt.clone(), self.name, self.pod.clone());
        let removal = std::thread::spawn(move || {
            let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            if let Err(err) = tokio.block_on(async { setup(&rt, name).1.remove_pod(&pod).await }) {
                eprintln!("removing the failed test's pod: {err}");
            }
        });
        let _ = removal.join();
    }
}

#[tokio::test]
async fn real_container_stopped_behind_the_kubelets_back_is_reported_dead() {
    let Some(rt) = RealRuntime::from_env("real_container_stopped_behind_the_kubelets_back_is_reported_dead") else {
        return;
    };
    let (client, runtime, pod) = setup(&rt, "pleg");
    let _removal = RemoveOnPanic { rt: rt.clone(), name: "pleg", pod: pod.clone() };
    let uid = PodUid::of(&pod);

    let cache = Arc::new(Cache::new());
    let (pleg, mut events) = GenericPleg::new(runtime.clone(), cache.clone(), Config::default());
    let pleg = Arc::new(pleg);
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let (pleg, cancel) = (pleg.clone(), cancel.clone());
        async move { pleg.run(cancel).await }
    });

    let outcome = async {
        let status = runtime.get_pod_status(&uid, "pleg", "kubelet-rs-test").await.unwrap();
        let result = runtime
            .sync_pod(&pod, &status, &Backoff::default(), &kubelet_core::ProbeResults::new(), &Default::default())
            .await;
        assert!(!result.is_err(), "{result:?}");
        // The sandbox and the container start.
        let mut started = 0;
        while started < 2 {
            let event =
                tokio::time::timeout(Duration::from_secs(5), events.recv()).await.expect("ContainerStarted").unwrap();
            if event.id == uid && event.kind == PodLifecycleEventKind::ContainerStarted {
                started += 1;
            }
        }
        assert!(pleg.healthy().is_ok());
        let id = cache.get(&uid).status.container_status("app").expect("cached status").id.clone();

        // Stopped behind the kubelet's back, straight through the CRI.
        client
            .runtime_service()
            .stop_container(pb::StopContainerRequest { container_id: id.clone(), timeout: 0 })
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            let event = tokio::time::timeout_at(deadline, events.recv())
                .await
                .expect("ContainerDied within two relist periods")
                .unwrap();
            if event.id == uid
                && event.kind == PodLifecycleEventKind::ContainerDied
                && event.container_id.as_deref() == Some(id.as_str())
            {
                break;
            }
        }
        assert_eq!(
            cache.get(&uid).status.container_status("app").unwrap().state,
            ContainerState::Exited,
            "the cache follows"
        );
    };
    outcome.await;
    cancel.cancel();
    task.await.unwrap();
    runtime.remove_pod(&pod).await.unwrap();
}

/// Waits until `cache`'s time has moved `count` times (each relist of a generic PLEG moves it),
/// within 10 s.
async fn relists(cache: &Cache, count: usize) {
    let mut seen = cache.timestamp();
    let mut moved = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while moved < count {
        assert!(tokio::time::Instant::now() < deadline, "the reference PLEG relisted {moved} of {count} times in 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = cache.timestamp();
        if now != seen {
            seen = now;
            moved += 1;
        }
    }
}

#[tokio::test]
async fn real_evented_pleg_relists_on_containerd_hints_and_not_while_idle() {
    let Some(rt) = RealRuntime::from_env("real_evented_pleg_relists_on_containerd_hints_and_not_while_idle") else {
        return;
    };
    let (client, runtime, pod) = setup(&rt, "evented");
    let _removal = RemoveOnPanic { rt: rt.clone(), name: "evented", pod: pod.clone() };
    let uid = PodUid::of(&pod);
    let cache = Arc::new(Cache::new());
    let (pleg, mut events) = EventedPleg::new(runtime.clone(), cache.clone(), evented::Config::default());
    let pleg = Arc::new(pleg);
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let (pleg, cancel) = (pleg.clone(), cancel.clone());
        async move { pleg.run(cancel).await }
    });
    // The clock the idle check reads: a generic PLEG beside it, relisting every second into a
    // cache of its own.
    let reference_cache = Arc::new(Cache::new());
    let (reference, _reference_events) = GenericPleg::new(runtime.clone(), reference_cache.clone(), Config::default());
    let reference_task = tokio::spawn({
        let cancel = cancel.clone();
        async move { reference.run(cancel).await }
    });
    let outcome = async {
        let status = runtime.get_pod_status(&uid, "evented", "kubelet-rs-test").await.unwrap();
        let result = runtime
            .sync_pod(&pod, &status, &Backoff::default(), &kubelet_core::ProbeResults::new(), &Default::default())
            .await;
        assert!(!result.is_err(), "{result:?}");
        let id = loop {
            let event = tokio::time::timeout(Duration::from_secs(2), events.recv())
                .await
                .expect("the start seen within 2 s")
                .unwrap();
            if event.id == uid
                && event.kind == PodLifecycleEventKind::ContainerStarted
                && let Some(app) = cache.get(&uid).status.container_status("app")
            {
                break app.id.clone();
            }
        };
        assert!(pleg.healthy().is_ok());

        // Idle: once the follow-ups of the last hint (1 s) are over, the reference relists three
        // times and the evented PLEG not once (hints never move the cache's time; relists do).
        relists(&reference_cache, 2).await;
        let idle_since = cache.timestamp();
        relists(&reference_cache, 3).await;
        assert_eq!(cache.timestamp(), idle_since, "no relist while nothing changed");

        // Stopped behind the kubelet's back: containerd's task exit makes the PLEG relist.
        client
            .runtime_service()
            .stop_container(pb::StopContainerRequest { container_id: id.clone(), timeout: 0 })
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        loop {
            let event = tokio::time::timeout_at(deadline, events.recv())
                .await
                .expect("ContainerDied within 500 ms, well inside the 1 s relist period")
                .unwrap();
            if event.id == uid
                && event.kind == PodLifecycleEventKind::ContainerDied
                && event.container_id.as_deref() == Some(id.as_str())
            {
                break;
            }
        }
    };
    outcome.await;
    cancel.cancel();
    task.await.unwrap();
    reference_task.await.unwrap();
    runtime.remove_pod(&pod).await.unwrap();
}
