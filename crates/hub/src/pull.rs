//! `llmr pull`: a GGUF model (or a speech model: a whisper.cpp `ggml-*.bin`, a Piper `.onnx`
//! voice with its config) from a Hugging Face compatible hub into the local store.
//!
//! `owner/repo[:QUANT]` chooses a file from the repository's listing (pinned to its commit);
//! `owner/repo/path/file.gguf` names one. The download ([`Hub::download`]) goes to a hidden
//! staging folder inside the model's directory (`.download/FILE.partial`, never seen by
//! `list`/`resolve`), resumes with an HTTP `Range` request when a partial file is there, and is
//! checked against the size and sha256 the listing and the hub announce. Only then is it
//! published with [`ModelStore::import_file`], which applies the store's rules and renames the
//! file into place atomically: no half-written file ever carries the final name.
//!
//! The store itself knows no network: this module is where hub and store meet. There is no user
//! interface here: progress goes to a `FnMut(downloaded, total)` callback.

mod select;

use self::select::select_file;
use crate::choice::base_name;
use crate::client::{Hub, Known, Remote};
use crate::download::{partial_path, staging_dir};
use crate::error::HubError;
use crate::listing::Listing;
use llmr_model_store::{ModelDescriptor, ModelName, ModelStore, NameError, StoreError};
use llmr_telemetry::error_chain;
use std::path::Path;
use tokio::fs;

/// Small repository files fetched beside the model when present (best effort).
const EXTRA_FILES: &[&str] = &["config.json", "tokenizer_config.json"];

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
    /// The repository at the commit the file is downloaded from.
    pub listing: Listing,
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
    #[error("{file:?} is not a single-file GGUF model (split parts and projectors cannot be pulled), a whisper.cpp ggml-*.bin or a Piper .onnx voice")]
    NotGguf { file: String },
    #[error("model '{repo}' has no GGUF file")]
    NoGguf { repo: String },
    #[error("model '{repo}' has no GGUF file tagged '{requested}' (exact, case-sensitive); available: {}; or name a file as '{repo}/FILE'", available.join(", "))]
    NoMatchingFile { repo: String, requested: String, available: Vec<String> },
    #[error("model '{repo}' has several GGUF files{}: {}; ask for one as '{repo}:QUANT' or '{repo}/FILE'",
        requested.as_deref().map(|r| format!(" tagged '{r}'")).unwrap_or_default(), candidates.join(", "))]
    Ambiguous { repo: String, requested: Option<String>, candidates: Vec<String> },
    /// Listing or downloading failed (not found, refused, a broken or corrupt download...).
    #[error(transparent)]
    Hub(#[from] HubError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("a blocking task failed: {0}")]
    Blocking(#[from] tokio::task::JoinError),
}

impl PullError {
    /// The download broke off: the same pull resumes it.
    pub fn is_resumable(&self) -> bool {
        matches!(self, PullError::Hub(error) if error.is_transient())
    }
}

impl RemoteFile {
    /// The name the file gets in the store: the last segment of its path.
    pub fn file_name(&self) -> &str {
        base_name(&self.path)
    }

    /// A file of the repository, at the listing's commit, with what the listing knows of it.
    fn file(&self, hub: &Hub, path: &str) -> (Remote, Known) {
        let listed = self.listing.get(path);
        let known = Known { size: listed.and_then(|l| l.size), sha256: listed.and_then(|l| l.sha256.clone()) };
        (self.listing.file(hub, path), known)
    }
}

/// The store's own work (reading GGUF headers, importing) on a blocking thread.
async fn in_store<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, PullError> {
    Ok(tokio::task::spawn_blocking(work).await??)
}

impl Hub {
    /// Lists the repository and chooses the file `spec` asks for.
    pub async fn locate(&self, spec: &PullSpec) -> Result<RemoteFile, PullError> {
        let listing = self.list(spec.repo.as_str(), "main").await?;
        let path = select_file(&spec.repo, &listing.paths(), &spec.file, self.endpoint())?;
        Ok(RemoteFile { repo: spec.repo.clone(), path, listing })
    }

    /// Downloads `remote` into the store as `name` (usually `remote.repo`), then the
    /// repository's `config.json`/`tokenizer_config.json` when it has them. A model already in
    /// the store under that file name is not downloaded again. Two pulls of the same file at the
    /// same time are not coordinated (they would share the partial file): don't.
    pub async fn pull(
        &self,
        store: &ModelStore,
        remote: &RemoteFile,
        name: &ModelName,
        mut progress: impl FnMut(u64, Option<u64>) + Send,
    ) -> Result<Pulled, PullError> {
        let dir = store.model_dir(name);
        let dest = dir.join(remote.file_name());
        if fs::try_exists(&dest).await.map_err(HubError::io(&dest))? {
            let (store, name) = (store.clone(), name.clone());
            let descriptor = in_store(move || describe_existing(&store, &name, &dest)).await?;
            return Ok(Pulled { descriptor, already_present: true, extras: vec![] });
        }
        let staging = staging_dir(&dir);
        fs::create_dir_all(&staging).await.map_err(HubError::io(&staging))?;
        let verified = staging.join(remote.file_name());
        let (file, known) = remote.file(self, &remote.path);
        if let Err(error) = self.download(&file, &partial_path(&verified), &verified, &known, &mut progress).await {
            remove_empty_dirs(store, &staging).await;
            return Err(error.into());
        }
        // A speech model's companions (a voice's config) are verified beside it before import.
        let mut companions = Vec::new();
        for path in select::companions(&remote.path) {
            let dest = staging.join(base_name(&path));
            let (file, known) = remote.file(self, &path);
            if let Err(error) = self.download(&file, &partial_path(&dest), &dest, &known, |_, _| {}).await {
                let _ = fs::remove_file(&verified).await;
                return Err(error.into());
            }
            companions.push(dest);
        }
        let (owned, name_s, path, extra) = (store.clone(), name.to_string(), verified.clone(), companions.clone());
        let imported = if select::speech_file(&remote.path) {
            in_store(move || owned.import_speech_files(&name_s, &path, &extra)).await
        } else {
            in_store(move || owned.import_file(&name_s, &path)).await
        };
        let _ = fs::remove_file(&verified).await;
        for c in &companions {
            let _ = fs::remove_file(c).await;
        }
        let descriptor = imported?;
        // An LLM's configs can carry its chat template; a speech model has no use for them.
        let extras = if select::speech_file(&remote.path) {
            Vec::new()
        } else {
            self.fetch_extras(remote, &dir, &staging).await
        };
        // Only removed when empty: a concurrent pull may be using it.
        let _ = fs::remove_dir(&staging).await;
        Ok(Pulled { descriptor, already_present: false, extras })
    }

    /// Best effort: a missing or failing extra file is logged, never an error.
    async fn fetch_extras(&self, remote: &RemoteFile, dir: &Path, staging: &Path) -> Vec<String> {
        let mut fetched = Vec::new();
        for extra in EXTRA_FILES.iter().filter(|e| remote.listing.get(e).is_some()) {
            let dest = dir.join(extra);
            if fs::try_exists(&dest).await.unwrap_or(true) {
                continue;
            }
            let tmp = staging.join(extra);
            let (file, known) = remote.file(self, extra);
            let result = match self.download(&file, &partial_path(&tmp), &tmp, &known, |_, _| {}).await {
                Ok(()) => fs::rename(&tmp, &dest).await.map_err(HubError::io(&dest)),
                Err(error) => Err(error),
            };
            match result {
                Ok(()) => fetched.push(extra.to_string()),
                Err(error) => {
                    let _ = fs::remove_file(&tmp).await;
                    let error = error_chain(&error);
                    tracing::warn!(file = extra, error, "could not fetch an extra file; continuing without it");
                }
            }
        }
        fetched
    }
}

/// The descriptor of a file already in the store, under the name that selects it. Blocking.
fn describe_existing(store: &ModelStore, name: &ModelName, file: &Path) -> Result<ModelDescriptor, StoreError> {
    if let Some(descriptor) = store.list().into_iter().find(|d| d.primary_file == file) {
        return Ok(descriptor);
    }
    // No name selects it (a broken file, or a directory made ambiguous by hand): say why.
    Err(match store.resolve(name.as_str()) {
        Err(error) => error,
        Ok(_) => StoreError::AlreadyExists { path: file.to_path_buf() },
    })
}

/// Removes `dir` and its parents up to the store root, as long as they are empty: a failed
/// first pull leaves no directories behind (a partial download keeps them).
async fn remove_empty_dirs(store: &ModelStore, dir: &Path) {
    let mut dir = Some(dir);
    while let Some(d) = dir.filter(|d| d.starts_with(store.root()) && *d != store.root()) {
        if fs::remove_dir(d).await.is_err() {
            break;
        }
        dir = d.parent();
    }
}
