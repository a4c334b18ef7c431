//! The fields of the kubelet API on `port`: `enableServer`, `port`, `tls*`, `authentication`
//! and `authorization`, with upstream's v1beta1 defaults (`pkg/kubelet/apis/config/v1beta1`).

use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

use super::{Error, parse_duration};

/// The kubelet API's settings, defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerConfiguration {
    /// `enableServer` (true): serve the kubelet API on `port`.
    pub enable_server: bool,
    /// `port` (10250); 0 turns the API off too.
    pub port: u16,
    /// `tlsCertFile`: the serving certificate (with its chain), PEM; without it a self-signed
    /// pair is made in `--cert-dir`.
    pub tls_cert_file: Option<PathBuf>,
    /// `tlsPrivateKeyFile`: the serving certificate's key, PEM.
    pub tls_private_key_file: Option<PathBuf>,
    /// `tlsMinVersion`: `VersionTLS12` or `VersionTLS13` (none: TLS 1.2).
    pub tls_min_version: Option<String>,
    /// `tlsCipherSuites`: the TLS 1.2 suites allowed, by Go's names (none: the TLS library's).
    pub tls_cipher_suites: Vec<String>,
    /// `authentication`.
    pub authentication: Authentication,
    /// `authorization`.
    pub authorization: Authorization,
    /// `enableDebuggingHandlers` (true): serve `/run`, `/exec`, `/attach`, `/portForward`,
    /// `/containerLogs` and `/runningpods/` on the kubelet API; off, they answer 405.
    pub enable_debugging_handlers: bool,
    /// `streamingConnectionIdleTimeout` (4h): an exec, attach or port-forward session through
    /// the kubelet API with no bytes either way for this long is closed. Upstream's kubelet no
    /// longer applies it (its runtime's streaming server has a 4 h idle timeout of its own).
    pub streaming_connection_idle_timeout: Duration,
}

impl Default for ServerConfiguration {
    fn default() -> Self {
        ServerConfiguration {
            enable_server: true,
            port: 10250,
            tls_cert_file: None,
            tls_private_key_file: None,
            tls_min_version: None,
            tls_cipher_suites: Vec::new(),
            authentication: Authentication::default(),
            authorization: Authorization::default(),
            enable_debugging_handlers: true,
            streaming_connection_idle_timeout: STREAMING_CONNECTION_IDLE_TIMEOUT,
        }
    }
}

/// Upstream's default `streamingConnectionIdleTimeout`.
const STREAMING_CONNECTION_IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 3600);

/// `authentication`: who a request to the kubelet API comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Authentication {
    /// `x509.clientCAFile`: client certificates signed by these CAs authenticate as their
    /// common name, with their organizations as groups.
    pub client_ca_file: Option<PathBuf>,
    /// `webhook.enabled` (true): bearer tokens are checked with a TokenReview.
    pub webhook_enabled: bool,
    /// `webhook.cacheTTL` (2m): how long a TokenReview's answer is kept.
    pub webhook_cache_ttl: Duration,
    /// `anonymous.enabled` (false): a request nothing authenticates is `system:anonymous`.
    pub anonymous_enabled: bool,
}

impl Default for Authentication {
    fn default() -> Self {
        Authentication {
            client_ca_file: None,
            webhook_enabled: true,
            webhook_cache_ttl: Duration::from_secs(120),
            anonymous_enabled: false,
        }
    }
}

/// `authorization.mode`: upstream's kubelet has these two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorizationMode {
    /// Every authenticated request is allowed.
    AlwaysAllow,
    /// Each request is asked of the API server with a SubjectAccessReview.
    Webhook,
}

/// `authorization`: what an authenticated request may do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Authorization {
    /// `mode` (Webhook).
    pub mode: AuthorizationMode,
    /// `webhook.cacheAuthorizedTTL` (5m).
    pub webhook_cache_authorized_ttl: Duration,
    /// `webhook.cacheUnauthorizedTTL` (30s).
    pub webhook_cache_unauthorized_ttl: Duration,
}

impl Default for Authorization {
    fn default() -> Self {
        Authorization {
            mode: AuthorizationMode::Webhook,
            webhook_cache_authorized_ttl: Duration::from_secs(300),
            webhook_cache_unauthorized_ttl: Duration::from_secs(30),
        }
    }
}

/// The serving fields as written.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawServer {
    enable_server: Option<bool>,
    port: Option<i64>,
    tls_cert_file: Option<String>,
    tls_private_key_file: Option<String>,
    tls_min_version: Option<String>,
    tls_cipher_suites: Option<Vec<String>>,
    authentication: Option<RawAuthentication>,
    authorization: Option<RawAuthorization>,
    enable_debugging_handlers: Option<bool>,
    streaming_connection_idle_timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuthentication {
    x509: Option<RawX509>,
    webhook: Option<RawTokenWebhook>,
    anonymous: Option<RawAnonymous>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawX509 {
    #[serde(rename = "clientCAFile")]
    client_ca_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawTokenWebhook {
    enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    cache_ttl: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAnonymous {
    enabled: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawAuthorization {
    mode: Option<String>,
    webhook: Option<RawAccessWebhook>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawAccessWebhook {
    #[serde(rename = "cacheAuthorizedTTL")]
    cache_authorized_ttl: Option<String>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    cache_unauthorized_ttl: Option<String>,
}

impl RawServer {
    /// The settings, checked as upstream's validation checks them.
    pub(super) fn read(self, at: &impl Fn(&str, String) -> Error) -> Result<ServerConfiguration, Error> {
        let mut server = ServerConfiguration {
            enable_server: self.enable_server.unwrap_or(true),
            enable_debugging_handlers: self.enable_debugging_handlers.unwrap_or(true),
            ..Default::default()
        };
        if let Some(port) = self.port {
            server.port = u16::try_from(port)
                .map_err(|_| at("port", format!("{port} must be between 0 and 65535, inclusive")))?;
        }
        let path = |value: Option<String>| value.filter(|p| !p.is_empty()).map(PathBuf::from);
        server.tls_cert_file = path(self.tls_cert_file);
        server.tls_private_key_file = path(self.tls_private_key_file);
        if server.tls_cert_file.is_some() != server.tls_private_key_file.is_some() {
            return Err(at("tlsCertFile", "tlsCertFile and tlsPrivateKeyFile must be set together".to_owned()));
        }
        server.tls_min_version = self.tls_min_version.filter(|v| !v.is_empty());
        match server.tls_min_version.as_deref() {
            None | Some("VersionTLS12" | "VersionTLS13") => {}
            Some(version @ ("VersionTLS10" | "VersionTLS11")) => {
                let message = format!("{version:?} is not supported: the kubelet API speaks TLS 1.2 and 1.3 only");
                return Err(at("tlsMinVersion", message));
            }
            Some(other) => {
                let message = format!("{other:?} is not a TLS version: VersionTLS12 or VersionTLS13");
                return Err(at("tlsMinVersion", message));
            }
        }
        server.tls_cipher_suites = self.tls_cipher_suites.unwrap_or_default();
        // A zero TTL is "the default", as upstream's defaulting has it (kubeadm writes `0s`).
        let ttl = |field: &str, value: Option<String>, default: Duration| match value {
            None => Ok(default),
            Some(text) => match parse_duration(&text).map_err(|m| at(field, m))? {
                Duration::ZERO => Ok(default),
                set => Ok(set),
            },
        };
        server.streaming_connection_idle_timeout = ttl(
            "streamingConnectionIdleTimeout",
            self.streaming_connection_idle_timeout,
            STREAMING_CONNECTION_IDLE_TIMEOUT,
        )?;
        let authentication = self.authentication.unwrap_or_default();
        let defaults = Authentication::default();
        let webhook = authentication.webhook.unwrap_or_default();
        server.authentication = Authentication {
            client_ca_file: path(authentication.x509.and_then(|x| x.client_ca_file)),
            webhook_enabled: webhook.enabled.unwrap_or(defaults.webhook_enabled),
            webhook_cache_ttl: ttl("authentication", webhook.cache_ttl, defaults.webhook_cache_ttl)?,
            anonymous_enabled: authentication.anonymous.and_then(|a| a.enabled).unwrap_or(defaults.anonymous_enabled),
        };
        let authorization = self.authorization.unwrap_or_default();
        let defaults = Authorization::default();
        let mode = match authorization.mode.as_deref() {
            None | Some("") | Some("Webhook") => AuthorizationMode::Webhook,
            Some("AlwaysAllow") => AuthorizationMode::AlwaysAllow,
            Some(other) => {
                let message = format!("{other:?} is not an authorization mode: Webhook or AlwaysAllow");
                return Err(at("authorization", message));
            }
        };
        let webhook = authorization.webhook.unwrap_or_default();
        server.authorization = Authorization {
            mode,
            webhook_cache_authorized_ttl: ttl(
                "authorization",
                webhook.cache_authorized_ttl,
                defaults.webhook_cache_authorized_ttl,
            )?,
            webhook_cache_unauthorized_ttl: ttl(
                "authorization",
                webhook.cache_unauthorized_ttl,
                defaults.webhook_cache_unauthorized_ttl,
            )?,
        };
        Ok(server)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::configuration::KubeletConfiguration;

    fn parse(body: &str) -> Result<ServerConfiguration, Error> {
        let text = format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}");
        KubeletConfiguration::from_yaml(&text).map(|c| c.server)
    }

    #[test]
    fn upstreams_v1beta1_defaults_secure_the_api() {
        let server = parse("").unwrap();
        assert!(server.enable_server);
        assert_eq!(server.port, 10250);
        assert!(server.authentication.webhook_enabled && !server.authentication.anonymous_enabled);
        assert_eq!(server.authentication.webhook_cache_ttl, Duration::from_secs(120));
        assert_eq!(server.authorization.mode, AuthorizationMode::Webhook);
        assert_eq!(server.authorization.webhook_cache_authorized_ttl, Duration::from_secs(300));
        assert_eq!(server.authorization.webhook_cache_unauthorized_ttl, Duration::from_secs(30));
    }

    #[test]
    fn the_serving_fields_are_read_and_checked() {
        let server = parse(
            "port: 10350\ntlsCertFile: /pki/k.crt\ntlsPrivateKeyFile: /pki/k.key\ntlsMinVersion: VersionTLS13\n\
             authentication: {anonymous: {enabled: true}, webhook: {enabled: false, cacheTTL: 10s}, x509: {clientCAFile: /pki/ca.crt}}\n\
             authorization: {mode: AlwaysAllow, webhook: {cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: 0s}}\n",
        )
        .unwrap();
        assert_eq!(server.port, 10350);
        assert_eq!(server.tls_cert_file, Some(PathBuf::from("/pki/k.crt")));
        assert_eq!(server.tls_min_version.as_deref(), Some("VersionTLS13"));
        assert!(server.authentication.anonymous_enabled && !server.authentication.webhook_enabled);
        assert_eq!(server.authentication.webhook_cache_ttl, Duration::from_secs(10));
        assert_eq!(server.authentication.client_ca_file, Some(PathBuf::from("/pki/ca.crt")));
        assert_eq!(server.authorization.mode, AuthorizationMode::AlwaysAllow);
        assert_eq!(server.authorization.webhook_cache_authorized_ttl, Duration::from_secs(60));
        assert_eq!(server.authorization.webhook_cache_unauthorized_ttl, Duration::from_secs(30), "0s is the default");
        for (body, field, words) in [
            ("port: 70000\n", "port", "between 0 and 65535"),
            ("tlsCertFile: /pki/k.crt\n", "tlsCertFile", "set together"),
            ("tlsMinVersion: VersionTLS10\n", "tlsMinVersion", "TLS 1.2 and 1.3 only"),
            ("tlsMinVersion: TLS1.2\n", "tlsMinVersion", "not a TLS version"),
            ("authorization: {mode: RBAC}\n", "authorization", "Webhook or AlwaysAllow"),
            ("authentication: {webhook: {cacheTTL: soon}}\n", "authentication", ""),
        ] {
            let error = parse(body).unwrap_err();
            assert_eq!(error.field.as_deref(), Some(field), "{body}: {error}");
            assert!(error.message.contains(words), "{body}: {error}");
        }
        assert!(parse("authentication: {x509: {clientCaFile: /ca.crt}}\n").is_err(), "a misspelt key is refused");
    }
}
