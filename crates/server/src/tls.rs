//! The kubelet API's TLS: the serving certificate (`tlsCertFile`/`tlsPrivateKeyFile`, or a
//! self-signed pair in `--cert-dir` as upstream makes one), client certificates verified against
//! `clientCAFile`, and `tlsMinVersion`/`tlsCipherSuites` by Go's names.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, PoisonError, RwLock},
};

use rustls::{
    ServerConfig, SupportedCipherSuite,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier},
    sign::CertifiedKey,
};

/// The TLS set-up failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A certificate, key or CA file could not be read or written.
    #[error("{}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A PEM file holds nothing usable.
    #[error("{}: {message}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The self-signed certificate could not be made.
    #[error("cannot make a self-signed certificate")]
    Generate(#[source] rcgen::Error),
    /// A `tlsCipherSuites` name that this server cannot offer.
    #[error(
        "tlsCipherSuites: {0:?} is not supported: the kubelet API offers the ECDHE suites with AES-GCM or ChaCha20-Poly1305"
    )]
    CipherSuite(String),
    /// The TLS library refused the configuration.
    #[error("invalid TLS configuration")]
    Rustls(#[source] rustls::Error),
}

/// A serving certificate chain and its key.
#[derive(Debug)]
#[non_exhaustive]
pub struct ServingCertificate {
    /// The certificate, then its chain.
    pub chain: Vec<CertificateDer<'static>>,
    /// Its private key.
    pub key: PrivateKeyDer<'static>,
}

/// The self-signed certificate's file in `--cert-dir`.
pub const SELF_SIGNED_CERT: &str = "kubelet.crt";
/// The self-signed key's file in `--cert-dir`.
pub const SELF_SIGNED_KEY: &str = "kubelet.key";

impl ServingCertificate {
    /// Reads `tlsCertFile` and `tlsPrivateKeyFile` (PEM).
    pub fn load(cert: &Path, key: &Path) -> Result<Self, Error> {
        let pem = |path: &Path, message: String| Error::Pem { path: path.to_owned(), message };
        let bytes = |path: &Path| std::fs::read(path).map_err(|source| Error::File { path: path.to_owned(), source });
        let chain = CertificateDer::pem_slice_iter(&bytes(cert)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem(cert, e.to_string()))?;
        if chain.is_empty() {
            return Err(pem(cert, "no certificate".to_owned()));
        }
        let key_der = PrivateKeyDer::from_pem_slice(&bytes(key)?).map_err(|e| pem(key, e.to_string()))?;
        Ok(ServingCertificate { chain, key: key_der })
    }

    /// The pair in `cert_dir` (`kubelet.crt`, `kubelet.key`), made first when either is missing,
    /// as upstream's: a certificate for `host` (its DNS name, or its IP), valid for a year, its
    /// common name `host@<unix time>`. The key is written readable by root only.
    pub fn self_signed(cert_dir: &Path, host: &str) -> Result<Self, Error> {
        let (cert, key) = (cert_dir.join(SELF_SIGNED_CERT), cert_dir.join(SELF_SIGNED_KEY));
        if cert.exists() && key.exists() {
            return Self::load(&cert, &key);
        }
        let (cert_pem, key_pem) = generate(host)?;
        let write = |path: &Path, text: &str, mode: u32| {
            use std::os::unix::fs::OpenOptionsExt;
            let file = |source| Error::File { path: path.to_owned(), source };
            std::fs::create_dir_all(cert_dir).map_err(file)?;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true).mode(mode);
            std::io::Write::write_all(&mut options.open(path).map_err(file)?, text.as_bytes()).map_err(file)
        };
        write(&key, &key_pem, 0o600)?;
        write(&cert, &cert_pem, 0o644)?;
        Self::load(&cert, &key)
    }
}

/// A self-signed certificate and key for `host`, as PEM.
fn generate(host: &str) -> Result<(String, String), Error> {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(Error::Generate)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, format!("{host}@{}", since_epoch.as_secs()));
    let name = match host.parse::<IpAddr>() {
        Ok(ip) => rcgen::SanType::IpAddress(ip),
        Err(_) => rcgen::SanType::DnsName(host.to_owned().try_into().map_err(Error::Generate)?),
    };
    params.subject_alt_names = vec![name];
    params.not_before = time_of(since_epoch);
    params.not_after = time_of(since_epoch + std::time::Duration::from_secs(365 * 24 * 3600));
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature, rcgen::KeyUsagePurpose::KeyEncipherment];
    let key = rcgen::KeyPair::generate().map_err(Error::Generate)?;
    let certificate = params.self_signed(&key).map_err(Error::Generate)?;
    Ok((certificate.pem(), key.serialize_pem()))
}

/// A point in time for rcgen, from the time since the epoch.
fn time_of(since_epoch: std::time::Duration) -> time::OffsetDateTime {
    let seconds = i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX);
    time::OffsetDateTime::from_unix_timestamp(seconds).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// What the server's TLS is made from.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct TlsSettings {
    /// `clientCAFile`: client certificates it signed are accepted (and required of nobody).
    pub client_ca_file: Option<PathBuf>,
    /// `tlsMinVersion`: `VersionTLS13` refuses TLS 1.2.
    pub min_version: Option<String>,
    /// `tlsCipherSuites`, by Go's names.
    pub cipher_suites: Vec<String>,
}

impl TlsSettings {
    /// The settings from the configuration's fields.
    pub fn new(client_ca_file: Option<PathBuf>, min_version: Option<String>, cipher_suites: Vec<String>) -> Self {
        TlsSettings { client_ca_file, min_version, cipher_suites }
    }
}

/// The serving certificate the server presents: fixed, or replaced while the server runs
/// (`serverTLSBootstrap`), and missing until one is issued, when handshakes fail as upstream's do
/// ("no serving certificate available for the kubelet").
#[derive(Debug, Default)]
pub struct ServingSlot(RwLock<Option<Arc<CertifiedKey>>>);

impl ServingSlot {
    /// A slot holding `certificate`.
    pub fn with(certificate: ServingCertificate) -> Result<Arc<ServingSlot>, Error> {
        let slot = Arc::new(ServingSlot::default());
        slot.set(certificate)?;
        Ok(slot)
    }

    /// Presents `certificate` from the next handshake on.
    pub fn set(&self, certificate: ServingCertificate) -> Result<(), Error> {
        let key = rustls::crypto::ring::sign::any_supported_type(&certificate.key).map_err(Error::Rustls)?;
        let certified = Arc::new(CertifiedKey::new(certificate.chain, key));
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(certified);
        Ok(())
    }

    /// Whether there is a certificate to present.
    pub fn is_set(&self) -> bool {
        self.0.read().unwrap_or_else(PoisonError::into_inner).is_some()
    }
}

impl ResolvesServerCert for ServingSlot {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// The server's TLS configuration: HTTP/1.1 only (exec and port-forward upgrade it), presenting
/// the certificate in `certificate` at each handshake.
pub fn server_config(certificate: Arc<ServingSlot>, settings: &TlsSettings) -> Result<Arc<ServerConfig>, Error> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = cipher_suites(&provider, &settings.cipher_suites)?;
    let provider = Arc::new(provider);
    let versions: &[&rustls::SupportedProtocolVersion] = match settings.min_version.as_deref() {
        Some("VersionTLS13") => &[&rustls::version::TLS13],
        _ => &[&rustls::version::TLS13, &rustls::version::TLS12],
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(Error::Rustls)?;
    let builder = match &settings.client_ca_file {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            let bytes = std::fs::read(path).map_err(|source| Error::File { path: path.clone(), source })?;
            for certificate in CertificateDer::pem_slice_iter(&bytes) {
                let certificate = certificate.map_err(|e| Error::Pem { path: path.clone(), message: e.to_string() })?;
                roots.add(certificate).map_err(Error::Rustls)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| Error::Pem { path: path.clone(), message: e.to_string() })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(certificate);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Checks that every `tlsCipherSuites` name is one the kubelet API can offer, as upstream checks
/// them before the kubelet starts, whether or not its API is then served.
pub fn check_cipher_suites(names: &[String]) -> Result<(), Error> {
    cipher_suites(&rustls::crypto::ring::default_provider(), names).map(drop)
}

/// The suites of `provider` that `names` allow: every TLS 1.3 suite (Go does not let them be
/// chosen either), and the TLS 1.2 suites named; no names keep them all.
fn cipher_suites(provider: &CryptoProvider, names: &[String]) -> Result<Vec<SupportedCipherSuite>, Error> {
    if names.is_empty() {
        return Ok(provider.cipher_suites.clone());
    }
    let rustls_name = |suite: &SupportedCipherSuite| format!("{:?}", suite.suite());
    for name in names {
        let wanted = go_to_rustls_name(name);
        if !provider.cipher_suites.iter().any(|s| rustls_name(s) == wanted) {
            return Err(Error::CipherSuite(name.clone()));
        }
    }
    let named = |suite: &SupportedCipherSuite| names.iter().any(|n| go_to_rustls_name(n) == rustls_name(suite));
    Ok(provider.cipher_suites.iter().filter(|s| s.tls13().is_some() || named(s)).copied().collect())
}

/// Go's name of a cipher suite as rustls spells it: `TLS_AES_128_GCM_SHA256` is
/// `TLS13_AES_128_GCM_SHA256`, and Go's short ChaCha20 names lack the `_SHA256`.
fn go_to_rustls_name(name: &str) -> String {
    let name = name.trim();
    if let Some(rest) = name.strip_prefix("TLS_AES_").or_else(|| name.strip_prefix("TLS_CHACHA20")) {
        let family = if name.starts_with("TLS_AES_") { "AES_" } else { "CHACHA20" };
        return format!("TLS13_{family}{rest}");
    }
    if name.ends_with("CHACHA20_POLY1305") { format!("{name}_SHA256") } else { name.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_cipher_suite_names_map_to_rustls_and_unknown_ones_are_refused() {
        let provider = rustls::crypto::ring::default_provider();
        let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let chosen = cipher_suites(
            &provider,
            &names(&[
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
                "TLS_AES_128_GCM_SHA256",
            ]),
        )
        .unwrap();
        let tls12: Vec<String> =
            chosen.iter().filter(|s| s.tls13().is_none()).map(|s| format!("{:?}", s.suite())).collect();
        assert_eq!(tls12.len(), 2, "{tls12:?}");
        assert!(tls12.contains(&"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256".to_owned()));
        assert_eq!(chosen.iter().filter(|s| s.tls13().is_some()).count(), 3, "TLS 1.3 suites stay");
        let refused = cipher_suites(&provider, &names(&["TLS_RSA_WITH_AES_128_CBC_SHA"])).unwrap_err();
        assert!(refused.to_string().contains("TLS_RSA_WITH_AES_128_CBC_SHA"), "{refused}");
        assert_eq!(cipher_suites(&provider, &[]).unwrap().len(), provider.cipher_suites.len());
    }

    #[test]
    fn a_self_signed_pair_is_made_once_and_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = ServingCertificate::self_signed(dir.path(), "node-1").unwrap();
        let second = ServingCertificate::self_signed(dir.path(), "node-1").unwrap();
        assert_eq!(first.chain, second.chain, "reused");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(SELF_SIGNED_KEY)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (_, parsed) = x509_parser::parse_x509_certificate(first.chain[0].as_ref()).unwrap();
        let common_name = parsed.subject().iter_common_name().next().unwrap().as_str().unwrap().to_owned();
        assert!(common_name.starts_with("node-1@"), "{common_name}");
        let config = server_config(ServingSlot::with(first).unwrap(), &TlsSettings::default()).unwrap();
        assert_eq!(config.alpn_protocols, [b"http/1.1".to_vec()]);
    }
}
