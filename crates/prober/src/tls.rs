//! The TLS client of HTTPS probes and hooks. As upstream's (`InsecureSkipVerify`), it does not
//! check the server's certificate against any authority, since a pod's certificate is seldom one
//! the node could check; the handshake's signatures are still checked against the certificate
//! the server sent.

use std::sync::{Arc, OnceLock};

use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
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
