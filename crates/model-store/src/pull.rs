//! Pulling a GGUF model from a Hugging Face compatible hub into the store.
//!
//! `owner/repo[:QUANT]` chooses a file from the repository's listing (`GET /api/models/...`);
//! `owner/repo/path/file.gguf` names one. The download goes to a hidden staging folder inside the
//! model's directory (`.download/FILE.partial`, never seen by `list`/`resolve`), resumes with an
//! HTTP `Range` request when a partial file is there, and is checked against the size the server
//! announced and, when the hub sends one (Hugging Face does for LFS files), the sha256 in
//! `X-Linked-Etag`/`ETag`. Only then is it published with [`ModelStore::import_file`], which
//! applies the store's rules and renames the file into place atomically: no half-written file
//! ever carries the final name.
//!
//! The library has no user interface: progress goes to a `FnMut(downloaded, total)` callback.

mod select;
mod transfer;

use self::select::{base_name, select_file};
pub use self::select::{choose_gguf, GgufChoiceError};
use crate::descriptor::ModelDescriptor;
use crate::error::StoreError;
use crate::name::{ModelName, NameError};
use crate::store::ModelStore;
use llmr_telemetry::error_chain;
use reqwest::blocking::Client;
pub use reqwest::Url;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Tried in this order when a name has no quantization tag.
pub const PREFERRED_QUANTIZATIONS: &[&str] = &["Q4_K_M", "Q8_0"];
/// Small repository files fetched beside the model when present (best effort).
const EXTRA_FILES: &[&str] = &["config.json", "tokenizer_config.json"];
/// Hidden, so store scans skip it (see `layout::read_dir`).
const STAGING_DIR: &str = ".download";
/// Tries per file; each after the first resumes where the previous one stopped.
const ATTEMPTS: u32 = 4;
const MAX_REDIRECTS: usize = 10;

/// Which file of a repository to pull.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileChoice {
    /// No tag: Q4_K_M, else Q8_0, else the repository's only GGUF.
    Preferred,
    /// The GGUF whose file name carries this tag (exact, case-sensitive).
    Quantization(String),
    /// This path in the repository.
    Path(String),
}

/// What `llmr pull` was asked for: `owner/repo`, `owner/repo:QUANT` or `owner/repo/path/file.gguf`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullSpec {
    /// `owner/repo`; also the default name in the store.
    pub repo: ModelName,
    pub file: FileChoice,
}

/// The file chosen in a repository, with the repository's listing.
#[derive(Clone, Debug)]
pub struct RemoteFile {
    pub repo: ModelName,
    /// The path in the repository (`rfilename`), checked to stay inside it.
    pub path: String,
    pub siblings: Vec<String>,
}

/// What the caller already knows of a file it fetches (a model manifest's size and sha256).
/// Each is checked when given; otherwise what the server announces is checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expected {
    pub size: Option<u64>,
    /// Hex, either case.
    pub sha256: Option<String>,
}

/// The result of a pull.
#[derive(Clone, Debug)]
pub struct Pulled {
    /// The model as the store now resolves it; `name` is what it can be served as.
    pub descriptor: ModelDescriptor,
    /// The file was already in the store; nothing was downloaded.
    pub already_present: bool,
    /// Extra files (`config.json`, ...) placed beside the model.
    pub extras: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("expected 'owner/repo', 'owner/repo:QUANT' or 'owner/repo/path/file.gguf', got {spec:?}")]
    NotOwnerRepo { spec: String },
    #[error("{file:?} is not a single-file GGUF model (split parts and projectors cannot be pulled)")]
    NotGguf { file: String },
    #[error("refusing file name {file:?} from '{repo}': it could escape the model directory")]
    UnsafePath { repo: String, file: String },
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("model '{repo}' not found at {endpoint}")]
    RepoNotFound { repo: String, endpoint: String },
    #[error("file '{file}' of model '{repo}' not found at {endpoint}")]
    FileNotFound { repo: String, file: String, endpoint: String },
    #[error("{endpoint} refused access to '{repo}' (HTTP {status}); {}", if *token_sent {
        "the HF_TOKEN sent does not grant access to it"
    } else {
        "if it is gated or private, set HF_TOKEN to an access token"
    })]
    Unauthorized { repo: String, endpoint: String, status: u16, token_sent: bool },
    #[error("model '{repo}' has no GGUF file")]
    NoGguf { repo: String },
    #[error("model '{repo}' has no GGUF file tagged '{requested}' (exact, case-sensitive); available: {}; or name a file as '{repo}/FILE'", available.join(", "))]
    NoMatchingFile { repo: String, requested: String, available: Vec<String> },
    #[error("model '{repo}' has several GGUF files{}: {}; ask for one as '{repo}:QUANT' or '{repo}/FILE'",
        requested.as_deref().map(|r| format!(" tagged '{r}'")).unwrap_or_default(), candidates.join(", "))]
    Ambiguous { repo: String, requested: Option<String>, candidates: Vec<String> },
    #[error("{url}: HTTP {status}")]
    Http { url: String, status: u16 },
    #[error("{url}: {reason}")]
    BadResponse { url: String, reason: String },
    #[error("request to {url} failed")]
    Request {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: the download broke off")]
    Transfer {
        url: String,
        #[source]
        source: io::Error,
    },
    #[error("{file}: expected {expected} bytes, received {actual}")]
    SizeMismatch { file: String, expected: u64, actual: u64 },
    #[error("{file}: sha256 mismatch: expected {expected}, the download has {actual}; the download was removed")]
    Sha256Mismatch { file: String, expected: String, actual: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl PullError {
    fn io(path: &Path) -> impl FnOnce(io::Error) -> Self + '_ {
        move |source| Self::Store(StoreError::Io { path: path.to_path_buf(), source })
    }
}

impl RemoteFile {
    /// The name the file gets in the store: the last segment of its path.
    pub fn file_name(&self) -> &str {
        base_name(&self.path)
    }
}

/// A Hugging Face compatible hub: its base URL and optional access token (not `Debug`, so the
/// token cannot end up in a log).
#[derive(Clone)]
pub struct Hub {
    base: Url,
    token: Option<String>,
    client: Client,
}

impl Hub {
    /// `HF_ENDPOINT` (default [`DEFAULT_ENDPOINT`]) and `HF_TOKEN`, as the Hugging Face tools read them.
    pub fn from_env() -> Result<Self, PullError> {
        let endpoint = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty());
        let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty());
        Self::new(endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT), token)
    }

    pub fn new(endpoint: &str, token: Option<String>) -> Result<Self, PullError> {
        let invalid = |reason: String| PullError::InvalidEndpoint { endpoint: endpoint.to_string(), reason };
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
            // Per read, not for the whole transfer (reqwest's blocking client).
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Self { base, token, client })
    }

    /// The endpoint, as shown in messages.
    pub fn endpoint(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    fn url<'s>(&self, segments: impl IntoIterator<Item = &'s str>) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut().expect("checked in Hub::new: a base URL").pop_if_empty().extend(segments);
        url
    }

    fn file_url(&self, repo: &ModelName, path: &str) -> Url {
        self.file_url_at(repo.as_str(), "main", path)
    }

    /// `{endpoint}/{repo}/resolve/{revision}/{path}`: a file of a repository at a revision. Each
    /// `/`-separated part is percent-encoded as one path segment; callers check that `repo`,
    /// `revision` and `path` have no `.`/`..` segments.
    pub fn file_url_at(&self, repo: &str, revision: &str, path: &str) -> Url {
        self.url(repo.split('/').chain(["resolve"]).chain(revision.split('/')).chain(path.split('/')))
    }

    /// Downloads `url` into `partial` (resuming what it already holds with a `Range` request),
    /// checks its size and sha256 against `expected` (else what the server announces) and
    /// renames it to `dest` (same filesystem: atomic). A download that proves wrong is deleted
    /// and an error returned: no unchecked byte ever carries `dest`'s name. The token, if any,
    /// is sent only to this hub's own origin. Blocking.
    pub fn fetch(
        &self,
        url: Url,
        partial: &Path,
        dest: &Path,
        expected: &Expected,
        mut progress: impl FnMut(u64, Option<u64>),
    ) -> Result<(), PullError> {
        let label = url.to_string();
        let target = transfer::Target { url, file: &label, repo: None };
        self.download_to(&target, partial, dest, expected, &mut progress)
    }

    /// Lists the repository and chooses the file `spec` asks for.
    pub fn locate(&self, spec: &PullSpec) -> Result<RemoteFile, PullError> {
        #[derive(serde::Deserialize)]
        struct RepoInfo {
            #[serde(default)]
            siblings: Vec<Sibling>,
        }
        #[derive(serde::Deserialize)]
        struct Sibling {
            rfilename: String,
        }

        let url = self.url(["api", "models"].into_iter().chain(spec.repo.as_str().split('/')));
        let response = self.get_plain(url.clone())?;
        self.check_status(&response, &spec.repo, None)?;
        let info: RepoInfo = serde_json::from_reader(response).map_err(|e| PullError::BadResponse {
            url: url.to_string(),
            reason: format!("not a model listing: {e}"),
        })?;
        let siblings: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
        let path = select_file(&spec.repo, &siblings, &spec.file, self.endpoint())?;
        Ok(RemoteFile { repo: spec.repo.clone(), path, siblings })
    }

    /// Downloads `remote` into the store as `name` (usually `remote.repo`), then the
    /// repository's `config.json`/`tokenizer_config.json` when it has them. A model already in
    /// the store under that file name is not downloaded again. Two pulls of the same file at the
    /// same time are not coordinated (they would share the partial file): don't.
    pub fn pull(
        &self,
        store: &ModelStore,
        remote: &RemoteFile,
        name: &ModelName,
        mut progress: impl FnMut(u64, Option<u64>),
    ) -> Result<Pulled, PullError> {
        let dir = store.model_dir(name);
        let dest = dir.join(remote.file_name());
        if dest.exists() {
            let descriptor = describe_existing(store, name, &dest)?;
            return Ok(Pulled { descriptor, already_present: true, extras: vec![] });
        }
        let staging = staging_dir(&dir);
        fs::create_dir_all(&staging).map_err(PullError::io(&staging))?;
        let verified = staging.join(remote.file_name());
        if let Err(error) = self.download(remote, &remote.path, &verified, &mut progress) {
            remove_empty_dirs(store, &staging);
            return Err(error);
        }
        let imported = store.import_file(name.as_str(), &verified);
        let _ = fs::remove_file(&verified);
        let descriptor = imported?;
        let extras = self.fetch_extras(remote, &dir, &staging);
        // Only removed when empty: a concurrent pull may be using it.
        let _ = fs::remove_dir(&staging);
        Ok(Pulled { descriptor, already_present: false, extras })
    }

    /// Best effort: a missing or failing extra file is logged, never an error.
    fn fetch_extras(&self, remote: &RemoteFile, dir: &Path, staging: &Path) -> Vec<String> {
        let mut fetched = Vec::new();
        for extra in EXTRA_FILES.iter().filter(|e| remote.siblings.iter().any(|s| s == *e)) {
            let dest = dir.join(extra);
            if dest.exists() {
                continue;
            }
            let tmp = staging.join(extra);
            let result = self
                .download(remote, extra, &tmp, &mut |_, _| {})
                .and_then(|()| fs::rename(&tmp, &dest).map_err(PullError::io(&dest)));
            match result {
                Ok(()) => fetched.push(extra.to_string()),
                Err(error) => {
                    let _ = fs::remove_file(&tmp);
                    let error = error_chain(&error);
                    tracing::warn!(file = extra, error, "could not fetch an extra file; continuing without it");
                }
            }
        }
        fetched
    }
}

/// The descriptor of a file already in the store, under the name that selects it.
fn describe_existing(store: &ModelStore, name: &ModelName, file: &Path) -> Result<ModelDescriptor, PullError> {
    if let Some(descriptor) = store.list().into_iter().find(|d| d.primary_file == file) {
        return Ok(descriptor);
    }
    // No name selects it (a broken file, or a directory made ambiguous by hand): say why.
    Err(match store.resolve(name.as_str()) {
        Err(error) => error,
        Ok(_) => StoreError::AlreadyExists { path: file.to_path_buf() },
    }
    .into())
}

/// Removes `dir` and its parents up to the store root, as long as they are empty: a failed
/// first pull leaves no directories behind (a partial download keeps them).
fn remove_empty_dirs(store: &ModelStore, dir: &Path) {
    let mut dir = Some(dir);
    while let Some(d) = dir.filter(|d| d.starts_with(store.root()) && *d != store.root()) {
        if fs::remove_dir(d).is_err() {
            break;
        }
        dir = d.parent();
    }
}

fn staging_dir(model_dir: &Path) -> PathBuf {
    model_dir.join(STAGING_DIR)
}

/// The sha256 of a file, lower-case hex (reading it whole: blocking, and slow for large files).
pub fn sha256_file(path: &Path) -> io::Result<String> {
    transfer::sha256_file(path)
}

/// Where an interrupted download of `file_name` into `model_dir` waits to be resumed.
pub fn partial_path_for(model_dir: &Path, file_name: &str) -> PathBuf {
    partial_path(&staging_dir(model_dir).join(file_name))
}

fn partial_path(dest: &Path) -> PathBuf {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dest.with_file_name(format!("{name}.partial"))
}
