//! The `kubelet-rs run` binary against the real containerd, driven through static pod files:
//! a manifest becomes a running pod, a restarted agent re-adopts it untouched, a container
//! stopped behind the agent's back is restarted, a removed manifest stops the pod, and SIGTERM
//! leaves running pods running; an edited manifest replaces its pod, a lost sandbox is recreated
//! with the next attempt, and a manifest removed while the agent is down stops its pod; and the
//! local API reports init, crash-loop, terminal and deadline statuses; kubeadm's control-plane
//! manifests run as static pods with stand-in images, every field honoured.

// Reason: test helpers outside `#[test]` functions may panic on broken invariants.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use cri_client::{Client, Config, CriRuntime, cgroups, container, manager, pb};
use kubelet_core::{Runtime, events::RingRecorder, runtime::ContainerState, testing::RealRuntime};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

struct Agent {
    child: Child,
    /// Its program, arguments and environment, for a restart.
    invocation: Invocation,
}

/// What started an agent.
struct Invocation {
    program: std::ffi::OsString,
    args: Vec<std::ffi::OsString>,
    envs: Vec<(std::ffi::OsString, Option<std::ffi::OsString>)>,
}

impl Agent {
    fn start(rt: &RealRuntime, dir: &Path, node: &str) -> Agent {
        Agent::start_with(rt, dir, node, &[])
    }

    fn start_with(rt: &RealRuntime, dir: &Path, node: &str, extra: &[&str]) -> Agent {
        Agent::spawn(agent_command(rt, dir, node).args(["--healthz-port", "0"]).args(extra))
    }

    fn spawn(command: &mut Command) -> Agent {
        let invocation = Invocation {
            program: command.get_program().to_owned(),
            args: command.get_args().map(ToOwned::to_owned).collect(),
            envs: command.get_envs().map(|(key, value)| (key.to_owned(), value.map(ToOwned::to_owned))).collect(),
        };
        let child = command.spawn().unwrap();
        Agent { child, invocation }
    }

    /// The same agent started again, logging to `dir/agent.log`, when this one has exited.
    fn running_again(mut self, dir: &Path) -> Agent {
        if self.child.try_wait().unwrap().is_none() {
            return self;
        }
        let log = std::fs::OpenOptions::new().append(true).open(dir.join("agent.log")).unwrap();
        let Invocation { program, args, envs } = &self.invocation;
        let mut command = Command::new(program);
        command.args(args).stdout(Stdio::null()).stderr(log);
        for (key, value) in envs {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        Agent::spawn(&mut command)
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

/// `kubelet-rs run` on the test runtime with the test's directories, logging to `agent.log`.
fn agent_command(rt: &RealRuntime, dir: &Path, node: &str) -> Command {
    common::agent_command(&rt.endpoint, dir, node)
}

fn manifest(node_pod: &str, image: &str, script: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {node_pod}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {image}\n    command: [\"sh\", \"-c\", \"{script}\"]\n"
    )
}

/// The runtime's view of a static pod named `name` (the first of its UIDs for which `done`
/// holds), once `done` holds (at most 20 s).
async fn wait_for(
    runtime: &CriRuntime,
    name: &str,
    what: &str,
    done: impl Fn(&kubelet_core::runtime::PodStatus) -> bool,
) -> kubelet_core::runtime::PodStatus {
    for _ in 0..200 {
        for pod in runtime.get_pods(true).await.unwrap().into_iter().filter(|p| p.name == name) {
            let status = runtime.get_pod_status(&pod.uid, &pod.name, &pod.namespace).await.unwrap();
            if done(&status) {
                return status;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A fresh scratch directory `<dir>-<pid>` with an empty manifest directory, and the node name
/// `<node>-<pid>` the test's agent runs as (its pods' names end with it).
fn scratch(rt: &RealRuntime, dir: &str, node: &str) -> (std::path::PathBuf, String) {
    let pid = std::process::id();
    let dir = rt.scratch_dir.join(format!("{dir}-{pid}"));
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    (dir, format!("{node}-{pid}"))
}

/// Waits (at most 20 s) until nothing of the pod `uid` is left: no sandbox or container in the
/// runtime, no log directory, no pod directory, no pod cgroup.
async fn wait_until_gone(runtime: &CriRuntime, dir: &Path, uid: &kubelet_core::PodUid) {
    let leftovers = || async {
        let mut left = Vec::new();
        if runtime.get_pods(true).await.unwrap().iter().any(|p| p.uid == *uid) {
            left.push("sandboxes or containers".to_owned());
        }
        for entry in std::fs::read_dir(dir.join("pods")).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().ends_with(uid.as_str()) {
                left.push(format!("log directory {}", entry.path().display()));
            }
        }
        if dir.join("root/pods").join(uid.as_str()).exists() {
            left.push("pod directory".to_owned());
        }
        for cgroup in cgroups::pod_cgroup_dirs(Path::new(cgroups::CGROUP_ROOT), uid.as_str()) {
            left.push(format!("cgroup {}", cgroup.display()));
        }
        left
    };
    for _ in 0..200 {
        if leftovers().await.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pod {uid} left behind: {:?}", leftovers().await);
}

fn running(status: &kubelet_core::runtime::PodStatus) -> bool {
    status.container_status("app").is_some_and(|c| c.state == ContainerState::Running)
}

#[tokio::test]
async fn real_static_pod_lifecycle_through_the_agent() {
    let Some(rt) = RealRuntime::from_env("real_static_pod_lifecycle_through_the_agent") else { return };
    let (dir, node) = scratch(&rt, "agent", "node");
    let name = format!("web-{node}");
    let client = Client::connect(&Config::new(&rt.endpoint)).unwrap();
    let runtime = Arc::new(test_runtime(&rt, &dir, &node));

    let outcome = {
        let (rt, dir, node, runtime, client) = (rt.clone(), dir.clone(), node.clone(), runtime.clone(), client.clone());
        async move {
            std::fs::write(dir.join("manifests/web.yaml"), manifest("web", &rt.busybox_image, "exec sleep 3600"))
                .unwrap();
            let mut agent = Agent::start(&rt, &dir, &node);
            let first = wait_for(&runtime, &name, "the pod to run", running).await;

            // SIGKILL and restart: the pod is re-adopted as it is.
            agent.signal(Signal::SIGKILL);
            assert!(agent.exited_within(Duration::from_secs(5)).await);
            let mut agent = Agent::start(&rt, &dir, &node);
            // The restarted agent has synced the pod once it reports it Running; then it must
            // leave it alone through a housekeeping period (2 s) and more.
            let root = dir.join("root").to_string_lossy().into_owned();
            let mut reported = false;
            for _ in 0..200 {
                let (_, json, _) = kubelet_rs(&["get", "pods", "-o", "json", "--root-dir", &root]);
                let list: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
                if list["items"].as_array().into_iter().flatten().any(|p| p["status"]["phase"] == "Running") {
                    reported = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(reported, "the restarted agent reports the pod Running");
            let watched = tokio::time::Instant::now();
            while watched.elapsed() < Duration::from_millis(2500) {
                let after = wait_for(&runtime, &name, "the pod after a restart", running).await;
                assert_eq!(after.sandbox_statuses[0].id, first.sandbox_statuses[0].id, "same sandbox");
                assert_eq!(
                    after.container_status("app").unwrap().id,
                    first.container_status("app").unwrap().id,
                    "same container"
                );
                assert_eq!(after.container_status("app").unwrap().restart_count, 0);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let after = wait_for(&runtime, &name, "the pod after a restart", running).await;

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
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

#[tokio::test]
async fn real_edits_sandbox_loss_and_removal_while_down() {
    let Some(rt) = RealRuntime::from_env("real_edits_sandbox_loss_and_removal_while_down") else { return };
    let (dir, node) = scratch(&rt, "agent-edit", "edit");
    let runtime = Arc::new(test_runtime(&rt, &dir, &node));

    let outcome = {
        let (rt, dir, node, runtime) = (rt.clone(), dir.clone(), node.clone(), runtime.clone());
        async move {
            let (web, gone) = (format!("web-{node}"), format!("gone-{node}"));
            std::fs::write(dir.join("manifests/web.yaml"), manifest("web", &rt.busybox_image, "exec sleep 3600"))
                .unwrap();
            std::fs::write(dir.join("manifests/gone.yaml"), manifest("gone", &rt.busybox_image, "exec sleep 3600"))
                .unwrap();
            let mut agent = Agent::start(&rt, &dir, &node);
            let first = wait_for(&runtime, &web, "the pod to run", running).await;
            let gone_pod = wait_for(&runtime, &gone, "the second pod to run", running).await;
            // The leak check sees a running pod's cgroup, so its absence later means something.
            let root = Path::new(cgroups::CGROUP_ROOT);
            assert!(!cgroups::pod_cgroup_dirs(root, first.uid.as_str()).is_empty(), "the running pod's cgroup");

            // An edited manifest is a new pod (a new UID): the old one stops, the new one runs.
            // The new one starts as soon as the old one is gone (its 2 s grace period, as `sleep`
            // as PID 1 ignores SIGTERM), not at a resync 10 s or more later.
            let edited_at = tokio::time::Instant::now();
            std::fs::write(dir.join("manifests/web.yaml"), manifest("web", &rt.busybox_image, "exec sleep 3601"))
                .unwrap();
            let edited = wait_for(&runtime, &web, "the edited pod to run", |s| s.uid != first.uid && running(s)).await;
            let took = edited_at.elapsed();
            println!("edited static pod running {:.1} s after the edit", took.as_secs_f64());
            assert!(took < Duration::from_secs(8), "the edited pod waited for a resync: {took:?}");
            // The old pod stops and nothing of it is left.
            wait_until_gone(&runtime, &dir, &first.uid).await;

            // A sandbox stopped behind the agent's back is recreated with the next attempt.
            let client = Client::connect(&Config::new(&rt.endpoint)).unwrap();
            let sandbox = edited.sandbox_statuses[0].clone();
            client
                .runtime_service()
                .stop_pod_sandbox(pb::StopPodSandboxRequest { pod_sandbox_id: sandbox.id.clone() })
                .await
                .unwrap();
            let recreated = wait_for(&runtime, &web, "the sandbox to be recreated", |s| {
                s.uid == edited.uid && running(s) && s.sandbox_statuses[0].id != sandbox.id
            })
            .await;
            assert_eq!(recreated.sandbox_statuses[0].attempt, sandbox.attempt + 1);

            // A manifest removed while the agent is down: its pod is stopped after the restart.
            agent.signal(Signal::SIGKILL);
            assert!(agent.exited_within(Duration::from_secs(5)).await);
            std::fs::remove_file(dir.join("manifests/gone.yaml")).unwrap();
            let mut agent = Agent::start(&rt, &dir, &node);
            // The agent kills a pod only the runtime knows and removes it in one step, so the
            // stopped pod may never be seen: wait for it to be gone, not for it to be stopped.
            wait_until_gone(&runtime, &dir, &gone_pod.uid).await;
            let still =
                wait_for(&runtime, &web, "the kept pod to keep running", |s| s.uid == edited.uid && running(s)).await;
            assert_eq!(still.sandbox_statuses[0].id, recreated.sandbox_statuses[0].id, "untouched by the restart");
            agent.signal(Signal::SIGTERM);
            assert!(agent.exited_within(Duration::from_secs(5)).await, "exits within 5 s of SIGTERM");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// Runs a test's `outcome`, which ends with its agent (running or not); once it has passed, that
/// agent (started again if it has exited) removes every pod of the test, as it removes a pod
/// whose manifest is gone, and must leave nothing of them on the host. Whatever happened, the
/// test's own clean-up then removes what is left of node `node`'s pods from the runtime.
async fn run_then_clean_up(
    outcome: impl Future<Output = Agent> + Send + 'static,
    runtime: &CriRuntime,
    dir: &Path,
    node: &str,
) {
    let left = match tokio::spawn(outcome).await {
        Ok(agent) => Ok(left_by_the_agent(agent, runtime, dir, node).await),
        Err(err) => Err(err),
    };
    for pod in runtime.get_pods(true).await.unwrap().into_iter().filter(|p| p.name.ends_with(node)) {
        let api = k8s_openapi::api::core::v1::Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                uid: Some(pod.uid.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        // A container the agent was starting when the test failed cannot be removed until its
        // start ends.
        let mut removed = runtime.remove_pod(&api).await;
        for _ in 0..20 {
            if removed.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            removed = runtime.remove_pod(&api).await;
        }
        removed.unwrap();
    }
    match left {
        Ok(left) if left.is_empty() => {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(left) => {
            common::unmount_below(dir);
            panic!("the agent left, a minute after its manifests were removed: {left:#?}");
        }
        Err(err) => std::panic::resume_unwind(err.into_panic()),
    }
}

/// Removes every manifest of `agent` and returns what of its pods is left once it has had a
/// minute to remove them: pods in the runtime, pod directories and the mounts below them, log
/// directories and container log links.
async fn left_by_the_agent(agent: Agent, runtime: &CriRuntime, dir: &Path, node: &str) -> Vec<String> {
    for manifest in std::fs::read_dir(dir.join("manifests")).unwrap() {
        std::fs::remove_file(manifest.unwrap().path()).unwrap();
    }
    let mut left = common::pods_left(runtime, dir, |p| p.name.ends_with(node)).await;
    if left.is_empty() {
        return left;
    }
    let _agent = agent.running_again(dir);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !left.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = common::pods_left(runtime, dir, |p| p.name.ends_with(node)).await;
    }
    left
}

/// A runtime manager over the test runtime, for looking at and cleaning up the agent's pods.
fn test_runtime(rt: &RealRuntime, dir: &Path, node: &str) -> CriRuntime {
    let client = Client::connect(&Config::new(&rt.endpoint)).unwrap();
    CriRuntime::new(
        client,
        manager::Config::new(node)
            .pod_logs_dir(dir.join("pods"))
            .container_logs_dir(dir.join("containers"))
            .pods_dir(dir.join("root/pods")),
        Arc::new(RingRecorder::default()),
    )
}

/// A plain HTTP GET on 127.0.0.1: the status code and the body (code 0 when nobody listens yet).
async fn get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else { return (0, String::new()) };
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let code = response.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (code, body)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The API status of the pod named `name` in `/pods`, once `done` holds (at most 30 s).
async fn pod_status(port: u16, name: &str, what: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    pod_status_within(port, name, what, Duration::from_secs(30), done).await
}

/// The API status of the pod named `name` in `/pods`, once `done` holds (at most `within`).
async fn pod_status_within(
    port: u16,
    name: &str,
    what: &str,
    within: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if let Ok((200, body)) = tokio::time::timeout(Duration::from_secs(2), get(port, "/pods")).await {
            let list: serde_json::Value = serde_json::from_str(&body).unwrap();
            if let Some(pod) = list["items"].as_array().unwrap().iter().find(|p| p["metadata"]["name"] == name)
                && done(&pod["status"])
            {
                return pod["status"].clone();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

fn pod_yaml(name: &str, policy: &str, deadline: Option<u32>, init: Option<&str>, image: &str, script: &str) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 2\n"
    );
    if let Some(d) = deadline {
        y.push_str(&format!("  activeDeadlineSeconds: {d}\n"));
    }
    if let Some(init_script) = init {
        y.push_str(&format!(
            "  initContainers:\n  - name: setup\n    image: {image}\n    command: [\"sh\", \"-c\", \"{init_script}\"]\n"
        ));
    }
    y.push_str(&format!(
        "  containers:\n  - name: app\n    image: {image}\n    command: [\"sh\", \"-c\", \"{script}\"]\n"
    ));
    y
}

fn waiting_reason(status: &serde_json::Value, name: &str) -> Option<String> {
    status["containerStatuses"].as_array()?.iter().find(|c| c["name"] == name)?["state"]["waiting"]["reason"]
        .as_str()
        .map(str::to_owned)
}

/// The waiting message of the pod's first container ("" when it is not waiting).
fn waiting_message(status: &serde_json::Value) -> String {
    status["containerStatuses"][0]["state"]["waiting"]["message"].as_str().unwrap_or_default().to_owned()
}

/// Whether the crash-loop backoff the first container waits out is 10 s doubled once per restart
/// after the first (which is immediate).
fn backoff_doubles(status: &serde_json::Value) -> bool {
    let restarts = status["containerStatuses"][0]["restartCount"].as_u64().unwrap_or(0);
    let expected = (10u64 << restarts.saturating_sub(1).min(5)).min(300);
    waiting_message(status).starts_with(&format!("back-off {expected}s "))
}

#[tokio::test]
async fn real_pod_statuses_through_the_local_api() {
    let Some(rt) = RealRuntime::from_env("real_pod_statuses_through_the_local_api") else { return };
    let (dir, node) = scratch(&rt, "agent-api", "api");
    let port = free_port();
    let image = rt.busybox_image.clone();
    let manifests = dir.join("manifests");
    let write = |file: &str, yaml: String| std::fs::write(manifests.join(file), yaml).unwrap();
    write("init.yaml", pod_yaml("init", "Always", None, Some("sleep 2"), &image, "exec sleep 3600"));
    write("crash.yaml", pod_yaml("crash", "OnFailure", None, None, &image, "exit 1"));
    write("done.yaml", pod_yaml("done", "OnFailure", None, None, &image, "exit 0"));
    write("fail.yaml", pod_yaml("fail", "Never", None, None, &image, "exit 1"));
    write("deadline.yaml", pod_yaml("deadline", "Always", Some(3), None, &image, "exec sleep 3600"));
    let mut agent = Agent::start_with(&rt, &dir, &node, &["--read-only-port", &port.to_string()]);

    let outcome = {
        let node = node.clone();
        async move {
            // Init containers first: the app waits with PodInitializing, then runs.
            let status = pod_status(port, &format!("init-{node}"), "init to run", |s| {
                waiting_reason(s, "app").as_deref() == Some("PodInitializing")
            })
            .await;
            assert_eq!(status["phase"], "Pending");
            let status = pod_status(port, &format!("init-{node}"), "the app to run", |s| s["phase"] == "Running").await;
            assert_eq!(status["initContainerStatuses"][0]["state"]["terminated"]["exitCode"], 0);
            assert_eq!(
                status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap()["status"],
                "True"
            );

            // OnFailure with exit 1: restarted, then held back by the crash-loop backoff.
            let status = pod_status(port, &format!("crash-{node}"), "CrashLoopBackOff", |s| {
                waiting_reason(s, "app").as_deref() == Some("CrashLoopBackOff")
            })
            .await;
            assert!(status["containerStatuses"][0]["restartCount"].as_i64().unwrap() >= 1);
            assert_eq!(status["containerStatuses"][0]["lastState"]["terminated"]["exitCode"], 1);
            assert!(backoff_doubles(&status), "{status}");

            // Exit 0 under OnFailure is Succeeded; exit 1 under Never is Failed.
            pod_status(port, &format!("done-{node}"), "Succeeded", |s| s["phase"] == "Succeeded").await;
            let failed = pod_status(port, &format!("fail-{node}"), "Failed", |s| s["phase"] == "Failed").await;
            assert_eq!(failed["containerStatuses"][0]["state"]["terminated"]["reason"], "Error");

            // activeDeadlineSeconds fails the pod.
            let status = pod_status(port, &format!("deadline-{node}"), "DeadlineExceeded", |s| {
                s["reason"] == "DeadlineExceeded"
            })
            .await;
            assert_eq!(status["phase"], "Failed");

            let (code, body) = get(port, "/healthz").await;
            assert_eq!((code, body.as_str()), (200, "ok"));
            // The read-only port serves no debugging handler, as upstream's.
            let (code, running) = get(port, "/runningpods/").await;
            assert_eq!((code, running.as_str()), (405, "Debug endpoints are disabled.\n"));
            let (_, metrics) = get(port, "/metrics").await;
            for name in [
                "kubelet_runtime_operations_total",
                "kubelet_pleg_relist_duration_seconds",
                "kubelet_pod_worker_duration_seconds",
                "kubelet_running_pods",
                "kubelet_running_containers{container_state=\"running\"}",
                "kubelet_started_pods_total",
                "kubelet_started_containers_total{container_type=\"container\"}",
                "kubelet_started_containers_total{container_type=\"init_container\"}",
                "kubelet_pod_start_duration_seconds",
                "kubelet_pod_start_sli_duration_seconds",
                "process_resident_memory_bytes",
                "process_cpu_seconds_total",
                "process_open_fds",
            ] {
                assert!(metrics.contains(name), "{name} missing from /metrics");
            }
            let started = metrics
                .lines()
                .find_map(|l| l.strip_prefix("kubelet_started_pods_total "))
                .and_then(|v| v.parse::<f64>().ok());
            assert!(started >= Some(5.0), "five pods started: {started:?}");

            // The backoff doubles: the second restart comes 10 s later and is followed by 20 s.
            let status = pod_status(port, &format!("crash-{node}"), "a second restart", |s| {
                s["containerStatuses"][0]["restartCount"].as_i64() >= Some(2)
                    && waiting_message(s).starts_with("back-off")
            })
            .await;
            assert!(backoff_doubles(&status), "{status}");
            agent.signal(Signal::SIGTERM);
            assert!(agent.exited_within(Duration::from_secs(5)).await, "exits within 5 s of SIGTERM");
            agent
        }
    };
    run_then_clean_up(outcome, &test_runtime(&rt, &dir, &node), &dir, &node).await;
}

/// A pod whose `app` runs `script` with the given probes (YAML lines under the container, each
/// indented by four spaces).
fn probed_pod_yaml(name: &str, image: &str, script: &str, probes: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: app\n    image: {image}\n    command: [\"sh\", \"-c\", \"{script}\"]\n{probes}"
    )
}

fn condition(status: &serde_json::Value, kind: &str) -> String {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .map_or_else(String::new, |c| c["status"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test]
async fn real_probes_restart_dead_containers_and_gate_readiness() {
    let Some(rt) = RealRuntime::from_env("real_probes_restart_dead_containers_and_gate_readiness") else { return };
    let (dir, node) = scratch(&rt, "agent-probes", "probes");
    let port = free_port();
    let image = rt.busybox_image.clone();
    let manifests = dir.join("manifests");
    let write = |file: &str, yaml: String| std::fs::write(manifests.join(file), yaml).unwrap();
    // Healthy for 4 s, then its liveness probe fails: the agent kills and restarts it.
    write(
        "live.yaml",
        probed_pod_yaml(
            "live",
            &image,
            "touch /tmp/healthy; sleep 4; rm /tmp/healthy; exec sleep 3600",
            "    livenessProbe:\n      exec:\n        command: [cat, /tmp/healthy]\n      periodSeconds: 1\n      failureThreshold: 2\n",
        ),
    );
    // Serves HTTP only after 4 s: started once its TCP port answers, ready once GET / does.
    write(
        "web.yaml",
        probed_pod_yaml(
            "web",
            &image,
            "mkdir -p /www && echo ok > /www/index.html && sleep 4 && exec httpd -f -p 8080 -h /www",
            "    ports:\n    - name: http\n      containerPort: 8080\n    startupProbe:\n      tcpSocket:\n        port: 8080\n      periodSeconds: 1\n      failureThreshold: 30\n    readinessProbe:\n      httpGet:\n        port: http\n        path: /\n      periodSeconds: 1\n",
        ),
    );
    // Never ready: its readiness probe's command fails.
    write(
        "unready.yaml",
        probed_pod_yaml(
            "unready",
            &image,
            "exec sleep 3600",
            "    readinessProbe:\n      exec:\n        command: [\"false\"]\n      periodSeconds: 1\n",
        ),
    );
    // Never started: its startup probe fails, so after 3 x 1 s it is restarted, and its
    // failing liveness probe never runs.
    write(
        "neverstarts.yaml",
        probed_pod_yaml(
            "neverstarts",
            &image,
            "exec sleep 3600",
            "    startupProbe:\n      exec:\n        command: [\"false\"]\n      periodSeconds: 1\n      failureThreshold: 3\n    livenessProbe:\n      exec:\n        command: [\"false\"]\n      periodSeconds: 1\n      failureThreshold: 1\n",
        ),
    );
    let agent = Agent::start_with(&rt, &dir, &node, &["--read-only-port", &port.to_string()]);

    let outcome = {
        let node = node.clone();
        async move {
            let web = format!("web-{node}");
            let status = pod_status(port, &web, "web to run unstarted", |s| s["phase"] == "Running").await;
            assert_eq!(status["containerStatuses"][0]["started"], false, "{status}");
            assert_eq!(status["containerStatuses"][0]["ready"], false, "{status}");
            assert_eq!(condition(&status, "Ready"), "False");
            let status = pod_status(port, &web, "web to be ready", |s| condition(s, "Ready") == "True").await;
            assert_eq!(status["containerStatuses"][0]["started"], true, "{status}");
            assert_eq!(status["containerStatuses"][0]["ready"], true, "{status}");
            assert_eq!(status["containerStatuses"][0]["restartCount"], 0, "{status}");

            let unready = pod_status(port, &format!("unready-{node}"), "unready to run", |s| {
                s["containerStatuses"][0]["state"]["running"].is_object()
            })
            .await;
            assert_eq!(unready["containerStatuses"][0]["started"], true, "no startup probe: started when running");
            // Not ready because its probe ran and failed, not because nothing happened yet.
            let unready_name = format!("unready-{node}");
            let mut failures = 0;
            for _ in 0..100 {
                let (_, metrics) = get(port, "/metrics/probes").await;
                let others = metrics.lines().filter(|l| !l.starts_with('#') && !l.starts_with("prober_probe_"));
                assert_eq!(others.count(), 0, "/metrics/probes holds the probe metrics alone: {metrics}");
                failures = probe_count(&metrics, &unready_name, "Readiness", "failed");
                if failures >= 2 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(failures >= 2, "the readiness probe of {unready_name} ran and failed twice: {failures}");
            let unready = pod_status(port, &unready_name, "unready", |_| true).await;
            assert_eq!(unready["containerStatuses"][0]["ready"], false, "{unready}");
            assert_eq!(condition(&unready, "ContainersReady"), "False");

            let live = pod_status(port, &format!("live-{node}"), "the liveness restart", |s| {
                s["containerStatuses"][0]["restartCount"].as_i64() >= Some(1)
                    && s["containerStatuses"][0]["state"]["running"].is_object()
            })
            .await;
            let last = &live["containerStatuses"][0]["lastState"]["terminated"];
            assert!(last.is_object(), "the killed instance is the last state: {live}");
            let never = format!("neverstarts-{node}");
            let status = pod_status(port, &never, "the restart after the startup probe's 3 failures", |s| {
                s["containerStatuses"][0]["restartCount"].as_i64() >= Some(1)
            })
            .await;
            assert_eq!(status["containerStatuses"][0]["started"], false, "{status}");
            let (_, metrics) = get(port, "/metrics").await;
            let never_probes: Vec<&str> = metrics
                .lines()
                .filter(|l| l.starts_with("prober_probe_total{") && l.contains(&format!("pod=\"{never}\"")))
                .collect();
            assert!(
                never_probes.iter().any(|l| l.contains("probe_type=\"Startup\"") && l.contains("result=\"failed\"")),
                "{never_probes:?}"
            );
            assert!(
                !never_probes.iter().any(|l| l.contains("probe_type=\"Liveness\"")),
                "no liveness probe before the startup probe passed: {never_probes:?}"
            );
            for line in [
                "prober_probe_total{probe_type=\"Liveness\",result=\"failed\"",
                "prober_probe_total{probe_type=\"Readiness\",result=\"successful\"",
                "prober_probe_total{probe_type=\"Startup\",result=\"failed\"",
                "prober_probe_duration_seconds_bucket{probe_type=\"Readiness\"",
            ] {
                assert!(metrics.contains(line), "{line} missing from /metrics");
            }
            agent
        }
    };
    run_then_clean_up(outcome, &test_runtime(&rt, &dir, &node), &dir, &node).await;
}

/// How many `kind` probes of pod `pod` had `result`, from `prober_probe_total` in `metrics`.
fn probe_count(metrics: &str, pod: &str, kind: &str, result: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("prober_probe_total{") && l.contains(&format!("pod=\"{pod}\"")))
        .filter(|l| l.contains(&format!("probe_type=\"{kind}\"")) && l.contains(&format!("result=\"{result}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|n| n as u64)
        .sum()
}

/// An HTTP server on 127.0.0.1 that answers 200 to everything and keeps each request's path.
async fn recording_server() -> (u16, Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let paths = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = paths.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = vec![0; 4096];
            let n = stream.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            seen.lock().unwrap().push(head.split_whitespace().nth(1).unwrap_or_default().to_owned());
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        }
    });
    (port, paths)
}

/// An HTTPS server on 127.0.0.1 with a self-signed certificate (made with `openssl` in `dir`)
/// that answers 200 to everything and keeps each request's path.
async fn recording_tls_server(dir: &Path) -> (u16, Arc<std::sync::Mutex<Vec<String>>>) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (cert, key) = (dir.join("cert.der"), dir.join("key.der"));
    let made = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=probe -outform der -out {} -keyout {dir}/key.pem && openssl pkcs8 -topk8 -nocrypt -in {dir}/key.pem -outform der -out {}",
            cert.display(),
            key.display(),
            dir = dir.display()
        ))
        .output()
        .unwrap();
    assert!(made.status.success(), "openssl: {}", String::from_utf8_lossy(&made.stderr));
    let cert = CertificateDer::from(std::fs::read(cert).unwrap());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(std::fs::read(key).unwrap()));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let paths = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = paths.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let Ok(mut stream) = acceptor.accept(stream).await else { continue };
            let mut buf = vec![0; 4096];
            let n = stream.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            seen.lock().unwrap().push(head.split_whitespace().nth(1).unwrap_or_default().to_owned());
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
            let _ = stream.shutdown().await;
        }
    });
    (port, paths)
}

#[tokio::test]
async fn real_hooks_run_after_start_and_before_stop() {
    let Some(rt) = RealRuntime::from_env("real_hooks_run_after_start_and_before_stop") else { return };
    let (dir, node) = scratch(&rt, "agent-hooks", "hooks");
    let port = free_port();
    let (hook_port, hook_paths) = recording_server().await;
    let (tls_port, tls_paths) = recording_tls_server(&dir).await;
    let image = rt.busybox_image.clone();
    let manifests = dir.join("manifests");
    // `secure`'s postStart hook and readiness probe speak HTTPS to a server whose certificate no
    // authority vouches for, as upstream's do.
    let secure = probed_pod_yaml(
        "secure",
        &image,
        "exec sleep 3600",
        &format!(
            "    lifecycle:\n      postStart:\n        httpGet: {{host: 127.0.0.1, port: {tls_port}, path: /started, scheme: HTTPS}}\n    readinessProbe:\n      httpGet: {{host: 127.0.0.1, port: {tls_port}, path: /ready, scheme: HTTPS}}\n      periodSeconds: 1\n"
        ),
    );
    std::fs::write(manifests.join("secure.yaml"), secure).unwrap();
    // `app`'s postStart writes the file its readiness probe reads; its preStop sleeps far past
    // the 5 s grace period. `web`'s hooks are httpGet requests the agent makes to this test.
    let hooked = [
        "apiVersion: v1",
        "kind: Pod",
        "metadata:",
        "  name: hooked",
        "spec:",
        "  terminationGracePeriodSeconds: 5",
        "  containers:",
        "  - name: app",
        &format!("    image: {image}"),
        "    command: [sh, -c, 'exec sleep 3600']",
        "    lifecycle:",
        "      postStart:",
        "        exec:",
        "          command: [sh, -c, 'echo started > /tmp/poststart']",
        "      preStop:",
        "        sleep:",
        "          seconds: 60",
        "    readinessProbe:",
        "      exec:",
        "        command: [cat, /tmp/poststart]",
        "      periodSeconds: 1",
        "  - name: web",
        &format!("    image: {image}"),
        "    command: [sh, -c, 'exec sleep 3600']",
        "    lifecycle:",
        "      postStart:",
        &format!("        httpGet: {{host: 127.0.0.1, port: {hook_port}, path: /poststart}}"),
        "      preStop:",
        &format!("        httpGet: {{host: 127.0.0.1, port: {hook_port}, path: /prestop}}"),
        "",
    ]
    .join("\n");
    std::fs::write(manifests.join("hooked.yaml"), hooked).unwrap();
    // A postStart hook that fails: the container is killed and started again.
    let failing = probed_pod_yaml(
        "badstart",
        &image,
        "exec sleep 3600",
        "    lifecycle:\n      postStart:\n        exec:\n          command: [\"false\"]\n",
    );
    std::fs::write(manifests.join("badstart.yaml"), failing).unwrap();
    let agent = Agent::start_with(&rt, &dir, &node, &["--read-only-port", &port.to_string()]);
    let root = dir.join("root").to_string_lossy().into_owned();
    let runtime = test_runtime(&rt, &dir, &node);

    let outcome = {
        let node = node.clone();
        let dir = dir.clone();
        let rt_for_body = test_runtime(&rt, &dir, &node);
        async move {
            let hooked = format!("hooked-{node}");
            let status = pod_status(port, &hooked, "hooked to be ready", |s| condition(s, "Ready") == "True").await;
            assert_eq!(status["containerStatuses"][0]["restartCount"], 0, "{status}");
            assert_eq!(*hook_paths.lock().unwrap(), ["/poststart"], "web's postStart request");
            pod_status(port, &format!("secure-{node}"), "secure to be ready over HTTPS", |s| {
                condition(s, "Ready") == "True"
            })
            .await;
            let over_tls = tls_paths.lock().unwrap().clone();
            assert_eq!(over_tls.first().map(String::as_str), Some("/started"), "{over_tls:?}");
            assert!(over_tls.iter().any(|p| p == "/ready"), "{over_tls:?}");

            let bad = pod_status(port, &format!("badstart-{node}"), "the restart after the failed postStart", |s| {
                s["containerStatuses"][0]["restartCount"].as_i64() >= Some(1)
            })
            .await;
            assert!(bad["containerStatuses"][0]["lastState"]["terminated"].is_object(), "{bad}");
            let (ok, described, err) =
                kubelet_rs(&["describe", "pod", &format!("badstart-{node}"), "--root-dir", &root]);
            assert!(ok, "describe: {err}");
            for want in ["FailedPostStartHook  ", "PostStartHook failed", "Killing  ", "  FailedPostStartHook\n"] {
                assert!(described.contains(want), "{want:?} missing from:\n{described}");
            }

            // Removing the manifest: app's preStop holds its stop for the whole 5 s grace period,
            // then StopContainer gets the 2 s floor; web's preStop request arrives.
            let removed = tokio::time::Instant::now();
            std::fs::remove_file(dir.join("manifests/hooked.yaml")).unwrap();
            let app_running = || async {
                rt_for_body
                    .get_pods(true)
                    .await
                    .unwrap()
                    .iter()
                    .filter(|p| p.name == hooked)
                    .any(|p| p.containers.iter().any(|c| c.name == "app" && c.state == ContainerState::Running))
            };
            for _ in 0..300 {
                if !app_running().await {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let took = removed.elapsed();
            assert!(!app_running().await, "app still runs {took:?} after its manifest went");
            assert!(took >= Duration::from_secs(5), "the preStop hook ran within the grace period: {took:?}");
            assert!(took < Duration::from_secs(20), "the preStop hook was cut at the grace period: {took:?}");
            assert_eq!(*hook_paths.lock().unwrap(), ["/poststart", "/prestop"], "web's preStop request");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

#[tokio::test]
async fn real_upstream_invocation_with_a_kubeadm_configuration() {
    let Some(rt) = RealRuntime::from_env("real_upstream_invocation_with_a_kubeadm_configuration") else { return };
    let (dir, node) = scratch(&rt, "agent-config", "config");
    let (file_port, flag_port, healthz_port) = (free_port(), free_port(), free_port());
    // The file names another manifest directory and a read-only port; the flags override both.
    // Its healthz port and sync frequency are not overridden, so they come from the file.
    let config = dir.join("kubelet.yaml");
    // As kubeadm writes it: fields without effect here are accepted and named in one warning.
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             staticPodPath: {}\nreadOnlyPort: {file_port}\nhealthzPort: {healthz_port}\nsyncFrequency: 30s\n\
             fileCheckFrequency: 5s\nmaxPods: 20\nsystemReserved: {{cpu: 100m, memory: 64Mi}}\n\
             authentication: {{anonymous: {{enabled: false}}, webhook: {{enabled: true, cacheTTL: 0s}}, x509: {{clientCAFile: /etc/kubernetes/pki/ca.crt}}}}\n\
             authorization: {{mode: Webhook}}\nclusterDNS: [10.96.0.10]\nclusterDomain: cluster.local\n\
             cgroupsPerQOS: true\nfailSwapOn: false\nport: 10250\nrotateCertificates: true\nserverTLSBootstrap: false\n\
             evictionHard: {{memory.available: 100Mi}}\ncontainerLogMaxSize: 10Mi\ncontainerLogMaxFiles: 5\n\
             featureGates: {{KubeletCrashLoopBackOffMax: false}}\n",
            dir.join("unused-manifests").display()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("manifests/web.yaml"), manifest("web", &rt.busybox_image, "exec sleep 3600")).unwrap();
    let config_arg = config.to_string_lossy().into_owned();
    let flag_port_arg = flag_port.to_string();
    // Not `start_with`, which turns the healthz port off with a flag: here the file names it.
    let mut agent = Agent::spawn(agent_command(&rt, &dir, &node).args([
        "--config",
        &config_arg,
        "--read-only-port",
        &flag_port_arg,
    ]));

    let rt_for_body = rt.clone();
    let outcome = {
        let (node, dir) = (node.clone(), dir.clone());
        async move {
            // The flag's manifest path: the pod runs; the flag's port: it is reported there.
            let status =
                pod_status(flag_port, &format!("web-{node}"), "the pod to run", |s| s["phase"] == "Running").await;
            assert!(status["containerStatuses"][0]["state"]["running"].is_object(), "{status}");
            assert_eq!(get(file_port, "/pods").await.0, 0, "the file's read-only port is overridden by the flag");
            // The file's healthz port, as no flag names one.
            let (code, body) = get(healthz_port, "/healthz").await;
            assert_eq!((code, body.as_str()), (200, "ok"));
            // clusterDNS and clusterDomain: a ClusterFirst pod resolves through the cluster.
            let runtime = test_runtime(&rt_for_body, &dir, &node);
            let resolv = exec_in_app(&runtime, &format!("web-{node}"), &["cat", "/etc/resolv.conf"]).await;
            assert!(resolv.contains("nameserver 10.96.0.10"), "{resolv}");
            assert!(resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"), "{resolv}");
            assert!(resolv.contains("ndots:5"), "{resolv}");
            let log = std::fs::read_to_string(dir.join("agent.log")).unwrap();
            assert!(
                log.contains("set but without effect in kubelet-rs: featureGates"),
                "one warning names what the file sets without effect: {log}"
            );
            // kubeadm's file asks for webhook authentication and authorization, which need the
            // API server: standalone, the kubelet API is not served, and the warning says so.
            assert!(log.contains("the kubelet API is not served"), "{log}");
            agent.signal(Signal::SIGTERM);
            assert!(agent.exited_within(Duration::from_secs(5)).await, "exits within 5 s of SIGTERM");
            agent
        }
    };
    run_then_clean_up(outcome, &test_runtime(&rt, &dir, &node), &dir, &node).await;
}

/// Runs `kubelet-rs` with `args`; its exit success and stdout.
fn kubelet_rs(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_kubelet-rs")).args(args).output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn real_get_pods_and_logs_through_the_unix_socket() {
    let Some(rt) = RealRuntime::from_env("real_get_pods_and_logs_through_the_unix_socket") else { return };
    let (dir, node) = scratch(&rt, "agent-cli", "cli");
    // A 20,000-character line (containerd splits it into partial pieces), then a line a second.
    let script =
        "head -c 20000 /dev/zero | tr -c x x; echo; i=0; while true; do echo line-$i; i=$((i+1)); sleep 1; done";
    std::fs::write(dir.join("manifests/logs.yaml"), manifest("logs", &rt.busybox_image, script)).unwrap();
    let mut agent = Agent::start(&rt, &dir, &node);
    let root = dir.join("root").to_string_lossy().into_owned();

    let outcome = {
        let node = node.clone();
        async move {
            let pod = format!("logs-{node}");
            let socket = Path::new(&root).join("kubelet-rs.sock");
            use std::os::unix::fs::PermissionsExt;
            for _ in 0..100 {
                if socket.exists() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600, "socket mode");

            // get pods: the kubectl-style table, once the pod runs.
            let mut table = String::new();
            for _ in 0..200 {
                let (ok, out, err) = kubelet_rs(&["get", "pods", "--root-dir", &root]);
                assert!(ok, "get pods: {err}");
                table = out;
                if table.lines().any(|l| l.starts_with(&pod) && l.contains("Running") && l.contains("1/1")) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
            assert_eq!(header, ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"], "{table}");
            let row: Vec<&str> =
                table.lines().find(|l| l.starts_with(&pod)).expect("the pod's row").split_whitespace().collect();
            assert_eq!((row[1], row[2], row[3]), ("1/1", "Running", "0"), "{table}");
            assert!(row[5].starts_with("10.85."), "pod IP in the table: {table}");
            let (ok, json, _) = kubelet_rs(&["get", "pods", "-o", "json", "--root-dir", &root]);
            let list: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert!(ok && list["kind"] == "PodList" && list["items"][0]["metadata"]["name"] == pod.as_str(), "{json}");
            let (ok, yaml, _) = kubelet_rs(&["get", "pods", "-o", "yaml", "--root-dir", &root]);
            assert!(ok && yaml.contains("kind: PodList"), "{yaml}");
            let (ok, described, err) = kubelet_rs(&["describe", "pod", &pod, "--root-dir", &root]);
            assert!(ok, "describe: {err}");
            for want in [
                "Status:       Running",
                "  app:",
                "    State:          Running",
                "Ready             True",
                "Events:",
                "Started container app",
            ] {
                assert!(described.contains(want), "{want:?} missing from:\n{described}");
            }

            // logs: the long line comes back whole; --tail and --timestamps as kubectl's. Wait
            // for the second short line (a second after the first).
            let mut logs = String::new();
            for _ in 0..100 {
                let (ok, out, err) = kubelet_rs(&["logs", &pod, "--root-dir", &root]);
                assert!(ok, "logs: {err}");
                logs = out;
                if logs.contains("line-1\n") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let first = logs.lines().next().unwrap();
            assert!(
                first.len() == 20_000 && first.bytes().all(|b| b == b'x'),
                "the long line, rejoined ({} bytes)",
                first.len()
            );
            assert!(logs.contains("line-0\nline-1\n"), "{logs}");
            let (_, tail, _) = kubelet_rs(&["logs", &pod, "--tail", "2", "--timestamps", "--root-dir", &root]);
            let tail: Vec<&str> = tail.lines().collect();
            assert_eq!(tail.len(), 2, "{tail:?}");
            assert!(tail.iter().all(|l| l.contains("Z line-")), "{tail:?}");
            let (ok, _, err) = kubelet_rs(&["logs", &pod, "--previous", "--root-dir", &root]);
            assert!(!ok && err.contains("previous"), "{err}");
            let (ok, _, err) = kubelet_rs(&["logs", "nope", "--root-dir", &root]);
            assert!(!ok && err.contains("not found"), "{err}");

            // -f: new lines arrive as the container writes them.
            let mut follow = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubelet-rs"))
                .args(["logs", &pod, "-f", "--tail", "1", "--root-dir", &root])
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(follow.stdout.take().unwrap()));
            let first: u32 = lines.next_line().await.unwrap().unwrap().trim_start_matches("line-").parse().unwrap();
            let later =
                tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await.unwrap().unwrap().unwrap();
            assert_eq!(later, format!("line-{}", first + 1));
            follow.kill().await.unwrap();

            // exec: stdin in, stdout and stderr apart, the command's exit code out.
            let script = "read line; echo \"got $line\"; echo oops >&2; exit 3";
            let mut exec = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubelet-rs"))
                .args(["exec", "-i", &pod, "--root-dir", &root, "--", "sh", "-c", script])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            tokio::io::AsyncWriteExt::write_all(exec.stdin.as_mut().unwrap(), b"ping\n").await.unwrap();
            let output = tokio::time::timeout(Duration::from_secs(20), exec.wait_with_output()).await.unwrap().unwrap();
            let (out, err) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
            assert_eq!((out.as_ref(), err.as_ref(), output.status.code()), ("got ping\n", "oops\n", Some(3)));
            let (ok, out, err) = kubelet_rs(&["exec", &pod, "--root-dir", &root, "--", "cat", "/etc/hostname"]);
            assert!(ok && out.trim() == pod, "{out} {err}");
            let (ok, _, err) = kubelet_rs(&["exec", "nope", "--root-dir", &root, "--", "true"]);
            assert!(!ok && err.contains("not found"), "{err}");

            // port-forward: a local port reaches an httpd in the pod, a connection at a time.
            let (ok, _, err) =
                kubelet_rs(&["exec", &pod, "--root-dir", &root, "--", "httpd", "-p", "8080", "-h", "/etc"]);
            assert!(ok, "httpd: {err}");
            let mut forward = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubelet-rs"))
                .args(["port-forward", &pod, ":8080", "--root-dir", &root])
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut said = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(forward.stdout.take().unwrap()));
            let listening =
                tokio::time::timeout(Duration::from_secs(10), said.next_line()).await.unwrap().unwrap().unwrap();
            let local = listening
                .strip_prefix("Forwarding from ")
                .and_then(|rest| rest.strip_suffix(" -> 8080"))
                .unwrap_or_else(|| panic!("{listening:?}"))
                .to_owned();
            for _ in 0..2 {
                let mut connection = tokio::net::TcpStream::connect(&local).await.unwrap();
                tokio::io::AsyncWriteExt::write_all(&mut connection, b"GET /hostname HTTP/1.0\r\n\r\n").await.unwrap();
                let mut answer = String::new();
                let reading = tokio::io::AsyncReadExt::read_to_string(&mut connection, &mut answer);
                tokio::time::timeout(Duration::from_secs(10), reading).await.unwrap().unwrap();
                assert!(answer.starts_with("HTTP/1.") && answer.ends_with(&format!("\r\n\r\n{pod}\n")), "{answer:?}");
            }
            forward.kill().await.unwrap();
            let (ok, _, err) = kubelet_rs(&["port-forward", "nope", "8080", "--root-dir", &root]);
            assert!(!ok && err.contains("not found"), "{err}");

            agent.signal(Signal::SIGTERM);
            assert!(agent.exited_within(Duration::from_secs(5)).await, "exits within 5 s of SIGTERM");
            assert!(!socket.exists(), "the socket is removed at shutdown");
            agent
        }
    };
    run_then_clean_up(outcome, &test_runtime(&rt, &dir, &node), &dir, &node).await;
}

/// The files of a container log directory that count against `containerLogMaxFiles` (a
/// compression's `.tmp` does not), sorted by name.
fn log_files(container_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(container_dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("0.log") && !n.ends_with(".tmp"))
        .collect();
    names.sort();
    names
}

/// The messages in a container's log files, oldest file first (the rotated ones in name order,
/// decompressed, then the live one), each with the name of the file it was read from; lines split
/// between two files are joined again (see [`join_split_lines`]).
fn logged_messages(container_dir: &Path) -> Vec<(String, String)> {
    let mut names = log_files(container_dir);
    // The live file sorts first by name ("0.log" < "0.log.<stamp>"), but was written last.
    let live_first = names.first().is_some_and(|n| n == "0.log");
    names.rotate_left(usize::from(live_first));
    let mut messages = Vec::new();
    for name in names {
        let path = container_dir.join(&name);
        let mut text = String::new();
        let Ok(file) = std::fs::File::open(&path) else { continue };
        if name.ends_with(".gz") {
            std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(file), &mut text).unwrap();
        } else {
            std::io::Read::read_to_string(&mut std::io::BufReader::new(file), &mut text).unwrap();
        }
        // A CRI log line is "<time> <stream> <tag> <message>".
        let found = text.lines().filter_map(|l| l.splitn(4, ' ').nth(3));
        messages.extend(found.map(|m| (name.clone(), m.to_owned())));
    }
    join_split_lines(messages)
}

/// `messages` (each with where it was read) with each line split in two joined again: a piece
/// that is not a whole line, followed by the piece that makes it one.
///
/// containerd hands a container's output to the log file in the chunks it reads, so a log reopen
/// during a burst can end one file with the start of a line and begin the next with its rest, each
/// written as a line of its own, which the CRI format cannot mark (upstream's rotation is the same).
/// A piece that completes nothing (the rest of a line whose start was rotated away) stays as it is.
fn join_split_lines(messages: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut joined = Vec::with_capacity(messages.len());
    let mut messages = messages.into_iter().peekable();
    while let Some((origin, message)) = messages.next() {
        let rest = messages.peek().map(|(_, rest)| rest.as_str()).unwrap_or_default();
        let whole = format!("{message}{rest}");
        if !is_whole_line(&message) && is_whole_line(&whole) {
            let (rest_origin, rest) = messages.next().expect("peeked above");
            eprintln!("joined a line split between {origin} and {rest_origin}: {message:?} + {rest:?}");
            joined.push((rest_origin, whole));
        } else {
            joined.push((origin, message));
        }
    }
    joined
}

#[test]
fn split_log_lines_are_joined_and_a_rest_without_its_start_is_kept() {
    let pad = "x".repeat(80);
    let messages = [
        ("a", format!("-7-{pad}")),
        ("a", format!("line-8-{pad}")),
        ("a", "lin".to_owned()),
        ("b", format!("e-9-{pad}")),
        ("b", "last-10".to_owned()),
    ];
    let messages = messages.into_iter().map(|(origin, m)| (origin.to_owned(), m)).collect();
    let joined: Vec<String> = join_split_lines(messages).into_iter().map(|(_, m)| m).collect();
    assert_eq!(joined, [format!("-7-{pad}"), format!("line-8-{pad}"), format!("line-9-{pad}"), "last-10".to_owned()]);
}

/// Whether `message` is one whole line of the chatty container: `line-N-` and 80 x, or `last-N`.
fn is_whole_line(message: &str) -> bool {
    let numbered = line_number(message).is_some() && message.ends_with(&"x".repeat(80));
    numbered || message.starts_with("last-")
}

/// The number N of a `line-N-...` message.
fn line_number(message: &str) -> Option<u64> {
    message.strip_prefix("line-")?.split('-').next()?.parse().ok()
}

/// Where `messages` first break the run of consecutive line numbers, with the messages around it.
fn first_gap(messages: &[(String, String)]) -> String {
    let numbered: Vec<(usize, u64)> =
        messages.iter().enumerate().filter_map(|(i, (_, m))| Some((i, line_number(m)?))).collect();
    let Some(gap) = numbered.windows(2).find(|w| w[1].1 != w[0].1 + 1) else {
        return "no gap".to_owned();
    };
    let around = &messages[gap[0].0.saturating_sub(2)..(gap[1].0 + 3).min(messages.len())];
    format!("after line {} comes {}: {around:?}", gap[0].1, gap[1].1)
}

#[tokio::test(flavor = "multi_thread")]
async fn real_container_logs_rotate_without_losing_lines() {
    let Some(rt) = RealRuntime::from_env("real_container_logs_rotate_without_losing_lines") else { return };
    let (dir, node) = scratch(&rt, "agent-logrotate", "logrotate");
    let config = dir.join("kubelet.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\ncontainerLogMonitorInterval: 3s\n",
    )
    .unwrap();
    // About 30 MiB of numbered 100-byte lines over 15 s or so, then the last number, then idle.
    let script = "pad=$(head -c 80 /dev/zero | tr -c x x); i=0; \
                  while [ $i -lt 200000 ]; do echo line-$i-$pad; i=$((i+1)); \
                  if [ $((i % 15000)) -eq 0 ]; then sleep 1; fi; done; echo last-$i; sleep 3600";
    std::fs::write(dir.join("manifests/chatty.yaml"), manifest("chatty", &rt.busybox_image, script)).unwrap();
    let mut command = agent_command(&rt, &dir, &node);
    command.arg("--config").arg(&config);
    let agent = Agent::spawn(&mut command);
    let root = dir.join("root").to_string_lossy().into_owned();
    let runtime = test_runtime(&rt, &dir, &node);

    let outcome = {
        let dir = dir.clone();
        let node = node.clone();
        let runtime = test_runtime(&rt, &dir, &node);
        async move {
            let pod = format!("chatty-{node}");
            let status = wait_for(&runtime, &pod, "the chatty pod to run", running).await;
            let pod_dir = std::fs::read_dir(dir.join("pods"))
                .unwrap()
                .filter_map(Result::ok)
                .find(|e| e.file_name().to_string_lossy().ends_with(status.uid.as_str()))
                .expect("the pod's log directory")
                .path();
            let container_dir = pod_dir.join("app");
            // Watch the file count while the container writes, until it says it is done.
            let mut most = 0;
            let mut done = false;
            for _ in 0..1200 {
                let files = log_files(&container_dir);
                most = most.max(files.len());
                // The last line may be rotated out of the live file between two looks: the
                // uncompressed rotated file is read too.
                let readable = files.iter().filter(|f| !f.ends_with(".gz"));
                let read = |file: &String| std::fs::read_to_string(container_dir.join(file)).unwrap_or_default();
                if readable.map(read).any(|text| text.contains("last-200000")) {
                    done = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(done, "the container wrote its last line");
            // The live file is rotated once more on the next round; wait for it (at most 10 s).
            for _ in 0..100 {
                if std::fs::metadata(container_dir.join("0.log")).map_or(0, |m| m.len()) < 1024 * 1024 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let files = log_files(&container_dir);
            assert!(most <= 3, "at most 3 files at any time, saw {most}");
            assert!(files.iter().any(|f| f.ends_with(".gz")), "older files are compressed: {files:?}");
            let messages = logged_messages(&container_dir);
            let numbers: Vec<u64> = messages.iter().filter_map(|(_, m)| line_number(m)).collect();
            let first = *numbers.first().expect("numbered lines kept");
            assert!(first > 0, "the oldest lines were rotated away");
            let expected: Vec<u64> = (first..200_000).collect();
            assert!(
                numbers == expected,
                "kept lines {first}.. are consecutive up to the last: {} lines; {}",
                numbers.len(),
                first_gap(&messages)
            );

            // `kubelet-rs logs` reads across the uncompressed rotated file and the live one.
            let (ok, logs, err) = kubelet_rs(&["logs", &pod, "--root-dir", &root]);
            assert!(ok, "logs: {err}");
            let shown_lines = logs.lines().map(|l| ("logs".to_owned(), l.to_owned())).collect();
            let shown: Vec<u64> = join_split_lines(shown_lines).iter().filter_map(|(_, l)| line_number(l)).collect();
            assert!(!shown.is_empty() && shown.windows(2).all(|w| w[1] == w[0] + 1), "logs are consecutive");
            assert_eq!(shown.last(), Some(&199_999));
            assert!(logs.ends_with("last-200000\n"), "the last line is shown");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// `enforceNodeAllocatable: [pods, system-reserved]` limits the existing `systemReservedCgroup`
/// to `systemReserved` (shares for the CPU, a memory limit) as upstream does, and the agent
/// refuses to start when an enforced reserved cgroup does not exist, naming it.
#[tokio::test(flavor = "multi_thread")]
async fn real_reserved_cgroups_are_limited_to_their_reservations() {
    let test = "real_reserved_cgroups_are_limited_to_their_reservations";
    let Some(rt) = RealRuntime::from_env(test) else { return };
    if Path::new(cgroups::CGROUP_ROOT).join("cgroup.controllers").exists() {
        kubelet_core::testing::skip(test, "it reads cgroup v1 files");
        return;
    }
    let (dir, node) = scratch(&rt, "agent-reserved", "reserved");
    let system = format!("/kubelet-rs-test-system-reserved-{}", std::process::id());
    let missing = format!("/kubelet-rs-test-missing-{}", std::process::id());
    let controller_dir =
        |controller: &str, cgroup: &str| Path::new(cgroups::CGROUP_ROOT).join(controller).join(&cgroup[1..]);
    // Upstream's check wants the cgroup in each of these controllers that is mounted.
    let controllers: Vec<&str> = ["cpu", "cpuacct", "cpuset", "memory", "pids", "hugetlb"]
        .into_iter()
        .filter(|c| Path::new(cgroups::CGROUP_ROOT).join(c).is_dir())
        .collect();
    for controller in &controllers {
        std::fs::create_dir_all(controller_dir(controller, &system)).unwrap();
    }
    let config = dir.join("kubelet.yaml");
    let write_config = |enforced: &str, kube_reserved_cgroup: &str| {
        let body = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             enforceNodeAllocatable: [{enforced}]\nsystemReservedCgroup: {system}\n\
             kubeReservedCgroup: {kube_reserved_cgroup}\nsystemReserved: {{cpu: 500m, memory: 100Mi}}\n"
        );
        std::fs::write(&config, body).unwrap();
    };

    // Not enforced: a kubeReservedCgroup that does not exist is never looked at.
    write_config("pods, system-reserved", &missing);
    let script = "trap 'exit 0' TERM; while true; do sleep 1; done";
    std::fs::write(dir.join("manifests/steady.yaml"), manifest("steady", &rt.busybox_image, script)).unwrap();
    let agent = Agent::start_with(&rt, &dir, &node, &["--config", config.to_str().unwrap()]);
    let runtime = test_runtime(&rt, &dir, &node);
    let outcome = {
        let mut agent = agent;
        let runtime = test_runtime(&rt, &dir, &node);
        let (dir, node, system) = (dir.clone(), node.clone(), system.clone());
        async move {
            let steady = wait_for(&runtime, &format!("steady-{node}"), "the static pod to run", running).await;
            let file = |controller: &str, name: &str| cgroup_file(&format!("{controller}{system}/{name}"));
            assert_eq!(file("cpu", "cpu.shares"), "512", "500m of CPU as shares");
            assert_eq!(file("memory", "memory.limit_in_bytes"), "104857600", "100Mi of memory");
            let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
            assert!(log.contains("Updated limits on system reserved cgroup"), "{log}");
            // The agent stops with its pod, before the second start.
            std::fs::remove_file(dir.join("manifests/steady.yaml")).unwrap();
            wait_until_gone(&runtime, &dir, &steady.uid).await;
            agent.signal(Signal::SIGTERM);
            assert!(agent.exited_within(Duration::from_secs(30)).await, "the agent stops");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;

    // Enforced on a cgroup that does not exist: the agent stops at start-up and says why.
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    write_config("pods, kube-reserved", &missing);
    let mut refused = Agent::start_with(&rt, &dir, &node, &["--config", config.to_str().unwrap()]);
    let exited = refused.exited_within(Duration::from_secs(30)).await;
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    for controller in &controllers {
        let _ = std::fs::remove_dir(controller_dir(controller, &system));
    }
    assert!(exited, "the agent refuses to run:\n{log}");
    assert!(!refused.child.try_wait().unwrap().unwrap().success(), "with a failure");
    // The log quotes the error, so its own quotes are escaped.
    let expected = format!("Failed to enforce Kube Reserved Cgroup Limits on \\\"{missing}\\\"");
    assert!(log.contains(&expected), "the error names the cgroup:\n{log}");
    assert!(log.contains("has some missing paths"), "upstream's reason:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The node's 2 MiB huge pages, as a count of pages.
const HUGEPAGES_2MI: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";

/// Huge pages as upstream handles them, with four 2 MiB pages allocated for the test: a pod
/// asking for 4Mi of them runs with that hugetlb limit on its pod cgroup (and zero of the 1 GiB
/// size), a pod asking for more than is left is refused with
/// `OutOfhugepages-2Mi`, a pod asking for none gets a limit of zero, and `kubepods` holds them all.
#[tokio::test(flavor = "multi_thread")]
async fn real_huge_pages_are_admitted_and_limited_as_upstream() {
    let test = "real_huge_pages_are_admitted_and_limited_as_upstream";
    let Some(rt) = RealRuntime::from_env(test) else { return };
    let hugetlb = Path::new(cgroups::CGROUP_ROOT).join("hugetlb");
    if !hugetlb.is_dir() || !Path::new(HUGEPAGES_2MI).exists() {
        // The machine's kernel, not the agent: CI's summary names it among what it did not check.
        let why = "this machine has no cgroup v1 hugetlb controller or no 2 MiB huge pages";
        kubelet_core::testing::not_checked(test, "huge pages admitted and limited", why);
        return;
    }
    let pages = HugePages::allocate(4);
    let (dir, node) = scratch(&rt, "agent-hugepages", "hugepages");
    let outcome = huge_pages_outcome(rt.clone(), dir.clone(), node.clone(), pages.allocated == 4);
    let runtime = test_runtime(&rt, &dir, &node);
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// 2 MiB huge pages allocated for a test, given back when dropped.
struct HugePages {
    before: String,
    allocated: u64,
}

impl HugePages {
    fn allocate(pages: u64) -> HugePages {
        let before = std::fs::read_to_string(HUGEPAGES_2MI).unwrap().trim().to_owned();
        std::fs::write(HUGEPAGES_2MI, pages.to_string()).unwrap();
        let allocated = std::fs::read_to_string(HUGEPAGES_2MI).unwrap().trim().parse().unwrap_or(0);
        HugePages { before, allocated }
    }
}

impl Drop for HugePages {
    fn drop(&mut self) {
        let _ = std::fs::write(HUGEPAGES_2MI, &self.before);
    }
}

/// The body of [`real_huge_pages_are_admitted_and_limited_as_upstream`]; `allocated` says whether
/// the kernel gave the four pages asked for.
async fn huge_pages_outcome(rt: RealRuntime, dir: std::path::PathBuf, node: String, allocated: bool) -> Agent {
    let sleep = "trap 'exit 0' TERM; while true; do sleep 1; done";
    let huge = |amount: &str| {
        format!(
            "{{requests: {{cpu: 100m, memory: 16Mi, hugepages-2Mi: {amount}}}, limits: {{cpu: 100m, memory: 16Mi, hugepages-2Mi: {amount}}}}}"
        )
    };
    let write_pod = |name: &str, resources: &str| {
        let manifest = resources_manifest(name, &rt.busybox_image, sleep, resources);
        std::fs::write(dir.join(format!("manifests/{name}.yaml")), manifest).unwrap();
    };
    write_pod("huge", &huge("4Mi"));
    write_pod("plain", "{}");
    let port = free_port();
    let agent = Agent::start_with(&rt, &dir, &node, &["--read-only-port", &port.to_string()]);
    let runtime = test_runtime(&rt, &dir, &node);
    let hugetlb_file =
        |cgroup: &str, size: &str| cgroup_file(&format!("hugetlb/{cgroup}/hugetlb.{size}.limit_in_bytes"));
    let plain = wait_for(&runtime, &format!("plain-{node}"), "the plain pod to run", running).await;
    assert_eq!(hugetlb_file(&format!("kubepods/besteffort/pod{}", plain.uid), "2MB"), "0", "none asked for");
    assert_eq!(hugetlb_file(&format!("kubepods/besteffort/pod{}", plain.uid), "1GB"), "0");
    if !allocated {
        let test = "real_huge_pages_are_admitted_and_limited_as_upstream";
        let why = "the kernel did not allocate four 2 MiB pages";
        kubelet_core::testing::not_checked(test, "huge pages admitted", why);
        return agent;
    }
    assert_eq!(hugetlb_file("kubepods", "2MB"), (8 << 20).to_string(), "kubepods holds the node's huge pages");
    let huge_pod = wait_for(&runtime, &format!("huge-{node}"), "the huge page pod to run", running).await;
    let pod_cgroup = format!("kubepods/pod{}", huge_pod.uid);
    assert_eq!(hugetlb_file(&pod_cgroup, "2MB"), (4 << 20).to_string());
    assert_eq!(hugetlb_file(&pod_cgroup, "1GB"), "0");
    // The container's own limit is the runtime's to apply: containerd's default
    // (`disable_hugetlb_controller`) leaves it to the pod cgroup, which bounds the container.
    // Admitted after the huge pod: 6Mi asked, 4Mi of 8Mi left.
    write_pod("greedy", &huge("6Mi"));
    let greedy =
        pod_status(port, &format!("greedy-{node}"), "the greedy pod refused", |s| s["phase"] == "Failed").await;
    assert_eq!(greedy["reason"], "OutOfhugepages-2Mi", "{greedy}");
    let message = greedy["message"].as_str().unwrap_or_default();
    let expected =
        "Node didn't have enough resource: hugepages-2Mi, requested: 6291456, used: 4194304, capacity: 8388608";
    assert!(message.contains(expected), "{message}");
    agent
}

/// Ephemeral storage as upstream's admission counts it: a pod asking for a little of the root
/// directory's filesystem runs, and one asking for more than is left of it is refused with
/// `OutOfephemeral-storage`, counting what the running pod asked for.
#[tokio::test(flavor = "multi_thread")]
async fn real_ephemeral_storage_requests_are_admitted_against_the_root_dir_filesystem() {
    let test = "real_ephemeral_storage_requests_are_admitted_against_the_root_dir_filesystem";
    let Some(rt) = RealRuntime::from_env(test) else { return };
    let (dir, node) = scratch(&rt, "agent-ephemeral", "ephemeral");
    let write_pod = {
        let (dir, image) = (dir.clone(), rt.busybox_image.clone());
        move |name: &str, amount: &str| {
            let sleep = "trap 'exit 0' TERM; while true; do sleep 1; done";
            let resources = format!("{{requests: {{ephemeral-storage: {amount}}}}}");
            let manifest = resources_manifest(name, &image, sleep, &resources);
            std::fs::write(dir.join(format!("manifests/{name}.yaml")), manifest).unwrap();
        }
    };
    write_pod("modest", "1Mi");
    let port = free_port();
    let agent = Agent::start_with(&rt, &dir, &node, &["--read-only-port", &port.to_string()]);
    let runtime = test_runtime(&rt, &dir, &node);
    let outcome = {
        let runtime = test_runtime(&rt, &dir, &node);
        let node = node.clone();
        async move {
            wait_for(&runtime, &format!("modest-{node}"), "the modest pod to run", running).await;
            write_pod("greedy", "1Pi");
            let refused = |s: &serde_json::Value| s["phase"] == "Failed";
            let greedy = pod_status(port, &format!("greedy-{node}"), "the greedy pod refused", refused).await;
            assert_eq!(greedy["reason"], "OutOfephemeral-storage", "{greedy}");
            let message = greedy["message"].as_str().unwrap_or_default();
            let expected = "Node didn't have enough resource: ephemeral-storage, requested: 1125899906842624, used: 1048576, capacity: ";
            assert!(message.contains(expected), "{message}");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// A static pod whose one container `app` runs `script` with `resources` (YAML flow maps,
/// indented for the container), for the QoS tests.
fn resources_manifest(name: &str, image: &str, script: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  \
         containers:\n  - name: app\n    image: {image}\n    command: [\"sh\", \"-c\", \"{script}\"]\n    \
         resources: {resources}\n"
    )
}

/// A cgroup v1 file under `/sys/fs/cgroup`, trimmed.
fn cgroup_file(path: &str) -> String {
    let full = Path::new(cgroups::CGROUP_ROOT).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display())).trim().to_owned()
}

/// The sizing containerd gives the runtime of sandbox `id`, from the sandbox's resources in its
/// config: the annotations CPU period, CPU quota, CPU shares and memory of its OCI spec (the
/// runtime's verbose sandbox status).
async fn sandbox_sizing(endpoint: &str, id: &str) -> [String; 4] {
    let client = Client::connect(&Config::new(endpoint)).unwrap();
    let request = pb::PodSandboxStatusRequest { pod_sandbox_id: id.to_owned(), verbose: true };
    let status = client.runtime_service().pod_sandbox_status(request).await.unwrap().into_inner();
    let info: serde_json::Value = serde_json::from_str(&status.info["info"]).unwrap();
    let annotations = &info["runtimeSpec"]["annotations"];
    ["cpu-period", "cpu-quota", "cpu-shares", "memory"]
        .map(|key| annotations[format!("io.kubernetes.cri.sandbox-{key}")].as_str().unwrap_or("missing").to_owned())
}

/// The CPU time (ns) the processes of cgroup `path` (cpuacct, children included) have used.
fn cpu_usage(path: &str) -> u64 {
    cgroup_file(&format!("cpuacct/{path}/cpuacct.usage")).parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn real_pods_run_in_qos_cgroups_with_their_resources() {
    let Some(rt) = RealRuntime::from_env("real_pods_run_in_qos_cgroups_with_their_resources") else { return };
    if Path::new(cgroups::CGROUP_ROOT).join("cgroup.controllers").exists() {
        kubelet_core::testing::skip("real_pods_run_in_qos_cgroups_with_their_resources", "it reads cgroup v1 files");
        return;
    }
    const NAMES: [&str; 3] = ["burstable", "besteffort", "guaranteed"];
    let (dir, node) = scratch(&rt, "agent-qos", "qos");
    let cores = std::thread::available_parallelism().unwrap().get();
    // As many busy loops as cores in each pod: the node's CPU is contended.
    let busy = (0..cores).map(|_| "while true; do :; done &").collect::<String>() + " wait";
    // The Guaranteed pod asks for what the Burstable one leaves of the node.
    let guaranteed_milli = cores * 1000 - 100;
    let guaranteed = format!("{{limits: {{cpu: {guaranteed_milli}m, memory: 64Mi}}}}");
    let write_manifest = {
        let (dir, image) = (dir.clone(), rt.busybox_image.clone());
        move |name: &str, script: &str, resources: &str| {
            let manifest = resources_manifest(name, &image, script, resources);
            std::fs::write(dir.join(format!("manifests/{name}.yaml")), manifest).unwrap();
        }
    };
    // The Guaranteed pod comes once the others run: its loops would starve the BestEffort pod's
    // start (2 shares against the node's).
    write_manifest("burstable", "sleep 3600", "{requests: {cpu: 100m}}");
    write_manifest("besteffort", &busy, "{}");
    let agent = Agent::start(&rt, &dir, &node);
    let runtime = test_runtime(&rt, &dir, &node);

    let outcome = {
        let runtime = test_runtime(&rt, &dir, &node);
        let (dir, node, rt_endpoint) = (dir.clone(), node.clone(), rt.endpoint.clone());
        async move {
            let mut uids = std::collections::HashMap::new();
            let mut sandboxes = std::collections::HashMap::new();
            for name in NAMES {
                if name == "guaranteed" {
                    write_manifest("guaranteed", &busy, &guaranteed);
                }
                let status = wait_for(&runtime, &format!("{name}-{node}"), name, running).await;
                uids.insert(name, status.uid.to_string());
                sandboxes.insert(name, status.sandbox_statuses[0].id.clone());
            }
            // The sandbox is given the pod's resources (upstream `calculateSandboxResources`),
            // which containerd hands its runtime as annotations of the sandbox's spec.
            let sized = |name: &str| sandbox_sizing(&rt_endpoint, &sandboxes[name]);
            let guaranteed_quota = (guaranteed_milli * 100).to_string();
            let guaranteed_shares = (guaranteed_milli * 1024 / 1000).to_string();
            assert_eq!(sized("guaranteed").await, ["100000", &guaranteed_quota, &guaranteed_shares, "67108864"]);
            assert_eq!(sized("burstable").await, ["100000", "0", "102", "0"]);
            assert_eq!(sized("besteffort").await, ["100000", "0", "2", "0"]);
            let guaranteed = format!("kubepods/pod{}", uids["guaranteed"]);
            let burstable = format!("kubepods/burstable/pod{}", uids["burstable"]);
            let best_effort = format!("kubepods/besteffort/pod{}", uids["besteffort"]);
            // Upstream's values: shares from requests, a quota and memory limit from limits.
            let cores = u64::try_from(cores).unwrap();
            let guaranteed_milli = u64::try_from(guaranteed_milli).unwrap();
            let shares = guaranteed_milli * 1024 / 1000;
            assert_eq!(cgroup_file(&format!("cpu/{guaranteed}/cpu.shares")), shares.to_string());
            assert_eq!(
                cgroup_file(&format!("cpu/{guaranteed}/cpu.cfs_quota_us")),
                (guaranteed_milli * 100).to_string()
            );
            assert_eq!(cgroup_file(&format!("memory/{guaranteed}/memory.limit_in_bytes")), "67108864");
            assert_eq!(cgroup_file(&format!("cpu/{burstable}/cpu.shares")), "102");
            assert_eq!(
                cgroup_file(&format!("cpu/{burstable}/cpu.cfs_quota_us")),
                "-1",
                "not every container limits CPU"
            );
            assert_eq!(cgroup_file(&format!("cpu/{best_effort}/cpu.shares")), "2");
            // The classes: Burstable's shares are its pods' requests, BestEffort's the fewest.
            assert_eq!(cgroup_file("cpu/kubepods/burstable/cpu.shares"), "102");
            assert_eq!(cgroup_file("cpu/kubepods/besteffort/cpu.shares"), "2");
            assert_eq!(cgroup_file("cpu/kubepods/cpu.shares"), (cores * 1024).to_string(), "the node's allocatable");
            // Under contention, the Guaranteed pod gets the CPU and the BestEffort one what is left.
            let before = (cpu_usage(&guaranteed), cpu_usage(&best_effort));
            tokio::time::sleep(Duration::from_secs(3)).await;
            let used = (cpu_usage(&guaranteed) - before.0, cpu_usage(&best_effort) - before.1);
            assert!(used.0 > 5 * used.1, "Guaranteed used {} ns, BestEffort {} ns over 3 s", used.0, used.1);

            // The pod cgroups go with the pods, and the Burstable class's shares with its pod.
            for name in NAMES {
                std::fs::remove_file(dir.join(format!("manifests/{name}.yaml"))).unwrap();
            }
            for uid in uids.values() {
                wait_until_gone(&runtime, &dir, &kubelet_core::PodUid::new(uid.as_str())).await;
            }
            assert_eq!(cgroup_file("cpu/kubepods/burstable/cpu.shares"), "2");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// What a crash between making a pod's cgroup and starting its sandbox leaves: the cgroup of
/// a pod nobody knows, here with a process in it. The agent's first housekeeping kills the
/// process and removes the cgroup (upstream's `cleanupOrphanedPodCgroups`), and leaves its own
/// pod's cgroup alone.
#[tokio::test(flavor = "multi_thread")]
async fn real_a_pod_cgroup_left_by_a_crash_is_removed_at_start() {
    let Some(rt) = RealRuntime::from_env("real_a_pod_cgroup_left_by_a_crash_is_removed_at_start") else { return };
    if Path::new(cgroups::CGROUP_ROOT).join("cgroup.controllers").exists() {
        let test = "real_a_pod_cgroup_left_by_a_crash_is_removed_at_start";
        kubelet_core::testing::skip(test, "it makes cgroup v1 directories");
        return;
    }
    let (dir, node) = scratch(&rt, "agent-orphan-cgroup", "orphan-cgroup");
    let orphan_uid = format!("orphan-{}", std::process::id());
    let orphan = format!("kubepods/besteffort/pod{orphan_uid}");
    // Whatever the outcome, nothing of the made-up pod stays.
    let _removed_at_the_end = RemovedCgroup(format!("/{orphan}"));
    for controller in ["cpu", "memory", "pids"] {
        std::fs::create_dir_all(Path::new(cgroups::CGROUP_ROOT).join(controller).join(&orphan)).unwrap();
    }
    let mut left_process =
        Command::new("sleep").arg("600").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let procs = Path::new(cgroups::CGROUP_ROOT).join("cpu").join(&orphan).join("cgroup.procs");
    std::fs::write(procs, left_process.id().to_string()).unwrap();
    std::fs::write(dir.join("manifests/kept.yaml"), manifest("kept", &rt.busybox_image, "sleep 3600")).unwrap();
    let agent = Agent::start(&rt, &dir, &node);
    let runtime = test_runtime(&rt, &dir, &node);

    let outcome = {
        let runtime = test_runtime(&rt, &dir, &node);
        let node = node.clone();
        let orphan_uid = orphan_uid.clone();
        async move {
            let kept = wait_for(&runtime, &format!("kept-{node}"), "the agent's pod", running).await;
            let root = Path::new(cgroups::CGROUP_ROOT);
            let mut left = Vec::new();
            for _ in 0..200 {
                left = cgroups::pod_cgroup_dirs(root, &orphan_uid);
                if left.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(left.is_empty(), "the orphaned pod's cgroup stays: {left:?}");
            let status = left_process.try_wait().unwrap();
            assert!(status.is_some(), "the process in the orphaned cgroup was killed");
            let kept_cgroup = format!("cpu/kubepods/besteffort/pod{}/cpu.shares", kept.uid);
            assert_eq!(cgroup_file(&kept_cgroup), "2", "the agent's own pod keeps its cgroup");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// A runtime killed while it wrote a sandbox's CNI result leaves that file empty, and then
/// fails every StopPodSandbox of the sandbox ("failed to get network ... cached result"), so
/// the pod could never go: the agent removes the unreadable result and stops the sandbox.
#[tokio::test(flavor = "multi_thread")]
async fn real_a_pod_whose_cached_cni_result_is_empty_still_goes() {
    let Some(rt) = RealRuntime::from_env("real_a_pod_whose_cached_cni_result_is_empty_still_goes") else { return };
    let (dir, node) = scratch(&rt, "agent-cni-cache", "cni-cache");
    std::fs::write(dir.join("manifests/web.yaml"), manifest("web", &rt.busybox_image, "sleep 3600")).unwrap();
    let agent = Agent::start(&rt, &dir, &node);
    let runtime = test_runtime(&rt, &dir, &node);
    let outcome = {
        let runtime = test_runtime(&rt, &dir, &node);
        let (dir, node) = (dir.clone(), node.clone());
        async move {
            let status = wait_for(&runtime, &format!("web-{node}"), "the pod to run", running).await;
            let pods = runtime.get_pods(true).await.unwrap();
            let pod = pods.iter().find(|p| p.uid == status.uid).unwrap();
            let sandbox = &pod.sandboxes[0].id;
            let results = Path::new(cri_client::manager::DEFAULT_CNI_CACHE_DIR).join("results");
            let cached: Vec<_> = std::fs::read_dir(&results)
                .unwrap()
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().contains(&format!("-{sandbox}-")))
                .collect();
            assert!(!cached.is_empty(), "the runtime caches the sandbox's CNI results in {}", results.display());
            for file in &cached {
                std::fs::write(file, "").unwrap();
            }
            std::fs::remove_file(dir.join("manifests/web.yaml")).unwrap();
            wait_until_gone(&runtime, &dir, &status.uid).await;
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// A pod cgroup (`/kubepods/...`) removed, with any process in it, when dropped.
struct RemovedCgroup(String);

impl Drop for RemovedCgroup {
    fn drop(&mut self) {
        let _ = cgroups::remove_pod_cgroup(Path::new(cgroups::CGROUP_ROOT), &self.0);
    }
}

/// A unix socket that forwards to the runtime's, so a test can make "the runtime socket" vanish
/// and come back without touching the runtime other tests use.
struct SocketProxy {
    path: std::path::PathBuf,
    tasks: tokio::task::JoinSet<()>,
}

impl SocketProxy {
    fn start(path: &Path, upstream: &Path) -> SocketProxy {
        let listener = tokio::net::UnixListener::bind(path).unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        let upstream = upstream.to_owned();
        tasks.spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                connections.spawn(async move {
                    if let Ok(mut server) = tokio::net::UnixStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        SocketProxy { path: path.to_owned(), tasks }
    }

    /// Closes every connection and removes the socket file.
    fn vanish(mut self) {
        self.tasks.abort_all();
        let _ = std::fs::remove_file(&self.path);
    }
}

#[tokio::test]
async fn real_healthz_fails_while_the_runtime_socket_is_gone() {
    let Some(rt) = RealRuntime::from_env("real_healthz_fails_while_the_runtime_socket_is_gone") else { return };
    let (dir, node) = scratch(&rt, "agent-healthz", "healthz");
    let upstream = rt.endpoint.trim_start_matches("unix://").to_owned();
    let proxy_path = dir.join("cri.sock");
    let proxy = SocketProxy::start(&proxy_path, Path::new(&upstream));
    let port = free_port();
    let endpoint = format!("unix://{}", proxy_path.display());
    let mut agent =
        Agent::spawn(common::agent_command(&endpoint, &dir, &node).args(["--read-only-port", &port.to_string()]));

    let outcome = async move {
        let healthz = |want: u16, within: Duration| async move {
            let deadline = tokio::time::Instant::now() + within;
            while tokio::time::Instant::now() < deadline {
                let (code, body) = get(port, "/healthz").await;
                if code == want {
                    return body;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("/healthz did not answer {want} within {within:?}");
        };
        assert_eq!(healthz(200, Duration::from_secs(30)).await, "ok");
        // The socket goes away (with every connection through it): 500, naming the runtime,
        // within the 5 s the README promises (the runtime status poll's period), plus 1 s of
        // slack for the machine.
        proxy.vanish();
        let body = healthz(500, Duration::from_secs(6)).await;
        assert!(body.contains("[-]runtime failed") && body.contains("healthz check failed"), "{body}");
        // It comes back: 200 again, without restarting the agent.
        let _proxy = SocketProxy::start(&proxy_path, Path::new(&upstream));
        assert_eq!(healthz(200, Duration::from_secs(30)).await, "ok");
        agent.signal(Signal::SIGTERM);
        assert!(agent.exited_within(Duration::from_secs(5)).await, "exits within 5 s of SIGTERM");
        agent
    };
    run_then_clean_up(outcome, &test_runtime(&rt, &dir, &node), &dir, &node).await;
}

/// The pod of the volumes test: every node-local volume type, with a fixed UID so an edit of its
/// labels updates it in place.
fn volumes_pod_yaml(uid: &str, app: &str, image: &str, host: &Path) -> String {
    [
        "apiVersion: v1",
        "kind: Pod",
        "metadata:",
        "  name: vols",
        &format!("  uid: {uid}"),
        &format!("  labels: {{app: {app}}}"),
        "spec:",
        "  terminationGracePeriodSeconds: 2",
        "  hostname: db-0",
        "  subdomain: db",
        "  hostAliases: [{ip: 10.1.2.3, hostnames: [foo.local, bar.local]}]",
        "  volumes:",
        "  - {name: cache, emptyDir: {}}",
        "  - {name: shm, emptyDir: {medium: Memory, sizeLimit: 16Mi}}",
        &format!("  - {{name: host, hostPath: {{path: {}, type: DirectoryOrCreate}}}}", host.display()),
        "  - name: info",
        "    downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}",
        "  - name: proj",
        "    projected: {sources: [{downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}}]}",
        "  initContainers:",
        "  - name: setup",
        &format!("    image: {image}"),
        "    command: [sh, -c, 'echo hello > /cache/greeting']",
        "    volumeMounts: [{name: cache, mountPath: /cache}]",
        "  containers:",
        "  - name: app",
        &format!("    image: {image}"),
        "    command: [sh, -c, 'exec sleep 3600']",
        "    env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]",
        "    volumeMounts:",
        "    - {name: cache, mountPath: /cache}",
        "    - {name: shm, mountPath: /shm}",
        "    - {name: host, mountPath: /host}",
        "    - {name: info, mountPath: /info, readOnly: true}",
        "    - {name: proj, mountPath: /proj}",
        "    - {name: cache, mountPath: /sub, subPath: nested}",
        "    - {name: cache, mountPath: /own, subPathExpr: 'by-name/$(POD_NAME)'}",
        "",
    ]
    .join("\n")
}

/// The agent's log in `dir` once it holds `needle`, or as it is after `within`.
async fn log_once_it_has(dir: &Path, needle: &str, within: Duration) -> String {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
        if log.contains(needle) || tokio::time::Instant::now() >= deadline {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `command` in the running container `app` of the pod named `name`; its stdout.
async fn exec_in_app(runtime: &CriRuntime, name: &str, command: &[&str]) -> String {
    let status = wait_for(runtime, name, "app to run", running).await;
    let id = status.container_status("app").unwrap().id.clone();
    let command: Vec<String> = command.iter().map(|s| (*s).to_owned()).collect();
    let result = runtime.exec_sync(&id, &command, Duration::from_secs(10)).await.unwrap();
    assert_eq!(result.exit_code, 0, "{command:?}: {}", String::from_utf8_lossy(&result.stderr));
    String::from_utf8_lossy(&result.stdout).into_owned()
}

/// A pod with `fsGroup` (and `runAsUser`, `runAsGroup`, `supplementalGroups`): its container
/// runs in the groups upstream gives it (its group, then fsGroup, then the supplemental ones),
/// its emptyDir volumes, on disk and in memory, are the fsGroup's and setgid, so what the
/// container makes there is the group's too, and a downwardAPI file of mode 0400 gains the
/// group's read (0440, the fsGroup's), so the pod's non-root user reads it. The memory emptyDir,
/// without a sizeLimit, is as large as the pod's memory limit.
#[tokio::test]
async fn real_an_fs_group_owns_the_pods_volumes_and_joins_its_containers() {
    let test = "real_an_fs_group_owns_the_pods_volumes_and_joins_its_containers";
    let Some(rt) = RealRuntime::from_env(test) else { return };
    let (dir, node) = scratch(&rt, "agent-fs-group", "fs-group");
    let port = free_port();
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: owned, labels: {{app: owned}}}}\nspec:\n\
         \x20 securityContext: {{runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000, supplementalGroups: [4000]}}\n\
         \x20 terminationGracePeriodSeconds: 1\n\
         \x20 volumes:\n\
         \x20 - {{name: scratch, emptyDir: {{}}}}\n\
         \x20 - {{name: shm, emptyDir: {{medium: Memory}}}}\n\
         \x20 - name: info\n\
         \x20   downwardAPI: {{defaultMode: 0400, items: [{{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}]}}\n\
         \x20 containers:\n\
         \x20 - name: app\n\
         \x20   image: {}\n\
         \x20   command: [sh, -c, 'touch /scratch/made /shm/made && exec sleep 3600']\n\
         \x20   resources: {{limits: {{memory: 64Mi}}}}\n\
         \x20   volumeMounts: [{{name: scratch, mountPath: /scratch}}, {{name: shm, mountPath: /shm}}, {{name: info, mountPath: /info}}]\n",
        rt.busybox_image
    );
    std::fs::write(dir.join("manifests/owned.yaml"), manifest).unwrap();
    let agent = Agent::start_with(&rt, &dir, &node, &["--read-only-port", &port.to_string()]);
    let runtime = test_runtime(&rt, &dir, &node);
    let outcome = {
        let node = node.clone();
        let rt_for_body = test_runtime(&rt, &dir, &node);
        async move {
            let name = format!("owned-{node}");
            pod_status(port, &name, "the pod to run", |s| s["phase"] == "Running").await;
            let exec = |command: &'static [&'static str]| exec_in_app(&rt_for_body, &name, command);
            assert_eq!(exec(&["id", "-u"]).await, "1000\n");
            assert_eq!(exec(&["id", "-G"]).await, "3000 2000 4000\n", "its group, the fsGroup, the supplemental one");
            let volumes = exec(&["stat", "-c", "%g %a", "/scratch", "/shm"]).await;
            assert_eq!(volumes, "2000 2777\n2000 3777\n", "the fsGroup's, setgid, writable by all (a tmpfs sticky)");
            let made = exec(&["stat", "-c", "%u %g", "/scratch/made", "/shm/made"]).await;
            assert_eq!(made, "1000 2000\n1000 2000\n", "what the container made is the group's");
            assert_eq!(exec(&["cat", "/info/labels"]).await, "app=\"owned\"", "its user reads a 0400 file");
            assert_eq!(exec(&["stat", "-L", "-c", "%u %g %a", "/info/labels"]).await, "0 2000 440\n");
            // A memory emptyDir without sizeLimit is the pod's memory limit, as upstream sizes it.
            let df = exec(&["df", "-k", "/shm"]).await;
            assert!(df.contains("tmpfs") && df.contains(" 65536 "), "a 64 MiB tmpfs: {df}");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// Image pulls are held to `registryPullQPS` and `registryBurst` as upstream's throttled image
/// service holds them: a pull that finds no token fails at once with `pull QPS exceeded`
/// (`ErrImagePull`), and is tried again after the pull backoff, when the bucket has refilled.
#[tokio::test]
async fn real_image_pulls_beyond_registry_pull_qps_fail_and_are_retried() {
    let Some(rt) = RealRuntime::from_env("real_image_pulls_beyond_registry_pull_qps_fail_and_are_retried") else {
        return;
    };
    let (dir, node) = scratch(&rt, "agent-pull-qps", "pullqps");
    let port = free_port();
    // One pull, then one more a second; both pods pull (`Always`) from the local registry at
    // once, so one of the two finds no token.
    let config = dir.join("kubelet.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nregistryPullQPS: 1\nregistryBurst: 1\n\
         serializeImagePulls: false\n",
    )
    .unwrap();
    for name in ["first", "second"] {
        let pod = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n\
             \x20 containers: [{{name: app, image: {}, imagePullPolicy: Always, command: [sleep, '3600']}}]\n",
            rt.busybox_image
        );
        std::fs::write(dir.join(format!("manifests/{name}.yaml")), pod).unwrap();
    }
    let config_arg = config.display().to_string();
    let agent = Agent::start_with(&rt, &dir, &node, &["--config", &config_arg, "--read-only-port", &port.to_string()]);
    let runtime = test_runtime(&rt, &dir, &node);
    let outcome = {
        let (node, dir) = (node.clone(), dir.clone());
        async move {
            for name in ["first", "second"] {
                let pod = format!("{name}-{node}");
                pod_status(port, &pod, "both pods to run in the end", |s| s["phase"] == "Running").await;
            }
            let root = dir.join("root").display().to_string();
            let described: String = ["first", "second"]
                .iter()
                .map(|name| kubelet_rs(&["describe", "pod", &format!("{name}-{node}"), "--root-dir", &root]).1)
                .collect();
            let refused = format!("Failed to pull image {:?}: pull QPS exceeded", rt.busybox_image);
            assert!(described.contains(&refused), "one of the two pulls found no token: {described}");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// SELinux options as upstream passes them: the pod's to its sandbox and, unless a container
/// has its own, to its containers, whose mounts of the pod's own volumes and hosts file the
/// runtime relabels; upstream admits such a pod on any host (the runtime applies the labels
/// where SELinux is on), and so does this agent: it runs here.
#[tokio::test]
async fn real_selinux_options_reach_the_runtime_and_the_pod_runs() {
    let Some(rt) = RealRuntime::from_env("real_selinux_options_reach_the_runtime_and_the_pod_runs") else {
        return;
    };
    let (dir, node) = scratch(&rt, "agent-selinux", "selinux");
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: labelled}}\nspec:\n\
         \x20 terminationGracePeriodSeconds: 1\n\
         \x20 securityContext: {{seLinuxOptions: {{level: 's0:c123,c456'}}}}\n\
         \x20 volumes: [{{name: scratch, emptyDir: {{}}}}, {{name: host, hostPath: {{path: /tmp}}}}]\n\
         \x20 containers:\n\
         \x20 - {{name: app, image: {}, command: [sleep, '3600'],\n\
         \x20    volumeMounts: [{{name: scratch, mountPath: /scratch}}, {{name: host, mountPath: /host}}]}}\n",
        rt.busybox_image
    );
    std::fs::write(dir.join("manifests/labelled.yaml"), pod).unwrap();
    let agent = Agent::start_with(&rt, &dir, &node, &[]);
    let runtime = test_runtime(&rt, &dir, &node);
    let outcome = {
        let (rt, node, dir) = (rt.clone(), node.clone(), dir.clone());
        async move {
            let runtime = test_runtime(&rt, &dir, &node);
            let status = wait_for(&runtime, &format!("labelled-{node}"), "app to run", running).await;
            let id = status.container_status("app").unwrap().id.clone();
            let client = Client::connect(&Config::new(&rt.endpoint)).unwrap();
            let request = pb::ContainerStatusRequest { container_id: id, verbose: true };
            let answer = client.runtime_service().container_status(request).await.unwrap().into_inner();
            let info: serde_json::Value = serde_json::from_str(&answer.info["info"]).unwrap();
            let config = &info["config"];
            assert_eq!(config["linux"]["security_context"]["selinux_options"]["level"], "s0:c123,c456", "{config}");
            let relabelled = |path: &str| {
                let mounts = config["mounts"].as_array().unwrap();
                let mount = mounts.iter().find(|m| m["container_path"] == path).unwrap();
                mount["selinux_relabel"].as_bool().unwrap_or(false)
            };
            assert!(relabelled("/scratch") && relabelled("/etc/hosts"), "the pod's own: {config}");
            assert!(!relabelled("/host"), "never the host's path: {config}");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// AppArmor as upstream's admit handler takes it: a pod whose container asks for a profile (the
/// deprecated annotation here, as v1.26 clusters write it) is refused with reason `AppArmor` on
/// a host that does not enforce AppArmor, and runs on one that does; an `unconfined` one runs
/// everywhere.
#[tokio::test]
async fn real_apparmor_profiles_run_only_where_the_host_enforces_them() {
    let Some(rt) = RealRuntime::from_env("real_apparmor_profiles_run_only_where_the_host_enforces_them") else {
        return;
    };
    let (dir, node) = scratch(&rt, "agent-apparmor", "apparmor");
    let port = free_port();
    for (name, profile) in [("confined", "runtime/default"), ("free", "unconfined")] {
        let pod = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  annotations:\n\
             \x20   container.apparmor.security.beta.kubernetes.io/app: {profile}\nspec:\n\
             \x20 terminationGracePeriodSeconds: 1\n\
             \x20 containers: [{{name: app, image: {}, command: [sleep, '3600']}}]\n",
            rt.busybox_image
        );
        std::fs::write(dir.join(format!("manifests/{name}.yaml")), pod).unwrap();
    }
    let agent = Agent::start_with(&rt, &dir, &node, &["--read-only-port", &port.to_string()]);
    let runtime = test_runtime(&rt, &dir, &node);
    let outcome = {
        let node = node.clone();
        async move {
            pod_status(port, &format!("free-{node}"), "the unconfined pod to run", |s| s["phase"] == "Running").await;
            let confined = format!("confined-{node}");
            match kubelet_core::apparmor::host_unavailable() {
                Some(why) => {
                    let status =
                        pod_status(port, &confined, "the confined pod's refusal", |s| s["phase"] == "Failed").await;
                    assert_eq!(status["reason"], "AppArmor", "{status}");
                    assert_eq!(
                        status["message"],
                        format!("Pod was rejected: Cannot enforce AppArmor: {why}"),
                        "{status}"
                    );
                }
                None => {
                    pod_status(port, &confined, "the confined pod to run", |s| s["phase"] == "Running").await;
                }
            }
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// `setHostnameAsFQDN`: a pod with a subdomain takes its FQDN as its hostname, as upstream
/// gives it; one whose FQDN does not fit the kernel's 64 characters gets no sandbox, with
/// upstream's event, and stays pending.
#[tokio::test]
async fn real_a_pod_may_take_its_fqdn_as_its_hostname() {
    let test = "real_a_pod_may_take_its_fqdn_as_its_hostname";
    let Some(rt) = RealRuntime::from_env(test) else { return };
    let (dir, node) = scratch(&rt, "agent-fqdn", "fqdn");
    let port = free_port();
    let pod = |name: &str, hostname: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  hostname: {hostname}\n  subdomain: web\n\
             \x20 setHostnameAsFQDN: true\n  terminationGracePeriodSeconds: 1\n\
             \x20 containers: [{{name: app, image: {}, command: [sleep, '3600']}}]\n",
            rt.busybox_image
        )
    };
    std::fs::write(dir.join("manifests/fqdn.yaml"), pod("fqdn", "web-0")).unwrap();
    let long = "a".repeat(40);
    std::fs::write(dir.join("manifests/long.yaml"), pod("long", &long)).unwrap();
    let agent = Agent::start_with(
        &rt,
        &dir,
        &node,
        &["--read-only-port", &port.to_string(), "--cluster-domain", "cluster.local"],
    );
    let runtime = test_runtime(&rt, &dir, &node);
    let outcome = {
        let (node, dir) = (node.clone(), dir.clone());
        let rt_for_body = test_runtime(&rt, &dir, &node);
        async move {
            let name = format!("fqdn-{node}");
            pod_status(port, &name, "the pod to run", |s| s["phase"] == "Running").await;
            let hostname = exec_in_app(&rt_for_body, &name, &["hostname"]).await;
            assert_eq!(hostname, "web-0.web.default.svc.cluster.local\n");
            let fqdn = format!("{long}.web.default.svc.cluster.local");
            let event = format!(
                "Failed to create pod sandbox: failed to construct FQDN from pod hostname and cluster domain, \
                 FQDN {fqdn} is too long (64 characters is the max, {} characters requested)",
                fqdn.len()
            );
            let root = dir.join("root").display().to_string();
            let long_pod = format!("long-{node}");
            let mut described = String::new();
            for _ in 0..100 {
                described = kubelet_rs(&["describe", "pod", &long_pod, "--root-dir", &root]).1;
                if described.contains(&event) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(described.contains("FailedCreatePodSandBox") && described.contains(&event), "{described}");
            let status = pod_status(port, &long_pod, "the long pod's status", |s| s["phase"].is_string()).await;
            assert_eq!(status["phase"], "Pending", "{status}");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

#[tokio::test]
async fn real_volumes_for_node_local_pods() {
    let Some(rt) = RealRuntime::from_env("real_volumes_for_node_local_pods") else { return };
    let (dir, node) = scratch(&rt, "agent-volumes", "volumes");
    let port = free_port();
    let uid = format!("vols-{node}");
    let host = dir.join("host/made");
    let manifest = dir.join("manifests/vols.yaml");
    std::fs::write(&manifest, volumes_pod_yaml(&uid, "one", &rt.busybox_image, &host)).unwrap();
    let secret = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: secret}}\nspec:\n  volumes: [{{name: creds, secret: {{secretName: db}}}}]\n  containers: [{{name: app, image: {}, volumeMounts: [{{name: creds, mountPath: /creds}}]}}]\n",
        rt.busybox_image
    );
    std::fs::write(dir.join("manifests/secret.yaml"), secret).unwrap();
    let agent = Agent::start_with(
        &rt,
        &dir,
        &node,
        &["--read-only-port", &port.to_string(), "--cluster-domain", "cluster.local"],
    );
    let runtime = test_runtime(&rt, &dir, &node);

    let outcome = {
        let (node, dir, image) = (node.clone(), dir.clone(), rt.busybox_image.clone());
        let rt_for_body = test_runtime(&rt, &dir, &node);
        async move {
            let name = format!("vols-{node}");
            pod_status(port, &name, "vols to run", |s| s["phase"] == "Running").await;
            let refused = format!(
                "{}: pod \"secret-{node}\" has forbidden references to API objects: Secret \"db\", Secret volume \"creds\"",
                dir.join("manifests/secret.yaml").display()
            );
            // The log quotes the message, as klog does. A manifest that cannot be taken is
            // reported once it has settled, a second after it was written, and the other pod may
            // run before that.
            let quoted = format!("{refused:?}");
            let log = log_once_it_has(&dir, &quoted, Duration::from_secs(10)).await;
            assert!(log.contains(&quoted), "the static pod with a secret is refused in upstream's words: {log}");
            let (_, pods) = get(port, "/pods").await;
            assert!(!pods.contains(&format!("\"secret-{node}\"")), "the refused static pod is not a pod of the agent");
            let exec = |command: &'static [&'static str]| exec_in_app(&rt_for_body, &name, command);
            assert_eq!(exec(&["cat", "/cache/greeting"]).await, "hello\n", "the init container's file");
            let df = exec(&["df", "-k", "/shm"]).await;
            assert!(df.contains("tmpfs") && df.contains("16384"), "a 16 MiB tmpfs: {df}");
            assert!(host.is_dir(), "DirectoryOrCreate made the host directory");
            exec(&["touch", "/host/from-the-pod"]).await;
            assert!(host.join("from-the-pod").exists(), "the hostPath is the host's directory");
            assert_eq!(exec(&["cat", "/info/labels"]).await, "app=\"one\"");
            assert_eq!(exec(&["cat", "/proj/name"]).await, name);
            // The managed /etc/hosts: the pod's IP with its hostname and FQDN, and its aliases.
            let hosts = exec(&["cat", "/etc/hosts"]).await;
            let ip = wait_for(&rt_for_body, &name, "app", running).await.ips[0].clone();
            let fqdn = format!("{ip}\tdb-0.db.default.svc.cluster.local\tdb-0\n");
            assert!(hosts.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"), "{hosts}");
            assert!(hosts.contains(&fqdn), "{hosts:?} has no {fqdn:?}");
            assert!(hosts.ends_with("# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"), "{hosts}");
            assert_eq!(exec(&["hostname"]).await, "db-0\n");
            exec(&["touch", "/sub/x"]).await;
            assert_eq!(exec(&["ls", "/cache/nested"]).await, "x\n", "the subPath is inside the volume");
            exec(&["touch", "/own/y"]).await;
            assert_eq!(exec(&["ls", "/cache/by-name"]).await, format!("{name}\n"), "subPathExpr: the pod's name");
            let own = format!("/cache/by-name/{name}");
            assert_eq!(exec_in_app(&rt_for_body, &name, &["ls", &own]).await, "y\n");
            let pod_dir = dir.join("root/pods").join(&uid);
            let mounted = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            assert!(mounted.contains(&pod_dir.join("volumes/kubernetes.io~empty-dir/shm").display().to_string()));

            // A restarted container finds the emptyDir as it was.
            let id = wait_for(&rt_for_body, &name, "app", running).await.container_status("app").unwrap().id.clone();
            let stop = pb::StopContainerRequest { container_id: id, timeout: 0 };
            rt_for_body.client().runtime_service().stop_container(stop).await.unwrap();
            pod_status(port, &name, "app's restart", |s| {
                s["containerStatuses"][0]["restartCount"].as_i64() >= Some(1)
                    && s["containerStatuses"][0]["state"]["running"].is_object()
            })
            .await;
            assert_eq!(exec(&["cat", "/cache/greeting"]).await, "hello\n", "the emptyDir outlives a restart");

            // New labels, same UID: the downwardAPI file follows.
            std::fs::write(dir.join("manifests/vols.yaml"), volumes_pod_yaml(&uid, "two", &image, &host)).unwrap();
            let mut labels = String::new();
            for _ in 0..200 {
                labels = exec(&["cat", "/info/labels"]).await;
                if labels == "app=\"two\"" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(labels, "app=\"two\"", "the labels file is refreshed");

            // Removed: the volumes go, the tmpfs first; the host's directory stays.
            std::fs::remove_file(dir.join("manifests/vols.yaml")).unwrap();
            wait_until_gone(&rt_for_body, &dir, &kubelet_core::PodUid::new(&uid)).await;
            let mounted = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            assert!(!mounted.contains(&pod_dir.display().to_string()), "nothing of the pod is mounted");
            assert!(!pod_dir.exists(), "the pod's directory is gone");
            assert!(host.join("from-the-pod").exists(), "the host's directory stays");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// A container sees the host's `/proc` and `/sys` as upstream's kubelet has the runtime show
/// them: the kernel's settings read-only (`/proc/sys`, where `kernel.core_pattern` names a
/// program the host runs as root for every crash) and the host's timers, keys and firmware
/// covered; containerd hides nothing the kubelet does not name. The sandbox runs under the
/// runtime's default seccomp profile, as upstream's sandboxes do.
#[tokio::test]
async fn real_pods_are_confined_as_upstream_confines_them() {
    let Some(rt) = RealRuntime::from_env("real_pods_are_confined_as_upstream_confines_them") else { return };
    let (dir, node) = scratch(&rt, "agent-proc", "proc");
    std::fs::write(dir.join("manifests/proc.yaml"), manifest("proc", &rt.busybox_image, "exec sleep 3600")).unwrap();
    let agent = Agent::start(&rt, &dir, &node);
    let runtime = test_runtime(&rt, &dir, &node);

    let outcome = {
        let rt_for_body = test_runtime(&rt, &dir, &node);
        let name = format!("proc-{node}");
        async move {
            let mountinfo = exec_in_app(&rt_for_body, &name, &["cat", "/proc/self/mountinfo"]).await;
            // The options of the last mount at `point` (the one the container sees).
            let options = |point: &str| {
                let mut fields = mountinfo.lines().map(|line| line.split(' ').collect::<Vec<_>>());
                fields.rfind(|f| f.get(4) == Some(&point)).and_then(|f| f.get(5).map(|o| (*o).to_owned()))
            };
            let on_host = |path: &&&str| Path::new(path).exists();
            for path in container::READONLY_PATHS.iter().filter(on_host) {
                let options = options(path).unwrap_or_default();
                assert!(options.starts_with("ro"), "{path} is mounted read-only, not {options:?}: {mountinfo}");
            }
            for path in container::MASKED_PATHS.iter().filter(on_host) {
                assert!(options(path).is_some(), "{path} is covered: {mountinfo}");
            }
            if Path::new("/proc/timer_list").exists() {
                let timers = exec_in_app(&rt_for_body, &name, &["cat", "/proc/timer_list"]).await;
                assert_eq!(timers, "", "the host's timers are hidden");
            }
            // The sandbox runs under the runtime's default seccomp profile, as upstream's does,
            // and the container unconfined, as upstream's without `seccompDefault`.
            let status = wait_for(&rt_for_body, &name, "app to run", running).await;
            let sandbox = &status.sandbox_statuses[0].id;
            let v2 = Path::new(cgroups::CGROUP_ROOT).join("cgroup.controllers").exists();
            let pod_cgroup = format!("{}kubepods/besteffort/pod{}", if v2 { "" } else { "pids/" }, status.uid);
            assert_eq!(seccomp_mode(&format!("{pod_cgroup}/{sandbox}")), "2", "filtered");
            let app = &status.container_status("app").unwrap().id;
            assert_eq!(seccomp_mode(&format!("{pod_cgroup}/{app}")), "0", "unconfined");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// The seccomp mode (`Seccomp:` in `/proc/<pid>/status`: 0 none, 2 a filter) of the first
/// process in the cgroup at `path` under the cgroup root.
fn seccomp_mode(path: &str) -> String {
    let procs = cgroup_file(&format!("{path}/cgroup.procs"));
    let pid = procs.lines().next().unwrap_or_else(|| panic!("no process in {path}"));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mode = status.lines().find_map(|line| line.strip_prefix("Seccomp:"));
    mode.unwrap_or_else(|| panic!("no Seccomp line for {pid}")).trim().to_owned()
}

/// Image filesystem pressure, with `imagefs.available` halfway between what the runtime's own
/// 4 GiB tmpfs has free before and after pulling an unused image: the eviction manager reclaims
/// the node's own first, removing the image no container uses once it is older than
/// `imageMinimumGCAge` while keeping the running pod's and the sandbox image, which ends the
/// pressure with no pod evicted; a static pod then filling its own writable layer brings the
/// pressure back, with nothing left to reclaim, and the manager, finding only static pods
/// (critical), evicts nothing.
#[tokio::test]
async fn real_image_fs_pressure_removes_unused_images_and_spares_critical_pods() {
    let test = "real_image_fs_pressure_removes_unused_images_and_spares_critical_pods";
    let Some(rt) = RealRuntime::from_env(test) else { return };
    let (dir, node) = scratch(&rt, "agent-imagefs", "imagefs");
    let runtime = test_runtime(&rt, &dir, &node);
    let image_fs_available = async || runtime.image_fs_stats().await.unwrap().unwrap().available_bytes;
    let unused = rt.unused_image();
    // Left by an earlier run that failed, it would take no room when pulled.
    if let Some(id) = runtime.image_ref(&unused).await.unwrap() {
        runtime.remove_image(&id).await.unwrap();
    }
    let before = image_fs_available().await;
    runtime.pull_image(&unused).await.unwrap();
    let after = image_fs_available().await;
    assert!(before > after, "the unused image takes room: {before} → {after} bytes free");
    let gap = before - after;
    let threshold_kib = (after + gap / 2) / 1024;
    let config = dir.join("kubelet.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             evictionHard: {{imagefs.available: {threshold_kib}Ki}}\nimageMinimumGCAge: 1s\n"
        ),
    )
    .unwrap();
    let script = "trap 'exit 0' TERM; while true; do sleep 1; done";
    std::fs::write(dir.join("manifests/steady.yaml"), manifest("steady", &rt.busybox_image, script)).unwrap();
    let mut command = agent_command(&rt, &dir, &node);
    command.args(["--healthz-port", "0"]).arg("--config").arg(&config);
    let agent = Agent::spawn(&mut command);

    let outcome = {
        let (dir, node) = (dir.clone(), node.clone());
        let (busybox, pause) = (rt.busybox_image.clone(), rt.pause_image.clone());
        let runtime = test_runtime(&rt, &dir, &node);
        async move {
            let log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
            let pod = format!("steady-{node}");
            let before = wait_for(&runtime, &pod, "the static pod to run", running).await;
            let present = async |reference: &str| runtime.image_ref(reference).await.unwrap().is_some();
            let mut removed = false;
            for _ in 0..300 {
                if !present(&unused).await {
                    removed = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(removed, "the unused image was removed under image filesystem pressure:\n{}", log());
            assert!(present(&busybox).await, "the running pod's image stays");
            assert!(present(&pause).await, "the sandbox image stays");
            assert!(log().contains("Attempting to reclaim ephemeral-storage"), "upstream's event:\n{}", log());
            // The round that removed it found the pressure gone, and evicted nothing. (Rounds
            // before it, while the image was younger than imageMinimumGCAge, found only
            // critical pods.)
            let reclaimed = "able to reduce resource pressure without evicting pods";
            let mut relieved = false;
            for _ in 0..150 {
                if log().contains(reclaimed) {
                    relieved = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(relieved, "the reclaimed room ended the pressure:\n{}", log());
            let since_relief = log().find(reclaimed).unwrap_or_default();
            assert!(!log()[since_relief..].contains("cannot evict"), "no eviction after the relief:\n{}", log());

            // A second static pod fills its writable layer (on the image filesystem) by the
            // room the image took: the pressure is back, and only pods are left to evict.
            let seen = log().len();
            let fill = format!("dd if=/dev/zero of=/fill bs=1M count={}; {script}", gap.div_ceil(1024 * 1024));
            std::fs::write(dir.join("manifests/filler.yaml"), manifest("filler", &busybox, &fill)).unwrap();
            let mut refused = false;
            for _ in 0..600 {
                if log().get(seen..).is_some_and(|new| new.contains("cannot evict a critical pod")) {
                    refused = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(refused, "the static pods are critical:\n{}", log());
            let after = wait_for(&runtime, &pod, "the static pod", running).await;
            let id = |s: &kubelet_core::runtime::PodStatus| s.container_status("app").map(|c| c.id.clone());
            assert_eq!(id(&after), id(&before), "the same container runs on");
            agent
        }
    };
    run_then_clean_up(outcome, &runtime, &dir, &node).await;
}

/// kubeadm v1.26.1's control-plane manifests, as kubeadm wrote them (`fixtures/kubeadm-v1.26`).
const KUBEADM_COMPONENTS: [&str; 4] = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"];

/// The ports the stand-ins answer their probes on, as kubeadm's manifests name them.
const KUBEADM_PROBE_PORTS: [u16; 4] = [2381, 6443, 10257, 10259];

/// kubeadm's manifest for `component` with the stand-in image, the advertise address on
/// 127.0.0.1 (the probes' host), and every hostPath under `host_root`; the rest as kubeadm wrote it.
fn kubeadm_manifest(component: &str, image: &str, host_root: &Path) -> String {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/kubeadm-v1.26/{component}.yaml"));
    let original = std::fs::read_to_string(fixture).unwrap();
    let mut lines = Vec::new();
    let mut in_host_path = false;
    for line in original.lines() {
        let indent = &line[..line.len() - line.trim_start().len()];
        let line = match line.trim_start() {
            text if text.starts_with("image: ") => format!("{indent}image: {image}"),
            text if in_host_path && text.starts_with("path: ") => {
                format!("{indent}path: {}{}", host_root.display(), &text["path: ".len()..])
            }
            _ => line.replace("10.0.0.10", "127.0.0.1"),
        };
        in_host_path = line.trim_start() == "- hostPath:";
        lines.push(line);
    }
    let moved = lines.iter().filter(|l| l.contains(&*host_root.to_string_lossy())).count();
    assert_eq!(moved, original.matches("hostPath:").count(), "every hostPath of {component} moved");
    lines.join("\n") + "\n"
}

/// The lines the stand-in of `component` printed (`name: value`), from its log file.
fn stand_in_report(dir: &Path, component: &str, node: &str) -> Vec<String> {
    let prefix = format!("kube-system_{component}-{node}_");
    let pod_dir = std::fs::read_dir(dir.join("pods"))
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .unwrap_or_else(|| panic!("no log directory for {component}"));
    logged_messages(&pod_dir.path().join(component)).into_iter().map(|(_, message)| message).collect()
}

/// Whether `report` has the line `expected`.
fn reported(report: &[String], expected: &str) -> bool {
    report.iter().any(|line| line == expected)
}

#[tokio::test(flavor = "multi_thread")]
async fn real_kubeadm_control_plane_static_pods() {
    let Some(rt) = RealRuntime::from_env("real_kubeadm_control_plane_static_pods") else { return };
    let (dir, node) = scratch(&rt, "agent-kubeadm", "kubeadm");
    for port in KUBEADM_PROBE_PORTS {
        let free = std::net::TcpListener::bind(("0.0.0.0", port)).is_ok();
        assert!(free, "port {port} is taken on this host: kubeadm's host-network pods need it");
    }
    // The host as kubeadm's certs phase leaves it, as far as the stand-ins look: the API server's
    // serving certificate and the cluster CA, under the moved /etc/kubernetes/pki.
    let host_root = dir.join("host");
    let pki = host_root.join("etc/kubernetes/pki");
    std::fs::create_dir_all(&pki).unwrap();
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=kube-apiserver-stand-in", "-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-out")
        .arg(pki.join("apiserver.crt"))
        .arg("-keyout")
        .arg(pki.join("apiserver.key"))
        .output()
        .unwrap();
    assert!(made.status.success(), "openssl: {}", String::from_utf8_lossy(&made.stderr));
    std::fs::copy(pki.join("apiserver.crt"), pki.join("ca.crt")).unwrap();
    for component in KUBEADM_COMPONENTS {
        let manifest = kubeadm_manifest(component, &rt.control_plane_image(), &host_root);
        std::fs::write(dir.join(format!("manifests/{component}.yaml")), manifest).unwrap();
    }
    let port = free_port();
    let port_arg = port.to_string();
    let mut agent = Agent::start_with(&rt, &dir, &node, &["--read-only-port", &port_arg]);

    let outcome = {
        let runtime = test_runtime(&rt, &dir, &node);
        let (dir, node, host_root) = (dir.clone(), node.clone(), host_root.clone());
        async move {
            let mut uids = Vec::new();
            for component in KUBEADM_COMPONENTS {
                uids.push(check_kubeadm_pod(port, &dir, &node, component).await);
            }
            // The API server's stand-in serves the certificate the host gave it through its
            // read-only hostPath, on the host's network.
            let served = Command::new("sh")
                .arg("-c")
                .arg("openssl s_client -connect 127.0.0.1:6443 </dev/null 2>/dev/null | openssl x509 -noout -subject")
                .output()
                .unwrap();
            let subject = String::from_utf8_lossy(&served.stdout);
            assert!(subject.contains("CN = kube-apiserver-stand-in"), "served: {subject}");
            let apiserver = stand_in_report(&dir, "kube-apiserver", &node);
            for (line, what) in [
                ("file /etc/kubernetes/pki/apiserver.crt: present", "the host's certificate through k8s-certs"),
                ("file /etc/kubernetes/pki/sa.pub: missing", "only what the host has"),
                ("writable /etc/kubernetes/pki: no", "k8s-certs is read-only, as kubeadm asks"),
                ("writable /etc/ssl/certs: no", "ca-certs is read-only"),
            ] {
                assert!(reported(&apiserver, line), "{what}: {apiserver:#?}");
            }
            let controller_manager = stand_in_report(&dir, "kube-controller-manager", &node);
            let flexvolume = "writable /usr/libexec/kubernetes/kubelet-plugins/volume/exec: yes";
            assert!(reported(&controller_manager, flexvolume), "flexvolume-dir is writable: {controller_manager:#?}");
            // etcd's data directory is writable and on the host, created as DirectoryOrCreate asks;
            // the kubeconfigs are created as empty files (FileOrCreate).
            let etcd = stand_in_report(&dir, "etcd", &node);
            assert!(reported(&etcd, "writable /var/lib/etcd: yes"), "{etcd:#?}");
            let written = std::fs::read_to_string(host_root.join("var/lib/etcd/stand-in-etcd")).unwrap();
            assert_eq!(written, "written by the stand-in etcd\n");
            for kubeconfig in ["controller-manager.conf", "scheduler.conf"] {
                let created = std::fs::metadata(host_root.join("etc/kubernetes").join(kubeconfig)).unwrap();
                assert!(created.is_file() && created.len() == 0, "{kubeconfig} created empty by FileOrCreate");
            }

            // The manifests go: the pods go, and what they wrote on the host stays.
            for component in KUBEADM_COMPONENTS {
                std::fs::remove_file(dir.join(format!("manifests/{component}.yaml"))).unwrap();
            }
            for uid in &uids {
                wait_until_gone(&runtime, &dir, uid).await;
            }
            assert!(host_root.join("var/lib/etcd/stand-in-etcd").is_file(), "a hostPath's content is never removed");
            agent.signal(Signal::SIGTERM);
            assert!(agent.exited_within(Duration::from_secs(10)).await, "exits after SIGTERM");
            agent
        }
    };
    run_then_clean_up(outcome, &test_runtime(&rt, &dir, &node), &dir, &node).await;
}

/// Checks the pod of kubeadm's `component` runs as its manifest asks: Ready through its probes
/// (HTTPS but etcd's), on the host's network, with kubeadm's command, in the Burstable cgroup
/// with its CPU request's shares, node-critical's OOM score, RuntimeDefault seccomp, and kubeadm's
/// labels and annotations kept. Its UID.
async fn check_kubeadm_pod(port: u16, dir: &Path, node: &str, component: &str) -> kubelet_core::PodUid {
    let name = format!("{component}-{node}");
    let ready = |s: &serde_json::Value| condition(s, "Ready") == "True";
    // The startup probes wait 10 s before their first try, as kubeadm asks.
    let status =
        pod_status_within(port, &name, &format!("{component} to be Ready"), Duration::from_secs(60), ready).await;
    let container = &status["containerStatuses"][0];
    assert_eq!((container["started"].as_bool(), container["ready"].as_bool()), (Some(true), Some(true)), "{status}");
    assert_eq!(container["restartCount"], 0, "{status}");
    assert_eq!(status["qosClass"], "Burstable", "{status}");
    assert_eq!(status["podIP"], status["hostIP"], "hostNetwork: {status}");

    let pod = pod_object(port, &name).await;
    assert_eq!(pod["metadata"]["namespace"], "kube-system");
    assert_eq!(pod["metadata"]["labels"]["component"], component);
    assert_eq!(pod["metadata"]["labels"]["tier"], "control-plane");
    assert_eq!(pod["metadata"]["annotations"]["kubernetes.io/config.source"], "file");
    if component == "kube-apiserver" {
        let endpoint =
            &pod["metadata"]["annotations"]["kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint"];
        assert_eq!(endpoint, "127.0.0.1:6443", "kubeadm's annotation is kept");
    }

    let report = stand_in_report(dir, component, node);
    let command: Vec<String> = pod["spec"]["containers"][0]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|arg| arg.as_str().unwrap().to_owned())
        .collect();
    assert!(reported(&report, &format!("command: {}", command.join(" "))), "{component}'s command: {report:#?}");
    assert!(reported(&report, "seccomp: 2"), "{component} runs with RuntimeDefault seccomp: {report:#?}");
    // Node-critical: -997, as a Guaranteed pod's, where a Burstable pod without a memory request
    // gets 999. A runtime with `restrict_oom_score_adj` (this project's, with no CAP_SYS_RESOURCE)
    // raises a negative value to its own score, 0.
    let oom_score_adj: i32 = report
        .iter()
        .find_map(|line| line.strip_prefix("oom_score_adj: "))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no oom_score_adj in {report:#?}"));
    assert!(oom_score_adj <= 0, "{component} is node-critical: oom_score_adj {oom_score_adj}");
    let cpu_request = match component {
        "kube-apiserver" => 250,
        "kube-controller-manager" => 200,
        _ => 100,
    };
    let shares = format!("cpu.shares: {}", cpu_request * 1024 / 1000);
    assert!(reported(&report, &shares), "{component}'s CPU request: {report:#?}");
    let cgroup = report.iter().find_map(|line| line.strip_prefix("cgroup: ")).unwrap_or_default();
    assert!(cgroup.contains("burstable"), "{component} in the Burstable QoS cgroup: {cgroup}");
    kubelet_core::PodUid::from(pod["metadata"]["uid"].as_str().unwrap())
}

/// The pod object named `name` in `/pods`.
async fn pod_object(port: u16, name: &str) -> serde_json::Value {
    let (code, body) = get(port, "/pods").await;
    assert_eq!(code, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    list["items"].as_array().unwrap().iter().find(|p| p["metadata"]["name"] == name).unwrap().clone()
}
