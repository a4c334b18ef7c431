//! Pull secrets (upstream `pkg/credentialprovider`): the credentials of a pod's
//! `imagePullSecrets` for an image, from `.dockerconfigjson` (`{"auths": {...}}`) and legacy
//! `.dockercfg` secrets, matched as upstream's keyring matches them: the registry host (a
//! `*.` wildcard matches one label), then a path prefix; the longest match is tried first.

use base64::Engine as _;
use kubelet_core::volume::ObjectData;
use serde_json::Value;

use crate::pb;

/// Docker Hub's names for itself, as images without a registry mean it.
const DOCKER_HUB: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];

/// `registry[/path]` of a credential's key: no scheme, no trailing slash, no `/v1`/`/v2`, and
/// Docker Hub's names as `docker.io`.
fn normalize_key(key: &str) -> String {
    let key = key.trim().trim_start_matches("https://").trim_start_matches("http://").trim_end_matches('/');
    let key = key.strip_suffix("/v1").or_else(|| key.strip_suffix("/v2")).unwrap_or(key);
    let (host, path) = key.split_once('/').unwrap_or((key, ""));
    let host = if DOCKER_HUB.contains(&host) { "docker.io" } else { host };
    if path.is_empty() { host.to_owned() } else { format!("{host}/{path}") }
}

/// `registry/repository` of an image reference, without tag or digest; Docker Hub's images as
/// `docker.io/library/x` or `docker.io/user/x`.
fn repository(image: &str) -> String {
    let name = image.split('@').next().unwrap_or(image);
    let name = match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    };
    let (first, rest) = name.split_once('/').unwrap_or(("", name));
    let is_host = first.contains('.') || first.contains(':') || first == "localhost";
    match (is_host, first.is_empty()) {
        (true, _) if DOCKER_HUB.contains(&first) => format!("docker.io/{rest}"),
        (true, _) => name.to_owned(),
        (false, true) => format!("docker.io/library/{rest}"),
        (false, false) => format!("docker.io/{name}"),
    }
}

/// Whether credential key `key` (normalized) covers `repository`.
fn matches(key: &str, repository: &str) -> bool {
    let (key_host, key_path) = key.split_once('/').unwrap_or((key, ""));
    let (host, path) = repository.split_once('/').unwrap_or((repository, ""));
    let host_ok = match key_host.strip_prefix("*.") {
        Some(domain) => {
            host.strip_suffix(domain).is_some_and(|sub| sub.ends_with('.') && !sub[..sub.len() - 1].contains('.'))
        }
        None => key_host == host,
    };
    host_ok && (key_path.is_empty() || path == key_path || path.starts_with(&format!("{key_path}/")))
}

/// The credentials of one registry entry.
fn auth_config(key: &str, entry: &Value) -> pb::AuthConfig {
    let text = |field: &str| entry[field].as_str().unwrap_or_default().to_owned();
    let (mut username, mut password) = (text("username"), text("password"));
    if let Some(auth) = entry["auth"].as_str().filter(|a| !a.is_empty())
        && let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(auth)
        && let Some((user, pass)) = String::from_utf8_lossy(&decoded).split_once(':')
    {
        (username, password) = (user.to_owned(), pass.to_owned());
    }
    pb::AuthConfig {
        username,
        password,
        server_address: key.to_owned(),
        identity_token: text("identitytoken"),
        registry_token: text("registrytoken"),
        ..Default::default()
    }
}

/// Every registry entry of a pull secret, by normalized key.
fn entries(data: &ObjectData) -> Vec<(String, pb::AuthConfig)> {
    let parsed = |key: &str| data.get(key).and_then(|bytes| serde_json::from_slice::<Value>(bytes).ok());
    let registries = match (parsed(".dockerconfigjson"), parsed(".dockercfg")) {
        (Some(config), _) => config["auths"].clone(),
        (None, Some(legacy)) => legacy,
        (None, None) => Value::Null,
    };
    let Value::Object(registries) = registries else { return Vec::new() };
    registries.iter().map(|(key, entry)| (normalize_key(key), auth_config(key, entry))).collect()
}

/// The credentials of `secrets` (the pod's pull secrets, in order) for `image`, the most
/// specific key first.
pub(crate) fn for_image(image: &str, secrets: &[ObjectData]) -> Vec<pb::AuthConfig> {
    let repository = repository(image);
    let mut found: Vec<(usize, pb::AuthConfig)> = secrets
        .iter()
        .flat_map(entries)
        .filter(|(key, _)| matches(key, &repository))
        .map(|(key, auth)| (key.len(), auth))
        .collect();
    found.sort_by_key(|(len, _)| std::cmp::Reverse(*len));
    found.into_iter().map(|(_, auth)| auth).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn secret(key: &str, json: &str) -> ObjectData {
        BTreeMap::from([(key.to_owned(), json.as_bytes().to_vec())])
    }

    #[test]
    fn images_name_their_registry_and_repository() {
        assert_eq!(repository("busybox"), "docker.io/library/busybox");
        assert_eq!(repository("busybox:1.35"), "docker.io/library/busybox");
        assert_eq!(repository("me/app@sha256:abc"), "docker.io/me/app");
        assert_eq!(repository("index.docker.io/me/app:1"), "docker.io/me/app");
        assert_eq!(repository("127.0.0.1:5000/team/app:2"), "127.0.0.1:5000/team/app");
        assert_eq!(repository("localhost/app"), "localhost/app");
        assert_eq!(normalize_key("https://index.docker.io/v1/"), "docker.io");
        assert_eq!(normalize_key("registry.example.com/team/"), "registry.example.com/team");
    }

    #[test]
    fn the_most_specific_matching_credential_comes_first() {
        let user_pass = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        let json = format!(
            r#"{{"auths": {{"registry.example.com": {{"auth": "{user_pass}"}},
                "registry.example.com/team": {{"username": "bob", "password": "pw"}},
                "*.cdn.example.com": {{"username": "carol", "password": "pw"}},
                "https://index.docker.io/v1/": {{"username": "dan", "password": "pw"}}}}}}"#
        );
        let secrets = [secret(".dockerconfigjson", &json)];
        let users = |image: &str| for_image(image, &secrets).into_iter().map(|a| a.username).collect::<Vec<_>>();
        assert_eq!(users("registry.example.com/team/app:1"), ["bob", "alice"]);
        assert_eq!(users("registry.example.com/other/app"), ["alice"]);
        let alice = &for_image("registry.example.com/x", &secrets)[0];
        assert_eq!((alice.password.as_str(), alice.server_address.as_str()), ("s3cret", "registry.example.com"));
        assert_eq!(users("eu.cdn.example.com/app"), ["carol"]);
        assert!(users("a.b.cdn.example.com/app").is_empty(), "a wildcard is one label");
        assert_eq!(users("busybox"), ["dan"]);
        assert!(users("quay.io/app").is_empty());
        let legacy = [secret(".dockercfg", r#"{"quay.io": {"username": "erin", "password": "pw"}}"#)];
        assert_eq!(for_image("quay.io/app", &legacy)[0].username, "erin");
        assert!(for_image("quay.io/app", &[secret(".dockerconfigjson", "not json")]).is_empty());
    }
}
