//! HTTP source tests against a real local HTTP server (axum on 127.0.0.1).

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, extract::State, http::HeaderMap, response::IntoResponse, routing::get};
use tokio::sync::mpsc;

use super::*;
use kubelet_core::{Operation, PodUpdate, Source, events::RingRecorder};

use crate::PodConfig;

#[derive(Clone)]
struct Reply {
    status: u16,
    body: String,
    delay: Duration,
}

#[derive(Clone)]
struct Server {
    reply: Arc<Mutex<Reply>>,
    headers: Arc<Mutex<Vec<HeaderMap>>>,
    addr: SocketAddr,
}

async fn answer(State(server): State<Server>, headers: HeaderMap) -> impl IntoResponse {
    server.headers.lock().unwrap().push(headers);
    let reply = server.reply.lock().unwrap().clone();
    tokio::time::sleep(reply.delay).await;
    (axum::http::StatusCode::from_u16(reply.status).unwrap(), reply.body)
}

impl Server {
    async fn start() -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = Server {
            reply: Arc::new(Mutex::new(Reply { status: 200, body: String::new(), delay: Duration::ZERO })),
            headers: Arc::default(),
            addr,
        };
        let app = Router::new().route("/pods", get(answer)).with_state(server.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        server
    }

    fn set(&self, status: u16, body: &str) {
        let mut reply = self.reply.lock().unwrap();
        reply.status = status;
        reply.body = body.to_owned();
    }

    fn url(&self) -> String {
        format!("http://{}/pods", self.addr)
    }
}

const POD: &str =
    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox:1\n";
const LIST: &str = r#"{"apiVersion":"v1","kind":"PodList","items":[
  {"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"i"}]}},
  {"metadata":{"name":"b"},"spec":{"containers":[{"name":"c","image":"i"}]}}]}"#;

fn source(server: &Server, ring: &Arc<RingRecorder>) -> (HttpSource, mpsc::Receiver<PodUpdate>) {
    let (config, rx) = PodConfig::new(ring.clone());
    let cfg = Config::new(server.url(), "node-1").header("X-Token", "secret").timeout(Duration::from_millis(300));
    (HttpSource::new(cfg, config.source(Source::Http), ring.clone()), rx)
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect()
}

#[tokio::test]
async fn a_single_pod_or_a_pod_list_in_yaml_or_json() {
    let server = Server::start().await;
    let ring = Arc::new(RingRecorder::default());
    let (mut src, _rx) = source(&server, &ring);
    server.set(200, POD);
    let pods = src.fetch().await.unwrap().unwrap();
    assert_eq!(names(&pods), ["web-node-1"]);
    assert!(pods[0].spec.as_ref().unwrap().tolerations.is_none(), "no file toleration for URL pods");
    assert_eq!(server.headers.lock().unwrap()[0]["x-token"], "secret", "configured headers are sent");
    assert!(src.fetch().await.unwrap().is_none(), "an unchanged body is not decoded again");
    server.set(200, LIST);
    assert_eq!(names(&src.fetch().await.unwrap().unwrap()), ["a-node-1", "b-node-1"]);
    server.set(200, "");
    assert_eq!(src.fetch().await.unwrap().unwrap().len(), 0, "an empty body is an empty snapshot");
}

#[tokio::test]
async fn errors_name_the_url_and_what_failed() {
    let server = Server::start().await;
    let ring = Arc::new(RingRecorder::default());
    let (mut src, _rx) = source(&server, &ring);
    server.set(404, "not here");
    let err = src.fetch().await.unwrap_err();
    assert!(matches!(err, FetchError::Status { status, .. } if status == StatusCode::NOT_FOUND), "{err}");
    assert_eq!(err.to_string(), format!("{}: 404 Not Found", server.url()));
    server.set(500, POD);
    assert!(
        matches!(src.fetch().await.unwrap_err(), FetchError::Status { status, .. } if status == StatusCode::INTERNAL_SERVER_ERROR)
    );
    server.set(200, "kind: Service\nmetadata: {name: s}\n");
    let err = src.fetch().await.unwrap_err();
    assert!(matches!(err, FetchError::Manifest(ManifestError::WrongKind { .. })), "{err}");
    assert!(err.to_string().starts_with(&server.url()), "{err}");
    server.reply.lock().unwrap().delay = Duration::from_secs(5);
    server.set(200, POD);
    assert!(matches!(src.fetch().await.unwrap_err(), FetchError::Timeout { .. }));
}

#[tokio::test]
async fn unreachable_and_unsupported_urls_fail_cleanly() {
    let ring = Arc::new(RingRecorder::default());
    let (config, _rx) = PodConfig::new(ring.clone());
    // A port nobody listens on: bind, note it, close.
    let addr = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let mut src =
        HttpSource::new(Config::new(format!("http://{addr}/pods"), "n"), config.source(Source::Http), ring.clone());
    assert!(matches!(src.fetch().await.unwrap_err(), FetchError::Transport { .. }));
    let mut src =
        HttpSource::new(Config::new("https://127.0.0.1/pods", "n"), config.source(Source::Http), ring.clone());
    assert!(matches!(src.fetch().await.unwrap_err(), FetchError::InvalidRequest { .. }));
}

async fn next(rx: &mut mpsc::Receiver<PodUpdate>) -> PodUpdate {
    tokio::time::timeout(Duration::from_secs(2), rx.recv()).await.expect("an update").unwrap()
}

#[tokio::test]
async fn run_keeps_the_last_good_snapshot_through_errors_and_follows_changes() {
    let server = Server::start().await;
    let ring = Arc::new(RingRecorder::default());
    let (config, mut rx) = PodConfig::new(ring.clone());
    let cfg = Config::new(server.url(), "node-1").check_frequency(Duration::from_millis(100));
    let src = HttpSource::new(cfg, config.source(Source::Http), ring.clone());
    let cancel = CancellationToken::new();
    server.set(200, POD);
    let task = tokio::spawn(src.run(cancel.clone()));
    let update = next(&mut rx).await;
    assert_eq!((update.op, update.pods.len()), (Operation::Add, 1));

    server.set(500, "oops");
    // At least three failed polls (100 ms apart), so "reported once" is about a repeated error.
    let polls = server.headers.lock().unwrap().len();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.headers.lock().unwrap().len() < polls + 3 {
        assert!(tokio::time::Instant::now() < deadline, "the source stopped polling");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(rx.try_recv().is_err(), "errors change nothing");
    assert_eq!(config.pods_of(Source::Http).await.len(), 1, "the last good snapshot stays");
    let warnings: Vec<_> = ring.events().into_iter().filter(|e| e.message.contains("500")).collect();
    assert_eq!(warnings.len(), 1, "a repeated error is reported once");

    server.set(200, LIST);
    let update = next(&mut rx).await;
    assert_eq!(update.op, Operation::Remove);
    let update = next(&mut rx).await;
    assert_eq!((update.op, update.pods.len()), (Operation::Add, 2));
    server.set(200, "");
    assert_eq!(next(&mut rx).await.op, Operation::Remove);
    cancel.cancel();
    task.await.unwrap();
}
