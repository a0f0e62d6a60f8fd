//! HTTP for registrations: one client, status mapping, bounded reads, hashing a body as it
//! streams (nothing kept) and byte ranges.

use super::{sha256_hex, RegisterError};
use llmr_telemetry::error_chain;
use reqwest::header::{AUTHORIZATION, CONTENT_RANGE, RANGE};
use reqwest::{Client, RequestBuilder, Response, StatusCode, Url};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// A file to fetch, and the token to send with it (only to the hub's own origin).
pub(super) struct Remote<'a> {
    pub url: Url,
    pub token: Option<&'a str>,
}

pub(super) struct Http {
    /// Follows redirects (reqwest drops `Authorization` when one leaves the origin).
    pub follow: Client,
    /// Follows none: to read the headers of each answer of a redirect chain.
    pub manual: Client,
}

impl Http {
    pub fn new() -> Self {
        let builder = || {
            Client::builder()
                .user_agent(concat!("llmr-router/", env!("CARGO_PKG_VERSION")))
                .connect_timeout(Duration::from_secs(30))
                // Per read, so a long streamed hash is not cut while data flows.
                .read_timeout(Duration::from_secs(120))
        };
        let build = |b: reqwest::ClientBuilder| b.build().expect("a client with rustls and no custom roots builds");
        Self { follow: build(builder()), manual: build(builder().redirect(reqwest::redirect::Policy::none())) }
    }

    pub fn get(&self, remote: &Remote<'_>) -> RequestBuilder {
        with_token(self.follow.get(remote.url.clone()), remote.token)
    }
}

pub(super) fn with_token(request: RequestBuilder, token: Option<&str>) -> RequestBuilder {
    match token {
        Some(token) => request.header(AUTHORIZATION, format!("Bearer {token}")),
        None => request,
    }
}

/// Sends; a connection failure is the server's (502).
pub(super) async fn send(request: RequestBuilder, url: &Url) -> Result<Response, RegisterError> {
    request
        .send()
        .await
        .map_err(|e| RegisterError::upstream(format!("{}: {}", redacted(url), error_chain(&e.without_url()))))
}

/// Success, or the error for `what` (`param` names the field it came from).
pub(super) fn check(response: Response, param: &'static str, what: &str) -> Result<Response, RegisterError> {
    let status = response.status();
    match status {
        s if s.is_success() => Ok(response),
        StatusCode::NOT_FOUND => Err(RegisterError::not_found(param, format!("{what} not found (HTTP 404 from {})", redacted(response.url())))),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(RegisterError::not_found(
            param,
            format!(
                "{what}: access refused (HTTP {} from {}); if it is private or gated, the router needs a token that grants access (HF_TOKEN)",
                status.as_u16(),
                redacted(response.url())
            ),
        )),
        _ => Err(RegisterError::upstream(format!("{}: HTTP {}", redacted(response.url()), status.as_u16()))),
    }
}

/// A URL for messages: without credentials or query (which can hold signed tokens).
pub(super) fn redacted(url: &Url) -> String {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.to_string()
}

fn broken(url: &Url, e: reqwest::Error) -> RegisterError {
    RegisterError::upstream(format!("{}: the transfer broke off: {}", redacted(url), error_chain(&e.without_url())))
}

/// The whole body, refusing one larger than `limit` bytes.
pub(super) async fn read_limited(mut response: Response, limit: u64, what: &str) -> Result<Vec<u8>, RegisterError> {
    let url = response.url().clone();
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| broken(&url, e))? {
        if (body.len() + chunk.len()) as u64 > limit {
            return Err(RegisterError::upstream(format!("{what} is larger than {limit} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Size and sha256 of the body, hashed as it arrives and never kept.
pub(super) async fn hash_body(mut response: Response) -> Result<(u64, String), RegisterError> {
    let url = response.url().clone();
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = response.chunk().await.map_err(|e| broken(&url, e))? {
        hasher.update(&chunk);
        size += chunk.len() as u64;
    }
    Ok((size, sha256_hex(hasher)))
}

/// Bytes `start..end` (end exclusive) of `remote`, with a `Range` request; a server that ignores
/// the range is read from the start and cut.
pub(super) async fn fetch_range(
    http: &Http,
    remote: &Remote<'_>,
    start: u64,
    end: u64,
    param: &'static str,
    what: &str,
) -> Result<Vec<u8>, RegisterError> {
    let request = http.get(remote).header(RANGE, format!("bytes={start}-{}", end - 1));
    let mut response = check(send(request, &remote.url).await?, param, what)?;
    let url = response.url().clone();
    let mut skip = match response.status() {
        StatusCode::PARTIAL_CONTENT => {
            let range = response.headers().get(CONTENT_RANGE).and_then(|v| v.to_str().ok()).unwrap_or_default();
            let first =
                range.strip_prefix("bytes ").and_then(|r| r.split('-').next()).and_then(|s| s.parse::<u64>().ok());
            if first != Some(start) {
                return Err(RegisterError::upstream(format!(
                    "{}: asked for bytes from {start}, got {range:?}",
                    redacted(&url)
                )));
            }
            0
        }
        _ => start,
    };
    let wanted = (end - start) as usize;
    let mut bytes = Vec::with_capacity(wanted);
    while let Some(chunk) = response.chunk().await.map_err(|e| broken(&url, e))? {
        let mut chunk = &chunk[..];
        let skipped = (skip as usize).min(chunk.len());
        chunk = &chunk[skipped..];
        skip -= skipped as u64;
        let take = (wanted - bytes.len()).min(chunk.len());
        bytes.extend_from_slice(&chunk[..take]);
        if bytes.len() == wanted {
            break;
        }
    }
    Ok(bytes)
}
