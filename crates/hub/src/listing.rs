//! A repository's listing at a revision: its files with their sizes and the sha256 of LFS
//! files, every path checked, and the revision pinned to the commit the hub reports.

use crate::client::{bad, Hub, Remote};
use crate::error::HubError;
use crate::hash::is_sha256;
use llmr_cluster::check_relative_path;
use serde::Deserialize;

/// A listing of a repository with ten thousand files is a few MB.
const LISTING_LIMIT: u64 = 64 << 20;

/// A file as a listing gives it: its path in the model directory, and what is known already.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedFile {
    pub path: String,
    pub size: Option<u64>,
    /// Lower-case hex; a hub lists it for LFS files.
    pub sha256: Option<String>,
}

/// A repository at a revision.
#[derive(Clone, Debug)]
pub struct Listing {
    pub repo: String,
    /// The commit the hub reported (a 40-hex id), else the revision asked for: every file is
    /// fetched at the commit the sizes and hashes were listed at.
    pub revision: String,
    /// Each path is relative and stays inside the repository (`check_relative_path`).
    pub files: Vec<ListedFile>,
}

impl Listing {
    pub fn get(&self, path: &str) -> Option<&ListedFile> {
        self.files.iter().find(|f| f.path == path)
    }

    pub fn paths(&self) -> Vec<String> {
        self.files.iter().map(|f| f.path.clone()).collect()
    }

    /// The file at `path`, at the pinned revision.
    pub fn file(&self, hub: &Hub, path: &str) -> Remote {
        hub.file(&self.repo, &self.revision, path)
    }
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

impl Hub {
    /// Lists `repo` (`owner/name`) at `revision` (`GET /api/models/{repo}/revision/{rev}?blobs=true`).
    /// A listed path that could leave the repository fails the whole listing.
    pub async fn list(&self, repo: &str, revision: &str) -> Result<Listing, HubError> {
        let mut url = self.url(["api", "models"].into_iter().chain(repo.split('/')).chain(["revision", revision]));
        url.set_query(Some("blobs=true"));
        let remote = Remote::listing(url.clone(), repo, revision);
        let body = self.read(&remote, LISTING_LIMIT).await?;
        let raw: RawListing =
            serde_json::from_slice(&body).map_err(|e| bad(&url, format!("not a model listing: {e}")))?;
        let mut files = Vec::with_capacity(raw.siblings.len());
        for sibling in raw.siblings {
            if let Err(problem) = check_relative_path(&sibling.rfilename) {
                return Err(HubError::UnsafePath { repo: repo.to_string(), file: sibling.rfilename, problem });
            }
            let lfs = sibling.lfs.filter(|l| is_sha256(&l.sha256));
            let size = lfs.as_ref().map(|l| l.size).or(sibling.size);
            let sha256 = lfs.map(|l| l.sha256.to_ascii_lowercase());
            files.push(ListedFile { path: sibling.rfilename, size, sha256 });
        }
        let pinned = raw.sha.filter(|s| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit()));
        let revision = pinned.unwrap_or_else(|| revision.to_string());
        Ok(Listing { repo: repo.to_string(), revision, files })
    }
}
