//! One GGUF file at an http(s) URL: its size and sha256 from the server's headers
//! (`X-Linked-Size`/`X-Linked-Etag` as Hugging Face sends them, or a sha256 `ETag` of the URL's
//! own server, read by the hub client), else by streaming it through sha256 without storing it.

use super::gguf_head::{self, GgufFacts, HEAD_LIMITS};
use super::RegisterError;
use llmr_cluster::{check_relative_path, ManifestFile};
use llmr_hub::{Hub, Known, Remote, Url};
use llmr_model_store::is_gguf;

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

/// Size and sha256 from the server's announcement when it makes one, else by streaming the file
/// through sha256 (nothing is stored); then the GGUF facts from the file's head.
pub(super) async fn inspect(hub: &Hub, url: Url, name: String) -> Result<UrlModel, RegisterError> {
    let remote = Remote::url(url);
    let from_hub = |e| RegisterError::hub("url", e);
    let (size, sha256) = match hub.head(&remote).await.map_err(from_hub)? {
        Known { size: Some(size), sha256: Some(sha256) } => (size, sha256),
        _ => hub.hash(&remote).await.map_err(from_hub)?,
    };
    let what = format!("'{}'", remote.name());
    let facts = gguf_head::read_remote(hub, &remote, size, HEAD_LIMITS, "url", &what).await?;
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
    }
}
