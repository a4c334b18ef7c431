//! The probe actions (upstream `pkg/probe/{exec,http,tcp,grpc}`): each runs once, within its
//! timeout, and says whether the container passed.

use std::{net::IpAddr, time::Duration};

use http_body_util::{BodyExt, Empty};
use hyper::{Request, StatusCode, body::Bytes, header};
use hyper_util::rt::TokioIo;
use k8s_openapi::{
    api::core::v1::{Container, ExecAction, GRPCAction, HTTPGetAction},
    apimachinery::pkg::util::intstr::IntOrString,
};
use kubelet_core::Runtime;
use tokio::{net::TcpStream, time::Instant};

/// How much of a response body or command output a probe keeps for its event (upstream reads
/// at most 10 KiB).
pub(crate) const MAX_OUTPUT: usize = 10 * 1024;

/// Redirects an httpGet probe follows, at most (Go's client default).
const MAX_REDIRECTS: usize = 10;

/// The verdict of one probe run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Passed.
    Success,
    /// Passed, with something worth an event (a redirect to another host).
    Warning(String),
    /// Failed, with why.
    Failure(String),
}

/// A probe that could not run (the runtime failed the exec): no verdict, nothing is counted.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ProbeError(pub(crate) String);

/// `exec`: the command in the container; exit code 0 passes, a timeout fails.
pub(crate) async fn exec<R: Runtime>(
    runtime: &R,
    container_id: &str,
    action: &ExecAction,
    timeout: Duration,
) -> Result<Verdict, ProbeError> {
    let command = action.command.clone().unwrap_or_default();
    let started = Instant::now();
    // The runtime enforces the timeout; this bound only guards against one that does not.
    let guard = timeout + Duration::from_secs(1);
    match tokio::time::timeout(guard, runtime.exec_sync(container_id, &command, timeout)).await {
        Err(_) => Ok(Verdict::Failure(format!("command {command:?} timed out"))),
        Ok(Err(_)) if started.elapsed() >= timeout => Ok(Verdict::Failure(format!("command {command:?} timed out"))),
        Ok(Err(err)) => Err(ProbeError(kubelet_core::ErrorChain(&err).to_string())),
        Ok(Ok(result)) => {
            if result.exit_code == 0 {
                Ok(Verdict::Success)
            } else {
                let mut output = result.stdout;
                output.extend_from_slice(&result.stderr);
                Ok(Verdict::Failure(limited(&output)))
            }
        }
    }
}

/// `tcpSocket`: a connection within the timeout passes.
pub(crate) async fn tcp(host: &str, port: u16, timeout: Duration) -> Verdict {
    let address = join_host_port(host, port);
    match tokio::time::timeout(timeout, TcpStream::connect(address.as_str())).await {
        Ok(Ok(_)) => Verdict::Success,
        Ok(Err(err)) => Verdict::Failure(format!("dial tcp {address}: {err}")),
        Err(_) => Verdict::Failure(format!("dial tcp {address}: i/o timeout")),
    }
}

/// The parts of an `httpGet` probe's request, resolved against the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HttpTarget {
    /// The host to connect to (the pod's IP unless the probe names one).
    pub(crate) host: String,
    /// The port.
    pub(crate) port: u16,
    /// The path and query, starting with `/`.
    pub(crate) path: String,
    /// Extra headers, in order; a `Host` header replaces the request's host.
    pub(crate) headers: Vec<(String, String)>,
    /// HTTPS (`scheme: HTTPS`), without verifying the server's certificate, as upstream.
    pub(crate) tls: bool,
}

impl HttpTarget {
    /// The target of `action` for a container of a pod at `pod_ip`.
    pub(crate) fn of(action: &HTTPGetAction, container: &Container, pod_ip: &str) -> Result<Self, ProbeError> {
        let host = action.host.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| pod_ip.to_owned());
        let port = resolve_port(&action.port, container)?;
        let path = match action.path.as_deref().unwrap_or_default() {
            "" => "/".to_owned(),
            p if p.starts_with('/') => p.to_owned(),
            p => format!("/{p}"),
        };
        let headers = action.http_headers.iter().flatten().map(|h| (h.name.clone(), h.value.clone())).collect();
        let tls = match action.scheme.as_deref().map(str::to_ascii_uppercase).as_deref() {
            None | Some("" | "HTTP") => false,
            Some("HTTPS") => true,
            Some(_) => {
                return Err(ProbeError(format!("unsupported scheme {:?}", action.scheme.as_deref().unwrap_or(""))));
            }
        };
        Ok(HttpTarget { host, port, path, headers, tls })
    }

    fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{}", join_host_port(&self.host, self.port), self.path)
    }
}

/// `httpGet`: a status from 200 to 399 passes; redirects are followed to the same host only
/// (one to another host passes with a warning, as upstream's); the body is read up to 10 KiB.
pub(crate) async fn http(target: &HttpTarget, user_agent: &str, timeout: Duration) -> Verdict {
    let url = target.url();
    match tokio::time::timeout(timeout, http_follow(target.clone(), user_agent)).await {
        Ok(Ok(verdict)) => verdict,
        Ok(Err(err)) => Verdict::Failure(format!("Get {url:?}: {err}")),
        Err(_) => Verdict::Failure(format!(
            "Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        )),
    }
}

async fn http_follow(
    target: HttpTarget,
    user_agent: &str,
) -> Result<Verdict, Box<dyn std::error::Error + Send + Sync>> {
    Ok(match follow(target, user_agent).await? {
        Answer::Final(status) if status.as_u16() >= 200 && status.as_u16() < 400 => Verdict::Success,
        Answer::Final(status) => Verdict::Failure(format!("HTTP probe failed with statuscode: {}", status.as_u16())),
        Answer::Elsewhere(body) => {
            Verdict::Warning(format!("Probe terminated redirects, Response body: {}", limited(&body)))
        }
    })
}

/// `httpGet` for a lifecycle hook: any answer passes (upstream's hook does not check the status),
/// after redirects on the same host; only a request that gets no answer fails.
pub(crate) async fn http_answer(
    target: &HttpTarget,
    user_agent: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    follow(target.clone(), user_agent).await.map(drop)
}

/// Where a GET ended.
enum Answer {
    /// A status that is not a redirect, or a redirect without a location.
    Final(StatusCode),
    /// A redirect to another host, not followed; the body of the redirect.
    Elsewhere(Vec<u8>),
}

/// GETs `target`, following redirects on the same host, at most [`MAX_REDIRECTS`].
async fn follow(mut target: HttpTarget, user_agent: &str) -> Result<Answer, Box<dyn std::error::Error + Send + Sync>> {
    for _ in 0..=MAX_REDIRECTS {
        let (status, location, body) = http_once(&target, user_agent).await?;
        if status.is_redirection()
            && let Some(location) = location
        {
            match redirect(&target, &location) {
                Some(next) => {
                    target = next;
                    continue;
                }
                None => return Ok(Answer::Elsewhere(body)),
            }
        }
        return Ok(Answer::Final(status));
    }
    Err("stopped after 10 redirects".into())
}

/// One GET; the status, the `Location` header and up to [`MAX_OUTPUT`] bytes of the body.
async fn http_once(
    target: &HttpTarget,
    user_agent: &str,
) -> Result<(StatusCode, Option<String>, Vec<u8>), Box<dyn std::error::Error + Send + Sync>> {
    let stream = TcpStream::connect(join_host_port(&target.host, target.port)).await?;
    if target.tls {
        let stream = crate::tls::connect(stream, &target.host).await?;
        return http_over(stream, target, user_agent).await;
    }
    http_over(stream, target, user_agent).await
}

/// One GET over `stream`, as [`http_once`] says.
async fn http_over<S>(
    stream: S,
    target: &HttpTarget,
    user_agent: &str,
) -> Result<(StatusCode, Option<String>, Vec<u8>), Box<dyn std::error::Error + Send + Sync>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let connection = tokio::spawn(connection);
    let mut request = Request::get(target.path.as_str())
        .header(header::HOST, join_host_port(&target.host, target.port))
        .header(header::USER_AGENT, user_agent)
        .header(header::ACCEPT, "*/*");
    for (name, value) in &target.headers {
        let headers = request.headers_mut().ok_or("invalid probe request")?;
        let name = header::HeaderName::from_bytes(name.as_bytes())?;
        let value = header::HeaderValue::from_str(value)?;
        if name == header::HOST || name == header::USER_AGENT || name == header::ACCEPT {
            headers.insert(name, value);
        } else {
            headers.append(name, value);
        }
    }
    let response = sender.send_request(request.body(Empty::<Bytes>::new())?).await?;
    let status = response.status();
    let location = response.headers().get(header::LOCATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let mut body = response.into_body();
    let mut kept = Vec::new();
    while kept.len() < MAX_OUTPUT {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    kept.extend_from_slice(&data[..data.len().min(MAX_OUTPUT - kept.len())]);
                }
            }
            Some(Err(_)) | None => break,
        }
    }
    connection.abort();
    Ok((status, location, kept))
}

/// Where a redirect from `target` to `location` leads, when it stays on the same host.
fn redirect(target: &HttpTarget, location: &str) -> Option<HttpTarget> {
    if location.starts_with('/') {
        return Some(HttpTarget { path: location.to_owned(), ..target.clone() });
    }
    let (rest, tls, default_port) = match (location.strip_prefix("http://"), location.strip_prefix("https://")) {
        (Some(rest), _) => (rest, false, 80),
        (_, Some(rest)) => (rest, true, 443),
        _ => return None,
    };
    let (authority, path) = rest.find('/').map_or((rest, "/"), |i| (&rest[..i], &rest[i..]));
    let (host, port) = split_host_port(authority, default_port)?;
    (host == target.host).then(|| HttpTarget { host, port, path: path.to_owned(), tls, ..target.clone() })
}

fn split_host_port(authority: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':').map_or(Some(default_port), |p| p.parse().ok())?;
        return Some((host.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None => Some((authority.to_owned(), default_port)),
    }
}

/// `grpc`: the standard health service (`grpc.health.v1.Health/Check`) answers SERVING.
pub(crate) async fn grpc(host: &str, action: &GRPCAction, timeout: Duration) -> Verdict {
    let service = action.service.clone().unwrap_or_default();
    let port = u16::try_from(action.port).unwrap_or(0);
    let address = join_host_port(host, port);
    match tokio::time::timeout(timeout, crate::grpc::check(&address, &service)).await {
        Err(_) => Verdict::Failure(format!("timeout: health rpc did not complete within {timeout:?}")),
        Ok(Err(crate::grpc::CheckError::Connect(err))) => {
            Verdict::Failure(format!("timeout: failed to connect service {address:?} within {timeout:?}: {err}"))
        }
        Ok(Err(crate::grpc::CheckError::Unimplemented(message))) => Verdict::Failure(format!(
            "this server does not implement the grpc health protocol (grpc.health.v1.Health): {message}"
        )),
        Ok(Err(crate::grpc::CheckError::Rpc(code, message))) => {
            Verdict::Failure(format!("health rpc probe failed: rpc error: code = {code:?} desc = {message}"))
        }
        Ok(Ok(status)) if status == crate::grpc::SERVING => Verdict::Success,
        Ok(Ok(status)) => {
            Verdict::Failure(format!("service unhealthy (responded with {:?})", crate::grpc::status_name(status)))
        }
    }
}

/// A probe's port: a number, or the name of one of the container's ports.
pub(crate) fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, ProbeError> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => match s.parse::<i32>() {
            Ok(n) => n,
            Err(_) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(s.as_str()))
                .map(|p| p.container_port)
                .ok_or_else(|| ProbeError(format!("couldn't find port: {s:?} in {:?}", container.name)))?,
        },
    };
    u16::try_from(number).ok().filter(|n| *n > 0).ok_or_else(|| ProbeError(format!("invalid port number: {number}")))
}

/// `host:port`, with IPv6 addresses in brackets.
pub(crate) fn join_host_port(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{host}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

/// Output for an event: at most [`MAX_OUTPUT`] bytes, lossy UTF-8, trimmed.
pub(crate) fn limited(output: &[u8]) -> String {
    String::from_utf8_lossy(&output[..output.len().min(MAX_OUTPUT)]).trim().to_owned()
}

#[cfg(test)]
mod tests;
