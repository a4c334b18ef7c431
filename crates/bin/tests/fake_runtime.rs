//! `kubelet-rs run --container-runtime-endpoint fake://`: the whole agent on the in-memory
//! runtime, without root, driven and observed through the binary's own commands.

// Reason: tests fail by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::{
    path::Path,
    process::{Child, Command},
    time::Duration,
};

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &Path, endpoint: &str) -> Agent {
    start_with(dir, endpoint, &[])
}

/// The agent on `endpoint` with the pod `web` (an init container `setup`, a container `app`)
/// and `extra` flags.
fn start_with(dir: &Path, endpoint: &str, extra: &[&str]) -> Agent {
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    std::fs::write(
        dir.join("manifests/web.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  initContainers:\n  - {name: setup, image: busybox}\n  containers:\n  - {name: app, image: busybox}\n",
    )
    .unwrap();
    let child = common::agent_command(endpoint, dir, "fake").args(["--healthz-port", "0"]).args(extra).spawn().unwrap();
    Agent(child)
}

/// The `get pods` row of `web-fake` once it matches `done` (at most 20 s).
async fn row_when(dir: &Path, done: impl Fn(&[&str]) -> bool) -> String {
    row_of(dir, "web-fake", done).await
}

/// The `get pods` row of the pod named `name` once it matches `done` (at most 20 s).
async fn row_of(dir: &Path, name: &str, done: impl Fn(&[&str]) -> bool) -> String {
    let root = dir.join("root");
    let mut last = String::new();
    for _ in 0..200 {
        let output = Command::new(env!("CARGO_BIN_EXE_kubelet-rs"))
            .args(["get", "pods", "--root-dir"])
            .arg(&root)
            .output()
            .unwrap();
        last = String::from_utf8_lossy(&output.stdout).into_owned();
        if let Some(row) = last.lines().find(|l| l.split_whitespace().next() == Some(name)) {
            let cells: Vec<&str> = row.split_whitespace().collect();
            if done(&cells) {
                return row.to_owned();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out; last table:\n{last}");
}

/// A pod with postStart and preStop hooks runs on the fake runtime as on a real node (its hooks
/// succeed at once: a hollow node has no process for them to act on).
#[tokio::test]
async fn a_pod_with_lifecycle_hooks_runs_on_the_fake_runtime() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("manifests")).unwrap();
    std::fs::write(
        dir.path().join("manifests/hooked.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: hooked}\nspec:\n  containers:\n  - name: app\n    image: busybox\n\
         \x20   lifecycle:\n      postStart: {exec: {command: [touch, /started]}}\n\
         \x20     preStop: {httpGet: {path: /stop, port: 8080}}\n",
    )
    .unwrap();
    let _agent = start(dir.path(), "fake://");
    let row = row_of(dir.path(), "hooked-fake", |c| c[2] == "Running").await;
    assert!(row.split_whitespace().nth(1) == Some("1/1"), "{row}");
}

#[tokio::test]
async fn pods_run_on_the_fake_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let _agent = start(dir.path(), "fake://?startLatency=100ms");
    let row = row_when(dir.path(), |c| c[1] == "1/1" && c[2] == "Running").await;
    // The rest of the row: the pod's full name and no restart.
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((columns[0], columns[3]), ("web-fake", "0"), "{row}");
    let output = Command::new(env!("CARGO_BIN_EXE_kubelet-rs"))
        .args(["describe", "pod", "web-fake", "--root-dir"])
        .arg(dir.path().join("root"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for want in [
        "Name:         web-fake",
        "Init Containers:",
        "  setup:",
        "      Reason:       Completed",
        "Containers:",
        "  app:",
        "    State:          Running",
        "Events:",
        "Started",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
}

#[tokio::test]
async fn a_failure_rate_of_one_fails_every_start() {
    let dir = tempfile::tempdir().unwrap();
    let _agent = start(dir.path(), "fake://?failureRate=1");
    let row = row_when(dir.path(), |c| c[2].ends_with("RunContainerError") || c[2].ends_with("CrashLoopBackOff")).await;
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((columns[0], columns[1]), ("web-fake", "0/1"), "never ready: {row}");
}

#[tokio::test]
async fn get_pods_watch_prints_the_table_again_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let _agent = start(dir.path(), "fake://");
    row_when(dir.path(), |c| c[2] == "Running").await;
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubelet-rs"))
        .args(["get", "pods", "--watch", "--root-dir"])
        .arg(dir.path().join("root"))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watch.stdout.take().unwrap()));
    assert!(next_line(&mut lines).await.starts_with("NAME"));
    assert!(next_line(&mut lines).await.starts_with("web-fake"));
    // A second pod: the table comes again, with both.
    std::fs::write(
        dir.path().join("manifests/db.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: db}\nspec:\n  containers:\n  - {name: app, image: busybox}\n",
    )
    .unwrap();
    let mut seen_db = false;
    for _ in 0..20 {
        if next_line(&mut lines).await.starts_with("db-fake") {
            seen_db = true;
            break;
        }
    }
    assert!(seen_db, "the watch printed the new pod");
    watch.kill().await.unwrap();
}

async fn next_line(lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>) -> String {
    tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.unwrap().unwrap().unwrap()
}

/// Under a `Type=notify` unit with `WatchdogSec`: `READY=1` once the agent runs, then
/// `WATCHDOG=1` about every half of the watchdog's timeout, then `STOPPING=1` at SIGTERM; all on
/// the socket systemd names in `NOTIFY_SOCKET` (the test's own here).
#[tokio::test]
async fn systemd_hears_ready_the_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = tokio::net::UnixDatagram::bind(&socket_path).unwrap();
    std::fs::create_dir_all(dir.path().join("manifests")).unwrap();
    let child = common::agent_command("fake://", dir.path(), "fake")
        .args(["--healthz-port", "0"])
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "400000")
        .spawn()
        .unwrap();
    let pid = child.id();
    let _agent = Agent(child);
    let next = || async {
        let mut buffer = [0u8; 256];
        let received = tokio::time::timeout(Duration::from_secs(20), socket.recv(&mut buffer)).await;
        let length = received.expect("a notification within 20 s").unwrap();
        String::from_utf8_lossy(&buffer[..length]).into_owned()
    };
    assert_eq!(next().await, "READY=1\n");
    let started = tokio::time::Instant::now();
    for _ in 0..5 {
        assert_eq!(next().await, "WATCHDOG=1\n");
    }
    // Five pings at half the 400 ms timeout: about a second, never faster than the period.
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(700), "five pings in {took:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid.cast_signed()), nix::sys::signal::Signal::SIGTERM).unwrap();
    let mut last = next().await;
    while last == "WATCHDOG=1\n" {
        last = next().await;
    }
    assert_eq!(last, "STOPPING=1\n");
}

/// What `curl` got from the kubelet API on `port` for `method path`: the status code and body
/// (code 0 while nothing answers).
fn kubelet_api(port: u16, method: &str, path: &str) -> (u16, String) {
    let output = Command::new("curl")
        .args(["-sk", "--path-as-is", "--max-time", "5", "-X", method, "-w", "\n%{http_code}"])
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl (`cargo xtask setup` installs it)");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

/// Starts the agent on the fake runtime with its kubelet API on `port` (anonymous, always
/// allowed) and `extra` configuration lines; returns once `/pods` lists `web-fake`.
async fn serve_the_kubelet_api(dir: &Path, port: u16, extra: &str) -> Agent {
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nport: {port}\n\
             authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}\n\
             authorization: {{mode: AlwaysAllow}}\n{extra}"
        ),
    )
    .unwrap();
    let agent = start_with(dir, "fake://", &["--config", config.to_str().unwrap()]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        if kubelet_api(port, "GET", "/pods").1.contains("web-fake") {
            return agent;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the kubelet API did not list the pod within 20 s");
}

/// With `enableDebuggingHandlers: false` every path of upstream's debugging handlers answers
/// 405 `Debug endpoints are disabled.` while `/pods` is served; with it on (the default),
/// `/containerLogs` answers 404 for a container the pod does not have, whatever its name
/// decodes to (`..`, a slash), and never reads outside the pod's log directory.
#[tokio::test]
async fn the_kubelet_api_serves_debugging_handlers_only_when_enabled() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let agent = serve_the_kubelet_api(dir.path(), port, "enableDebuggingHandlers: false\n").await;
    let debugging = [
        ("POST", "/run/default/web-fake/app?cmd=ls"),
        ("POST", "/exec/default/web-fake/app?command=ls"),
        ("GET", "/attach/default/web-fake/app"),
        ("POST", "/portForward/default/web-fake"),
        ("GET", "/containerLogs/default/web-fake/app"),
        ("GET", "/runningpods/"),
        ("GET", "/debug/pprof/"),
        ("GET", "/logs/"),
    ];
    for (method, path) in debugging {
        let answer = kubelet_api(port, method, path);
        assert_eq!(answer, (405, "Debug endpoints are disabled.\n".to_owned()), "{method} {path}");
    }
    // configz is one of upstream's debugging handlers too, not installed at all when they are off.
    assert_eq!(kubelet_api(port, "GET", "/configz").0, 404);
    drop(agent);

    let _agent = serve_the_kubelet_api(dir.path(), port, "").await;
    assert_eq!(kubelet_api(port, "GET", "/runningpods/").0, 200);
    // A container that never restarted has no previous logs: upstream's 400.
    let previous = kubelet_api(port, "GET", "/containerLogs/default/web-fake/app?previous=true");
    assert_eq!(previous, (400, "previous terminated container \"app\" in pod \"web-fake\" not found".to_owned()));
    assert_eq!(kubelet_api(port, "GET", "/configz").0, 200);
    let names =
        [("%2E%2E", ".."), ("..%2F..%2F..%2Fetc", "../../../etc"), ("app%2F..%2F..", "app/../.."), ("other", "other")];
    for (encoded, name) in names {
        let answer = kubelet_api(port, "GET", &format!("/containerLogs/default/web-fake/{encoded}"));
        let expected = format!("container {name:?} not found in pod \"web-fake\"");
        assert_eq!(answer, (404, expected), "{encoded}");
    }
}
