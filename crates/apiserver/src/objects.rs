//! The content of API-backed volumes from the API server (upstream's config map and secret
//! managers with the `Get` change detection strategy, and its token manager): [`ApiObjects`]
//! implements `kubelet_core::volume::ObjectSource`.
//!
//! Config maps and secrets are read at each set-up of a volume (every sync of its pod), so a
//! change reaches the files at the pod's next sync. Tokens come from the TokenRequest API, bound
//! to the pod, and are kept until 80% of their lifetime has passed (upstream's refresh point);
//! the cache drops every token due, so it holds no more than the tokens of the last lifetime.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{ConfigMap, Pod, Secret, ServiceAccount},
};
use kube::{Api, Client, api::PostParams};
use kubelet_core::{
    hook::BoxFuture,
    volume::{ObjectData, ObjectSource},
};
use tokio::time::Instant;

/// A token kept: the JWT and when it should be replaced.
#[derive(Debug)]
struct Token {
    jwt: String,
    refresh_at: Instant,
}

/// Config maps, secrets and service account tokens from the API server.
pub struct ApiObjects {
    client: Client,
    /// Tokens by pod UID, audience and lifetime.
    tokens: Mutex<HashMap<(String, String, i64), Token>>,
}

impl std::fmt::Debug for ApiObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiObjects").finish_non_exhaustive()
    }
}

impl ApiObjects {
    /// Objects read through `client`.
    pub fn new(client: Client) -> Self {
        ApiObjects { client, tokens: Mutex::default() }
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String, i64), Token>> {
        // Each critical section inserts, reads or removes whole entries: a poisoned map is whole.
        self.tokens.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn failed(what: &str, err: &kube::Error) -> String {
    format!("cannot get {what}: {err}")
}

impl ObjectSource for ApiObjects {
    fn config_map<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ObjectData>, String>> {
        Box::pin(async move {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
            let found = api.get_opt(name).await.map_err(|e| failed(&format!("configmap {namespace}/{name}"), &e))?;
            Ok(found.map(|cm| {
                let text = cm.data.into_iter().flatten().map(|(k, v)| (k, v.into_bytes()));
                text.chain(cm.binary_data.into_iter().flatten().map(|(k, v)| (k, v.0))).collect()
            }))
        })
    }

    fn secret<'a>(&'a self, namespace: &'a str, name: &'a str) -> BoxFuture<'a, Result<Option<ObjectData>, String>> {
        Box::pin(async move {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
            let found = api.get_opt(name).await.map_err(|e| failed(&format!("secret {namespace}/{name}"), &e))?;
            Ok(found.map(|s| s.data.into_iter().flatten().map(|(k, v)| (k, v.0)).collect()))
        })
    }

    fn service_account_token<'a>(
        &'a self,
        pod: &'a Pod,
        audience: Option<&'a str>,
        expiration_seconds: i64,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let key = (uid.clone(), audience.unwrap_or_default().to_owned(), expiration_seconds);
            if let Some(token) = self.tokens().get(&key).filter(|t| Instant::now() < t.refresh_at) {
                return Ok(token.jwt.clone());
            }
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            let account = pod.spec.as_ref().and_then(|s| s.service_account_name.as_deref()).unwrap_or("default");
            let request = TokenRequest {
                spec: Some(TokenRequestSpec {
                    audiences: audience.map(|a| vec![a.to_owned()]),
                    expiration_seconds: Some(expiration_seconds),
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".to_owned()),
                        kind: Some("Pod".to_owned()),
                        name: pod.metadata.name.clone(),
                        uid: Some(uid),
                    }),
                }),
                ..TokenRequest::default()
            };
            let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
            let response = api
                .create_token_request(account, &PostParams::default(), &request)
                .await
                .map_err(|e| format!("cannot get a token of service account {namespace}/{account}: {e}"))?;
            let jwt = response
                .status
                .and_then(|s| s.token)
                .filter(|t| !t.is_empty())
                .ok_or("the API server sent no token")?;
            let lifetime = Duration::from_secs(u64::try_from(expiration_seconds).unwrap_or(3600));
            let refresh_at = Instant::now() + lifetime.mul_f64(0.8);
            let mut tokens = self.tokens();
            // Tokens due for refresh go (a gone pod's among them), so the cache stays small.
            tokens.retain(|_, t| Instant::now() < t.refresh_at);
            tokens.insert(key, Token { jwt: jwt.clone(), refresh_at });
            Ok(jwt)
        })
    }
}
