//! The client: one hub's endpoint and token, and the requests every caller makes (HEAD, GET with
//! a size limit, Range reads, hashing a body as it streams), each following redirects by hand.

use crate::error::HubError;
use crate::hash::{sha256_etag, Sum};
use reqwest::header::{HeaderMap, CONTENT_LENGTH, CONTENT_RANGE, ETAG, LOCATION, RANGE};
use reqwest::{Client, Method, Response, StatusCode, Url};
use std::ops::Range;
use std::time::Duration;

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
const MAX_REDIRECTS: usize = 10;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `HF_ENDPOINT`, else [`DEFAULT_ENDPOINT`], as the Hugging Face tools read it.
pub fn endpoint_from_env() -> String {
    env("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
}

/// `HF_TOKEN`, when set and not empty.
pub fn token_from_env() -> Option<String> {
    env("HF_TOKEN")
}

/// What is known of a file: its size and sha256 (lower-case hex), each where known. What a
/// server announces ([`Hub::head`]), or what a caller expects of a download.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Known {
    pub size: Option<u64>,
    pub sha256: Option<String>,
}

/// What a [`Remote`] is, to name it in errors.
#[derive(Clone, Debug)]
enum Of {
    Listing { repo: String, revision: String },
    File { repo: String, path: String },
    Url,
}

/// Something to request: its URL, and whether it is a hub repository's listing or file (whose
/// failures get the hub's messages: model not found, file not found, access refused) or any URL.
#[derive(Clone, Debug)]
pub struct Remote {
    url: Url,
    of: Of,
}

impl Remote {
    /// Any http(s) URL (not a hub repository's file): its failures are plain HTTP statuses.
    pub fn url(url: Url) -> Remote {
        Remote { url, of: Of::Url }
    }

    pub(crate) fn listing(url: Url, repo: &str, revision: &str) -> Remote {
        Remote { url, of: Of::Listing { repo: repo.to_string(), revision: revision.to_string() } }
    }

    pub fn as_url(&self) -> &Url {
        &self.url
    }

    /// How messages name it: the file's path in its repository, else the URL without
    /// credentials or query.
    pub fn name(&self) -> String {
        match &self.of {
            Of::File { path, .. } => path.clone(),
            Of::Listing { repo, .. } => repo.clone(),
            Of::Url => shown(&self.url),
        }
    }
}

/// A URL for messages: without credentials or query (a CDN's signed URLs carry their
/// signature there).
pub(crate) fn shown(url: &Url) -> String {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.to_string()
}

pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    header(headers, CONTENT_LENGTH.as_str()).and_then(|l| l.parse().ok())
}

pub(crate) fn bad(url: &Url, reason: impl Into<String>) -> HubError {
    HubError::BadResponse { url: shown(url), reason: reason.into() }
}

/// A body that broke off.
pub(crate) fn broken(url: &Url, error: reqwest::Error) -> HubError {
    HubError::Transfer { url: shown(url), source: std::io::Error::other(error.without_url()) }
}

/// The last answer of a redirect chain, and what the chain announced about the file.
pub(crate) struct Answer {
    pub response: Response,
    pub announced: Known,
}

/// A Hugging Face compatible hub: its base URL and optional access token. Not `Debug`, so the
/// token cannot end up in a log; the token is sent to the hub's own origin only, never to a
/// server it redirects to. Cloning is cheap and shares the connections.
#[derive(Clone)]
pub struct Hub {
    base: Url,
    token: Option<String>,
    client: Client,
}

impl Hub {
    pub fn new(endpoint: &str, token: Option<String>) -> Result<Self, HubError> {
        let invalid = |reason: String| HubError::InvalidEndpoint { endpoint: endpoint.to_string(), reason };
        let base = Url::parse(endpoint).map_err(|e| invalid(e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(invalid("not an http(s) URL".into()));
        }
        let client = Client::builder()
            .user_agent(concat!("llmr/", env!("CARGO_PKG_VERSION")))
            // Redirects are followed by hand, to read Hugging Face's `X-Linked-*` headers on the
            // hub's own answer and to send the token to the hub only, never to a CDN.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(30))
            // Per read, so a long download or streamed hash is not cut while data flows.
            .read_timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Self { base, token: token.filter(|t| !t.is_empty()), client })
    }

    /// `HF_ENDPOINT` (default [`DEFAULT_ENDPOINT`]) and `HF_TOKEN`.
    pub fn from_env() -> Result<Self, HubError> {
        Self::new(&endpoint_from_env(), token_from_env())
    }

    /// The hub at `endpoint` (a manifest's), with `HF_TOKEN` only when `endpoint` is the one
    /// `HF_ENDPOINT` names (default huggingface.co): another endpoint never receives it.
    pub fn from_env_at(endpoint: &str) -> Result<Self, HubError> {
        let ours = endpoint_from_env().trim_end_matches('/') == endpoint.trim_end_matches('/');
        Self::new(endpoint, token_from_env().filter(|_| ours))
    }

    /// A client for the server of `url` (its origin as the endpoint), sharing this one's
    /// connections; the token goes along only when that is this hub's own origin.
    pub fn for_url(&self, url: &Url) -> Hub {
        let mut base = url.clone();
        base.set_path("/");
        base.set_query(None);
        base.set_fragment(None);
        let _ = base.set_username("");
        let _ = base.set_password(None);
        let token = self.token.clone().filter(|_| self.is_own(url));
        Hub { base, token, client: self.client.clone() }
    }

    /// The endpoint, as shown in messages.
    pub fn endpoint(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    fn is_own(&self, url: &Url) -> bool {
        url.origin() == self.base.origin()
    }

    /// The endpoint and `segments`, each percent-encoded as one path segment.
    pub(crate) fn url<'s>(&self, segments: impl IntoIterator<Item = &'s str>) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut().expect("checked in Hub::new: a base URL").pop_if_empty().extend(segments);
        url
    }

    /// `{endpoint}/{repo}/resolve/{revision}/{path}`: a file of a repository at a revision. Each
    /// `/`-separated part is percent-encoded as one path segment; callers check that `repo`,
    /// `revision` and `path` have no `.`/`..` segments.
    pub fn file(&self, repo: &str, revision: &str, path: &str) -> Remote {
        let segments = repo.split('/').chain(["resolve"]).chain(revision.split('/')).chain(path.split('/'));
        Remote { url: self.url(segments), of: Of::File { repo: repo.to_string(), path: path.to_string() } }
    }

    /// Sends `method` to `remote`, following redirects by hand: the token goes only to this
    /// hub's origin, `X-Linked-Size`/`X-Linked-Etag` are read on every answer of the chain, and
    /// a plain sha256 `ETag` is trusted only on a successful answer from this hub's origin (a
    /// CDN's ETags mean something else).
    pub(crate) async fn send(&self, method: Method, remote: &Remote, range: Option<&str>) -> Result<Answer, HubError> {
        let mut url = remote.url.clone();
        let mut announced = Known::default();
        for _ in 0..MAX_REDIRECTS {
            let mut request = self.client.request(method.clone(), url.clone());
            if let Some(token) = self.token.as_ref().filter(|_| self.is_own(&url)) {
                request = request.bearer_auth(token);
            }
            if let Some(range) = range {
                request = request.header(RANGE, range);
            }
            let response = request
                .send()
                .await
                .map_err(|source| HubError::Request { url: shown(&url), source: source.without_url() })?;
            let headers = response.headers();
            announced.sha256 = announced.sha256.or_else(|| header(headers, "x-linked-etag").and_then(sha256_etag));
            announced.size = announced.size.or_else(|| header(headers, "x-linked-size").and_then(|s| s.parse().ok()));
            let status = response.status();
            if !status.is_redirection() {
                if status.is_success() && self.is_own(&url) {
                    announced.sha256 =
                        announced.sha256.or_else(|| header(headers, ETAG.as_str()).and_then(sha256_etag));
                }
                return Ok(Answer { response, announced });
            }
            let location = header(headers, LOCATION.as_str())
                .ok_or_else(|| bad(&url, format!("HTTP {} without a Location", status.as_u16())))?;
            url = url.join(location).map_err(|e| bad(&url, format!("bad redirect {location:?}: {e}")))?;
        }
        Err(bad(&url, "too many redirects"))
    }

    /// The answer if it succeeded, else the error that names what `remote` is.
    pub(crate) fn check(&self, response: Response, remote: &Remote) -> Result<Response, HubError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let endpoint = self.endpoint().to_string();
        let refused = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
        Err(match (&remote.of, status) {
            (Of::Listing { repo, revision }, StatusCode::NOT_FOUND) => {
                if header(response.headers(), "x-error-code") == Some("RevisionNotFound") {
                    HubError::RevisionNotFound { repo: repo.clone(), revision: revision.clone(), endpoint }
                } else {
                    HubError::RepoNotFound { repo: repo.clone(), endpoint }
                }
            }
            (Of::File { repo, path }, StatusCode::NOT_FOUND) => {
                HubError::FileNotFound { repo: repo.clone(), file: path.clone(), endpoint }
            }
            (Of::Listing { repo, .. } | Of::File { repo, .. }, _) if refused => HubError::Unauthorized {
                repo: repo.clone(),
                endpoint,
                status: status.as_u16(),
                token_sent: self.token.is_some(),
            },
            _ => HubError::Http { url: shown(response.url()), status: status.as_u16() },
        })
    }

    /// GET, checked.
    async fn get(&self, remote: &Remote, range: Option<&str>) -> Result<Response, HubError> {
        let answer = self.send(Method::GET, remote, range).await?;
        self.check(answer.response, remote)
    }

    /// The size and sha256 the server announces (`X-Linked-*` as Hugging Face sends them, a
    /// sha256 `ETag` from the hub itself, `Content-Length`), without the body. A server without
    /// HEAD (405, 501) announces what its redirects said.
    pub async fn head(&self, remote: &Remote) -> Result<Known, HubError> {
        let Answer { response, mut announced } = self.send(Method::HEAD, remote, None).await?;
        if matches!(response.status(), StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED) {
            return Ok(announced);
        }
        let response = self.check(response, remote)?;
        announced.size = announced.size.or_else(|| content_length(response.headers()));
        Ok(announced)
    }

    /// The whole body, refusing one larger than `limit` bytes.
    pub async fn read(&self, remote: &Remote, limit: u64) -> Result<Vec<u8>, HubError> {
        let mut response = self.get(remote, None).await?;
        let url = response.url().clone();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| broken(&url, e))? {
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(bad(&url, format!("the answer is larger than {limit} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// Size and sha256 of the body, hashed as it arrives and never kept.
    pub async fn hash(&self, remote: &Remote) -> Result<(u64, String), HubError> {
        let mut response = self.get(remote, None).await?;
        let url = response.url().clone();
        let mut sum = Sum::default();
        while let Some(chunk) = response.chunk().await.map_err(|e| broken(&url, e))? {
            sum.update(&chunk);
        }
        Ok(sum.finish())
    }

    /// Bytes `range` of the file, with a `Range` request; a server that ignores the range is
    /// read from the start and cut. Fewer bytes than asked (the file is shorter) is an error.
    pub async fn read_range(&self, remote: &Remote, range: Range<u64>) -> Result<Vec<u8>, HubError> {
        let Range { start, end } = range;
        if end <= start {
            return Ok(Vec::new());
        }
        let mut response = self.get(remote, Some(&format!("bytes={start}-{}", end - 1))).await?;
        let url = response.url().clone();
        let mut skip = match response.status() {
            StatusCode::PARTIAL_CONTENT => {
                let range = header(response.headers(), CONTENT_RANGE.as_str()).unwrap_or_default();
                if parse_content_range(range).map(|(first, _)| first) != Some(start) {
                    return Err(bad(&url, format!("asked for bytes from {start}, got {range:?}")));
                }
                0
            }
            _ => start,
        };
        let wanted = (end - start) as usize;
        let mut bytes = Vec::with_capacity(wanted);
        while let Some(chunk) = response.chunk().await.map_err(|e| broken(&url, e))? {
            let skipped = (skip as usize).min(chunk.len());
            skip -= skipped as u64;
            let chunk = &chunk[skipped..];
            let take = (wanted - bytes.len()).min(chunk.len());
            bytes.extend_from_slice(&chunk[..take]);
            if bytes.len() == wanted {
                return Ok(bytes);
            }
        }
        Err(bad(&url, format!("asked for bytes {start}..{end}, received {}", bytes.len())))
    }
}

/// `bytes START-END/TOTAL` (TOTAL may be `*`).
pub(crate) fn parse_content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let (range, total) = value.strip_prefix("bytes ")?.split_once('/')?;
    let (start, _end) = range.split_once('-')?;
    let total = if total == "*" { None } else { Some(total.parse().ok()?) };
    Some((start.parse().ok()?, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_and_shown_urls() {
        assert_eq!(parse_content_range("bytes 100-199/200"), Some((100, Some(200))));
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(parse_content_range("items 1-2/3"), None);
        let url = Url::parse("https://user:pw@cdn.example/a/b.gguf?X-Amz-Signature=secret").unwrap();
        assert_eq!(shown(&url), "https://cdn.example/a/b.gguf");
    }

    #[test]
    fn endpoints_urls_and_the_token_scope() {
        assert!(matches!(Hub::new("ftp://h", None), Err(HubError::InvalidEndpoint { .. })));
        assert!(matches!(Hub::new("not a url", None), Err(HubError::InvalidEndpoint { .. })));
        let hub = Hub::new("https://hub.example/prefix/", Some("hf_x".into())).unwrap();
        assert_eq!(hub.endpoint(), "https://hub.example/prefix");
        let remote = hub.file("o/r", "refs/pr/1", "sub/a b#.gguf");
        assert_eq!(remote.as_url().as_str(), "https://hub.example/prefix/o/r/resolve/refs/pr/1/sub/a%20b%23.gguf");
        assert_eq!(remote.name(), "sub/a b#.gguf");

        let elsewhere = hub.for_url(&Url::parse("https://cdn.example:8443/x/y.gguf?sig=1").unwrap());
        assert_eq!((elsewhere.endpoint(), elsewhere.token.is_some()), ("https://cdn.example:8443", false));
        let same = hub.for_url(&Url::parse("https://hub.example/o/r/resolve/main/m.gguf").unwrap());
        assert!(same.token.is_some(), "the hub's own origin keeps the token");
        assert!(Hub::new("http://h", Some(String::new())).unwrap().token.is_none());
    }
}
