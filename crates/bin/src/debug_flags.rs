//! `/debug/flags/v` on the kubelet API: `PUT` a klog verbosity to change the agent's while it
//! runs, as upstream's kubelet takes it (`enableDebugFlagsHandler`, component-base's
//! `StringFlagPutHandler` with `GlogSetter`). Off, it answers 405 `flags endpoint is disabled.`

use axum::{
    Router,
    body::Bytes,
    http::{Method, StatusCode, header},
    response::{IntoResponse, Response},
    routing::any,
};

/// The route: the handler when `enabled`, else upstream's refusal.
pub(crate) fn router(enabled: bool) -> Router {
    if !enabled {
        return Router::new().route("/debug/flags/v", any(disabled));
    }
    Router::new().route("/debug/flags/v", any(put_verbosity))
}

async fn disabled() -> Response {
    (StatusCode::METHOD_NOT_ALLOWED, "flags endpoint is disabled.\n").into_response()
}

/// Upstream's answers, plain text ending in a newline.
fn plain(status: StatusCode, text: &str) -> Response {
    let headers = [(header::CONTENT_TYPE, "text/plain"), (header::X_CONTENT_TYPE_OPTIONS, "nosniff")];
    (status, headers, format!("{text}\n")).into_response()
}

async fn put_verbosity(method: Method, body: Bytes) -> Response {
    if method != Method::PUT {
        return plain(StatusCode::NOT_ACCEPTABLE, "unsupported http method");
    }
    let value = String::from_utf8_lossy(&body).into_owned();
    match set(&value) {
        Ok(said) => plain(StatusCode::OK, &said),
        Err(err) => plain(StatusCode::BAD_REQUEST, &err),
    }
}

/// Upstream's `GlogSetter`: the value is klog's `-v`, an unsigned 32-bit number as given (no
/// space around it); it replaces the filter the agent started with, `RUST_LOG`'s too.
fn set(value: &str) -> Result<String, String> {
    let verbosity: u32 = value.parse().map_err(|_| {
        format!("failed set klog.logging.verbosity {value}: strconv.ParseUint: parsing {value:?}: invalid syntax")
    })?;
    let verbosity = u8::try_from(verbosity).unwrap_or(u8::MAX);
    crate::logging::set_verbosity(verbosity)
        .map_err(|err| format!("failed set klog.logging.verbosity {value}: {err}"))?;
    Ok(format!("successfully set klog.logging.verbosity to {value}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verbosity_that_is_no_number_is_refused_in_upstreams_words() {
        let err = set("loud").unwrap_err();
        assert!(err.starts_with("failed set klog.logging.verbosity loud: "), "{err}");
        assert!(set("4\n").is_err(), "taken as given, as upstream's");
    }
}
