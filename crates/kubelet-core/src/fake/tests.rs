//! Fake runtime tests: the kubelet-like rules it follows and its scripting hooks.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{Container as ApiContainer, Pod as ApiPod, PodSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::*;

fn container(name: &str, image: &str) -> ApiContainer {
    ApiContainer { name: name.into(), image: Some(image.into()), ..Default::default() }
}

fn api_pod(uid: &str, policy: &str, init: &[&str], containers: &[&str]) -> ApiPod {
    ApiPod {
        metadata: ObjectMeta {
            uid: Some(uid.into()),
            name: Some(format!("pod-{uid}")),
            namespace: Some("default".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some(policy.into()),
            init_containers: (!init.is_empty()).then(|| init.iter().map(|n| container(n, "busybox")).collect()),
            containers: containers.iter().map(|n| container(n, "busybox")).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn sync(rt: &FakeRuntime, pod: &ApiPod, backoff: &Backoff) -> (PodSyncResult, PodStatus) {
    let uid = PodUid::of(pod);
    let status = rt.get_pod_status(&uid, "", "").await.unwrap();
    let result = rt.sync_pod(pod, &status, backoff, &crate::ProbeResults::new(), &Default::default()).await;
    (result, rt.get_pod_status(&uid, "", "").await.unwrap())
}

fn state_of(status: &PodStatus, name: &str) -> Option<(ContainerState, u32)> {
    status.container_status(name).map(|s| (s.state, s.restart_count))
}

#[tokio::test(start_paused = true)]
async fn sync_creates_sandbox_and_starts_containers_once() {
    let rt = FakeRuntime::new();
    let backoff = Backoff::default();
    let pod = api_pod("u1", "Always", &[], &["a", "b"]);
    let (result, status) = sync(&rt, &pod, &backoff).await;
    assert!(!result.is_err());
    let actions: Vec<_> = result.results.iter().map(|r| (r.action, r.target.as_str())).collect();
    assert_eq!(
        actions,
        [
            (SyncAction::CreatePodSandbox, "pod-u1_default"),
            (SyncAction::StartContainer, "a"),
            (SyncAction::StartContainer, "b")
        ]
    );
    assert_eq!(status.sandbox_statuses.len(), 1);
    assert_eq!(status.ips.len(), 1);
    assert_eq!(state_of(&status, "a"), Some((ContainerState::Running, 0)));
    // A second sync keeps everything.
    let (result, status2) = sync(&rt, &pod, &backoff).await;
    assert!(result.results.is_empty());
    assert_eq!(status2, status);
    let pods = rt.get_pods(false).await.unwrap();
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].containers.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn init_containers_run_one_at_a_time_before_the_app() {
    let rt = FakeRuntime::new();
    rt.set_exit_code("init1", 0);
    rt.set_exit_code("init2", 0);
    let backoff = Backoff::default();
    let pod = api_pod("u1", "Always", &["init1", "init2"], &["app"]);
    let (_, status) = sync(&rt, &pod, &backoff).await;
    assert_eq!(state_of(&status, "init1"), Some((ContainerState::Exited, 0)));
    assert_eq!(state_of(&status, "init2"), None);
    assert_eq!(state_of(&status, "app"), None);
    let (_, status) = sync(&rt, &pod, &backoff).await;
    assert_eq!(state_of(&status, "init2"), Some((ContainerState::Exited, 0)));
    assert_eq!(state_of(&status, "app"), None);
    let (_, status) = sync(&rt, &pod, &backoff).await;
    assert_eq!(state_of(&status, "app"), Some((ContainerState::Running, 0)));
}

#[tokio::test(start_paused = true)]
async fn on_failure_restarts_with_crash_loop_backoff() {
    let rt = FakeRuntime::new();
    rt.set_exit_code("job", 1);
    let backoff = Backoff::default();
    let pod = api_pod("u1", "OnFailure", &[], &["job"]);
    let (_, status) = sync(&rt, &pod, &backoff).await;
    assert_eq!(state_of(&status, "job"), Some((ContainerState::Exited, 0)));
    // First restart is immediate and opens a 10 s backoff.
    let (_, status) = sync(&rt, &pod, &backoff).await;
    assert_eq!(state_of(&status, "job"), Some((ContainerState::Exited, 1)));
    let (result, status) = sync(&rt, &pod, &backoff).await;
    assert_eq!(state_of(&status, "job"), Some((ContainerState::Exited, 1)), "held back");
    let failure = result.results[0].failure.as_ref().unwrap();
    assert_eq!(failure.reason, reasons::CRASH_LOOP_BACK_OFF);
    assert!(failure.message.contains("restarting failed container=job pod=pod-u1_default"), "{}", failure.message);
    assert!(!result.is_err(), "a backoff is not a sync error");
    tokio::time::advance(Duration::from_secs(10)).await;
    let (_, status) = sync(&rt, &pod, &backoff).await;
    assert_eq!(state_of(&status, "job"), Some((ContainerState::Exited, 2)));
    // Now 20 s.
    tokio::time::advance(Duration::from_secs(15)).await;
    let (result, _) = sync(&rt, &pod, &backoff).await;
    assert_eq!(result.results[0].failure.as_ref().unwrap().reason, reasons::CRASH_LOOP_BACK_OFF);
}

#[tokio::test(start_paused = true)]
async fn restart_policy_decides_what_exited_containers_do() {
    let backoff = Backoff::default();
    for (policy, code, restarted) in
        [("Never", 1, false), ("OnFailure", 0, false), ("OnFailure", 1, true), ("Always", 0, true)]
    {
        let rt = FakeRuntime::new();
        rt.set_exit_code("c", code);
        let pod = api_pod(&format!("{policy}-{code}"), policy, &[], &["c"]);
        sync(&rt, &pod, &backoff).await;
        let (_, status) = sync(&rt, &pod, &backoff).await;
        let expected = if restarted { 1 } else { 0 };
        assert_eq!(state_of(&status, "c").unwrap().1, expected, "{policy} exit {code}");
    }
}

#[tokio::test(start_paused = true)]
async fn changed_image_restarts_only_that_container() {
    let rt = FakeRuntime::new();
    let backoff = Backoff::default();
    let mut pod = api_pod("u1", "Always", &[], &["a", "b"]);
    let (_, before) = sync(&rt, &pod, &backoff).await;
    pod.spec.as_mut().unwrap().containers[1].image = Some("busybox:new".into());
    let (result, after) = sync(&rt, &pod, &backoff).await;
    let actions: Vec<_> = result.results.iter().map(|r| (r.action, r.target.as_str())).collect();
    assert_eq!(actions, [(SyncAction::KillContainer, "b"), (SyncAction::StartContainer, "b")]);
    assert_eq!(after.container_status("a").unwrap().id, before.container_status("a").unwrap().id);
    assert_ne!(after.container_status("b").unwrap().id, before.container_status("b").unwrap().id);
    assert_eq!(after.sandbox_statuses[0].id, before.sandbox_statuses[0].id);
}

#[tokio::test(start_paused = true)]
async fn stopped_sandbox_is_recreated_with_next_attempt() {
    let rt = FakeRuntime::new();
    let backoff = Backoff::default();
    let pod = api_pod("u1", "Always", &[], &["a"]);
    sync(&rt, &pod, &backoff).await;
    rt.stop_sandbox(&PodUid::new("u1")).unwrap();
    let status = rt.get_pod_status(&PodUid::new("u1"), "", "").await.unwrap();
    assert!(status.ips.is_empty());
    assert!(!status.is_running());
    let (_, status) = sync(&rt, &pod, &backoff).await;
    assert_eq!(status.sandbox_statuses[0].attempt, 1);
    assert_eq!(status.sandbox_statuses[0].state, SandboxState::Ready);
    assert_eq!(state_of(&status, "a"), Some((ContainerState::Running, 1)));
}

#[tokio::test(start_paused = true)]
async fn scripted_errors_latencies_and_call_record() {
    let rt = FakeRuntime::new();
    rt.fail_next(Method::Status, FakeError::new(Code::Unavailable, "connection refused"));
    assert_eq!(rt.status().await.unwrap_err().code, Code::Unavailable);
    assert!(rt.status().await.unwrap().runtime_ready(), "only the next call fails");

    rt.set_latency(Method::GetPods, Duration::from_millis(250));
    let start = Instant::now();
    rt.get_pods(true).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(250));

    let backoff = Backoff::default();
    rt.fail_next(Method::RunPodSandbox, FakeError::new(Code::Internal, "cni plugin crashed"));
    let pod = api_pod("u1", "Always", &[], &["a"]);
    let (result, status) = sync(&rt, &pod, &backoff).await;
    assert!(result.is_err());
    assert_eq!(result.errors().next().unwrap().reason, reasons::CREATE_POD_SANDBOX_ERROR);
    assert!(status.sandbox_statuses.is_empty());
    rt.fail_next(Method::StartContainer, FakeError::new(Code::Internal, "exec format error"));
    let (result, _) = sync(&rt, &pod, &backoff).await;
    assert_eq!(result.errors().next().unwrap().reason, reasons::RUN_CONTAINER_ERROR);

    let methods: Vec<Method> = rt.calls().iter().map(|c| c.method).collect();
    assert_eq!(methods[..3], [Method::Status, Method::Status, Method::GetPods]);
    assert_eq!(rt.calls_of(Method::SyncPod).len(), 2);
    assert_eq!(rt.calls_of(Method::SyncPod)[0].target, "u1");
}

#[tokio::test(start_paused = true)]
async fn kill_gc_delete_and_exec() {
    let rt = FakeRuntime::new();
    rt.set_exec_result("a", ExecResult { stdout: b"ok\n".to_vec(), ..Default::default() });
    let backoff = Backoff::default();
    let pod = api_pod("u1", "Always", &[], &["a"]);
    let (_, status) = sync(&rt, &pod, &backoff).await;
    let id = status.container_status("a").unwrap().id.clone();
    assert_eq!(rt.exec_sync(&id, &["echo".into()], Duration::from_secs(1)).await.unwrap().stdout, b"ok\n");
    assert_eq!(rt.delete_container(&id).await.unwrap_err().code, Code::Internal, "running containers are not deleted");

    // Three dead instances: GC keeps the newest one.
    for _ in 0..3 {
        rt.stop_container(&rt.get_pod_status(&PodUid::new("u1"), "", "").await.unwrap().container_statuses[0].id, 2)
            .unwrap();
        tokio::time::advance(Duration::from_secs(400)).await;
        sync(&rt, &pod, &backoff).await;
    }
    assert_eq!(rt.container_count(), 4);
    rt.garbage_collect(&GcPolicy::default(), true, false).await.unwrap();
    assert_eq!(rt.container_count(), 2);

    let running = rt.get_pods(true).await.unwrap().remove(0);
    rt.kill_pod(Some(&pod), &running, Some(0)).await.unwrap();
    assert!(rt.get_pods(false).await.unwrap().is_empty());
    let status = rt.get_pod_status(&PodUid::new("u1"), "", "").await.unwrap();
    assert!(status.container_statuses.iter().all(|c| c.state == ContainerState::Exited));
    rt.garbage_collect(&GcPolicy { max_per_pod_container: 0, ..GcPolicy::default() }, true, false).await.unwrap();
    assert!(rt.get_pods(true).await.unwrap().is_empty(), "a dead pod with nothing kept is gone");
    assert_eq!(rt.delete_container("nope").await.unwrap_err().code, Code::NotFound);
}

#[tokio::test(start_paused = true)]
async fn populate_scales_to_ten_thousand_containers() {
    let rt = FakeRuntime::new();
    rt.populate(1000, 10);
    assert_eq!(rt.container_count(), 10_000);
    let pods = rt.get_pods(false).await.unwrap();
    assert_eq!(pods.len(), 1000);
    assert!(pods.iter().all(|p| p.containers.len() == 10 && p.sandboxes.len() == 1));
}

#[tokio::test(start_paused = true)]
async fn a_failed_liveness_probe_kills_and_restarts_as_the_policy_allows() {
    for (policy, restarted) in [("Always", true), ("Never", false)] {
        let rt = FakeRuntime::new();
        let backoff = Backoff::default();
        let pod = api_pod("u1", policy, &[], &["a"]);
        let (_, status) = sync(&rt, &pod, &backoff).await;
        let id = status.container_status("a").unwrap().id.clone();
        let probes = crate::ProbeResults::new();
        probes.set(crate::ProbeKind::Liveness, &PodUid::new("u1"), &id, crate::ProbeOutcome::Failure);
        let result = rt.sync_pod(&pod, &status, &backoff, &probes, &Default::default()).await;
        assert!(!result.is_err(), "{result:?}");
        let status = rt.get_pod_status(&PodUid::new("u1"), "", "").await.unwrap();
        let newest = status.container_status("a").unwrap();
        if restarted {
            assert_eq!((newest.state, newest.restart_count), (ContainerState::Running, 1), "{policy}");
            assert_ne!(newest.id, id);
        } else {
            assert_eq!((newest.state, newest.id.as_str()), (ContainerState::Exited, id.as_str()), "{policy}");
        }
    }
}
