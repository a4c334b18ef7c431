//! The kubelet API on `address:port` (`kubelet-server`): the local API's routes behind upstream's
//! TLS, authentication and authorization, as the API server calls them for `kubectl logs`.

use std::sync::Arc;

use anyhow::{Context, Result};
use config::configuration::{AuthorizationMode, ServerConfiguration};
use server::{
    Authenticator, Authorizer, Guard,
    review::ApiReviews,
    tls::{ServingCertificate, TlsSettings},
};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::settings::Settings;

/// Serves `router` as the kubelet API when the settings ask for it; `client` (cluster mode)
/// answers the token and access reviews. Without a client, an API that needs those reviews
/// (upstream's defaults) is not served, with a warning saying why.
pub(crate) async fn serve(
    settings: &Settings,
    client: Option<kube::Client>,
    router: axum::Router,
    cancel: CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(address) = settings.kubelet_api else { return Ok(None) };
    let config = &settings.file.server;
    let reviews = match (client, needs_reviews(config)) {
        (Some(client), _) => Some(ApiReviews::new(client)),
        (None, false) => None,
        (None, true) => {
            warn!(
                %address,
                "the kubelet API is not served: its webhook authentication or authorization needs the API server \
                 (--kubeconfig); standalone, set authentication.webhook.enabled: false and authorization.mode: \
                 AlwaysAllow (with authentication.x509.clientCAFile) to serve it"
            );
            return Ok(None);
        }
    };
    let certificate = match (&config.tls_cert_file, &config.tls_private_key_file) {
        (Some(cert), Some(key)) => ServingCertificate::load(cert, key),
        _ => ServingCertificate::self_signed(&settings.cert_dir, &settings.node_name),
    }
    .context("cannot set up the kubelet API's serving certificate")?;
    let authentication = &config.authentication;
    let tls_settings = TlsSettings::new(
        authentication.client_ca_file.clone(),
        config.tls_min_version.clone(),
        config.tls_cipher_suites.clone(),
    );
    let tls = server::tls::server_config(certificate, &tls_settings).context("cannot set up the kubelet API's TLS")?;
    let token_reviews = reviews
        .clone()
        .filter(|_| authentication.webhook_enabled)
        .map(|r| (Arc::new(r) as Arc<dyn server::authn::TokenReviewer>, authentication.webhook_cache_ttl));
    let authenticator = Authenticator::new(token_reviews, authentication.anonymous_enabled);
    let authorizer = match (config.authorization.mode, reviews) {
        (AuthorizationMode::AlwaysAllow, _) => Authorizer::AlwaysAllow,
        (AuthorizationMode::Webhook, Some(reviews)) => Authorizer::webhook(
            Arc::new(reviews),
            config.authorization.webhook_cache_authorized_ttl,
            config.authorization.webhook_cache_unauthorized_ttl,
        ),
        // `needs_reviews` made sure there is a client.
        (AuthorizationMode::Webhook, None) => return Ok(None),
    };
    let guard = Guard::new(tls, authenticator, authorizer, &settings.node_name);
    let serving = server::serve(address, guard, router, cancel).await?;
    Ok(Some(serving))
}

/// Whether the configuration asks the API server about tokens or access.
fn needs_reviews(config: &ServerConfiguration) -> bool {
    config.authentication.webhook_enabled || config.authorization.mode == AuthorizationMode::Webhook
}
