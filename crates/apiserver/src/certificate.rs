//! The node's certificates from the API server (upstream `client-go/util/certificate` and
//! `pkg/kubelet/certificate`): a `NodeRequest` is a CertificateSigningRequest for
//! `system:node:<node>` in `system:nodes`, issued once its signer has approved and signed it;
//! `store` keeps each pair as `<prefix>-<time>.pem` behind the `<prefix>-current.pem` link in
//! `--cert-dir`; [`keep_renewed`] asks for a new certificate between 70% and 90% of the current
//! one's lifetime. [`CLIENT`] is the node's client certificate (TLS bootstrap and
//! `rotateCertificates`), [`SERVING`] the kubelet API's (`serverTLSBootstrap`).

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use k8s_openapi::{
    ByteString,
    api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{Api, Client, api::PostParams};
use rcgen::PublicKeyData;
use sha2::Digest;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use x509_parser::prelude::FromDer;

use crate::bootstrap::{BootstrapError, write_private};

/// How long a request may wait for its certificate (upstream's hour).
const WAIT_FOR_CERTIFICATE: Duration = Duration::from_secs(3600);

/// What a node certificate is for: its files in `--cert-dir`, its signer and its usages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Purpose {
    /// The files' prefix: `<prefix>-<time>.pem`, and `<prefix>-current.pem` linking to the newest.
    pub file_prefix: &'static str,
    /// The signer asked.
    pub signer: &'static str,
    /// The usages asked: an ECDSA key signs, it does not encipher (upstream asks for key
    /// encipherment of RSA keys only).
    pub usages: &'static [&'static str],
}

impl Purpose {
    /// The link to the current pair in `cert_dir`.
    pub fn current_file(&self, cert_dir: &Path) -> PathBuf {
        cert_dir.join(format!("{}-current.pem", self.file_prefix))
    }
}

/// The node's client certificate, which the kubeconfig written by TLS bootstrap names.
pub const CLIENT: Purpose = Purpose {
    file_prefix: "kubelet-client",
    signer: "kubernetes.io/kube-apiserver-client-kubelet",
    usages: &["digital signature", "client auth"],
};

/// The kubelet API's serving certificate (`serverTLSBootstrap`).
pub const SERVING: Purpose = Purpose {
    file_prefix: "kubelet-server",
    signer: "kubernetes.io/kubelet-serving",
    usages: &["digital signature", "server auth"],
};

/// A CertificateSigningRequest of the node's.
pub(crate) struct NodeRequest {
    /// Upstream's digest name (TLS bootstrap), or none: the API server names it `csr-...`.
    name: Option<String>,
    purpose: Purpose,
    pem: String,
    public_key: Vec<u8>,
}

impl NodeRequest {
    /// A request of `key` for `system:node:<node>` in `system:nodes`, for `purpose`, naming
    /// `dns_names` and `ips` (a serving certificate's).
    pub(crate) fn new(
        key: &rcgen::KeyPair,
        node: &str,
        purpose: Purpose,
        dns_names: &[String],
        ips: &[IpAddr],
    ) -> Result<NodeRequest, BootstrapError> {
        let common_name = format!("system:node:{node}");
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "system:nodes");
        params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
        for name in dns_names {
            let name = name.clone().try_into().map_err(BootstrapError::Key)?;
            params.subject_alt_names.push(rcgen::SanType::DnsName(name));
        }
        params.subject_alt_names.extend(ips.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
        let pem = params.serialize_request(key).and_then(|request| request.pem()).map_err(BootstrapError::Key)?;
        let public_key = key.subject_public_key_info();
        Ok(NodeRequest { name: None, purpose, pem, public_key })
    }

    /// The request named as upstream's TLS bootstrap names it, after a digest of its key, subject
    /// and usages, so that a restart finds its own request again.
    pub(crate) fn named_by_digest(mut self, node: &str) -> NodeRequest {
        let common_name = format!("system:node:{node}");
        self.name = Some(digested_name(&self.public_key, &common_name, &["system:nodes"], self.purpose.usages));
        self
    }

    /// Creates the request (or finds it from an earlier attempt) and waits for its certificate:
    /// the request's name and the certificate.
    pub(crate) async fn issue(&self, client: &Client) -> Result<(String, Vec<u8>), BootstrapError> {
        let requests: Api<CertificateSigningRequest> = Api::all(client.clone());
        let label = self.name.clone().unwrap_or_else(|| "csr-".to_owned());
        let api_error = |verb: &str, source| BootstrapError::Api {
            what: format!("cannot {verb} the certificate signing request {label}"),
            source,
        };
        let name = match requests.create(&PostParams::default(), &self.object()).await {
            Ok(created) => created.metadata.name.unwrap_or_default(),
            Err(kube::Error::Api(status)) if status.code == 409 && self.name.is_some() => {
                let existing = requests.get(&label).await.map_err(|source| api_error("read", source))?;
                if !self.is_asked_by(&existing) {
                    return Err(BootstrapError::NotOurs { name: label });
                }
                info!(request = %label, "certificate signing request found from an earlier attempt");
                label.clone()
            }
            Err(source) => return Err(api_error("create", source)),
        };
        info!(request = %name, signer = self.purpose.signer, "waiting for the certificate of the certificate signing request");
        let certificate = wait(&requests, &name).await?;
        if !self.is_issued_for_our_key(&certificate) {
            return Err(BootstrapError::NotIssuedForOurKey { name });
        }
        Ok((name, certificate))
    }

    fn object(&self) -> CertificateSigningRequest {
        CertificateSigningRequest {
            metadata: ObjectMeta {
                name: self.name.clone(),
                generate_name: self.name.is_none().then(|| "csr-".to_owned()),
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(self.pem.clone().into_bytes()),
                signer_name: self.purpose.signer.to_owned(),
                usages: Some(self.purpose.usages.iter().map(|usage| (*usage).to_owned()).collect()),
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        }
    }

    /// Whether `existing` asks what this request asks (upstream `ensureCompatible`): the same
    /// signer, and a request for the same key.
    fn is_asked_by(&self, existing: &CertificateSigningRequest) -> bool {
        existing.spec.signer_name == self.purpose.signer
            && request_public_key(&existing.spec.request.0) == Some(self.public_key.clone())
    }

    /// Whether the first certificate of `pem` is for the node's key.
    fn is_issued_for_our_key(&self, pem: &[u8]) -> bool {
        let first = x509_parser::pem::Pem::iter_from_buffer(pem).next().and_then(Result::ok);
        first.is_some_and(|block| {
            block.parse_x509().is_ok_and(|certificate| certificate.public_key().raw == self.public_key.as_slice())
        })
    }
}

/// Watches request `name` until it is issued, denied, failed or deleted, an hour at most; a
/// watch that breaks is started again.
async fn wait(requests: &Api<CertificateSigningRequest>, name: &str) -> Result<Vec<u8>, BootstrapError> {
    let deadline = tokio::time::Instant::now() + WAIT_FOR_CERTIFICATE;
    loop {
        let settled = kube::runtime::wait::await_condition(requests.clone(), name, is_settled);
        match tokio::time::timeout_at(deadline, settled).await {
            Err(_) => return Err(BootstrapError::TimedOut { name: name.to_owned() }),
            Ok(Ok(request)) => return outcome(name, request),
            Ok(Err(err)) => {
                warn!(request = %name, error = %err, "watching the certificate signing request failed; watching again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// The certificate of a settled request, or why there is none.
fn outcome(name: &str, request: Option<CertificateSigningRequest>) -> Result<Vec<u8>, BootstrapError> {
    let name = name.to_owned();
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

/// Stores the issued certificate with its key as `<prefix>-<time>.pem` in `cert_dir` and points
/// `<prefix>-current.pem` at it (upstream's file store); the link's path.
pub(crate) fn store(
    cert_dir: &Path,
    purpose: Purpose,
    certificate: &[u8],
    key_pem: &str,
) -> Result<PathBuf, BootstrapError> {
    let stamp = time::OffsetDateTime::now_utc();
    let name = format!(
        "{}-{:04}-{:02}-{:02}-{:02}-{:02}-{:02}.pem",
        purpose.file_prefix,
        stamp.year(),
        u8::from(stamp.month()),
        stamp.day(),
        stamp.hour(),
        stamp.minute(),
        stamp.second()
    );
    let file = cert_dir.join(&name);
    std::fs::create_dir_all(cert_dir).map_err(|source| BootstrapError::File { path: cert_dir.to_owned(), source })?;
    let mut contents = certificate.to_vec();
    if !contents.ends_with(b"\n") {
        contents.push(b'\n');
    }
    contents.extend_from_slice(key_pem.as_bytes());
    write_private(&file, &contents)?;
    // A new link renamed over the old one: the current pair is never missing.
    let current = purpose.current_file(cert_dir);
    let next = cert_dir.join(format!("{}-current.pem.next", purpose.file_prefix));
    let error = |path: &Path| {
        let path = path.to_owned();
        move |source| BootstrapError::File { path, source }
    };
    let _ = std::fs::remove_file(&next);
    std::os::unix::fs::symlink(&file, &next).map_err(error(&next))?;
    std::fs::rename(&next, &current).map_err(error(&current))?;
    Ok(current)
}

/// A node certificate kept renewed by [`keep_renewed`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Renewal {
    /// What it is for.
    pub purpose: Purpose,
    /// `--cert-dir`, where each new pair is stored.
    pub cert_dir: PathBuf,
    /// The node's name.
    pub node: String,
    /// The names a serving certificate is for.
    pub dns_names: Vec<String>,
    /// The addresses a serving certificate is for.
    pub ips: Vec<IpAddr>,
}

impl Renewal {
    /// The renewal of `purpose`'s certificate of `node` into `cert_dir`.
    pub fn new(purpose: Purpose, cert_dir: &Path, node: &str) -> Renewal {
        Renewal {
            purpose,
            cert_dir: cert_dir.to_owned(),
            node: node.to_owned(),
            dns_names: Vec::new(),
            ips: Vec::new(),
        }
    }

    /// With the names and addresses a serving certificate is for.
    pub fn for_names(mut self, dns_names: Vec<String>, ips: Vec<IpAddr>) -> Renewal {
        self.dns_names = dns_names;
        self.ips = ips;
        self
    }
}

/// Keeps a node certificate renewed until `cancel` (upstream's certificate manager): at a random
/// point between 70% and 90% of the lifetime of the certificate `current()` gives (PEM; at once
/// when there is none), a new key and a CertificateSigningRequest made with the node's own
/// credentials (`client`, which the Node authorizer lets ask); once issued, the pair is stored as
/// the current one in `--cert-dir` and handed to `stored`. A failure is tried again with a
/// backoff (2 s doubling to 5 minutes).
pub async fn keep_renewed(
    client: Client,
    renewal: Renewal,
    current: impl Fn() -> Option<Vec<u8>>,
    stored: impl Fn(&Path),
    cancel: CancellationToken,
) {
    let kind = renewal.purpose.file_prefix;
    loop {
        let validity = current().and_then(|pem| validity(&pem));
        let wait = match validity {
            Some((not_before, not_after)) => {
                let deadline = rotation_deadline(not_before, not_after, fastrand::f64());
                deadline.duration_since(SystemTime::now()).unwrap_or_default()
            }
            None => Duration::ZERO,
        };
        info!(certificate = kind, in_seconds = wait.as_secs(), "the certificate will be renewed");
        if cancel.run_until_cancelled(tokio::time::sleep(wait)).await.is_none() {
            return;
        }
        let mut failures = 0;
        loop {
            match cancel.run_until_cancelled(renew_once(&client, &renewal)).await {
                None => return,
                Some(Ok((request, file))) => {
                    info!(certificate = kind, %request, "certificate renewed");
                    stored(&file);
                    break;
                }
                Some(Err(err)) => {
                    let wait = Duration::from_secs(2u64.saturating_mul(1 << failures.min(8)).min(300));
                    failures += 1;
                    warn!(certificate = kind, error = %kubelet_core::ErrorChain(&err), retry_in = ?wait, "cannot renew the certificate");
                    if cancel.run_until_cancelled(tokio::time::sleep(wait)).await.is_none() {
                        return;
                    }
                }
            }
        }
    }
}

/// One renewal: a new key, its certificate asked for and stored; the request's name and the
/// stored pair's path.
async fn renew_once(client: &Client, renewal: &Renewal) -> Result<(String, PathBuf), BootstrapError> {
    let key = rcgen::KeyPair::generate().map_err(BootstrapError::Key)?;
    let request = NodeRequest::new(&key, &renewal.node, renewal.purpose, &renewal.dns_names, &renewal.ips)?;
    let (name, certificate) = request.issue(client).await?;
    let file = store(&renewal.cert_dir, renewal.purpose, &certificate, &key.serialize_pem())?;
    Ok((name, file))
}

/// When a certificate valid from `not_before` to `not_after` is rotated: at 70% of its lifetime
/// plus `jitter` (0 to 1) times 20% (upstream's `nextRotationDeadline`).
fn rotation_deadline(not_before: SystemTime, not_after: SystemTime, jitter: f64) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    not_before + lifetime.mul_f64(0.7 + 0.2 * jitter.clamp(0.0, 1.0))
}

/// The validity of the first certificate of `pem`.
pub(crate) fn validity(pem: &[u8]) -> Option<(SystemTime, SystemTime)> {
    let block =
        x509_parser::pem::Pem::iter_from_buffer(pem).filter_map(Result::ok).find(|b| b.label == "CERTIFICATE")?;
    let certificate = block.parse_x509().ok()?;
    let time = |t: x509_parser::time::ASN1Time| {
        SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t.timestamp()).unwrap_or(0))
    };
    Some((time(certificate.validity().not_before), time(certificate.validity().not_after)))
}

/// A self-signed certificate of `key`, valid until `not_after`, for tests.
#[cfg(test)]
// Reason: tests fail by panicking.
#[allow(clippy::unwrap_used)]
pub(crate) fn certificate_of(key: &rcgen::KeyPair, not_after: time::OffsetDateTime) -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.not_after = not_after;
    params.self_signed(key).unwrap().pem()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_asks_for_the_nodes_name_in_system_nodes_and_is_named_after_its_key() {
        let key = rcgen::KeyPair::generate().unwrap();
        let request = NodeRequest::new(&key, "node-1", CLIENT, &[], &[]).unwrap().named_by_digest("node-1");
        let block = x509_parser::pem::Pem::iter_from_buffer(request.pem.as_bytes()).next().unwrap().unwrap();
        assert_eq!(block.label, "CERTIFICATE REQUEST");
        let (_, parsed) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents).unwrap();
        assert_eq!(parsed.certification_request_info.subject.to_string(), "O=system:nodes, CN=system:node:node-1");
        assert_eq!(request_public_key(request.pem.as_bytes()), Some(key.subject_public_key_info()));
        let name = |key: &rcgen::KeyPair, node: &str| {
            NodeRequest::new(key, node, CLIENT, &[], &[]).unwrap().named_by_digest(node).name.unwrap()
        };
        let first = request.name.clone().unwrap();
        assert!(first.starts_with("node-csr-"));
        // The same key asks under the same name; another key or node under another.
        assert_eq!(name(&key, "node-1"), first);
        assert_ne!(name(&key, "node-2"), first);
        let other = rcgen::KeyPair::generate().unwrap();
        assert_ne!(name(&other, "node-1"), first);
        // SHA-512/256 is 32 bytes: 43 characters of unpadded base64.
        assert_eq!(first.len(), "node-csr-".len() + 43);
        // Renewals are named by the API server.
        assert_eq!(
            NodeRequest::new(&key, "node-1", CLIENT, &[], &[]).unwrap().object().metadata.generate_name.as_deref(),
            Some("csr-")
        );
    }

    #[test]
    fn only_a_certificate_of_the_nodes_key_is_taken() {
        let key = rcgen::KeyPair::generate().unwrap();
        let request = NodeRequest::new(&key, "node-1", CLIENT, &[], &[]).unwrap();
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
        let a = digested_name(key, "system:node:foo", &["bar"], CLIENT.usages);
        let b = digested_name(key, "system:node:foob", &["ar"], CLIENT.usages);
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
    fn a_serving_request_names_the_nodes_names_and_addresses() {
        let key = rcgen::KeyPair::generate().unwrap();
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let request = NodeRequest::new(&key, "node-1", SERVING, &["node-1".to_owned()], &[ip]).unwrap();
        let block = x509_parser::pem::Pem::iter_from_buffer(request.pem.as_bytes()).next().unwrap().unwrap();
        let (_, parsed) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents).unwrap();
        let names: Vec<String> = parsed
            .requested_extensions()
            .into_iter()
            .flatten()
            .filter_map(|extension| match extension {
                x509_parser::extensions::ParsedExtension::SubjectAlternativeName(names) => Some(names),
                _ => None,
            })
            .flat_map(|names| names.general_names.iter().map(|name| name.to_string()))
            .collect();
        assert_eq!(names, ["DNSName(node-1)", "IPAddress(0a:00:00:07)"]);
        let object = request.object();
        assert_eq!(object.spec.signer_name, "kubernetes.io/kubelet-serving");
        assert_eq!(object.spec.usages.unwrap(), ["digital signature", "server auth"]);
    }
}
