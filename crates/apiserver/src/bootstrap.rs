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

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use k8s_openapi::{
    ByteString,
    api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client,
    api::PostParams,
    config::{KubeConfigOptions, Kubeconfig},
};
use rcgen::PublicKeyData;
use sha2::Digest;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::credentials::NodeCredentials;
use x509_parser::prelude::FromDer;

/// The signer of kubelets' client certificates.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The client certificate and key in `--cert-dir` that the written kubeconfig names: a link to
/// the newest `kubelet-client-<time>.pem`.
pub const CURRENT_CLIENT_PEM: &str = "kubelet-client-current.pem";
/// The key waiting for its certificate, in `--cert-dir`.
const PENDING_KEY: &str = "kubelet-client.key.tmp";
/// How long the request may wait for its certificate (upstream's hour).
const WAIT_FOR_CERTIFICATE: Duration = Duration::from_secs(3600);
/// How long the API server is waited for before the request is tried anyway (upstream's minute).
const WAIT_FOR_SERVER: Duration = Duration::from_secs(60);
/// The usages asked for: an ECDSA key signs, it does not encipher (upstream asks for key
/// encipherment of RSA keys only).
const USAGES: [&str; 2] = ["digital signature", "client auth"];

/// Why the node has no client certificate.
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
    #[error("no certificate was issued for the certificate signing request {name} within {} s", WAIT_FOR_CERTIFICATE.as_secs())]
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
    let request = NodeRequest::new(&key, node)?;
    let certificate = request.issue(&client).await?;
    let current = store(cert_dir, &certificate, &key.serialize_pem())?;
    if let Err(err) = std::fs::remove_file(cert_dir.join(PENDING_KEY))
        && err.kind() != std::io::ErrorKind::NotFound
    {
        warn!(error = %err, "cannot remove the pending key in --cert-dir");
    }
    write_kubeconfig(kubeconfig, &bootstrap_config, bootstrap, &current)?;
    info!(request = %request.name, path = %kubeconfig.display(), "client certificate issued; kubeconfig written");
    Ok(Bootstrap::Issued { request: request.name })
}

/// Rotates the node's client certificate (upstream's certificate manager with
/// `rotateCertificates`) until `cancel`: at a random point between 70% and 90% of the current
/// certificate's lifetime, a new key and a CertificateSigningRequest made with the node's own
/// credentials (`client`, which the Node authorizer lets ask); once issued, the pair is stored as
/// the current one in `cert_dir` and `credentials` reloaded, so the clients use it from their next
/// request on. A failure is tried again with a backoff (2 s doubling to 5 minutes).
pub async fn rotate_client_certificate(
    client: Client,
    credentials: NodeCredentials,
    cert_dir: PathBuf,
    node: String,
    cancel: CancellationToken,
) {
    let mut failures = 0;
    loop {
        let validity =
            credentials.certificate_file().and_then(|file| std::fs::read(file).ok()).and_then(|pem| validity(&pem));
        let Some((not_before, not_after)) = validity else {
            warn!(kubeconfig = %credentials.kubeconfig().display(), "rotateCertificates: the kubeconfig names no client certificate file to rotate");
            return;
        };
        let deadline = rotation_deadline(not_before, not_after, fastrand::f64());
        let wait = deadline.duration_since(SystemTime::now()).unwrap_or_default();
        info!(in_seconds = wait.as_secs(), "the client certificate will be rotated");
        if cancel.run_until_cancelled(tokio::time::sleep(wait)).await.is_none() {
            return;
        }
        loop {
            match cancel.run_until_cancelled(rotate_once(&client, &credentials, &cert_dir, &node)).await {
                None => return,
                Some(Ok(request)) => {
                    info!(%request, "client certificate rotated");
                    failures = 0;
                    break;
                }
                Some(Err(err)) => {
                    let wait = Duration::from_secs(2u64.saturating_mul(1 << failures.min(8)).min(300));
                    failures += 1;
                    warn!(error = %kubelet_core::ErrorChain(&err), retry_in = ?wait, "cannot rotate the client certificate");
                    if cancel.run_until_cancelled(tokio::time::sleep(wait)).await.is_none() {
                        return;
                    }
                }
            }
        }
    }
}

/// One rotation: a new key, its certificate asked for and stored, the credentials reloaded.
async fn rotate_once(
    client: &Client,
    credentials: &NodeCredentials,
    cert_dir: &Path,
    node: &str,
) -> Result<String, BootstrapError> {
    let key = rcgen::KeyPair::generate().map_err(BootstrapError::Key)?;
    let request = NodeRequest::new(&key, node)?;
    let certificate = request.issue(client).await?;
    store(cert_dir, &certificate, &key.serialize_pem())?;
    credentials.reload();
    Ok(request.name)
}

/// When a certificate valid from `not_before` to `not_after` is rotated: at 70% of its lifetime
/// plus `jitter` (0 to 1) times 20% (upstream's `nextRotationDeadline`).
fn rotation_deadline(not_before: SystemTime, not_after: SystemTime, jitter: f64) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    not_before + lifetime.mul_f64(0.7 + 0.2 * jitter.clamp(0.0, 1.0))
}

/// The validity of the first certificate of `pem`.
fn validity(pem: &[u8]) -> Option<(SystemTime, SystemTime)> {
    let block =
        x509_parser::pem::Pem::iter_from_buffer(pem).filter_map(Result::ok).find(|b| b.label == "CERTIFICATE")?;
    let certificate = block.parse_x509().ok()?;
    let time = |t: x509_parser::time::ASN1Time| {
        SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or(0))
    };
    Some((time(certificate.validity().not_before), time(certificate.validity().not_after)))
}

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
    if let Some(key) = key_in(&cert_dir.join(CURRENT_CLIENT_PEM)) {
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
fn write_private(path: &Path, contents: &[u8]) -> Result<(), BootstrapError> {
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

/// The node's CertificateSigningRequest.
struct NodeRequest {
    name: String,
    pem: String,
    public_key: Vec<u8>,
}

impl NodeRequest {
    /// A request of `key` for `system:node:<node>` in `system:nodes`.
    fn new(key: &rcgen::KeyPair, node: &str) -> Result<NodeRequest, BootstrapError> {
        let common_name = format!("system:node:{node}");
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "system:nodes");
        params.distinguished_name.push(rcgen::DnType::CommonName, common_name.clone());
        let pem = params.serialize_request(key).and_then(|request| request.pem()).map_err(BootstrapError::Key)?;
        let public_key = key.subject_public_key_info();
        let name = digested_name(&public_key, &common_name, &["system:nodes"], &USAGES);
        Ok(NodeRequest { name, pem, public_key })
    }

    /// Creates the request (or finds it from an earlier attempt) and waits for its certificate.
    async fn issue(&self, client: &Client) -> Result<Vec<u8>, BootstrapError> {
        let requests: Api<CertificateSigningRequest> = Api::all(client.clone());
        match requests.create(&PostParams::default(), &self.object()).await {
            Ok(_) => info!(request = %self.name, "certificate signing request created; waiting for its certificate"),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let existing = requests.get(&self.name).await.map_err(|source| self.api_error("read", source))?;
                if !self.is_asked_by(&existing) {
                    return Err(BootstrapError::NotOurs { name: self.name.clone() });
                }
                info!(request = %self.name, "certificate signing request found from an earlier attempt; waiting for its certificate");
            }
            Err(source) => return Err(self.api_error("create", source)),
        }
        let certificate = self.wait(&requests).await?;
        if !self.is_issued_for_our_key(&certificate) {
            return Err(BootstrapError::NotIssuedForOurKey { name: self.name.clone() });
        }
        Ok(certificate)
    }

    fn object(&self) -> CertificateSigningRequest {
        CertificateSigningRequest {
            metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() },
            spec: CertificateSigningRequestSpec {
                request: ByteString(self.pem.clone().into_bytes()),
                signer_name: CLIENT_SIGNER.to_owned(),
                usages: Some(USAGES.iter().map(|usage| (*usage).to_owned()).collect()),
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        }
    }

    /// Whether `existing` asks what this request asks (upstream `ensureCompatible`): the same
    /// signer, and a request for the same key.
    fn is_asked_by(&self, existing: &CertificateSigningRequest) -> bool {
        existing.spec.signer_name == CLIENT_SIGNER
            && request_public_key(&existing.spec.request.0) == Some(self.public_key.clone())
    }

    /// Whether the first certificate of `pem` is for the node's key.
    fn is_issued_for_our_key(&self, pem: &[u8]) -> bool {
        let first = x509_parser::pem::Pem::iter_from_buffer(pem).next().and_then(Result::ok);
        first.is_some_and(|block| {
            block.parse_x509().is_ok_and(|certificate| certificate.public_key().raw == self.public_key.as_slice())
        })
    }

    /// Watches the request until it is issued, denied, failed or deleted, an hour at most; a
    /// watch that breaks is started again.
    async fn wait(&self, requests: &Api<CertificateSigningRequest>) -> Result<Vec<u8>, BootstrapError> {
        let deadline = tokio::time::Instant::now() + WAIT_FOR_CERTIFICATE;
        loop {
            let settled = kube::runtime::wait::await_condition(requests.clone(), &self.name, is_settled);
            match tokio::time::timeout_at(deadline, settled).await {
                Err(_) => return Err(BootstrapError::TimedOut { name: self.name.clone() }),
                Ok(Ok(request)) => return self.outcome(request),
                Ok(Err(err)) => {
                    warn!(request = %self.name, error = %err, "watching the certificate signing request failed; watching again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// The certificate of a settled request, or why there is none.
    fn outcome(&self, request: Option<CertificateSigningRequest>) -> Result<Vec<u8>, BootstrapError> {
        let name = self.name.clone();
        let Some(status) = request.and_then(|r| r.status) else { return Err(BootstrapError::Deleted { name }) };
        let conditions = status.conditions.unwrap_or_default();
        let reason_of = |kind: &str| {
            conditions.iter().find(|c| c.type_ == kind).map(|c| {
                let reason = c.reason.clone().unwrap_or_default();
                let message = c.message.clone().unwrap_or_default();
                format!("{reason} {message}").trim().to_owned()
            })
        };
        if let Some(reason) = reason_of("Denied") {
            return Err(BootstrapError::Denied { name, reason });
        }
        if let Some(reason) = reason_of("Failed") {
            return Err(BootstrapError::Failed { name, reason });
        }
        status.certificate.map(|c| c.0).ok_or(BootstrapError::Deleted { name })
    }

    fn api_error(&self, verb: &str, source: kube::Error) -> BootstrapError {
        BootstrapError::Api { what: format!("cannot {verb} the certificate signing request {}", self.name), source }
    }
}

/// Whether a request is done with: deleted, denied, failed, or approved with its certificate.
fn is_settled(request: Option<&CertificateSigningRequest>) -> bool {
    let Some(status) = request.and_then(|r| r.status.as_ref()) else { return request.is_none() };
    let has = |kind: &str| status.conditions.iter().flatten().any(|c| c.type_ == kind && c.status == "True");
    let issued = has("Approved") && status.certificate.as_ref().is_some_and(|c| !c.0.is_empty());
    issued || has("Denied") || has("Failed")
}

/// The subject public key info of a PEM certificate request.
fn request_public_key(pem: &[u8]) -> Option<Vec<u8>> {
    let block = x509_parser::pem::Pem::iter_from_buffer(pem).next()?.ok()?;
    let (_, request) = x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents).ok()?;
    Some(request.certification_request_info.subject_pki.raw.to_vec())
}

/// Upstream's request name: `node-csr-` and the unpadded URL-safe base64 of the SHA-512/256 of
/// the key's DER, the common name, the organizations and the usages, each base64'd and ended
/// by `|`.
fn digested_name(public_key: &[u8], common_name: &str, organizations: &[&str], usages: &[&str]) -> String {
    let mut hash = sha2::Sha512_256::new();
    let mut write = |data: &[u8]| {
        hash.update(URL_SAFE_NO_PAD.encode(data).as_bytes());
        hash.update(b"|");
    };
    write(public_key);
    write(common_name.as_bytes());
    organizations.iter().for_each(|o| write(o.as_bytes()));
    usages.iter().for_each(|u| write(u.as_bytes()));
    format!("node-csr-{}", URL_SAFE_NO_PAD.encode(hash.finalize()))
}

/// Stores the issued certificate with its key as `kubelet-client-<time>.pem` in `cert_dir` and
/// points `kubelet-client-current.pem` at it (upstream's file store); the link's path.
fn store(cert_dir: &Path, certificate: &[u8], key_pem: &str) -> Result<PathBuf, BootstrapError> {
    let stamp = time::OffsetDateTime::now_utc();
    let name = format!(
        "kubelet-client-{:04}-{:02}-{:02}-{:02}-{:02}-{:02}.pem",
        stamp.year(),
        u8::from(stamp.month()),
        stamp.day(),
        stamp.hour(),
        stamp.minute(),
        stamp.second()
    );
    let file = cert_dir.join(&name);
    let mut contents = certificate.to_vec();
    if !contents.ends_with(b"\n") {
        contents.push(b'\n');
    }
    contents.extend_from_slice(key_pem.as_bytes());
    write_private(&file, &contents)?;
    // A new link renamed over the old one: the current pair is never missing.
    let current = cert_dir.join(CURRENT_CLIENT_PEM);
    let next = cert_dir.join(format!("{CURRENT_CLIENT_PEM}.next"));
    let error = |path: &Path| {
        let path = path.to_owned();
        move |source| BootstrapError::File { path, source }
    };
    let _ = std::fs::remove_file(&next);
    std::os::unix::fs::symlink(&file, &next).map_err(error(&next))?;
    std::fs::rename(&next, &current).map_err(error(&current))?;
    Ok(current)
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
    use super::*;

    /// A certificate of `key`, valid until `not_after`.
    fn certificate_of(key: &rcgen::KeyPair, not_after: time::OffsetDateTime) -> String {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.not_after = not_after;
        params.self_signed(key).unwrap().pem()
    }

    #[test]
    fn the_request_asks_for_the_nodes_name_in_system_nodes_and_is_named_after_its_key() {
        let key = rcgen::KeyPair::generate().unwrap();
        let request = NodeRequest::new(&key, "node-1").unwrap();
        let block = x509_parser::pem::Pem::iter_from_buffer(request.pem.as_bytes()).next().unwrap().unwrap();
        assert_eq!(block.label, "CERTIFICATE REQUEST");
        let (_, parsed) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents).unwrap();
        assert_eq!(parsed.certification_request_info.subject.to_string(), "O=system:nodes, CN=system:node:node-1");
        assert_eq!(request_public_key(request.pem.as_bytes()), Some(key.subject_public_key_info()));
        assert!(request.name.starts_with("node-csr-"));
        // The same key asks under the same name; another key or node under another.
        assert_eq!(NodeRequest::new(&key, "node-1").unwrap().name, request.name);
        assert_ne!(NodeRequest::new(&key, "node-2").unwrap().name, request.name);
        let other = rcgen::KeyPair::generate().unwrap();
        assert_ne!(NodeRequest::new(&other, "node-1").unwrap().name, request.name);
        // SHA-512/256 is 32 bytes: 43 characters of unpadded base64.
        assert_eq!(request.name.len(), "node-csr-".len() + 43);
    }

    #[test]
    fn only_a_certificate_of_the_nodes_key_is_taken() {
        let key = rcgen::KeyPair::generate().unwrap();
        let request = NodeRequest::new(&key, "node-1").unwrap();
        let in_an_hour = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
        assert!(request.is_issued_for_our_key(certificate_of(&key, in_an_hour).as_bytes()));
        let other = rcgen::KeyPair::generate().unwrap();
        assert!(!request.is_issued_for_our_key(certificate_of(&other, in_an_hour).as_bytes()));
        assert!(!request.is_issued_for_our_key(b"not a certificate"));
    }

    #[test]
    fn a_certificate_is_rotated_between_70_and_90_percent_of_its_lifetime() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        let start = time::OffsetDateTime::from_unix_timestamp(1_000_000).unwrap();
        params.not_before = start;
        params.not_after = start + time::Duration::seconds(1000);
        let pem = params.self_signed(&key).unwrap().pem();
        let (not_before, not_after) = validity(pem.as_bytes()).unwrap();
        let at = |seconds| SystemTime::UNIX_EPOCH + Duration::from_secs(seconds);
        assert_eq!((not_before, not_after), (at(1_000_000), at(1_001_000)));
        assert_eq!(rotation_deadline(not_before, not_after, 0.0), at(1_000_700));
        assert_eq!(rotation_deadline(not_before, not_after, 0.5), at(1_000_800));
        assert_eq!(rotation_deadline(not_before, not_after, 1.0), at(1_000_900));
    }

    #[test]
    fn the_name_digest_separates_its_parts() {
        let key = b"key";
        let a = digested_name(key, "system:node:foo", &["bar"], &USAGES);
        let b = digested_name(key, "system:node:foob", &["ar"], &USAGES);
        assert_ne!(a, b);
    }

    #[test]
    fn a_request_is_settled_when_issued_denied_failed_or_deleted() {
        use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestStatus};
        let with = |conditions: &[&str], certificate: Option<&[u8]>| CertificateSigningRequest {
            status: Some(CertificateSigningRequestStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|kind| CertificateSigningRequestCondition {
                            type_: (*kind).to_owned(),
                            status: "True".to_owned(),
                            ..CertificateSigningRequestCondition::default()
                        })
                        .collect(),
                ),
                certificate: certificate.map(|c| ByteString(c.to_vec())),
            }),
            ..CertificateSigningRequest::default()
        };
        assert!(!is_settled(Some(&CertificateSigningRequest::default())));
        assert!(!is_settled(Some(&with(&["Approved"], None))), "approved, not yet signed");
        assert!(is_settled(Some(&with(&["Approved"], Some(b"pem")))));
        assert!(is_settled(Some(&with(&["Denied"], None))));
        assert!(is_settled(Some(&with(&["Approved", "Failed"], None))));
        assert!(is_settled(None), "deleted");
    }

    #[test]
    fn a_kubeconfig_is_still_valid_while_its_client_certificates_are() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubelet.conf");
        let now = SystemTime::now();
        assert!(!still_valid(&kubeconfig, now).unwrap(), "absent");

        let key = rcgen::KeyPair::generate().unwrap();
        let in_an_hour = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
        let certificate = certificate_of(&key, in_an_hour);
        let pem = store(dir.path(), certificate.as_bytes(), &key.serialize_pem()).unwrap();
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

    #[test]
    fn a_new_key_is_kept_until_its_certificate_comes() {
        let dir = tempfile::tempdir().unwrap();
        let first = node_key(dir.path()).unwrap();
        let again = node_key(dir.path()).unwrap();
        assert_eq!(first.subject_public_key_info(), again.subject_public_key_info());
    }
}
