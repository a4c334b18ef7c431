//! Pods with resources, for the tests.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// `key=value,...` as a resource list.
fn list(text: &str) -> Value {
    let pairs = text.split(',').filter_map(|kv| kv.split_once('='));
    Value::Object(pairs.map(|(k, v)| (k.to_owned(), Value::from(v))).collect())
}

/// Pod `uid` with containers of (name, requests, limits).
pub(crate) fn pod(uid: &str, containers: &[(&str, &str, &str)]) -> Pod {
    let containers: Vec<Value> = containers
        .iter()
        .map(|(name, requests, limits)| json!({"name": name, "resources": {"requests": list(requests), "limits": list(limits)}}))
        .collect();
    serde_json::from_value(json!({"metadata": {"uid": uid}, "spec": {"containers": containers}})).unwrap()
}
