//! The CRI side of `cargo xtask bench` and `cargo xtask chaos`, built on this crate's client.
//!
//! ```text
//! cri_bench floor  ENDPOINT --image IMG --pods N --parallel P --dir DIR [--runtime-pid PID]
//!     the bare CRI sequence a kubelet cannot avoid for N one-container pods, P at a time:
//!     RunPodSandbox, CreateContainer, StartContainer, then StopContainer and StopPodSandbox
//!     (the container runs what the benchmark's manifests run, confined as a kubelet confines
//!     it: the sandbox under the runtime's default seccomp profile, upstream's masked and
//!     read-only paths in the container);
//!     prints {"start_s": .., "stop_s": .., "calls_s": {"run_podsandbox": .., "create_container": ..,
//!     "start_container": ..}, "runtime_cpu_start_s": ..} (each call's mean; the CPU seconds
//!     process PID, the runtime, used until every pod had started, null without it) and
//!     removes what it made
//! cri_bench watch  ENDPOINT --namespace NS (--running N | --stopped)
//!     prints "watching" after its first look, then the Unix time (seconds) at which N containers of
//!     pods in NS run, or no sandbox of NS is ready any more
//! cri_bench state  ENDPOINT --namespace NS
//!     the pods of NS as JSON: ready sandboxes and running containers per pod UID
//! cri_bench namespaces ENDPOINT
//!     every sandbox the runtime holds, ready or not, counted by its pod's namespace, as JSON
//!     (`{"NS": N}`; a sandbox without the namespace label under "")
//! cri_bench kill   ENDPOINT --namespace NS
//!     stops every running container of NS at once (no grace), as a crash would, and prints the
//!     Unix time the runtime confirmed it
//! cri_bench clean  ENDPOINT --namespace NS
//!     stops and removes every sandbox of NS, with its containers
//! cri_bench exec   ENDPOINT --namespace NS --times N
//!     runs `true` with ExecSync in the first running container of NS, N times one after another,
//!     and prints each round trip in seconds
//! cri_bench probe  ENDPOINT --namespace NS --ports P[,P...]
//!     the probing floor: what the bench's probed pods' probes cost a client that only runs them
//!     (an HTTP GET on each port of each pod's IP every second, ExecSync `true` in each running
//!     container every 10 s), until killed; prints "probing" once its probes run
//! ```
//!
//! Every sandbox it makes carries the label `kubelet-rs.bench=floor`, so a crashed run's leftovers
//! are easy to find.

// Reason: a measuring tool with its own argument checks; wall time is what it measures.
#![allow(clippy::disallowed_methods)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

mod probe;

use k8s_openapi::{
    api::core::v1::{Pod, PodSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kubelet_cri_client::{
    Client, Config, container, labels,
    pb::{self, runtime_service_client::RuntimeServiceClient},
    sandbox::{Dns, ResolvConf, sandbox_config},
};

type Rpc = RuntimeServiceClient<kubelet_cri_client::CriChannel>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How often `watch` looks: often enough for 10 ms resolution, rarely enough to leave the
/// runtime to the agent under test.
const POLL: Duration = Duration::from_millis(10);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tokio = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(tokio) => tokio,
        Err(err) => {
            eprintln!("cri_bench: {err}");
            return ExitCode::FAILURE;
        }
    };
    match tokio.block_on(run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("cri_bench: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The value after `--name`, if given.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
}

fn required<'a>(args: &'a [String], name: &str) -> Result<&'a str, BoxError> {
    flag(args, name).ok_or_else(|| format!("{name} is required").into())
}

fn number(args: &[String], name: &str) -> Result<usize, BoxError> {
    let value = required(args, name)?;
    value.parse().map_err(|_| format!("{name} takes a number, not {value:?}").into())
}

async fn run(args: &[String]) -> Result<(), BoxError> {
    let (Some(command), Some(endpoint)) = (args.first(), args.get(1)) else {
        return Err("usage: cri_bench floor|watch|state|namespaces|kill|clean|exec|probe ENDPOINT [options]".into());
    };
    let client = Client::connect(&Config::new(endpoint.as_str()))?;
    let rpc = client.runtime_service();
    match command.as_str() {
        "floor" => {
            let image = required(args, "--image")?.to_owned();
            let dir = PathBuf::from(required(args, "--dir")?);
            let runtime_pid = match flag(args, "--runtime-pid") {
                Some(_) => Some(number(args, "--runtime-pid")?),
                None => None,
            };
            let before = runtime_pid.map(process_cpu_seconds);
            let (pods, parallel) = (number(args, "--pods")?, number(args, "--parallel")?);
            let floor = floor(rpc, &image, &dir, pods, parallel, runtime_pid).await?;
            let figures = serde_json::json!({
                "start_s": floor.start.as_secs_f64(),
                "stop_s": floor.stop.as_secs_f64(),
                "calls_s": floor.calls,
                "runtime_cpu_start_s": floor.runtime_cpu_start.zip(before).map(|(after, before)| after - before),
            });
            println!("{figures}");
        }
        "watch" => {
            let namespace = required(args, "--namespace")?;
            let goal = match flag(args, "--running") {
                Some(_) => Goal::Running(number(args, "--running")?),
                None if args.iter().any(|a| a == "--stopped") => Goal::Stopped,
                None => return Err("watch takes --running N or --stopped".into()),
            };
            watch(rpc, namespace, goal).await?;
        }
        "state" => {
            let pods = state(rpc, required(args, "--namespace")?).await?;
            let json: serde_json::Map<String, serde_json::Value> = pods
                .into_iter()
                .map(|(uid, pod)| {
                    let value = serde_json::json!({
                        "name": pod.name,
                        "ready_sandboxes": pod.ready_sandboxes,
                        "sandboxes": pod.sandboxes,
                        "running": pod.running,
                        "containers": pod.containers,
                        "started": pod.started,
                        "ready_sandbox_ids": pod.ready_sandbox_ids,
                        "running_ids": pod.running_ids,
                    });
                    (uid, value)
                })
                .collect();
            println!("{}", serde_json::Value::Object(json));
        }
        "namespaces" => {
            let mut rpc = rpc;
            let sandboxes = rpc.list_pod_sandbox(pb::ListPodSandboxRequest { filter: None }).await?.into_inner().items;
            let mut counts = BTreeMap::<String, usize>::new();
            for sandbox in sandboxes {
                let namespace = sandbox.labels.get(labels::POD_NAMESPACE).cloned().unwrap_or_default();
                *counts.entry(namespace).or_default() += 1;
            }
            println!("{}", serde_json::json!(counts));
        }
        "kill" => {
            let namespace = required(args, "--namespace")?;
            let mut rpc = rpc;
            for container in running_containers(&mut rpc, namespace).await? {
                rpc.stop_container(pb::StopContainerRequest { container_id: container.id, timeout: 0 }).await?;
            }
            println!("{:.6}", unix_now());
        }
        "clean" => {
            let namespace = required(args, "--namespace")?;
            let mut rpc = rpc;
            let sandboxes = rpc.list_pod_sandbox(pb::ListPodSandboxRequest { filter: None }).await?.into_inner().items;
            for sandbox in sandboxes.into_iter().filter(|s| in_namespace(&s.labels, namespace)) {
                rpc.stop_pod_sandbox(pb::StopPodSandboxRequest { pod_sandbox_id: sandbox.id.clone() }).await?;
                rpc.remove_pod_sandbox(pb::RemovePodSandboxRequest { pod_sandbox_id: sandbox.id }).await?;
            }
        }
        "exec" => {
            // The runtime's own ExecSync of `true` in the namespace's first running container,
            // `--times` times one after another: each round trip in seconds, one per line.
            let namespace = required(args, "--namespace")?;
            let mut rpc = rpc;
            let running = running_containers(&mut rpc, namespace).await?;
            let container = running.into_iter().next().ok_or("no running container in the namespace")?;
            for _ in 0..number(args, "--times")? {
                let request =
                    pb::ExecSyncRequest { container_id: container.id.clone(), cmd: vec!["true".into()], timeout: 10 };
                let began = std::time::Instant::now();
                let response = rpc.exec_sync(request).await?.into_inner();
                if response.exit_code != 0 {
                    return Err(format!("true exited with {}", response.exit_code).into());
                }
                println!("{:.6}", began.elapsed().as_secs_f64());
            }
        }
        "probe" => {
            let ports = required(args, "--ports")?
                .split(',')
                .map(|port| port.parse().map_err(|err| format!("--ports {port:?}: {err}")))
                .collect::<Result<Vec<u16>, _>>()?;
            probe::run_until_killed(rpc, required(args, "--namespace")?, &ports).await?;
        }
        other => {
            return Err(format!(
                "unknown command {other:?}: floor, watch, state, namespaces, kill, clean, exec or probe"
            )
            .into());
        }
    }
    Ok(())
}

/// The running containers of pods in `namespace`.
async fn running_containers(rpc: &mut Rpc, namespace: &str) -> Result<Vec<pb::Container>, BoxError> {
    let filter = pb::ContainerFilter {
        state: Some(pb::ContainerStateValue { state: pb::ContainerState::ContainerRunning as i32 }),
        ..pb::ContainerFilter::default()
    };
    let list = rpc.list_containers(pb::ListContainersRequest { filter: Some(filter) }).await?.into_inner();
    Ok(list.containers.into_iter().filter(|c| in_namespace(&c.labels, namespace)).collect())
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs_f64()
}

/// The namespace of the floor's pods.
const FLOOR_NAMESPACE: &str = "kubelet-rs-floor";

/// One pod of the floor: a name in [`FLOOR_NAMESPACE`] and a fresh UID.
fn floor_pod(index: usize) -> Pod {
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos();
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("floor-{index}")),
            namespace: Some(FLOOR_NAMESPACE.into()),
            uid: Some(format!("floor-{index}-{nanos}")),
            labels: Some(BTreeMap::from([("kubelet-rs.bench".into(), "floor".into())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec::default()),
        ..Pod::default()
    }
}

/// Starts one pod: sandbox, container, start. Returns the sandbox and container IDs.
/// A floor pod that runs: its sandbox, its container, and how long each of the three calls took,
/// in [`FLOOR_CALLS`]' order.
struct Started {
    sandbox: String,
    container: String,
    calls: [Duration; 3],
}

/// The calls of a floor pod's start, by the `operation_type` the agent's
/// `kubelet_runtime_operations_duration_seconds` records them under.
const FLOOR_CALLS: [&str; 3] = ["run_podsandbox", "create_container", "start_container"];

async fn start_pod(mut rpc: Rpc, pod: Pod, image: String, logs: PathBuf) -> Result<Started, BoxError> {
    let log_dir = logs.join(pod.metadata.uid.as_deref().unwrap_or_default());
    tokio::fs::create_dir_all(&log_dir).await?;
    let mut config =
        sandbox_config(&pod, 0, &log_dir, "", &Dns { host: Some(ResolvConf::default()), ..Dns::default() })?;
    if let Some(linux) = config.linux.as_mut() {
        // The runtime's own cgroup parent, which it removes with the sandbox.
        linux.cgroup_parent = String::new();
    }
    let began = Instant::now();
    let sandbox = rpc
        .run_pod_sandbox(pb::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() })
        .await?
        .into_inner()
        .pod_sandbox_id;
    let container = pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata { name: "app".into(), attempt: 0 }),
        image: Some(pb::ImageSpec { image, ..pb::ImageSpec::default() }),
        // What the benchmark's manifests run: a process that stops at once on SIGTERM.
        command: ["sh", "-c", "trap 'exit 0' TERM; sleep 36000 & wait"].map(String::from).to_vec(),
        labels: [(labels::CONTAINER_NAME.to_owned(), "app".to_owned())].into(),
        log_path: "app/0.log".into(),
        linux: Some(pb::LinuxContainerConfig {
            security_context: Some(floor_security_context()),
            ..pb::LinuxContainerConfig::default()
        }),
        ..pb::ContainerConfig::default()
    };
    let ran = began.elapsed();
    let began = Instant::now();
    let id = rpc
        .create_container(pb::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(container),
            sandbox_config: Some(config),
        })
        .await?
        .into_inner()
        .container_id;
    let created = began.elapsed();
    let began = Instant::now();
    rpc.start_container(pb::StartContainerRequest { container_id: id.clone() }).await?;
    Ok(Started { sandbox, container: id, calls: [ran, created, began.elapsed()] })
}

/// What every kubelet asks of a container's security: upstream's masked and read-only `/proc`
/// and `/sys` paths, which the runtime mounts over each container's own.
fn floor_security_context() -> pb::LinuxContainerSecurityContext {
    let (masked_paths, readonly_paths) = container::proc_paths(None);
    pb::LinuxContainerSecurityContext { masked_paths, readonly_paths, ..pb::LinuxContainerSecurityContext::default() }
}

/// Stops one pod: its container (with the agent's minimum grace; the process exits on SIGTERM),
/// then its sandbox.
///
/// A failed StopContainer is asked once more, as a kubelet's next sync would: with 110 pods
/// stopped at once on two cores, a container that outlives its grace is killed while its shim
/// exits, and containerd 1.6 answers "ttrpc: closed" for a container that did stop.
async fn stop_pod(mut rpc: Rpc, sandbox: String, container: String) -> Result<(), BoxError> {
    let timeout = kubelet_cri_client::MIN_GRACE_PERIOD_SECONDS;
    let stop = pb::StopContainerRequest { container_id: container, timeout };
    if rpc.stop_container(stop.clone()).await.is_err() {
        rpc.stop_container(stop).await?;
    }
    rpc.stop_pod_sandbox(pb::StopPodSandboxRequest { pod_sandbox_id: sandbox }).await?;
    Ok(())
}

/// Runs `work` over `items`, at most `parallel` at a time, and waits for all.
async fn bounded<T, O, F, Fut>(items: Vec<T>, parallel: usize, work: F) -> Result<Vec<Fut::Output>, BoxError>
where
    T: Send + 'static,
    O: Send + 'static,
    F: Fn(T) -> Fut,
    Fut: Future<Output = Result<O, BoxError>> + Send + 'static,
{
    let permits = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for item in items {
        let permit = permits.clone().acquire_owned().await?;
        let job = work(item);
        tasks.spawn(async move {
            let result = job.await;
            drop(permit);
            result
        });
    }
    Ok(tasks.join_all().await)
}

/// The floor's figures: start and stop of every pod, and the mean time of each start call.
struct Floor {
    start: Duration,
    stop: Duration,
    /// Mean seconds of each of [`FLOOR_CALLS`].
    calls: BTreeMap<&'static str, f64>,
    /// The runtime's CPU seconds once every pod had started, where its process was named.
    runtime_cpu_start: Option<f64>,
}

/// The CPU seconds process `pid` has used, its exited threads included (`/proc/PID/stat`'s
/// utime and stime, in ticks of 1/100 s); zero when it cannot be read.
fn process_cpu_seconds(pid: usize) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let after_command = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after_command.split_whitespace().skip(11).take(2).filter_map(|t| t.parse::<u64>().ok()).sum();
    ticks as f64 / 100.0
}

async fn floor(
    rpc: Rpc,
    image: &str,
    dir: &Path,
    pods: usize,
    parallel: usize,
    runtime_pid: Option<usize>,
) -> Result<Floor, BoxError> {
    let logs = dir.join("floor-logs");
    let begin = Instant::now();
    let started = bounded((0..pods).map(floor_pod).collect(), parallel, |pod| {
        start_pod(rpc.clone(), pod, image.to_owned(), logs.clone())
    })
    .await?;
    let start = begin.elapsed();
    let runtime_cpu_start = runtime_pid.map(process_cpu_seconds);
    let (started, errors): (Vec<_>, Vec<_>) = started.into_iter().partition(Result::is_ok);
    let started: Vec<Started> = started.into_iter().filter_map(Result::ok).collect();
    let calls = FLOOR_CALLS
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let total: f64 = started.iter().map(|pod| pod.calls[i].as_secs_f64()).sum();
            (*name, total / started.len().max(1) as f64)
        })
        .collect();
    let ids: Vec<(String, String)> = started.into_iter().map(|pod| (pod.sandbox, pod.container)).collect();
    let begin = Instant::now();
    let stopped = bounded(ids.clone(), parallel, |(sandbox, container)| {
        let rpc = rpc.clone();
        async move { stop_pod(rpc, sandbox, container).await }
    })
    .await?;
    let stop = begin.elapsed();
    let mut remove = rpc.clone();
    for (sandbox, _) in &ids {
        let _ = remove.remove_pod_sandbox(pb::RemovePodSandboxRequest { pod_sandbox_id: sandbox.clone() }).await;
    }
    let _ = tokio::fs::remove_dir_all(&logs).await;
    if let Some(Err(err)) = errors.into_iter().next() {
        return Err(format!("starting a floor pod: {err}").into());
    }
    if let Some(Err(err)) = stopped.into_iter().find(Result::is_err) {
        return Err(format!("stopping a floor pod: {err}").into());
    }
    Ok(Floor { start, stop, calls, runtime_cpu_start })
}

enum Goal {
    Running(usize),
    Stopped,
}

fn in_namespace(labels: &std::collections::HashMap<String, String>, namespace: &str) -> bool {
    labels.get(labels::POD_NAMESPACE).is_some_and(|n| n == namespace)
}

async fn watch(mut rpc: Rpc, namespace: &str, goal: Goal) -> Result<(), BoxError> {
    let mut first = true;
    loop {
        let reached = match goal {
            Goal::Running(count) => {
                let filter = pb::ContainerFilter {
                    state: Some(pb::ContainerStateValue { state: pb::ContainerState::ContainerRunning as i32 }),
                    ..pb::ContainerFilter::default()
                };
                let list = rpc.list_containers(pb::ListContainersRequest { filter: Some(filter) }).await?.into_inner();
                list.containers.iter().filter(|c| in_namespace(&c.labels, namespace)).count() >= count
            }
            Goal::Stopped => {
                let filter = pb::PodSandboxFilter {
                    state: Some(pb::PodSandboxStateValue { state: pb::PodSandboxState::SandboxReady as i32 }),
                    ..pb::PodSandboxFilter::default()
                };
                let list = rpc.list_pod_sandbox(pb::ListPodSandboxRequest { filter: Some(filter) }).await?.into_inner();
                !list.items.iter().any(|s| in_namespace(&s.labels, namespace))
            }
        };
        if reached && !first {
            println!("{:.6}", unix_now());
            return Ok(());
        }
        if first {
            // The caller starts its clock after this line, so a goal already reached is reported
            // at the next look rather than before the clock started.
            println!("watching");
            first = false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Ready sandboxes and running containers of every pod UID in `namespace`.
#[derive(Default)]
struct PodState {
    name: String,
    ready_sandboxes: usize,
    sandboxes: usize,
    /// Running containers per container name.
    running: BTreeMap<String, usize>,
    containers: usize,
    /// When the latest of its running containers started, as the runtime says (Unix seconds).
    started: f64,
    /// The IDs of its ready sandboxes and of its running containers: a pod that keeps them kept
    /// running throughout.
    ready_sandbox_ids: BTreeSet<String>,
    running_ids: BTreeSet<String>,
}

async fn state(mut rpc: Rpc, namespace: &str) -> Result<BTreeMap<String, PodState>, BoxError> {
    let sandboxes = rpc.list_pod_sandbox(pb::ListPodSandboxRequest { filter: None }).await?.into_inner().items;
    let containers = rpc.list_containers(pb::ListContainersRequest { filter: None }).await?.into_inner().containers;
    let mut pods: BTreeMap<String, PodState> = BTreeMap::new();
    for sandbox in sandboxes.iter().filter(|s| in_namespace(&s.labels, namespace)) {
        let uid = sandbox.labels.get(labels::POD_UID).cloned().unwrap_or_default();
        let pod = pods.entry(uid).or_default();
        pod.name = sandbox.labels.get(labels::POD_NAME).cloned().unwrap_or_default();
        pod.sandboxes += 1;
        if sandbox.state == pb::PodSandboxState::SandboxReady as i32 {
            pod.ready_sandboxes += 1;
            pod.ready_sandbox_ids.insert(sandbox.id.clone());
        }
    }
    for container in containers.iter().filter(|c| in_namespace(&c.labels, namespace)) {
        let uid = container.labels.get(labels::POD_UID).cloned().unwrap_or_default();
        let pod = pods.entry(uid).or_default();
        pod.containers += 1;
        if container.state == pb::ContainerState::ContainerRunning as i32 {
            let name = container.labels.get(labels::CONTAINER_NAME).cloned().unwrap_or_default();
            *pod.running.entry(name).or_default() += 1;
            pod.running_ids.insert(container.id.clone());
            let request = pb::ContainerStatusRequest { container_id: container.id.clone(), verbose: false };
            if let Some(status) = rpc.container_status(request).await?.into_inner().status {
                #[allow(clippy::cast_precision_loss)] // Reason: nanoseconds since 1970 as seconds, to the microsecond.
                let started = status.started_at as f64 / 1e9;
                pod.started = pod.started.max(started);
            }
        }
    }
    Ok(pods)
}
