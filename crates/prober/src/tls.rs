//! The TLS client of HTTPS probes and hooks. As upstream's (`InsecureSkipVerify`), it does not
//! check the server's certificate against any authority, since a pod's certificate is seldom one
//! the node could check; the handshake's signatures are still checked against the public key of
//! the certificate the server sent. Any certificate X.509 can parse will do, version 1 included
//! (what `openssl req -x509` makes without extensions, and Go accepts), where webpki would refuse
//! it before looking at the key.

use std::sync::{Arc, OnceLock};

use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::{CryptoProvider, WebPkiSupportedAlgorithms},
    pki_types::{CertificateDer, ServerName, UnixTime},
};
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};

/// Accepts any server certificate; checks the handshake's signatures with the provider's
/// algorithms.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_signature(message, cert, dss, &self.0.signature_verification_algorithms, Version::Tls12)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_signature(message, cert, dss, &self.0.signature_verification_algorithms, Version::Tls13)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Version {
    Tls12,
    Tls13,
}

/// Checks the handshake signature `dss` over `message` with the public key of `cert`, by the
/// algorithms `algorithms` maps its scheme to: each in turn for TLS 1.2 (whose schemes do not
/// name a curve), the first for TLS 1.3, as rustls does.
fn verify_signature(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algorithms: &WebPkiSupportedAlgorithms,
    version: Version,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let unadvertised =
        || rustls::Error::PeerMisbehaved(rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme);
    if version == Version::Tls13 && !allowed_in_tls13(dss.scheme) {
        return Err(unadvertised());
    }
    let (_, candidates) =
        algorithms.mapping.iter().find(|(scheme, _)| *scheme == dss.scheme).ok_or_else(unadvertised)?;
    let candidates = match version {
        Version::Tls12 => candidates,
        Version::Tls13 => &candidates[..candidates.len().min(1)],
    };
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|_| rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
    let public_key = &parsed.tbs_certificate.subject_pki.subject_public_key.data;
    let verified =
        candidates.iter().any(|algorithm| algorithm.verify_signature(public_key, message, dss.signature()).is_ok());
    if verified {
        Ok(HandshakeSignatureValid::assertion())
    } else {
        Err(rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature))
    }
}

/// Whether TLS 1.3 allows `scheme` in CertificateVerify (RFC 8446 4.4.3: no PKCS #1 v1.5, no
/// SHA-1).
fn allowed_in_tls13(scheme: SignatureScheme) -> bool {
    !matches!(
        scheme,
        SignatureScheme::RSA_PKCS1_SHA1
            | SignatureScheme::RSA_PKCS1_SHA256
            | SignatureScheme::RSA_PKCS1_SHA384
            | SignatureScheme::RSA_PKCS1_SHA512
            | SignatureScheme::ECDSA_SHA1_Legacy
    )
}

/// The connector, made once.
fn connector() -> Result<&'static TlsConnector, rustls::Error> {
    static CONNECTOR: OnceLock<TlsConnector> = OnceLock::new();
    if let Some(connector) = CONNECTOR.get() {
        return Ok(connector);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    Ok(CONNECTOR.get_or_init(|| TlsConnector::from(Arc::new(config))))
}

/// TLS over `stream` to `host` (a name, sent as SNI, or an IP).
pub(crate) async fn connect(
    stream: TcpStream,
    host: &str,
) -> Result<TlsStream<TcpStream>, Box<dyn std::error::Error + Send + Sync>> {
    let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_owned())?;
    Ok(connector()?.connect(name, stream).await?)
}
