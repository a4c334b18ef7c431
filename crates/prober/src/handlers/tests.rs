//! The probe actions against small servers on loopback, and exec against the fake runtime.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ContainerPort, HTTPHeader};
use kubelet_core::{
    Backoff, PodUid,
    fake::FakeRuntime,
    runtime::{ExecResult, PodStatus},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use super::*;

const TIMEOUT: Duration = Duration::from_secs(2);

/// An HTTP server on loopback answering every request with `respond(path)` (a status line and
/// headers, without the blank line); it keeps each request's head.
async fn server(respond: fn(&str, u16) -> String) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            let mut buf = vec![0; 4096];
            let n = stream.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).into_owned();
            let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
            seen.lock().unwrap().push(head);
            let body = "b".repeat(20_000);
            let response = format!("{}\r\ncontent-length: {}\r\n\r\n{body}", respond(&path, port), body.len());
            let _ = stream.write_all(response.as_bytes()).await;
        }
    });
    (port, requests)
}

fn target(port: u16, path: &str) -> HttpTarget {
    HttpTarget { host: "127.0.0.1".into(), port, path: path.into(), headers: Vec::new(), tls: false }
}

#[tokio::test]
async fn http_passes_on_2xx_and_3xx_and_fails_with_the_status_otherwise() {
    let (port, requests) = server(|path, _| match path {
        "/ok" => "HTTP/1.1 200 OK".into(),
        "/notmodified" => "HTTP/1.1 304 Not Modified".into(),
        _ => "HTTP/1.1 500 Internal Server Error".into(),
    })
    .await;
    let mut with_headers = target(port, "/ok");
    with_headers.headers = vec![("X-Probe".into(), "1".into()), ("Host".into(), "example.test".into())];
    assert_eq!(http(&with_headers, "kube-probe/1.36", TIMEOUT).await, Verdict::Success);
    let head = requests.lock().unwrap()[0].to_lowercase();
    assert!(head.starts_with("get /ok http/1.1"), "{head}");
    for line in ["user-agent: kube-probe/1.36", "accept: */*", "x-probe: 1", "host: example.test"] {
        assert!(head.contains(line), "{line} in {head}");
    }
    assert_eq!(http(&target(port, "/notmodified"), "ua", TIMEOUT).await, Verdict::Success);
    assert_eq!(
        http(&target(port, "/fail"), "ua", TIMEOUT).await,
        Verdict::Failure("HTTP probe failed with statuscode: 500".into())
    );
}

#[tokio::test]
async fn http_follows_redirects_on_the_same_host_only() {
    let (port, requests) = server(|path, port| match path {
        "/start" => "HTTP/1.1 302 Found\r\nlocation: /middle".into(),
        "/middle" => format!("HTTP/1.1 301 Moved\r\nlocation: http://127.0.0.1:{port}/end"),
        "/end" => "HTTP/1.1 200 OK".into(),
        "/away" => "HTTP/1.1 302 Found\r\nlocation: http://elsewhere.test/".into(),
        _ => "HTTP/1.1 302 Found\r\nlocation: /loop".into(),
    })
    .await;
    assert_eq!(http(&target(port, "/start"), "ua", TIMEOUT).await, Verdict::Success);
    assert_eq!(requests.lock().unwrap().len(), 3);
    let away = http(&target(port, "/away"), "ua", TIMEOUT).await;
    let Verdict::Warning(message) = away else { panic!("{away:?}") };
    assert!(message.starts_with("Probe terminated redirects, Response body: bbbb"), "{message}");
    assert_eq!(message.len(), "Probe terminated redirects, Response body: ".len() + MAX_OUTPUT, "body kept to 10 KiB");
    let looping = http(&target(port, "/loop"), "ua", TIMEOUT).await;
    assert!(matches!(&looping, Verdict::Failure(m) if m.contains("stopped after 10 redirects")), "{looping:?}");
}

#[tokio::test]
async fn http_and_tcp_fail_on_a_closed_port_and_a_silent_server() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let refused = http(&target(closed, "/"), "ua", TIMEOUT).await;
    assert!(
        matches!(&refused, Verdict::Failure(m) if m.starts_with(&format!("Get \"http://127.0.0.1:{closed}/\": "))),
        "{refused:?}"
    );
    let tcp_refused = tcp("127.0.0.1", closed, TIMEOUT).await;
    assert!(
        matches!(&tcp_refused, Verdict::Failure(m) if m.starts_with(&format!("dial tcp 127.0.0.1:{closed}: "))),
        "{tcp_refused:?}"
    );
    // A server that accepts and never answers: the timeout fails the probe.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    assert_eq!(tcp("127.0.0.1", port, TIMEOUT).await, Verdict::Success, "tcpSocket only connects");
    let hung = http(&target(port, "/"), "ua", Duration::from_millis(200)).await;
    assert!(matches!(&hung, Verdict::Failure(m) if m.contains("context deadline exceeded")), "{hung:?}");
    drop(silent);
}

#[tokio::test]
async fn grpc_fails_clearly_without_a_server() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let action = GRPCAction { port: i32::from(closed), service: None };
    let verdict = grpc("127.0.0.1", &action, TIMEOUT).await;
    assert!(
        matches!(&verdict, Verdict::Failure(m) if m.starts_with(&format!("timeout: failed to connect service \"127.0.0.1:{closed}\""))),
        "{verdict:?}"
    );
}

#[test]
fn targets_resolve_named_ports_default_paths_and_the_pod_ip() {
    let container = Container {
        name: "web".into(),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: 8080,
            ..ContainerPort::default()
        }]),
        ..Container::default()
    };
    let action = HTTPGetAction {
        port: IntOrString::String("http".into()),
        path: Some("healthz".into()),
        http_headers: Some(vec![HTTPHeader { name: "X-A".into(), value: "b".into() }]),
        ..HTTPGetAction::default()
    };
    let t = HttpTarget::of(&action, &container, "10.1.0.5").unwrap();
    assert_eq!(
        t,
        HttpTarget {
            host: "10.1.0.5".into(),
            port: 8080,
            path: "/healthz".into(),
            headers: vec![("X-A".into(), "b".into())],
            tls: false,
        }
    );
    assert_eq!(t.url(), "http://10.1.0.5:8080/healthz");
    let by_number = HTTPGetAction {
        port: IntOrString::String("81".into()),
        host: Some("fd00::1".into()),
        ..HTTPGetAction::default()
    };
    let t = HttpTarget::of(&by_number, &container, "10.1.0.5").unwrap();
    assert_eq!(t.url(), "http://[fd00::1]:81/");
    let https = HTTPGetAction { scheme: Some("HTTPS".into()), ..by_number.clone() };
    assert_eq!(HttpTarget::of(&https, &container, "10.1.0.5").unwrap().url(), "https://[fd00::1]:81/");
    let ftp = HTTPGetAction { scheme: Some("FTP".into()), ..by_number.clone() };
    assert_eq!(HttpTarget::of(&ftp, &container, "ip").unwrap_err().0, "unsupported scheme \"FTP\"");
    let missing = HTTPGetAction { port: IntOrString::String("admin".into()), ..HTTPGetAction::default() };
    assert_eq!(HttpTarget::of(&missing, &container, "ip").unwrap_err().0, "couldn't find port: \"admin\" in \"web\"");
    assert!(resolve_port(&IntOrString::Int(70000), &container).is_err());
}

#[test]
fn redirects_keep_to_the_host() {
    let from = target(80, "/a");
    assert_eq!(redirect(&from, "/b").map(|t| t.path), Some("/b".into()));
    assert_eq!(redirect(&from, "http://127.0.0.1:81/c").map(|t| (t.port, t.path)), Some((81, "/c".into())));
    assert_eq!(redirect(&from, "http://127.0.0.1").map(|t| (t.port, t.path)), Some((80, "/".into())));
    assert_eq!(redirect(&from, "http://other/"), None);
    let to_https = redirect(&from, "https://127.0.0.1/s").unwrap();
    assert_eq!(
        (to_https.tls, to_https.port, to_https.path.as_str()),
        (true, 443, "/s"),
        "the host decides, not the scheme"
    );
}

#[tokio::test(start_paused = true)]
async fn exec_passes_on_exit_zero_and_fails_with_the_output() {
    let runtime = FakeRuntime::new();
    let pod = kubelet_core::testing::pod("p1", &["app"]);
    let status = PodStatus::new(PodUid::new("p1"), "p1", "default");
    assert!(
        !runtime
            .sync_pod(&pod, &status, &Backoff::default(), &kubelet_core::ProbeResults::new(), &Default::default())
            .await
            .is_err()
    );
    let status = runtime.get_pod_status(&PodUid::new("p1"), "p1", "default").await.unwrap();
    let id = status.container_statuses[0].id.clone();
    let action = ExecAction { command: Some(vec!["check".into()]) };
    assert_eq!(exec(&runtime, &id, &action, TIMEOUT).await.unwrap(), Verdict::Success);
    let mut failed = ExecResult::default();
    failed.exit_code = 2;
    failed.stdout = b"not yet\n".to_vec();
    failed.stderr = b"  \n".to_vec();
    runtime.set_exec_result("app", failed);
    assert_eq!(exec(&runtime, &id, &action, TIMEOUT).await.unwrap(), Verdict::Failure("not yet".into()));
    let gone = exec(&runtime, "nope", &action, TIMEOUT).await.unwrap_err();
    assert!(gone.0.contains("not found"), "a runtime error is no verdict: {gone}");
}

/// An HTTPS server on loopback (a self-signed certificate no authority vouches for) answering
/// every request 200.
async fn tls_server() -> u16 {
    let cert = include_bytes!("testdata/cert.der").to_vec();
    let key = include_bytes!("testdata/key.der").to_vec();
    tls_server_with(cert, key, rustls::DEFAULT_VERSIONS).await
}

/// An HTTPS server on loopback with the certificate `cert` (DER) and its PKCS #8 `key`, speaking
/// `versions`, answering every request 200.
async fn tls_server_with(cert: Vec<u8>, key: Vec<u8>, versions: &[&'static rustls::SupportedProtocolVersion]) -> u16 {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let cert = CertificateDer::from(cert);
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // Served as it is: `with_single_cert` would refuse a version 1 certificate.
    let signing_key = provider.key_provider.load_private_key(key).unwrap();
    let certified = Arc::new(rustls::sign::CertifiedKey::new(vec![cert], signing_key));
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(OneCertificate(certified)));
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let Ok(mut stream) = acceptor.accept(stream).await else { continue };
            let mut buf = vec![0; 4096];
            let _ = stream.read(&mut buf).await;
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
            let _ = stream.shutdown().await;
        }
    });
    port
}

/// Serves one certificate to every client.
#[derive(Debug)]
struct OneCertificate(Arc<rustls::sign::CertifiedKey>);

impl rustls::server::ResolvesServerCert for OneCertificate {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// A version 1 certificate, as `openssl req -x509` makes without extensions (kubeadm's
/// control-plane stand-ins serve one): Go's TLS client takes it, so a probe must too.
#[tokio::test]
async fn https_probes_pass_with_a_version_1_certificate_over_tls_1_2_and_1_3() {
    let cert = include_bytes!("testdata/v1-cert.der").to_vec();
    let key = include_bytes!("testdata/v1-key.der").to_vec();
    for versions in [&[&rustls::version::TLS13][..], &[&rustls::version::TLS12][..]] {
        let port = tls_server_with(cert.clone(), key.clone(), versions).await;
        let https = HttpTarget { tls: true, ..target(port, "/") };
        assert_eq!(http(&https, "kube-probe/1.36", TIMEOUT).await, Verdict::Success, "{versions:?}");
    }
    // The handshake is still signed with the certificate's key: another key fails it.
    let other_key = include_bytes!("testdata/key.der").to_vec();
    let port = tls_server_with(cert, other_key, rustls::DEFAULT_VERSIONS).await;
    let https = HttpTarget { tls: true, ..target(port, "/") };
    assert!(matches!(http(&https, "kube-probe/1.36", TIMEOUT).await, Verdict::Failure(_)));
}

#[tokio::test]
async fn https_probes_pass_without_checking_the_certificate_as_upstreams() {
    let port = tls_server().await;
    let https = HttpTarget { tls: true, ..target(port, "/") };
    assert_eq!(http(&https, "kube-probe/1.36", TIMEOUT).await, Verdict::Success);
    // The same server spoken to in plain HTTP answers nothing a probe can pass.
    assert!(matches!(http(&target(port, "/"), "kube-probe/1.36", TIMEOUT).await, Verdict::Failure(_)));
    // And HTTPS to a plain HTTP server fails in the handshake.
    let (plain, _) = server(|_, _| "HTTP/1.1 200 OK".to_owned()).await;
    let Verdict::Failure(why) = http(&HttpTarget { tls: true, ..target(plain, "/") }, "kube-probe/1.36", TIMEOUT).await
    else {
        panic!("HTTPS to a plain server passed");
    };
    assert!(why.starts_with("Get \"https://127.0.0.1:"), "{why}");
}
