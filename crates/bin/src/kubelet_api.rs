//! The kubelet API on `address:port` (`kubelet-server`): the local API's routes behind upstream's
//! TLS, authentication and authorization, as the API server calls them for `kubectl logs`.

use std::{path::Path, sync::Arc};

use anyhow::{Context, Result};
use config::configuration::{AuthorizationMode, ServerConfiguration};
use kubelet_cluster::certificate::{Renewal, SERVING, keep_renewed};
use kubelet_core::ErrorChain;
use server::{
    Authenticator, Authorizer, Guard,
    review::ApiReviews,
    tls::{ServingCertificate, ServingSlot, TlsSettings},
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

use crate::settings::Settings;

/// Serves `router` as the kubelet API when the settings ask for it; `client` (cluster mode)
/// answers the token and access reviews. Without a client, an API that needs those reviews
/// (upstream's defaults) is not served, with a warning saying why.
pub(crate) async fn serve(
    settings: &Settings,
    client: Option<kube::Client>,
    router: axum::Router,
    cancel: CancellationToken,
) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let Some(address) = settings.kubelet_api else { return Ok(Vec::new()) };
    let config = &settings.file.server;
    let reviews = match (&client, needs_reviews(config)) {
        (Some(client), _) => Some(ApiReviews::new(client.clone())),
        (None, false) => None,
        (None, true) => {
            warn!(
                %address,
                "the kubelet API is not served: its webhook authentication or authorization needs the API server \
                 (--kubeconfig); standalone, set authentication.webhook.enabled: false and authorization.mode: \
                 AlwaysAllow (with authentication.x509.clientCAFile) to serve it"
            );
            return Ok(Vec::new());
        }
    };
    let mut tasks = Vec::new();
    let certificate = match (client, settings.file.server_tls_bootstrap) {
        (Some(client), true) => {
            let slot = Arc::new(ServingSlot::default());
            tasks.push(keep_serving_certificate(settings, client, slot.clone(), cancel.child_token()));
            slot
        }
        (None, true) => {
            warn!(
                "serverTLSBootstrap needs the API server (--kubeconfig): the kubelet API's certificate is tlsCertFile's or self-signed"
            );
            ServingSlot::with(fixed_certificate(settings)?)?
        }
        (_, false) => ServingSlot::with(fixed_certificate(settings)?)?,
    };
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
        (AuthorizationMode::Webhook, None) => return Ok(Vec::new()),
    };
    let guard = Guard::new(tls, authenticator, authorizer, &settings.node_name);
    tasks.push(server::serve(address, guard, router, server::Limits::default(), cancel).await?);
    Ok(tasks)
}

/// `tlsCertFile` and `tlsPrivateKeyFile`, or the self-signed pair in `--cert-dir`.
fn fixed_certificate(settings: &Settings) -> Result<ServingCertificate> {
    let config = &settings.file.server;
    match (&config.tls_cert_file, &config.tls_private_key_file) {
        (Some(cert), Some(key)) => ServingCertificate::load(cert, key),
        _ => ServingCertificate::self_signed(&settings.cert_dir, &settings.node_name),
    }
    .context("cannot set up the kubelet API's serving certificate")
}

/// `serverTLSBootstrap`: the serving certificate in `--cert-dir` (`kubelet-server-current.pem`)
/// is presented when there is one, and a new one is asked for of the API server for the node's
/// name and IP (at once when there is none, then between 70% and 90% of its lifetime); until one
/// is issued, handshakes fail, as upstream's do.
fn keep_serving_certificate(
    settings: &Settings,
    client: kube::Client,
    slot: Arc<ServingSlot>,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let current = SERVING.current_file(&settings.cert_dir);
    let present = move |file: &Path| match ServingCertificate::load(file, file).and_then(|c| slot.set(c)) {
        Ok(()) => info!(file = %file.display(), "the kubelet API presents the serving certificate"),
        Err(err) => warn!(error = %ErrorChain(&err), "cannot use the serving certificate"),
    };
    if current.exists() {
        present(&current);
    }
    let ips = settings.node_ip.parse().into_iter().chain(settings.secondary_node_ip).collect();
    let renewal =
        Renewal::new(SERVING, &settings.cert_dir, &settings.node_name).for_names(vec![settings.node_name.clone()], ips);
    let existing = move || std::fs::read(&current).ok();
    let renewing = keep_renewed(client, renewal, existing, present, cancel);
    tokio::spawn(renewing.instrument(info_span!("serving_certificate")))
}

/// Whether the configuration asks the API server about tokens or access.
fn needs_reviews(config: &ServerConfiguration) -> bool {
    config.authentication.webhook_enabled || config.authorization.mode == AuthorizationMode::Webhook
}
