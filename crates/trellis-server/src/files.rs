//! A run's files: a stage's `prompt.md`, `response.md`, `status.json`, logs, and the artifacts the run
//! captured. Nothing outside the run directory is ever served: `..`, `.`, empty segments, backslashes and
//! encoded separators are refused, no symbolic link is followed (the run directory included), and only
//! regular files with one link are read (a hard link a command made could name any file). Every
//! refusal is a plain `404`, so a probe learns nothing. Files are sent as text or as downloads, never as
//! something a browser would run (HTML and SVG included).

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderValue, Uri, header};
use axum::response::{IntoResponse, Response};

use crate::api::{ApiError, blocking};
use crate::runs::Server;

/// Files larger than this are refused (the web app shows logs, not disk images).
const MAX_FILE: u64 = 64 << 20;

/// A stage's file, or a file under it (`artifacts/...` of a CLI agent, for example).
#[utoipa::path(get, path = "/api/runs/{id}/stages/{dir}/{file}",
    params(("id" = String, Path, description = "The run id"),
        ("dir" = String, Path, description = "The stage directory (`002-build@1`)"),
        ("file" = String, Path, description = "The file: `prompt.md`, `response.md`, `status.json`, `stdout.log`, ...")),
    responses((status = 200, description = "The file: text as `text/plain` or `application/json`, anything else as a download"),
        (status = 404, description = "No such file in the run (or a path that leaves it)")))]
pub async fn stage_file(
    State(server): State<Arc<Server>>,
    UrlPath((id, dir, file)): UrlPath<(String, String, String)>,
    uri: Uri,
) -> Result<Response, ApiError> {
    serve(server, id, uri, vec!["stages".to_owned(), dir], file).await
}

/// A captured artifact: `artifacts/<node>/attempt-<n>/<path>` of the run.
#[utoipa::path(get, path = "/api/runs/{id}/artifacts/{path}",
    params(("id" = String, Path, description = "The run id"),
        ("path" = String, Path, description = "The artifact's path under the run's `artifacts/` folder")),
    responses((status = 200, description = "The artifact, as text or a download"),
        (status = 404, description = "No such artifact")))]
pub async fn artifact(
    State(server): State<Arc<Server>>,
    UrlPath((id, path)): UrlPath<(String, String)>,
    uri: Uri,
) -> Result<Response, ApiError> {
    serve(server, id, uri, vec!["artifacts".to_owned()], path).await
}

fn not_found() -> ApiError {
    ApiError::not_found("no such file in the run")
}

async fn serve(
    server: Arc<Server>,
    id: String,
    uri: Uri,
    prefix: Vec<String>,
    rest: String,
) -> Result<Response, ApiError> {
    // Separators and dots sent encoded are refused before anything is decoded into a path.
    let raw = uri.path().to_ascii_lowercase();
    if ["%2f", "%5c", "%2e", "%00"].iter().any(|e| raw.contains(e)) {
        return Err(not_found());
    }
    let mut segments = prefix;
    segments.extend(rest.split('/').map(str::to_owned));
    let (bytes, name) = blocking(move || {
        let record = server.record(&id).map_err(|_| not_found())?;
        read_inside(record.root(), &segments)
    })
    .await?;
    Ok(typed(bytes, &name))
}

/// Reads `root/segments...` when every segment is a plain name, no component is a symbolic link and the
/// file is a regular file of a sane size.
#[allow(
    clippy::disallowed_methods,
    reason = "runs on the blocking pool (stage files)"
)]
fn read_inside(root: &Path, segments: &[String]) -> Result<(Vec<u8>, String), ApiError> {
    if segments.len() < 2 || !segments.iter().all(|s| trellis_store::plain_name(s)) {
        return Err(not_found());
    }
    let mut path = PathBuf::from(root);
    for segment in segments {
        path.push(segment);
        let meta = std::fs::symlink_metadata(&path).map_err(|_| not_found())?;
        if meta.file_type().is_symlink() {
            return Err(not_found());
        }
    }
    let meta = std::fs::symlink_metadata(&path).map_err(|_| not_found())?;
    // A second name for a file (a hard link a command made) may be a file from anywhere: everything
    // the run itself writes has one.
    if !meta.is_file() || meta.nlink() != 1 || meta.len() > MAX_FILE {
        return Err(not_found());
    }
    let bytes = std::fs::read(&path).map_err(|_| not_found())?;
    Ok((bytes, segments.last().cloned().unwrap_or_default()))
}

/// Text files as text (UTF-8), JSON as JSON, anything else as a download; never sniffed.
fn typed(bytes: Vec<u8>, name: &str) -> Response {
    let extension = Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let content_type = match extension.as_str() {
        "json" => Some("application/json"),
        "jsonl" | "md" | "log" | "txt" | "diff" | "patch" | "csv" | "yaml" | "yml" | "toml"
        | "rs" | "py" | "js" | "ts" | "sh" | "fabro" | "dot" => Some("text/plain; charset=utf-8"),
        _ if std::str::from_utf8(&bytes).is_ok() && extension != "html" && extension != "svg" => {
            Some("text/plain; charset=utf-8")
        }
        _ => None,
    };
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; sandbox"),
    );
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type.unwrap_or("application/octet-stream")),
    );
    if content_type.is_none() {
        headers.insert(
            header::CONTENT_DISPOSITION,
            HeaderValue::from_static("attachment"),
        );
    }
    response
}
