//! Image garbage collection against the real containerd, with the high threshold between the
//! image filesystem's usage before and after pulling an unused image: below it nothing goes; over
//! it an unused image goes once it is old enough, and neither the image a container runs nor the
//! sandbox image does.

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

/// The image filesystem's usage in whole percents, as upstream's image GC computes it.
async fn image_fs_usage_percent(runtime: &CriRuntime) -> u32 {
    let stats = runtime.image_fs_stats().await.unwrap().expect("the runtime names its image filesystem");
    let available_percent = stats.available_bytes * 100 / stats.capacity_bytes;
    u32::try_from(100 - available_percent).unwrap()
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
    // Other tests' images that no container uses (the control-plane stand-in) would tie with the
    // unused image for removal: they go first (the registry has them), so the unused image is
    // the one candidate.
    let keep = [runtime.image_ref(&rt.busybox_image).await.unwrap(), runtime.image_ref(&rt.pause_image).await.unwrap()];
    for image in runtime.list_images().await.unwrap() {
        if !keep.iter().flatten().any(|id| *id == image.id) {
            runtime.remove_image(&image.id).await.unwrap();
        }
    }
    let usage_before = image_fs_usage_percent(&runtime).await;
    let unused = rt.unused_image();
    runtime.pull_image(&unused).await.unwrap();
    assert!(present(&runtime, &unused).await);
    let usage_after = image_fs_usage_percent(&runtime).await;
    assert!(
        usage_after >= usage_before + 2,
        "the unused image moves the usage by whole percents: {usage_before} % → {usage_after} %"
    );

    // The usage after reaches the high threshold, the usage before is below it; the low one is a
    // percent under it, so that the image's reported size (its compressed layer: half of what it
    // holds once unpacked) covers what is wanted.
    let recorder = Arc::new(RingRecorder::default());
    let policy = ImageGcPolicy::new(usage_after, usage_after - 1, Duration::from_secs(1), None);
    let gc = ImageGc::new(runtime.clone(), policy, recorder.clone(), &node);
    let first = gc.garbage_collect().await;
    assert!(matches!(first, Err(ImageGcError::NotEnoughFreed { freed: 0, .. })), "{first:?}");
    assert!(present(&runtime, &unused).await, "an image seen for less than imageMinimumGCAge stays");
    let reasons: Vec<String> = recorder.events().into_iter().map(|e| e.reason).collect();
    assert!(reasons.contains(&"FreeDiskSpaceFailed".to_owned()), "{reasons:?}");

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = gc.garbage_collect().await;
    assert!(matches!(second, Ok(freed) if freed > 0), "enough freed: {second:?}");
    let usage_collected = image_fs_usage_percent(&runtime).await;
    // Below the high threshold again, the next collection removes nothing.
    let third = gc.garbage_collect().await;
    assert!(matches!(third, Ok(0)), "nothing to free: {third:?}");
    let unused_gone = !present(&runtime, &unused).await;
    let busybox_kept = present(&runtime, &rt.busybox_image).await;
    let pause_kept = present(&runtime, &rt.pause_image).await;

    let api = k8s_openapi::api::core::v1::Pod { metadata: pod.metadata.clone(), ..Default::default() };
    runtime.remove_pod(&api).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(usage_collected < usage_after, "below the high threshold again: {usage_collected} % from {usage_after} %");
    assert!(unused_gone, "the unused image was removed");
    assert!(busybox_kept, "the image a container uses stays");
    assert!(pause_kept, "the sandbox image stays");
}
