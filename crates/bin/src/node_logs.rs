//! `/logs/` on the kubelet API: the node's log directory, `/var/log`, as upstream's kubelet
//! serves it (`enableSystemLogHandler`, Go's `http.FileServer`): a directory as a list of links,
//! a file as its bytes. Off, it answers 405 `logs endpoint is disabled.`, as upstream's.
//!
//! Containers can write below `/var/log` (a hostPath volume, a log shipper's), so a link there
//! may lead anywhere, and a directory may be swapped for a link between a check and an open:
//! what is served is what an open file descriptor holds, and only when the kernel's own name for
//! it (`/proc/self/fd/N`) is below the directory. Only regular files and directories are
//! served (a FIFO would hold a thread until someone wrote to it). A file is streamed in chunks,
//! whatever its size.

use std::path::{Component, Path, PathBuf};

use axum::{
    Router,
    body::Body,
    extract::{Path as UrlPath, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{any, get},
};

/// Where upstream's kubelet serves `/logs/` from.
pub(crate) const NODE_LOG_DIR: &str = "/var/log";

/// The routes of `/logs/`: the files below `dir` when `enabled`, else upstream's refusal.
pub(crate) fn router(enabled: bool, dir: impl Into<PathBuf>) -> Router {
    if !enabled {
        return Router::new()
            .route("/logs", any(disabled))
            .route("/logs/", any(disabled))
            .route("/logs/{*path}", any(disabled));
    }
    Router::new()
        .route("/logs", get(redirect_to_directory))
        .route("/logs/", get(serve_root))
        .route("/logs/{*path}", get(serve_path))
        .with_state(Base(dir.into()))
}

/// The directory served.
#[derive(Clone)]
struct Base(PathBuf);

async fn disabled() -> Response {
    (StatusCode::METHOD_NOT_ALLOWED, "logs endpoint is disabled.\n").into_response()
}

/// `/logs` without its slash: Go's file server sends the client to the directory's own path.
async fn redirect_to_directory() -> Response {
    (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, "/logs/")]).into_response()
}

async fn serve_root(State(base): State<Base>) -> Response {
    serve(&base.0, "").await
}

async fn serve_path(State(base): State<Base>, UrlPath(path): UrlPath<String>) -> Response {
    serve(&base.0, &path).await
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "404 page not found\n").into_response()
}

/// The file or directory `relative` names below `base`, if it is one there.
async fn serve(base: &Path, relative: &str) -> Response {
    let Some(opened) = open_inside(base, relative).await else { return not_found() };
    let Ok(metadata) = opened.metadata() else { return not_found() };
    if metadata.is_dir() {
        if !relative.is_empty() && !relative.ends_with('/') {
            let name = relative.rsplit('/').next().unwrap_or_default();
            return (StatusCode::MOVED_PERMANENTLY, [(header::LOCATION, format!("{name}/"))]).into_response();
        }
        // Listed through the descriptor: the directory checked, whatever its name is now.
        return listing(&held_path(&opened)).await;
    }
    if !metadata.is_file() {
        return not_found();
    }
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(opened)));
    let headers = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    (StatusCode::OK, headers, body).into_response()
}

/// The kernel's name of what `file` holds open.
fn held_path(file: &std::fs::File) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// `relative` below `base` opened, when what was opened is below `base`:
/// a path of plain names (no `..`), opened without blocking (a FIFO opens at once) and checked
/// through its descriptor, so no link swapped in after the check leads out.
async fn open_inside(base: &Path, relative: &str) -> Option<std::fs::File> {
    let inside = resolve_inside(base, relative).await?;
    let base = tokio::fs::canonicalize(base).await.ok()?;
    let opened = tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW).open(inside)
    })
    .await
    .ok()?
    .ok()?;
    let real = tokio::fs::read_link(held_path(&opened)).await.ok()?;
    real.starts_with(&base).then_some(opened)
}

/// `base` joined with `relative`, every link resolved, when that stays below `base`: a path
/// of plain names (no `..`), whose real location is `base` or below it.
async fn resolve_inside(base: &Path, relative: &str) -> Option<PathBuf> {
    let relative = Path::new(relative.trim_start_matches('/'));
    if relative.components().any(|part| !matches!(part, Component::Normal(_))) {
        return None;
    }
    let base = tokio::fs::canonicalize(base).await.ok()?;
    let real = tokio::fs::canonicalize(base.join(relative)).await.ok()?;
    real.starts_with(&base).then_some(real)
}

/// The most entries a listing shows: a directory a container filled with names costs no more.
const MOST_ENTRIES: usize = 10_000;

/// A directory as Go's file server lists it: its entries by name, directories with a `/`, at
/// most [`MOST_ENTRIES`] of them.
async fn listing(dir: &Path) -> Response {
    let Ok(mut entries) = tokio::fs::read_dir(dir).await else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "Error reading directory\n").into_response();
    };
    let mut names = Vec::new();
    while names.len() < MOST_ENTRIES
        && let Ok(Some(entry)) = entries.next_entry().await
    {
        let is_dir = entry.file_type().await.is_ok_and(|kind| kind.is_dir());
        let name = entry.file_name().to_string_lossy().into_owned();
        names.push(if is_dir { format!("{name}/") } else { name });
    }
    names.sort();
    let mut page = String::from("<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n");
    for name in names {
        let shown = escape_html(&name);
        page.push_str(&format!("<a href=\"{}\">{shown}</a>\n", escape_html(&percent_encode_path(&name))));
    }
    page.push_str("</pre>\n");
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response()
}

fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&#34;").replace('\'', "&#39;")
}

/// `name` as a relative URL path: every byte but the unreserved ones and `/` percent-encoded.
fn percent_encode_path(name: &str) -> String {
    let mut encoded = String::new();
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use axum::body::to_bytes;
    use tower::ServiceExt;

    use super::*;

    async fn get_path(router: &Router, path: &str) -> (StatusCode, String) {
        let request = axum::http::Request::get(path).body(Body::empty()).unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn files_and_directories_below_the_log_directory_are_served_and_nothing_outside() {
        let scratch = tempfile::tempdir().unwrap();
        let logs = scratch.path().join("log");
        std::fs::create_dir_all(logs.join("pods/ns_web_u1")).unwrap();
        std::fs::write(logs.join("syslog"), "boot\n").unwrap();
        std::fs::write(logs.join("pods/ns_web_u1/0.log"), "hello\n").unwrap();
        std::fs::write(scratch.path().join("secret"), "outside\n").unwrap();
        // A container with a hostPath volume on the log directory leaves links out of it.
        std::os::unix::fs::symlink(scratch.path().join("secret"), logs.join("escape")).unwrap();
        std::os::unix::fs::symlink(logs.join("pods/ns_web_u1/0.log"), logs.join("web.log")).unwrap();
        nix::unistd::mkfifo(&logs.join("pipe"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let router = router(true, &logs);

        assert_eq!(get_path(&router, "/logs/syslog").await, (StatusCode::OK, "boot\n".to_owned()));
        assert_eq!(get_path(&router, "/logs/web.log").await, (StatusCode::OK, "hello\n".to_owned()), "a link inside");
        assert_eq!(get_path(&router, "/logs/escape").await.0, StatusCode::NOT_FOUND, "a link out");
        assert_eq!(get_path(&router, "/logs/../secret").await.0, StatusCode::NOT_FOUND);
        assert_eq!(get_path(&router, "/logs/%2e%2e/secret").await.0, StatusCode::NOT_FOUND);
        assert_eq!(get_path(&router, "/logs/pipe").await.0, StatusCode::NOT_FOUND, "a FIFO holds no thread");
        let (status, listed) = get_path(&router, "/logs/").await;
        assert_eq!(status, StatusCode::OK);
        assert!(listed.contains("<a href=\"pods/\">pods/</a>\n<a href=\"syslog\">syslog</a>"), "{listed}");
        assert_eq!(get_path(&router, "/logs/pods").await.0, StatusCode::MOVED_PERMANENTLY);
        let (status, listed) = get_path(&router, "/logs/pods/ns_web_u1/").await;
        assert!(status == StatusCode::OK && listed.contains("0.log"), "{listed}");
    }

    #[tokio::test]
    async fn a_disabled_handler_answers_405_as_upstreams() {
        let router = router(false, "/nonexistent");
        for path in ["/logs", "/logs/", "/logs/syslog"] {
            assert_eq!(
                get_path(&router, path).await,
                (StatusCode::METHOD_NOT_ALLOWED, "logs endpoint is disabled.\n".to_owned())
            );
        }
    }
}
