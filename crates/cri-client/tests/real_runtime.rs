//! The CRI runtime manager against the real containerd `cargo xtask ci` starts: pods run with
//! their IP, init containers first, crash-looping containers back off, image changes restart one
//! container, kills honour the grace period, and a new manager re-adopts what an old one created.

// Reason: test helpers outside `#[test]` functions may panic on broken invariants.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::PathBuf, sync::Arc, time::Duration};

use k8s_openapi::{
    api::core::v1::{Container, Pod, PodSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kubelet_core::{
    Backoff, PodUid, Runtime,
    events::RingRecorder,
    runtime::{ContainerState, GcPolicy, PodStatus, reasons},
    testing::RealRuntime,
};
use kubelet_cri_client::{
    Client, Config, CriRuntime,
    actions::{ProbeVerdicts, compute_pod_actions},
    cgroups, manager, pb,
};

struct Env {
    rt: RealRuntime,
    runtime: CriRuntime,
    logs: PathBuf,
}

fn manager(rt: &RealRuntime, logs: &std::path::Path) -> CriRuntime {
    let client = Client::connect(&Config::new(&rt.endpoint)).unwrap();
    // Every path under the test's scratch directory, the per-pod directory (termination-log
    // files) included.
    let config = manager::Config::new("test-node")
        .pod_logs_dir(logs.join("pods"))
        .container_logs_dir(logs.join("containers"))
        .pods_dir(logs.join("kubelet-pods"));
    CriRuntime::new(client, config, Arc::new(RingRecorder::default()))
}

fn env(test: &str) -> Option<Env> {
    let rt = RealRuntime::from_env(test)?;
    let logs = rt.scratch_dir.join(test);
    let runtime = manager(&rt, &logs);
    Some(Env { rt, runtime, logs })
}

fn container(name: &str, image: &str, script: &str) -> Container {
    Container {
        name: name.into(),
        image: Some(image.into()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["sh".into(), "-c".into(), script.into()]),
        ..Container::default()
    }
}

fn pod(name: &str, policy: &str, init: Vec<Container>, containers: Vec<Container>) -> Pod {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("kubelet-rs-test".into()),
            uid: Some(format!("{name}-{}-{nanos}", std::process::id())),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some(policy.into()),
            termination_grace_period_seconds: Some(3),
            init_containers: (!init.is_empty()).then_some(init),
            containers,
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

impl Env {
    async fn status(&self, pod: &Pod) -> PodStatus {
        let uid = PodUid::of(pod);
        self.runtime.get_pod_status(&uid, pod.metadata.name.as_deref().unwrap(), "kubelet-rs-test").await.unwrap()
    }

    /// Polls the pod's status until `done` holds (at most 20 s).
    async fn wait_for(&self, pod: &Pod, what: &str, done: impl Fn(&PodStatus) -> bool) -> PodStatus {
        for _ in 0..200 {
            let status = self.status(pod).await;
            if done(&status) {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("timed out waiting for {what}: {:?}", self.status(pod).await);
    }

    async fn sync(&self, pod: &Pod, backoff: &Backoff) -> kubelet_core::runtime::PodSyncResult {
        let status = self.status(pod).await;
        self.runtime.sync_pod(pod, &status, backoff, &kubelet_core::ProbeResults::new(), &Default::default()).await
    }

    /// A guard that removes `pod` if the test panics before [`Env::cleanup`].
    fn remove_on_panic(&self, pod: &Pod) -> RemoveOnPanic {
        RemoveOnPanic { rt: self.rt.clone(), logs: self.logs.clone(), pod: pod.clone() }
    }

    /// Removes the pod as a kubelet would, and checks that nothing is left.
    async fn cleanup(&self, pod: &Pod) {
        let uid = pod.metadata.uid.as_deref().unwrap();
        let root = std::path::Path::new(cgroups::CGROUP_ROOT);
        // The check sees the pod's cgroup while its sandbox runs, so its absence later means
        // something.
        assert!(!cgroups::pod_cgroup_dirs(root, uid).is_empty(), "no cgroup of pod {uid} found while it runs");
        self.runtime.remove_pod(pod).await.unwrap();
        let status = self.status(pod).await;
        assert!(status.sandbox_statuses.is_empty() && status.container_statuses.is_empty(), "{status:?}");
        let left = cgroups::pod_cgroup_dirs(root, uid);
        assert!(left.is_empty(), "cgroups left behind: {left:?}");
        let log_dir =
            self.logs.join("pods").join(format!("kubelet-rs-test_{}_{uid}", pod.metadata.name.as_deref().unwrap()));
        assert!(!log_dir.exists(), "log dir {} left behind", log_dir.display());
    }
}

/// Removes a test's pod when the test panics before its cleanup, so a failed test leaks no pod.
///
/// It runs in a thread of its own, with its own tokio runtime and client: the test's runtime is
/// unwinding.
struct RemoveOnPanic {
    rt: RealRuntime,
    logs: PathBuf,
    pod: Pod,
}

impl Drop for RemoveOnPanic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let (rt, logs, pod) = (self.rt.clone(), self.logs.clone(), self.pod.clone());
        let removal = std::thread::spawn(move || {
            let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            // The client is made inside the new runtime, whose reactor its connection needs.
            if let Err(err) = tokio.block_on(async { manager(&rt, &logs).remove_pod(&pod).await }) {
                eprintln!("removing the failed test's pod: {err}");
            }
        });
        let _ = removal.join();
    }
}

fn state(status: &PodStatus, name: &str) -> Option<ContainerState> {
    status.container_status(name).map(|c| c.state)
}

async fn exec(env: &Env, status: &PodStatus, name: &str, cmd: &[&str]) -> String {
    let id = &status.container_status(name).unwrap().id;
    let cmd: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
    let result = env.runtime.exec_sync(id, &cmd, Duration::from_secs(10)).await.unwrap();
    String::from_utf8_lossy(&result.stdout).into_owned()
}

#[tokio::test]
async fn real_two_containers_share_the_pod_ip() {
    let Some(env) = env("real_two_containers_share_the_pod_ip") else { return };
    let image = env.rt.busybox_image.clone();
    let p = pod(
        "two",
        "Always",
        vec![],
        vec![container("a", &image, "exec sleep 3600"), container("b", &image, "exec sleep 3600")],
    );
    let _removal = env.remove_on_panic(&p);
    let result = env.sync(&p, &Backoff::default()).await;
    let outcome = async {
        assert!(!result.is_err(), "{result:?}");
        let status = env
            .wait_for(&p, "both running", |s| {
                state(s, "a") == Some(ContainerState::Running) && state(s, "b") == Some(ContainerState::Running)
            })
            .await;
        let ip = status.ips.first().cloned().expect("a pod IP");
        for name in ["a", "b"] {
            let addresses = exec(&env, &status, name, &["ip", "-4", "addr", "show", "eth0"]).await;
            assert!(addresses.contains(&format!("inet {ip}/")), "{name}: {addresses}");
        }
        // A second sync changes nothing.
        let again = env.sync(&p, &Backoff::default()).await;
        assert!(again.results.is_empty(), "{again:?}");
    };
    outcome.await;
    env.cleanup(&p).await;
}

#[tokio::test]
async fn real_init_container_runs_before_the_app() {
    let Some(env) = env("real_init_container_runs_before_the_app") else { return };
    let image = env.rt.busybox_image.clone();
    let p = pod(
        "init",
        "Always",
        vec![container("setup", &image, "sleep 1; echo done")],
        vec![container("app", &image, "exec sleep 3600")],
    );
    let _removal = env.remove_on_panic(&p);
    let backoff = Backoff::default();
    let first = env.sync(&p, &backoff).await;
    assert!(!first.is_err(), "{first:?}");
    let status = env.status(&p).await;
    assert_eq!(state(&status, "app"), None, "the app waits for init");
    let status = env.wait_for(&p, "init to finish", |s| state(s, "setup") == Some(ContainerState::Exited)).await;
    assert_eq!(status.container_status("setup").unwrap().exit_code, 0);
    env.sync(&p, &backoff).await;
    let status = env.wait_for(&p, "the app to run", |s| state(s, "app") == Some(ContainerState::Running)).await;
    let init_done = status.container_status("setup").unwrap().finished_at.unwrap();
    let app_started = status.container_status("app").unwrap().started_at.unwrap();
    assert!(init_done <= app_started, "init finished {init_done}, app started {app_started}");
    env.cleanup(&p).await;
}

#[tokio::test]
async fn real_sidecar_serves_the_app_and_stops_after_it() {
    let Some(env) = env("real_sidecar_serves_the_app_and_stops_after_it") else { return };
    let image = env.rt.busybox_image.clone();
    // The sidecar writes a heartbeat file every second and serves it; the app reads it.
    let mut sidecar = container(
        "beat",
        &image,
        "mkdir -p /www; (while true; do date +%s > /www/beat; sleep 1; done) & exec httpd -f -p 8080 -h /www",
    );
    sidecar.restart_policy = Some("Always".into());
    let app =
        container("app", &image, "while true; do echo \"beat $(wget -qO- http://127.0.0.1:8080/beat)\"; sleep 1; done");
    let p = pod("sidecar", "Always", vec![sidecar], vec![app]);
    let _removal = env.remove_on_panic(&p);
    let backoff = Backoff::default();
    let first = env.sync(&p, &backoff).await;
    assert!(!first.is_err(), "{first:?}");
    assert_eq!(state(&env.status(&p).await, "app"), None, "the app waits for the sidecar");
    env.wait_for(&p, "the sidecar to run", |s| state(s, "beat") == Some(ContainerState::Running)).await;
    let second = env.sync(&p, &backoff).await;
    assert!(!second.is_err(), "{second:?}");
    let status = env.wait_for(&p, "the app to run", |s| state(s, "app") == Some(ContainerState::Running)).await;
    assert_eq!(state(&status, "beat"), Some(ContainerState::Running), "a started sidecar keeps running");

    let log = env.logs.join("pods").join(format!("kubelet-rs-test_sidecar_{}", p.metadata.uid.as_deref().unwrap()));
    let mut read = String::new();
    for _ in 0..100 {
        read = std::fs::read_to_string(log.join("app/0.log")).unwrap_or_default();
        if read.lines().any(|l| l.split("beat ").nth(1).is_some_and(|v| v.trim().parse::<u64>().is_ok())) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(read.lines().any(|l| l.split("beat ").nth(1).is_some_and(|v| v.trim().parse::<u64>().is_ok())), "{read}");
    let resync = env.sync(&p, &backoff).await;
    assert!(resync.results.is_empty(), "nothing to do while both run: {resync:?}");

    // On termination the sidecar stops after the app.
    let running = env.runtime.get_pods(false).await.unwrap().into_iter().find(|r| r.uid == PodUid::of(&p)).unwrap();
    env.runtime.kill_pod(Some(&p), &running, Some(2)).await.unwrap();
    let status = env.status(&p).await;
    let finished = |name: &str| status.container_status(name).and_then(|c| c.finished_at).unwrap();
    assert!(finished("app") <= finished("beat"), "app stopped {}, sidecar {}", finished("app"), finished("beat"));
    env.cleanup(&p).await;
}

#[tokio::test]
async fn real_failing_container_restarts_with_backoff_and_numbered_logs() {
    let Some(env) = env("real_failing_container_restarts_with_backoff_and_numbered_logs") else { return };
    let image = env.rt.busybox_image.clone();
    let p = pod("crash", "OnFailure", vec![], vec![container("job", &image, "echo attempt; exit 1")]);
    let _removal = env.remove_on_panic(&p);
    let backoff = Backoff::default();
    env.sync(&p, &backoff).await;
    env.wait_for(&p, "the first exit", |s| state(s, "job") == Some(ContainerState::Exited)).await;
    let restart = env.sync(&p, &backoff).await;
    assert!(!restart.is_err(), "the first restart is immediate: {restart:?}");
    let status = env
        .wait_for(&p, "the second exit", |s| {
            s.container_status("job").is_some_and(|c| c.restart_count == 1 && c.state == ContainerState::Exited)
        })
        .await;
    assert_eq!(status.container_status("job").unwrap().exit_code, 1);
    let held = env.sync(&p, &backoff).await;
    let failure = held.results.iter().find_map(|r| r.failure.as_ref()).expect("a backoff");
    assert_eq!(failure.reason, reasons::CRASH_LOOP_BACK_OFF);
    assert!(!held.is_err(), "a backoff is not a sync error");
    let dir =
        env.logs.join("pods").join(format!("kubelet-rs-test_crash_{}", p.metadata.uid.as_deref().unwrap())).join("job");
    for n in ["0.log", "1.log"] {
        let content = std::fs::read_to_string(dir.join(n)).unwrap();
        assert!(content.contains(" stdout F attempt"), "{n}: {content}");
    }
    env.cleanup(&p).await;
}

#[tokio::test]
async fn real_missing_image_is_retried_when_its_pull_backoff_ends() {
    let Some(env) = env("real_missing_image_is_retried_when_its_pull_backoff_ends") else { return };
    let missing = env.rt.busybox_image.replace("busybox", "no-such-image");
    let p = pod("nopull", "Always", vec![], vec![container("app", &missing, "true")]);
    let _removal = env.remove_on_panic(&p);
    let backoff = Backoff::default();
    let failure = |result: &kubelet_core::runtime::PodSyncResult| {
        result.results.iter().find_map(|r| r.failure.clone()).expect("a failed pull")
    };
    let first = failure(&env.sync(&p, &backoff).await);
    assert_eq!(first.reason, reasons::ERR_IMAGE_PULL);
    assert_eq!(first.retry_after, Some(Duration::from_secs(10)), "retried when the 10 s back-off ends");
    let held = failure(&env.sync(&p, &backoff).await);
    assert_eq!(held.reason, reasons::IMAGE_PULL_BACK_OFF);
    let remaining = held.retry_after.expect("a sync held by the back-off is queued for its end");
    assert!(remaining > Duration::from_secs(8) && remaining <= Duration::from_secs(10), "{remaining:?}");
    env.cleanup(&p).await;
}

#[tokio::test]
async fn real_changed_image_restarts_only_that_container_and_kill_honours_grace() {
    let Some(env) = env("real_changed_image_restarts_only_that_container_and_kill_honours_grace") else { return };
    let image = env.rt.busybox_image.clone();
    let mut p = pod(
        "change",
        "Always",
        vec![],
        vec![container("a", &image, "exec sleep 3600"), container("b", &image, "exec sleep 3600")],
    );
    let _removal = env.remove_on_panic(&p);
    let backoff = Backoff::default();
    env.sync(&p, &backoff).await;
    let before = env
        .wait_for(&p, "both running", |s| {
            state(s, "a") == Some(ContainerState::Running) && state(s, "b") == Some(ContainerState::Running)
        })
        .await;
    // The same image by digest is a different image string, so a different container hash.
    let digest = env
        .runtime
        .list_images()
        .await
        .unwrap()
        .into_iter()
        .find(|i| i.repo_tags.contains(&image))
        .unwrap()
        .repo_digests[0]
        .clone();
    p.spec.as_mut().unwrap().containers[1].image = Some(digest);
    let result = env.sync(&p, &backoff).await;
    assert!(!result.is_err(), "{result:?}");
    let after = env
        .wait_for(&p, "b restarted", |s| {
            s.container_statuses
                .iter()
                .any(|c| c.name == "b" && c.state == ContainerState::Running && c.restart_count == 1)
        })
        .await;
    assert_eq!(after.container_status("a").unwrap().id, before.container_status("a").unwrap().id, "a untouched");
    assert_eq!(after.sandbox_statuses[0].id, before.sandbox_statuses[0].id, "same sandbox");

    // `sleep` as PID 1 ignores SIGTERM: the stop waits the whole 3 s grace, then kills.
    let running = env.runtime.get_pods(false).await.unwrap().into_iter().find(|r| r.uid == PodUid::of(&p)).unwrap();
    let started = tokio::time::Instant::now();
    env.runtime.kill_pod(Some(&p), &running, None).await.unwrap();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(2900), "grace not honoured: {took:?}");
    let status = env.status(&p).await;
    assert!(status.container_statuses.iter().all(|c| c.state == ContainerState::Exited));
    assert_eq!(status.container_status("a").unwrap().exit_code, 137);
    env.cleanup(&p).await;
}

#[tokio::test]
async fn real_a_new_manager_readopts_everything() {
    let Some(env) = env("real_a_new_manager_readopts_everything") else { return };
    let image = env.rt.busybox_image.clone();
    let p = pod("adopt", "Always", vec![], vec![container("a", &image, "exec sleep 3600")]);
    let _removal = env.remove_on_panic(&p);
    env.sync(&p, &Backoff::default()).await;
    let before = env.wait_for(&p, "running", |s| state(s, "a") == Some(ContainerState::Running)).await;
    // A restarted agent: a brand new manager with nothing in memory.
    let fresh = manager(&env.rt, &env.logs);
    let pods = fresh.get_pods(false).await.unwrap();
    let listed = pods.iter().find(|r| r.uid == PodUid::of(&p)).expect("listed by its UID label");
    assert_eq!((listed.name.as_str(), listed.namespace.as_str()), ("adopt", "kubelet-rs-test"));
    assert_eq!(listed.containers[0].hash, before.container_status("a").unwrap().hash);
    let status = fresh.get_pod_status(&PodUid::of(&p), "adopt", "kubelet-rs-test").await.unwrap();
    assert_eq!(status.container_status("a").unwrap().restart_count, 0);
    let actions = compute_pod_actions(&p, &status, &ProbeVerdicts::default());
    assert_eq!(actions.sandbox_id, before.sandbox_statuses[0].id);
    assert!(
        !actions.kill_pod
            && !actions.create_sandbox
            && actions.containers_to_start.is_empty()
            && actions.containers_to_kill.is_empty()
    );
    let result =
        fresh.sync_pod(&p, &status, &Backoff::default(), &kubelet_core::ProbeResults::new(), &Default::default()).await;
    assert!(result.results.is_empty(), "nothing to do: {result:?}");
    env.cleanup(&p).await;
}

#[tokio::test]
async fn real_termination_messages_come_from_the_file_or_the_log() {
    let Some(env) = env("real_termination_messages_come_from_the_file_or_the_log") else { return };
    let image = env.rt.busybox_image.clone();
    let mut file = container("file", &image, "printf 'bye now' > /dev/termination-log; exit 3");
    file.termination_message_path = Some("/dev/termination-log".into());
    let mut logs = container("logs", &image, "echo first; echo oops; exit 2");
    logs.termination_message_path = Some("/dev/termination-log".into());
    logs.termination_message_policy = Some("FallbackToLogsOnError".into());
    let p = pod("messages", "Never", vec![], vec![file, logs]);
    let _removal = env.remove_on_panic(&p);
    let result = env.sync(&p, &Backoff::default()).await;
    assert!(!result.is_err(), "{result:?}");
    let status = env
        .wait_for(&p, "both exited", |s| {
            state(s, "file") == Some(ContainerState::Exited) && state(s, "logs") == Some(ContainerState::Exited)
        })
        .await;
    let file = status.container_status("file").unwrap();
    assert_eq!((file.exit_code, file.message.as_str()), (3, "bye now"));
    let logs = status.container_status("logs").unwrap();
    assert_eq!((logs.exit_code, logs.message.as_str()), (2, "first\noops\n"));
    let pod_dir = env.logs.join("kubelet-pods").join(p.metadata.uid.as_deref().unwrap());
    let written = pod_dir.join("containers/file/0-termination-log");
    assert_eq!(std::fs::read_to_string(&written).ok().as_deref(), Some("bye now"), "{}", written.display());
    env.cleanup(&p).await;
    assert!(!pod_dir.exists(), "the pod directory is removed");
}

/// containerd's own events hint at a change when a container exits, within a second of its exit.
#[tokio::test]
async fn real_containerd_hints_follow_a_container_exit() {
    let Some(env) = env("real_containerd_hints_follow_a_container_exit") else { return };
    let (tx, mut rx) = tokio::sync::mpsc::channel(1);
    let client = env.runtime.client().clone();
    let watch = tokio::spawn(async move { client.watch_containerd_changes(tx).await });
    let hints = Arc::new(std::sync::Mutex::new(Vec::new()));
    let collector = tokio::spawn({
        let hints = hints.clone();
        async move {
            while rx.recv().await.is_some() {
                hints.lock().unwrap().push(kubelet_core::clock::wall_now());
            }
        }
    });
    let image = env.rt.busybox_image.clone();
    let p = pod("hint", "Never", vec![], vec![container("a", &image, "sleep 1")]);
    let _removal = env.remove_on_panic(&p);
    let result = env.sync(&p, &Backoff::default()).await;
    let outcome = async {
        assert!(!result.is_err(), "{result:?}");
        let status = env.wait_for(&p, "the container to exit", |s| state(s, "a") == Some(ContainerState::Exited)).await;
        let exited = status.container_status("a").unwrap().finished_at.unwrap();
        // The hint for the exit is either in already or within a second of it.
        let deadline = exited + std::time::Duration::from_secs(1);
        loop {
            let hinted = hints.lock().unwrap().iter().any(|at| *at >= exited && *at <= deadline);
            if hinted {
                break;
            }
            assert!(
                kubelet_core::clock::wall_now() < deadline + std::time::Duration::from_millis(200),
                "no hint within 1 s of the exit at {exited}: {:?}",
                hints.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    outcome.await;
    watch.abort();
    collector.abort();
    env.cleanup(&p).await;
}

/// Garbage collection keeps the newest dead instance of each container and the newest sandbox,
/// and the restart count goes on counting after it.
#[tokio::test]
async fn real_garbage_collection_keeps_the_newest_dead_instance_and_sandbox() {
    let Some(env) = env("real_garbage_collection_keeps_the_newest_dead_instance_and_sandbox") else { return };
    let image = env.rt.busybox_image.clone();
    let p = pod("gc", "Always", vec![], vec![container("job", &image, "exit 1")]);
    let _removal = env.remove_on_panic(&p);
    // No crash-loop back-off to wait out.
    let backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(1));
    let newest = |s: &PodStatus| s.container_status("job").map(|c| (c.restart_count, c.state));
    let exited = |count: u32| move |s: &PodStatus| newest(s) == Some((count, ContainerState::Exited));
    // Three dead instances in the first sandbox.
    for count in 0..3 {
        let result = env.sync(&p, &backoff).await;
        assert!(!result.is_err(), "{result:?}");
        env.wait_for(&p, "the instance to exit", exited(count)).await;
    }
    // The sandbox stops: the next sync makes a new one, whose first instance is the fourth.
    let first_sandbox = env.status(&p).await.sandbox_statuses[0].id.clone();
    env.runtime
        .client()
        .runtime_service()
        .stop_pod_sandbox(pb::StopPodSandboxRequest { pod_sandbox_id: first_sandbox.clone() })
        .await
        .unwrap();
    env.sync(&p, &backoff).await;
    let before = env.wait_for(&p, "the fourth instance to exit", exited(3)).await;
    assert_eq!(before.sandbox_statuses.len(), 2, "{before:?}");
    assert_eq!(before.container_statuses.len(), 4, "{before:?}");
    let second_sandbox = before.sandbox_statuses[0].id.clone();
    assert_ne!(second_sandbox, first_sandbox);

    env.runtime.garbage_collect(&GcPolicy::default(), true, false).await.unwrap();
    let after = env.status(&p).await;
    let sandboxes: Vec<&str> = after.sandbox_statuses.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(sandboxes, [second_sandbox.as_str()], "the newest sandbox stays, the stopped one goes");
    let dead: Vec<u32> = after.container_statuses.iter().map(|c| c.restart_count).collect();
    assert_eq!(dead, [3], "only the newest dead instance stays");

    // The count goes on from the instance that stayed.
    env.sync(&p, &backoff).await;
    env.wait_for(&p, "the fifth instance to exit", exited(4)).await;
    env.cleanup(&p).await;
}

/// containerd's own services, reached on the CRI socket as the agent reaches them: the messages a
/// test needs to start a task the way an interrupted StartContainer leaves it.
mod containerd_api {
    use std::path::PathBuf;

    use kubelet_cri_client::tonic::{
        self, Request,
        codegen::http::uri::PathAndQuery,
        metadata::MetadataValue,
        transport::{Channel, Endpoint, Uri},
    };

    /// `containerd.types.Mount`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Mount {
        #[prost(string, tag = "1")]
        pub(crate) r#type: String,
        #[prost(string, tag = "2")]
        pub(crate) source: String,
        #[prost(string, tag = "3")]
        pub(crate) target: String,
        #[prost(string, repeated, tag = "4")]
        pub(crate) options: Vec<String>,
    }

    /// `containerd.services.snapshots.v1.MountsRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct MountsRequest {
        #[prost(string, tag = "1")]
        pub(crate) snapshotter: String,
        #[prost(string, tag = "2")]
        pub(crate) key: String,
    }

    /// `containerd.services.snapshots.v1.MountsResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct MountsResponse {
        #[prost(message, repeated, tag = "1")]
        pub(crate) mounts: Vec<Mount>,
    }

    /// `containerd.services.tasks.v1.CreateTaskRequest`, without IO, checkpoint or options.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct CreateTaskRequest {
        #[prost(string, tag = "1")]
        pub(crate) container_id: String,
        #[prost(message, repeated, tag = "3")]
        pub(crate) rootfs: Vec<Mount>,
    }

    /// `containerd.services.tasks.v1.StartRequest` and `GetRequest`: a task, no exec.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct TaskRequest {
        #[prost(string, tag = "1")]
        pub(crate) container_id: String,
    }

    /// `CreateTaskResponse`, `StartResponse`: only the pid is read (field 2 and 1).
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct CreateTaskResponse {
        #[prost(uint32, tag = "2")]
        pub(crate) pid: u32,
    }

    /// A response whose fields are not read.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Ignored {}

    pub(crate) fn channel(endpoint: &str) -> Channel {
        let path = PathBuf::from(endpoint.trim_start_matches("unix://"));
        Endpoint::from_static("http://[::]:50051").connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
    }

    /// One unary call in the CRI plugin's namespace `k8s.io`.
    pub(crate) async fn call<Req, Resp>(
        channel: &Channel,
        method: &'static str,
        message: Req,
    ) -> Result<Resp, tonic::Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut request = Request::new(message);
        request.metadata_mut().insert("containerd-namespace", MetadataValue::from_static("k8s.io"));
        let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
        Ok(grpc.unary(request, PathAndQuery::from_static(method), codec).await?.into_inner())
    }
}

/// A SIGKILL of the agent inside StartContainer can leave containerd 1.6 with a running task
/// under a container its CRI reports as created; CRI StopContainer skips such a container and
/// RemoveContainer refuses it. The test makes that state by starting the task through
/// containerd's Tasks service, then removes the pod as the agent does: the task's process must be
/// gone and nothing of the pod left.
#[tokio::test]
async fn real_a_task_left_under_a_created_container_goes_with_its_pod() {
    use containerd_api::*;
    let Some(env) = env("real_a_task_left_under_a_created_container_goes_with_its_pod") else { return };
    let image = env.rt.busybox_image.clone();
    let c = container("left", &image, "sleep 3600");
    let p = pod("left-task", "Always", vec![], vec![c.clone()]);
    let _removal = env.remove_on_panic(&p);
    let (name, uid) = (p.metadata.name.clone().unwrap(), p.metadata.uid.clone().unwrap());
    let mut cri = env.runtime.client().runtime_service();
    let log_dir = env.logs.join("pods").join(format!("kubelet-rs-test_{name}_{uid}"));
    std::fs::create_dir_all(&log_dir).unwrap();
    let sandbox_config =
        kubelet_cri_client::sandbox::sandbox_config(&p, 0, &log_dir, "/kubepods", &Default::default()).unwrap();
    let sandbox_id = cri
        .run_pod_sandbox(pb::RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    env.runtime
        .client()
        .image_service()
        .pull_image(pb::PullImageRequest {
            image: Some(pb::ImageSpec { image: image.clone(), ..Default::default() }),
            ..Default::default()
        })
        .await
        .unwrap();
    let config = pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata { name: "left".into(), attempt: 0 }),
        image: Some(pb::ImageSpec { image: image.clone(), ..Default::default() }),
        command: vec!["sleep".into(), "3600".into()],
        labels: kubelet_cri_client::labels::container_labels(&p, &c),
        ..Default::default()
    };
    let container_id = cri
        .create_container(pb::CreateContainerRequest {
            pod_sandbox_id: sandbox_id,
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;

    // The task, created and started through containerd's own services on the container's snapshot.
    let channel = channel(&env.rt.endpoint);
    let mounts: MountsResponse = call(
        &channel,
        "/containerd.services.snapshots.v1.Snapshots/Mounts",
        MountsRequest { snapshotter: "overlayfs".into(), key: container_id.clone() },
    )
    .await
    .unwrap();
    let created: CreateTaskResponse = call(
        &channel,
        "/containerd.services.tasks.v1.Tasks/Create",
        CreateTaskRequest { container_id: container_id.clone(), rootfs: mounts.mounts },
    )
    .await
    .unwrap();
    let _: Ignored =
        call(&channel, "/containerd.services.tasks.v1.Tasks/Start", TaskRequest { container_id: container_id.clone() })
            .await
            .unwrap();
    let pid = created.pid;
    assert!(pid > 0 && std::path::Path::new(&format!("/proc/{pid}")).exists(), "the task's process {pid} runs");
    // The state the crash leaves: CRI says created while the task runs.
    let status = env.status(&p).await;
    assert_eq!(state(&status, "left"), Some(ContainerState::Created), "{status:?}");
    let refused = cri.remove_container(pb::RemoveContainerRequest { container_id: container_id.clone() }).await;
    assert_eq!(refused.map(drop).unwrap_err().code(), kubelet_cri_client::tonic::Code::FailedPrecondition);

    env.cleanup(&p).await;
    let task: Result<Ignored, _> =
        call(&channel, "/containerd.services.tasks.v1.Tasks/Get", TaskRequest { container_id: container_id.clone() })
            .await;
    assert_eq!(task.unwrap_err().code(), kubelet_cri_client::tonic::Code::NotFound, "the task is gone");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(stat.is_empty() || stat.contains(") Z "), "the task's process {pid} still runs: {stat}");
}
