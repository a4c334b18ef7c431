//! TLS bootstrap (upstream `pkg/kubelet/certificate/bootstrap`): a node that has only a
//! bootstrap kubeconfig (`--bootstrap-kubeconfig`, a bootstrap token as kubeadm writes it) asks
//! the API server for its client certificate.
//!
//! [`load_client_cert`] does what upstream's `LoadClientCert` does:
//!
//! - a kubeconfig at `--kubeconfig` whose client certificate has not expired is used as it is;
//! - otherwise the node's key is the one of the last certificate in `--cert-dir`, or
//!   `kubelet-client.key.tmp` there (kept across attempts until a certificate is issued), or a new
//!   ECDSA P-256 key;
//! - a `kubernetes.io/kube-apiserver-client-kubelet` CertificateSigningRequest for
//!   `system:node:<node>` in `system:nodes` is created with the bootstrap credentials, named after
//!   a digest of its key, subject and usages (so that a restart finds its own request again), and
//!   watched until it is issued, denied or failed (an hour at most);
//! - the certificate and key go to `kubelet-client-<time>.pem`, which `kubelet-client-current.pem`
//!   links to, and the kubeconfig is written with the bootstrap kubeconfig's cluster and that file
//!   as its credentials.

use std::{
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use base64::Engine;
use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{
    certificate::{CLIENT, NodeRequest, Renewal, keep_renewed, store},
    credentials::NodeCredentials,
};

/// The key waiting for its certificate, in `--cert-dir`.
const PENDING_KEY: &str = "kubelet-client.key.tmp";
/// How long the API server is waited for before the request is tried anyway (upstream's minute).
const WAIT_FOR_SERVER: Duration = Duration::from_secs(60);

/// Why the node has no certificate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// A kubeconfig could not be read or used.
    #[error("cannot use the kubeconfig {}", path.display())]
    Kubeconfig {
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A file in `--cert-dir`, or the kubeconfig, could not be read or written.
    #[error("cannot write {}", path.display())]
    File {
        /// Its path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The key or the request could not be made.
    #[error("cannot make the node's key or certificate signing request")]
    Key(#[source] rcgen::Error),
    /// The API server refused or failed a request.
    #[error("{what}")]
    Api {
        /// What was asked.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A request of that name exists for another key, subject, signer or usage.
    #[error("the certificate signing request {name} exists and does not ask for this node's certificate")]
    NotOurs {
        /// The request's name.
        name: String,
    },
    /// The request was denied.
    #[error("the certificate signing request {name} was denied: {reason}")]
    Denied {
        /// The request's name.
        name: String,
        /// The condition's reason and message.
        reason: String,
    },
    /// The signer could not issue the certificate.
    #[error("the certificate signing request {name} failed: {reason}")]
    Failed {
        /// The request's name.
        name: String,
        /// The condition's reason and message.
        reason: String,
    },
    /// The request was deleted before a certificate was issued.
    #[error("the certificate signing request {name} was deleted before a certificate was issued")]
    Deleted {
        /// The request's name.
        name: String,
    },
    /// No certificate came within the hour.
    #[error("no certificate was issued for the certificate signing request {name} within an hour")]
    TimedOut {
        /// The request's name.
        name: String,
    },
    /// What was issued is not a certificate for the node's key.
    #[error("the certificate issued for the certificate signing request {name} is not a certificate of the node's key")]
    NotIssuedForOurKey {
        /// The request's name.
        name: String,
    },
}

/// What [`load_client_cert`] found or did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Bootstrap {
    /// The kubeconfig's client certificate is still valid: nothing was asked.
    StillValid,
    /// A certificate was issued for this request, and the kubeconfig written.
    Issued {
        /// The CertificateSigningRequest's name.
        request: String,
    },
}

/// Makes sure `kubeconfig` holds valid client credentials of node `node`, asking for a client
/// certificate with the credentials of `bootstrap` when it does not (see the [module](self)).
pub async fn load_client_cert(
    kubeconfig: &Path,
    bootstrap: &Path,
    cert_dir: &Path,
    node: &str,
) -> Result<Bootstrap, BootstrapError> {
    if still_valid(kubeconfig, SystemTime::now())? {
        info!(path = %kubeconfig.display(), "the kubeconfig's client certificate is still valid: no bootstrap");
        return Ok(Bootstrap::StillValid);
    }
    info!(bootstrap = %bootstrap.display(), "asking for a client certificate with the bootstrap kubeconfig");
    let bootstrap_config = read_kubeconfig(bootstrap)?;
    let client = client_of(&bootstrap_config, bootstrap).await?;
    create_dir(cert_dir)?;
    let key = node_key(cert_dir)?;
    wait_for_server(&client).await;
    let request = NodeRequest::new(&key, node, CLIENT, &[], &[])?.named_by_digest(node);
    let (request, certificate) = request.issue(&client).await?;
    let current = store(cert_dir, CLIENT, &certificate, &key.serialize_pem())?;
    if let Err(err) = std::fs::remove_file(cert_dir.join(PENDING_KEY))
        && err.kind() != std::io::ErrorKind::NotFound
    {
        warn!(error = %err, "cannot remove the pending key in --cert-dir");
    }
    write_kubeconfig(kubeconfig, &bootstrap_config, bootstrap, &current)?;
    info!(%request, path = %kubeconfig.display(), "client certificate issued; kubeconfig written");
    Ok(Bootstrap::Issued { request })
}

/// Rotates the node's client certificate (`rotateCertificates`) until `cancel`, as
/// [`keep_renewed`] does, with the node's own credentials: the certificate the clients use now
/// is `credentials`'s, and each new one is stored as `kubelet-client-current.pem` in `cert_dir`
/// and `credentials` reloaded, so the clients use it from their next request on.
pub async fn rotate_client_certificate(
    client: Client,
    credentials: NodeCredentials,
    cert_dir: PathBuf,
    node: String,
    cancel: CancellationToken,
) {
    let renewal = Renewal::new(CLIENT, &cert_dir, &node);
    let current = || credentials.certificate_pem();
    let stored = |_: &Path| credentials.reload();
    keep_renewed(client, renewal, current, stored, cancel).await;
}

/// How often an expired client certificate is looked at again, and the API server asked whether
/// it answers (upstream checks every 10 s).
const EXPIRED_CHECK: Duration = Duration::from_secs(10);

/// Waits until the node's client certificate (`credentials`'s) has expired with no renewed one in
/// its place and the API server answers the node (upstream's `updateTransport` with `exitAfter`,
/// under `rotateCertificates`): then the node can no longer renew it, and the caller stops, so
/// that its supervisor starts it again into TLS bootstrap. Nothing runs before the expiry; after
/// it, the server is asked every 10 s (`GET /version`), and a server that does not answer (a
/// network failure, a 5xx) is waited for, as upstream does, with an error each time. `None` when
/// `cancel` ends the wait.
pub async fn wait_for_unrenewable_expiry(
    client: Client,
    credentials: NodeCredentials,
    cancel: CancellationToken,
) -> Option<String> {
    loop {
        let not_after = credentials.certificate_pem().and_then(|pem| crate::certificate::validity(&pem));
        let now = SystemTime::now();
        match not_after.map(|(_, not_after)| not_after) {
            Some(not_after) if not_after > now => {
                let until = not_after.duration_since(now).unwrap_or_default();
                cancel.run_until_cancelled(tokio::time::sleep(until)).await?;
                continue;
            }
            // No certificate to read: the renewal writes one, or the credentials are not a file's.
            None => {
                cancel.run_until_cancelled(tokio::time::sleep(EXPIRED_CHECK)).await?;
                continue;
            }
            Some(_) => {}
        }
        match cancel.run_until_cancelled(client.apiserver_version()).await? {
            Ok(_) => return Some(EXPIRED_AND_ANSWERED.to_owned()),
            Err(kube::Error::Api(status)) if status.code < 500 => return Some(EXPIRED_AND_ANSWERED.to_owned()),
            Err(err) => warn!(
                error = %kubelet_core::ErrorChain(&err),
                "the currently active client certificate has expired, but the server is not responsive; a restart may be \
                 necessary to retrieve new initial credentials"
            ),
        }
        cancel.run_until_cancelled(tokio::time::sleep(EXPIRED_CHECK)).await?;
    }
}

/// Why [`wait_for_unrenewable_expiry`] ends the node, in upstream's words.
pub const EXPIRED_AND_ANSWERED: &str =
    "the currently active client certificate has expired and the server is responsive, exiting";

/// Whether `kubeconfig` exists and its current user's client certificates are all valid at
/// `now` (upstream `isClientConfigStillValid`): one that cannot be read, has no certificate or
/// has an expired one is bootstrapped again; only an error other than its absence stops.
pub fn still_valid(kubeconfig: &Path, now: SystemTime) -> Result<bool, BootstrapError> {
    match std::fs::metadata(kubeconfig) {
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => return Err(BootstrapError::File { path: kubeconfig.to_owned(), source }),
    }
    match client_certificates(kubeconfig) {
        Ok(certificates) if certificates.is_empty() => {
            warn!(path = %kubeconfig.display(), "the kubeconfig has no client certificate: bootstrapping");
            Ok(false)
        }
        Ok(certificates) => Ok(certificates.iter().all(|not_after| *not_after > now)),
        Err(why) => {
            warn!(path = %kubeconfig.display(), %why, "cannot read the kubeconfig's client certificate: bootstrapping");
            Ok(false)
        }
    }
}

/// The ends of validity of the client certificates of `kubeconfig`'s current user.
fn client_certificates(kubeconfig: &Path) -> Result<Vec<SystemTime>, String> {
    let config = Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let user = current_user(&config).ok_or("no current user")?;
    let pem = match (&user.client_certificate_data, &user.client_certificate) {
        (Some(data), _) => base64::engine::general_purpose::STANDARD.decode(data).map_err(|e| e.to_string())?,
        (None, Some(path)) => {
            let path = relative_to(kubeconfig, path);
            std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?
        }
        (None, None) => return Ok(Vec::new()),
    };
    certificate_ends(&pem)
}

/// The current context's user of `config`.
pub(crate) fn current_user(config: &Kubeconfig) -> Option<&kube::config::AuthInfo> {
    let context_name = config.current_context.as_deref()?;
    let context = config.contexts.iter().find(|c| c.name == context_name)?.context.as_ref()?;
    config.auth_infos.iter().find(|a| a.name == context.user.as_deref().unwrap_or_default())?.auth_info.as_ref()
}

/// The current context's cluster of `config`.
fn current_cluster(config: &Kubeconfig) -> Option<&kube::config::Cluster> {
    let context_name = config.current_context.as_deref()?;
    let context = config.contexts.iter().find(|c| c.name == context_name)?.context.as_ref()?;
    config.clusters.iter().find(|c| c.name == context.cluster)?.cluster.as_ref()
}

/// A path of a kubeconfig, which is relative to the kubeconfig's directory unless absolute.
fn relative_to(kubeconfig: &Path, path: &str) -> PathBuf {
    kubeconfig.parent().unwrap_or(Path::new("/")).join(path)
}

/// The ends of validity of the certificates in `pem`.
fn certificate_ends(pem: &[u8]) -> Result<Vec<SystemTime>, String> {
    let mut ends = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|e| e.to_string())?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let certificate = block.parse_x509().map_err(|e| e.to_string())?;
        let seconds = u64::try_from(certificate.validity().not_after.timestamp()).unwrap_or(0);
        ends.push(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds));
    }
    Ok(ends)
}

fn read_kubeconfig(path: &Path) -> Result<Kubeconfig, BootstrapError> {
    Kubeconfig::read_from(path).map_err(|e| BootstrapError::Kubeconfig { path: path.to_owned(), source: e.into() })
}

async fn client_of(config: &Kubeconfig, path: &Path) -> Result<Client, BootstrapError> {
    let error =
        |source: Box<dyn std::error::Error + Send + Sync>| BootstrapError::Kubeconfig { path: path.to_owned(), source };
    let config = kube::Config::from_custom_kubeconfig(config.clone(), &KubeConfigOptions::default())
        .await
        .map_err(|e| error(e.into()))?;
    Client::try_from(config).map_err(|e| error(e.into()))
}

fn create_dir(dir: &Path) -> Result<(), BootstrapError> {
    std::fs::create_dir_all(dir).map_err(|source| BootstrapError::File { path: dir.to_owned(), source })
}

/// The node's key: the current certificate's, the pending one, or a new one (written as the
/// pending key, so that a restart asks for the same certificate).
fn node_key(cert_dir: &Path) -> Result<rcgen::KeyPair, BootstrapError> {
    if let Some(key) = key_in(&CLIENT.current_file(cert_dir)) {
        return Ok(key);
    }
    let pending = cert_dir.join(PENDING_KEY);
    if let Some(key) = key_in(&pending) {
        return Ok(key);
    }
    let key = rcgen::KeyPair::generate().map_err(BootstrapError::Key)?;
    write_private(&pending, key.serialize_pem().as_bytes())?;
    Ok(key)
}

/// The private key (PKCS #8) in the PEM file at `path`, if there is one.
fn key_in(path: &Path) -> Option<rcgen::KeyPair> {
    let pem = std::fs::read(path).ok()?;
    x509_parser::pem::Pem::iter_from_buffer(&pem)
        .filter_map(Result::ok)
        .find(|block| block.label == "PRIVATE KEY")
        .and_then(|block| rcgen::KeyPair::try_from(block.contents.as_slice()).ok())
}

/// Writes `contents` to `path`, readable by its owner only.
pub(crate) fn write_private(path: &Path, contents: &[u8]) -> Result<(), BootstrapError> {
    let error = |source| BootstrapError::File { path: path.to_owned(), source };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true).mode(0o600);
    options.open(path).and_then(|mut file| file.write_all(contents)).map_err(error)
}

/// Waits until the API server answers `/healthz`, a minute at most, as upstream does before
/// its request (which is tried anyway).
async fn wait_for_server(client: &Client) {
    let deadline = tokio::time::Instant::now() + WAIT_FOR_SERVER;
    loop {
        let request = http::Request::get("/healthz").body(Vec::new());
        let answered = match request {
            Ok(request) => client.request_text(request).await.map_err(|e| e.to_string()),
            Err(err) => Err(err.to_string()),
        };
        match answered {
            Ok(_) => return,
            Err(why) if tokio::time::Instant::now() >= deadline => {
                warn!(%why, "the API server did not answer /healthz within a minute; asking for the certificate anyway");
                return;
            }
            Err(why) => info!(%why, "waiting for the API server"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Writes the node's kubeconfig (upstream `writeKubeconfigFromBootstrapping`): the bootstrap
/// kubeconfig's current cluster, and `pem` as the client certificate and key.
fn write_kubeconfig(
    path: &Path,
    bootstrap: &Kubeconfig,
    bootstrap_path: &Path,
    pem: &Path,
) -> Result<(), BootstrapError> {
    let no_cluster = || BootstrapError::Kubeconfig {
        path: bootstrap_path.to_owned(),
        source: "the current context names no cluster".into(),
    };
    let cluster = current_cluster(bootstrap).ok_or_else(no_cluster)?;
    let quote = |text: &str| serde_json::Value::from(text).to_string();
    let mut text = String::from("apiVersion: v1\nkind: Config\nclusters:\n- name: default-cluster\n  cluster:\n");
    text.push_str(&format!("    server: {}\n", quote(cluster.server.as_deref().unwrap_or_default())));
    if let Some(ca) = &cluster.certificate_authority {
        let ca = relative_to(bootstrap_path, ca);
        text.push_str(&format!("    certificate-authority: {}\n", quote(&ca.display().to_string())));
    } else if let Some(data) = &cluster.certificate_authority_data {
        text.push_str(&format!("    certificate-authority-data: {}\n", quote(data)));
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        text.push_str("    insecure-skip-tls-verify: true\n");
    }
    let pem = quote(&pem.display().to_string());
    text.push_str(&format!(
        "users:\n- name: default-auth\n  user:\n    client-certificate: {pem}\n    client-key: {pem}\n\
         contexts:\n- name: default-context\n  context:\n    cluster: default-cluster\n    user: default-auth\n    \
         namespace: default\ncurrent-context: default-context\n"
    ));
    write_private(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::SeqCst},
    };

    use rcgen::PublicKeyData;

    use super::*;
    use crate::certificate::certificate_of;

    #[test]
    fn a_kubeconfig_is_still_valid_while_its_client_certificates_are() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubelet.conf");
        let now = SystemTime::now();
        assert!(!still_valid(&kubeconfig, now).unwrap(), "absent");

        let key = rcgen::KeyPair::generate().unwrap();
        let in_an_hour = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
        let certificate = certificate_of(&key, in_an_hour);
        let pem = store(dir.path(), CLIENT, certificate.as_bytes(), &key.serialize_pem()).unwrap();
        let bootstrap = Kubeconfig::from_yaml(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:6443', \
             certificate-authority: ca.crt}\nusers:\n- name: u\n  user: {token: abc.def}\ncontexts:\n- name: x\n  \
             context: {cluster: c, user: u}\ncurrent-context: x\n",
        )
        .unwrap();
        write_kubeconfig(&kubeconfig, &bootstrap, &dir.path().join("bootstrap.conf"), &pem).unwrap();
        assert!(still_valid(&kubeconfig, now).unwrap());
        assert!(!still_valid(&kubeconfig, now + Duration::from_secs(7200)).unwrap(), "expired");

        // What was written names the bootstrap's server, its CA (made absolute) and the pair.
        let written = Kubeconfig::read_from(&kubeconfig).unwrap();
        let cluster = current_cluster(&written).unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority.as_deref(), Some(dir.path().join("ca.crt").to_str().unwrap()));
        let user = current_user(&written).unwrap();
        assert_eq!(user.client_certificate.as_deref(), Some(pem.to_str().unwrap()));
        assert_eq!(user.client_key.as_deref(), Some(pem.to_str().unwrap()));
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&kubeconfig), 0o600);
        assert_eq!(mode(&pem), 0o600);
        // The stored pair gives the key back, for the next request.
        assert_eq!(key_in(&pem).unwrap().subject_public_key_info(), key.subject_public_key_info());

        // A kubeconfig without a client certificate (a token) is bootstrapped again.
        std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n").unwrap();
        assert!(!still_valid(&kubeconfig, now).unwrap());
    }

    /// A client whose server answers each request with the next of `answers` (a status code, or
    /// `None` for a connection that fails), then with 200 and a version, counting the requests
    /// in `asked`.
    fn client_answering(answers: Vec<Option<u16>>, asked: Arc<AtomicUsize>) -> Client {
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            let answer = answers.get(asked.fetch_add(1, SeqCst)).copied().unwrap_or(Some(200));
            async move {
                let code = answer.ok_or_else(|| std::io::Error::other("connection refused"))?;
                let body = if code == 200 {
                    r#"{"major":"1","minor":"26","gitVersion":"v1.26.1"}"#.to_owned()
                } else {
                    format!(r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","code":{code}}}"#)
                };
                let response = http::Response::builder().status(code).body(kube::client::Body::from(body.into_bytes()));
                Ok::<_, std::io::Error>(response.unwrap())
            }
        });
        Client::new(service, "default")
    }

    /// Credentials whose rotated client certificate, in `dir`, ends at `not_after`.
    fn credentials_ending(dir: &Path, not_after: time::OffsetDateTime) -> NodeCredentials {
        let key = rcgen::KeyPair::generate().unwrap();
        let pair = dir.join("kubelet-client-current.pem");
        std::fs::write(&pair, certificate_of(&key, not_after) + &key.serialize_pem()).unwrap();
        NodeCredentials::rotated(&dir.join("kubelet.conf"), &pair)
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_certificate_ends_the_node_once_the_server_answers_and_not_before() {
        let dir = tempfile::tempdir().unwrap();
        let an_hour = time::Duration::hours(1);

        // While the certificate is valid, nothing is asked.
        let asked = Arc::new(AtomicUsize::new(0));
        let valid = credentials_ending(dir.path(), time::OffsetDateTime::now_utc() + an_hour);
        let waiting =
            wait_for_unrenewable_expiry(client_answering(vec![], asked.clone()), valid, CancellationToken::new());
        assert!(tokio::time::timeout(Duration::from_secs(600), waiting).await.is_err());
        assert_eq!(asked.load(SeqCst), 0);

        // Expired: a server that does not answer (a failed connection, a 503) is asked again every
        // 10 s, and the node ends once it answers.
        let asked = Arc::new(AtomicUsize::new(0));
        let expired = credentials_ending(dir.path(), time::OffsetDateTime::now_utc() - an_hour);
        let client = client_answering(vec![None, Some(503)], asked.clone());
        let started = tokio::time::Instant::now();
        let why = wait_for_unrenewable_expiry(client, expired.clone(), CancellationToken::new()).await;
        assert_eq!(why.as_deref(), Some(EXPIRED_AND_ANSWERED));
        assert_eq!(asked.load(SeqCst), 3);
        assert_eq!(started.elapsed(), 2 * EXPIRED_CHECK);

        // A refusal is an answer (the server is there, and refuses the expired certificate).
        let asked = Arc::new(AtomicUsize::new(0));
        let why = wait_for_unrenewable_expiry(
            client_answering(vec![Some(401)], asked.clone()),
            expired.clone(),
            CancellationToken::new(),
        )
        .await;
        assert_eq!(why.as_deref(), Some(EXPIRED_AND_ANSWERED));
        assert_eq!(asked.load(SeqCst), 1);

        // Cancelled while the server does not answer: no reason to end.
        let cancel = CancellationToken::new();
        let client = client_answering(vec![Some(503); 100], Arc::new(AtomicUsize::new(0)));
        let waiting = tokio::spawn(wait_for_unrenewable_expiry(client, expired, cancel.clone()));
        tokio::time::sleep(Duration::from_secs(35)).await;
        cancel.cancel();
        assert_eq!(waiting.await.unwrap(), None);
    }

    #[test]
    fn a_new_key_is_kept_until_its_certificate_comes() {
        let dir = tempfile::tempdir().unwrap();
        let first = node_key(dir.path()).unwrap();
        let again = node_key(dir.path()).unwrap();
        assert_eq!(first.subject_public_key_info(), again.subject_public_key_info());
    }
}
