//! Pod status: the runtime's pods and one pod's status (upstream `GetPods`, `GetPodStatus`),
//! with termination messages and restart counts read back from the node.

use super::*;

/// Upstream's limits on termination messages: the file, and the log tail used as fallback.
pub(super) const MAX_MESSAGE_BYTES: usize = 4096;
pub(super) const MAX_LOG_TAIL_LINES: usize = 80;
pub(super) const MAX_LOG_TAIL_BYTES: usize = 2048;

/// The message content of CRI log lines (`<time> <stream> <P|F> <message>`).
pub(super) fn log_message(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut parts = line.splitn(4, ' ');
        let (_, _, tag, message) = (parts.next(), parts.next(), parts.next(), parts.next().unwrap_or_default());
        out.push_str(message);
        if tag != Some("P") {
            out.push('\n');
        }
    }
    out
}

/// How much of a log file's end is read for the fallback message: more than 80 lines of
/// containerd's longest (16 KiB) plus the 2 KiB kept, so the window always holds a whole line.
const LOG_TAIL_WINDOW: u64 = 32 * 1024;

/// The last `max` bytes of a file (upstream `tail.ReadAtMost`), and whether that is all of it.
async fn read_at_most(path: &Path, max: u64) -> std::io::Result<(Vec<u8>, bool)> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut file = tokio::fs::File::open(path).await?;
    let len = file.metadata().await?.len();
    let start = len.saturating_sub(max);
    file.seek(std::io::SeekFrom::Start(start)).await?;
    let mut bytes = Vec::with_capacity(usize::try_from(len - start).unwrap_or_default());
    file.take(max).read_to_end(&mut bytes).await?;
    Ok((bytes, start == 0))
}

/// The end of `text`, at most `max` bytes, starting on a character boundary.
fn last_chars(text: &str, max: usize) -> &str {
    let start = text.len().saturating_sub(max);
    let start = (start..text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
    &text[start..]
}

/// The last lines of a container's log, within upstream's limits; only the file's end is read.
pub(super) async fn log_tail(path: &Path) -> String {
    let Ok((bytes, whole)) = read_at_most(path, LOG_TAIL_WINDOW).await else { return String::new() };
    let text = String::from_utf8_lossy(&bytes);
    // A window that starts mid-file starts mid-line: drop that partial line.
    let text = if whole { &text[..] } else { text.split_once('\n').map_or("", |(_, rest)| rest) };
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(MAX_LOG_TAIL_LINES)..].join("\n");
    last_chars(&log_message(&tail), MAX_LOG_TAIL_BYTES).to_owned()
}

/// A dead container's termination message (upstream `getTerminationMessage`): the last 4096
/// bytes of its termination file, or with `FallbackToLogsOnError` and a failure, the tail of
/// its log.
pub(super) async fn termination_message(status: &pb::ContainerStatus) -> String {
    let path = status.annotations.get(labels::TERMINATION_MESSAGE_PATH);
    let file = status.mounts.iter().find(|m| Some(&m.container_path) == path).map(|m| m.host_path.clone());
    let mut message = String::new();
    if let Some(file) = file {
        match read_at_most(Path::new(&file), MAX_MESSAGE_BYTES as u64).await {
            Ok((bytes, _)) => message = String::from_utf8_lossy(&bytes).into_owned(),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return format!("Error on reading termination log {file}: {err}"),
        }
    }
    let fallback =
        status.annotations.get(labels::TERMINATION_MESSAGE_POLICY).is_some_and(|p| p == "FallbackToLogsOnError");
    if message.is_empty() && fallback && status.exit_code != 0 && !status.log_path.is_empty() {
        message = log_tail(Path::new(&status.log_path)).await;
    }
    message
}

pub(super) async fn get_pods(rt: &CriRuntime, all: bool) -> Result<Vec<runtime::Pod>, Error> {
    let sandbox_filter = (!all).then(|| pb::PodSandboxFilter {
        state: Some(pb::PodSandboxStateValue { state: pb::PodSandboxState::SandboxReady as i32 }),
        ..Default::default()
    });
    let container_filter = (!all).then(|| pb::ContainerFilter {
        state: Some(pb::ContainerStateValue { state: pb::ContainerState::ContainerRunning as i32 }),
        ..Default::default()
    });
    let (sandboxes, containers) =
        futures::try_join!(rt.list_listed_sandboxes(sandbox_filter), rt.list_listed_containers(container_filter))?;
    let mut pods: BTreeMap<PodUid, runtime::Pod> = BTreeMap::new();
    for s in sandboxes {
        let Some(uid) = s.pod_uid() else { continue };
        let entry = pods.entry(uid.clone()).or_insert_with(|| s.empty_pod(uid));
        entry.sandboxes.push(s.into_sandbox());
    }
    for c in containers {
        let Some(uid) = c.pod_uid() else { continue };
        let entry = pods.entry(uid.clone()).or_insert_with(|| c.empty_pod(uid));
        entry.containers.push(c.into_container());
    }
    // Newest first; one without a creation time last.
    for pod in pods.values_mut() {
        pod.sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        pod.containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    }
    Ok(pods.into_values().collect())
}

pub(super) async fn get_pod_status(
    rt: &CriRuntime,
    uid: &PodUid,
    name: &str,
    namespace: &str,
) -> Result<PodStatus, Error> {
    let selector = CriRuntime::uid_selector(uid);
    let sandbox_filter = pb::PodSandboxFilter { label_selector: selector.clone(), ..Default::default() };
    let container_filter = pb::ContainerFilter { label_selector: selector, ..Default::default() };
    let (mut sandboxes, containers) =
        futures::try_join!(rt.list_sandboxes(Some(sandbox_filter)), rt.list_containers(Some(container_filter)))?;
    sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let sandbox_ids: Vec<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
    let container_ids: Vec<&str> = containers.iter().map(|c| c.id.as_str()).collect();
    let status = PodStatus::new(uid.clone(), name, namespace);
    read_statuses(rt, status, &sandbox_ids, &container_ids).await
}

/// The status of a pod [`get_pods`] has just listed: the listed sandboxes' and containers'
/// statuses alone, without listing the pod again.
pub(super) async fn get_listed_pod_status(rt: &CriRuntime, pod: &runtime::Pod) -> Result<PodStatus, Error> {
    let sandbox_ids: Vec<&str> = pod.sandboxes.iter().map(|s| s.id.as_str()).collect();
    let container_ids: Vec<&str> = pod.containers.iter().map(|c| c.id.as_str()).collect();
    let status = PodStatus::new(pod.uid.clone(), &pod.name, &pod.namespace);
    read_statuses(rt, status, &sandbox_ids, &container_ids).await
}

/// Fills `status` with the statuses of the pod's sandboxes (`sandbox_ids` newest first: the
/// pod's IPs are the newest sandbox's while it is ready) and containers; one removed since it
/// was listed is left out.
async fn read_statuses(
    rt: &CriRuntime,
    mut status: PodStatus,
    sandbox_ids: &[&str],
    container_ids: &[&str],
) -> Result<PodStatus, Error> {
    for (i, id) in sandbox_ids.iter().enumerate() {
        let request = pb::PodSandboxStatusRequest { pod_sandbox_id: (*id).to_owned(), verbose: false };
        let response = match rt.client.runtime_service().pod_sandbox_status(request).await {
            Ok(response) => response.into_inner(),
            Err(e) if e.code() == tonic::Code::NotFound => continue,
            Err(e) => return Err(Error::status("PodSandboxStatus", e)),
        };
        let Some(sandbox_status) = response.status else { continue };
        let converted = convert::sandbox_status(&sandbox_status);
        if i == 0 && converted.state == SandboxState::Ready {
            status.ips.clone_from(&converted.ips);
        }
        if status.name.is_empty()
            && let Some(meta) = &sandbox_status.metadata
        {
            status.name.clone_from(&meta.name);
            status.namespace.clone_from(&meta.namespace);
        }
        status.sandbox_statuses.push(converted);
    }
    let mut statuses = Vec::new();
    for id in container_ids {
        let request = pb::ContainerStatusRequest { container_id: (*id).to_owned(), verbose: false };
        match rt.client.runtime_service().container_status(request).await {
            Ok(response) => {
                if let Some(s) = response.into_inner().status {
                    let mut converted = convert::container_status(&s);
                    if converted.state == ContainerState::Exited {
                        let message = termination_message(&s).await;
                        if !message.is_empty() {
                            converted.message = message;
                        }
                    }
                    statuses.push((s.created_at, converted));
                }
            }
            Err(e) if e.code() == tonic::Code::NotFound => {}
            Err(e) => return Err(Error::status("ContainerStatus", e)),
        }
    }
    statuses.sort_by_key(|(created, _)| std::cmp::Reverse(*created));
    status.container_statuses = statuses.into_iter().map(|(_, s)| s).collect();
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn log_messages_and_tails() {
        let text = "2026-11-22T07:41:24.897821647Z stdout F hello\n2026-11-22T07:41:24.9Z stderr P part\n2026-11-22T07:41:24.9Z stderr F ial\n";
        assert_eq!(log_message(text), "hello\npartial\n");
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let lines: String = (0..200).map(|i| format!("2026-11-22T07:41:24Z stdout F line {i}\n")).collect();
        std::fs::write(&log, lines).unwrap();
        let tail = log_tail(&log).await;
        assert!(tail.ends_with("line 199\n") && !tail.contains("line 119\n"), "80 lines at most");
        std::fs::write(&log, format!("2026-11-22T07:41:24Z stdout F {}\n", "x".repeat(5000))).unwrap();
        assert_eq!(log_tail(&log).await.len(), MAX_LOG_TAIL_BYTES, "2 KiB at most");
        // A long log: only its end is read, and the partial first line of the window is dropped.
        let long: String = (0..20_000).map(|i| format!("2026-11-22T07:41:24Z stdout F entry {i}\n")).collect();
        std::fs::write(&log, long).unwrap();
        let tail = log_tail(&log).await;
        assert!(tail.ends_with("entry 19999\n") && tail.starts_with("entry "), "{tail:?}");
    }

    fn exited(file: &Path, policy: &str, log: &Path) -> pb::ContainerStatus {
        pb::ContainerStatus {
            exit_code: 1,
            log_path: log.display().to_string(),
            mounts: vec![pb::Mount {
                container_path: "/dev/termination-log".into(),
                host_path: file.display().to_string(),
                ..Default::default()
            }],
            annotations: [
                (labels::TERMINATION_MESSAGE_PATH.to_owned(), "/dev/termination-log".to_owned()),
                (labels::TERMINATION_MESSAGE_POLICY.to_owned(), policy.to_owned()),
            ]
            .into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn termination_messages_keep_the_last_4096_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (file, log) = (dir.path().join("termination-log"), dir.path().join("0.log"));
        let body: String = (0..1000).map(|i| format!("{i:04}\n")).collect();
        std::fs::write(&file, &body).unwrap();
        let message = termination_message(&exited(&file, "File", &log)).await;
        assert_eq!(message.len(), MAX_MESSAGE_BYTES);
        assert!(message.ends_with("0999\n"), "the end of the file, as upstream keeps");

        // An empty file falls back to the log only with FallbackToLogsOnError.
        std::fs::write(&file, "").unwrap();
        std::fs::write(&log, "2026-11-22T07:41:24Z stderr F panic: boom\n").unwrap();
        assert_eq!(termination_message(&exited(&file, "File", &log)).await, "");
        assert_eq!(termination_message(&exited(&file, "FallbackToLogsOnError", &log)).await, "panic: boom\n");
        std::fs::remove_file(&file).unwrap();
        assert_eq!(termination_message(&exited(&file, "FallbackToLogsOnError", &log)).await, "panic: boom\n");
    }
}
