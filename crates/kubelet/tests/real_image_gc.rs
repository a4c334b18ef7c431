//! Image garbage collection against the real containerd: over the high threshold, an unused
//! image goes once it is old enough, and neither the image a container runs nor the sandbox
//! image does.

// Reason: test code may panic on broken invariants.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use kubelet_core::{Backoff, PodUid, ProbeResults, Runtime, events::RingRecorder, testing::RealRuntime};
use kubelet_cri_client::{Client, Config, CriRuntime, manager};
use kubelet_node::image_gc::{ImageGc, ImageGcError, ImageGcPolicy};

/// Whether the runtime holds an image by this reference.
async fn present(runtime: &CriRuntime, reference: &str) -> bool {
    runtime.image_ref(reference).await.unwrap().is_some()
}

#[tokio::test]
async fn real_image_gc_removes_an_unused_image_and_never_a_used_one() {
    let Some(rt) = RealRuntime::from_env("real_image_gc_removes_an_unused_image_and_never_a_used_one") else {
        return;
    };
    let dir = rt.scratch_dir.join(format!("image-gc-{}", std::process::id()));
    let node = format!("image-gc-{}", std::process::id());
    let client = Client::connect(&Config::new(&rt.endpoint)).unwrap();
    let runtime = Arc::new(CriRuntime::new(
        client,
        manager::Config::new(&node)
            .pod_logs_dir(dir.join("pods"))
            .container_logs_dir(dir.join("containers"))
            .pods_dir(dir.join("root/pods")),
        Arc::new(RingRecorder::default()),
    ));
    // A pod runs busybox; the unused image is pulled from the local registry.
    let pod = rt.sleeping_pod(&format!("user-{node}"), "default");
    let uid = PodUid::of(&pod);
    let status = runtime.get_pod_status(&uid, "", "").await.unwrap();
    let synced = runtime.sync_pod(&pod, &status, &Backoff::default(), &ProbeResults::new(), &Default::default()).await;
    assert!(synced.errors().next().is_none(), "{synced:?}");
    let unused = rt.unused_image();
    runtime.pull_image(&unused).await.unwrap();
    assert!(present(&runtime, &unused).await);

    // Any usage crosses a 1 % threshold, and nothing short of an empty disk reaches 0 %: every
    // image that may go, goes.
    let recorder = Arc::new(RingRecorder::default());
    let policy = ImageGcPolicy::new(1, 0, Duration::from_secs(1), None);
    let gc = ImageGc::new(runtime.clone(), policy, recorder.clone(), &node);
    let first = gc.garbage_collect().await;
    assert!(matches!(first, Err(ImageGcError::NotEnoughFreed { freed: 0, .. })), "{first:?}");
    assert!(present(&runtime, &unused).await, "an image seen for less than imageMinimumGCAge stays");

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = gc.garbage_collect().await;
    assert!(matches!(second, Err(ImageGcError::NotEnoughFreed { freed, .. }) if freed > 0), "{second:?}");
    let reasons: Vec<String> = recorder.events().into_iter().map(|e| e.reason).collect();
    assert!(reasons.contains(&"FreeDiskSpaceFailed".to_owned()), "{reasons:?}");
    let unused_gone = !present(&runtime, &unused).await;
    let busybox_kept = present(&runtime, &rt.busybox_image).await;
    let pause_kept = present(&runtime, &rt.pause_image).await;

    let api = k8s_openapi::api::core::v1::Pod { metadata: pod.metadata.clone(), ..Default::default() };
    runtime.remove_pod(&api).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(unused_gone, "the unused image was removed");
    assert!(busybox_kept, "the image a container uses stays");
    assert!(pause_kept, "the sandbox image stays");
}
