//! `/configz` on the kubelet API: the configuration in force, as upstream's kubelet shows it
//! (`{"kubeletconfig": {...}}`, the v1beta1 fields with defaults applied and the flags merged in).

use std::sync::Arc;

use axum::{Json, Router, extract::State, routing::get};
use serde_json::{Value, json};

use crate::settings::{LogFormat, Settings};

/// The route, answering with the configuration the agent started with.
pub(crate) fn router(settings: &Settings) -> Router {
    Router::new().route("/configz", get(configz)).with_state(Arc::new(configuration_in_force(settings)))
}

async fn configz(State(configuration): State<Arc<Value>>) -> Json<Value> {
    Json(configuration.as_ref().clone())
}

/// The file's fields with what the flags set outside it (`--v`, `--logging-format`).
fn configuration_in_force(settings: &Settings) -> Value {
    let mut fields = settings.file.to_v1beta1();
    let format = match settings.log_format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    fields["logging"] = json!({"format": format, "verbosity": settings.verbosity});
    json!({ "kubeletconfig": fields })
}
