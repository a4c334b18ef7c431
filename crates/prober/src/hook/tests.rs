//! Hooks against the fake runtime (exec) and a server on loopback (httpGet).

use k8s_openapi::{
    api::core::v1::{ExecAction, HTTPGetAction, Pod, SleepAction, TCPSocketAction},
    apimachinery::pkg::util::intstr::IntOrString,
};
use kubelet_core::{
    Backoff, PodUid, ProbeResults, Runtime,
    fake::FakeRuntime,
    runtime::{ExecResult, PodStatus},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use super::*;

async fn running() -> (FakeRuntime, Pod, String) {
    let runtime = FakeRuntime::new();
    let pod = kubelet_core::testing::pod("p1", &["app"]);
    let status = PodStatus::new(PodUid::new("p1"), "p1", "default");
    assert!(
        !runtime.sync_pod(&pod, &status, &Backoff::default(), &ProbeResults::new(), &Default::default()).await.is_err()
    );
    let status = runtime.get_pod_status(&PodUid::new("p1"), "p1", "default").await.unwrap();
    let id = status.container_statuses[0].id.clone();
    (runtime, pod, id)
}

fn exec(command: &[&str]) -> LifecycleHandler {
    let command = Some(command.iter().map(|s| (*s).to_owned()).collect());
    LifecycleHandler { exec: Some(ExecAction { command }), ..LifecycleHandler::default() }
}

#[tokio::test(start_paused = true)]
async fn exec_hooks_pass_on_exit_zero_and_fail_with_the_command_and_output() {
    let (runtime, pod, id) = running().await;
    let container = pod.spec.as_ref().unwrap().containers[0].clone();
    let target = Target::new(&pod, &container, &id, Some("10.0.0.2"));
    Hooks::default().run(&runtime, target, &exec(&["touch", "/ready"])).await.unwrap();
    let mut failed = ExecResult::default();
    failed.exit_code = 3;
    failed.stderr = b"no such file\n".to_vec();
    runtime.set_exec_result("app", failed);
    let err = Hooks::default().run(&runtime, target, &exec(&["touch", "/ready"])).await.unwrap_err().to_string();
    for part in ["Exec lifecycle hook ([\"touch\", \"/ready\"])", "Container \"app\"", "exited with 3", "no such file"]
    {
        assert!(err.contains(part), "{part:?} missing from {err}");
    }
    let gone = Target::new(&pod, &container, "nope", None);
    let err = Hooks::default().run(&runtime, gone, &exec(&["true"])).await.unwrap_err().to_string();
    assert!(err.contains("not found"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_sleep_hook_takes_its_seconds_and_a_tcp_hook_cannot_run() {
    let (runtime, pod, id) = running().await;
    let container = pod.spec.as_ref().unwrap().containers[0].clone();
    let target = Target::new(&pod, &container, &id, None);
    let sleep = LifecycleHandler { sleep: Some(SleepAction { seconds: 5 }), ..LifecycleHandler::default() };
    let started = tokio::time::Instant::now();
    Hooks::default().run(&runtime, target, &sleep).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    let tcp = LifecycleHandler {
        tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(80), ..TCPSocketAction::default() }),
        ..LifecycleHandler::default()
    };
    let err = Hooks::default().run(&runtime, target, &tcp).await.unwrap_err().to_string();
    assert!(err.starts_with("Cannot run handler"), "{err}");
}

#[tokio::test]
async fn http_hooks_pass_on_any_answer_and_fail_without_one() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = vec![0; 4096];
            let n = stream.read(&mut buf).await.unwrap_or(0);
            let _ = seen_tx.send(String::from_utf8_lossy(&buf[..n]).into_owned());
            let _ = stream.write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n").await;
        }
    });
    let (runtime, pod, id) = running().await;
    let container = pod.spec.as_ref().unwrap().containers[0].clone();
    let handler = |port: u16| LifecycleHandler {
        http_get: Some(HTTPGetAction {
            path: Some("/hook".into()),
            port: IntOrString::Int(i32::from(port)),
            ..HTTPGetAction::default()
        }),
        ..LifecycleHandler::default()
    };
    // Upstream's hook does not look at the status: a 500 is an answer.
    Hooks::default()
        .run(&runtime, Target::new(&pod, &container, &id, Some("127.0.0.1")), &handler(port))
        .await
        .unwrap();
    let head = seen.recv().await.unwrap().to_lowercase();
    assert!(head.starts_with("get /hook http/1.1") && head.contains("user-agent: kube-lifecycle/1.36"), "{head}");
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let err = Hooks::default()
        .run(&runtime, Target::new(&pod, &container, &id, Some("127.0.0.1")), &handler(closed))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("HTTP lifecycle hook (/hook) for Container \"app\""), "{err}");
    let err = Hooks::default()
        .run(&runtime, Target::new(&pod, &container, &id, None), &handler(port))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("failed to find networking container"), "{err}");
}
