//! One model's files, as its manifest lists them: downloaded into `<store>/<name>/` (hub and URL
//! sources) or used in place (path sources), each checked for size and sha256, then described.
//!
//! A download goes through the hub client (`llmr_hub`, async) to
//! `<store>/<name>/.download/<path>.partial` (hidden: the store never lists it), is resumed from
//! there with a `Range` request, checked, and only then renamed to its final name: a corrupt or
//! partial file never carries it. A file found under its final name is trusted when the model's
//! record says it was checked with this size, time and sha256 (it was renamed into place only
//! after its check); otherwise it is hashed once, on a blocking thread (as the model is
//! described: both read local files whole).
//!
//! The record, `<store>/<name>/.llmr-manifest.json`, also marks the directory as the router's:
//! the store's own models are the ones without it, so a model deleted at the router (its files
//! kept) does not come back as a local one.

use llmr_cluster::{check_model_name, check_relative_path, ManifestFile, ModelManifest, ModelSource, PathProblem};
use llmr_hub::{is_sha256, partial_path_for, sha256_file, staging_dir, Hub, HubError, Known, Remote, Url};
use llmr_model_store::{Format, ModelDescriptor, StoreError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;
use tokio::fs;

/// Marks a model directory as synced from a router, and records which files were checked.
pub(super) const RECORD: &str = ".llmr-manifest.json";

/// Why a model's files could not be made ready; its text (with its sources) is the `Failed`
/// message of the heartbeat.
#[derive(Debug, thiserror::Error)]
pub(super) enum FetchError {
    #[error("refusing {what} {value:?}: it {problem}")]
    Unsafe { what: &'static str, value: String, problem: PathProblem },
    #[error("invalid manifest: {0}")]
    Manifest(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {actual} bytes, the manifest says {expected}", path.display())]
    Size { path: PathBuf, expected: u64, actual: u64 },
    #[error("{}: its sha256 differs from the manifest's {expected}", path.display())]
    Digest { path: PathBuf, expected: String },
    #[error(transparent)]
    Download(#[from] HubError),
    #[error(transparent)]
    Describe(#[from] StoreError),
    #[error("a blocking task failed: {0}")]
    Blocking(#[from] tokio::task::JoinError),
    #[error("the manifest says {manifest}, the files are {found}")]
    Format { manifest: &'static str, found: Format },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FetchError + '_ {
    move |source| FetchError::Io { path: path.to_path_buf(), source }
}

fn refuse<'a>(what: &'static str, value: &'a str) -> impl FnOnce(PathProblem) -> FetchError + 'a {
    move |problem| FetchError::Unsafe { what, value: value.to_string(), problem }
}

/// Bytes fetched (or checked) so far, for the heartbeat's `Downloading` message.
#[derive(Debug, Default)]
pub(super) struct Progress {
    done: AtomicU64,
    total: AtomicU64,
}

impl Progress {
    pub fn describe(&self) -> String {
        let (done, total) = (self.done.load(Ordering::Relaxed), self.total.load(Ordering::Relaxed));
        format!("{} of {} MiB", done >> 20, total >> 20)
    }

    fn set(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
    }

    fn add(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    manifest: Option<ModelManifest>,
    #[serde(default)]
    checked: Vec<Checked>,
}

/// A file whose content was found equal to `sha256` while it had this size and time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Checked {
    path: PathBuf,
    size: u64,
    modified_ns: u64,
    sha256: String,
}

/// Size and modification time, the identity a check is recorded under.
async fn stamp(path: &Path) -> Option<(u64, u64)> {
    let meta = fs::metadata(path).await.ok().filter(|m| m.is_file())?;
    let modified = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some((meta.len(), modified.as_nanos() as u64))
}

impl Record {
    async fn read(dir: &Path) -> Record {
        fs::read(dir.join(RECORD)).await.ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    /// Written beside, then renamed: a crash leaves the old record or the new one.
    async fn write(&self, dir: &Path) -> Result<(), FetchError> {
        let (tmp, path) = (dir.join(format!("{RECORD}.tmp")), dir.join(RECORD));
        let bytes = serde_json::to_vec_pretty(self).expect("a record serializes");
        fs::write(&tmp, bytes).await.map_err(io(&tmp))?;
        fs::rename(&tmp, &path).await.map_err(io(&path))
    }

    async fn trusts(&self, path: &Path, file: &ManifestFile) -> bool {
        let Some((size, modified_ns)) = stamp(path).await else { return false };
        size == file.size
            && self.checked.iter().any(|c| {
                c.path == path
                    && c.size == size
                    && c.modified_ns == modified_ns
                    && c.sha256.eq_ignore_ascii_case(&file.sha256)
            })
    }

    async fn note(&mut self, path: &Path, file: &ManifestFile) {
        self.checked.retain(|c| c.path != path);
        if let Some((size, modified_ns)) = stamp(path).await {
            let sha256 = file.sha256.to_ascii_lowercase();
            self.checked.push(Checked { path: path.to_path_buf(), size, modified_ns, sha256 });
        }
    }
}

/// Everything in a manifest that names a place: nothing may escape its directory.
pub(super) fn check(m: &ModelManifest) -> Result<(), FetchError> {
    check_model_name(&m.name).map_err(refuse("model name", &m.name))?;
    if m.files.is_empty() {
        return Err(FetchError::Manifest("it lists no files".into()));
    }
    for f in &m.files {
        check_relative_path(&f.path).map_err(refuse("file path", &f.path))?;
        if !is_sha256(&f.sha256) {
            return Err(FetchError::Manifest(format!("file {:?}: {:?} is not a sha256", f.path, f.sha256)));
        }
    }
    if !m.files.iter().any(|f| f.path == m.primary) {
        return Err(FetchError::Manifest(format!("the primary file {:?} is not among its files", m.primary)));
    }
    match &m.source {
        ModelSource::Hub { repo, revision, .. } => {
            check_relative_path(repo).map_err(refuse("repository", repo))?;
            check_relative_path(revision).map_err(refuse("revision", revision))?;
        }
        ModelSource::Url { .. } if m.files.len() != 1 => {
            return Err(FetchError::Manifest(format!("a URL source has one file, it lists {}", m.files.len())));
        }
        ModelSource::Url { .. } | ModelSource::Path { .. } => {}
    }
    Ok(())
}

/// Makes the model's files present and checked, and describes the model.
pub(super) async fn fetch_model(
    store_root: &Path,
    m: &ModelManifest,
    progress: &Progress,
) -> Result<ModelDescriptor, FetchError> {
    check(m)?;
    let model_dir = store_root.join(&m.name);
    fs::create_dir_all(&model_dir).await.map_err(io(&model_dir))?;
    let mut record = Record::read(&model_dir).await;
    record.manifest = Some(m.clone());
    record.write(&model_dir).await?;
    progress.total.store(m.total_bytes(), Ordering::Relaxed);

    let files_dir = match &m.source {
        ModelSource::Path { dir } => {
            let dir = PathBuf::from(dir);
            for f in &m.files {
                check_in_place(&dir.join(&f.path), f, &mut record).await?;
                progress.add(f.size);
            }
            dir
        }
        ModelSource::Hub { endpoint, repo, revision } => {
            let hub = Hub::from_env_at(endpoint)?;
            for f in &m.files {
                download(&hub, hub.file(repo, revision, &f.path), &model_dir, f, &mut record, progress).await?;
            }
            model_dir.clone()
        }
        ModelSource::Url { url } => {
            let url = Url::parse(url).map_err(|e| FetchError::Manifest(format!("invalid URL {url:?}: {e}")))?;
            // A URL's own server, never the hub's token.
            let hub = Hub::new(&url.origin().ascii_serialization(), None)?;
            download(&hub, Remote::url(url), &model_dir, &m.files[0], &mut record, progress).await?;
            model_dir.clone()
        }
    };
    record.write(&model_dir).await?;
    if !matches!(m.source, ModelSource::Path { .. }) {
        // Every file is in place: nothing is left to resume.
        let _ = fs::remove_dir_all(staging_dir(&model_dir)).await;
    }

    let (name, primary) = (m.name.clone(), m.primary.clone());
    let paths: Vec<String> = m.files.iter().map(|f| f.path.clone()).collect();
    let desc = tokio::task::spawn_blocking(move || {
        let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
        ModelDescriptor::from_files(name, &files_dir, &primary, &paths)
    })
    .await??;
    let expected = super::sync::store_format(m.format);
    if desc.format != expected {
        return Err(FetchError::Format { manifest: m.format.as_str(), found: desc.format });
    }
    Ok(desc)
}

async fn download(
    hub: &Hub,
    remote: Remote,
    model_dir: &Path,
    f: &ManifestFile,
    record: &mut Record,
    progress: &Progress,
) -> Result<(), FetchError> {
    let dest = model_dir.join(&f.path);
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent).await.map_err(io(parent))?;
    }
    if fs::try_exists(&dest).await.map_err(io(&dest))? {
        if record.trusts(&dest, f).await || matches_digest(&dest, f).await? {
            record.note(&dest, f).await;
            progress.add(f.size);
            return Ok(());
        }
        tracing::warn!(file = %dest.display(), "differs from the router's manifest; fetching it again");
        fs::remove_file(&dest).await.map_err(io(&dest))?;
    }
    let partial = partial_path_for(model_dir, &f.path);
    if let Some(parent) = partial.parent() {
        fs::create_dir_all(parent).await.map_err(io(parent))?;
    }
    let base = progress.get();
    let expected = Known { size: Some(f.size), sha256: Some(f.sha256.clone()) };
    hub.download(&remote, &partial, &dest, &expected, |done, _| progress.set(base + done)).await?;
    record.note(&dest, f).await;
    Ok(())
}

/// A file used where it is (a shared folder): it must be there with the manifest's size and,
/// checked once per size and time, its sha256. Never deleted, whatever it holds.
async fn check_in_place(path: &Path, f: &ManifestFile, record: &mut Record) -> Result<(), FetchError> {
    let meta = fs::metadata(path).await.map_err(io(path))?;
    if !meta.is_file() {
        return Err(io(path)(std::io::Error::other("not a file")));
    }
    if meta.len() != f.size {
        return Err(FetchError::Size { path: path.to_path_buf(), expected: f.size, actual: meta.len() });
    }
    if !record.trusts(path, f).await {
        if !matches_digest(path, f).await? {
            return Err(FetchError::Digest { path: path.to_path_buf(), expected: f.sha256.clone() });
        }
        record.note(path, f).await;
    }
    Ok(())
}

/// Whether the file has the manifest's size and sha256 (hashed on a blocking thread).
async fn matches_digest(path: &Path, f: &ManifestFile) -> Result<bool, FetchError> {
    if fs::metadata(path).await.map_err(io(path))?.len() != f.size {
        return Ok(false);
    }
    let owned = path.to_path_buf();
    let (_, actual) = tokio::task::spawn_blocking(move || sha256_file(&owned)).await?.map_err(io(path))?;
    Ok(actual.eq_ignore_ascii_case(&f.sha256))
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmr_cluster::ModelFormat;

    fn manifest(name: &str, path: &str) -> ModelManifest {
        ModelManifest {
            name: name.into(),
            format: ModelFormat::Gguf,
            source: ModelSource::Path { dir: "/models".into() },
            files: vec![ManifestFile { path: path.into(), size: 1, sha256: "a".repeat(64) }],
            primary: path.into(),
            quantization: None,
            architecture: None,
            has_chat_template: false,
            registered_at: 0,
        }
    }

    #[test]
    fn names_and_paths_that_could_escape_are_refused() {
        assert!(check(&manifest("org/m", "sub/m.gguf")).is_ok());
        for (name, path) in
            [("../x", "m.gguf"), ("/abs", "m.gguf"), ("m", "../m.gguf"), ("m", "/etc/passwd"), ("m", "a/./b")]
        {
            assert!(check(&manifest(name, path)).is_err(), "{name} {path}");
        }
        let mut m = manifest("m", "m.gguf");
        m.primary = "other.gguf".into();
        assert!(check(&m).unwrap_err().to_string().contains("primary"));
        let mut m = manifest("m", "m.gguf");
        m.source = ModelSource::Hub { endpoint: "http://h".into(), repo: "o/r".into(), revision: "../main".into() };
        assert!(check(&m).unwrap_err().to_string().contains("revision"));
    }
}

#[cfg(test)]
mod fetch_tests {
    use super::*;
    use llmr_cluster::ModelFormat;
    use llmr_hub_mirror::HubMirror;
    use llmr_testkit::gguf_with_architecture as gguf;
    use std::fs;

    struct Fixture {
        _tmp: tempfile::TempDir,
        store: PathBuf,
        repo_dir: PathBuf,
        bytes: Vec<u8>,
        sha: String,
    }

    /// A repository `org/m` holding `sub/m.gguf`, and an empty store.
    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let repo_dir = tmp.path().join("repo");
        fs::create_dir_all(repo_dir.join("sub")).unwrap();
        let bytes = gguf("echo", 300_000);
        fs::write(repo_dir.join("sub/m.gguf"), &bytes).unwrap();
        let (_, sha) = sha256_file(&repo_dir.join("sub/m.gguf")).unwrap();
        let store = tmp.path().join("store");
        fs::create_dir_all(&store).unwrap();
        Fixture { _tmp: tmp, store, repo_dir, bytes, sha }
    }

    fn manifest(name: &str, source: ModelSource, path: &str, size: u64, sha: &str) -> ModelManifest {
        ModelManifest {
            name: name.into(),
            format: ModelFormat::Gguf,
            source,
            files: vec![ManifestFile { path: path.into(), size, sha256: sha.into() }],
            primary: path.into(),
            quantization: None,
            architecture: Some("echo".into()),
            has_chat_template: false,
            registered_at: 0,
        }
    }

    fn hub(mirror: &HubMirror) -> ModelSource {
        ModelSource::Hub { endpoint: mirror.endpoint(), repo: "org/m".into(), revision: "main".into() }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hub_download_resumes_its_partial_file_and_lands_checked() {
        let f = fixture();
        let mirror = HubMirror::start(vec![("org/m".into(), f.repo_dir.clone())]).await.unwrap();
        let m = manifest("org/m", hub(&mirror), "sub/m.gguf", f.bytes.len() as u64, &f.sha);
        let partial = f.store.join("org/m/.download/sub/m.gguf.partial");
        fs::create_dir_all(partial.parent().unwrap()).unwrap();
        fs::write(&partial, &f.bytes[..100_000]).unwrap();

        let progress = Progress::default();
        let desc = fetch_model(&f.store, &m, &progress).await.unwrap();
        let dest = f.store.join("org/m/sub/m.gguf");
        assert_eq!(
            (desc.name.as_str(), desc.primary_file.as_path(), desc.architecture.as_str()),
            ("org/m", dest.as_path(), "echo")
        );
        assert_eq!(fs::read(&dest).unwrap(), f.bytes);
        let log = mirror.request_log();
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(log[0].path, "/org/m/resolve/main/sub/m.gguf");
        assert_eq!(log[0].range.as_deref(), Some("bytes=100000-"), "the partial file was resumed");
        assert!(!f.store.join("org/m/.download").exists(), "nothing is left to resume");
        assert_eq!(progress.describe(), "0 of 0 MiB");
        assert_eq!(progress.get(), f.bytes.len() as u64);

        // Checked once: the next sync trusts the record and asks nothing.
        fetch_model(&f.store, &m, &Progress::default()).await.unwrap();
        assert_eq!(mirror.request_log().len(), 1);
        // A file changed behind the record's back is hashed, found wrong, and fetched again.
        fs::write(&dest, vec![0u8; f.bytes.len()]).unwrap();
        fetch_model(&f.store, &m, &Progress::default()).await.unwrap();
        assert_eq!(fs::read(&dest).unwrap(), f.bytes);
        assert_eq!(mirror.request_log().len(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_corrupt_download_is_deleted_and_never_takes_the_final_name() {
        let f = fixture();
        let mirror = HubMirror::start(vec![("org/m".into(), f.repo_dir.clone())]).await.unwrap();
        let wrong = "0".repeat(64);
        let m = manifest("bad", hub(&mirror), "sub/m.gguf", f.bytes.len() as u64, &wrong);
        let err = fetch_model(&f.store, &m, &Progress::default()).await.unwrap_err().to_string();
        assert!(err.contains("sha256 mismatch") && err.contains(&f.sha), "{err}");
        assert!(!f.store.join("bad/sub/m.gguf").exists());
        assert!(!f.store.join("bad/.download/sub/m.gguf.partial").exists());
        // A size the server does not send is refused too.
        let m = manifest("bad", hub(&mirror), "sub/m.gguf", 10, &f.sha);
        let err = fetch_model(&f.store, &m, &Progress::default()).await.unwrap_err().to_string();
        assert!(err.contains("expected 10 bytes"), "{err}");
        assert!(!f.store.join("bad/sub/m.gguf").exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn escaping_names_and_paths_are_refused_before_anything_is_touched() {
        let f = fixture();
        let mirror = HubMirror::start(vec![("org/m".into(), f.repo_dir.clone())]).await.unwrap();
        let size = f.bytes.len() as u64;
        for (name, path) in [("../outside", "sub/m.gguf"), ("m", "../m.gguf"), ("m", "/etc/passwd")] {
            let err = fetch_model(&f.store, &manifest(name, hub(&mirror), path, size, &f.sha), &Progress::default())
                .await
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("refusing"), "{err}");
        }
        assert_eq!(fs::read_dir(&f.store).unwrap().count(), 0, "nothing was created");
        assert!(mirror.request_log().is_empty(), "nothing was requested");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_path_source_is_used_in_place_and_never_modified() {
        let f = fixture();
        let shared = f.repo_dir.to_string_lossy().into_owned();
        let source = || ModelSource::Path { dir: shared.clone() };
        let size = f.bytes.len() as u64;
        let desc =
            fetch_model(&f.store, &manifest("shared", source(), "sub/m.gguf", size, &f.sha), &Progress::default())
                .await
                .unwrap();
        assert_eq!(desc.primary_file, f.repo_dir.join("sub/m.gguf"));
        let in_store: Vec<_> = fs::read_dir(f.store.join("shared")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(in_store, [RECORD], "only the record is in the store");

        let err =
            fetch_model(&f.store, &manifest("s2", source(), "sub/m.gguf", size + 1, &f.sha), &Progress::default())
                .await
                .unwrap_err()
                .to_string();
        assert!(err.contains(&format!("{size} bytes, the manifest says {}", size + 1)), "{err}");
        let wrong = "1".repeat(64);
        let err = fetch_model(&f.store, &manifest("s3", source(), "sub/m.gguf", size, &wrong), &Progress::default())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("sha256 differs"), "{err}");
        assert_eq!(fs::read(f.repo_dir.join("sub/m.gguf")).unwrap(), f.bytes, "a shared file is never touched");
        let err =
            fetch_model(&f.store, &manifest("s4", source(), "sub/absent.gguf", size, &f.sha), &Progress::default())
                .await
                .unwrap_err()
                .to_string();
        assert!(err.contains("absent.gguf"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_url_source_is_downloaded_like_a_hub_file() {
        let f = fixture();
        let mirror = HubMirror::start(vec![("org/m".into(), f.repo_dir.clone())]).await.unwrap();
        let url = format!("{}/org/m/resolve/main/sub/m.gguf", mirror.endpoint());
        let m = manifest("direct", ModelSource::Url { url }, "m.gguf", f.bytes.len() as u64, &f.sha);
        let desc = fetch_model(&f.store, &m, &Progress::default()).await.unwrap();
        assert_eq!(desc.primary_file, f.store.join("direct/m.gguf"));
        assert_eq!(fs::read(&desc.primary_file).unwrap(), f.bytes);
    }
}
