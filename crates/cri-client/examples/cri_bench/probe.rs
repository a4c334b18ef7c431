//! `cri_bench probe`: the probing floor. The bench's probed pods ask for an httpGet probe every
//! second and an exec probe every 10 s per container; this runs the same probes with nothing
//! else around them (no results kept, no status, no metrics), so the bench can hold the agent's
//! CPU for probing against the least a client spends on the same work on the same machine, in
//! the same window.

use std::time::Duration;

use hyper::{Request, body::Bytes, header};
use hyper_util::rt::TokioIo;
use tokio::{
    net::TcpStream,
    task::JoinSet,
    time::{Instant, MissedTickBehavior},
};

use super::{BoxError, Rpc, in_namespace, pb, running_containers};

/// Each container's httpGet period in the probed manifests.
const HTTP_PERIOD: Duration = Duration::from_secs(1);

/// Each container's exec period in the probed manifests.
const EXEC_PERIOD: Duration = Duration::from_secs(10);

/// Runs the probes of every pod of `namespace` (a GET on each of `ports` at the pod's IP, an
/// exec in each running container) until the process is killed. Each probe's first run is spread
/// over its period, as the agent's probe workers spread theirs.
pub(super) async fn run_until_killed(mut rpc: Rpc, namespace: &str, ports: &[u16]) -> Result<(), BoxError> {
    let addresses: Vec<String> = pod_ips(&mut rpc, namespace)
        .await?
        .iter()
        .flat_map(|ip| ports.iter().map(move |port| format!("{ip}:{port}")))
        .collect();
    let containers = running_containers(&mut rpc, namespace).await?;
    if addresses.is_empty() || containers.is_empty() {
        return Err(format!("no pod with an IP and a running container in {namespace}").into());
    }
    let start = Instant::now();
    let mut probes = JoinSet::new();
    for (i, address) in addresses.iter().enumerate() {
        let first = start + spread(HTTP_PERIOD, i, addresses.len());
        probes.spawn(every(first, HTTP_PERIOD, address.clone(), http_get));
    }
    for (i, container) in containers.iter().enumerate() {
        let first = start + spread(EXEC_PERIOD, i, containers.len());
        let rpc = rpc.clone();
        probes.spawn(every(first, EXEC_PERIOD, container.id.clone(), move |id| exec_true(rpc.clone(), id)));
    }
    println!("probing");
    while let Some(ended) = probes.join_next().await {
        ended?;
    }
    Ok(())
}

/// The offset of the `i`th of `n` probes sharing `period`.
fn spread(period: Duration, i: usize, n: usize) -> Duration {
    period.mul_f64(i as f64 / n as f64)
}

/// Runs `probe` on `target` every `period` from `first`, forever; a failure is printed and the
/// next period tried, as a probe's failure is.
async fn every<F, Fut>(first: Instant, period: Duration, target: String, probe: F)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<(), BoxError>>,
{
    let mut ticks = tokio::time::interval_at(first, period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Err(err) = probe(target.clone()).await {
            eprintln!("cri_bench probe {target}: {err}");
        }
    }
}

/// The IPs of the ready sandboxes of `namespace`.
async fn pod_ips(rpc: &mut Rpc, namespace: &str) -> Result<Vec<String>, BoxError> {
    let filter = pb::PodSandboxFilter {
        state: Some(pb::PodSandboxStateValue { state: pb::PodSandboxState::SandboxReady as i32 }),
        ..pb::PodSandboxFilter::default()
    };
    let sandboxes = rpc.list_pod_sandbox(pb::ListPodSandboxRequest { filter: Some(filter) }).await?.into_inner().items;
    let mut ips = Vec::new();
    for sandbox in sandboxes.into_iter().filter(|s| in_namespace(&s.labels, namespace)) {
        let request = pb::PodSandboxStatusRequest { pod_sandbox_id: sandbox.id, verbose: false };
        let status = rpc.pod_sandbox_status(request).await?.into_inner().status;
        if let Some(ip) = status.and_then(|s| s.network).map(|n| n.ip).filter(|ip| !ip.is_empty()) {
            ips.push(ip);
        }
    }
    Ok(ips)
}

/// One GET of `/` on a new connection, the body read to its end: what an httpGet probe does.
async fn http_get(address: String) -> Result<(), BoxError> {
    let stream = TcpStream::connect(address.as_str()).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let connection = tokio::spawn(connection);
    let request = Request::get("/")
        .header(header::HOST, address.as_str())
        .header(header::USER_AGENT, "cri_bench-probe")
        .header(header::ACCEPT, "*/*")
        .body(http_body_util::Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    http_body_util::BodyExt::collect(response.into_body()).await?;
    connection.abort();
    if !status.is_success() {
        return Err(format!("answered {status}").into());
    }
    Ok(())
}

/// ExecSync of `true` in container `id`, with an exec probe's default timeout of 1 s.
async fn exec_true(mut rpc: Rpc, id: String) -> Result<(), BoxError> {
    let request = pb::ExecSyncRequest { container_id: id, cmd: vec!["true".into()], timeout: 1 };
    let response = rpc.exec_sync(request).await?.into_inner();
    if response.exit_code != 0 {
        return Err(format!("true exited with {}", response.exit_code).into());
    }
    Ok(())
}
