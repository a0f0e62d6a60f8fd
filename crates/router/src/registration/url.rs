//! One GGUF file at an http(s) URL: its size and sha256 from the server's headers
//! (`X-Linked-Size`/`X-Linked-Etag` as Hugging Face sends them, or a sha256 `ETag`), else by
//! streaming it through sha256 without storing it.

use super::gguf_head::{self, GgufFacts, HEAD_LIMITS};
use super::http::{check, hash_body, redacted, send, with_token, Http, Remote};
use super::{is_sha256, RegisterError};
use llmr_cluster::{check_relative_path, ManifestFile};
use llmr_model_store::is_gguf;
use reqwest::header::{CONTENT_LENGTH, ETAG, LOCATION};
use reqwest::{StatusCode, Url};

const MAX_REDIRECTS: usize = 10;

pub(super) struct UrlModel {
    pub file: ManifestFile,
    /// The file name without `.gguf`: the default served name.
    pub stem: String,
    pub facts: GgufFacts,
}

fn bad_url(message: impl Into<String>) -> RegisterError {
    RegisterError::invalid("url", message)
}

/// Checks the URL: http(s), naming a `.gguf` file.
pub(super) fn parse(url: &str) -> Result<(Url, String), RegisterError> {
    let parsed = Url::parse(url).map_err(|e| bad_url(format!("not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad_url("only http and https URLs can be registered"));
    }
    let last = parsed.path_segments().and_then(|mut s| s.next_back()).unwrap_or_default();
    let name = percent_decode(last).ok_or_else(|| bad_url("the file name is not UTF-8"))?;
    if let Err(problem) = check_relative_path(&name) {
        return Err(bad_url(format!("the file name {name:?} {problem}")));
    }
    if name.contains('/') || !is_gguf(&name) {
        return Err(bad_url(format!("must name a .gguf file, got {name:?}")));
    }
    Ok((parsed, name))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// What the server announced about the file.
#[derive(Debug, Default)]
struct Announced {
    size: Option<u64>,
    sha256: Option<String>,
}

fn sha256_etag(value: &str) -> Option<String> {
    let v = value.trim().trim_start_matches("W/").trim_matches('"');
    is_sha256(v).then(|| v.to_ascii_lowercase())
}

/// HEAD, following redirects by hand to read Hugging Face's `X-Linked-*` headers on the hub's own
/// answer; a plain `ETag` is trusted as a sha256 only from the URL's own origin (a CDN's ETags
/// mean something else).
async fn head(http: &Http, remote: &Remote<'_>) -> Result<Announced, RegisterError> {
    let mut announced = Announced::default();
    let mut url = remote.url.clone();
    for _ in 0..MAX_REDIRECTS {
        let token = remote.token.filter(|_| url.origin() == remote.url.origin());
        let response = send(with_token(http.manual.head(url.clone()), token), &url).await?;
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        if announced.sha256.is_none() {
            announced.sha256 = header("x-linked-etag").as_deref().and_then(sha256_etag);
        }
        if announced.size.is_none() {
            announced.size = header("x-linked-size").and_then(|s| s.parse().ok());
        }
        if response.status().is_redirection() {
            let location = header(LOCATION.as_str())
                .ok_or_else(|| RegisterError::upstream(format!("{}: a redirect without Location", redacted(&url))))?;
            url = url
                .join(&location)
                .map_err(|e| RegisterError::upstream(format!("{}: bad redirect {location:?}: {e}", redacted(&url))))?;
            continue;
        }
        if matches!(response.status(), StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED) {
            return Ok(announced);
        }
        let response = check(response, "url", "the file")?;
        if announced.sha256.is_none() && url.origin() == remote.url.origin() {
            announced.sha256 = response.headers().get(ETAG).and_then(|v| v.to_str().ok()).and_then(sha256_etag);
        }
        if announced.size.is_none() {
            announced.size =
                response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|s| s.parse().ok());
        }
        return Ok(announced);
    }
    Err(RegisterError::upstream(format!("{}: too many redirects", redacted(&remote.url))))
}

pub(super) async fn inspect(
    http: &Http,
    url: Url,
    name: String,
    token: Option<&str>,
) -> Result<UrlModel, RegisterError> {
    let remote = Remote { url, token };
    let announced = head(http, &remote).await?;
    let (size, sha256) = match announced {
        Announced { size: Some(size), sha256: Some(sha256) } => (size, sha256),
        _ => {
            // No digest announced: hash the file as it streams by (nothing is stored).
            let response = check(send(http.get(&remote), &remote.url).await?, "url", "the file")?;
            hash_body(response).await?
        }
    };
    let what = format!("'{}'", redacted(&remote.url));
    let facts = gguf_head::read_remote(http, &remote, size, HEAD_LIMITS, "url", &what).await?;
    let stem = name[..name.len() - ".gguf".len()].to_string();
    Ok(UrlModel { file: ManifestFile { path: name, size, sha256 }, stem, facts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_name_a_gguf_file() {
        let (_, name) = parse("https://h/o/r/resolve/main/My%20Model-Q4_0.gguf?download=true").unwrap();
        assert_eq!(name, "My Model-Q4_0.gguf");
        for bad in [
            "ftp://h/m.gguf",
            "https://h/m.bin",
            "https://h/",
            "not a url",
            "https://h/a%2F..%2Fm.gguf",
            "https://h/%2E%2E",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.param(), Some("url"), "{bad}");
        }
        assert_eq!(sha256_etag(&format!("W/\"{}\"", "A".repeat(64))), Some("a".repeat(64)));
        assert_eq!(sha256_etag("\"ce013625030ba8dba906f756967f9e9ca394464a\""), None);
    }
}
