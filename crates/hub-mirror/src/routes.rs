//! The hub's HTTP surface, answering as huggingface.co does: the model listing
//! (`/api/models/...`) and file downloads (`/{repo}/resolve/{rev}/{path}`).

use crate::repo::{Repo, RepoFile};
use crate::LoggedRequest;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::header::{
    HeaderName, ACCEPT_RANGES, AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG, RANGE,
};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::SeekFrom;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio_util::io::ReaderStream;

pub(crate) struct Hub {
    pub repos: BTreeMap<String, Repo>,
    pub log: Arc<Mutex<Vec<LoggedRequest>>>,
}

type Shared = Arc<Hub>;

pub(crate) fn router(hub: Shared) -> Router {
    Router::new()
        .route("/api/models/{owner}/{name}", get(listing))
        .route("/api/models/{owner}/{name}/revision/{rev}", get(listing_at))
        .route("/{owner}/{name}/resolve/{rev}/{*path}", get(resolve).head(resolve))
        .fallback(|| async { error(StatusCode::NOT_FOUND, None, "Not Found") })
        .layer(middleware::from_fn_with_state(hub.clone(), log_request))
        .with_state(hub)
}

async fn log_request(State(hub): State<Shared>, request: Request, next: Next) -> Response {
    let logged = LoggedRequest {
        method: request.method().to_string(),
        path: request.uri().path().to_string(),
        query: request.uri().query().map(str::to_string),
        range: header(request.headers(), RANGE),
        authorization: header(request.headers(), AUTHORIZATION),
    };
    hub.log.lock().unwrap_or_else(|e| e.into_inner()).push(logged);
    next.run(request).await
}

fn header(headers: &HeaderMap, name: HeaderName) -> Option<String> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// Hugging Face's error answers: `{"error": "..."}` and an `X-Error-Code` header.
fn error(status: StatusCode, code: Option<&'static str>, message: &str) -> Response {
    let mut response = (status, axum::Json(serde_json::json!({ "error": message }))).into_response();
    if let Some(code) = code {
        response.headers_mut().insert("x-error-code", HeaderValue::from_static(code));
    }
    response
}

/// Why a repository at a revision cannot be served.
enum Missing {
    Repo,
    Revision(String),
}

impl IntoResponse for Missing {
    fn into_response(self) -> Response {
        match self {
            Missing::Repo => error(StatusCode::NOT_FOUND, Some("RepoNotFound"), "Repository not found"),
            Missing::Revision(rev) => {
                error(StatusCode::NOT_FOUND, Some("RevisionNotFound"), &format!("Invalid rev id: {rev}"))
            }
        }
    }
}

/// The repository and the revision asked for: `main` or the repository's commit id.
fn find<'h>(hub: &'h Hub, owner: &str, name: &str, rev: &str) -> Result<(String, &'h Repo), Missing> {
    let id = format!("{owner}/{name}");
    let repo = hub.repos.get(&id).ok_or(Missing::Repo)?;
    if rev != "main" && rev != repo.sha {
        return Err(Missing::Revision(rev.to_string()));
    }
    Ok((id, repo))
}

#[derive(Deserialize)]
struct ListingQuery {
    #[serde(default)]
    blobs: Option<String>,
}

async fn listing(
    State(hub): State<Shared>,
    Path((owner, name)): Path<(String, String)>,
    Query(query): Query<ListingQuery>,
) -> Response {
    listing_of(&hub, &owner, &name, "main", &query)
}

async fn listing_at(
    State(hub): State<Shared>,
    Path((owner, name, rev)): Path<(String, String, String)>,
    Query(query): Query<ListingQuery>,
) -> Response {
    listing_of(&hub, &owner, &name, &rev, &query)
}

fn listing_of(hub: &Hub, owner: &str, name: &str, rev: &str, query: &ListingQuery) -> Response {
    let (id, repo) = match find(hub, owner, name, rev) {
        Ok(found) => found,
        Err(missing) => return missing.into_response(),
    };
    let blobs = matches!(query.blobs.as_deref(), Some("true" | "1"));
    let siblings: Vec<serde_json::Value> = repo
        .files
        .iter()
        .map(|(path, file)| {
            let mut sibling = serde_json::json!({ "rfilename": path });
            if blobs {
                sibling["blobId"] = file.blob_id.clone().into();
                sibling["size"] = file.size.into();
                if file.is_lfs() {
                    sibling["lfs"] =
                        serde_json::json!({ "sha256": file.sha256, "size": file.size, "pointerSize": 134 });
                }
            }
            sibling
        })
        .collect();
    let body = serde_json::json!({
        "_id": &repo.sha[..24],
        "id": id,
        "modelId": id,
        "sha": repo.sha,
        "private": false,
        "disabled": false,
        "gated": false,
        "siblings": siblings,
    });
    axum::Json(body).into_response()
}

/// A repository path from a request: no absolute path, `.`/`..`, empty segment, backslash or
/// control character.
fn safe_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.chars().any(|c| c == '\\' || c.is_control())
        && path.split('/').all(|seg| !matches!(seg, "" | "." | ".."))
}

/// A single byte range of a file of `len` bytes: `bytes=a-b`, `bytes=a-` or `bytes=-n`.
/// `None` when the header is absent or not understood (the whole file is then sent, as RFC 9110
/// allows); `Some(Err(()))` when the range cannot be satisfied.
fn parse_range(value: Option<&str>, len: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = value?.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (start, end) = spec.split_once('-')?;
    let (start, end) = (start.trim(), end.trim());
    let range = if start.is_empty() {
        let suffix: u64 = end.parse().ok()?;
        if suffix == 0 || len == 0 {
            return Some(Err(()));
        }
        (len.saturating_sub(suffix), len - 1)
    } else {
        let start: u64 = start.parse().ok()?;
        let end: u64 = if end.is_empty() { u64::MAX } else { end.parse().ok()? };
        if end < start {
            return None;
        }
        if start >= len {
            return Some(Err(()));
        }
        (start, end.min(len - 1))
    };
    Some(Ok(range))
}

async fn resolve(
    State(hub): State<Shared>,
    method: Method,
    headers: HeaderMap,
    Path((owner, name, rev, path)): Path<(String, String, String, String)>,
) -> Response {
    let (_, repo) = match find(&hub, &owner, &name, &rev) {
        Ok(found) => found,
        Err(missing) => return missing.into_response(),
    };
    if !safe_path(&path) {
        return error(StatusCode::BAD_REQUEST, Some("InvalidPath"), "Invalid file path");
    }
    let Some(file) = repo.files.get(&path) else {
        return error(StatusCode::NOT_FOUND, Some("EntryNotFound"), "Entry not found");
    };
    let range = headers.get(RANGE).and_then(|v| v.to_str().ok());
    match serve_file(file, &repo.sha, range, method == Method::HEAD).await {
        Ok(response) => response,
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, None, &format!("cannot read the file: {e}")),
    }
}

async fn serve_file(file: &RepoFile, commit: &str, range: Option<&str>, head: bool) -> std::io::Result<Response> {
    let len = file.size;
    let mut response = Response::new(Body::empty());
    let h = response.headers_mut();
    let value = |s: String| HeaderValue::from_str(&s).expect("hex digits and numbers are valid header values");
    h.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert("x-repo-commit", value(commit.to_string()));
    if file.is_lfs() {
        h.insert(ETAG, value(format!("\"{}\"", file.sha256)));
        h.insert("x-linked-etag", value(format!("\"{}\"", file.sha256)));
        h.insert("x-linked-size", value(len.to_string()));
    } else {
        h.insert(ETAG, value(format!("\"{}\"", file.blob_id)));
    }
    let (start, end) = match parse_range(range, len) {
        None => (0, len.checked_sub(1)),
        Some(Ok((start, end))) => {
            *response.status_mut() = StatusCode::PARTIAL_CONTENT;
            response.headers_mut().insert(CONTENT_RANGE, value(format!("bytes {start}-{end}/{len}")));
            (start, Some(end))
        }
        Some(Err(())) => {
            *response.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
            response.headers_mut().insert(CONTENT_RANGE, value(format!("bytes */{len}")));
            response.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
            return Ok(response);
        }
    };
    let count = end.map_or(0, |end| end + 1 - start);
    response.headers_mut().insert(CONTENT_LENGTH, value(count.to_string()));
    if head || count == 0 {
        return Ok(response);
    }
    // Streamed in chunks: a model file is never read into memory whole.
    let mut reader = tokio::fs::File::open(&file.local).await?;
    reader.seek(SeekFrom::Start(start)).await?;
    let stream = ReaderStream::with_capacity(reader.take(count), 256 * 1024);
    *response.body_mut() = Body::from_stream(stream);
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_like_http_servers_do() {
        assert_eq!(parse_range(Some("bytes=0-9"), 100), Some(Ok((0, 9))));
        assert_eq!(parse_range(Some("bytes=90-"), 100), Some(Ok((90, 99))));
        assert_eq!(parse_range(Some("bytes=90-200"), 100), Some(Ok((90, 99))));
        assert_eq!(parse_range(Some("bytes=-10"), 100), Some(Ok((90, 99))));
        assert_eq!(parse_range(Some("bytes=-1000"), 100), Some(Ok((0, 99))));
        assert_eq!(parse_range(Some("bytes=100-"), 100), Some(Err(())));
        assert_eq!(parse_range(Some("bytes=5-2"), 100), None);
        assert_eq!(parse_range(Some("bytes=0-1,5-6"), 100), None);
        assert_eq!(parse_range(Some("items=0-1"), 100), None);
        assert_eq!(parse_range(None, 100), None);
    }

    #[test]
    fn escaping_paths_are_refused() {
        assert!(safe_path("a/b.gguf"));
        for bad in ["", "../x", "a/../b", "/x", "a//b", "./a", "a\\b", "a\0b"] {
            assert!(!safe_path(bad), "{bad:?}");
        }
    }
}
