//! A repository on a Hugging Face compatible hub: its listing at a revision (with sizes and the
//! sha256 of LFS files) and its files' URLs, pinned to the commit the listing reports.

use super::http::{check, read_limited, send, with_token, Http, Remote};
use super::{is_sha256, Listed, RegisterError};
use llmr_cluster::check_relative_path;
use reqwest::header::HeaderValue;
use reqwest::{StatusCode, Url};
use serde::Deserialize;

/// A listing of a repository with ten thousand files is a few MB.
const LISTING_LIMIT: u64 = 64 << 20;

pub(super) struct HubRepo<'a> {
    pub endpoint: Url,
    pub token: Option<&'a str>,
    pub repo: String,
    /// The commit the listing reported (a 40-hex id), else the revision asked for: every file
    /// is fetched at the same commit the hashes were taken from.
    pub revision: String,
}

#[derive(Deserialize)]
struct RawListing {
    #[serde(default)]
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<RawSibling>,
}

#[derive(Deserialize)]
struct RawSibling {
    rfilename: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    lfs: Option<RawLfs>,
}

#[derive(Deserialize)]
struct RawLfs {
    sha256: String,
    size: u64,
}

/// `endpoint` + path segments, each percent-encoded as one segment.
pub(super) fn join<'s>(endpoint: &Url, segments: impl IntoIterator<Item = &'s str>) -> Url {
    let mut url = endpoint.clone();
    url.path_segments_mut().expect("checked to be an http(s) base URL").pop_if_empty().extend(segments);
    url
}

impl<'a> HubRepo<'a> {
    /// Lists `repo` at `revision` (`GET /api/models/{repo}/revision/{rev}?blobs=true`).
    pub async fn list(
        http: &Http,
        endpoint: Url,
        token: Option<&'a str>,
        repo: &str,
        revision: &str,
    ) -> Result<(HubRepo<'a>, Vec<Listed>), RegisterError> {
        let mut url =
            join(&endpoint, ["api", "models"].into_iter().chain(repo.split('/')).chain(["revision", revision]));
        url.set_query(Some("blobs=true"));
        let response = send(with_token(http.follow.get(url.clone()), token), &url).await?;
        let revision_missing = response.status() == StatusCode::NOT_FOUND
            && response.headers().get("x-error-code") == Some(&HeaderValue::from_static("RevisionNotFound"));
        if revision_missing {
            let message = format!("repository '{repo}' has no revision '{revision}'");
            return Err(RegisterError::not_found("revision", message));
        }
        let what = format!("repository '{repo}' at {}", endpoint.as_str().trim_end_matches('/'));
        let response = check(response, "repo", &what)?;
        let body = read_limited(response, LISTING_LIMIT, "the repository listing").await?;
        let raw: RawListing = serde_json::from_slice(&body)
            .map_err(|e| RegisterError::upstream(format!("{url}: not a model listing: {e}")))?;
        let mut files = Vec::with_capacity(raw.siblings.len());
        for sibling in raw.siblings {
            if let Err(problem) = check_relative_path(&sibling.rfilename) {
                let message = format!(
                    "the hub lists a file name that could escape the model directory: {:?} ({problem})",
                    sibling.rfilename
                );
                return Err(RegisterError::invalid("repo", message));
            }
            let lfs = sibling.lfs.filter(|l| is_sha256(&l.sha256));
            let size = lfs.as_ref().map(|l| l.size).or(sibling.size);
            files.push(Listed { path: sibling.rfilename, size, sha256: lfs.map(|l| l.sha256.to_ascii_lowercase()) });
        }
        let pinned = raw.sha.filter(|s| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit()));
        let revision = pinned.unwrap_or_else(|| revision.to_string());
        Ok((HubRepo { endpoint, token, repo: repo.to_string(), revision }, files))
    }

    /// `{endpoint}/{repo}/resolve/{revision}/{path}`.
    pub fn remote(&self, path: &str) -> Remote<'a> {
        let segments = self.repo.split('/').chain(["resolve", self.revision.as_str()]).chain(path.split('/'));
        Remote { url: join(&self.endpoint, segments), token: self.token }
    }
}
